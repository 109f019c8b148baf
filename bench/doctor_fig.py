"""Figure 3 (the doctor): `run_doctor` (all checks, in this process, connections included) on N nodes against (a)
the ssh loop running one light command (`PYTHON -c pass`) on every node, and (p) pdsh (`-R ssh -f N`) running it;
`fits` are least-squares lines against N.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.baselines import have_pdsh, pdsh, ssh_loop
from bench.common import fit_line, log, ratio, sandbox_of, stats
from launcher.config.inventory import load_inventory
from launcher.doctor import run_doctor

TARGET = 1.5


def run(sizes: list[int], repeat: int | dict[int, int], root: Path) -> dict[str, Any]:
    """`repeat`: runs per N, a number or N -> runs."""
    rows = []
    use_pdsh = have_pdsh()
    for n in sizes:
        with sandbox_of(n, root, script="bench/workloads/lines.py") as box:  # a script nobody edits during the bench
            runs = repeat if isinstance(repeat, int) else repeat.get(n, 3)
            log(f"doctor: {n} nodes, {runs} runs")
            cluster = load_inventory(box.inventory)
            light = f"{box.python} -c pass"
            ssh_loop(box.ssh_config, [light] * n)  # untimed warm-up
            run_doctor(cluster)
            variants = ["ssh_loop", *(["pdsh"] if use_pdsh else []), "doctor"]
            times: dict[str, list[float]] = {v: [] for v in variants}
            problems: list[str] = []
            for rep in range(runs):
                for variant in variants[rep % len(variants):] + variants[:rep % len(variants)]:
                    if variant == "doctor":
                        start = time.perf_counter()
                        report = run_doctor(cluster)
                        times["doctor"].append(time.perf_counter() - start)
                        problems += [f"{f.host} {f.check}: {f.status} {f.detail}" for f in report.failures]
                        continue
                    result = ssh_loop(box.ssh_config, [light] * n) if variant == "ssh_loop" else pdsh(
                        box.ssh_config, n, light)
                    if result.code != 0:
                        raise RuntimeError(f"the {variant} baseline failed:\n{result.stderr[-2000:]}")
                    times[variant].append(result.seconds)
            row: dict[str, Any] = {"nodes": n, **{v: stats(times[v]) for v in variants}}
            row["doctor_over_a"] = ratio(row["doctor"], row["ssh_loop"])
            if use_pdsh:
                row["doctor_over_p"] = ratio(row["doctor"], row["pdsh"])
            row["doctor_ok"] = row["doctor_over_a"] is not None and row["doctor_over_a"] <= TARGET
            row["failures_found"] = sorted(set(problems))
            rows.append(row)
            log(f"doctor {n}: " + ", ".join(f"{v} {row[v]['median']:.2f}s" for v in variants))
    fits = {v: fit_line([r["nodes"] for r in rows if v in r], [r[v]["median"] for r in rows if v in r])
            for v in ("ssh_loop", "pdsh", "doctor")}
    return {"rows": rows, "note": "run_doctor(cluster) timed in-process (imports already done), all checks",
            "repeat": repeat if isinstance(repeat, int) else {str(k): v for k, v in repeat.items()},
            "pdsh": use_pdsh, "fits": fits}
