"""`inv top` on real sandbox nodes: every rank of a detached run with its pid, CPU, memory and step rate, the slow
rank flagged; the live view in a real terminal (tmux); and what it says for a run that is not there."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools.observe import free_port
from tests.helpers import REPO, inv, inv_background, run_id_of, run_processes, wait_for

PERIOD, SLOW_RANK, FACTOR = 0.1, 3, 3.0


@pytest.fixture
def steps_box(make_sandbox):
    # 2 nodes x 2 ranks; each prints `rank R step N` every 0.1 s, rank 3 every 0.3 s.
    return make_sandbox(2, torchrun="stand-in",
                        nproc_per_node=2, master_port=free_port(), script="tests/scripts/steps.py",
                        script_args=[str(PERIOD), str(SLOW_RANK), str(FACTOR)])


def _detached(box, logs: Path) -> str:
    started = inv("launch", "--hosts", str(box.inventory), "--detach", "--skip-doctor", log_dir=logs)
    assert started.returncode == 0, started.stderr
    return run_id_of(started.stdout + started.stderr)


def test_top_once_json_shows_every_rank_with_its_rate_and_flags_the_slow_one(steps_box, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    run_id = _detached(steps_box, logs)
    try:
        time.sleep(2)  # every rank is stepping, its rate from 2 s of steps
        taken: list = []

        def every_rank_seen_twice() -> bool:
            # a rank's CPU % is from two of the look's reads of it: one first found at the look's last read has
            # none yet (seen once in a loaded fresh-clone run), and the next call has it
            t0 = time.monotonic()
            result = inv("top", "--hosts", str(steps_box.inventory), "--once", "--json", log_dir=logs)
            taken[:] = [result, time.monotonic() - t0]
            assert result.returncode == 0, result.stderr
            ranks = json.loads(result.stdout)["ranks"]
            return len(ranks) == 4 and all(r["cpu_percent"] is not None and r["last_line"] for r in ranks)

        wait_for(every_rank_seen_twice, 60, "every rank stepping, seen twice by one top --once", interval=0.5)
        result, took = taken
        snap = json.loads(result.stdout)
        assert snap["run"] == run_id
        assert [n["node"] for n in snap["nodes"]] == ["node-0", "node-1"]
        assert all(n["reachable"] and n["load1"] is not None and n["mem_total_bytes"] > 0 for n in snap["nodes"])
        assert all(n["gpus"] is None for n in snap["nodes"])  # no nvidia-smi here
        ranks = snap["ranks"]
        assert [(r["node"], r["rank"], r["local_rank"]) for r in ranks] == [
            ("node-0", 0, 0), ("node-0", 1, 1), ("node-1", 2, 0), ("node-1", 3, 1)]
        live = set(run_processes(run_id))
        for r in ranks:
            assert r["pid"] in live, r
            assert r["cpu_percent"] > 0 and r["rss_bytes"] > 1 << 20, r
            assert r["last_output_s"] < 2 and f"rank {r['rank']} step" in r["last_line"], r
        # What the script does, per second: 1 / (period + its step's own time); the slow rank 3x less often.
        for r in ranks:
            expected = 1 / (PERIOD * (FACTOR if r["rank"] == SLOW_RANK else 1))
            assert 0.6 * expected < r["steps_per_s"] <= 1.05 * expected, r
        fast = [r["steps_per_s"] for r in ranks if r["rank"] != SLOW_RANK]
        assert max(fast) / min(fast) < 1.2  # the fast ranks agree within 20%
        assert [r["straggler"] for r in ranks] == [False, False, False, True]
        assert took < 15
    finally:
        inv("stop", "--hosts", str(steps_box.inventory), log_dir=logs)
    assert run_processes(run_id) == []


def _screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (scripts/setup installs it)")
def test_the_live_view_in_a_terminal_refreshes_follows_a_rank_and_q_leaves_the_run_running(steps_box, tmp_path: Path
                                                                                         ) -> None:
    logs = tmp_path / "logs"
    run_id = _detached(steps_box, logs)
    session, code = f"top-{os.getpid()}", tmp_path / "code"
    command = (f"cd {REPO} && INVOKE_LAUNCHER_LOG_DIR={logs} {sys.executable} -m invoke top "
               f"--hosts {steps_box.inventory}; "
               f"echo $? > {code}; sleep 60")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "40", command], check=True)
    try:
        wait_for(lambda: all(f"rank {r} step" in _screen(session) for r in range(4)), 30, "every rank on the screen")
        first = _screen(session)
        assert all(f"node-{r // 2}    r{r}" in first for r in range(4)), first
        assert "q quit (the run goes on)" in first
        wait_for(lambda: _screen(session).split("rank 0 step")[1][:6] != first.split("rank 0 step")[1][:6], 10,
                 "the view refreshed")
        subprocess.run(["tmux", "send-keys", "-t", session, "l"], check=True)
        wait_for(lambda: "r0 (node-0)" in _screen(session), 10, "rank 0's log followed")
        subprocess.run(["tmux", "send-keys", "-t", session, "s"], check=True)  # every rank's stack, the run goes on
        wait_for(lambda: len(list((logs / run_id).glob("stacks-*/node-*-r*.txt"))) == 4, 30, "every rank's stack")
        wait_for(lambda: "steps.py" in _screen(session).split("stacks:", 1)[-1], 10, "the stacks' line shown")
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        wait_for(code.exists, 10, "inv top quit")
        assert code.read_text().strip() == "0"
        assert len(run_processes(run_id)) >= 6  # torchrun and two workers a node: the run goes on
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
        inv("stop", "--hosts", str(steps_box.inventory), log_dir=logs)
    assert run_processes(run_id) == []


def test_top_says_what_is_wrong_with_a_run_that_is_not_there_or_ended_and_an_unreachable_node(steps_box,
                                                                                             tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    none = inv("top", "--hosts", str(steps_box.inventory), "--once", "--run", "20200101-000000-abcdef", log_dir=logs)
    assert none.returncode == 1
    assert "run 20200101-000000-abcdef is not running on" in none.stderr, none.stderr
    assert "node-0: run 20200101-000000-abcdef did not run here" in none.stderr
    run_id = _detached(steps_box, logs)
    time.sleep(1)
    # A node that cannot be reached keeps its row, saying why; the others are shown.
    os.kill(steps_box.nodes[1].pid, signal.SIGSTOP)  # node-1's sshd: the kernel takes the connection, no answer
    try:
        partial = inv("top", "--hosts", str(steps_box.inventory), "--once", "--json", log_dir=logs,
                      env={"INVOKE_LAUNCHER_CONNECT_TIMEOUT": "2"})
    finally:
        os.kill(steps_box.nodes[1].pid, signal.SIGCONT)
    assert partial.returncode == 0, partial.stderr
    snap = json.loads(partial.stdout)
    assert [n["reachable"] for n in snap["nodes"]] == [True, False]
    assert "node-1" in snap["nodes"][1]["problem"]
    assert [r["rank"] for r in snap["ranks"]] == [0, 1]
    inv("stop", "--hosts", str(steps_box.inventory), "--run", run_id, log_dir=logs)
    ended = inv("top", "--hosts", str(steps_box.inventory), "--once", "--run", run_id, log_dir=logs)
    assert ended.returncode == 1, ended.stdout
    said = f"node-0: run {run_id} has ended here (stopped); node-1: run {run_id} has ended here (stopped)"
    assert f"run {run_id} is not running" in ended.stderr and said in ended.stderr, ended.stderr
    # The live view says it the same way of every node (its agent's session ends as it answers: never `its agent
    # ended (no reason given)` beside `run ... is exited here`).
    live = inv("top", "--hosts", str(steps_box.inventory), "--run", run_id, log_dir=logs)
    assert live.returncode == 1 and said in live.stderr, live.stderr


def test_status_of_a_detached_run_says_the_stragglers_top_flags(steps_box, tmp_path: Path) -> None:
    """No launcher watches a detached run, so none keeps its stragglers: `inv status` of it showed none of those
    `inv top` flags. It takes one look, as `inv top --once` does, and says them."""
    logs = tmp_path / "logs"
    run_id = _detached(steps_box, logs)
    try:
        wait_for(lambda: "SLOW" in inv("top", "--hosts", str(steps_box.inventory), "--once", log_dir=logs).stdout,
                 60, "inv top --once flags rank 3")
        status = inv("status", "--hosts", str(steps_box.inventory), log_dir=logs)
        assert status.returncode == 0, status.stdout + status.stderr
        said = [line for line in status.stdout.splitlines() if "straggler:" in line]
        assert len(said) == 1 and re.search(r"straggler: node-1 r3 at 0\.[2-5]\dx the median rate \(now, one look as "
                                            r"`inv top --once`\)", said[0]), status.stdout
    finally:
        inv("stop", "--hosts", str(steps_box.inventory), "--run", run_id, log_dir=logs)
    assert run_processes(run_id) == []


def test_an_attached_launch_tells_a_straggler_once_and_inv_status_shows_it(make_sandbox, tmp_path: Path) -> None:
    # 2 nodes x 1 rank: rank 1 steps 3x slower. Beats every 2 s (silence timeout 8 s), a straggler after 3 s.
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/steps.py",
                       script_args=["0.05", "1", "3", "12"])
    logs = tmp_path / "logs"
    env = {"INVOKE_LAUNCHER_STRAGGLER_HOLD": "3", "INVOKE_LAUNCHER_SILENCE_TIMEOUT": "8"}
    result = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", log_dir=logs, env=env)
    assert result.returncode == 0, result.stderr
    said = [line for line in (result.stdout + result.stderr).splitlines() if "straggler:" in line]
    assert len(said) == 1, said
    assert re.search(r"straggler: node-1 r1 at 0\.[2-5]\dx the median rate for \d+ s", said[0]), said
    run_id = run_id_of(result.stdout + result.stderr)
    status = inv("status", "--hosts", str(box.inventory), "--run", run_id, log_dir=logs)
    assert "straggler: node-1 r1 at" in status.stdout, status.stdout


def _tmux_top(session: str, box, logs: Path, code: Path, width: int, height: int) -> None:
    """The live view of the box's run in a terminal of `width` x `height` (tmux), its exit code into `code`."""
    # the terminal's own size: not LINES and COLUMNS as this process has them (rich would believe them)
    command = (f"unset LINES COLUMNS; cd {REPO} && INVOKE_LAUNCHER_LOG_DIR={logs} {sys.executable} -m invoke top "
               f"--hosts {box.inventory}; echo $? > {code}; sleep 60")
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), command],
                   check=True)


def _one_line(text: str) -> str:
    """Lines wrapped to the width as one line again (the verdict's words, whole)."""
    return re.sub(r"\s+", " ", text)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (scripts/setup installs it)")
def test_top_and_the_hang_watch_give_one_verdict_on_a_rank_behind_at_work(make_sandbox, tmp_path: Path) -> None:
    """#60 item 10: rank 0 computes alone (a checkpoint, an evaluation: CPU busy, state R) while rank 1 waits in the
    barrier. The launch's hang watch (--hang-timeout 10) said `not a hang (... rank 0 ... is at work ...)`; `inv top`
    said `hang suspected: r0 never entered barrier #N of default_pg (33 s)` from the wait alone. Now `--once` and the
    live view take two looks at the stacks and say the watch's verdict in its words: r0 `BEHIND, at work`."""
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/busy_save.py", script_args=["600", "0"])
    out, logs, code = tmp_path / "launch.out", tmp_path / "logs", tmp_path / "code"
    proc = inv_background("launch", "--hosts", str(box.inventory), "--hang-timeout", "10", "--skip-doctor",
                          log_dir=logs, out=out)
    session = f"top-verdict-{os.getpid()}"
    try:
        wait_for(lambda: out.read_text(errors="replace").count("step 2") == 2, 120, "both ranks' third step")
        began = time.monotonic()  # rank 0 saves from here (600 s); rank 1 waits in the barrier
        run_id = run_id_of(out.read_text())
        _tmux_top(session, box, logs, code, 120, 30)
        watch_said = re.compile(r"no progress for \d+ s, but (not a hang \(rank 0 never entered barrier #\d+ of "
                                r"default_pg \(its last: #\d+\), which rank 1 entered; but rank 0 \(node-0, pid \d+\) "
                                r"is at work: )")
        wait_for(lambda: watch_said.search(out.read_text(errors="replace")), 60, "the hang watch's look")
        watched = watch_said.search(out.read_text(errors="replace"))
        assert watched is not None
        time.sleep(max(0.0, 32 - (time.monotonic() - began)))  # the others have waited TOP_BEHIND_HANG_S
        once = inv("top", "--hosts", str(box.inventory), "--once", log_dir=logs)
        assert once.returncode == 0, once.stderr
        said = _one_line(once.stdout)
        assert "hang suspected" not in said, once.stdout
        assert any(re.match(r"node-0\s+r0\s.*BEHIND, at work", line) for line in once.stdout.splitlines()), once.stdout
        assert re.search(r"r0 behind \d+ s, at work: " + re.escape(watched.group(1)), said), (watched.group(1),
                                                                                              once.stdout)
        # the live view, from its own look at the stacks: the same verdict on the screen
        wait_for(lambda: re.search(r"node-0\s+r0\s.*BEHIND, at work", _screen(session)), 60, "the view's verdict")
        screen = _screen(session)
        assert re.search(r"^r0 behind \d+ s, at work: not a hang \(rank 0 never entered barrier", screen, re.M), screen
        assert "hang suspected" not in screen, screen
        assert proc.poll() is None  # nothing was stopped
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
        inv("stop", "--hosts", str(box.inventory), log_dir=logs)
        proc.wait(timeout=60)
    assert run_processes(run_id) == []


@pytest.fixture
def input_box(make_sandbox):
    # 2 nodes x 4 ranks training alone; rank 6 (node-1's third) waits 60 ms more for each batch: ~0.45x the rate,
    # data ~55% of its step against ~0% for the others. Ends by itself after 240 s.
    return make_sandbox(2, torchrun="stand-in",
                        nproc_per_node=4, master_port=free_port(), script="tests/scripts/slow_input.py",
                        script_args=["6", "0.06", "240"])


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (scripts/setup installs it)")
def test_a_slow_rank_comes_first_at_once_in_a_small_terminal_with_the_column_that_says_why(input_box, tmp_path: Path
                                                                                          ) -> None:
    """#60 item 11: the live view in 80 columns showed r0-r4, all healthy, and `+3 ranks not shown`: its straggler
    was held for straggler_hold (60 s) where `--once` flags it at once, and the `data` column that says why was
    dropped; `--once` into a pipe ignored COLUMNS (200-wide lines)."""
    logs, code = tmp_path / "logs", tmp_path / "code"
    run_id = _detached(input_box, logs)
    session = f"top-slow-{os.getpid()}"
    try:
        taken: list = []

        def flagged_once() -> bool:  # rank 6's own row (while the last ranks are still importing torch, a look
            # has flagged others: half the ranks stepping, the other half's forward shares not yet theirs)
            taken[:] = [inv("top", "--hosts", str(input_box.inventory), "--once", log_dir=logs, env={"COLUMNS": "80"})]
            return any(re.match(r"node-1\s+r6\s.*SLOW", line) for line in taken[0].stdout.splitlines())

        wait_for(flagged_once, 90, "inv top --once flags rank 6", interval=0.5)
        lines = taken[0].stdout.splitlines()
        assert all(len(line) <= 80 for line in lines), taken[0].stdout  # COLUMNS, into a pipe
        header = next(line for line in lines if "last line" in line)
        slow = next(line for line in lines if re.match(r"node-1\s+r6\s", line))
        assert "SLOW" in slow and "data" in header, taken[0].stdout
        assert int(slow[header.index("data") - 1:header.index("data") + 4].strip().rstrip("%")) >= 35, taken[0].stdout
        _tmux_top(session, input_box, logs, code, 80, 14)  # room for five ranks of eight (and the columns' line)

        def first_row() -> str:
            rows = [line for line in _screen(session).splitlines() if re.match(r"node-\d\s+r\d\s", line)]
            return rows[0] if rows else ""

        # well before straggler_hold (60 s): as soon as a look finds it, as --once does
        until = time.monotonic() + 40
        while not re.match(r"node-1\s+r6\s.*SLOW", first_row()) and time.monotonic() < until:
            time.sleep(0.2)
        screen = _screen(session)
        assert re.match(r"node-1\s+r6\s.*SLOW", first_row()), screen
        header = next(line for line in screen.splitlines() if "last line" in line)
        assert "data" in header, screen
        assert int(first_row()[header.index("data") - 1:header.index("data") + 4].strip().rstrip("%")) >= 35, screen
        assert re.search(r"^\+3 ranks not shown, none flagged \(inv top --once shows every rank\)", screen, re.M), \
            screen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
        inv("stop", "--hosts", str(input_box.inventory), log_dir=logs)
    assert run_processes(run_id) == []
