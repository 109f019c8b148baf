"""Supervision that nothing outside the run can break, each failure caused for real on sshd nodes.

A console nobody reads, a torchrun or an agent killed with SIGKILL, a node whose sshd is SIGSTOPped, a full disk
under the controller's log folder, a line without a newline, a pid reused by a stranger: each test asserts what a
user would check (exit code, the sentence, every line in logs/, no process of the run left within grace + 2 s).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devtools.observe import free_port, gone, parent, signal_each, sshd_family
from tests.helpers import REPO, inv, node_runs, run_processes, runs_on, wait_for

pytestmark = pytest.mark.integration

GRACE = 1.0


def env_with(**config: object) -> dict[str, str]:
    """The environment for `inv` with these invoke.yaml settings (INVOKE_LAUNCHER_*)."""
    return {**os.environ, **{f"INVOKE_LAUNCHER_{k.upper()}": str(v) for k, v in config.items()}}


def launch_background(inventory: Path, log_dir: Path, err: Path, stdout: int | None = None,
                      **config: object) -> subprocess.Popen[bytes]:
    """`inv launch` in its own session (signals reach it as from a terminal); stderr to a file."""
    env = env_with(log_dir=log_dir, grace=GRACE, **config)
    with open(err, "wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "invoke", "launch", "--hosts", str(inventory)], cwd=REPO,
                                env=env, stdout=stdout if stdout is not None else sink, stderr=sink,
                                start_new_session=True)


def the_run(box, node: int) -> Path:
    """The one run directory of sandbox node `node` (each test uses a fresh sandbox)."""
    wait_for(lambda: node_runs(box, node).exists() and any(node_runs(box, node).iterdir()), 60, "a run directory")
    run = next(node_runs(box, node).iterdir())
    return run / f"node-{node}"


def leader_pid(run_dir: Path) -> int:
    wait_for(lambda: (run_dir / "leader").exists(), 60, "torchrun started")
    return int((run_dir / "leader").read_text().split()[0])


def gone_within(run_id: str, seconds: float) -> None:
    """No process of the run is left on any node within `seconds` (from now)."""
    wait_for(lambda: not run_processes(run_id), seconds, f"processes of run {run_id} left: {run_processes(run_id)}")


def run_id_of_box(box) -> str:
    return the_run(box, 0).parent.name


@pytest.fixture
def sleeper_box(make_sandbox):
    return make_sandbox(2, torchrun="stand-in",
                        master_port=free_port(), script="tests/scripts/sleeper.py", script_args=["0.2"])


def test_a_console_nobody_reads_never_stops_a_healthy_run(make_sandbox, tmp_path: Path) -> None:
    # 2 nodes x 300 lines of 200 characters at 25 lines/s: 12 s of output, far more than a pipe holds.
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/chatty.py", script_args=["300", "25", "200"])
    proc = launch_background(box.inventory, tmp_path / "logs", tmp_path / "err", stdout=subprocess.PIPE,
                             heartbeat_timeout=3, silence_timeout=3, console_buffer=50)
    try:
        run_dirs = [the_run(box, i) for i in range(2)]
        # Nobody reads the launcher's stdout for the whole run (4x the heartbeat timeout): the run goes on.
        wait_for(lambda: all((d / "exit_code").exists() for d in run_dirs), 60, "the run's end on both nodes")
        assert [(d / "exit_code").read_text() for d in run_dirs] == ["0", "0"]
        assert not any((d / "stop_requested").exists() for d in run_dirs)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = (tmp_path / "err").read_text()
    assert proc.returncode == 0, err
    run_id = run_dirs[0].parent.name
    for node in ("node-0", "node-1"):
        mirrored = (tmp_path / "logs" / run_id / f"{node}.log").read_text().splitlines()
        # chatty's own lines (a warning of torch's or a traceback may say "line" too: a fresh clone's run counted 302)
        assert sum(1 for line in mirrored if re.search(r"\bline \d+ rank \d+ ", line)) == 300, node
    assert "console: skipped" in err and f"every line is in {tmp_path / 'logs' / run_id}/" in err, err
    assert out.count(b"| line ") < 600  # the console really skipped some


@pytest.mark.parametrize(("victim", "exit_code", "cause"), [
    ("torchrun", 137, "root cause: node-1, exit code 137"),
    ("agent", 1, "root cause: node-1: the launcher's agent on the node died"),
])
def test_kill_9_on_a_node_leaves_no_process(sleeper_box, tmp_path: Path, victim: str, exit_code: int,
                                            cause: str) -> None:
    """kill -9 of node-1's torchrun (its workers live on in sessions of their own) or of its agent."""
    proc = launch_background(sleeper_box.inventory, tmp_path / "logs", tmp_path / "err")
    try:
        node1 = the_run(sleeper_box, 1)
        torchrun = leader_pid(node1)
        run_id = node1.parent.name
        wait_for(lambda: len(run_processes(run_id)) >= 4, 60, "torchrun and a worker on each node")
        os.kill(torchrun if victim == "torchrun" else parent(torchrun), signal.SIGKILL)
        code = proc.wait(timeout=60)
        gone_within(run_id, GRACE + 2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = (tmp_path / "err").read_text()
    assert code == exit_code, err
    assert cause in err, err
    if victim == "torchrun":
        assert (node1 / "exit_code").read_text() == "137"


@contextlib.contextmanager
def running_launch(box, tmp_path: Path, **config: object) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A launch of the sleeper job, once every node has torchrun and a worker; killed at the end if still there."""
    proc = launch_background(box.inventory, tmp_path / "logs", tmp_path / "err", **config)
    try:
        run_id = run_id_of_box(box)
        wait_for(lambda: len(run_processes(run_id)) >= 4, 60, "torchrun and a worker on each node")
        yield proc, run_id
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def sshd_stopped(box, index: int) -> Iterator[None]:
    """Node `index`'s sshd processes (listener and sessions) SIGSTOPped: a node that stops answering."""
    stopped = signal_each(sshd_family(box.nodes[index].pid), signal.SIGSTOP)
    assert len(stopped) >= 2  # the listener and the session of our connection
    try:
        yield
    finally:
        signal_each(stopped, signal.SIGCONT)


def test_a_node_whose_sshd_stops_is_found_and_nothing_is_left(sleeper_box, tmp_path: Path) -> None:
    with running_launch(sleeper_box, tmp_path, heartbeat_timeout=4, silence_timeout=4) as (proc, run_id):
        t0 = time.monotonic()
        with sshd_stopped(sleeper_box, 1):
            code = proc.wait(timeout=60)
            took = time.monotonic() - t0
            gone_within(run_id, GRACE + 2)
    err = (tmp_path / "err").read_text()
    assert code == 1, err
    assert "root cause: node-1 stopped answering (nothing for 4 s)" in err, err
    assert took < 4 + GRACE + 5, err  # the silence timeout, then the others' stop


def test_a_silent_agents_node_is_swept_over_a_new_channel(sleeper_box, tmp_path: Path) -> None:
    """node-1's agent SIGSTOPped (a hung disk, a stuck kernel call): its sshd still answers, so the launcher stops
    node-1's part over a new channel, the stopped agent too, and nothing of the run is left."""
    with running_launch(sleeper_box, tmp_path, heartbeat_timeout=60, silence_timeout=4) as (proc, run_id):
        node1 = the_run(sleeper_box, 1)
        supervisor = int((node1 / "supervisor").read_text().split()[0])
        t0 = time.monotonic()
        os.kill(supervisor, signal.SIGSTOP)
        try:
            code = proc.wait(timeout=60)
            gone_within(run_id, max(0.0, 4 + GRACE + 5 - (time.monotonic() - t0)))
            took = time.monotonic() - t0
            wait_for(lambda: gone(supervisor), 5, "the stopped agent killed")
        finally:
            if not gone(supervisor):
                os.kill(supervisor, signal.SIGKILL)
    err = (tmp_path / "err").read_text()
    assert code == 1, err
    assert "root cause: node-1 stopped answering (nothing for 4 s)" in err, err
    assert took < 4 + GRACE + 5, err
    assert "may still be running" not in err, err


def test_a_silent_node_that_cannot_be_swept_is_named_with_the_stop_line(sleeper_box, tmp_path: Path) -> None:
    # The bound outlasts the launch (the silence timeout, the grace, the sweep's wait: ~10 s)
    with running_launch(sleeper_box, tmp_path, heartbeat_timeout=20, silence_timeout=4) as (proc, run_id):
        with sshd_stopped(sleeper_box, 1):
            code = proc.wait(timeout=60)
        gone_within(run_id, 30)  # node-1's agent: no launcher heard from for its bound (20 s), it stops its part
    err = (tmp_path / "err").read_text()
    assert code == 1, err
    assert (f"node-1: its part of the run may still be running (stopping it over a new connection failed: no answer "
            f"within {GRACE + 3:g} s); it stops by itself 20 s after it last heard a launcher, unless one attaches; "
            f"run `inv stop --hosts {sleeper_box.inventory} --run {run_id}` to stop it now") in err, err


def test_ctrl_c_returns_in_time_when_a_node_is_dead(sleeper_box, tmp_path: Path) -> None:
    with (running_launch(sleeper_box, tmp_path, heartbeat_timeout=60, silence_timeout=60) as (proc, run_id),
          sshd_stopped(sleeper_box, 1)):
        time.sleep(0.5)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=30)
        took = time.monotonic() - t0
    err = (tmp_path / "err").read_text()
    assert code == 130, err
    assert took < GRACE + 5 + 3, err  # grace, the stop margin, a few seconds
    assert "no confirmation from node-1" in err, err
    # node-1's agent hears nothing more (its sshd was stopped) and stops its part after its heartbeat timeout;
    # with sshd running again it gets EOF at once and does so now.
    gone_within(run_id, 60)


def test_a_full_disk_under_the_log_folder_costs_one_warning(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/chatty.py", script_args=["400", "400", "200"])
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(full)], check=True)
    try:
        result = inv("launch", "--hosts", str(box.inventory), log_dir=full / "logs", timeout=120)
    finally:
        subprocess.run(["umount", "-l", str(full)], check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("warning: cannot write the log copy") == 1, result.stderr
    assert "No space left on device" in result.stderr
    assert result.stdout.count("| line ") == 800  # every line still on the console
    for i in range(2):  # and every node's own log is complete
        # chatty.py's own lines (a torchrun's traceback at exit under load has `File ..., line N` lines too)
        assert len(re.findall(r"\]:line \d+ rank", (the_run(box, i) / "log").read_text())) == 400


def xs_in(text: str) -> int:
    return sum(len(run) for run in re.findall("x{1024,}", text))


def test_a_16_mib_line_without_newline_is_cut_and_mirrored_whole(make_sandbox, tmp_path: Path) -> None:
    size = 16 * 1024 * 1024
    box = make_sandbox(1, torchrun="stand-in", master_port=free_port(), script="tests/scripts/chatty.py",
                       script_args=["--no-newline", str(size)])
    result = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs", timeout=120)
    assert result.returncode == 0, result.stderr
    run_id = run_id_of_box(box)
    mirrored = (tmp_path / "logs" / run_id / "node-0.log").read_text()
    # Count the job's runs of x only: torch's own warnings name paths, and a temporary directory's name may hold an x.
    assert xs_in(mirrored) == size
    pieces = [line for line in result.stdout.splitlines() if line.startswith("node-0")]
    assert sum(xs_in(line) for line in pieces) == size
    assert max(len(line) for line in pieces) < 70_000
    assert sum("[line cut: no newline within 65536 bytes]" in line for line in pieces) == size // 65536


def test_inv_stop_spares_a_stranger_with_the_recorded_pid(sleeper_box, tmp_path: Path) -> None:
    # A run that ended long ago, whose recorded torchrun pid (and group) now belongs to an unrelated process.
    stranger = subprocess.Popen(["sleep", "120"], start_new_session=True)
    run_id = "20200101-000000-abcdef"
    run_dir = node_runs(sleeper_box, 0) / run_id / "node-0"
    run_dir.mkdir(parents=True)
    (run_dir / "pgid").write_text(str(stranger.pid))
    (run_dir / "leader").write_text(f"{stranger.pid} 1")  # the start time of the process that was recorded
    (run_dir / "log").write_text("")
    try:
        result = inv("stop", "--hosts", str(sleeper_box.inventory), "--run", run_id, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        time.sleep(0.5)
        assert stranger.poll() is None, "inv stop signalled a process that is not the run's"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_heartbeat_timeout_is_reported_as_what_it_is(sleeper_box, tmp_path: Path) -> None:
    """A launcher frozen longer than the heartbeat timeout: the nodes stop their part by themselves, and the report
    says so, not `exit code 137` nor a failure of the run's own (exit code 129: the launcher lost its run)."""
    proc = launch_background(sleeper_box.inventory, tmp_path / "logs", tmp_path / "err",
                             heartbeat_timeout=2, silence_timeout=60)
    try:
        run_id = run_id_of_box(sleeper_box)
        wait_for(lambda: len(run_processes(run_id)) >= 4, 60, "torchrun and a worker on each node")
        os.killpg(proc.pid, signal.SIGSTOP)
        wait_for(lambda: not run_processes(run_id), 30, "the nodes stopping their parts")
        os.killpg(proc.pid, signal.SIGCONT)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = (tmp_path / "err").read_text()
    assert code == 129, err
    assert (f"run {run_id}: no launcher was heard from for 2 s (--heartbeat-timeout), so node-0, node-1 stopped their "
            "part by themselves") in err, err
    assert "exit code 137" not in err and "FAILED" not in err and "root cause" not in err, err


def test_logs_follow_on_a_lost_run_ends_and_says_so(sleeper_box, tmp_path: Path) -> None:
    # A run whose supervisor was killed: no exit code will ever come, and no process of it is alive.
    run_id = "20200101-000000-0123ab"
    run_dir = node_runs(sleeper_box, 0) / run_id / "node-0"
    run_dir.mkdir(parents=True)
    (run_dir / "log").write_text("[default0]:tick 0 rank 0\n")
    t0 = time.monotonic()
    result = inv("logs", "--hosts", str(sleeper_box.inventory), "--run", run_id, "--node", "node-0", "--follow",
                 timeout=60)
    assert time.monotonic() - t0 < 20
    assert result.returncode == 1, result.stdout + result.stderr
    assert "node-0 r0  | tick 0 rank 0" in result.stdout
    assert "lost" in result.stderr, result.stderr


def test_ctrl_c_while_starting_starts_nothing_and_exits_130(sleeper_box, tmp_path: Path) -> None:
    """Node-1 takes 30 s to get ready (a slow setup line); Ctrl-C meanwhile: node-0, ready and waiting, aborts."""
    data = yaml.safe_load(sleeper_box.inventory.read_text())
    data["hosts"][1] = {"name": data["hosts"][1], "setup": ["sleep 30"]}
    sleeper_box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    env = env_with(log_dir=tmp_path / "logs", grace=GRACE)
    with open(tmp_path / "err", "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "invoke", "launch", "--hosts", str(sleeper_box.inventory),
                                 "--skip-doctor"], cwd=REPO, env=env, stdout=sink, stderr=sink,
                                start_new_session=True)
    try:
        wait_for(lambda: "connected 2/2" in (tmp_path / "err").read_text(), 60, "connected")
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=GRACE + 5 + 5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = (tmp_path / "err").read_text()
    assert code == 130, err
    assert "could not start: interrupted while starting; nothing was started" in err, err
    assert runs_on(sleeper_box) == []
