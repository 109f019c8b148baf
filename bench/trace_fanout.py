"""Where the launcher's fan-out time goes: a phase timeline of bench/_drive.py runs, next to the ssh loop (a).

    python -m bench.trace_fanout [--nodes 4,16] [--repeat 5] [--preflight]

For each N: (a) and the traced launcher, interleaved; prints the median of each phase, measured from the moment
the launcher process was spawned: interpreter start, imports, planning, `ssh -G` + connect per host, preflight,
channels opened, agents' `started` (stamped on the node), agents' `exited`, `launch` returning, process exit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.baselines import ssh_loop
from bench.common import DRIVER, note_runs, remove_run_dirs, run_timed, sandbox_of


def phases(trace: dict, spawn: float, exit_s: float) -> dict[str, float]:
    def last(d: dict, i: int = 1) -> float:
        return max(v[i] for v in d.values()) - spawn

    def first(d: dict, i: int = 0) -> float:
        return min(v[i] for v in d.values()) - spawn

    out = {
        "main() entered": trace["main"] - spawn,
        "imports done": trace["imported"] - spawn,
        "inventory+plan done": trace["planned"] - spawn,
        "ssh -G: first start": first(trace["resolve"]),
        "ssh -G: last end": last(trace["resolve"]),
        "ssh -G: median duration": statistics.median(e - s for s, e in trace["resolve"].values()),
        "connect (incl. ssh -G): last end": last(trace["connect"]),
        "connect: median duration": statistics.median(e - s for s, e in trace["connect"].values()),
    }
    for key in ("probed", "reached", "ready"):  # the doctor's probe and TCP check, then `ready` (controller clock)
        if trace.get(key):
            out[f"{key}: first"] = min(trace[key].values()) - spawn
            out[f"{key}: last"] = max(trace[key].values()) - spawn
    out.update({
        "channels: first opened": first(trace["channel"], 1),
        "channels: last opened": last(trace["channel"]),
        "agents started (node clock): first": first(trace["started"], 0),
        "agents started (node clock): last": last(trace["started"], 0),
        "agents exited (node clock): last": last(trace["exited"], 0),
        "exit events received: last": last(trace["exited"], 1),
        "launch() returned": trace["returned"] - spawn,
        "process exit": exit_s,
    })
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,16")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--preflight", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ddp-trace-"))
    try:
        trace(args, root)
    finally:
        remove_run_dirs()
        shutil.rmtree(root, ignore_errors=True)
    return 0


def trace(args: argparse.Namespace, root: Path) -> None:
    for n in [int(x) for x in args.nodes.split(",")]:
        with sandbox_of(n, root, script="bench/workloads/lines.py") as box:
            light = [f"{box.python} -c pass"] * n
            ssh_loop(box.ssh_config, light)
            rows: list[dict[str, float]] = []
            base: list[float] = []
            for k in range(args.repeat + 1):
                a = ssh_loop(box.ssh_config, light)
                out = root / f"trace-{n}-{k}.json"
                argv = [*DRIVER, str(box.inventory), "--log-dir", str(root / "logs"),
                        "--trace", str(out)] + (["--preflight"] if args.preflight else [])
                spawn = time.time()
                result = run_timed(argv, timeout=120)
                note_runs(result.stderr)
                if result.code != 0:
                    print(result.stderr[-1500:], file=sys.stderr)
                    continue
                if k == 0:
                    continue  # warm-up
                base.append(a.seconds)
                rows.append(phases(json.loads(out.read_text()), spawn, result.seconds))
            print(f"\n{n} nodes{' with preflight' if args.preflight else ''}: (a) ssh loop median "
                  f"{statistics.median(base):.3f} s (min {min(base):.3f}, max {max(base):.3f})")
            for key in rows[0]:
                values = [r[key] for r in rows if key in r]
                print(f"  {key:<40} {statistics.median(values):7.3f} s   "
                      f"(min {min(values):.3f}, max {max(values):.3f})")


if __name__ == "__main__":
    sys.exit(main())
