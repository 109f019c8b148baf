"""torchrun's python started before `go` (launcher/node/agent/prestart.py): it imports torch's launcher module at once,
makes nothing until it is let go, then runs torchrun's planned words in its folder with its environment, its output
into torchrun's log. Real processes here, a stand-in torch on PYTHONPATH (no torch import)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.node.agent.prestart import hold
from launcher.node.agent.storewait import waiting_argv

RUN = ("import os, sys, time\nprint(repr(time.time()), __name__, os.getcwd(), os.environ.get('ASKED'), "
       "*sys.argv[1:])\n")


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """torch.distributed.launcher.api says something and notes when it was imported; torch.distributed.run prints
    when it ran, as what, where, an environment value and its words."""
    root = tmp_path / "site"
    for package in ("torch", "torch/distributed", "torch/distributed/launcher"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "torch/distributed/launcher/api.py").write_text(
        "import os, sys, time\nprint('UserWarning: said while importing', file=sys.stderr)\n"
        "with open(os.environ['IMPORTED'], 'w') as f:\n    f.write(repr(time.time()))\n")
    (root / "torch/distributed/run.py").write_text(RUN)
    return root


def _env(stand_in: Path, tmp_path: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(stand_in), "IMPORTED": str(tmp_path / "imported"), "ASKED": "yes",
            "PATH": os.environ["PATH"]}


def _planned(*extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", *extra, "train.py"]


def _wait_for(path: Path, seconds: float = 20) -> None:
    end = time.monotonic() + seconds
    while not path.exists() or not path.read_text():
        assert time.monotonic() < end, f"{path} never written"
        time.sleep(0.02)


def _gone(pid: int, seconds: float = 5) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.02)
    return False


def test_it_imports_at_once_and_runs_torchrun_only_when_let_go(stand_in: Path, tmp_path: Path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    log = tmp_path / "torchrun.log"
    log.touch()
    env = _env(stand_in, tmp_path)
    held = hold(_planned(), str(workdir), env)
    assert held is not None
    _wait_for(tmp_path / "imported")
    time.sleep(0.3)
    assert log.read_text() == ""  # nothing runs, nothing is written, before `go`
    assert held.proc.poll() is None
    let_go = time.time()
    proc = held.release(_planned(), dict(env), str(log))
    assert proc is held.proc
    assert proc.wait() == 0
    said, ran = log.read_text().split("\n", 1)
    assert said == "UserWarning: said while importing"  # what it printed before `go`, first in torchrun's log
    ran_at, name, cwd, asked, *argv = ran.split()
    assert float(ran_at) >= let_go > float((tmp_path / "imported").read_text())
    assert (name, cwd, asked) == ("__main__", str(workdir), "yes")
    assert argv == ["--nnodes", "2", "train.py"]
    held.drop()  # once let go, nothing: torchrun is the run's now
    assert proc.returncode == 0


def test_the_store_wait_form_runs_too(stand_in: Path, tmp_path: Path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        planned = waiting_argv(_planned(), {"node_rank": 1, "master_addr": "127.0.0.1", "master_port": port},
                               10.0, 0.02)
        log = tmp_path / "torchrun.log"
        log.touch()
        held = hold(planned, str(tmp_path), _env(stand_in, tmp_path))
        assert held is not None
        proc = held.release(planned, _env(stand_in, tmp_path), str(log))
        assert proc is not None and proc.wait() == 0
    assert log.read_text().splitlines()[1].split()[1:] == ["__main__", str(tmp_path), "yes", "--nnodes", "2",
                                                            "train.py"]


def test_other_words_or_environment_than_it_started_with_end_it(stand_in: Path, tmp_path: Path):
    env = _env(stand_in, tmp_path)
    held = hold(_planned(), str(tmp_path), env)
    assert held is not None
    assert held.release(_planned(), dict(env, ASKED="other"), str(tmp_path / "log")) is None
    assert held.proc.returncode == -signal.SIGKILL
    held = hold(_planned(), str(tmp_path), env)
    assert held.release(_planned("--max-restarts", "1"), env, str(tmp_path / "log")) is None
    assert held.proc.returncode == -signal.SIGKILL


def test_a_dropped_start_is_killed_and_waited_for(stand_in: Path, tmp_path: Path):
    held = hold(_planned(), str(tmp_path), _env(stand_in, tmp_path))
    assert held is not None
    held.drop()
    assert held.proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "log").exists()


def test_only_the_launchers_torchrun_is_held(stand_in: Path, tmp_path: Path):
    assert hold([sys.executable, "train.py"], str(tmp_path), _env(stand_in, tmp_path)) is None
    assert hold(["no-such-python", "-m", "torch.distributed.run"], str(tmp_path), _env(stand_in, tmp_path)) is None


def _held_by_an_agent_killed(planned: list[str], stand_in: Path, tmp_path: Path) -> int:
    """An agent process holds torchrun's python for `planned`, then dies by kill -9 once it has imported; the held
    process's pid."""
    agent = subprocess.Popen(
        [sys.executable, "-c", "import sys; from launcher.node.agent.prestart import hold\n"
         f"held = hold({planned!r}, {str(tmp_path)!r}, {_env(stand_in, tmp_path)!r})\n"
         "print(held.proc.pid, flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        pid = int(agent.stdout.readline())
        _wait_for(tmp_path / "imported")
        assert not _gone(pid, 0.2)
    finally:
        agent.kill()
        agent.wait()
    return pid


def test_it_dies_with_the_agent_that_held_it(stand_in: Path, tmp_path: Path):
    """kill -9 of the agent before `go`: the held python does not outlive it (the kernel's parent-death signal)."""
    assert _gone(_held_by_an_agent_killed(_planned(), stand_in, tmp_path))


def _wrapper(tmp_path: Path) -> str:
    """A node's `python:` as many sites have it: a shell script that runs python without `exec`, and stays."""
    path = tmp_path / "python-wrapper"
    path.write_text(f"#!/bin/bash\n{sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def test_a_python_wrapper_that_does_not_exec_is_held_and_runs_torchrun(stand_in: Path, tmp_path: Path):
    """The held python's parent is the wrapper, not the agent: it waits for `go` all the same."""
    log = tmp_path / "torchrun.log"
    log.touch()
    env = _env(stand_in, tmp_path)
    planned = [_wrapper(tmp_path), *_planned()[1:]]
    held = hold(planned, str(tmp_path), env)
    assert held is not None
    _wait_for(tmp_path / "imported")
    time.sleep(0.3)
    assert held.proc.poll() is None  # still held: it did not take the wrapper for a dead agent
    proc = held.release(planned, dict(env), str(log))
    assert proc is held.proc and proc.wait() == 0
    ran = log.read_text().splitlines()
    assert ran[1].split()[1:] == ["__main__", str(tmp_path), "yes", "--nnodes", "2", "train.py"], ran


def test_behind_a_wrapper_it_ends_with_the_agent(stand_in: Path, tmp_path: Path):
    """kill -9 of the agent: the parent-death signal reaches the wrapper only, and the held python ends at the
    end of the agent's pipe instead."""
    assert _gone(_held_by_an_agent_killed([_wrapper(tmp_path), *_planned()[1:]], stand_in, tmp_path))
