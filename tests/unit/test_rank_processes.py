"""Every process of a rank told apart (launcher/node/common/proc.py `rank_processes`): the rank's own process is the
topmost of its RANK; the processes below it that inherited its RANK (DataLoader workers, forked or spawned; compile
workers) are its helpers. Real processes, no torch: a parent with RANK that forks one child and spawns another (which
spawns one of its own), beside a second rank."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.node.common.proc import rank_processes, start_time, workers
from launcher.node.wire import RUN_ID_ENV
from launcher.watch.stackgroups import rank_stacks, stack_file

MARK = f"20000101-000000-abcdef/unit-{os.getpid()}"
RANK_SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, time
    children = []
    if sys.argv[1] == "parent":
        if os.fork() == 0:  # a forked helper (a DataLoader worker under fork)
            time.sleep(60)
            os._exit(0)
        children.append(subprocess.Popen([sys.executable, __file__, "spawned"]))
    elif sys.argv[1] == "spawned":  # a spawned helper that starts one of its own (a compile pool's worker)
        children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    time.sleep(60)
""")


def _tree(pid: int) -> set[int]:
    """`pid` and every process below it."""
    found = {pid}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if parent == pid:
                found |= _tree(int(entry))
    return found


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, subprocess.Popen]]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    base = {**os.environ, RUN_ID_ENV: MARK, "LOCAL_RANK": "0"}
    parent = subprocess.Popen([sys.executable, str(script), "parent"], env={**base, "RANK": "3"})
    other = subprocess.Popen([sys.executable, str(script), "alone"], env={**base, "RANK": "4", "LOCAL_RANK": "1"})
    try:
        deadline = time.monotonic() + 20
        while len(_tree(parent.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the last one's exec is done: its environment is the one it was given
        yield parent, other
    finally:
        for proc in (parent, other):
            for pid in _tree(proc.pid):  # the test's own processes, by pid
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()


def test_a_ranks_own_process_is_the_topmost_of_its_rank_and_the_rest_are_its_helpers(ranks) -> None:
    parent, other = ranks
    found, helpers = rank_processes(MARK)
    assert [(w[0], w[2], w[3]) for w in found] == [(parent.pid, 3, 0), (other.pid, 4, 1)]
    assert found[0][1] == start_time(parent.pid)
    assert workers(MARK) == found  # the ranks alone: their own processes, so their CPU is their own
    below = _tree(parent.pid) - {parent.pid}
    assert {h[0] for h in helpers} == below and len(below) == 3
    assert all(h[2] == 3 and h[4] == parent.pid for h in helpers)  # rank 3's, owned by its own process
    direct = [h for h in helpers if h[3] == parent.pid]
    deeper = [h for h in helpers if h[3] != parent.pid]
    assert len(direct) == 2 and len(deeper) == 1 and deeper[0][3] in {h[0] for h in direct}
    assert all(h[1] == start_time(h[0]) for h in helpers)


def test_a_stacks_answer_keeps_helpers_under_their_rank_and_out_of_the_grouping() -> None:
    dump = 'Current thread 0x00007f (most recent call first):\n  File "/w/train.py", line 9 in <module>\n'
    rank = {"rank": 3, "local_rank": 0, "pid": 100, "state": "S", "state_name": "sleeping", "stack": dump}
    helper = {"rank": 3, "local_rank": 0, "pid": 101, "state": "S", "state_name": "sleeping", "stack": None,
              "why": "it has no stack hook", "helper": True, "parent": 100, "owner": 100}
    [stack] = rank_stacks("node-1", [rank, helper])
    assert stack.pid == 100 and [h.pid for h in stack.helpers] == [101] and stack.helpers[0].parent == 100
    text = stack_file(stack)
    assert text.index("node node-1, rank 3 (local rank 0), pid 100") < text.index("--- helper of rank 3: pid 101")
    assert "child of 100" in text and "no stack: it has no stack hook" in text
