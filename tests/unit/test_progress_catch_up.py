"""A worker's record caught up by its collectives' thread (launcher/node/worker/hook.py `Recorder.catch_up`): the
steps a hang left unwritten are in the record the hang watch reads."""

from __future__ import annotations

import os
from pathlib import Path

from launcher.node.agent import stackdump
from launcher.node.worker import hook
from tests.unit.test_progress_hook import record_of


def test_the_steps_a_hang_left_unwritten_are_written_once_the_rank_is_quiet(tmp_path: Path) -> None:
    # issue 69 (10): a fast loop writes its record at most every flush interval; a rank that hangs right after a step
    # leaves that step unwritten unless the collectives' thread catches the record up (it never writes a loss value:
    # those are the main thread's).
    clock = [100.0]
    recorder = hook.Recorder(str(tmp_path), stackdump.bounds.RECORD_BYTES, 0.1, lambda: clock[0])
    recorder.step()
    clock[0] += 0.05
    recorder.step()  # within the flush interval: not written
    assert record_of(tmp_path, os.getpid())["steps"] == 1
    recorder.catch_up(100.1)  # one interval since the write: the main thread may still write it
    assert record_of(tmp_path, os.getpid())["steps"] == 1
    recorder.catch_up(100.25)
    assert record_of(tmp_path, os.getpid())["steps"] == 2
    before = (tmp_path / str(os.getpid())).read_bytes()
    recorder.catch_up(101.0)  # nothing new: no write
    assert (tmp_path / str(os.getpid())).read_bytes() == before


def test_the_collectives_thread_finds_the_recorder_under_the_hooks_name() -> None:
    from launcher.node.worker import collectives

    assert collectives.HOOK_MODULE == hook.MODULE_NAME
