"""The node agent run locally as the launcher runs it (`python -c BOOTSTRAP`, the node package then the request on
stdin), with no SSH."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.node import wire
from launcher.node.agent import rundir
from launcher.node.common import proc as procs
from launcher.plan import launchplan as plan
from launcher.plan.request import log_tail_settings, stacks_settings
from launcher.run.actions import agent_input
from launcher.transport.program import BOOTSTRAP
from tests.support.nodeenv import node_python

AGENT = ["-c", BOOTSTRAP]
"""The agent's command line after the interpreter; its stdin starts with `agent_input(request)`, as the launcher's."""
NODE = "node1"


class Node:
    """A private runs root (XDG_CACHE_HOME in a tmp dir) and the processes a test started, ended at teardown."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache")}
        self.env.pop(wire.RUN_ID_ENV, None)
        self.root = tmp / "cache" / "ddp-launcher" / "runs"
        self.procs: list[subprocess.Popen[bytes]] = []

    def run_dir(self, run_id: str, **files: str) -> Path:
        path = self.root / run_id / NODE
        path.mkdir(parents=True)
        (path / "log").write_text(files.pop("log", ""))
        for name, text in files.items():
            (path / name).write_text(text)
        return path

    def process(self, *argv: str, mark: str | None = None) -> subprocess.Popen[bytes]:
        """A process in a session of its own, like torchrun; with `mark`, one of that run's."""
        env = dict(self.env)
        if mark is not None:
            env[wire.RUN_ID_ENV] = mark
        proc = subprocess.Popen(argv or ("sleep", "60"), env=env, start_new_session=True, stdout=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def request(self, timeout: float = 30, **request: object) -> tuple[subprocess.CompletedProcess[bytes], list]:
        """Run one agent action; its result and its JSON events."""
        request.setdefault("node", NODE)
        done = subprocess.run([node_python(), *AGENT], input=agent_input(request),
                              env=self.env, capture_output=True, timeout=timeout, check=False)
        return done, [json.loads(line) for line in done.stderr.decode().splitlines()]

    def follower(self, run_id: str, stdout: int | None) -> subprocess.Popen[bytes]:
        """The agent following the run's log (`logs --follow`), in the background."""
        path = self.tmp / "follow.json"
        request = {"action": "logs", "node": NODE, "run_id": run_id, "follow": True}
        path.write_bytes(agent_input(request))
        with open(path, "rb") as stdin:
            proc = subprocess.Popen([node_python(), *AGENT], env=self.env, stdin=stdin, stdout=stdout,
                                    stderr=subprocess.PIPE, start_new_session=True)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group is only what the test started
            proc.wait()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    try:
        yield n
    finally:
        n.close()


def dead_pid() -> int:
    """A pid that no process has now (one that just ended and was reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat, read here rather than trusting the agent's parser."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def errors(events: list) -> list[str]:
    return [e["message"] for e in events if e["event"] == "error"]


def test_leader_record_round_trip(tmp_path: Path) -> None:
    start = rundir.record_leader(str(tmp_path), os.getpid())
    assert start == start_time(os.getpid()) == procs.start_time(os.getpid())
    assert (tmp_path / "leader").read_text() == f"{os.getpid()} {start}"
    assert rundir.leader_of(str(tmp_path)) == (os.getpid(), start)


@pytest.mark.parametrize("text", ["", "1234", "x 5", "0 5", "1 5", "-7 5", "12 5 9", "12 -5"])
def test_malformed_leader_record_names_nobody(tmp_path: Path, text: str) -> None:
    (tmp_path / "leader").write_text(text)
    assert rundir.leader_of(str(tmp_path)) is None


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "no pidfd (python 3.8)"])
def test_signal_process_spares_a_pid_seen_with_another_start_time(node: Node, monkeypatch, pidfd: bool) -> None:
    # What a pid that died and was reused between the scan and the kill looks like: same pid, another start.
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    proc = node.process()
    start = start_time(proc.pid)
    assert not procs.signal_process(proc.pid, start + 1, signal.SIGKILL)
    time.sleep(0.2)
    assert proc.poll() is None
    assert procs.signal_process(proc.pid, start, signal.SIGKILL)
    assert proc.wait(timeout=5) == -signal.SIGKILL


@pytest.mark.parametrize("record", ["leader with another start time", "leader unmarked", "only an old pgid"])
def test_stop_spares_an_unrelated_process_the_run_dir_names(node: Node, record: str) -> None:
    run_id = plan.new_run_id()
    other = node.process()  # someone else's job that got the run's old pid (its own session: pgid == pid)
    start = start_time(other.pid)
    files = {"pgid": str(other.pid)}
    if record == "leader with another start time":
        files["leader"] = f"{other.pid} {start - 1}"
    elif record == "leader unmarked":
        files["leader"] = f"{other.pid} {start}"
    node.run_dir(run_id, exit_code="0", **files)
    done, events = node.request(action="stop", run_id=run_id, grace=1)
    assert done.returncode == 0, events
    answer = json.loads(done.stdout)
    assert (answer["found"], answer["left"]) == (0, 0)
    time.sleep(0.3)
    assert other.poll() is None, "the agent signalled a process that is not the run's"


def test_stop_with_a_dead_leader_signals_nothing_else(node: Node) -> None:
    run_id = plan.new_run_id()
    bystander = node.process()
    node.run_dir(run_id, exit_code="0", leader=f"{dead_pid()} 1", pgid=str(bystander.pid))
    done, events = node.request(action="stop", run_id=run_id, grace=1)
    assert done.returncode == 0, events
    assert json.loads(done.stdout)["state"] == "exited"
    assert bystander.poll() is None


def test_stop_ends_marked_processes_and_the_leaders_group(node: Node) -> None:
    run_id = plan.new_run_id()
    mark = f"{run_id}/{NODE}"
    run_dir = node.run_dir(run_id)
    # torchrun's part: a marked group leader with a child in its group that has lost the mark; killpg reaches it.
    leader = node.process("sh", "-c", f"env -u {wire.RUN_ID_ENV} sleep 60 & echo $!; wait", mark=mark)
    child = int(leader.stdout.readline())
    deadline = time.monotonic() + 5  # until the child has exec'd `env -u`: from then on it carries no mark
    while not Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep") and time.monotonic() < deadline:
        time.sleep(0.01)
    rundir.record_leader(str(run_dir), leader.pid)
    worker = node.process(mark=mark)  # a worker that left the group (its own session), found by its mark
    bystander = node.process()
    done, events = node.request(action="stop", run_id=run_id, grace=5)
    assert done.returncode == 0, events
    answer = json.loads(done.stdout)
    assert (answer["found"], answer["left"]) == (2, 0)
    assert leader.wait(timeout=5) == -signal.SIGTERM
    assert worker.wait(timeout=5) == -signal.SIGTERM
    deadline = time.monotonic() + 5
    while procs.alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not procs.alive(child), "the leader's group was not signalled"
    assert bystander.poll() is None
    assert (run_dir / "stop_requested").exists()


@pytest.mark.parametrize("action", ["stop", "status", "logs"])
@pytest.mark.parametrize("run_id", ["../../victim", "20260101-000000-abcde", "20260101-000000-ABCDEF",
                                    "20260101-000000-abcdef/../../../victim", 12])
def test_a_bad_run_id_is_refused(node: Node, action: str, run_id: object) -> None:
    # ../../victim from the runs root is tmp/cache/victim: a directory that looks like a run's, outside the root.
    victim = node.tmp / "cache" / "victim" / NODE
    victim.mkdir(parents=True)
    (victim / "log").write_text("not a run's log\n")
    done, events = node.request(action=action, run_id=run_id, grace=1)
    assert done.returncode == 2
    assert done.stdout == b""
    assert errors(events) == [f"{run_id!r} is not a run id: run ids look like 20260131-235959-a1b2c3"]


@pytest.mark.parametrize("action", ["stop", "status", "logs", "runs"])
@pytest.mark.parametrize("name", ["a/b", "..", "x..y", "", None])
def test_a_bad_node_name_is_refused(node: Node, action: str, name: object) -> None:
    done, events = node.request(action=action, node=name, run_id=plan.new_run_id(), grace=1)
    assert done.returncode == 2
    assert errors(events) == [f"{name!r} is not a node name this agent accepts (no '/', no '..', not empty)"]


def test_runs_lists_only_run_ids(node: Node) -> None:
    run_id = plan.new_run_id()
    node.run_dir(run_id)
    node.run_dir("notes")
    done, _ = node.request(action="runs")
    assert json.loads(done.stdout) == {"runs": [run_id]}


@pytest.mark.parametrize("grace", [None, "10", -1, True])
def test_stop_needs_a_grace_period_from_the_request(node: Node, grace: object) -> None:
    run_id = plan.new_run_id()
    node.run_dir(run_id)
    worker = node.process(mark=f"{run_id}/{NODE}")
    request = {"action": "stop", "run_id": run_id}
    if grace is not None:
        request["grace"] = grace
    done, events = node.request(**request)
    assert done.returncode == 2
    assert errors(events) == [f"a stop request needs its grace period (seconds, a number >= 0); got {grace!r}"]
    assert worker.poll() is None


def test_follow_ends_on_a_lost_run(node: Node) -> None:
    run_id = plan.new_run_id()
    node.run_dir(run_id, log="tick 0\ntick 1\n")  # no exit code, and nothing of it alive: its supervisor was killed
    t0 = time.monotonic()
    done, events = node.request(timeout=20, action="logs", run_id=run_id, follow=True)
    assert time.monotonic() - t0 < 5
    assert done.returncode == 1
    assert done.stdout == b"tick 0\ntick 1\n"
    assert errors(events) == [f"run {run_id} was lost on this node: no exit code recorded and none of its processes "
                              f"alive (its supervisor was killed); the log ends here"]


def test_follow_keeps_going_while_the_run_lives_and_ends_with_it(node: Node) -> None:
    run_id = plan.new_run_id()
    run_dir = node.run_dir(run_id, log="tick 0\n")
    worker = node.process(mark=f"{run_id}/{NODE}")
    follower = node.follower(run_id, subprocess.PIPE)
    time.sleep(3)  # past the lost-run checks: a live marked process keeps it following
    assert follower.poll() is None
    with open(run_dir / "log", "a") as log:
        log.write("tick 1\n")
    worker.kill()
    worker.wait()
    (run_dir / "exit_code").write_text("0")
    out, err = follower.communicate(timeout=10)
    assert follower.returncode == 0, err
    assert out == b"tick 0\ntick 1\n"


def test_follow_ends_when_the_launcher_is_gone(node: Node) -> None:
    run_id = plan.new_run_id()
    node.run_dir(run_id, log="tick 0\n")
    node.process(mark=f"{run_id}/{NODE}")  # the run lives on: only the closed stdout can end the follower
    follower = node.follower(run_id, subprocess.PIPE)
    assert follower.stdout.readline() == b"tick 0\n"
    follower.stdout.close()
    assert follower.wait(timeout=5) == 1


def test_start_waits_for_go_and_an_aborted_start_leaves_nothing(tmp_path: Path) -> None:
    """Ready, then nothing until `go`: a stop (another node could not start) leaves no run directory, no process."""
    run_id = f"20000101-000000-{secrets.token_hex(3)}"
    request = {"action": "start", "run_dir": f"{wire.RUNS_ROOT}/{run_id}/node1", "mark": f"{run_id}/node1",
               "workdir": str(tmp_path), "argv": [sys.executable, "-c", "open('ran', 'w')"], "expand_home": [],
               "env": {}, "launcher_env": {}, "secret_names": [], "unset_env": [], "socket_ifname": None,
               "master_addr": "127.0.0.1",
               "master_port": 29400, "node_rank": 0, "detach": False, "grace": 1.0, "heartbeat_timeout": 30.0,
               "away_after_s": 15.0, "attach_tail_bytes": 65536, "reattach": False,
               "alive_interval": 5.0, "log_tail": log_tail_settings(), **stacks_settings(), "watch": True}
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for word, ran in (("stop", False), ("go", True)):
        proc = subprocess.Popen([node_python(), *AGENT], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=env, cwd=tmp_path)
        assert proc.stdin is not None and proc.stderr is not None
        proc.stdin.write(agent_input({**request, "mark": f"{run_id}/node{int(ran)}",
                                      "run_dir": f"{wire.RUNS_ROOT}/{run_id}/node{int(ran)}"}))
        proc.stdin.flush()
        first = json.loads(proc.stderr.readline())
        assert first["event"] == "ready"
        time.sleep(0.3)
        assert not (tmp_path / "ran").exists()  # nothing before the word
        proc.stdin.write(f"{word}\n".encode())
        proc.stdin.flush()  # stdin stays open while the run lives: EOF would mean "launcher gone"
        assert proc.wait(timeout=30) == 0
        proc.stdin.close()
        events = [json.loads(line)["event"] for line in proc.stderr.read().splitlines()]
        proc.stderr.close()
        assert (tmp_path / "ran").exists() is ran, events
        assert ("aborted" in events) is not ran and ("started" in events) is ran
        assert (tmp_path / "cache" / "ddp-launcher" / "runs" / run_id / f"node{int(ran)}").exists() is ran


ESCAPER = """
import os, sys, time
if os.fork() == 0:  # a daemon as a worker may leave one: setsid and fork again, its parent gone
    os.setsid()
    if os.fork() == 0:
        open('daemon.pid', 'w').write(str(os.getpid()))
        time.sleep(120)
    os._exit(0)
while not os.path.exists('end'):
    time.sleep(0.05)
"""


@pytest.mark.parametrize("end", ["the-runs-end", "a-stop-that-kills-the-supervisor"])
def test_a_daemon_the_run_left_is_found_below_the_supervisor_and_stopped(tmp_path: Path, monkeypatch, end: str) -> None:
    """The supervisor is its run's reaper: a process that double-forked out of torchrun's session stays below it, a look
    for the run reads that tree (not every process of the node), and the run's end stops what it finds there. A
    supervisor killed by a stop (a silent agent) is a zombie until its parent waits for it, its orphans gone up: the
    stop then looks over /proc (an empty tree had said "nothing left", and torchrun outlived the stop)."""
    run_id = f"20000101-000000-{secrets.token_hex(3)}"
    mark = f"{run_id}/{NODE}"
    request = {"action": "start", "run_dir": f"{wire.RUNS_ROOT}/{mark}", "mark": mark, "workdir": str(tmp_path),
               "argv": [sys.executable, "-c", ESCAPER], "expand_home": [], "env": {}, "launcher_env": {},
               "secret_names": [], "unset_env": [], "socket_ifname": None, "master_addr": "127.0.0.1",
               "master_port": 29400, "node_rank": 0, "detach": False, "grace": 1.0, "heartbeat_timeout": 30.0,
               "away_after_s": 15.0, "attach_tail_bytes": 65536, "reattach": False,
               "alive_interval": 5.0, "log_tail": log_tail_settings(), **stacks_settings(), "watch": True}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    agent = subprocess.Popen([node_python(), *AGENT], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env={**os.environ}, cwd=tmp_path, start_new_session=True)
    assert agent.stdin is not None and agent.stderr is not None
    daemon = 0
    try:
        agent.stdin.write(agent_input(request))
        agent.stdin.flush()
        assert json.loads(agent.stderr.readline())["event"] == "ready"
        agent.stdin.write(b"go\n")
        agent.stdin.flush()
        deadline = time.monotonic() + 30
        while not (tmp_path / "daemon.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        daemon = int((tmp_path / "daemon.pid").read_text())
        reaper = (tmp_path / "cache" / "ddp-launcher" / "runs" / mark / "reaper").read_text().split()
        assert int(reaper[0]) == agent.pid and int(reaper[1]) == start_time(agent.pid)
        assert procs.parent_of(daemon) == agent.pid  # not init: the supervisor is the reaper of its run's orphans
        tree = procs.run_tree(mark)
        assert tree is not None and daemon in tree
        assert daemon in procs.marked_processes(mark)
        if end == "the-runs-end":
            (tmp_path / "end").touch()
            assert agent.wait(timeout=30) == 0
        else:
            os.kill(agent.pid, signal.SIGKILL)  # not waited for: a zombie while the stop looks
            deadline = time.monotonic() + 10
            while procs.alive(agent.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert procs.run_tree(mark) is None and daemon in procs.marked_processes(mark)
            done, events = Node(tmp_path).request(action="stop", run_id=run_id, grace=1, kill_supervisor=True)
            assert done.returncode == 0, events
            assert json.loads(done.stdout)["left"] == 0
        assert procs.alive(daemon) is False, "the run's daemon outlived its run"
    finally:
        (tmp_path / "end").touch()
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()
        agent.stdin.close()
        agent.stderr.close()
        if daemon and procs.alive(daemon):
            os.kill(daemon, signal.SIGKILL)
