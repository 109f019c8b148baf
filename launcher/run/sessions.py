"""Every node agent's session of one attached run: opened all at once, each read by a thread of its own into typed
events, and each kept sure that the launcher lives (heartbeats).

A session is a channel of the node's SSH connection by default, or whatever a `SessionOpener` gives (a task of one
srun step: `launcher/slurm/step.py`). Output goes straight to `on_event` from the reader threads, so consumers must
not block; every other event goes to `control`, where the run's handle takes them one at a time and decides.
"""

from __future__ import annotations

import base64
import json
import queue
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from launcher.events import (
    Beat,
    Ended,
    EndKind,
    Message,
    NcclDumps,
    NodeEnd,
    NodeEvent,
    Output,
    Probed,
    Reached,
    Ready,
    StacksTaken,
    Started,
    Stopping,
)
from launcher.limits import heartbeat_interval
from launcher.node.protocol import HEARTBEAT, KILL, STOP, Event, word_line
from launcher.plan.launch import NodeCommand
from launcher.transport.program import host_command, program_input
from launcher.transport.sessions import Node, classify
from launcher.transport.settings import DEFAULT_FANOUT


class SessionChannel(Protocol):
    """A node agent's session as the controller uses it (`transport.Channel` over SSH)."""

    def send(self, data: bytes, block: bool = True) -> bool: ...
    def read(self) -> tuple[bytes, bytes]: ...
    def wait_readable(self, timeout: float) -> None: ...
    @property
    def finished(self) -> bool: ...
    @property
    def drained(self) -> bool: ...
    def exit_code(self) -> int: ...
    def close(self) -> None: ...


SessionOpener = Callable[[str, Sequence[tuple[NodeCommand, dict[str, Any]]]], list["SessionChannel | str"]]
"""Starts every node's agent session at once from the node program's source and each node's request; a channel or
an error per node, in order. The default opens a channel on each node's SSH connection."""


@dataclass
class Session:
    """One node's agent, as the controller sees it."""

    command: NodeCommand
    channel: SessionChannel
    heard: float = field(default_factory=time.monotonic)
    opened: float = field(default_factory=time.monotonic)
    """When its request was sent: a probe's time counts from here."""
    checked: dict[str, Any] = field(default_factory=dict)
    """What the agent said for the start's checks, by event name: `probed` (probe, listener, at), `tcp`."""
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
    parts: dict[str, list[str]] = field(default_factory=dict)
    """The parts of a large event received so far, by the event's name."""

    @property
    def name(self) -> str:
        return self.command.host.name


class Sessions:
    """The run's sessions by node name, the queue their events go to, and the heartbeat thread."""

    def __init__(self, nodes: Mapping[str, Node], requests: Mapping[str, dict[str, Any]], agent_source: str,
                 on_event: Callable[[NodeEvent], None], heartbeat_timeout: float):
        self.nodes, self.requests, self.agent_source = nodes, requests, agent_source
        self.on_event = on_event
        self.by_name: dict[str, Session] = {}
        self.control: queue.Queue[NodeEvent] = queue.Queue()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._interval = heartbeat_interval(heartbeat_timeout)
        self._heartbeat = threading.Thread(target=self._beat, daemon=True, name="heartbeat")

    def open(self, commands: Sequence[NodeCommand], opener: SessionOpener | None) -> list[str | None]:
        """Every node's session at once (heartbeats flow from the first); an error or None per command, in order."""
        self._heartbeat.start()
        if opener is not None:
            return self._open_with(opener, commands)
        with ThreadPoolExecutor(max_workers=min(DEFAULT_FANOUT, len(commands))) as pool:
            return list(pool.map(self._open_one, commands))  # every session open before any stop is sent

    def _open_one(self, command: NodeCommand) -> str | None:
        node = self.nodes[command.host.name]
        try:
            channel = node.open_channel(host_command(command.host))
        except Exception as exc:  # a closed connection, a session or command the node's sshd never started
            return classify(node.target, exc).detail
        # The program first, then the session is seen: once registered, other threads send it words (a heartbeat, the
        # stop when another node's start failed), and a word before the program is read as the program (the node's
        # python: "zlib.error: incorrect header check"; a healthy master named broken). One told nothing yet is told
        # by the gate's abort or the stop that follows the opening.
        channel.send(program_input(self.agent_source, self.requests[command.host.name]))
        self._register(command, channel)
        return None

    def _open_with(self, opener: SessionOpener, commands: Sequence[NodeCommand]) -> list[str | None]:
        """Every session through `opener` at once (an srun step starts all its tasks together)."""
        requests = [(c, self.requests[c.host.name]) for c in commands]
        try:
            opened = opener(self.agent_source, requests)
        except Exception as exc:
            return [str(exc)] * len(requests)
        errors: list[str | None] = []
        for command, channel in zip(commands, opened, strict=True):
            if isinstance(channel, str):
                errors.append(channel)
            else:
                self._register(command, channel)
                errors.append(None)
        return errors

    def _register(self, command: NodeCommand, channel: SessionChannel) -> Session:
        """Track a node's open session and start reading it."""
        session = Session(command, channel)
        with self._lock:
            self.by_name[session.name] = session
        threading.Thread(target=self._read, args=(session,), daemon=True, name=f"read-{session.name}").start()
        return session

    def close(self) -> None:
        """Stop heartbeats and close the channels (an attached node then stops what is left by itself)."""
        self._closing.set()
        for session in self.by_name.values():
            session.channel.close()

    # --- the node's channel -> events ---------------------------------------------------------------------

    def _read(self, session: Session) -> None:
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
            if channel.drained:
                self._end(session, EndKind.LOST)
                return
            if not out and not err:
                channel.wait_readable(0.5)

    def _agent_line(self, session: Session, line: bytes) -> None:
        try:
            event = json.loads(line)
            name = event["event"]
        except (ValueError, KeyError, TypeError):
            text = line.decode("utf-8", errors="replace").strip()
            if text:
                self.control.put(Message(session.name, time.time(), text))
            return
        if name == Event.PART:
            event = self._part(session, event)
            if event is None:
                return
            name = event.get("event")
        handler = HANDLERS.get(name) if isinstance(name, str) else None  # a name outside the vocabulary: nothing
        if handler is not None:
            handler(self, session, event, time.time())

    # One handler per event name the controller acts on (launcher.node.protocol.Event); IGNORED says why the others
    # are not. Output goes to `on_event` from the reader; everything else to `control`, for the run's handle.

    def _ready(self, session: Session, event: dict[str, Any], now: float) -> None:
        session.ready = True
        self.control.put(Ready(session.name, now))

    def _probed(self, session: Session, event: dict[str, Any], now: float) -> None:
        session.checked[Event.PROBED] = {"probe": event.get("probe"), "listener": event.get("listener"),
                                         "at": time.monotonic()}
        self.control.put(Probed(session.name, now))

    def _tcp(self, session: Session, event: dict[str, Any], now: float) -> None:
        session.checked[Event.TCP] = event.get("tcp")
        self.control.put(Reached(session.name, now))

    def _started(self, session: Session, event: dict[str, Any], now: float) -> None:
        session.started = True  # here too: the channel's end may be judged before the waiter sees this
        if event.get("detached"):
            session.reported = {"code": 0}  # a detached agent's work ends with the start
        self.control.put(Started(session.name, now, int(event.get("pid", 0)), event.get("time")))

    def _error(self, session: Session, event: dict[str, Any], now: float) -> None:
        self.control.put(Message(session.name, now, str(event.get("message", "unknown error"))))

    def _stopping(self, session: Session, event: dict[str, Any], now: float) -> None:
        self.control.put(Stopping(session.name, now, str(event.get("reason", STOP))))

    def _exited(self, session: Session, event: dict[str, Any], now: float) -> None:
        session.reported = event  # the node's end is decided when its channel ends (`_channel_ended`)

    def _alive(self, session: Session, event: dict[str, Any], now: float) -> None:
        if event.get("progress") is not None:  # else only a heartbeat: `heard` was set when it was read
            self.control.put(Beat(session.name, now, tuple(event["progress"])))

    def _stacks(self, session: Session, event: dict[str, Any], now: float) -> None:
        self.control.put(StacksTaken(session.name, now, tuple(event.get("workers") or ()),
                                     dict(event.get("nccl") or {})))

    def _nccl(self, session: Session, event: dict[str, Any], now: float) -> None:
        self.control.put(NcclDumps(session.name, now, dict(event.get("nccl") or {}),
                                   tuple(int(r) for r in event.get("asked") or ())))

    def _part(self, session: Session, part: dict[str, Any]) -> dict[str, Any] | None:
        """Collect one part of a large event (launcher.node.protocol.emit_parts); the whole event once all came."""
        key = str(part.get("of"))
        pieces = session.parts.setdefault(key, [])
        pieces.append(str(part.get("data", "")))
        if len(pieces) < int(part.get("count", 1)):
            return None
        del session.parts[key]
        try:
            fields = json.loads(zlib.decompress(base64.b64decode("".join(pieces))))
        except (ValueError, zlib.error):
            return {"event": Event.ERROR, "message": f"the {key} event came damaged"}
        return {**fields, "event": key}

    def _channel_ended(self, session: Session, status: int) -> None:
        if session.reported is not None:
            reason = session.reported.get("reason")
            # Whether the launcher's stop ended this node is the agent's word: a stop that came after torchrun had
            # already failed on its own (a race with a peer's collateral failure) does not hide a root cause.
            self._end(session, EndKind.EXITED, int(session.reported.get("code", status)),
                      None if reason in (None, STOP, KILL) else str(reason),
                      left=int(session.reported.get("left", 0)), asked_to_stop=reason in (STOP, KILL),
                      before_workers=reason is None and session.reported.get("workers") is False)
        elif not session.started:
            self._end(session, EndKind.START_ERROR, status)
        else:
            self._end(session, EndKind.AGENT_DIED, status)

    def _end(self, session: Session, kind: EndKind, code: int | None = None, reason: str | None = None,
             left: int = 0, asked_to_stop: bool | None = None, before_workers: bool = False) -> None:
        asked = session.asked_to_stop if asked_to_stop is None else asked_to_stop
        end = NodeEnd(session.name, kind, time.time(), code, reason or session.stop_reason, asked, left=left,
                      before_workers=before_workers)
        self.control.put(Ended(session.name, end.time, end, (session.reported or {}).get("time")))

    # --- heartbeats ------------------------------------------------------------------------------------------

    def _beat(self) -> None:
        while not self._closing.wait(self._interval):
            for session in list(self.by_name.values()):
                if session.end is None:
                    session.channel.send(word_line(HEARTBEAT), block=False)  # never waits on a silent node


Handler = Callable[[Sessions, Session, dict[str, Any], float], None]
HANDLERS: dict[str, Handler] = {
    Event.READY: Sessions._ready, Event.PROBED: Sessions._probed, Event.TCP: Sessions._tcp,
    Event.STARTED: Sessions._started, Event.ERROR: Sessions._error, Event.STOPPING: Sessions._stopping,
    Event.EXITED: Sessions._exited, Event.ALIVE: Sessions._alive, Event.STACKS: Sessions._stacks,
    Event.NCCL: Sessions._nccl,
}
"""What the controller does with each event name a node's agent session says (`part`s are put together first)."""
IGNORED = {
    Event.ABORTED: "the start was dropped: the launcher's own `abort` or stop, or it was gone; the session's end "
                   "(start-error) follows",
    Event.STOPPED: "`exited` follows with the same fields (left, reason), and the node's end is decided on that",
    Event.RUN: "only the logs action says it, and that action's stdout is the log (launcher.run.control)",
}
"""Event names a session may say that the controller deliberately does nothing with, and why."""
