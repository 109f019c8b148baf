"""One attached run across nodes, shaped like torch elastic's `PContext`: `start`, `wait`, `stop(grace)`, `close`.

Each node's agent (`launcher/agent.py`) runs on a channel: by default one of that node's SSH connection, or whatever
a `SessionOpener` gives (a task of one srun step: `launcher/slurm/step.py`). A reader thread per node
turns its channel into typed events; a heartbeat thread keeps every node's agent sure the launcher is alive; the
waiting thread decides (fail fast, silence, stop deadlines). Output goes to `on_event` from the reader threads, so
consumers must not block: nothing here ever waits on a console or a disk.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from launcher.config.model import Cluster, Host
from launcher.node.protocol import ABORT, GO, HEARTBEAT, KILL, STOP, TCP, word_line
from launcher.options import DEFAULT_FANOUT, Options, heartbeat_interval
from launcher.plan.commands import LaunchPlan, NodeCommand
from launcher.report.rootcause import NodeEnd
from launcher.transport.program import host_command, program_input
from launcher.transport.sessions import Node, classify

STALL = 2.0
"""A gap this long between two of the waiter's steps means the launcher itself was frozen, not its nodes."""
STOP_MARGIN = 5.0
"""Seconds beyond the grace period that a node gets to confirm a stop before the launcher gives up on it."""
SWEEP_MARGIN = 3.0
"""Seconds beyond the grace period the launcher waits for a sweep over a new channel (a node whose sshd answers
needs about one: a session, the agent's start, a look at /proc); one whose sshd does not is reported instead."""
SWEPT = ("agent-died", "silent")
"""Ends after which the node's part may live on without its agent: the launcher stops it over a new channel. (A
node that did not confirm a stop in time is not waited for again: Ctrl-C returns within grace + STOP_MARGIN.)"""


@dataclass(frozen=True)
class NodeEvent:
    """Something that happened on one node of a run."""

    node: str
    time: float


@dataclass(frozen=True)
class Ready(NodeEvent):
    """The node's agent checked what it could and waits for `go` (sent once every node is ready)."""


@dataclass(frozen=True)
class Probed(NodeEvent):
    """The node's agent ran the doctor's probe in its start session (a launch with the doctor on)."""


@dataclass(frozen=True)
class Reached(NodeEvent):
    """The node's agent tried to reach the master's listener (the doctor's TCP check) and said what it found."""


@dataclass(frozen=True)
class NodeFacts:
    """What one node's agent session said for the start's checks, for a `StartGate` to judge."""

    probe: dict[str, Any] | None = None
    """The probe's answer (its `probed` event)."""
    listener: dict[str, Any] | None = None
    """The master's: whether it could bind master_port (and who holds it if not)."""
    tcp: dict[str, Any] | None = None
    """Its connection to the master's listener (its `tcp` event)."""
    took: float | None = None
    """Seconds from sending the session's request to the probe's answer (or to giving up on it)."""
    exit_code: int | None = None
    """The session ended before the probe answered, with this code (125: a setup line failed)."""
    messages: tuple[str, ...] = ()
    """What the node's shell or agent said before that end."""
    timed_out: bool = False
    """No answer within the gate's `probe_timeout`."""
    failure: str | None = None
    """The session could not be opened."""


@runtime_checkable
class StartGate(Protocol):
    """Checks that every node's agent runs in its start session before `go` (the doctor's: `SessionPreflight`)."""

    probe_timeout: float

    def prepare(self, cluster: Cluster, nodes: dict[str, Node]) -> None:
        """Work on the open connections before any session opens (`launch --sync`)."""

    def node_section(self, cluster: Cluster, host: Host, run_id: str) -> dict[str, Any]:
        """The start request's `preflight` part for this host."""

    def judge(self, cluster: Cluster, facts: Mapping[str, NodeFacts], clock: tuple[float, float],
              seconds: float) -> Any:
        """Raise a LauncherError when nothing may start; return otherwise."""


class SessionChannel(Protocol):
    """A node agent's session as the controller uses it (`transport.Channel` over SSH)."""

    def send(self, data: bytes, block: bool = True) -> bool: ...
    def read(self) -> tuple[bytes, bytes]: ...
    def wait_readable(self, timeout: float) -> None: ...
    @property
    def finished(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def exit_code(self) -> int: ...
    def close(self) -> None: ...


SessionOpener = Callable[[str, Sequence[tuple[NodeCommand, dict[str, Any]]]], list["SessionChannel | str"]]
"""Starts every node's agent session at once from the node program's source and each node's request; a channel or
an error per node, in order. The default opens a channel on each node's SSH connection."""


@dataclass(frozen=True)
class Started(NodeEvent):
    pid: int
    node_time: float | None = None
    """When the agent said so, by the node's clock."""


@dataclass(frozen=True)
class Output(NodeEvent):
    data: bytes


@dataclass(frozen=True)
class Stopping(NodeEvent):
    reason: str


@dataclass(frozen=True)
class Message(NodeEvent):
    """An error from the agent, or words of the node's shell (`python3: command not found`)."""

    text: str


@dataclass(frozen=True)
class Left(NodeEvent):
    """A node of an elastic (c10d) run failed and the others go on without it: at least MIN nodes remain."""

    end: NodeEnd
    remaining: int
    """Nodes still running."""


@dataclass(frozen=True)
class Ended(NodeEvent):
    """The node's part is over, one way or another (see `NodeEnd.kind`)."""

    end: NodeEnd
    node_time: float | None = None
    """When the agent reported the exit, by the node's clock (None when it could not)."""


@dataclass
class _Session:
    """One node's agent, as the controller sees it."""

    command: NodeCommand
    channel: SessionChannel
    heard: float = field(default_factory=time.monotonic)
    opened: float = field(default_factory=time.monotonic)
    """When its request was sent: a probe's time counts from here."""
    checked: dict[str, Any] = field(default_factory=dict)
    """What the agent said for the start's checks: `probed` (probe, listener, at), `tcp`."""
    ready: bool = False
    started: bool = False
    pending_word: bytes | None = None
    """A stop word the channel could not take yet."""
    stop_reason: str | None = None
    asked_to_stop: bool = False
    messages: list[str] = field(default_factory=list)
    end: NodeEnd | None = None
    reported: dict[str, Any] | None = None
    """The agent's `exited` event, once it came."""

    @property
    def name(self) -> str:
        return self.command.host.name


class RunHandle:
    """The controller side of one run: its sessions, heartbeats, and the decisions taken while waiting."""

    def __init__(self, plan: LaunchPlan, opts: Options, nodes: dict[str, Node], requests: dict[str, dict[str, Any]],
                 agent_source: str, on_event: Callable[[NodeEvent], None], opener: SessionOpener | None = None):
        self.plan, self.opts, self.nodes = plan, opts, nodes
        self.opener = opener
        self.requests = requests
        self.agent_source = agent_source
        self.on_event = on_event
        self.sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._control: queue.Queue[NodeEvent] = queue.Queue()
        self._closing = threading.Event()
        self._cleanups: list[tuple[threading.Thread, float, str]] = []
        """Sweeps after dead agents, each with the moment the launcher stops waiting for it."""
        self.unswept: dict[str, str] = {}
        """Nodes whose sweep failed, and why: their part may still run."""
        self.start_failure: str | None = None
        low, _ = plan.cluster.rendezvous.elastic.nodes_range(len(plan.nodes))
        self.min_nodes = low if plan.cluster.rendezvous.elastic.backend == "c10d" else len(plan.nodes) + 1
        """While this many nodes still run, a failed node does not stop the others (c10d); static: never."""
        self._stop_deadline: float | None = None
        self._last_step = time.monotonic()
        self._heartbeat = threading.Thread(target=self._beat, daemon=True, name="heartbeat")

    # --- start ----------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Open every node's agent session at once (heartbeats flow from the first) and wait until all started.

        Any node that cannot start makes the others stop what they started: a run starts everywhere or nowhere.
        With a `StartGate` (the doctor's checks) each agent probes first, in the same session; the gate's verdict
        comes before `go`, and when it raises, every agent is told `abort` and nothing starts anywhere.
        """
        began = time.monotonic()
        self._heartbeat.start()
        if self.opener is None:
            with ThreadPoolExecutor(max_workers=min(DEFAULT_FANOUT, len(self.plan.nodes))) as pool:
                errors = list(pool.map(self._open, self.plan.nodes))  # every session open before any stop is sent
        else:
            errors = self._open_all(self.opener)
        for command, error in zip(self.plan.nodes, errors, strict=True):
            if error is not None:
                self._fail_start(f"{command.host.name}: cannot open a session: {error}")
        gate = self.opts.preflight if isinstance(self.opts.preflight, StartGate) else None
        if gate is not None:
            self._check(gate, {c.host.name: e for c, e in zip(self.plan.nodes, errors, strict=True) if e}, began)
        # Each agent checks what it can, says `ready` and waits: `go` only once every node is ready.
        while self.start_failure is None and not all(s.ready or s.end for s in self.sessions.values()):
            self._step(0.2)
        if self.start_failure is None:
            for session in self.sessions.values():
                session.channel.send(word_line(GO))
        while self.start_failure is None and not all(s.started or s.end for s in self.sessions.values()):
            self._step(0.2)

    def _check(self, gate: StartGate, unopened: dict[str, str], began: float) -> None:
        """The gate's checks inside the agents' sessions: gather every probe, then the TCP round, then the verdict.

        Round one: each agent's `probed` event (the master's says whether master_port was free, and holds it). A
        node whose probe has not answered within the gate's probe_timeout, or whose session ended first, is judged
        on that. Round two, when the master holds the port: `tcp` to every node that probed, each answers `tcp`.
        """
        sent = time.time()
        while True:
            now = time.monotonic()
            waiting = [s for s in self.sessions.values() if "probed" not in s.checked and s.end is None
                       and now - s.opened < gate.probe_timeout]
            if not waiting:
                break
            self._step(min(0.2, max(0.0, min(s.opened + gate.probe_timeout for s in waiting) - now)))
        master = self.sessions.get(self.plan.cluster.hosts[0].name)
        listener = master.checked.get("probed", {}).get("listener") if master is not None else None
        if listener and listener.get("free") and self.start_failure is None:  # else no run can start anyway
            asked = [s for s in self.sessions.values() if "probed" in s.checked and s.end is None]
            for session in asked:
                session.channel.send(word_line(TCP))
            until = time.monotonic() + gate.probe_timeout
            while any("tcp" not in s.checked and s.end is None for s in asked) and time.monotonic() < until:
                self._step(0.2)
            for session in asked:
                if session.end is None:
                    session.checked.setdefault("tcp", {"ok": False, "error": f"no answer to the TCP check within "
                                                                              f"{gate.probe_timeout:g} s"})
        facts = {name: self._facts(name, unopened) for name in (c.host.name for c in self.plan.nodes)}
        try:
            gate.judge(self.plan.cluster, facts, (sent, time.time()), time.monotonic() - began)
        except Exception:
            self._abort_start()
            raise

    def _facts(self, name: str, unopened: dict[str, str]) -> NodeFacts:
        """What one node's session said for the checks (a probe past its limit counts as not answering)."""
        session = self.sessions.get(name)
        if session is None:
            return NodeFacts(failure=unopened.get(name, "no session was opened"))
        probed = session.checked.get("probed")
        if probed is not None:
            return NodeFacts(probe=probed["probe"], listener=probed["listener"], tcp=session.checked.get("tcp"),
                             took=round(probed["at"] - session.opened, 3))
        end = session.end
        if end is None or end.kind == "silent":  # no answer in time (the silence limit is never shorter)
            return NodeFacts(took=round(time.monotonic() - session.opened, 3), timed_out=True)
        return NodeFacts(exit_code=end.exit_code, messages=tuple(session.messages))

    def _abort_start(self) -> None:
        """The checks failed: `abort` to every agent; wait for those that answer (none has made anything)."""
        for session in self.sessions.values():
            if session.end is None:
                session.asked_to_stop = True
                if not session.channel.send(word_line(ABORT), block=False):
                    session.pending_word = word_line(ABORT)  # sent again at the next step
        self._stop_deadline = time.monotonic() + STOP_MARGIN
        # An agent that never probed (a python that hangs) gets `abort` or the channel's end whenever it starts.
        while any(s.end is None and "probed" in s.checked for s in self.sessions.values()):
            self._step(0.2)

    def _open(self, command: NodeCommand) -> str | None:
        node = self.nodes[command.host.name]
        try:
            channel = node.open_channel(host_command(command.host))
        except Exception as exc:  # a closed connection, a session or command the node's sshd never started
            return classify(node.target, exc).detail
        session = self._register(command, channel)
        channel.send(program_input(self.agent_source, self.requests[session.name]))
        return None

    def _open_all(self, opener: SessionOpener) -> list[str | None]:
        """Every session through `opener` at once (an srun step starts all its tasks together)."""
        requests = [(c, self.requests[c.host.name]) for c in self.plan.nodes]
        try:
            opened = opener(self.agent_source, requests)
        except Exception as exc:
            return [str(exc)] * len(requests)
        errors: list[str | None] = []
        for command, channel in zip(self.plan.nodes, opened, strict=True):
            if isinstance(channel, str):
                errors.append(channel)
            else:
                self._register(command, channel)
                errors.append(None)
        return errors

    def _register(self, command: NodeCommand, channel: SessionChannel) -> _Session:
        """Track a node's open session and start reading it."""
        session = _Session(command, channel)
        with self._lock:
            self.sessions[session.name] = session
        threading.Thread(target=self._read, args=(session,), daemon=True, name=f"read-{session.name}").start()
        return session

    def abort(self, reason: str) -> None:
        """Give up starting: stop what has started (a run starts everywhere or nowhere)."""
        self._fail_start(reason)

    def _fail_start(self, reason: str) -> None:
        if self.start_failure is None:
            self.start_failure = reason
            self.stop()

    @property
    def started(self) -> list[str]:
        return [s.name for s in self.sessions.values() if s.started]

    # --- the node's channel -> events ---------------------------------------------------------------------

    def _read(self, session: _Session) -> None:
        channel, name = session.channel, session.name
        err_rest = b""
        while True:
            out, err = channel.read()
            if out or err:
                session.heard = time.monotonic()
            if out:
                self.on_event(Output(name, time.time(), out))
            if err:
                *lines, err_rest = (err_rest + err).split(b"\n")
                for line in lines:
                    self._agent_line(session, line)
            if channel.finished:
                self._channel_ended(session, channel.exit_code())
                return
            if channel.closed and not out and not err:
                self._end(session, "lost")
                return
            if not out and not err:
                channel.wait_readable(0.5)

    def _agent_line(self, session: _Session, line: bytes) -> None:
        try:
            event = json.loads(line)
            kind = event["event"]
        except (ValueError, KeyError, TypeError):
            text = line.decode("utf-8", errors="replace").strip()
            if text:
                self._control.put(Message(session.name, time.time(), text))
            return
        now = time.time()
        if kind == "ready":
            session.ready = True
            self._control.put(Ready(session.name, now))
        elif kind == "probed":
            session.checked["probed"] = {"probe": event.get("probe"), "listener": event.get("listener"),
                                         "at": time.monotonic()}
            self._control.put(Probed(session.name, now))
        elif kind == "tcp":
            session.checked["tcp"] = event.get("tcp")
            self._control.put(Reached(session.name, now))
        elif kind == "started":
            session.started = True  # here too: the channel's end may be judged before the waiter sees this
            if event.get("detached"):
                session.reported = {"code": 0}  # a detached agent's work ends with the start
            self._control.put(Started(session.name, now, int(event.get("pid", 0)), event.get("time")))
        elif kind == "error":
            self._control.put(Message(session.name, now, str(event.get("message", "unknown error"))))
        elif kind == "stopping":
            self._control.put(Stopping(session.name, now, str(event.get("reason", "stop"))))
        elif kind == "exited":
            session.reported = event

    def _channel_ended(self, session: _Session, status: int) -> None:
        if session.reported is not None:
            reason = session.reported.get("reason")
            # Whether the launcher's stop ended this node is the agent's word: a stop that came after torchrun had
            # already failed on its own (a race with a peer's collateral failure) does not hide a root cause.
            self._end(session, "exited", int(session.reported.get("code", status)),
                      None if reason in (None, STOP, KILL) else str(reason),
                      left=int(session.reported.get("left", 0)), asked_to_stop=reason in (STOP, KILL))
        elif not session.started:
            self._end(session, "start-error", status)
        else:
            self._end(session, "agent-died", status)

    def _end(self, session: _Session, kind: str, code: int | None = None, reason: str | None = None,
             left: int = 0, asked_to_stop: bool | None = None) -> None:
        asked = session.asked_to_stop if asked_to_stop is None else asked_to_stop
        end = NodeEnd(session.name, kind, time.time(), code, reason or session.stop_reason, asked, left=left)
        self._control.put(Ended(session.name, end.time, end, (session.reported or {}).get("time")))

    # --- heartbeats ------------------------------------------------------------------------------------------

    def _beat(self) -> None:
        interval = heartbeat_interval(self.opts.heartbeat_timeout)
        while not self._closing.wait(interval):
            for session in list(self.sessions.values()):
                if session.end is None:
                    session.channel.send(word_line(HEARTBEAT), block=False)  # never waits on a silent node

    # --- waiting and deciding --------------------------------------------------------------------------------

    def _step(self, timeout: float) -> None:
        """Take one event (or time out), then look at the clock: silent nodes, stop deadlines."""
        try:
            event = self._control.get(timeout=timeout)
        except queue.Empty:
            event = None
        if event is not None:
            self._take(event)
        now = time.monotonic()
        if now - self._last_step > STALL:
            # The launcher itself was frozen (SIGSTOP, a suspended laptop): what it did not read is no node's silence.
            for session in list(self.sessions.values()):
                session.heard = max(session.heard, now)
        self._last_step = now
        for session in list(self.sessions.values()):
            if session.end is not None:
                continue
            if session.pending_word is not None and session.channel.send(session.pending_word, block=False):
                session.pending_word = None
            silent = now - session.heard
            # Before its agent is ready a node may be starting its python from a cold network filesystem.
            limit = self.opts.silence_timeout if session.ready else max(self.opts.silence_timeout,
                                                                        self.opts.probe_timeout)
            if silent > limit:
                self._take(Ended(session.name, time.time(), NodeEnd(
                    session.name, "silent", time.time(), asked_to_stop=session.asked_to_stop, silent_for=silent)))
            elif self._stop_deadline is not None and now > self._stop_deadline:
                self._take(Ended(session.name, time.time(), NodeEnd(
                    session.name, "unanswered", time.time(), asked_to_stop=True)))

    def _take(self, event: NodeEvent) -> None:
        session = self.sessions[event.node]
        if isinstance(event, Ended):
            if session.end is not None:
                return
            session.end = replace(event.end, errors=tuple(session.messages))
            event = replace(event, end=session.end)
            if session.end.kind in SWEPT and session.name in self.nodes:
                self._sweep_after_agent(session)
            elif session.end.kind == "unanswered":
                self.unswept[session.name] = "it did not confirm the stop in time"
            if session.end.failed and not session.asked_to_stop:
                remaining = sum(1 for s in self.sessions.values() if s.end is None)
                if session.started and remaining >= self.min_nodes and self.start_failure is None:
                    self.on_event(event)  # an elastic group re-forms without the node: the others go on
                    event = Left(event.node, event.time, session.end, remaining)
                elif session.started:
                    self.stop()
                else:
                    end = session.end
                    silent = f"stopped answering (nothing for {end.silent_for:.0f} s)"
                    exited = f"the agent exited with code {end.exit_code}"
                    why = "; ".join(session.messages) or (silent if end.kind == "silent" else exited)
                    self._fail_start(f"{session.name}: {why}")
        elif isinstance(event, Started):
            session.started = True
        elif isinstance(event, Stopping):
            session.stop_reason = event.reason
        elif isinstance(event, Message):
            session.messages.append(event.text)
        self.on_event(event)

    def _cleaning(self) -> bool:
        """A sweep after a dead agent is still under way, and within its limit (a node gone silent can't hold us)."""
        return any(thread.is_alive() and time.monotonic() < until for thread, until, _ in self._cleanups)

    def _sweep_after_agent(self, session: _Session) -> None:
        """The agent died (killed), went silent (stopped, stuck) or never confirmed a stop while torchrun may live
        on: stop the run on that node over a new channel, the silent agent too. When that fails as well, the node's
        part may still run: `unswept` says so, for the report."""
        node = self.nodes[session.name]
        request = {"action": "stop", "run_id": self.plan.run_id, "node": session.name, "grace": self.opts.grace,
                   "kill_keeper": session.end is not None and session.end.kind != "agent-died"}

        def sweep() -> None:
            try:
                result = node.run(host_command(session.command.host), program_input(self.agent_source, request),
                                  timeout=self.opts.action_timeout)
                why = (f"no answer within {result.timed_out:g} s" if result.timed_out is not None else
                       f"the stop exited with code {result.exit_code}" if result.exit_code != 0 else None)
            except Exception as exc:  # the connection is gone too: the node's own watchdogs are all that is left
                why = str(exc) or type(exc).__name__
            if why is not None:
                self.unswept[session.name] = why

        thread = threading.Thread(target=sweep, daemon=True, name=f"sweep-{session.name}")
        # TERM, grace, KILL on the node, and a margin: whenever its sshd answers, nothing of the run is left then.
        self._cleanups.append((thread, time.monotonic() + self.opts.grace + SWEEP_MARGIN, session.name))
        thread.start()

    def unswept_lines(self, source: str) -> list[str]:
        """For each node whose part could not be stopped over a new channel: what to run."""
        return [f"{name}: its part of the run may still be running (stopping it over a new connection failed: "
                f"{why}); run `inv stop --hosts {source} --run {self.plan.run_id}`"
                for name, why in sorted(self.unswept.items())]

    def stop(self, kill: bool = False) -> None:
        """Ask every node still running to stop (TERM, grace, KILL; `kill` skips the grace)."""
        word = word_line(KILL if kill else STOP)
        for session in list(self.sessions.values()):
            if session.end is None and (kill or not session.asked_to_stop):
                session.asked_to_stop = True
                if not session.channel.send(word, block=False):
                    session.pending_word = word  # the channel could not take it now: sent again at the next step
        grace = 0.0 if kill else self.opts.grace
        deadline = time.monotonic() + grace + STOP_MARGIN
        self._stop_deadline = min(self._stop_deadline or deadline, deadline)

    def wait(self, timeout: float | None = None) -> list[NodeEnd] | None:
        """Every node's end, in plan order, once all ended (None if `timeout` passed first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while any(s.end is None for s in self.sessions.values()) or self._cleaning():
            if deadline is not None and time.monotonic() > deadline:
                return None
            self._step(0.2)
        for thread, _, name in self._cleanups:
            if thread.is_alive():
                self.unswept.setdefault(name, f"no answer within {self.opts.grace + SWEEP_MARGIN:g} s")
        return [self.sessions[c.host.name].end for c in self.plan.nodes if c.host.name in self.sessions]  # type: ignore[misc]

    def close(self) -> None:
        """Stop heartbeats and close the channels (an attached node then stops what is left by itself)."""
        self._closing.set()
        for session in self.sessions.values():
            session.channel.close()
