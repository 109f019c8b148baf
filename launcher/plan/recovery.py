"""What follows an attempt of a run (pure): started again on which nodes, or the end, and why; the one place that
decides it, as torch elastic's `SimpleElasticAgent._invoke_run` decides on its worker group's state.

An attempt ends one way (`AttemptEnd.how`): it succeeded; its script failed by itself (an exception, an exit code: a
retry would fail the same way); a node was lost (its connection, its silence, its agent's death) or a process of the
run was killed by a signal; it hung (the watch's verdict, its suspects and the step it had reached); the user stopped
it; its nodes stopped it for want of a launcher; this launcher left it to them (its terminal closed, another took it
over); it could not start. The decision (`after_attempt`):
- a lost node, a killed process, a launcher gone: started again while retries are left, on the nodes left;
- a hang, with `on_hang: restart` and a retry left: started again, without the node whose rank held the run up when
  the run can do without it (a c10d range's minimum, or a static run on the nodes left), else on the same nodes; a
  run that hangs at the same step again on another node is the program's bug, not a node's, and ends;
- a node that caused FAILURES_TO_BLACKLIST failed attempts (hangs included) sits out for the cool-down;
- everything else ends the launch.
Which nodes then pass the doctor's checks and are swept of the attempt is I/O (launcher/run/attempts.py); `next_nodes`
(launcher/plan/retry.py) then plans the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher.errors import UsageError
from launcher.plan.retry import blacklisted

HOWS = ("ok", "failed", "lost", "killed", "hang", "stopped", "interrupted", "launcher-gone", "left", "no-start")
"""How an attempt can end (`AttemptEnd.how`)."""
RETRIED = ("lost", "killed", "launcher-gone")
"""Ends another attempt may get past: the node, not the program."""


@dataclass(frozen=True)
class AttemptEnd:
    """How one attempt ended, as the decision reads it."""

    how: str
    """One of HOWS."""
    why: str = ""
    """In a sentence: the root cause, the hang's words."""
    node: str | None = None
    """The node whose end ended it (a hang's: the node of the rank that held it up)."""
    rank: int | None = None
    step: int | None = None
    """A hang's: the furthest step the ranks' lines named when it hung (it hung after this step)."""

    def __post_init__(self) -> None:
        if self.how not in HOWS:
            raise ValueError(f"an attempt ends one of {', '.join(HOWS)}, not {self.how!r}")


@dataclass(frozen=True)
class Retry:
    """Start the run again (with the job's resume_args)."""

    reason: str
    sit_out: Mapping[str, str] = field(default_factory=dict)
    """Nodes that sit the next attempt out whatever the doctor's checks say, and why."""


@dataclass(frozen=True)
class Final:
    """The launch ends with this attempt."""

    reason: str
    """Why no attempt follows (`the script itself failed`, `no retry left (2 allowed)`)."""


def after_attempt(end: AttemptEnd, before: Sequence[AttemptEnd], *, nodes: Sequence[str], min_nodes: int,
                  retries: int, on_hang: str, failures: Mapping[str, Sequence[float]], now: float,
                  cooldown: float) -> Retry | Final:
    """What follows `end`, the last of `before` + [end] attempts on `nodes` (this attempt's), for a launch allowed
    `retries` restarts. `min_nodes`: the fewest nodes the run can do with (a c10d range's minimum; 1 for a static
    run). `failures`: each node's failed attempts' times so far, this one's included (the blacklist's)."""
    if end.how == "ok":
        return Final("exit 0")
    if end.how == "hang" and on_hang != "restart":
        return Final(f"{end.why or 'it hung'} (--on-hang {on_hang})")
    if end.how not in (*RETRIED, "hang"):
        return Final(_final_reason(end))
    again = _same_hang(end, before)
    if again is not None:
        return Final(again)
    reason = _reason(end)
    if len(before) >= retries:
        return Final(f"{reason}; no retry left ({retries} allowed)")
    sit_out = blacklisted(failures, now, cooldown)
    left = [n for n in nodes if n not in sit_out]
    if end.how == "hang" and end.node in left and len(left) - 1 >= min_nodes:  # the run can do without it
        step = "" if end.step is None else f" after step {end.step}"
        sit_out = {**sit_out, str(end.node): f"its rank {end.rank} held the run up{step}"}
    return Retry(reason, sit_out)


def _reason(end: AttemptEnd) -> str:
    if end.how == "hang":
        where = "" if end.step is None else f" after step {end.step}"
        who = f"{end.node} held the run up (rank {end.rank})" if end.node else "every rank waited alike"
        return f"it hung{where}: {who}"
    return end.why or end.how


def _final_reason(end: AttemptEnd) -> str:
    if end.how == "failed":
        return "the script itself failed (a retry would fail the same way)"
    if end.how == "no-start":
        return "the run could not start (a retry would not either)"
    return end.why or end.how


def _same_hang(end: AttemptEnd, before: Sequence[AttemptEnd]) -> str | None:
    """The program's own hang: the last attempt hung at the same step as this one, on another node."""
    last = before[-1] if before else None
    if end.how != "hang" or last is None or last.how != "hang" or end.step is None or last.step != end.step:
        return None
    if end.node is None or last.node is None or end.node == last.node:
        return None
    return (f"the run hung after step {end.step} twice, on {last.node} then {end.node}: the program, not a node "
            "(no retry: it would hang there again)")


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
    "detached": ("needs an attached run: a detached run has no launcher to start it again",
                 "does not apply to a detached run: no launcher is there to start it again",
                 "does not apply to a detached run: no launcher watches it for a hang (an attached run's does; `inv "
                 "top` shows a rank behind)"),
    "slurm": ("does not apply to --slurm (a SLURM job is requeued by SLURM (sbatch --requeue))",
              "does not apply under SLURM", "does not apply under SLURM; a hang stops the run"),
    "attach": ("does not apply to attach: it follows the run it takes over to its end (`launch --on-hang restart` "
               "starts a run again)", "does not apply to attach", "does not apply to attach; a hang stops the run"),
}
"""Per WHERE that cannot restart: an option given (refused), the inventory's retries, its job.on_hang (noted)."""


def restarts(retries: int, on_hang: str, *, source: str, where: str = "attached", given: bool = False,
             on_hang_given: bool = False) -> Restarts:
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
        return Restarts(0, "stop", ("note: on_hang: restart starts the run again as one of its retries, and it has "
                                    "none (--retries N, or the inventory's retries): a hang stops the run",))
    return Restarts(retries, on_hang)
