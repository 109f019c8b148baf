"""Benchmark of `run_doctor` on sandboxes of 2, 4, 8 (and 16) nodes, against a bare parallel `ssh node-i true`.

Run it from the repository root: `python bench/bench_doctor.py`. It prints a table and writes
bench/results/doctor.json. Each figure is the median of 3 runs (with min and max), all measured in the same run
as the baseline: on a small machine every SSH handshake and every interpreter start competes for the same
cores, so only the comparison at the same N means something.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher import doctor, sandbox  # noqa: E402
from launcher.inventory import load_inventory  # noqa: E402

RESULTS = REPO / "bench" / "results" / "doctor.json"
SIZES = (2, 4, 8)
BIG = 16
BIG_BUDGET_S = 60.0
"""16 nodes are run only when the 8-node round suggests they will take less than this."""


def timed(fn: Callable[[], Any], repeat: int) -> tuple[dict[str, Any], list[Any]]:
    """Median, min and max wall time of `repeat` calls (seconds), and what each call returned."""
    times, values = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        values.append(fn())
        times.append(time.perf_counter() - start)
    stats = {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
             "max_s": round(max(times), 3), "runs_s": [round(t, 3) for t in times]}
    return stats, values


def ssh_loop(ssh_config: Path, count: int) -> None:
    """The baseline: `ssh node-i true` for every node at once in one shell (`&` ... `wait`)."""
    config = shlex.quote(str(ssh_config))
    script = " ".join(f"ssh -F {config} node-{i} true &" for i in range(count)) + " wait"
    subprocess.run(["bash", "-c", script], check=True, capture_output=True)


def reserve_subnet(first: int = 200) -> tuple[str, IO[str]]:
    """A base address 127.0.K.2 no other sandbox uses (K from 200: the tests count from 10)."""
    return sandbox.reserve_base_addr(first, 250)


free_port = sandbox.free_port


def bench_size(count: int, repeat: int, root: Path) -> dict[str, Any]:
    base, lock = reserve_subnet()
    state = root / f"n{count}" / "state"
    try:
        box = sandbox.up(count, state_dir=state, inventory=root / f"n{count}" / "sandbox.yaml", base_addr=base,
                         master_port=free_port())
        cluster = load_inventory(box.inventory)
        row: dict[str, Any] = {"nodes": count}
        ssh_loop(box.ssh_config, count)  # warm the page cache and sshd's first-connection costs, untimed
        for mode in ("all", "fast"):
            stats, reports = timed(lambda m=mode: doctor.run_doctor(cluster, checks=m), repeat)
            stats["ok"] = all(r.ok for r in reports)
            stats["connect_s_median"] = round(statistics.median(r.timings["connect_s"] for r in reports), 3)
            stats["probe_s_median"] = round(statistics.median(r.timings["probe_s"] for r in reports), 3)
            stats["probe_on_node_s_max"] = round(max(p["elapsed"] for r in reports for p in r.probes.values() if p), 3)
            row[f"doctor_{mode}"] = stats
        row["ssh_true"], _ = timed(lambda: ssh_loop(box.ssh_config, count), repeat)
        row["doctor_all_over_ssh_true"] = round(row["doctor_all"]["median_s"] / row["ssh_true"]["median_s"], 2)
        return row
    finally:
        sandbox.down(state)
        lock.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-big", action="store_true", help=f"skip the {BIG}-node round")
    args = parser.parse_args()
    started = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-doctor-") as tmp:
        for count in SIZES:
            round_start = time.monotonic()
            rows.append(bench_size(count, args.repeat, Path(tmp)))
            last_round = time.monotonic() - round_start
            print(f"{count} nodes: {last_round:.1f} s", file=sys.stderr)
        if not args.no_big and last_round * 2.5 < BIG_BUDGET_S:
            rows.append(bench_size(BIG, args.repeat, Path(tmp)))
        elif not args.no_big:
            print(f"skipping {BIG} nodes: the 8-node round took {last_round:.1f} s", file=sys.stderr)
    header = (f"{'nodes':>5} | {'doctor all (med/min/max s)':>27} | {'doctor fast':>20} | "
              f"{'ssh true loop':>20} | all/ssh")
    print(header)
    print("-" * len(header))
    for row in rows:
        cells = []
        for key in ("doctor_all", "doctor_fast", "ssh_true"):
            s = row[key]
            cells.append(f"{s['median_s']:.2f} / {s['min_s']:.2f} / {s['max_s']:.2f}")
        print(f"{row['nodes']:>5} | {cells[0]:>27} | {cells[1]:>20} | {cells[2]:>20} | "
              f"{row['doctor_all_over_ssh_true']:.2f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "when": _dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "load_avg_at_end": os.getloadavg()},
        "repeat": args.repeat,
        "results": rows,
        "wall_s": round(time.monotonic() - started, 1),
    }, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO)} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
