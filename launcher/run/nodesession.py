"""One node agent's session of an attached run, as the controller sees it (`Session`), and what a session is made of:
a channel (`SessionChannel`: an SSH channel, or a task of an srun step) that a `SessionOpener` starts."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from launcher.events import NodeEnd
from launcher.plan.launchplan import NodeCommand
from launcher.run.state import NodeState


class SessionChannel(Protocol):
    """A node agent's session as the controller uses it (`transport.Channel` over SSH)."""

    def send(self, data: bytes, block: bool = True) -> bool: ...
    def read(self) -> tuple[bytes, bytes]: ...
    def wait_readable(self, timeout: float) -> None: ...
    @property
    def finished(self) -> bool: ...
    @property
    def drained(self) -> bool: ...
    @property
    def output_ended(self) -> bool: ...
    def exit_code(self) -> int: ...
    def close(self) -> None: ...


SessionOpener = Callable[[str, Sequence[tuple[NodeCommand, dict[str, Any]]]], Sequence["SessionChannel | str"]]
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
    pending_message: bytes | None = None
    """A stop message the channel could not take yet."""
    stop_reason: str | None = None
    asked_to_stop: bool = False
    messages: list[str] = field(default_factory=list)
    end: NodeEnd | None = None
    reported: dict[str, Any] | None = None
    """The agent's `exited` event, once it came."""
    parts: dict[str, list[str]] = field(default_factory=dict)
    """The parts of a large event received so far, by the event's name."""
    received: int = 0
    """Bytes of the node's log read so far: where a new session's stream starts (no line lost, none twice)."""
    at_known: bool = True
    """`received` is the node's own offset (not so for `attach` from the node's last lines, without a local copy)."""
    lines: int = 0
    """Lines of it read so far."""
    beats: int = 0
    """`alive` beats heard (the trace counts them: too many to trace one by one)."""
    stop_message: bytes | None = None
    """The last stop message sent (`stop` or `kill`): a session that replaces a lost one is told it again."""
    outage: float | None = None
    """Since when (monotonic: the last message heard before the loss) the node's session is lost, while a new one is
    being opened; the silence timeout counts from here."""
    attaching: bool = False
    """A new session is open and has not yet been taken by the node's run (its `attached` event)."""
    lost_at: float | None = None
    """When the launcher found that session gone (monotonic): a reconnect's line says the time from here."""
    lost_how: str = ""
    """How it was found gone: `silent` (nothing came: the node stopped answering), or its connection or output ended."""
    reconnect_error: str | None = None
    """Why the last try at a new session failed (`could not reconnect ...: connection refused`)."""
    attach_lines: int = 0
    """`lines` when that session was opened: what came after is the backlog it caught up."""
    following: SessionChannel | None = None
    """The channel being read (a new session's, until it is taken)."""
    taken: dict[str, Any] | None = None
    """Another launcher took the run over (the node's `taken` event: by, at)."""

    @property
    def name(self) -> str:
        return self.command.host.name

    @property
    def state(self) -> NodeState:
        """Where its part is (`launcher.run.state`), from what its session said and what it was told."""
        if self.end is not None:
            return NodeState.ENDED
        if self.outage is not None:
            return NodeState.AWAY
        if self.asked_to_stop:
            return NodeState.STOPPING
        if self.started:
            return NodeState.RUNNING
        return NodeState.READY if self.ready else NodeState.OPENING
