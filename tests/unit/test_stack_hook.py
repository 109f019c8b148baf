"""The workers' stack hook (launcher/node/worker/hook.py's `stacks`) as a worker runs it: it answers the look's signal
while it runs, so does a forked child (a DataLoader worker), and a look that comes as the worker exits never ends it
(Python's exit puts back the signal's action found before faulthandler: the default ends the process)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from launcher.node.agent import stackdump

EXITING = "import sys\nprint('up', flush=True)\nsys.stdin.readline()\nprint('bye', flush=True)\n"
# The child lives until the parent ends it (3 s were not enough under a loaded suite: it was gone before the look).
FORKING = ("import os, sys, time\npid = os.fork()\nif pid == 0:\n    time.sleep(120)\n    os._exit(0)\n"
           "print(pid, flush=True)\nsys.stdin.readline()\nos.kill(pid, 9)\nos.waitpid(pid, 0)\n")


def _worker(tmp_path: Path, source: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    stackdump.install_hook(str(tmp_path), env)
    return subprocess.Popen([sys.executable, "-c", source], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def _answer(tmp_path: Path, pid: int) -> str:
    deadline = time.monotonic() + 10
    path = tmp_path / stackdump.STACKS_DIR / f"{pid}.txt"
    while time.monotonic() < deadline and not (path.exists() and path.read_text()):
        time.sleep(0.02)
    return path.read_text()


def test_a_look_as_the_worker_exits_never_ends_it(tmp_path: Path) -> None:
    signum = stackdump.stack_signal()
    for _ in range(8):
        proc = _worker(tmp_path, EXITING)
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline() == "up\n"
        os.kill(proc.pid, signum)
        assert "most recent call first" in _answer(tmp_path, proc.pid)
        proc.stdin.write("\n")
        proc.stdin.flush()
        while proc.poll() is None:  # looks all through its exit
            try:
                os.kill(proc.pid, signum)
            except ProcessLookupError:
                break
            time.sleep(0.0005)
        assert proc.wait() == 0


def test_a_forked_child_answers_with_a_file_of_its_own(tmp_path: Path) -> None:
    proc = _worker(tmp_path, FORKING)
    assert proc.stdout is not None and proc.stdin is not None
    child = int(proc.stdout.readline())
    own = tmp_path / stackdump.STACKS_DIR / f"{child}.txt"
    deadline = time.monotonic() + 10
    while not own.exists() and time.monotonic() < deadline:  # made as the child registers (a look asks only then)
        time.sleep(0.02)
    os.kill(child, stackdump.stack_signal())
    assert "most recent call first" in _answer(tmp_path, child)
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=10) == 0
