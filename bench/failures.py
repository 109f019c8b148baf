"""Figure (failures): what is left of an attached 2-node run after each way it can break, caused for real.

On a 2-node sandbox running bench/workloads/sleeper.py (nproc 1; grace 1 s, heartbeat and silence timeouts 4 s):
  crash     node 1's worker exits with code 3 (bench/workloads/exit_on_node.py, 0.5 s after it starts)
  torchrun  kill -9 of node 1's torchrun (the pid in its run directory's `leader` file)
  agent     kill -9 of node 1's agent (torchrun's parent)
  launcher  kill -9 of the launcher's process group
  sshd      node 1's sshd processes (listener and sessions) SIGSTOPped; SIGCONT once the row is measured, always
For each: the time from the fault to no process of the run on any node (every process of a run carries
DDP_LAUNCHER_RUN=<run id>/<node>; polled every 20 ms, at most 60 s), the launcher's exit code and when it exited,
and how many processes were still there after 60 s (the bench then kills them by their mark and counts them).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.common import (
    REPO,
    RUN_ID,
    Box,
    free_port,
    kill_marked,
    log,
    node_run_dir,
    note_runs,
    read_text,
    run_processes,
    sandbox_of,
    stats,
    wait_gone,
    wait_until,
)
from devtools.observe import children, gone, parent, processes_mentioning, sshd_family
from launcher.node.wire import RUN_ID_ENV

NODES = 2
SCRIPT = "bench/workloads/sleeper.py"
ARGS = ["0.2"]
CRASH_SCRIPT = "bench/workloads/exit_on_node.py"
CRASH_ARGS = ["1", "3"]
"""Node 1's worker exits with code 3 (after 0.5 s); node 0's waits."""
GRACE_S = 1.0
HEARTBEAT_TIMEOUT_S = 4.0
SILENCE_TIMEOUT_S = 4.0
CAP_S = 60.0
POLL_S = 0.02
MARGIN_S = 2.0
UP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Mode:
    key: str
    label: str
    launcher_survives: bool
    """The launcher lives through the fault (and should exit by itself, with a code that says what happened)."""

    @property
    def target_s(self) -> float:
        """Seconds allowed from the launcher's exit (or, for sshd, from the fault) to no process left: a killed
        launcher leaves the run to its nodes for the heartbeat timeout (it may come back, or `attach`)."""
        if self.key == "sshd":
            return SILENCE_TIMEOUT_S + GRACE_S + MARGIN_S
        return (HEARTBEAT_TIMEOUT_S if self.key == "launcher" else 0.0) + GRACE_S + MARGIN_S

    @property
    def target(self) -> str:
        if self.key == "sshd":
            return f"≤ silence timeout + grace + 2 s ({self.target_s:.0f} s) after the fault, 0 left"
        if self.key == "launcher":
            return (f"≤ heartbeat timeout + grace + 2 s ({self.target_s:.0f} s) after the kill (the nodes keep the run "
                    "for the bound), 0 left")
        return f"≤ grace + 2 s ({self.target_s:.0f} s) after the launcher's exit, 0 left"


MODES = (
    Mode("crash", "worker crash (node-1 exits 3)", True),
    Mode("torchrun", "kill -9 node-1's torchrun", True),
    Mode("agent", "kill -9 node-1's agent", True),
    Mode("launcher", "kill -9 launcher's process group", False),
    Mode("sshd", "node-1's sshd SIGSTOPped", True),
)


# --------------------------------------------------------------------------------------------------------------
# Finding the run's processes.




_wait_for = functools.partial(wait_until, poll=POLL_S)
"""Wait for a condition at this figure's poll interval (common.wait_until)."""

def _runs_on(box: Box, index: int) -> set[str]:
    folder = node_run_dir(box, index, "x").parent.parent
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def _leader(run_dir: Path) -> int | None:
    parts = read_text(run_dir / "leader").split()
    return int(parts[0]) if parts else None


# --------------------------------------------------------------------------------------------------------------
# One row, once.


def _inventory(box: Box, root: Path, crash: bool) -> Path:
    """A copy of the sandbox's inventory with a fresh master port (and the crashing job for the crash row)."""
    data = yaml.safe_load(box.inventory.read_text())
    port = free_port()
    data["rendezvous"]["master_port"] = port
    if crash:
        data["job"] = {"script": CRASH_SCRIPT, "args": CRASH_ARGS}
    path = root / f"inventory-{port}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _launch(inventory: Path, root: Path, out: Path) -> subprocess.Popen[bytes]:
    """`inv launch` in its own session (signals reach it as from a terminal), with the short timeouts."""
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(root / "logs"), "INVOKE_LAUNCHER_GRACE": str(GRACE_S),
           "INVOKE_LAUNCHER_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
           "INVOKE_LAUNCHER_SILENCE_TIMEOUT": str(SILENCE_TIMEOUT_S)}
    with open(out, "wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "invoke", "launch", "--hosts", str(inventory)], cwd=REPO,
                                env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def _context(box: Box, out: Path, run_id: str | None) -> str:
    """What the launcher printed and each node's log ends with: for the report when a run did not come up."""
    parts = [f"launcher output: ...{read_text(out)[-800:]}"]
    if run_id:
        for i in range(NODES):
            parts.append(f"node-{i} log: ...{read_text(node_run_dir(box, i, run_id) / 'log')[-300:]}")
    return "\n".join(parts)


def _crash_moment(leader: int) -> float:
    """Watch node 1's worker (torchrun's child running the crashing script) until it exits; when it did."""
    worker = _wait_for(lambda: sorted(set(children(leader)) & set(processes_mentioning(CRASH_SCRIPT))),
                       UP_TIMEOUT_S, "node-1's worker")[0]
    deadline = time.monotonic() + CAP_S
    while not gone(worker):
        if time.monotonic() > deadline:
            raise RuntimeError(f"node-1's worker {worker} did not exit within {CAP_S:.0f} s")
        time.sleep(0.005)
    return time.perf_counter()


def _cause(mode: Mode, box: Box, proc: subprocess.Popen[bytes], node1: Path, stopped: list[int]) -> float:
    """Cause the fault; return its moment (perf_counter). SIGSTOPped pids go into `stopped` as they are stopped."""
    leader = _wait_for(lambda: _leader(node1), UP_TIMEOUT_S, "node-1's torchrun")
    if mode.key == "crash":
        return _crash_moment(leader)
    if mode.key == "torchrun":
        start = time.perf_counter()
        os.kill(leader, signal.SIGKILL)
    elif mode.key == "agent":
        agent = parent(leader)  # gone: ProcessLookupError (an OSError), reported below like a run that did not come up
        start = time.perf_counter()
        os.kill(agent, signal.SIGKILL)
    elif mode.key == "launcher":
        start = time.perf_counter()
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        family = sshd_family(box.box.nodes[1].pid)
        if len(family) < 2:
            raise RuntimeError(f"node-1's sshd has no session under its listener: {family}")
        start = time.perf_counter()
        for pid in family:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
    return start


def _exit_watch(proc: subprocess.Popen[bytes]) -> tuple[threading.Thread, dict[str, float]]:
    """A thread that notes when the launcher exits (perf_counter), while the main thread polls the nodes."""
    seen: dict[str, float] = {}

    def watch() -> None:  # a blocking waitpid: Popen.wait(timeout) polls in 50 ms steps
        proc.wait()
        seen["at"] = time.perf_counter()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


def _root_cause(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if "root cause" in line]
    return lines[0][:240] if lines else " ".join(text.split())[-240:]


def once(mode: Mode, box: Box, root: Path, k: int) -> dict[str, Any]:
    """Start a run, let it come up, cause the fault, measure; nothing of the run is left when it returns."""
    out = root / f"failure-{mode.key}-{k}.out"
    before = _runs_on(box, 1)
    proc = _launch(_inventory(box, root, mode.key == "crash"), root, out)
    watcher, seen = _exit_watch(proc)
    run_id: str | None = None
    stopped: list[int] = []
    try:
        try:
            run_id = _wait_for(lambda: ((m := RUN_ID.search(read_text(out))) and m.group(1))
                               or next(iter(_runs_on(box, 1) - before), None), UP_TIMEOUT_S, "the run id")
            note_runs(f"run {run_id}")
            node1 = node_run_dir(box, 1, run_id)
            if mode.key != "crash":
                _wait_for(lambda: all("tick" in read_text(node_run_dir(box, i, run_id) / "log") for i in range(NODES)),
                          UP_TIMEOUT_S, "every node to tick", poll=0.05)
            start = _cause(mode, box, proc, node1, stopped)
        except (RuntimeError, OSError) as exc:
            raise RuntimeError(f"{exc}\n{_context(box, out, run_id)}") from None
        gone_s, left, _ = wait_gone(lambda: run_processes(run_id), CAP_S, poll=POLL_S, start=start)
        watcher.join(max(0.0, start + CAP_S - time.perf_counter()))
        exited = seen.get("at")
        code = proc.returncode if exited is not None else None
        if exited is None:  # still running after the cap: the figure says so, and it goes
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        exit_s = None if exited is None else exited - start
        killed = kill_marked(f"{RUN_ID_ENV}={run_id}/".encode()) if left else 0
        return {"run_id": run_id, "gone_s": None if gone_s is None else round(gone_s, 4), "left": max(left, killed),
                "launcher_code": code, "launcher_exit_s": None if exit_s is None else round(exit_s, 4),
                "gone_after_exit_s": None if gone_s is None or exit_s is None else round(gone_s - exit_s, 4),
                "root_cause": _root_cause(read_text(out))}
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        watcher.join(10)
        if run_id:
            kill_marked(f"{RUN_ID_ENV}={run_id}/".encode())


# --------------------------------------------------------------------------------------------------------------
# The figure.


def _met(mode: Mode, r: dict[str, Any]) -> bool:
    if r["gone_s"] is None or r["left"]:
        return False
    if mode.key == "sshd":
        return r["gone_s"] <= mode.target_s
    return r["launcher_exit_s"] is not None and r["gone_s"] <= r["launcher_exit_s"] + mode.target_s


def summarize(mode: Mode, runs: list[dict[str, Any]]) -> dict[str, Any]:
    gone = [r["gone_s"] for r in runs if r["gone_s"] is not None]
    exits = [r["launcher_exit_s"] for r in runs if r["launcher_exit_s"] is not None]
    return {"label": mode.label, "target": mode.target, "target_s": mode.target_s,
            "launcher_survives": mode.launcher_survives, "gone": stats(gone), "launcher_exit": stats(exits),
            "gone_after_exit": stats([r["gone_after_exit_s"] for r in runs if r["gone_after_exit_s"] is not None]),
            "codes": [r["launcher_code"] for r in runs], "left_total": sum(r["left"] for r in runs),
            "timeouts": sum(r["gone_s"] is None for r in runs),
            "launcher_not_exited": sum(r["launcher_exit_s"] is None for r in runs),
            "root_cause": runs[0]["root_cause"] if runs else "",
            "ok": bool(runs) and all(_met(mode, r) for r in runs)}


def run(repeat: int, root: Path) -> dict[str, Any]:
    """`repeat` runs of each failure mode, interleaved (crash, torchrun, agent, launcher, sshd, crash, ...)."""
    results: dict[str, list[dict[str, Any]]] = {m.key: [] for m in MODES}
    failures: list[dict[str, str]] = []
    with sandbox_of(NODES, root, script=SCRIPT, script_args=ARGS) as box:
        log(f"failures: {NODES} nodes, {repeat} run(s) of each of {len(MODES)} modes; grace {GRACE_S:g} s, "
            f"heartbeat and silence timeouts {HEARTBEAT_TIMEOUT_S:g} s")
        for k in range(repeat):
            for mode in MODES:
                for attempt in range(2):  # a run that did not come up (before any fault) is tried again, once
                    try:
                        r = once(mode, box, root, 10 * k + attempt)
                    except RuntimeError as exc:
                        failures.append({"way": mode.key, "run": str(k), "error": str(exc)[-2500:]})
                        log(f"failures: {mode.key} run {k} did not come up: {str(exc).splitlines()[0]}")
                        continue
                    results[mode.key].append(r)
                    log(f"failures: {mode.key} run {k}: gone {r['gone_s']} s, launcher {r['launcher_code']} at "
                        f"{r['launcher_exit_s']} s, {r['left']} left")
                    break
    return {"nodes": NODES, "repeat": repeat, "grace_s": GRACE_S, "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
            "silence_timeout_s": SILENCE_TIMEOUT_S, "cap_s": CAP_S, "runs": results, "start_failures": failures,
            "modes": {m.key: summarize(m, results[m.key]) for m in MODES}}
