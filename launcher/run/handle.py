"""One attached run across nodes, as torch elastic's agent runs its worker group: its state (`launcher.run.state`:
STARTING, RUNNING, STOPPING, ENDED, and each node's) moved by one loop (`step`), `start`, `wait`, `stop`, `close`.

Each node's agent (`launcher/node/agent/agent.py`) runs in a session (`launcher.run.sessions`): a reader thread per node
turns its channel into typed events, a heartbeat thread keeps every agent sure the launcher is alive, and this
handle's waiting thread takes them one at a time and carries out what `launcher.plan.recovery` decides of each
node's end (fail fast, an elastic group going on without a node, a failed start), of silence and stop deadlines, and
a run alive but stuck (`launcher.run.hangcheck`). Output goes to `on_event` from the reader threads, so consumers
must not block: nothing here ever waits on a console or a disk. How the run ended is `launcher.plan.ends.run_end`'s,
from every node's end and what `supervised` says.
"""

from __future__ import annotations

import logging
import math
import queue
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from launcher.events import (
    Beat,
    CutOff,
    Ended,
    EndKind,
    HangSuspected,
    Left,
    Message,
    NodeEnd,
    NodeEvent,
    Position,
    Reattached,
    Started,
    Stopping,
)
from launcher.limits import STALL, STOP_MARGIN
from launcher.node.wire import KILL, POSITION, STOP, STOPPED_BY, message_line, stopped_by
from launcher.plan.ends import Supervised
from launcher.plan.launchplan import LaunchPlan
from launcher.plan.recovery import FailStart, GoOnWithout, StopRun, after_node_end, group_needs
from launcher.run.catchup import Returns
from launcher.run.gate import StartGate
from launcher.run.hangcheck import HangCheck
from launcher.run.losscheck import LossCheck
from launcher.run.reach import cut_off_since, out_of_reach, silence_limit, stop_over
from launcher.run.reattach import Reconnector
from launcher.run.sessions import Session, SessionOpener, Sessions
from launcher.run.starting import start
from launcher.run.state import GroupState, RunState
from launcher.run.sweep import SWEPT, Sweeps
from launcher.transport.connections import Node
from launcher.watch.spares import SpareWatch

log = logging.getLogger(__name__)
TALLY_S = 60.0
"""How often the trace counts the heartbeats and beats that went both ways (each is too frequent to trace)."""


class RunHandle:
    """The controller side of one run: its state, its sessions, and the decisions carried out while waiting."""

    def __init__(
        self,
        plan: LaunchPlan,
        nodes: dict[str, Node],
        requests: dict[str, dict[str, Any]],
        agent_source: str,
        on_event: Callable[[NodeEvent], None],
        opener: SessionOpener | None = None,
        gate: StartGate | None = None,
        reconnector: Reconnector | None = None,
    ):
        self.plan, self.nodes = plan, nodes
        settings = self.settings = plan.settings
        self.gate = gate
        """What runs before `go`: the doctor's checks in the agents' sessions (`launcher.run.gate`)."""
        self.opener = opener
        self.on_event = on_event
        self.reconnector = reconnector
        """New sessions to a node's run (a dropped connection, `attach`); None under SLURM."""
        self.link = Sessions(
            nodes,
            requests,
            agent_source,
            on_event,
            settings.run.heartbeat_bound,
            settings.run.silence_timeout,
            reconnector,
        )
        self.sessions: dict[str, Session] = self.link.by_name
        self.sweeps = Sweeps(
            plan.run_id, nodes, agent_source, settings.run.grace, settings.run.heartbeat_bound, reconnector
        )
        self.state = RunState.STARTING
        self.returns = Returns()
        """The launcher's own returns and its nodes' reconnects whose backlog is being read."""
        self.start_failure: str | None = None
        self.needs = group_needs(plan.cluster, len(plan.nodes))
        """While this many nodes still run, a failed node does not stop the others (c10d); static: every node."""
        self.stop_deadline: float | None = None
        self.interrupted = False
        """The user asked for the stop (Ctrl-C, SIGTERM)."""
        self.left = False
        """This launcher let the run go on without it (its terminal closed)."""
        self.attaching = False
        """This handle takes over a run that lives on (`attach`) rather than starting one."""
        self.on_stopping: Callable[[list[str], str], None] = lambda names, why: None
        """Told the nodes a stop goes to, and why, before it goes (the console folds torchrun's lines on it)."""
        self.spares = SpareWatch.of(plan.cluster.rendezvous.elastic, len(plan.nodes))  # a c10d run's idle hosts
        self._tallied = time.monotonic()
        self.cut_off: float | None = None
        """Since when (monotonic) no node of the run can be reached at all, while that lasts."""
        self._last_step = time.monotonic()
        hang_timeout, on_hang = settings.run.hang_timeout, settings.run.on_hang
        self.hangs = (
            None if hang_timeout == 0 else HangCheck(hang_timeout, on_hang == "keep", restart=on_hang == "restart")
        )
        """The run's progress and the looks at its stacks (launcher.run.hangcheck); None: --hang-timeout 0."""
        self.losses = LossCheck(settings.run.on_nonfinite, (c.host.name for c in plan.nodes))

    @property
    def hang(self) -> HangSuspected | None:
        """The hang that stopped the run (exit code 124)."""
        return self.hangs.hang if self.hangs is not None else None

    @property
    def group(self) -> GroupState:
        """The run's state and every node's, now."""
        return GroupState(self.state, {name: s.state for name, s in list(self.sessions.items())})

    def supervised(self) -> Supervised:
        """What the supervision saw, for the run's end (`launcher.plan.ends.run_end`)."""
        seen = self.needs, self.interrupted, self.left, self.cut_off is not None, self.hang, self.losses.nonfinite
        return Supervised(*seen, frozenset(self.spares.spares))

    @property
    def unswept(self) -> dict[str, str]:
        """Nodes whose part could not be stopped over a new channel, and why."""
        return self.sweeps.unswept

    # --- start ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Open every node's session at once; wait until all started (`starting.start`): everywhere or nowhere."""
        start(self)
        self._started()

    def attach(self, offsets: Mapping[str, int | None]) -> None:
        """Take over a run that lives on its nodes (`attach`): an attach session to every node at once, each taken by
        the node's run (or replaying its end, when it ended meanwhile), the log from `offsets` (this machine's copy;
        None: its last lines). Nothing is started, and a node that cannot be attached stops nothing anywhere."""
        assert self.reconnector is not None
        reconnector = self.reconnector
        self.attaching = True
        errors = self.link.attach(
            self.plan.nodes,
            lambda command: reconnector.open(command.host, False, offsets.get(command.host.name), take_over=True),
            offsets,
        )
        for command, error in zip(self.plan.nodes, errors, strict=True):
            if error is not None:
                self._fail_start(f"{command.host.name}: {error}")
        self._started()

    def until(self, done: Callable[[], bool]) -> None:
        """Step until `done`, or until the start failed."""
        while self.start_failure is None and not done():
            self.step(0.2)
        for _ in range(self.link.control.qsize()):  # what came with the last: each node's `attached` counts (taken)
            self.step(0)

    def _started(self) -> None:
        """Every node started (or taken): the run is RUNNING and the hang watch's clock starts."""
        self.until(lambda: all(s.started or s.end for s in self.sessions.values()))
        if self.start_failure is None and self.state == RunState.STARTING:
            self._enter(RunState.RUNNING, f"{len(self.sessions)} node(s) started")
        if self.hangs is not None:
            self.hangs.watch.start(time.monotonic())

    def opened(self, errors: list[str | None]) -> dict[str, str]:
        """Every session is open or could not be: those that could not fail the start (and a stop that went out
        while the others were opening reaches them too). The nodes without a session, and why."""
        unopened = {c.host.name: e for c, e in zip(self.plan.nodes, errors, strict=True) if e is not None}
        for name, error in unopened.items():
            self._fail_start(f"{name}: cannot open a session: {error}")
        if self.start_failure is not None:
            self.stop(why=f"the start failed: {self.start_failure}")
        return unopened

    def abort(self, reason: str) -> None:
        """Give up starting: stop what has started (a run starts everywhere or nowhere)."""
        self._fail_start(reason)

    def _fail_start(self, reason: str) -> None:
        if self.start_failure is None:
            self.start_failure = reason
            if not self.attaching:  # an attach that fails leaves the run as it found it
                self.stop(why=f"the start failed: {reason}")

    @property
    def started(self) -> list[str]:
        return [s.name for s in self.sessions.values() if s.started]

    # --- waiting and deciding --------------------------------------------------------------------------------

    def step(self, timeout: float) -> None:
        """Take one event (or time out), then look at the clock: silent nodes, stop deadlines."""
        try:
            event = self.link.control.get(timeout=timeout)
        except queue.Empty:
            event = None
        if event is not None:
            self._take(event)
        now = time.monotonic()
        if now - self._last_step > STALL:
            self._back(now, now - self._last_step)
        self._last_step = now
        for caught in self.returns.due(self.sessions, now):
            self.on_event(caught)
        bound = self._outage_bound(now)
        sessions = list(self.sessions.values())
        over = stop_over(sessions, self.stop_deadline)
        for session in sessions:
            if session.end is None:
                self._look_at(session, now, bound, over)
        if (
            self.hangs is not None
            and self.hang is None
            and self.state == RunState.RUNNING
            and self.sessions
            and all(s.started for s in list(self.sessions.values()))
        ):
            self.hangs.look(self, now)
        if now - self._tallied > TALLY_S:
            self._tally()

    def _back(self, now: float, away_s: float) -> None:
        """The launcher itself was frozen (SIGSTOP, a suspended laptop): what it did not read is no node's silence and
        no hang's; each node says how long its log is now, and once it is read that far a line says the absence."""
        live = [s for c in self.plan.nodes if (s := self.sessions.get(c.host.name)) is not None and s.end is None]
        log.info(
            "this launcher was frozen for %.0f s (SIGSTOP, a suspended laptop): position asked of %d node(s)",
            away_s,
            len(live),
        )
        for session in live:
            session.heard = max(session.heard, now)
            if session.started:
                session.channel.send(message_line(POSITION), block=False)
        if self.hangs is not None:
            self.hangs.watch.rearm(now)
        self.returns.away(now, away_s, {s.name: s.lines for s in live if s.started})

    def _outage_bound(self, now: float) -> float:
        """How long a node may be out of reach: the silence timeout, or, while this machine is cut off from every
        node (`reach.cut_off_since`), the nodes' own bound, when they stop the run by themselves (said once, as it
        begins)."""
        run, was = self.settings.run, self.cut_off
        bound = math.inf if run.heartbeat_bound is None else run.heartbeat_bound  # inf: the nodes keep the run
        self.cut_off = cut_off_since(list(self.sessions.values()), was, now, run.silence_timeout)
        if was is None and self.cut_off is not None:
            since = time.time() - (now - self.cut_off)
            log.info("no node can be reached for %.0f s: cut off (this machine's network?)", now - self.cut_off)
            self.on_event(CutOff("", time.time(), since, None if math.isinf(bound) else since + bound))
        return run.silence_timeout if self.cut_off is None else bound

    def _look_at(self, session: Session, now: float, outage_bound: float, over: bool) -> None:
        """A message the channel could not take before; a node out of reach now (`reach.out_of_reach`), ended so: one
        lost since its loss (the root cause, not a node that missed a stop)."""
        if session.pending_message is not None and session.channel.send(session.pending_message, block=False):
            session.pending_message = None
        run = self.settings.run
        limit = silence_limit(session, run.silence_timeout, run.probe_timeout)
        end = out_of_reach(session, now, limit, outage_bound, self.stop_deadline, over)
        if end is None:
            return
        at = time.time() if session.outage is None else time.time() - (now - session.outage)
        if session.outage is not None and session.reconnect_error is not None:
            lost_for = now - session.outage
            session.messages.append(f"could not reconnect within {lost_for:.0f} s: {session.reconnect_error}")
        log.info("%s: out of reach (%s, %.0f s; %s)", session.name, end.kind, end.silent_for, session.reconnect_error)
        self._take(Ended(session.name, at, replace(end, time=at)))

    def _take(self, event: NodeEvent) -> None:
        session = self.sessions[event.node]
        if isinstance(event, Ended):
            if session.end is not None:
                return
            session.end = replace(event.end, errors=tuple(session.messages))
            event = self._ended(session, replace(event, end=session.end))
        elif isinstance(event, Started):
            session.started = True
        elif isinstance(event, Stopping):
            session.stop_reason = event.reason
        elif isinstance(event, Message):
            session.messages.append(event.text)
        elif isinstance(event, Beat):
            self.spares.observe(time.monotonic(), event.node, event.progress)
            if self.hangs is not None:
                self.hangs.observe(time.monotonic(), time.time(), event.node, event.progress)
            self.losses.observe(event.node, event.progress, self.on_event, self.stop)
        elif isinstance(event, Position):
            self.returns.position(event)
            return
        elif isinstance(event, Reattached):
            session.started = True
            self.returns.reattached(event, session.attach_lines)
        elif self.hangs is not None and self.hangs.takes(event):
            return  # a node's answer to a hang's look (its stacks, its dumps): the look says it
        self.on_event(event)

    def _ended(self, session: Session, event: Ended) -> NodeEvent:
        """A node's end: sweep after its agent where it died, then what `after_node_end` decides: nothing, go on
        without it, stop the others, fail the start."""
        end = session.end
        assert end is not None
        if end.kind in SWEPT and session.name in self.nodes:
            self.sweeps.after(session)
        elif end.kind == EndKind.UNANSWERED:
            self.sweeps.unswept[session.name] = "it did not confirm the stop in time"
        remaining = sum(1 for s in list(self.sessions.values()) if s.end is None)
        decision = after_node_end(
            end,
            asked_to_stop=session.asked_to_stop,
            started=session.started,
            remaining=remaining,
            needs=self.needs,
            start_failed=self.start_failure is not None,
            said=session.messages,
        )
        log.info(
            "%s ended (%s, exit code %s, stop reason %s): %s",
            session.name,
            end.kind,
            end.exit_code,
            end.stop_reason,
            decision or "nothing follows",
        )
        if isinstance(decision, GoOnWithout):
            self.on_event(event)  # an elastic group re-forms without the node: the others go on
            return Left(event.node, event.time, end, decision.remaining)
        if isinstance(decision, StopRun):
            self.stop(why=f"{decision.node} failed: the others are stopped (fail fast)")
        elif isinstance(decision, FailStart):
            self._fail_start(decision.why)
        return event

    def unswept_lines(self, source: str) -> list[str]:
        """For each node whose part could not be stopped over a new channel: what to run."""
        return self.sweeps.lines(source)

    def stop(self, kill: bool = False, why: str = "asked") -> None:
        """Ask every node still running to stop (TERM, grace, KILL; `kill` skips the grace); `why`, for the trace."""
        message = message_line(f"{STOPPED_BY} {stopped_by(why)}") + message_line(KILL if kill else STOP)  # one send
        going = [s.name for s in list(self.sessions.values()) if s.end is None]
        self.on_stopping(going, why)
        for session in list(self.sessions.values()):
            if session.end is None and (kill or not session.asked_to_stop):
                session.asked_to_stop, session.stop_message = True, message
                if not session.channel.send(message, block=False):
                    session.pending_message = message  # the channel could not take it now: sent again at the next step
        grace = 0.0 if kill else self.plan.settings.run.grace
        deadline = time.monotonic() + grace + STOP_MARGIN
        self.stop_deadline = min(self.stop_deadline or deadline, deadline)
        log.info("%s sent to %s", "kill" if kill else f"stop (grace {grace:g} s)", ", ".join(going) or "no node")
        if self.state in (RunState.STARTING, RunState.RUNNING):
            self._enter(RunState.STOPPING, why)

    def wait(self, timeout: float | None = None) -> list[NodeEnd] | None:
        """Every node's end, in plan order, once all ended (None if `timeout` passed first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(s.end is None for s in self.sessions.values()) or self.sweeps.under_way():
            if deadline is not None and time.monotonic() > deadline:
                return None
            self.step(0.2)
        self.sweeps.settle()
        self._tally()
        self._enter(RunState.ENDED, "every node's part ended")
        return [end for c in self.plan.nodes if (end := self._end_of(c.host.name)) is not None]

    def _enter(self, state: RunState, why: str) -> None:
        """The run's state moves (one place, so that the trace says every move and why)."""
        log.info("run %s: %s -> %s (%s)", self.plan.run_id, self.state, state, why)
        self.state = state

    def _tally(self) -> None:
        """The trace's count of what is too frequent to trace one by one: heartbeats sent, beats heard."""
        beats = {s.name: s.beats for s in list(self.sessions.values())}
        log.debug("heartbeats sent: %d; beats heard: %s", self.link.heartbeats, beats)
        self._tallied = time.monotonic()

    def _end_of(self, name: str) -> NodeEnd | None:
        session = self.sessions.get(name)
        return None if session is None else session.end

    def close(self) -> None:
        """Stop heartbeats and close the channels: a run that did not end goes on on its nodes (`attach` takes it)."""
        self.link.close()
