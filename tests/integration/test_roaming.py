"""A run outlives its launcher's troubles, each caused for real on sshd nodes: the launcher paused (a laptop's lid), a
node's connection killed (a roam, a VPN reconnect), the launcher killed or its terminal closed, another terminal
taking the run over, a node whose sshd is gone. Judged by what a user keeps: the exit code, every line once (on the
console and in logs/), no rank restarted, nothing left once the run is over or its bound has passed."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.observe import free_port, parent, signal_each, sshd_family
from tests.helpers import REPO, node_runs, run_processes, wait_for

pytestmark = pytest.mark.integration

GRACE = 1.0
LINES, RATE = 120, 10.0
"""chatty.py's job: this many lines a rank, this many a second (12 s)."""


def start(box, log_dir: Path, out: Path, *task: str, **config: object) -> subprocess.Popen[bytes]:
    """`inv TASK --hosts INVENTORY` in a session of its own (signals reach it as from a terminal); stdout to `out`,
    stderr beside it (`out.err`)."""
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(log_dir), "INVOKE_LAUNCHER_GRACE": str(GRACE),
           **{f"INVOKE_LAUNCHER_{k.upper()}": str(v) for k, v in config.items()}}
    with open(out, "wb") as sink, open(f"{out}.err", "wb") as errors:
        return subprocess.Popen([sys.executable, "-m", "invoke", *(task or ("launch",)), "--hosts",
                                 str(box.inventory)], cwd=REPO, env=env, stdout=sink, stderr=errors,
                                start_new_session=True)


def run_dir(box, node: int) -> Path:
    wait_for(lambda: node_runs(box, node).exists() and any(node_runs(box, node).iterdir()), 60, "a run directory")
    return next(node_runs(box, node).iterdir()) / f"node-{node}"


def lines_of(text: str) -> Counter[tuple[int, int]]:
    """(rank, line number) of each chatty.py line printed, counted."""
    return Counter((int(rank), int(i)) for i, rank in re.findall(r"line (\d+) rank (\d+) ", text))


def every_line_once(text: str, ranks: int = 2, lines: int = LINES, node: int = 0) -> None:
    """Every line of ranks node..node+ranks-1 (a node's own log: its own ranks), each once."""
    counted = lines_of(text)
    wanted = {(r, i) for r in range(node, node + ranks) for i in range(lines)}
    assert set(counted) == wanted, sorted(wanted ^ set(counted))[:10]
    assert max(counted.values()) == 1, [k for k, n in counted.items() if n > 1][:10]


def printing(out: Path, count: int) -> None:
    wait_for(lambda: sum(lines_of(out.read_text(errors="replace")).values()) >= count, 60, f"{count} lines printed")


@contextlib.contextmanager
def ended(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    try:
        yield
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def chatty_box(make_sandbox):
    return make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/chatty.py",
                        script_args=[str(LINES), str(RATE), "40"])


def test_a_launcher_paused_with_the_defaults_finds_its_run_training_and_every_line_once(make_sandbox,
                                                                                        tmp_path: Path) -> None:
    """What a laptop's lid does, with the defaults but a short silence timeout: SIGSTOP for 18 s, past the silence
    timeout (3 s), which would have failed the run as `stopped answering`, and past the nodes' mark of an absent
    launcher (15 s). `status` from another terminal says the launcher is away and no time when the nodes stop the run
    (with no heartbeat bound they keep it: the old default, 600 s, ended a lunch break's run); the launcher wakes,
    catches up and says so, exit code 0, every line once and the local copy the node's log byte for byte."""
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/chatty.py",
                       script_args=["250", str(RATE), "40"])
    out = tmp_path / "out"
    proc = start(box, tmp_path / "logs", out, silence_timeout=3)
    with ended(proc):
        printing(out, 10)
        os.killpg(proc.pid, signal.SIGSTOP)
        time.sleep(16)
        status = subprocess.run([sys.executable, "-m", "invoke", "status", "--hosts", str(box.inventory)],
                                cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
        os.killpg(proc.pid, signal.SIGCONT)
        code = proc.wait(timeout=60)
    said = Path(f"{out}.err").read_text()
    shown = status.stdout.replace("\n", " ")
    assert re.search(r"its launcher \(.+\) has not been heard from since \d\d:\d\d:\d\d \(\d+ s\): its nodes keep "
                     r"the run going without it", shown), shown
    assert "by themselves" not in shown, shown
    assert code == 0, said
    away = re.search(r"the launcher was away (\d+) s; node-0, node-1 kept training; \d+ lines caught up", said)
    assert away and int(away[1]) >= 16, said
    every_line_once(out.read_text(), lines=250)
    run_id = run_dir(box, 0).parent.name
    for node in range(2):  # the local copy is the node's log, byte for byte
        assert (tmp_path / "logs" / run_id / f"node-{node}.log").read_bytes() == \
            (run_dir(box, node) / "log").read_bytes()


def test_a_nodes_dropped_connection_is_opened_again_and_its_ranks_go_on(chatty_box, tmp_path: Path) -> None:
    """node-1's sshd session for the launcher killed (a roam, a NAT that forgot the flow): a new connection takes the
    run's console; no process of the run ends, no line is lost or printed twice, exit code 0."""
    out = tmp_path / "out"
    proc = start(chatty_box, tmp_path / "logs", out, silence_timeout=10)
    with ended(proc):
        printing(out, 20)
        supervisor = int((run_dir(chatty_box, 1) / "supervisor").read_text().split()[0])
        run_id = run_dir(chatty_box, 1).parent.name
        before = set(run_processes(run_id))
        session = parent(supervisor)
        assert session in sshd_family(chatty_box.nodes[1].pid)  # the supervisor is its session's command (exec)
        t0 = time.monotonic()
        os.kill(session, signal.SIGKILL)
        wait_for(lambda: "connection dropped" in Path(f"{out}.err").read_text(), 15, "the reconnect's line")
        took = time.monotonic() - t0
        assert before <= set(run_processes(run_id)), "a process of the run ended with the connection"
        code = proc.wait(timeout=60)
    said = Path(f"{out}.err").read_text()
    assert code == 0, said
    assert re.search(r"node-1: the connection dropped and was opened again after \d+\.\d s; its run went on; \d+ "
                     r"lines? caught up", said), said
    assert took < 10, said
    every_line_once(out.read_text())


BOUND_S = 10
"""The heartbeat bound of a run whose launcher was killed."""


def test_a_killed_launcher_leaves_the_run_to_its_bound_then_nothing(chatty_box, tmp_path: Path) -> None:
    """SIGKILL: the nodes keep training, `status` says the launcher is away and when the run stops, then (the bound:
    10 s, which a loaded machine's `status`, begun 3 s in, answers within) each node stops its part and nothing of the
    run is left."""
    out = tmp_path / "out"
    proc = start(chatty_box, tmp_path / "logs", out, heartbeat_timeout=BOUND_S)
    with ended(proc):
        printing(out, 10)
        run_id = run_dir(chatty_box, 0).parent.name
        os.killpg(proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        log = run_dir(chatty_box, 1) / "log"
        size = log.stat().st_size
        time.sleep(3)
        assert run_processes(run_id) and log.stat().st_size > size, "the run stopped with its launcher"
        status = subprocess.run([sys.executable, "-m", "invoke", "status", "--hosts", str(chatty_box.inventory)],
                                cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
        wait_for(lambda: not run_processes(run_id), BOUND_S + GRACE + 5, "the run's processes gone after the bound")
    assert time.monotonic() - t0 > BOUND_S * 3 / 4, "stopped before its bound (the last heartbeat, a quarter of it)"
    assert status.stdout.count("running") == 2, status.stdout
    assert re.search(r"its launcher \(.+\) has not been heard from since \d\d:\d\d:\d\d \(\d+ s\): node-\[0,1\] stop "
                     r"the run by themselves at \d\d:\d\d:\d\d", status.stdout.replace("\n", " ")), status.stdout
    assert f"attach --hosts {chatty_box.inventory} --run {run_id}" in status.stdout.replace("\n", ""), status.stdout


def test_a_closed_terminal_leaves_the_run_and_attach_takes_it_to_its_end(chatty_box, tmp_path: Path) -> None:
    """SIGHUP: the launcher leaves the run to its nodes (exit code 129, the command to take it back); `attach` from
    another terminal streams from where the local copy stopped, and ends with the run's exit code. Every line is in
    logs/ once; what the launch printed and what attach printed together are every line once."""
    out, again = tmp_path / "out", tmp_path / "attach"
    proc = start(chatty_box, tmp_path / "logs", out)
    with ended(proc):
        printing(out, 20)
        os.killpg(proc.pid, signal.SIGHUP)
        assert proc.wait(timeout=30) == 129
        run_id = run_dir(chatty_box, 0).parent.name
        assert len(run_processes(run_id)) >= 4, "the run stopped with its launcher"
        time.sleep(1)  # lines the nodes print while no launcher is there
        follower = start(chatty_box, tmp_path / "logs", again, "attach")
        with ended(follower):
            code = follower.wait(timeout=60)
    left, said = Path(f"{out}.err").read_text(), Path(f"{again}.err").read_text()
    assert f"the launcher's terminal closed: run {run_id} goes on on its 2 node(s) without it" in left, left
    assert f"inv attach --hosts {chatty_box.inventory} --run {run_id}" in left, left
    assert code == 0, said
    assert re.search(rf"attached to run {run_id} on 2 node\(s\); its nodes had heard no launcher for \d+ s", said), said
    every_line_once(out.read_text() + again.read_text())
    for node in range(2):
        mirror = (tmp_path / "logs" / run_id / f"node-{node}.log").read_bytes()
        assert mirror == (run_dir(chatty_box, node) / "log").read_bytes()
    assert not run_processes(run_id)


ATTACH_BY_API = """
import sys
from launcher import api
from launcher.errors import LauncherError

lines = []
try:
    api.attach(sys.argv[1], log_dir=sys.argv[2], on_output=lines.append, on_message=print)
except LauncherError as exc:
    print("REFUSED", exc)
result = api.attach(sys.argv[1], log_dir=sys.argv[2], on_output=lines.append, on_message=print, force=True)
print("RESULT", result.run_id, result.ok, result.exit_code, len(lines))
with open(sys.argv[3], "w") as kept:
    kept.write("\\n".join(lines))
"""


def test_a_launcher_that_wakes_after_an_attach_lets_go(chatty_box, tmp_path: Path) -> None:
    """The first launcher asleep (SIGSTOP) for a moment, while the Python API's `attach` takes the run over from
    another process: its nodes still count it present, so the attach is refused, naming it, until `force=True`, which
    says it displaces it. Once awake the first launcher says who took the run and leaves (exit code 129) without
    touching it; the attach follows the run to its end as its owner and returns its result; the local copy of each
    node's log has every line once (both launchers wrote it, each at the node's own offsets)."""
    out = tmp_path / "out"
    proc = start(chatty_box, tmp_path / "logs", out)
    with ended(proc):
        printing(out, 10)
        os.killpg(proc.pid, signal.SIGSTOP)
        run_id = run_dir(chatty_box, 0).parent.name
        with open(tmp_path / "api", "wb") as sink:
            follower = subprocess.Popen([sys.executable, "-c", ATTACH_BY_API, str(chatty_box.inventory),
                                         str(tmp_path / "logs"), str(tmp_path / "api-lines")], cwd=REPO, stdout=sink,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        with ended(follower):
            wait_for(lambda: "attached to run" in (tmp_path / "api").read_text(), 60, "the attach")
            os.killpg(proc.pid, signal.SIGCONT)
            assert proc.wait(timeout=30) == 129
            follower.wait(timeout=60)
    left, said = Path(f"{out}.err").read_text(), (tmp_path / "api").read_text()
    assert re.search(r"run \S+ was taken over by .+ \(`attach`\) on node-0, node-1: this launcher lets go", left), left
    assert re.search(rf"REFUSED run {run_id} is followed now by another launcher \(\S+@\S+ \(pid {proc.pid}\)\), "
                     rf"which its nodes hear: `(?:inv|ddpl) attach --hosts \S+ --run {run_id} --force` takes it over",
                     said), said
    assert re.search(rf"taking run {run_id} over from the launcher that follows it now \(\S+@\S+ \(pid {proc.pid}\)\)",
                     said), said
    assert re.search(rf"RESULT {run_id} True 0 \d+", said), said
    for node in range(2):
        every_line_once((tmp_path / "logs" / run_id / f"node-{node}.log").read_text(), ranks=1, lines=LINES, node=node)
    # issue 69 (6): what the first launcher had not read when it froze, the attach printed; woken, the first one
    # prints none of it again (it printed 14 lines twice), and says so
    shown_twice = set(lines_of(out.read_text())) & set(lines_of((tmp_path / "api-lines").read_text()))
    assert not shown_twice, sorted(shown_twice)[:10]
    assert re.search(r"node-\d: \d+ line\(s\) another launcher on this machine printed already", left), left


def test_a_node_whose_sshd_is_gone_fails_the_run_within_the_silence_timeout(chatty_box, tmp_path: Path) -> None:
    """node-1's sshd killed, listener and session: no reconnect can succeed; the run fails within the silence timeout
    as a lost node, and the report says node-1's part stops by itself at its bound (nothing can stop it sooner)."""
    out = tmp_path / "out"
    proc = start(chatty_box, tmp_path / "logs", out, silence_timeout=4, heartbeat_timeout=8)
    with ended(proc):
        printing(out, 10)
        run_id = run_dir(chatty_box, 1).parent.name
        t0 = time.monotonic()
        signal_each(sshd_family(chatty_box.nodes[1].pid), signal.SIGKILL)
        code = proc.wait(timeout=60)
        took = time.monotonic() - t0
        wait_for(lambda: not run_processes(run_id), 8 + GRACE + 5, "node-1's part stopped at its bound")
    said = Path(f"{out}.err").read_text()
    assert code == 1, said
    assert "root cause: node-1: the connection to the node was lost" in said, said
    assert "could not reconnect within 4 s: connection refused" in said, said
    assert "node-1: its part of the run may still be running" in said and "it stops by itself 8 s after" in said, said
    assert took < 4 + GRACE + 5 + 5, said


def test_a_launcher_cut_off_from_every_node_waits_for_them_within_their_bound(make_sandbox, tmp_path: Path) -> None:
    """This machine's network gone for 8 s (every node's sshd session killed, and no new connection answered: each
    node's listener SIGSTOPped), past the silence timeout (3 s): no node is lost, since none can be reached (this
    launcher's own network, most likely); it says so and keeps trying within the nodes' bound (30 s), reconnects to
    each when the network is back, and the run ends well with every line once."""
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/chatty.py", script_args=["250", "10", "40"])
    out = tmp_path / "out"
    proc = start(box, tmp_path / "logs", out, silence_timeout=3, heartbeat_timeout=30, connect_timeout=2)
    with ended(proc):
        printing(out, 20)
        listeners = [node.pid for node in box.nodes]
        stopped = signal_each(listeners, signal.SIGSTOP)
        try:
            for listener in listeners:
                signal_each([pid for pid in sshd_family(listener) if pid != listener], signal.SIGKILL)
            time.sleep(8)
        finally:
            signal_each(stopped, signal.SIGCONT)
        code = proc.wait(timeout=90)
    said = Path(f"{out}.err").read_text()
    assert code == 0, said
    assert re.search(r"no node of the run can be reached since \d\d:\d\d:\d\d \(this machine's network\?\): the run "
                     r"goes on on its nodes; trying again until \d\d:\d\d:\d\d", said), said
    for node in ("node-0", "node-1"):
        assert f"{node}: the connection dropped and was opened again after" in said, said
    every_line_once(out.read_text(), lines=250)
