"""An attached run's consoles, here without SSH: the supervisor's socket, a session's descriptors handed over and
written
to, the owner's rules (a reconnect taken at once, another launcher only with take_over), a console let go while its
launcher sleeps with a full pipe, where a new console's stream begins; and the launcher's messages for a return."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.events import CaughtUp, EndKind, NodeEnd, Position, Reattached
from launcher.node import wire
from launcher.node.agent.consoles import Consoles
from launcher.node.agent.launcherconsole import Console, hand_over, start_offset, wait_released
from launcher.report.absence import attached_line, away_line, left_line, taken_line
from launcher.run.catchup import Returns, caught_up_line


class Messages:
    """What the consoles need of the supervisor's `LauncherWords`."""

    def __init__(self) -> None:
        self.last_message, self.last_message_wall = time.monotonic(), time.time()
        self.input_ended, self.consoles = False, None
        self.said: list[str] = []
        self.stopped: str | None = None

    def heard(self) -> None:
        self.last_message, self.last_message_wall = time.monotonic(), time.time()

    def take(self, message: str) -> None:
        self.said.append(message)

    def stop(self, message: str) -> None:
        self.stopped = message


def pipes() -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """A session's three descriptors (stdin read end, stdout and events write ends) and the launcher's ends."""
    (in_r, in_w), (out_r, out_w), (ev_r, ev_w) = os.pipe(), os.pipe(), os.pipe()
    return (in_r, out_w, ev_w), (in_w, out_r, ev_r)


@pytest.fixture
def supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    emitted: list[dict] = []
    monkeypatch.setattr("launcher.node.agent.consoles.emit",
                        lambda name, **fields: emitted.append({"event": name, **fields}))
    (tmp_path / "log").write_bytes(b"line 0\nline 1\nline 2\n")
    messages = Messages()
    session, launcher = pipes()
    request = {"heartbeat_timeout": 600.0, "away_after_s": 15.0, "attach_tail_bytes": 65536, "reattach": True}
    consoles = Consoles(str(tmp_path), request, messages, Console(session, "owner-a", 0, who="ana@laptop"))
    consoles.serve()
    yield SimpleNamespace(consoles=consoles, messages=messages, emitted=emitted, first=launcher, dir=str(tmp_path))
    consoles.close()


def attach(supervisor, owner: str, take_over: bool = False, offset: int | None = None):
    attached = len(supervisor.emitted)
    session, launcher = pipes()
    sock, answer = hand_over(supervisor.dir, {"owner": owner, "who": f"{owner}@desk", "take_over": take_over,
                                          "offset": offset}, session)
    for fd in session:  # the supervisor holds its own copies now, as it would of a session's
        os.close(fd)
    deadline = time.monotonic() + 5  # its answer comes just before the supervisor turns to it and says `attached`
    while answer.get("accepted") and len(supervisor.emitted) == attached and time.monotonic() < deadline:
        time.sleep(0.01)
    return sock, answer, launcher


def test_a_reconnect_of_the_owner_is_taken_and_its_words_and_stream_are_the_runs(supervisor) -> None:
    sock, answer, (stdin, stdout, _) = attach(supervisor, "owner-a", offset=7)
    assert answer == {"accepted": True}
    current = supervisor.consoles.current
    assert current is not None and current.offset == 7 and current.owner == "owner-a"
    assert [e["event"] for e in supervisor.emitted] == [wire.Event.ATTACHED]
    assert current.enter() and current.write(1, b"line 1\n")  # the supervisor writes to the session's own pipe
    current.leave()
    assert os.read(stdout, 100) == b"line 1\n"
    os.write(stdin, b"hb\n")
    deadline = time.monotonic() + 5
    while supervisor.messages.said != ["hb"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert supervisor.messages.said == ["hb"]
    supervisor.consoles.close()
    assert wait_released(sock) == {"released": "ended"}  # the attach session then ends


def test_another_launcher_is_refused_with_who_owns_the_run_unless_it_takes_it_over(supervisor) -> None:
    _, refused, _ = attach(supervisor, "owner-b")
    assert refused["taken"] is True and refused["by"] == "ana@laptop"
    assert supervisor.consoles.current is supervisor.consoles.first
    sock, answer, _ = attach(supervisor, "owner-b", take_over=True)
    assert answer == {"accepted": True}
    assert supervisor.consoles.owner == "owner-b" and supervisor.consoles.first.gone.is_set()
    # the start session's launcher hears it (its events pipe takes the line now), and a later reconnect of it is refused
    line = json.loads(os.read(supervisor.first[2], 4096).splitlines()[-1])
    assert line["event"] == wire.Event.TAKEN and line["by"] == "owner-b@desk"
    _, again, _ = attach(supervisor, "owner-a")
    assert again["taken"] is True and again["by"] == "owner-b@desk"
    sock.close()


def test_a_console_let_go_never_holds_its_writer_on_a_full_pipe(supervisor) -> None:
    """Its launcher asleep: nothing reads the pipe; a write blocked on it ends once the console is let go."""
    first = supervisor.consoles.first
    assert first.enter()
    result: list[bool] = []
    writer = threading.Thread(target=lambda: result.append(first.write(1, b"x" * (1 << 20))))
    writer.start()
    time.sleep(0.3)
    assert writer.is_alive()  # the pipe is full: the write waits
    attach(supervisor, "owner-a")  # a reconnect: the old console is let go
    writer.join(2)
    assert result == [False]


def test_a_lost_console_makes_the_launcher_away_with_when_the_run_stops(supervisor) -> None:
    supervisor.consoles.lost(supervisor.consoles.first, "its connection closed")
    record = json.loads((Path(supervisor.dir) / "console.json").read_text())
    assert record["present"] is False and record["stops_at"] == pytest.approx(record["away_since"] + 600)
    assert supervisor.messages.stopped is None  # the run goes on, within its bound


@pytest.mark.parametrize(("offset", "tail", "begins"), [(5, 64, 5), (999, 64, 21), (None, 64, 0), (None, 10, 14),
                                                       (None, 7, 14)])
def test_a_new_consoles_stream_begins_at_its_launchers_offset_or_the_start_of_a_line(tmp_path: Path, offset, tail,
                                                                                    begins) -> None:
    log = tmp_path / "log"
    log.write_bytes(b"line 0\nline 1\nline 2\n")  # 21 bytes, lines at 0, 7, 14
    assert start_offset(str(log), offset, tail) == begins


def test_the_launchers_words_for_a_return() -> None:
    returns = Returns()
    sessions = {n: SimpleNamespace(received=0, lines=3, end=None) for n in ("node-0", "node-1")}
    returns.away(0.0, 61.2, {"node-0": 3, "node-1": 3})
    assert returns.due(sessions, 1.0) == []  # no node said where its log is yet
    for node in sessions:
        returns.position(Position(node, 1.0, 100))
        sessions[node].received, sessions[node].lines = 100, 209
    [back] = returns.due(sessions, 2.0)
    assert caught_up_line(back) == "the launcher was away 61 s; node-0, node-1 kept training; 412 lines caught up"
    returns.reattached(Reattached("node-1", 3.0, down_s=2.14, log_bytes=150), lines=209)
    sessions["node-1"].received, sessions["node-1"].lines = 150, 232
    [again] = returns.due(sessions, 4.0)
    assert caught_up_line(again) == ("node-1: the connection dropped and was opened again after 2.1 s; its run went "
                                     "on; 23 lines caught up")
    taken = NodeEnd("node-0", EndKind.TAKEN, 5.0)
    assert caught_up_line(CaughtUp("", 5.0, 9.0, 1.0, 0, (), (), True)) is None and not taken.failed


def test_the_words_of_a_run_the_launcher_lost_without_a_failure() -> None:
    ends = [NodeEnd("node-0", EndKind.EXITED, 1.0, 143, "heartbeat-timeout"),
            NodeEnd("node-1", EndKind.EXITED, 1.0, 1)]
    said = away_line("R", ends, 600)
    assert said is not None and said.startswith("run R: no launcher was heard from for 600 s (--heartbeat-timeout), so "
                                                "node-0 stopped its part by itself; node-1: exit code 1 (its peer "
                                                "stopped)")
    assert away_line("R", ends[1:], 600) is None
    assert taken_line("R", [NodeEnd("node-0", EndKind.TAKEN, 1.0, stop_reason="taken over by bo@desk")]) == \
        "run R was taken over by bo@desk (`attach`) on node-0: this launcher lets go; the run goes on there"
    assert "`ddpl attach --run R` takes it back" in left_line("R", 2, 600, "ddpl attach --run R")
    assert attached_line("R", {"node-0": 73.4, "node-1": None}) == (
        "attached to run R on 2 node(s); its nodes had heard no launcher for 73 s; it had ended on node-1 meanwhile")


@pytest.mark.skipif(os.geteuid() != 0, reason="takes another uid for the stranger")
def test_another_users_session_is_never_taken(supervisor) -> None:
    """Only this uid's sessions become a console (SO_PEERCRED): another user on the node cannot take the run's
    stream or send it messages, whatever the socket's name."""
    stranger = 65534  # nobody
    child = os.fork()
    if child == 0:  # the stranger: hands its descriptors over, and says whether they were taken
        try:
            os.setgid(stranger)
            os.setuid(stranger)
            session, _ = pipes()
            _, answer = hand_over(supervisor.dir, {"owner": "owner-a", "take_over": True}, session)
            os._exit(0 if answer is not None and "silent" in answer else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert supervisor.consoles.current is supervisor.consoles.first and supervisor.consoles.owner == "owner-a"
