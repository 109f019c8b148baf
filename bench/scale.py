"""Figure `scale`: the launcher at 128 and 256 nodes beside the ssh loop and pdsh, measured in one run.

    python -m bench.run --only scale          (~15 minutes on 2 cores)

Per N (one sandbox each; 256 nodes from 127.0.K.2 span two /24s; light commands, no torch):
  fan-out   `PYTHON -c pass` on every node: the launcher (a fresh process, bench/_drive.py, imports included), the
            launcher with the doctor's preflight, (a) the ssh loop, (p) `pdsh -f N` and (p32) pdsh with its own
            default fan-out (32), interleaved in rotated order;
  doctor    `inv doctor --hosts INV` as typed (a fresh process, every check);
  on a detached light run (bench/workloads/hang_worker.py: a worker per node waiting in a stand-in collective):
            `inv status`, `inv top --once --json`, `inv stacks`, `inv stop`, each a fresh process as typed, with
            the size of its answer (lines, characters: bounded at any N);
  console   an attached launch's output: its line count and its first and last lines.
Every figure of the launcher is compared with (a)'s median on the same sandbox: an ssh loop reaching every node
with one light Python is the least any of these does. Each run's process tree is sampled (threads, fds, memory).
Then the launcher's cost per node from 2 to the largest N: its fan-out at 2, 8 and 32 nodes too (one run each),
CPU, peak memory, threads and fds fitted against N (`cost`). Stop against a pkill loop and pdsh at these sizes is
stop_scale's figure (`--only stop`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.baselines import have_pdsh, pdsh, ssh_loop
from bench.common import (
    DRIVER,
    MARK_ENV,
    REPO,
    RUN_ID,
    Box,
    fit_line,
    kill_marked,
    log,
    note_runs,
    run_processes,
    run_timed,
    sandbox_of,
    wait_gone,
)
from bench.fanout import driver_rss_kb, summary

WORKER = str(REPO / "bench" / "workloads" / "hang_worker.py")
SIZES = (128, 256)
COST_SIZES = (2, 8, 32)
"""Extra fan-out sizes (one run each) for the per-node cost lines from 2 nodes up."""
PDSH_DEFAULT_FANOUT = 32
OP_TIMEOUT_S = 300.0
TARGET = 1.0
"""Each operation against the ssh loop's light fan-out on the same nodes (#36)."""
CONSOLE_KEEP = 4
"""First and last lines of an attached launch's console kept in the results."""


def _light(box: Box) -> str:
    return f"{box.python} -c pass"


def fanout_once(box: Box, root: Path, variant: str) -> Any:
    """One timed, sampled fan-out of the light command by `variant`."""
    if variant == "ssh_loop":
        result = ssh_loop(box.ssh_config, [_light(box)] * box.n, timeout=OP_TIMEOUT_S, sample=True)
    elif variant in ("pdsh", "pdsh_32"):
        fan = box.n if variant == "pdsh" else PDSH_DEFAULT_FANOUT
        result = pdsh(box.ssh_config, box.n, _light(box), timeout=OP_TIMEOUT_S, fanout=fan, sample=True)
    else:
        argv = [*DRIVER, str(box.inventory), "--log-dir", str(root / "logs"),
                *(["--preflight"] if variant == "launcher_preflight" else [])]
        result = run_timed(argv, timeout=OP_TIMEOUT_S, sample=True)
        note_runs(result.stderr)
    if result.code != 0:
        raise RuntimeError(f"{variant} failed on {box.n} nodes (exit {result.code}):\n{result.stderr[-2000:]}")
    return result


def fanouts(box: Box, root: Path, runs: int) -> dict[str, Any]:
    variants = ["ssh_loop", *(["pdsh", "pdsh_32"] if have_pdsh() else []), "launcher", "launcher_preflight"]
    fanout_once(box, root, "ssh_loop")  # untimed warm-up: a fresh sshd's first sessions are slower for everyone
    # The launcher's first launch on fresh nodes is its own figure, outside the medians: every node compiles the
    # agent's modules once into its code cache (~40 ms of CPU a node), as a user's first launch after an upgrade.
    # With the preflight, as `inv launch` runs by default: the probe's modules are compiled then too (timed in the
    # preflight's medians, whose first run at 256 nodes took 21.5 s and the second 18.8 s).
    first = fanout_once(box, root, "launcher_preflight")
    got: dict[str, list[Any]] = {v: [] for v in variants}
    for rep in range(runs):
        for variant in variants[rep % len(variants):] + variants[:rep % len(variants)]:
            got[variant].append(fanout_once(box, root, variant))
    return {**{v: summary([r.seconds for r in got[v]], got[v], v.startswith("launcher")) for v in variants},
            "first_launch": {"seconds": round(first.seconds, 3)}}


def _inv(root: Path, *args: str, sample: bool = True) -> Any:
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(root / "logs")}
    return run_timed([sys.executable, "-m", "invoke", *args], timeout=OP_TIMEOUT_S, env=env, sample=sample)


def _answer(result: Any) -> dict[str, Any]:
    text = result.stdout + result.stderr
    return {"seconds": round(result.seconds, 3), "code": result.code, "lines": len(text.splitlines()),
            "chars": len(text), "first_line": (text.splitlines() or [""])[0][:300], "cpu_s": round(result.cpu_s, 3),
            "peak": result.peak}


def on_detached_run(box: Box, root: Path) -> dict[str, Any]:
    """status, top --once --json, stacks, then stop, on a detached light run whose workers wait in a collective."""
    argv = [*DRIVER, "--detach", "--log-dir", str(root / "logs"), str(box.inventory), "--", box.python, WORKER]
    started = run_timed(argv, timeout=OP_TIMEOUT_S)
    match = RUN_ID.search(started.stdout + started.stderr)
    if started.code != 0 or not match:
        raise RuntimeError(f"the detached launch failed (exit {started.code}):\n{started.stderr[-2000:]}")
    run_id = match.group(1)
    note_runs(f"run {run_id}")
    try:
        deadline = time.monotonic() + OP_TIMEOUT_S
        while len(run_processes(run_id)) < 2 * box.n and time.monotonic() < deadline:  # stand-in and its worker
            time.sleep(0.2)
        hosts = ("--hosts", str(box.inventory), "--run", run_id)
        out = {"detached_launch_s": round(started.seconds, 3),
               "status": _answer(_inv(root, "status", *hosts)),
               "top": _answer(_inv(root, "top", "--once", "--json", *hosts)),
               "stacks": _answer(_inv(root, "stacks", *hosts))}
        t0 = time.perf_counter()
        stop = _inv(root, "stop", *hosts)
        gone_s, left, _ = wait_gone(lambda: run_processes(run_id), 60.0, start=t0)
        out["stop"] = {**_answer(stop), "gone_s": gone_s, "left": left}
        return out
    finally:
        kill_marked(f"{MARK_ENV}={run_id}/".encode())


def console(box: Box, root: Path) -> dict[str, Any]:
    """An attached light launch as a user sees it: how many lines, the first and the last."""
    result = run_timed([*DRIVER, str(box.inventory), "--log-dir", str(root / "logs")], timeout=OP_TIMEOUT_S)
    lines = [line for line in (result.stdout + result.stderr).splitlines() if not line.startswith("bench-driver")]
    return {"lines": len(lines), "first": lines[:CONSOLE_KEEP], "last": lines[-CONSOLE_KEEP:], "code": result.code}


def at_size(n: int, root: Path, runs: int) -> dict[str, Any]:
    with sandbox_of(n, root, script="bench/workloads/lines.py") as box:
        log(f"scale: {n} nodes, fan-out x{runs}")
        row: dict[str, Any] = {"nodes": n, **fanouts(box, root, runs)}
        log(f"scale: {n} nodes, the doctor and the console")
        row["doctor"] = _answer(_inv(root, "doctor", "--hosts", str(box.inventory)))
        row["console"] = console(box, root)
        log(f"scale: {n} nodes, status, top, stacks and stop on a detached run")
        row.update(on_detached_run(box, root))
    loop = row["ssh_loop"]["median"]
    row["over_a"] = {k: round(row[k]["median" if "median" in row[k] else "seconds"] / loop, 2)
                     for k in ("launcher", "launcher_preflight", "doctor", "status", "top", "stacks", "stop")}
    if "pdsh" in row:
        row["over_a"].update(pdsh=round(row["pdsh"]["median"] / loop, 2), pdsh_32=round(row["pdsh_32"]["median"]
                                                                                         / loop, 2))
    log(f"scale {n}: " + ", ".join(f"{k} {v}x" for k, v in row["over_a"].items()))
    return row


def cost(root: Path, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The launcher's fan-out cost per node, from COST_SIZES (one run each) and the rows' sizes."""
    points = []
    for n in COST_SIZES:
        with sandbox_of(n, root, script="bench/workloads/lines.py") as box:
            fanout_once(box, root, "ssh_loop")
            result = fanout_once(box, root, "launcher")
            points.append({"nodes": n, "seconds": result.seconds, "cpu_s": result.cpu_s, **(result.peak or {}),
                           "rss_kb": driver_rss_kb(result)})
    for r in rows:
        u = r["launcher"]
        points.append({"nodes": r["nodes"], "seconds": u["median"], "cpu_s": u["cpu_s"]["median"],
                       "threads": u["peak_threads"]["median"], "fds": u["peak_fds"]["median"],
                       "rss_kb": (u.get("peak_rss_mb", {}).get("median") or 0) * 1024,
                       "processes": u["peak_processes"]["median"]})
    ns = [p["nodes"] for p in points]
    fits = {key: fit_line(ns, [p.get(key) or 0 for p in points]) for key in ("seconds", "cpu_s", "threads", "fds")}
    fits["rss_mb"] = fit_line(ns, [(p.get("rss_kb") or 0) / 1024 for p in points])
    per_node = [{"nodes": p["nodes"], "cpu_ms": round(1000 * p["cpu_s"] / p["nodes"], 1),
                 "threads": round((p.get("threads") or 0) / p["nodes"], 2),
                 "fds": round((p.get("fds") or 0) / p["nodes"], 2)} for p in points]
    return {"points": points, "fits": fits, "per_node": per_node}


def run(sizes: list[int], runs: int, root: Path) -> dict[str, Any]:
    rows = [at_size(n, root, runs) for n in sizes]
    return {"rows": rows, "cost": cost(root, rows), "runs": runs, "target": TARGET,
            "pdsh_default_fanout": PDSH_DEFAULT_FANOUT}


if __name__ == "__main__":
    import json
    import tempfile

    sizes = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "128,256").split(",")]
    print(json.dumps(run(sizes, 2, Path(tempfile.mkdtemp(prefix="ddp-bench-scale-"))), indent=2))
