"""Figure 3 (the doctor): `run_doctor` (all checks, in this process, connections included) on N nodes against (a)
the ssh loop running one light command (`PYTHON -c pass`) on every node; each report's `timings` split the doctor's
own time into connect and probe.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from common import log, ratio, sandbox_of, ssh_loop, stats

from launcher.doctor import run_doctor
from launcher.inventory import load_inventory

TARGET = 1.5


def run(sizes: list[int], repeat: int, root: Path) -> dict[str, Any]:
    rows = []
    for n in sizes:
        with sandbox_of(n, root, script="bench/lines.py") as box:  # a script nobody edits during the bench
            log(f"doctor: {n} nodes")
            cluster = load_inventory(box.inventory)
            light = [f"{box.python} -c pass"] * n
            ssh_loop(box.ssh_config, light)  # untimed warm-up
            run_doctor(cluster)
            times: dict[str, list[float]] = {"ssh_loop": [], "doctor": []}
            problems: list[str] = []
            for rep in range(repeat):
                for variant in (("ssh_loop", "doctor") if rep % 2 == 0 else ("doctor", "ssh_loop")):
                    if variant == "ssh_loop":
                        result = ssh_loop(box.ssh_config, light)
                        if result.code != 0:
                            raise RuntimeError(f"the ssh loop failed:\n{result.stderr[-2000:]}")
                        times["ssh_loop"].append(result.seconds)
                    else:
                        start = time.perf_counter()
                        report = run_doctor(cluster)
                        times["doctor"].append(time.perf_counter() - start)
                        problems += [f"{f.host} {f.check}: {f.status} {f.detail}" for f in report.failures]
            row: dict[str, Any] = {"nodes": n, "ssh_loop": stats(times["ssh_loop"]), "doctor": stats(times["doctor"])}
            row["doctor_over_a"] = ratio(row["doctor"], row["ssh_loop"])
            row["doctor_ok"] = row["doctor_over_a"] is not None and row["doctor_over_a"] <= TARGET
            row["failures_found"] = sorted(set(problems))
            rows.append(row)
            log(f"doctor {n}: a {row['ssh_loop']['median']:.2f}s, run_doctor {row['doctor']['median']:.2f}s")
    return {"rows": rows, "note": "run_doctor(cluster) timed in-process (imports already done), all checks",
            "repeat": repeat}
