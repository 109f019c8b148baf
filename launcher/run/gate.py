"""The start gate: checks that run inside every node agent's start session before `go` (the doctor's fast checks,
`launcher.doctor.collect.SessionPreflight`). When the gate raises, every agent is told `abort`, and nothing starts
anywhere: no run directory, no process.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from launcher.config.model import Cluster, Host
from launcher.events import EndKind, NodeFacts
from launcher.node.protocol import ABORT, TCP, Event, word_line
from launcher.options import STOP_MARGIN
from launcher.transport.sessions import Node

if TYPE_CHECKING:
    from launcher.run.handle import RunHandle


@runtime_checkable
class StartGate(Protocol):
    """What a launch does before `go` (`Options.preflight`): work on the open connections before any session opens
    (`launch --sync`), and, when `in_session`, checks that every node's agent runs in its start session (the
    doctor's: `SessionPreflight`)."""

    probe_timeout: float
    in_session: bool

    def prepare(self, cluster: Cluster, nodes: dict[str, Node]) -> None:
        """Work on the open connections before any session opens (`launch --sync`)."""

    def node_section(self, cluster: Cluster, host: Host, run_id: str) -> dict[str, Any] | None:
        """The start request's `preflight` part for this host (None: the agent checks nothing before `ready`)."""

    def judge(self, cluster: Cluster, facts: Mapping[str, NodeFacts], clock: tuple[float, float],
              seconds: float) -> Any:
        """Raise a LauncherError when nothing may start; return otherwise."""


@dataclass(frozen=True)
class ConnectionsFirst:
    """A start gate that only works on the open connections (`launch --sync --skip-doctor`): no checks in the
    agents' sessions."""

    before: Callable[[Cluster, dict[str, Node]], None] | None = None
    probe_timeout: float = 0.0
    in_session: bool = False

    def prepare(self, cluster: Cluster, nodes: dict[str, Node]) -> None:
        if self.before is not None:
            self.before(cluster, nodes)

    def node_section(self, cluster: Cluster, host: Host, run_id: str) -> dict[str, Any] | None:
        return None

    def judge(self, cluster: Cluster, facts: Mapping[str, NodeFacts], clock: tuple[float, float],
              seconds: float) -> None:
        return None


def check(handle: RunHandle, gate: StartGate, unopened: dict[str, str], began: float) -> None:
    """The gate's checks inside the agents' sessions: gather every probe, then the TCP round, then the verdict.

    Round one: each agent's `probed` event (the master's says whether master_port was free, and holds it). A
    node whose probe has not answered within the gate's probe_timeout, or whose session ended first, is judged
    on that. Round two, when the master holds the port: `tcp` to every node that probed, each answers `tcp`.
    """
    sent = time.time()
    sessions = handle.sessions
    while True:
        now = time.monotonic()
        waiting = [s for s in sessions.values() if Event.PROBED not in s.checked and s.end is None
                   and now - s.opened < gate.probe_timeout]
        if not waiting:
            break
        handle.step(min(0.2, max(0.0, min(s.opened + gate.probe_timeout for s in waiting) - now)))
    master = sessions.get(handle.plan.cluster.hosts[0].name)
    listener = master.checked.get(Event.PROBED, {}).get("listener") if master is not None else None
    if listener and listener.get("free") and handle.start_failure is None:  # else no run can start anyway
        _tcp_round(handle, gate)
    facts = {name: _facts(handle, name, unopened) for name in (c.host.name for c in handle.plan.nodes)}
    try:
        gate.judge(handle.plan.cluster, facts, (sent, time.time()), time.monotonic() - began)
    except Exception:
        _abort_start(handle)
        raise


def _tcp_round(handle: RunHandle, gate: StartGate) -> None:
    """`tcp` to every node that probed: each connects to the master's listener and answers `tcp`."""
    asked = [s for s in handle.sessions.values() if Event.PROBED in s.checked and s.end is None]
    for session in asked:
        session.channel.send(word_line(TCP))
    until = time.monotonic() + gate.probe_timeout
    while any(Event.TCP not in s.checked and s.end is None for s in asked) and time.monotonic() < until:
        handle.step(0.2)
    for session in asked:
        if session.end is None:
            session.checked.setdefault(Event.TCP, {"ok": False, "error": f"no answer to the TCP check within "
                                                                      f"{gate.probe_timeout:g} s"})


def _facts(handle: RunHandle, name: str, unopened: dict[str, str]) -> NodeFacts:
    """What one node's session said for the checks (a probe past its limit counts as not answering)."""
    session = handle.sessions.get(name)
    if session is None:
        return NodeFacts(failure=unopened.get(name, "no session was opened"))
    probed = session.checked.get(Event.PROBED)
    if probed is not None:
        return NodeFacts(probe=probed["probe"], listener=probed["listener"], tcp=session.checked.get(Event.TCP),
                         took=round(probed["at"] - session.opened, 3))
    end = session.end
    if end is None or end.kind == EndKind.SILENT:  # no answer in time (the silence limit is never shorter)
        return NodeFacts(took=round(time.monotonic() - session.opened, 3), timed_out=True)
    return NodeFacts(exit_code=end.exit_code, messages=tuple(session.messages))


def _abort_start(handle: RunHandle) -> None:
    """The checks failed: `abort` to every agent; wait for those that answer (none has made anything)."""
    for session in handle.sessions.values():
        if session.end is None:
            session.asked_to_stop = True
            if not session.channel.send(word_line(ABORT), block=False):
                session.pending_word = word_line(ABORT)  # sent again at the next step
    handle.stop_deadline = time.monotonic() + STOP_MARGIN
    # An agent that never probed (a python that hangs) gets `abort` or the channel's end whenever it starts.
    while any(s.end is None and Event.PROBED in s.checked for s in handle.sessions.values()):
        handle.step(0.2)
