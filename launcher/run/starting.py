"""An attached run's start (`start`): every node's agent session opened at once, the start gate's rounds inside them
(`launcher.run.gate`: each agent's probe gathered while the sessions still open, the TCP check once the master holds
its port, the gate's verdict, and `abort` to every agent when it refuses), each agent ready, then `go`. Driven by the
run's handle (`RunHandle.start`), stepping it between its waits."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from launcher.events import EndKind, NodeFacts
from launcher.limits import STOP_MARGIN
from launcher.node.wire import ABORT, GO, TCP, Event, message_line
from launcher.plan.launchplan import LaunchPlan
from launcher.run.gate import StartGate
from launcher.run.sessions import Session, SessionOpener, Sessions

log = logging.getLogger(__name__)


class Starting(Protocol):
    """What the rounds need of the run's handle (`launcher.run.handle.RunHandle`)."""

    sessions: dict[str, Session]
    plan: LaunchPlan
    link: Sessions
    opener: SessionOpener | None
    start_failure: str | None
    stop_deadline: float | None

    gate: StartGate | None

    def step(self, timeout: float) -> None: ...

    def until(self, done: Callable[[], bool]) -> None: ...

    def opened(self, errors: list[str | None]) -> dict[str, str]: ...


def start(handle: Starting) -> None:
    """Open every node's agent session at once, and send `go` once every one is ready.

    Any node that cannot start makes the others stop what they started: a run starts everywhere or nowhere. With a
    `StartGate` (the doctor's checks) each agent probes first, in the same session; the gate's verdict comes before
    `go`, and when it raises, every agent is told `abort` and nothing starts anywhere.
    """
    began = time.monotonic()
    gate = handle.gate
    if gate is not None and gate.in_session:
        gate_check(handle, gate, began)  # the sessions open while their checks are gathered
    else:
        handle.opened(handle.link.open(handle.plan.nodes, handle.opener))
    # Each agent checks what it can, says `ready` and waits: `go` only once every node is ready.
    handle.until(lambda: all(s.ready or s.end for s in handle.sessions.values()))
    if handle.start_failure is None:
        log.debug("every node is ready in %.2f s: go", time.monotonic() - began)
        for session in handle.sessions.values():
            session.channel.send(message_line(GO))


def gate_check(handle: Starting, gate: StartGate, began: float) -> None:
    """The gate's checks inside the agents' sessions, gathered while the sessions still open, then the verdict.

    Each agent's `probed` event (the master's says whether master_port was free, and holds it). A node whose probe
    has not answered within the gate's probe_timeout, or whose session ended first, is judged on that. Once the
    master holds the port, every node that probed is told `tcp` as its probe comes in, and answers `tcp`. At 256
    nodes the first probes come seconds before the last session opens: no check waits for the opening to end.
    """
    sent = time.time()
    sessions = handle.sessions
    outcome: list[list[str | None] | BaseException] = []

    def open_all() -> None:
        try:
            outcome.append(handle.link.open(handle.plan.nodes, handle.opener))
        except BaseException as exc:  # said in the calling thread
            outcome.append(exc)

    opening = threading.Thread(target=open_all, daemon=True, name="open")
    opening.start()
    asked: dict[str, float] = {}  # node -> when it was told `tcp`
    try:
        while True:
            _ask_tcp(handle, asked)
            now = time.monotonic()
            waiting = [
                s
                for s in list(sessions.values())
                if Event.PROBED not in s.checked and s.end is None and now - s.opened < gate.probe_timeout
            ]
            if not waiting and not opening.is_alive():
                break
            until = min((s.opened + gate.probe_timeout for s in waiting), default=now + 0.2)
            handle.step(min(0.2, max(0.0, until - now)))
    finally:
        opening.join()  # Ctrl-C too: the sessions it opens are then the ones told to stop
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    unopened = handle.opened(outcome[0])
    _ask_tcp(handle, asked)
    _tcp_answers(handle, gate, asked)
    facts = {name: _facts(handle, name, unopened) for name in (c.host.name for c in handle.plan.nodes)}
    try:
        gate.judge(handle.plan.cluster, facts, (sent, time.time()), time.monotonic() - began)
    except Exception as exc:
        log.info("the start gate refused the run after %.2f s: %s", time.monotonic() - began, exc)
        _abort_start(handle)
        raise
    log.info("the start gate's checks passed on %d node(s) in %.2f s", len(facts), time.monotonic() - began)


def _ask_tcp(handle: Starting, asked: dict[str, float]) -> None:
    """`tcp` to every node that probed and was not told yet, once the master holds master_port (else no run can
    start anyway)."""
    master = handle.sessions.get(handle.plan.cluster.hosts[0].name)
    listener = master.checked.get(Event.PROBED, {}).get("listener") if master is not None else None
    if not (listener and listener.get("free")) or handle.start_failure is not None:
        return
    for session in list(handle.sessions.values()):
        if session.name not in asked and Event.PROBED in session.checked and session.end is None:
            session.channel.send(message_line(TCP))
            asked[session.name] = time.monotonic()


def _tcp_answers(handle: Starting, gate: StartGate, asked: dict[str, float]) -> None:
    """Each node told `tcp` answers `tcp` within the probe timeout, or is said not to have."""
    told = [handle.sessions[name] for name in asked]
    until = max(asked.values(), default=0.0) + gate.probe_timeout
    while any(Event.TCP not in s.checked and s.end is None for s in told) and time.monotonic() < until:
        handle.step(0.2)
    for session in told:
        if session.end is None:
            session.checked.setdefault(
                Event.TCP, {"ok": False, "error": f"no answer to the TCP check within {gate.probe_timeout:g} s"}
            )


def _facts(handle: Starting, name: str, unopened: dict[str, str]) -> NodeFacts:
    """What one node's session said for the checks (a probe past its limit counts as not answering)."""
    session = handle.sessions.get(name)
    if session is None:
        return NodeFacts(failure=unopened.get(name, "no session was opened"))
    probed = session.checked.get(Event.PROBED)
    if probed is not None:
        return NodeFacts(
            probe=probed["probe"],
            listener=probed["listener"],
            tcp=session.checked.get(Event.TCP),
            took=round(probed["at"] - session.opened, 3),
        )
    end = session.end
    if end is None or end.kind == EndKind.SILENT:  # no answer in time (the silence limit is never shorter)
        return NodeFacts(took=round(time.monotonic() - session.opened, 3), timed_out=True)
    return NodeFacts(exit_code=end.exit_code, messages=tuple(session.messages))


def _abort_start(handle: Starting) -> None:
    """The checks failed: `abort` to every agent; wait for those that answer (none has made anything)."""
    for session in handle.sessions.values():
        if session.end is None:
            session.asked_to_stop = True
            if not session.channel.send(message_line(ABORT), block=False):
                session.pending_message = message_line(ABORT)  # sent again at the next step
    handle.stop_deadline = time.monotonic() + STOP_MARGIN
    # An agent that never probed (a python that hangs) gets `abort` or the channel's end whenever it starts.
    while any(s.end is None and Event.PROBED in s.checked for s in handle.sessions.values()):
        handle.step(0.2)
