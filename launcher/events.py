"""What happens on a node of a run, as typed events the controller decides on (`launcher.run.handle`) and its
consumers see (console, root cause, retries): from the agent's JSON events, its session's end, and the clock.

Below both launcher.run (which makes them) and launcher.report (which says them): it imports only the standard
library and the node package's names (`launcher.node.wire`: the wire's event names and stop reasons).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from launcher.node.wire import HEARTBEAT_TIMEOUT, LAUNCHER_GONE, STOPPED_ELSEWHERE

SELF_STOPS = (HEARTBEAT_TIMEOUT, LAUNCHER_GONE)
"""Why a node's agent stops its part without being asked: the launcher went silent, or its connection closed."""


class EndKind(str, Enum):
    """How a node's part of a run ended, as the controller saw it; the values are what messages and JSON say."""

    EXITED = "exited"
    """The agent reported torchrun's exit."""
    LOST = "lost"
    """The connection to the node dropped."""
    SILENT = "silent"
    """Nothing came from the node for too long."""
    AGENT_DIED = "agent-died"
    """The agent's session ended without a report, after torchrun started."""
    UNANSWERED = "unanswered"
    """No answer to a stop in time."""
    START_ERROR = "start-error"
    """The session ended before torchrun started (a setup line, a refused start, an abort)."""
    TAKEN = "taken"
    """Another launcher took the run over (`attach`): this one lets go of the node; its part goes on."""

    def __str__(self) -> str:
        return self.value  # an f-string says `lost`, on every Python (3.12 formats a mixed-in Enum by its str)


@dataclass(frozen=True)
class NodeEnd:
    """How one node's part of a run ended, as the controller saw it."""

    node: str
    kind: EndKind
    """See `EndKind` (a plain string of one of its values is taken as that kind)."""
    time: float
    exit_code: int | None = None
    stop_reason: str | None = None
    """Why the node's agent stopped the run: stop/kill (the launcher asked), launcher-gone, heartbeat-timeout."""
    asked_to_stop: bool = False
    """The launcher had asked this node to stop before it ended: a consequence, not a cause."""
    silent_for: float = 0.0
    left: int = 0
    """Processes of the run the node could not kill."""
    tail: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    raised: tuple[tuple[int, int | None, str], ...] = ()
    """(local rank, global rank, the exception line) of each rank that printed a traceback's last line: what the
    root cause says, where torchrun's own summary has only `To enable traceback see: ...`."""
    before_workers: bool = False
    """torchrun ended by itself before it ever started its workers: it never completed the rendezvous (its peers may
    still wait there), whatever its exit code says."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EndKind(self.kind))  # ValueError for a kind no one decides on

    @property
    def failed(self) -> bool:
        """Anything but torchrun's exit 0 after its workers ran; a node that stopped its part by itself failed whatever
        torchrun said."""
        if self.stop_reason == STOPPED_ELSEWHERE or self.kind == EndKind.TAKEN:
            return False  # a stop from another terminal, or another launcher's now: what the user asked for
        return (
            self.kind != EndKind.EXITED or self.exit_code != 0 or self.stop_reason in SELF_STOPS or self.before_workers
        )


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
    at: int | None = None
    """The byte of the node's log `data` starts at (None: unknown; a copy then appends it)."""


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
class Reattached(NodeEvent):
    """The node's run was reached over a new session (its connection dropped and came back, or `attach`): it is this
    launcher's console again."""

    down_s: float | None = None
    """Seconds from finding the old session gone to this one taken (None: `attach`'s first session)."""
    log_bytes: int = 0
    """The node's log's size when it took the session: what this launcher reads to be where the node is."""
    replay: bool = False
    """The run had ended there meanwhile: the session replays its end."""
    away_s: float | None = None
    """How long the node had heard no launcher."""


@dataclass(frozen=True)
class CutOff(NodeEvent):
    """No node of the run can be reached (`node` is ""), past the silence timeout: this launcher's own network, most
    likely. It keeps trying until the nodes' bound, when they stop the run by themselves (for ever with none)."""

    since: float = 0.0
    """When the first of them went out of reach (wall clock)."""
    until: float | None = None
    """When the nodes stop the run by themselves, unless a launcher is back (wall clock); None: they keep it (no
    heartbeat bound)."""


@dataclass(frozen=True)
class Position(NodeEvent):
    """How long the node's log is now (the answer to `position`)."""

    log_bytes: int = 0


@dataclass(frozen=True)
class CaughtUp(NodeEvent):
    """A launcher back from away (`node` is ""), or a node reconnected, has read what its nodes printed meanwhile."""

    away_s: float = 0.0
    """How long it was away (the launcher frozen, or the node's connection down)."""
    since: float = 0.0
    """When the absence began (wall clock)."""
    lines: int = 0
    """Lines that came in once it was back."""
    kept: tuple[str, ...] = ()
    """The nodes whose run went on meanwhile."""
    ended: tuple[str, ...] = ()
    """The nodes whose part ended meanwhile (not those another launcher took over)."""
    complete: bool = True
    """False: not every node's backlog was read within CATCH_UP_WAIT_S."""


@dataclass(frozen=True)
class Beat(NodeEvent):
    """An attached node's agent is alive; how each of its ranks looks from outside (`quiet_s`, `cpu_s`, `state`)."""

    progress: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class StacksTaken(NodeEvent):
    """A node's agent took every worker's stack (the `stacks` message): launcher/node/agent/stackdump.py's answer."""

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
    why: str = ""
    """What made it a hang (launcher.watch.verdict)."""
    suspects: tuple[tuple[str, int], ...] = ()
    """(node, rank) of each rank that holds the hang up (the verdict's); none where every rank is stuck alike."""
    step: int | None = None
    """The furthest step the ranks' lines named when it hung (None: none names its steps)."""
    counted: int | None = None
    """The optimizer steps every rank had made, as the hook counted them (None: not counted)."""
    restarting: bool = False
    """The launcher stops this attempt to start the run again (`--on-hang restart`, a retry left)."""
    stall: bool = False
    """No rank waits for another: every rank idle for STALL_FACTOR hang timeouts (launcher.limits), not a hang."""


@dataclass(frozen=True)
class LossFlagged(NodeEvent):
    """What the loss rules found (launcher/watch/loss.py: `nonfinite`, `outlier`, `spike`), once each; `node` is the
    rank's ("" for the run's spike)."""

    kind: str = ""
    line: str = ""
    rank: int | None = None
    step: int | None = None
    stops: bool = False
    """The launcher stops the run for it (`--on-nonfinite stop`)."""


@dataclass(frozen=True)
class HangRuledOut(NodeEvent):
    """No progress for `quiet_s`, but every rank's stack, looked at twice, says the run is not hung (`why`): it goes
    on, and is looked at again one timeout later. `answers` as HangSuspected's (the second look)."""

    quiet_s: float = 0.0
    answers: dict[str, Any] = field(default_factory=dict)
    why: str = ""


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
    """NCCL's flight recorder dumps a node's workers wrote as the run ended (an NCCL timeout), or when the launcher
    asked for them (the `dumps` message): {name: base64}."""

    dumps: dict[str, str] = field(default_factory=dict)
    asked: tuple[int, ...] = ()
    """The ranks whose debug-info pipe the agent wrote to (asked for dumps)."""
