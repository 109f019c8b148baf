"""A run's output: the node's agent merges its workers' files into one tagged log (`logmerge.LogMerger`), the
controller prefixes it in bulk (`logs.NodeLog`); on real sshd nodes, every line of a chatty job arrives once, whole
and in order per rank, live and through `inv logs`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from launcher.node import wire
from launcher.node.agent import logmerge
from launcher.plan.request import log_tail_settings
from launcher.report.lines import CUT_MARK, NodeLog

# --- the controller: bulk prefixes, the same text as one line at a time ------------------------------------


def test_a_million_tagged_lines_are_prefixed_without_a_loop_per_line() -> None:
    log = NodeLog("node-1", 1, 6, None, False)
    log.format(b"[default0@r2]:first\n[default1@r3]:first\n")  # tags seen once: from here on, in bulk
    block = b"".join(b"[default%d@r%d]:rank %d line %d\n" % (i % 2, 2 + i % 2, 2 + i % 2, i) for i in range(10**6))
    t0 = time.process_time()
    text, count = log.format(block)
    assert time.process_time() - t0 < 1.0  # one bytes.replace per tag: about 0.1 s here; line by line, ~1.5 s
    assert count == 10**6 and text.count("\n") == 10**6
    assert text.startswith("node-1 r2  | rank 2 line 0\nnode-1 r3  | rank 3 line 1\n")
    assert list(log.tail)[-1] == "[local rank 1, rank 3] rank 3 line 999999"


# --- the agent: worker files -> one tagged log ----------------------------------------------------------------


def test_the_merger_tags_worker_lines_with_the_rank_in_their_environment(tmp_path: Path) -> None:
    mark = "20000101-000000-abcdef/node1"
    settings = dict(log_tail_settings(), poll_s=0.01, chunk=64, max_line=200)  # lines cross every read
    attempt = tmp_path / "ranks" / "none_x1" / "attempt_1"
    for local in (0, 1):
        (attempt / str(local)).mkdir(parents=True)
    (tmp_path / "torchrun.log").write_bytes(b"")  # torchrun's own output, as spawn makes it
    merger = logmerge.LogMerger(str(tmp_path), mark, settings).start()
    env = {**os.environ, wire.RUN_ID_ENV: mark, "TORCHELASTIC_RESTART_COUNT": "1", "LOCAL_RANK": "0", "RANK": "6"}
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        time.sleep(0.5)  # its environment is readable in /proc
        with open(tmp_path / "torchrun.log", "ab") as own:
            own.write(b"torchrun says hi\n")
        with open(attempt / "0" / "stdout.log", "ab") as out0, open(attempt / "1" / "stderr.log", "ab") as err1:
            for i in range(200):
                out0.write(b"out %d\n" % i)
                err1.write(b"err %d" % i + (b"\n" if i < 199 else b""))  # local rank 1 ends without a newline
                if i % 37 == 0:
                    out0.flush()
                    err1.flush()
            out0.write(b"y" * 300)  # no newline for more than max_line bytes
            out0.flush()
            time.sleep(0.3)
    finally:
        worker.kill()
        worker.wait()
    merger.close()
    lines = (tmp_path / "log").read_bytes().split(b"\n")
    assert lines[-1] == b"" and lines.count(b"torchrun says hi") == 1
    assert [x for x in lines if x.startswith(b"[default0@r6]:out")] == [b"[default0@r6]:out %d" % i
                                                                       for i in range(200)]
    # No worker of local rank 1 is alive to say its global rank: the local rank alone.
    assert [x for x in lines if x.startswith(b"[default1]:")] == [b"[default1]:err %d" % i for i in range(200)]
    cut = [x for x in lines if x.startswith(b"[default0@r6]:y")]
    room = 200 - len(b"[default0@r6]:") - len(CUT_MARK)  # a cut piece, its tag and the mark: within max_line
    tag = b"[default0@r6]:"
    assert cut == [tag + b"y" * room + CUT_MARK] * (300 // room) + [tag + b"y" * (300 % room)]
    assert len(lines) == 1 + 200 + 200 + len(cut) + 1


def test_the_merger_follows_an_attempt_torchrun_makes_again(tmp_path: Path) -> None:
    """A c10d group whose members change restarts its workers without counting a restart: torchrun removes
    attempt_N and makes it again, and new workers (their global ranks new too) write new files under the old names.
    Every line of both gets to the log, each under its own worker's rank."""
    mark = "20000101-000000-abcdef/node1"
    settings = dict(log_tail_settings(), poll_s=0.01)
    attempt = tmp_path / "ranks" / "none_x1" / "attempt_1"
    (attempt / "0").mkdir(parents=True)
    (tmp_path / "torchrun.log").write_bytes(b"")
    merger = logmerge.LogMerger(str(tmp_path), mark, settings).start()

    def worker(rank: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, wire.RUN_ID_ENV: mark, "TORCHELASTIC_RESTART_COUNT": "1", "LOCAL_RANK": "0",
               "RANK": str(rank)}
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)

    first = worker(1)
    try:
        time.sleep(0.5)  # its environment is readable in /proc
        with open(attempt / "0" / "stdout.log", "ab") as out:
            out.write(b"first 0\n")
            out.flush()
            time.sleep(0.3)  # the merger has the file open
            out.write(b"first 1\nfirst 2")  # not read yet, and no newline, when the folder goes
        shutil.rmtree(attempt)  # what torchrun does before it starts the new workers (after the old ones ended)
    finally:
        first.kill()
        first.wait()
    (attempt / "0").mkdir(parents=True)
    second = worker(0)
    try:
        time.sleep(0.5)
        with open(attempt / "0" / "stdout.log", "ab") as out:
            out.write(b"second 0\nsecond 1\n")
        time.sleep(0.3)
    finally:
        second.kill()
        second.wait()
    merger.close()
    assert (tmp_path / "log").read_bytes().split(b"\n") == [
        b"[default0@r1]:first 0", b"[default0@r1]:first 1", b"[default0@r1]:first 2",
        b"[default0@r0]:second 0", b"[default0@r0]:second 1", b""]


# --- a chatty job on real nodes ---------------------------------------------------------------------------------

PREFIXED = re.compile(r"^(node-\d) +r(\d+) +\| (.*)$")


def check_lines(text: str, count: int, ranks: list[int]) -> None:
    """Every `out R i` and `err R i` line once, in order per rank and stream, under its node's and rank's prefix."""
    seen: dict[tuple[str, int], list[int]] = defaultdict(list)
    last = set()
    for line in text.splitlines():
        m = PREFIXED.match(line)
        if not m:
            continue
        node, rank, body = m.group(1), int(m.group(2)), m.group(3)
        parts = body.split()
        if parts[:1] in (["out"], ["err"]) and len(parts) == 3:
            assert (int(parts[1]), node) == (rank, f"node-{rank // 2}"), line
            seen[(parts[0], rank)].append(int(parts[2]))
        elif parts[:1] == ["last"]:
            assert body == f"last {rank}", line
            last.add(rank)
    for rank in ranks:
        for stream in ("out", "err"):
            assert seen[(stream, rank)] == list(range(count)), (stream, rank, len(seen[(stream, rank)]))
    assert last == set(ranks)


@pytest.mark.integration
def test_a_chatty_jobs_lines_arrive_once_whole_and_in_order_live_and_replayed(make_sandbox, tmp_path: Path) -> None:
    from devtools.observe import free_port
    from tests.helpers import inv, run_id_of

    count = 20_000
    box = make_sandbox(2, torchrun="stand-in",
                       nproc_per_node=2, master_port=free_port(), script="tests/scripts/both_streams.py",
                       script_args=[str(count), "50"])
    logs = tmp_path / "logs"
    live = inv("launch", "--hosts", str(box.inventory), log_dir=logs, timeout=240,
               env={"INVOKE_LAUNCHER_CONSOLE_BUFFER": "1000000"})
    assert live.returncode == 0, live.stderr[-3000:]
    assert "skipped" not in live.stderr, live.stderr[-3000:]
    check_lines(live.stdout, count, [0, 1, 2, 3])
    run_id = run_id_of(live.stderr)

    replay = inv("logs", "--hosts", str(box.inventory), "--run", run_id, log_dir=logs, timeout=120)
    assert replay.returncode == 0, replay.stderr[-3000:]
    check_lines(replay.stdout, count, [0, 1, 2, 3])
    only = inv("logs", "--hosts", str(box.inventory), "--run", run_id, "--rank", "2", log_dir=logs, timeout=120)
    assert only.returncode == 0, only.stderr[-3000:]
    check_lines(only.stdout, count, [2])
    assert all(line.startswith("node-1 r2 ") for line in only.stdout.splitlines()), only.stdout[:500]
