"""Figure 4 (stop): a sleeping 4-node job (bench/workloads/sleeper.py under torchrun), stopped three ways.

- Ctrl-C on an attached `inv launch`: SIGINT to the launcher's process group; time until no process of the run
  is left on any node (the run's processes all carry DDP_LAUNCHER_RUN=<run id>/<node>; polled every 20 ms).
- `inv stop --run ID` on a `--detach`ed run: time from starting `inv stop` until none is left.
- (d) the floor: the same torchrun processes started locally, SIGTERM to their process groups directly.
- (a) Ctrl-C on the ssh loop (SIGINT to the loop's process group, as a terminal would): how many remote processes
  are still there after a while. The bench then kills them by their own mark, so nothing is left behind.

The job counts as running once every node's torchrun has a worker printing ticks.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.baselines import ssh_loop_script
from bench.common import (
    REPO,
    RUN_ID,
    Box,
    finish,
    free_port,
    kill_marked,
    log,
    node_run_dir,
    note_runs,
    pids_with_env,
    read_text,
    run_processes,
    sandbox_of,
    stats,
    wait_gone,
    wait_until,
)
from bench.job import with_port
from devtools.sandbox.procs import table as process_table
from launcher.node.wire import RUN_ID_ENV

NODES = 4
SCRIPT = "bench/workloads/sleeper.py"
ARGS = ["0.2"]
TARGET_S = 2.0
GONE_TIMEOUT_S = 20.0
A_WATCH_S = 3.0
"""How long (a)'s remote processes are watched after Ctrl-C before they are counted as left."""
TICK = re.compile(r"tick \d+ rank (\d+)")




_wait_for = functools.partial(wait_until, poll=0.05)
"""Wait for a condition at this figure's poll interval (common.wait_until)."""

def _context(box: Box, out: Path, run_id: str | None) -> str:
    """What the launcher printed and each node's log ends with: for the report when a run did not come up."""
    parts = [f"launcher output: ...{read_text(out)[-800:]}"]
    if run_id:
        for i in range(NODES):
            parts.append(f"node-{i} log: ...{read_text(node_run_dir(box, i, run_id) / 'log')[-300:]}")
    return "\n".join(parts)


def _ticking(box: Box, run_id: str) -> bool:
    """Every node's run log shows a worker's tick."""
    return all("tick" in read_text(node_run_dir(box, i, run_id) / "log") for i in range(NODES))


def _inv(*args: str, log_dir: Path, out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(log_dir)}
    with open(out, "wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, env=env, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)


def sigint_attached(box: Box, root: Path, k: int) -> dict[str, Any]:
    inventory = with_port(box, free_port(), root)
    out = root / f"attached-{k}.out"
    proc = _inv("launch", "--hosts", str(inventory), log_dir=root / "logs", out=out)
    run_id = None
    try:
        try:
            run_id = _wait_for(lambda: (m := RUN_ID.search(read_text(out))) and m.group(1), 60, "the run id")
            note_runs(run_id and f"run {run_id}")
            _wait_for(lambda: _ticking(box, run_id), 60, "every node to tick")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{_context(box, out, run_id)}") from None
        start = time.perf_counter()
        os.killpg(proc.pid, signal.SIGINT)
        gone_s, left, first_s = wait_gone(lambda: run_processes(run_id), GONE_TIMEOUT_S, start=start)
        code = finish(proc)
        exited_s = time.perf_counter() - start
        return {"gone_s": gone_s, "left": left, "first_gone_s": first_s, "launcher_exit_s": exited_s,
                "launcher_code": code}
    finally:
        if proc.poll() is None:
            finish(proc, 0.1)
        if run_id:
            kill_marked(f"{RUN_ID_ENV}={run_id}/".encode())


def inv_stop_detached(box: Box, root: Path, k: int) -> dict[str, Any]:
    inventory = with_port(box, free_port(), root)
    out = root / f"detached-{k}.out"
    run_id = None
    try:
        launch = _inv("launch", "--hosts", str(inventory), "--detach", log_dir=root / "logs", out=out)
        if finish(launch, 60) != 0:
            raise RuntimeError(f"inv launch --detach failed:\n{read_text(out)[-2000:]}")
        match = RUN_ID.search(read_text(out))
        if not match:
            raise RuntimeError(f"no run id in:\n{read_text(out)[-2000:]}")
        run_id = match.group(1)
        note_runs(f"run {run_id}")
        try:
            _wait_for(lambda: _ticking(box, run_id), 60, "every node to tick")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{_context(box, out, run_id)}") from None
        start = time.perf_counter()
        stopper = _inv("stop", "--hosts", str(inventory), "--run", run_id, log_dir=root / "logs",
                       out=root / f"stop-{k}.out")
        gone_s, left, first_s = wait_gone(lambda: run_processes(run_id), GONE_TIMEOUT_S, start=start)
        code = finish(stopper)
        return {"gone_s": gone_s, "left": left, "first_gone_s": first_s, "stop_exit_s": time.perf_counter() - start,
                "stop_code": code}
    finally:
        if run_id:
            kill_marked(f"{RUN_ID_ENV}={run_id}/".encode())


def sigint_ssh_loop(box: Box, root: Path, k: int) -> dict[str, Any]:
    port = free_port()
    token = f"bench-{secrets.token_hex(4)}"
    mark = f"DDP_BENCH_MARK={token}".encode()
    commands = [
        f"cd {shlex.quote(str(REPO))} && env {box.tmp_words}DDP_BENCH_MARK={token} "
        + shlex.join([box.python, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node-rank", str(i),
                      "--nproc-per-node", "1", "--master-addr", "node-0", "--master-port", str(port), SCRIPT, *ARGS])
        for i in range(NODES)
    ]
    out = root / f"loop-{k}.out"
    with open(out, "wb") as sink:
        loop = subprocess.Popen(["bash", "-c", ssh_loop_script(box.ssh_config, commands)], stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            _wait_for(lambda: len(set(TICK.findall(read_text(out)))) == NODES, 60, "every rank of the ssh loop to tick")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{_context(box, out, None)}") from None
        remote_before = len(pids_with_env(mark))
        start = time.perf_counter()
        os.killpg(loop.pid, signal.SIGINT)
        gone_s, left, _ = wait_gone(lambda: pids_with_env(mark), A_WATCH_S, start=start)
        loop_code = finish(loop, 5)
        ssh_clients_left = _group_members(loop.pid)
        return {"gone_s": gone_s, "left": left, "remote_before": remote_before, "loop_exit_s":
                time.perf_counter() - start, "loop_code": loop_code, "ssh_clients_left": ssh_clients_left}
    finally:
        # Clean up what (a) leaves: its ssh clients (still in the loop's process group) and, by their mark, the
        # remote torchrun processes and workers.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(loop.pid, signal.SIGKILL)
        if loop.poll() is None:
            loop.wait()
        kill_marked(mark)


def sigterm_local(box: Box, root: Path, k: int) -> dict[str, Any]:
    """(d) the floor: the same 4 torchrun processes started locally, each its own process group, stopped by
    SIGTERM to those groups directly; how long torchrun and its workers take to go."""
    port = free_port()
    token = f"bench-{secrets.token_hex(4)}"
    mark = f"DDP_BENCH_MARK={token}".encode()
    env = {**os.environ, "DDP_BENCH_MARK": token, "TMPDIR": str(box.root)}
    out = root / f"local-{k}.out"
    procs = []
    try:
        with open(out, "wb") as sink:
            for i in range(NODES):
                procs.append(subprocess.Popen(
                    [box.python, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node-rank", str(i),
                     "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), SCRIPT, *ARGS],
                    cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True))
        try:
            _wait_for(lambda: len(set(TICK.findall(read_text(out)))) == NODES, 60, "every local rank to tick")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{_context(box, out, None)}") from None
        start = time.perf_counter()
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        gone_s, left, first_s = wait_gone(lambda: pids_with_env(mark), GONE_TIMEOUT_S, start=start)
        return {"gone_s": gone_s, "left": left, "first_gone_s": first_s}
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        kill_marked(mark)


def _group_members(pgid: int) -> int:
    """How many live processes are in process group `pgid`."""
    return sum(1 for entry in process_table().values() if entry.pgrp == pgid)


def run(repeat: int, root: Path, baselines_every_run: bool = True) -> dict[str, Any]:
    """`repeat` runs of each launcher way; (a) and (d) every run, or only in the first with `baselines_every_run`
    off (--quick: (a) leaves its processes every time, and (d) is context, not a target)."""
    results: dict[str, list[dict[str, Any]]] = {key: [] for key in ("sigint", "inv_stop", "ssh_loop_sigint",
                                                                     "local_sigterm")}
    failures: list[dict[str, str]] = []

    def trial(key: str, fn: Any, box: Box, k: int) -> None:
        """One measurement; a run that did not come up (before any stop) is recorded and tried again, once."""
        for attempt in range(2):
            try:
                results[key].append(fn(box, root, 10 * k + attempt))
                return
            except RuntimeError as exc:
                failures.append({"way": key, "run": str(k), "error": str(exc)[-2500:]})
                log(f"stop: {key} run {k} did not come up: {str(exc).splitlines()[0]}")

    with sandbox_of(NODES, root, script=SCRIPT, script_args=ARGS) as box:
        log(f"stop: {NODES} nodes, {repeat} runs of each way")
        for k in range(repeat):
            trial("sigint", sigint_attached, box, k)
            trial("inv_stop", inv_stop_detached, box, k)
            if baselines_every_run or k == 0:
                trial("ssh_loop_sigint", sigint_ssh_loop, box, k)
                trial("local_sigterm", sigterm_local, box, k)
            log(f"stop run {k}: " + ", ".join(f"{key} gone {v[-1]['gone_s']} left {v[-1]['left']}"
                                               for key, v in results.items() if v))
    summary: dict[str, Any] = {"nodes": NODES, "repeat": repeat, "runs": results, "start_failures": failures}
    for key in ("sigint", "inv_stop", "local_sigterm"):
        runs = results[key]
        gone = [r["gone_s"] for r in runs if r["gone_s"] is not None]
        summary[key] = {**stats(gone), "left_total": sum(r["left"] for r in runs),
                        "timeouts": sum(r["gone_s"] is None for r in runs),
                        "first_gone": stats([r["first_gone_s"] for r in runs if r["first_gone_s"] is not None])}
        summary[f"{key}_ok"] = (bool(runs) and summary[key]["timeouts"] == 0 and summary[key]["left_total"] == 0
                                and all(g <= TARGET_S for g in gone))
    loop = results["ssh_loop_sigint"]
    summary["ssh_loop_sigint"] = {
        "left": stats([r["left"] for r in loop]),
        "remote_before": stats([r["remote_before"] for r in loop]),
        "ssh_clients_left": stats([r["ssh_clients_left"] for r in loop]),
        "watched_s": A_WATCH_S,
    }
    return summary
