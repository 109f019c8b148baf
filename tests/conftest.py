"""Shared pytest fixtures: `make_sandbox` (a local cluster of real sshd nodes per test), `free_port`, `hostfile`."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools import sandbox
from devtools.observe import end_runs_under, reserve_base_addr
from devtools.observe import free_port as free_port  # re-exported: tests import it from here
from devtools.sandbox import Sandbox
from tests.helpers import PAGE_OFF
from tests.support.nodeenv import node_python

STAND_IN_ENV = {"PYTHONPATH": str(Path(__file__).parent / "support" / "torchrun_standin")}
"""What makes a node's `python -m torch.distributed.run` the tests' stand-in (it drops the folder for its workers)."""

# Sandboxes get 127.0.K.2, 127.0.K.3, ... with K from here, one K per sandbox in this process.
_SUBNETS = itertools.count(10)
_LAST_SUBNET = 250


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: starts real sshd servers and processes")
    # A suite started as a background job of a script (`cmd &`, nohup) inherits SIGINT ignored, and so would every
    # launcher it starts: their Ctrl-C tests then wait out their bounds. A handler here is reset to the default in
    # each child at exec, as a terminal's job would have it.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The run's page after an attached launch is a process of its own (matplotlib, a second or two of CPU, loading
    # the next test's 2 CPUs): off for every launch a test starts, whichever way, unless it turns it on (test_report).
    os.environ.update(PAGE_OFF)


class SandboxFactory:
    """`make_sandbox(nodes=2, **up_kwargs)`: a sandbox with its own state folder and addresses, downed at teardown."""

    def __init__(self, root: Path):
        self._root = root
        self.state_dirs: list[Path] = []
        """State folders of the sandboxes made (or tried), in order."""
        self._locks: list[contextlib.ExitStack] = []

    def reserve_base(self) -> str:
        """A base address 127.0.K.2 that no other sandbox of any process uses until teardown."""
        base, handle = reserve_base_addr(next(_SUBNETS), _LAST_SUBNET)
        self._locks.append(handle)
        return base

    def __call__(self, nodes: int = 2, *, torchrun: str = "real", **up_kwargs: Any) -> Sandbox:
        """`torchrun="stand-in"`: the nodes run tests/support/torchrun_standin's torchrun (no `import torch`, ~1.3
        CPU-seconds a node a launch), for a test of what the launcher does around its job (its mechanics, its
        verdicts on the workers: their stacks, records, collectives); the job may be a torch job (rank 0's worker
        serves its group's store). What torchrun itself does (elastic restarts, a c10d rendezvous, the error file
        `@record` writes, its names byte for byte) needs "real"."""
        if torchrun not in ("real", "stand-in"):
            raise ValueError(f"torchrun is 'real' or 'stand-in', not {torchrun!r}")
        if torchrun == "stand-in":
            up_kwargs["env"] = {**up_kwargs.get("env", {}), **STAND_IN_ENV}
        folder = self._root / f"sandbox-{len(self.state_dirs)}"
        up_kwargs.setdefault("state_dir", folder / "state")
        up_kwargs.setdefault("inventory", folder / "sandbox.yaml")
        up_kwargs.setdefault("ssh_port", 2222)
        # Every node program runs under the declared dependencies only (no numpy): as on a user's node venv.
        up_kwargs.setdefault("python", node_python())
        # Logins read a ~/.bashrc of their own that sets PATH only (PATH_ONLY_RC: this machine's runs pyenv's rehash,
        # whose lock one killed login leaves behind, and every later login then waits 60 s); a test may give its own.
        up_kwargs.setdefault("login_rc", sandbox.PATH_ONLY_RC)
        if "base_addr" not in up_kwargs:
            up_kwargs["base_addr"] = self.reserve_base()
        self.state_dirs.append(Path(up_kwargs["state_dir"]))  # before `up`: teardown covers a failed start
        return sandbox.up(nodes, **up_kwargs)

    def close(self) -> None:
        """Down every sandbox made (each even if another fails), then free their addresses. What is left of a run the
        test left (a launcher it killed: the run lives on within its heartbeat bound) ends with it, not in the next."""
        errors = []
        for state_dir in self.state_dirs:
            try:
                for cache in Path(state_dir).glob("node-*/cache"):
                    end_runs_under(cache)
                sandbox.down(state_dir)
            except Exception as exc:
                errors.append(exc)
        for handle in self._locks:
            handle.close()
        if errors:
            raise errors[0]


@pytest.fixture
def make_sandbox(tmp_path: Path) -> Iterator[SandboxFactory]:
    """Factory of local sshd clusters for one test; every one is downed at teardown, pass or fail."""
    factory = SandboxFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def hostfile(tmp_path: Path) -> Path:
    """A DeepSpeed hostfile of two 4-slot hosts."""
    path = tmp_path / "hostfile"
    path.write_text("# DeepSpeed's format\nworker-1 slots=4\nworker-2 slots=4\n")
    return path


HEAVIEST_FIRST = ("test_trainers.py", "test_hang.py", "test_slurm.py", "test_progress.py", "test_elastic.py",
                  "test_roaming.py", "test_report.py", "test_recover.py", "test_page_truth.py", "test_installed.py",
                  "test_lifecycle.py", "test_launch.py", "test_supervision.py", "test_containers.py",
                  "test_setup_script.py", "test_top.py", "test_train.py")
"""The files that take longest (real trainers, hang timeouts, a SLURM cluster, a venv made from scratch), measured
with --durations: run first, so that with the suite spread over workers (pytest-xdist, --dist loadfile) none of them
is left to run alone at the end. xdist would reorder files by their count of tests (its default `--loadscope-reorder`
put the one-test venv file last, alone for its 50 s): pyproject's addopts turn that off."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(Path(item.path).name, len(rank)))  # stable: a file keeps its own order
