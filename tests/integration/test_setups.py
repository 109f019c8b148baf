"""Users' own set-ups on real sshd nodes: a node's `python:` that is a wrapper which does not `exec`, and a node
whose torchrun ends before the rendezvous while the others wait in it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devtools.observe import free_port
from tests._train_helpers import assert_replicas_in_sync
from tests.helpers import inv, run_id_of, run_processes
from tests.support.nodeenv import node_python

pytestmark = pytest.mark.integration

TRAIN = ("--script", "train/ddp.py", "--args", "--epochs 1 --dataset-size 64 --batch-size 16")


def _wrapper(folder: Path, body: str) -> str:
    """A shell script standing for a node's python: `body`, then the nodes' real python without `exec`."""
    path = folder / "python-wrapper"
    path.write_text(f"#!/bin/bash\n{body}\n{node_python()} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def test_a_python_wrapper_that_does_not_exec_runs_attached(make_sandbox, tmp_path: Path) -> None:
    """`conda run` and site wrappers stay as python's parent: the attached launch (torchrun's early start
    included) runs to its end as the detached one does, with and without the doctor, and leaves nothing."""
    wrapper = _wrapper(tmp_path, "")
    box = make_sandbox(2, master_port=free_port(), python_override={1: wrapper})
    for doctor in ((), ("--skip-doctor",)):
        began = time.monotonic()
        result = inv("launch", "--hosts", str(box.inventory), *doctor, *TRAIN, log_dir=tmp_path / "logs", timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert time.monotonic() - began < 90
        assert_replicas_in_sync(result.stdout, world_size=2)
        assert run_processes(run_id_of(result.stderr)) == []
    doctor = inv("doctor", "--hosts", str(box.inventory))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    said = " ".join(doctor.stdout.split())  # the console wraps long lines
    assert "node-1 python: Python" in said and f"through {wrapper}, a wrapper that does not exec" in said, said


def test_a_node_whose_torchrun_ends_before_the_rendezvous_ends_the_launch(make_sandbox, tmp_path: Path) -> None:
    """node-1's torchrun exits 0 at once, before joining: node-0 would wait in the rendezvous for its timeout
    (600 s). The launch ends in seconds instead, naming node-1 and what happened, with nothing left behind."""
    wrapper = _wrapper(tmp_path, 'case "$*" in *torch.distributed.run*) exit 0;; esac')
    box = make_sandbox(2, master_port=free_port(), python_override={1: wrapper})
    began = time.monotonic()
    result = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", *TRAIN, log_dir=tmp_path / "logs",
                 timeout=120)
    took = time.monotonic() - began
    assert result.returncode == 1, result.stdout + result.stderr
    assert "root cause: node-1: torchrun ended (exit code 0) before it started any worker" in result.stderr, \
        result.stderr
    assert "node-0: exit code" in result.stderr and "(stopped by the launcher)" in result.stderr, result.stderr
    assert took < 60, f"{took:.0f} s"
    assert run_processes(run_id_of(result.stderr)) == []
