"""Figure 1 (fan-out) and figure 6 (the launcher's own CPU and memory).

A light command (`PYTHON -c pass`) in place of torchrun on N nodes: the launcher, started as a fresh process by
bench/_drive.py (so its imports count, like a user's `inv launch`), against (a), a bash loop of `ssh node-i CMD &`
running the same command, and (p) `pdsh -R ssh -f N` running it. With the doctor's fast checks
(`RunIO(gate=...)`) too, up to 16 nodes. Every run's process tree is sampled for its peak threads, file
descriptors and memory (bench/usage.py); `fits` are least-squares lines against N (the per-node cost).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench.baselines import have_pdsh, pdsh, ssh_loop
from bench.common import DRIVER, Box, fit_line, log, note_runs, paired_ratio, ratio, run_timed, sandbox_of, stats

TARGET_PLAIN = 1.0
"""The plain fan-out against the ssh loop from 8 nodes up (#25); below 8, TARGET_SMALL."""
TARGET_SMALL = 1.25
SMALL_N = 8


def target_plain(n: int) -> float:
    """The plain fan-out's target at `n` nodes: the launcher's fixed start-up weighs more where the loop is short."""
    return TARGET_SMALL if n < SMALL_N else TARGET_PLAIN

TARGET_PREFLIGHT = 1.25

FAILURES: list[dict[str, Any]] = []
"""Launches that failed (e.g. a preflight check that failed under load): kept for the report, then retried."""


def drive(box: Box, root: Path, preflight: bool, tries: int = 3, sample: bool = False) -> Any:
    argv = [*DRIVER, str(box.inventory), "--log-dir", str(root / "logs")]
    if preflight:
        argv.append("--preflight")
    for _ in range(tries):
        result = run_timed(argv, timeout=120, sample=sample)
        note_runs(result.stderr)
        if result.code == 0 and "exited 0" in result.stderr:
            return result
        FAILURES.append({"nodes": box.n, "preflight": preflight, "code": result.code, "seconds":
                         round(result.seconds, 3), "stderr_tail": result.stderr[-1500:]})
        log(f"fan-out: the launcher failed on {box.n} nodes (preflight {preflight}), exit {result.code}: "
            f"{result.stderr.strip().splitlines()[-1:] }")
    raise RuntimeError(f"the launcher failed {tries} times (exit {result.code}) on {box.n} nodes:\n"
                       f"{result.stderr[-2000:]}")


def baseline(box: Box, sample: bool = False) -> Any:
    result = ssh_loop(box.ssh_config, [f"{box.python} -c pass"] * box.n, timeout=120, sample=sample)
    if result.code != 0:
        raise RuntimeError(f"the ssh loop failed (exit {result.code}):\n{result.stderr[-2000:]}")
    return result


def with_pdsh(box: Box, sample: bool = False) -> Any:
    result = pdsh(box.ssh_config, box.n, f"{box.python} -c pass", timeout=120, sample=sample)
    if result.code != 0:
        raise RuntimeError(f"pdsh failed (exit {result.code}):\n{result.stderr[-2000:]}")
    return result


def _measure(box: Box, root: Path, variant: str) -> Any:
    if variant == "ssh_loop":
        return baseline(box, sample=True)
    if variant == "pdsh":
        return with_pdsh(box, sample=True)
    return drive(box, root, variant == "launcher_preflight", sample=True)


def driver_rss_kb(result: Any) -> int | None:
    """The launcher's own peak memory (VmHWM, kB), as bench/_drive.py prints it at its exit."""
    found = re.search(r"bench-driver-peak-rss-kb: (\d+)", result.stderr)
    return int(found.group(1)) if found else None


def summary(times: list[float], usage: list[Any], with_rss: bool) -> dict[str, Any]:
    """A method's times and what its runs cost (CPU; the process tree's peak processes, threads, fds, memory)."""
    out = stats(times)
    out["cpu_s"] = stats([u.cpu_s for u in usage])
    for key in ("processes", "threads", "fds"):
        out[f"peak_{key}"] = stats([u.peak[key] for u in usage if u.peak])
    out["tree_rss_mb"] = stats([round(u.peak["rss_kb"] / 1024, 1) for u in usage if u.peak])
    if with_rss:  # the driver's own VmHWM (exact); the tree's sampled sum above is comparable across methods
        rss = [kb for u in usage if (kb := driver_rss_kb(u)) is not None]
        out["peak_rss_mb"] = stats([round(kb / 1024, 1) for kb in rss])
    return out


def run(sizes: list[int], repeat: int | dict[int, int], root: Path, preflight_max: int = 16) -> dict[str, Any]:
    """`repeat`: runs per N (a number, or N -> runs); the preflight variant only up to `preflight_max` nodes (above,
    the doctor figure has the probe's cost)."""
    rows = []
    use_pdsh = have_pdsh()
    if not use_pdsh:
        log("fan-out: pdsh is not installed (scripts/setup installs it): no pdsh baseline")
    for n in sizes:
        # The inventory's script is only read by the preflight's script check: one of ours, that nobody edits.
        with sandbox_of(n, root, script="bench/workloads/lines.py") as box:
            runs = repeat if isinstance(repeat, int) else repeat.get(n, 3)
            variants = ["ssh_loop", *(["pdsh"] if use_pdsh else []), "launcher",
                        *(["launcher_preflight"] if n <= preflight_max else [])]
            log(f"fan-out: {n} nodes, {runs} runs of {', '.join(variants)}")
            # Untimed warm-up: the first sessions of a fresh sshd and the first imports are slower for everyone.
            baseline(box)
            if n <= preflight_max:  # above, one session per node more costs seconds and warms nothing new
                drive(box, root, False)
            times: dict[str, list[float]] = {v: [] for v in variants}
            usage: dict[str, list[Any]] = {v: [] for v in variants}
            for rep in range(runs):
                order = variants[rep % len(variants):] + variants[:rep % len(variants)]  # rotate the order
                for variant in order:
                    result = _measure(box, root, variant)
                    times[variant].append(result.seconds)
                    usage[variant].append(result)
            row: dict[str, Any] = {"nodes": n}
            for variant in variants:
                row[variant] = summary(times[variant], usage[variant], variant.startswith("launcher"))
            row["launcher_over_a"] = ratio(row["launcher"], row["ssh_loop"])
            row["launcher_over_a_paired"] = paired_ratio(row["launcher"], row["ssh_loop"])
            row["launcher_ok"] = row["launcher_over_a"] is not None and row["launcher_over_a"] <= target_plain(n)
            if use_pdsh:
                row["launcher_over_p"] = ratio(row["launcher"], row["pdsh"])
            if "launcher_preflight" in row:
                row["preflight_over_a"] = ratio(row["launcher_preflight"], row["ssh_loop"])
                row["preflight_over_a_paired"] = paired_ratio(row["launcher_preflight"], row["ssh_loop"])
                over = row["preflight_over_a"]
                row["preflight_ok"] = over is not None and over <= TARGET_PREFLIGHT
            rows.append(row)
            log(f"fan-out {n}: " + ", ".join(f"{v} {row[v]['median']:.2f}s" for v in variants))
    return {"rows": rows, "failed_launches": FAILURES, "light_command": "PYTHON -c pass",
            "repeat": repeat if isinstance(repeat, int) else {str(k): v for k, v in repeat.items()},
            "pdsh": use_pdsh, "pdsh_fanout": "N (all nodes at once)", "fits": fits(rows)}


def fits(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Least-squares lines against N: seconds and CPU seconds for each method; the launcher's threads, fds, memory."""
    out: dict[str, Any] = {}
    for variant in ("ssh_loop", "pdsh", "launcher", "launcher_preflight"):
        have = [r for r in rows if variant in r and r[variant]["median"] is not None]
        ns = [r["nodes"] for r in have]
        out[variant] = {"seconds": fit_line(ns, [r[variant]["median"] for r in have]),
                        "cpu_s": fit_line(ns, [r[variant]["cpu_s"]["median"] for r in have]),
                        "threads": fit_line(ns, [r[variant]["peak_threads"]["median"] or 0 for r in have]),
                        "fds": fit_line(ns, [r[variant]["peak_fds"]["median"] or 0 for r in have]),
                        "tree_rss_mb": fit_line(ns, [r[variant]["tree_rss_mb"]["median"] or 0 for r in have])}
        if variant.startswith("launcher"):
            out[variant]["peak_rss_mb"] = fit_line(ns, [r[variant]["peak_rss_mb"]["median"] or 0 for r in have])
    return out
