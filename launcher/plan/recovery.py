"""What follows, at every point a run can go one way or another (pure): the one place that decides it, as torch
elastic's `SimpleElasticAgent._invoke_run` decides on its worker group's state. Every decision is a typed value
whose words are made here, once; no caller reads a decision's text.

Inside an attempt, when a node's part ends (`after_node_end`): nothing to do (it succeeded, or it was asked to stop),
the run goes on without it (`GoOnWithout`: an elastic group that keeps its minimum), the run stops (`StopRun`: a static
group needs every node), or a start that had not finished fails (`FailStart`: a run starts on every node or on none).

After an attempt (`after_attempt`), from how it ended (`AttemptEnd`, classified by `launcher.plan.ends`):
- a lost node, a killed process, a launcher gone: started again while retries are left, on the nodes left (`Retry`);
- a hang, with `on_hang: restart` and a retry left: started again, without the node whose rank held the run up when
  the run can do without it (a c10d range's minimum, or a static run on the nodes left), else on the same nodes; a
  run that hangs at the same step again on another node is the program's bug, not a node's, and ends;
- a node that caused FAILURES_TO_BLACKLIST failed attempts (hangs included) sits out for the cool-down;
- everything else ends the launch (`Final`, with its `Reason`).
Which nodes then pass the doctor's checks and are swept of the attempt is I/O (launcher/run/attempts.py); whether
enough are left for the next attempt is decided here too (`too_few`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from launcher.config.model import Cluster
from launcher.errors import UsageError
from launcher.events import EndKind, NodeEnd
from launcher.plan.retry import NextNodes, blacklisted


class How(str, Enum):
    """How an attempt ended; the values are what attempts.json and the pages say."""

    OK = "ok"
    FAILED = "failed"
    """The script failed by itself (an exception, an exit code): a retry would fail the same way."""
    LOST = "lost"
    """A node was lost: its connection, its silence, its agent's death."""
    KILLED = "killed"
    """A process of the run was killed by a signal (the OOM killer, a node's reboot)."""
    HANG = "hang"
    """The hang watch's verdict stopped it."""
    STOPPED = "stopped"
    """Stopped from elsewhere (`stop`)."""
    INTERRUPTED = "interrupted"
    """The user stopped it (Ctrl-C)."""
    LAUNCHER_GONE = "launcher-gone"
    """Its nodes stopped it for want of a launcher."""
    LEFT = "left"
    """This launcher left it to its nodes (its terminal closed, another launcher took it over)."""
    NO_START = "no-start"
    """It could not start."""
    NONFINITE = "nonfinite"
    """A rank's loss went NaN or infinite and the launcher stopped it (`--on-nonfinite stop`)."""

    def __str__(self) -> str:
        return self.value

    @property
    def node_caused(self) -> bool:
        """Counts against the node that caused it (the blacklist's failed attempts)."""
        return self in (How.LOST, How.KILLED, How.HANG, How.LAUNCHER_GONE)

    @property
    def retried(self) -> bool:
        """Another attempt may get past it: the node's doing, not the program's."""
        return self in (How.LOST, How.KILLED, How.LAUNCHER_GONE)


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt ended, as the decision reads it."""

    how: How
    why: str = ""
    """In a sentence: the root cause, the hang's words."""
    node: str | None = None
    """The node whose end ended it (a hang's: the node of the rank that held it up)."""
    rank: int | None = None
    step: int | None = None
    """A hang's: the furthest step the ranks' lines named when it hung (the program's numbering, which a resumed
    attempt goes on with: two attempts that hung at one step are the program's hang)."""
    counted: int | None = None
    """A hang's: the optimizer steps every rank of the attempt had made, as the hook counted them."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "how", How(self.how))  # ValueError for a way no one decides on

    @property
    def summary(self) -> str:
        """What ended it, as an attempt's line says it."""
        if self.how == How.HANG:
            where = self.hung_after
            who = f"{self.node} held the run up (rank {self.rank})" if self.node else "every rank waited alike"
            return f"it hung{where}: {who}"
        return self.why or self.how.value

    @property
    def hung_after(self) -> str:
        """` after N optimizer steps` (what the ranks' hooks counted), else ` after step N` (the lines' word), else
        nothing: a line may name a step the rank never made (`hanging before step 30`); the hook counts those made."""
        if self.counted is not None:
            return f" after {self.counted} optimizer step{'' if self.counted == 1 else 's'}"
        return "" if self.step is None else f" after step {self.step}"


class Reason(str, Enum):
    """Why no attempt follows."""

    SUCCEEDED = "succeeded"
    PROGRAM_FAILED = "program-failed"
    """The script failed by itself: a retry would fail the same way."""
    NO_START = "no-start"
    """The run could not start: a retry would not either."""
    ENDED_AS_ASKED = "ended-as-asked"
    """Interrupted, stopped from elsewhere, left to its nodes: what someone asked for."""
    HANG_STOPS = "hang-stops"
    """A hang, where `--on-hang` does not restart."""
    PROGRAM_HANGS = "program-hangs"
    """The same hang twice, on two nodes: the program's, not a node's."""
    LOSS_NONFINITE = "loss-nonfinite"
    """The loss went non-finite: a retry from the last checkpoint replays the same batches to the same end."""
    NO_RETRY_LEFT = "no-retry-left"
    TOO_FEW_NODES = "too-few-nodes"
    """Too few nodes passed the checks and the sweep for the next attempt."""


@dataclass(frozen=True)
class Retry:
    """Start the run again (with the job's resume_args)."""

    why: str
    """What ended the attempt (`AttemptEnd.summary`)."""
    sit_out: Mapping[str, str] = field(default_factory=dict)
    """Nodes that sit the next attempt out whatever the doctor's checks say (a hang's node, a cool-down), and why."""


@dataclass(frozen=True)
class Final:
    """The launch ends with this attempt."""

    reason: Reason
    why: str
    """What ended the attempt (`AttemptEnd.summary`)."""
    text: str
    """Why no attempt follows, as the user reads it under the attempts' lines."""


@dataclass(frozen=True)
class GoOnWithout:
    """An elastic group goes on without a node whose part ended: enough nodes are left."""

    node: str
    remaining: int
    needs: int


@dataclass(frozen=True)
class StopRun:
    """A node's failure stops the run on every node (fail fast)."""

    node: str


@dataclass(frozen=True)
class FailStart:
    """The start fails: what started elsewhere is stopped, nothing starts anywhere."""

    why: str
    """`node: what it said`, as the launch's error says it."""


def group_needs(cluster: Cluster, count: int) -> int:
    """How many nodes a running group of `count` needs to go on: a c10d range's minimum, else every node."""
    elastic = cluster.rendezvous.elastic
    return elastic.nodes_range(count)[0] if elastic.backend == "c10d" else count


def restart_needs(cluster: Cluster, count: int) -> int:
    """The fewest nodes a new attempt of a run of `count` can start on: a c10d range's minimum; a static run is
    planned again for whatever nodes are left, one at least."""
    elastic = cluster.rendezvous.elastic
    return elastic.nodes_range(count)[0] if elastic.backend == "c10d" else 1


def after_node_end(
    end: NodeEnd,
    *,
    asked_to_stop: bool,
    started: bool,
    remaining: int,
    needs: int,
    start_failed: bool,
    said: Sequence[str] = (),
) -> GoOnWithout | StopRun | FailStart | None:
    """What follows a node's end inside an attempt: `remaining` nodes still run, the group `needs` that many to go
    on (`group_needs`); the node had `started` its part; the run's start has failed (`start_failed`: it is being
    stopped everywhere). `said`: what the node's session said (its agent's messages), a failed start's words."""
    if not end.failed or asked_to_stop:
        return None  # it succeeded, or its end is what was asked
    if started and not start_failed and remaining >= needs:
        return GoOnWithout(end.node, remaining, needs)
    if started:
        return StopRun(end.node)
    silent = f"stopped answering (nothing for {end.silent_for:.0f} s)"
    exited = f"the agent exited with code {end.exit_code}"
    return FailStart(f"{end.node}: {'; '.join(said) or (silent if end.kind == EndKind.SILENT else exited)}")


def after_attempt(
    end: AttemptEnd,
    before: Sequence[AttemptEnd],
    *,
    nodes: Sequence[str],
    min_nodes: int,
    retries: int,
    on_hang: str,
    failures: Mapping[str, Sequence[float]],
    now: float,
    cooldown: float,
) -> Retry | Final:
    """What follows `end`, the last of `before` + [end] attempts on `nodes` (this attempt's), for a launch allowed
    `retries` restarts. `min_nodes`: the fewest nodes the run can do with (`restart_needs`). `failures`: each node's
    failed attempts' times so far, this one's included (the blacklist's)."""
    said = end.summary
    if end.how == How.OK:
        return Final(Reason.SUCCEEDED, said, "exit 0")
    if end.how == How.HANG and on_hang != "restart":
        return Final(Reason.HANG_STOPS, said, f"not retried: {end.why or 'it hung'} (--on-hang {on_hang})")
    if end.how == How.FAILED:
        return Final(
            Reason.PROGRAM_FAILED, said, "not retried: the script itself failed (a retry would fail the same way)"
        )
    if end.how == How.NONFINITE:
        return Final(
            Reason.LOSS_NONFINITE,
            said,
            f"not retried: {said} (a retry would replay the same batches from its checkpoint)",
        )
    if end.how == How.NO_START:
        return Final(Reason.NO_START, said, "not retried: the run could not start (a retry would not either)")
    if not end.how.retried and end.how != How.HANG:
        return Final(Reason.ENDED_AS_ASKED, said, f"not retried: {said}")
    again = _same_hang(end, before)
    if again is not None:
        return Final(Reason.PROGRAM_HANGS, said, again)
    if len(before) >= retries:
        return Final(Reason.NO_RETRY_LEFT, said, f"{said}; no retry left ({retries} allowed)")
    sit_out = blacklisted(failures, now, cooldown)
    left = [n for n in nodes if n not in sit_out]
    if end.how == How.HANG and end.node in left and len(left) - 1 >= min_nodes:  # the run can do without it
        sit_out = {**sit_out, str(end.node): f"its rank {end.rank} held the run up{end.hung_after}"}
    return Retry(said, sit_out)


def too_few(chosen: NextNodes, needs: int) -> Final | None:
    """The end of the launch where fewer than `needs` nodes are left for the next attempt (`chosen`: the nodes that
    passed the decision, the checks and the sweep); None: the next attempt starts."""
    if len(chosen.cluster.hosts) >= needs:
        return None
    text = "\n".join(
        [
            f"cannot retry: {len(chosen.cluster.hosts)} node(s) left, the run needs at least {needs}",
            *(f"  {name}: {why}" for name, why in chosen.dropped.items()),
        ]
    )
    return Final(Reason.TOO_FEW_NODES, text, text)


def outcome(end: AttemptEnd, decision: Retry | Final) -> str:
    """An attempt's outcome as attempts.json says it: ok, failed (retried), failed-final, interrupted."""
    if end.how == How.OK:
        return "ok"
    if end.how in (How.INTERRUPTED, How.STOPPED, How.LEFT):
        return "interrupted"
    return "failed" if isinstance(decision, Retry) else "failed-final"


def _same_hang(end: AttemptEnd, before: Sequence[AttemptEnd]) -> str | None:
    """The program's own hang: the last attempt hung at the same step as this one, on another node."""
    last = before[-1] if before else None
    if end.how != How.HANG or last is None or last.how != How.HANG or end.step is None or last.step != end.step:
        return None
    if end.node is None or last.node is None or end.node == last.node:
        return None
    return (
        f"the run hung at the same step twice, on {last.node} then {end.node}: the program, not a node "
        "(no retry: it would hang there again)"
    )


@dataclass(frozen=True)
class Restarts:
    """Whether a launch may start its run again, resolved once: how often, and what a hang does."""

    retries: int
    on_hang: str
    notes: tuple[str, ...] = ()
    """What the user is told of a setting that does not apply (the inventory's: an option given is refused)."""


WHERE = ("attached", "detached", "slurm", "attach")
"""Where a run is followed: an attached launch over SSH (the only one that starts a run again), a detached one (no
launcher), under SLURM (the scheduler requeues), `attach` (a run taken over, followed to its end)."""
_WHY_NOT = {
    "detached": (
        "needs an attached run: a detached run has no launcher to start it again",
        "does not apply to a detached run: no launcher is there to start it again",
        "does not apply to a detached run: no launcher watches it for a hang (an attached run's does; `inv "
        "top` shows a rank behind)",
    ),
    "slurm": (
        "does not apply to --slurm (a SLURM job is requeued by SLURM (sbatch --requeue))",
        "does not apply under SLURM",
        "does not apply under SLURM; a hang stops the run",
    ),
    "attach": (
        "does not apply to attach: it follows the run it takes over to its end (`launch --on-hang restart` "
        "starts a run again)",
        "does not apply to attach",
        "does not apply to attach; a hang stops the run",
    ),
}
"""Per WHERE that cannot restart: an option given (refused), the inventory's retries, its job.on_hang (noted)."""


def restarts(
    retries: int,
    on_hang: str,
    *,
    source: str,
    where: str = "attached",
    given: bool = False,
    on_hang_given: bool = False,
) -> Restarts:
    """A launch's `retries` and `on_hang` as the run will use them, decided once: only an attached launch over SSH
    starts a run again, and a restart after a hang is one of its retries. `given`, `on_hang_given`: the command line
    set them (refused with a usage error where they cannot apply; the inventory's are noted and dropped)."""
    if where not in WHERE:
        raise ValueError(f"a run is followed one of {', '.join(WHERE)} ways, not {where!r}")
    if where != "attached":
        refused, retries_note, on_hang_note = _WHY_NOT[where]
        if given and retries:
            raise UsageError(f"--retries {refused}")
        if on_hang_given and on_hang == "restart":
            raise UsageError(f"--on-hang restart {refused}")
        notes = [f"note: {source}: retries: {retries} {retries_note}"] if retries else []
        if on_hang == "restart":
            notes.append(f"note: {source}: job.on_hang: restart {on_hang_note}")
        return Restarts(0, "stop" if on_hang == "restart" else on_hang, tuple(notes))
    if on_hang == "restart" and not retries:
        return Restarts(
            0,
            "stop",
            (
                "note: on_hang: restart starts the run again as one of its retries, and it has "
                "none (--retries N, or the inventory's retries): a hang stops the run",
            ),
        )
    return Restarts(retries, on_hang)
