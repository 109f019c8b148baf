"""What happens on a node of a run, as typed events the controller decides on (`launcher.run.handle`) and its
consumers see (console, root cause, retries): from the agent's JSON events, its session's end, and the clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.report.rootcause import NodeEnd


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
class Beat(NodeEvent):
    """An attached node's agent is alive; how each of its ranks looks from outside (`quiet_s`, `cpu_s`, `state`)."""

    progress: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class StacksTaken(NodeEvent):
    """A node's agent took every worker's stack (the `stacks` word): launcher/node/stacks.py's answer."""

    workers: tuple[dict[str, Any], ...] = ()
    nccl: dict[str, str] = field(default_factory=dict)
    """NCCL flight recorder dumps found in the run directory (name -> base64), on GPU nodes."""


@dataclass(frozen=True)
class HangSuspected(NodeEvent):
    """No rank made progress for `quiet_s` (the whole run: `node` is ""); every node's stacks, or why it has none."""

    quiet_s: float = 0.0
    answers: dict[str, Any] = field(default_factory=dict)
    kept: bool = False
    """The run goes on (`--on-hang keep`); else the launcher stops it."""


@dataclass(frozen=True)
class Ended(NodeEvent):
    """The node's part is over, one way or another (see `NodeEnd.kind`)."""

    end: NodeEnd
    node_time: float | None = None
    """When the agent reported the exit, by the node's clock (None when it could not)."""


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


@dataclass(frozen=True)
class NcclDumps(NodeEvent):
    """NCCL's flight recorder dumps a node's workers wrote as the run ended (an NCCL timeout): {name: base64}."""

    dumps: dict[str, str] = field(default_factory=dict)
