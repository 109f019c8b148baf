"""Figure 1 (fan-out) and figure 6 (the launcher's own CPU and memory).

A light command (`PYTHON -c pass`) in place of torchrun on N nodes: the launcher, started as a fresh process by
bench/_drive.py (so its imports count, like a user's `inv launch`), against (a), a bash loop of `ssh node-i CMD &`
running the same command. With the doctor's fast checks (`Options(preflight=...)`) too.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from common import BENCH, Box, log, note_runs, paired_ratio, ratio, run_timed, sandbox_of, ssh_loop, stats

TARGET_PLAIN = 1.0
TARGET_PREFLIGHT = 1.25

FAILURES: list[dict[str, Any]] = []
"""Launches that failed (e.g. a preflight check that failed under load): kept for the report, then retried."""


def drive(box: Box, root: Path, preflight: bool, tries: int = 3) -> Any:
    argv = [sys.executable, str(BENCH / "_drive.py"), str(box.inventory), "--log-dir", str(root / "logs")]
    if preflight:
        argv.append("--preflight")
    for _ in range(tries):
        result = run_timed(argv, timeout=120)
        note_runs(result.stderr)
        if result.code == 0 and "exited 0" in result.stderr:
            return result
        FAILURES.append({"nodes": box.n, "preflight": preflight, "code": result.code, "seconds":
                         round(result.seconds, 3), "stderr_tail": result.stderr[-1500:]})
        log(f"fan-out: the launcher failed on {box.n} nodes (preflight {preflight}), exit {result.code}: "
            f"{result.stderr.strip().splitlines()[-1:] }")
    raise RuntimeError(f"the launcher failed {tries} times (exit {result.code}) on {box.n} nodes:\n"
                       f"{result.stderr[-2000:]}")


def baseline(box: Box) -> Any:
    result = ssh_loop(box.ssh_config, [f"{box.python} -c pass"] * box.n, timeout=120)
    if result.code != 0:
        raise RuntimeError(f"the ssh loop failed (exit {result.code}):\n{result.stderr[-2000:]}")
    return result


def run(sizes: list[int], repeat: int, root: Path) -> dict[str, Any]:
    rows = []
    for n in sizes:
        # The inventory's script is only read by the preflight's script check: one of ours, that nobody edits.
        with sandbox_of(n, root, script="bench/lines.py") as box:
            log(f"fan-out: {n} nodes")
            # Untimed warm-up: the first sessions of a fresh sshd and the first imports are slower for everyone.
            baseline(box)
            drive(box, root, False)
            times: dict[str, list[float]] = {"ssh_loop": [], "launcher": [], "launcher_preflight": []}
            usage: dict[str, list[tuple[float, int]]] = {"ssh_loop": [], "launcher": [], "launcher_preflight": []}
            variants = ["ssh_loop", "launcher", "launcher_preflight"]
            for rep in range(repeat):
                order = variants[rep % len(variants):] + variants[:rep % len(variants)]  # rotate the order
                for variant in order:
                    result = baseline(box) if variant == "ssh_loop" else drive(box, root, variant != "launcher")
                    times[variant].append(result.seconds)
                    match = re.search(r"bench-driver-peak-rss-kb: (\d+)", result.stderr)
                    usage[variant].append((result.cpu_s, int(match.group(1)) if match else 0))
            row: dict[str, Any] = {"nodes": n}
            for variant in variants:
                row[variant] = stats(times[variant])
                row[variant]["cpu_s"] = stats([u[0] for u in usage[variant]])
                if variant != "ssh_loop":  # the driver's own VmHWM; nothing comparable for bash + ssh clients
                    row[variant]["peak_rss_mb"] = stats([round(u[1] / 1024, 1) for u in usage[variant]])
            row["launcher_over_a"] = ratio(row["launcher"], row["ssh_loop"])
            row["launcher_over_a_paired"] = paired_ratio(row["launcher"], row["ssh_loop"])
            row["launcher_ok"] = row["launcher_over_a"] is not None and row["launcher_over_a"] <= TARGET_PLAIN
            row["preflight_over_a"] = ratio(row["launcher_preflight"], row["ssh_loop"])
            row["preflight_over_a_paired"] = paired_ratio(row["launcher_preflight"], row["ssh_loop"])
            over = row["preflight_over_a"]
            row["preflight_ok"] = over is not None and over <= TARGET_PREFLIGHT
            rows.append(row)
            log(f"fan-out {n}: a {row['ssh_loop']['median']:.2f}s, launcher {row['launcher']['median']:.2f}s, "
                f"with preflight {row['launcher_preflight']['median']:.2f}s")
    return {"rows": rows, "failed_launches": FAILURES, "light_command": "PYTHON -c pass", "repeat": repeat}
