"""What a node agent's session says on its event stream (one JSON line an event, launcher/node/wire.py's `Event`
names), turned into the typed events the run's handle decides on (launcher.events): one handler per name
(`HANDLERS`), and the names deliberately left alone (`IGNORED`). Output (the log's bytes) is not here: it goes from
the session's reader to the console directly."""

from __future__ import annotations

import base64
import json
import logging
import queue
import time
import zlib
from collections.abc import Callable
from typing import Any

from launcher.events import (
    Beat,
    Message,
    NcclDumps,
    NodeEvent,
    Position,
    Probed,
    Reached,
    Ready,
    Reattached,
    StacksTaken,
    Started,
    Stopping,
)
from launcher.node.wire import STOP, Event
from launcher.run.nodesession import Session

Control = queue.Queue[NodeEvent]
"""Where the handlers put what the run's handle decides on."""


def agent_line(control: Control, session: Session, line: bytes) -> None:
    """One line of the session's events: its typed event on `control`; a line that is not an event (the node's
    shell: `python3: command not found`) as a Message."""
    try:
        event = json.loads(line)
        name = event["event"]
    except (ValueError, KeyError, TypeError):
        text = line.decode("utf-8", errors="replace").strip()
        if text:
            control.put(Message(session.name, time.time(), text))
        return
    if name == Event.PART:
        event = _part(session, event)
        if event is None:
            return
        name = event.get("event")
    handler = HANDLERS.get(name) if isinstance(name, str) else None  # a name outside the vocabulary: nothing
    if name == Event.ALIVE:
        session.beats += 1  # counted: a beat every few seconds is too many to trace
    elif isinstance(name, str):
        log.debug("%s: %s %s", session.name, name, _traced(event))
    if handler is not None:
        handler(control, session, event, time.time())


log = logging.getLogger(__name__)
TRACED = ("reason", "code", "left", "workers", "error", "log_bytes", "by", "pid", "part")
"""An event's fields the trace says (its stacks, dumps and checks are too long to trace)."""


def _traced(event: dict[str, Any]) -> dict[str, Any]:
    return {key: event[key] for key in TRACED if key in event}


# One handler per event name the controller acts on (launcher.node.wire.Event); IGNORED says why the others
# are not. Output goes to `on_event` from the reader; everything else to `control`, for the run's handle.


def _ready(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    session.ready = True
    control.put(Ready(session.name, now))


def _probed(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    session.checked[Event.PROBED] = {
        "probe": event.get("probe"),
        "listener": event.get("listener"),
        "at": time.monotonic(),
    }
    control.put(Probed(session.name, now))


def _tcp(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    session.checked[Event.TCP] = event.get("tcp")
    control.put(Reached(session.name, now))


def _started(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    session.started = True  # here too: the channel's end may be judged before the waiter sees this
    if event.get("detached"):
        session.reported = {"code": 0}  # a detached agent's work ends with the start
    control.put(Started(session.name, now, int(event.get("pid", 0)), event.get("time")))


def _error(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    control.put(Message(session.name, now, str(event.get("message", "unknown error"))))


def _stopping(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    control.put(Stopping(session.name, now, str(event.get("reason", STOP))))


def _exited(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    session.reported = event  # the node's end is decided when its channel ends (Sessions._channel_ended)


def _attached(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    """A new session was taken by the node's run: it is the node's channel from now on, and a stop already asked
    for is said again there (the old session may have lost it)."""
    if session.following is not None:
        session.channel = session.following
    down = None if session.lost_at is None or not session.started else time.monotonic() - session.lost_at
    away = event.get("away_s")
    # The event first, then `started`: an attach that sees every node started has every node's event queued.
    control.put(
        Reattached(
            session.name,
            now,
            down,
            int(event.get("log_bytes") or 0),
            bool(event.get("replay")),
            None if away is None else float(away),
        )
    )
    session.started, session.attaching, session.outage, session.lost_at = True, False, None, None
    session.heard = time.monotonic()
    if session.asked_to_stop and session.stop_message is not None:
        session.pending_message = session.stop_message


def _taken(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    session.taken = {"by": event.get("by"), "at": event.get("at")}


def _position(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    control.put(Position(session.name, now, int(event.get("log_bytes") or 0)))


def _alive(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    if event.get("progress") is not None:  # else only a heartbeat: `heard` was set when it was read
        control.put(Beat(session.name, now, tuple(event["progress"])))


def _stacks(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    control.put(StacksTaken(session.name, now, tuple(event.get("workers") or ()), dict(event.get("nccl") or {})))


def _nccl(control: Control, session: Session, event: dict[str, Any], now: float) -> None:
    control.put(
        NcclDumps(session.name, now, dict(event.get("nccl") or {}), tuple(int(r) for r in event.get("asked") or ()))
    )


def _part(session: Session, part: dict[str, Any]) -> dict[str, Any] | None:
    """Collect one part of a large event (launcher.node.wire.emit_parts); the whole event once all came."""
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


Handler = Callable[[Control, Session, dict[str, Any], float], None]
HANDLERS: dict[str, Handler] = {
    Event.READY: _ready,
    Event.PROBED: _probed,
    Event.TCP: _tcp,
    Event.STARTED: _started,
    Event.ERROR: _error,
    Event.STOPPING: _stopping,
    Event.EXITED: _exited,
    Event.ALIVE: _alive,
    Event.STACKS: _stacks,
    Event.NCCL: _nccl,
    Event.ATTACHED: _attached,
    Event.TAKEN: _taken,
    Event.POSITION: _position,
}
"""What the controller does with each event name a node's agent session says (`part`s are put together first)."""
IGNORED = {
    Event.ABORTED: "the start was dropped: the launcher's own `abort` or stop, or it was gone; the session's end "
    "(start-error) follows",
    Event.STOPPED: "`exited` follows with the same fields (left, reason), and the node's end is decided on that",
    Event.RUN: "only the logs action says it, and that action's stdout is the log (launcher.run.control)",
}
"""Event names a session may say that the controller deliberately does nothing with, and why."""
