"""Figure (reconnect): from a dropped connection to the stream flowing again, on a 2-node run that lives on.

An attached launch of bench/workloads/sleeper.py printing a line every 20 ms on each node; node 1's sshd session for
the launcher is SIGKILLed (what a roam or a NAT that forgot the flow does to a TCP connection) `repeat` times, 3 s
apart, in one run. For each drop: the time from the kill to the first line of node 1 that reaches the launcher's
console after it (the launcher's own stdout, read here and timed as each line arrives), and the reconnect's own
figure as the launcher says it (`opened again after X s`: from finding the session gone to the new one taken).
Then: every one of node 1's ticks came once (none lost, none twice), and the run is stopped (Ctrl-C) with nothing
left. The target: under 2 s, the reconnect's first try having no back-off.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from bench.common import (
    REPO,
    Box,
    free_port,
    log,
    node_run_dir,
    read_text,
    run_processes,
    sandbox_of,
    stats,
    wait_gone,
)
from devtools.observe import sshd_family

NODES = 2
SCRIPT = "bench/workloads/sleeper.py"
INTERVAL_S = 0.02
TARGET_S = 2.0
APART_S = 3.0
UP_TIMEOUT_S = 60.0
TICK = re.compile(r"^node-1 +r1 +\| tick (\d+) ")
REOPENED = re.compile(r"node-1: the connection dropped and was opened again after (\d+\.\d) s")


class Console:
    """The launcher's stdout, each line timed as it arrives (perf_counter)."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.lines: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            with self.lock:
                self.lines.append((time.perf_counter(), raw.decode("utf-8", "replace").rstrip("\n")))

    def first_tick_after(self, moment: float) -> float | None:
        with self.lock:
            return next((at for at, line in self.lines if at > moment and TICK.match(line)), None)

    def ticks(self) -> Counter[int]:
        with self.lock:
            return Counter(int(m.group(1)) for _, line in self.lines if (m := TICK.match(line)))


def _launch(box: Box, root: Path) -> subprocess.Popen[bytes]:
    data = yaml.safe_load(box.inventory.read_text())
    data["rendezvous"]["master_port"] = free_port()
    inventory = root / "reconnect.yaml"
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(root / "logs"), "INVOKE_LAUNCHER_GRACE": "1",
           "INVOKE_LAUNCHER_PAGE": "0"}
    with open(root / "reconnect.err", "wb") as err:
        return subprocess.Popen([sys.executable, "-m", "invoke", "launch", "--hosts", str(inventory)], cwd=REPO,
                                env=env, stdout=subprocess.PIPE, stderr=err, start_new_session=True)


def _drop(box: Box, console: Console) -> float:
    """Kill node 1's sshd sessions (the launcher's connection: the start session's, or after a drop the one whose
    `attach` took the run over); the seconds until node 1's stream flows again."""
    listener = box.box.nodes[1].pid
    sessions = [pid for pid in sshd_family(listener) if pid != listener]
    if not sessions:
        raise RuntimeError("node-1's sshd has no session")
    moment = time.perf_counter()
    for pid in sessions:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = moment + UP_TIMEOUT_S
    while (flowing := console.first_tick_after(moment)) is None:
        if time.perf_counter() > deadline:
            raise RuntimeError("node-1's stream did not come back within a minute")
        time.sleep(0.005)
    return flowing - moment


def run(repeat: int, root: Path) -> dict[str, Any]:
    with sandbox_of(NODES, root, script=SCRIPT, script_args=[str(INTERVAL_S)]) as box:
        log(f"reconnect: {NODES} nodes, {repeat} dropped connection(s) of node-1, {APART_S:g} s apart")
        proc = _launch(box, root)
        console = Console(proc)
        try:
            deadline = time.monotonic() + UP_TIMEOUT_S
            while not console.ticks() and time.monotonic() < deadline:
                time.sleep(0.05)
            run_id = next(iter(p.name for p in node_run_dir(box, 1, "x").parent.parent.iterdir()))
            flowing = []
            for k in range(repeat):
                time.sleep(APART_S)
                flowing.append(_drop(box, console))
                log(f"reconnect: drop {k}: node-1's stream flowing again after {flowing[-1]:.2f} s")
            time.sleep(1.0)
            os.killpg(proc.pid, signal.SIGTERM)  # as Ctrl-C: the run stopped on every node
            proc.wait(timeout=60)
            _, left, _ = wait_gone(lambda: run_processes(run_id), 30)
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

        said = [float(x) for x in REOPENED.findall(read_text(root / "reconnect.err"))]
        ticks = console.ticks()
    last = max(ticks) if ticks else -1
    lost = [i for i in range(last + 1) if i not in ticks]
    twice = sorted(i for i, n in ticks.items() if n > 1)
    summary = {"flowing": stats(flowing), "reconnect_said": stats(said), "drops": repeat, "ticks": last + 1,
               "lost": lost[:10], "twice": twice[:10], "left": left, "target_s": TARGET_S,
               "ok": bool(flowing) and max(flowing) <= TARGET_S and not lost and not twice and not left}
    log(f"reconnect: flowing again {summary['flowing']}, lost {len(lost)}, twice {len(twice)}, left {left}")
    return summary
