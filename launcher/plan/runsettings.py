"""A run's settings beyond its command, resolved once (pure): what a hang does and when it is suspected, whether and
how the run is started again, how long a stop waits, what makes a rank a straggler. The command line's options over
the settings' files (`Options`), over the inventory's (`retries`, `job.hang_timeout`, `job.on_hang`), over the
defaults; whether a restart can apply where the run is followed (`recovery.restarts`) is folded in here too.

The plan holds the value (`LaunchPlan.settings`): every room that follows the run reads it there (the node's request,
the hang watch, the attempts, a stop's grace, the straggler teller), and no room decides any of it again.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from launcher.config.model import Cluster, Job
from launcher.limits import action_timeout
from launcher.options import (
    DEFAULT_GRACE,
    DEFAULT_RETRY_COOLDOWN,
    DEFAULT_RETRY_WAIT,
    STRAGGLER_FACTOR,
    STRAGGLER_HOLD_S,
    Options,
)
from launcher.plan.recovery import restarts


@dataclass(frozen=True)
class RunSettings:
    """What one run uses of the settings that shape how it is followed, each resolved."""

    hang_timeout: float | None = None
    """Seconds without progress before the run is suspected hung: None, learnt from the run (launcher.watch.hang);
    0, never watched."""
    on_hang: str = "stop"
    """What a suspected hang does (launcher.options.ON_HANG), once it can apply here (`restart` needs a retry)."""
    retries: int = 0
    """How often a failed attached run is started again on the nodes left (0 wherever no launcher can)."""
    retry_wait: float = DEFAULT_RETRY_WAIT
    """Seconds between a failed attempt and the doctor's checks before the next."""
    retry_cooldown: float = DEFAULT_RETRY_COOLDOWN
    """Seconds a node that caused two failed attempts sits out."""
    grace: float = DEFAULT_GRACE
    """Seconds between TERM and KILL when the run is stopped."""
    straggler_factor: float = STRAGGLER_FACTOR
    """A rank slower than this share of the median rank's step rate..."""
    straggler_hold: float = STRAGGLER_HOLD_S
    """...for this many seconds is told as a straggler."""
    notes: tuple[str, ...] = ()
    """What the user is told before anything starts, of a setting that does not apply where the run is followed."""

    @property
    def action_timeout(self) -> float:
        """How long a stop may take on a node: the grace period plus a margin."""
        return action_timeout(self.grace)


SETTINGS = tuple(f.name for f in fields(RunSettings) if f.name != "notes")
"""The options a run's settings hold (the plan's value wins over the raw option wherever both are read)."""


def run_settings(cluster: Cluster, job: Job | None = None, opts: Options | None = None, *,
                 where: str = "attached") -> RunSettings:
    """The settings a run of `job` (default: the inventory's) on `cluster` uses, followed `where`
    (`recovery.WHERE`): `opts`' values where given, else the inventory's, else the defaults. Raises a UsageError
    for an option given that cannot apply there (`--retries` with a detached run)."""
    opts = opts or Options()
    job = job or cluster.job
    inventory_hang = job.hang_timeout if job is not None else None
    inventory_on_hang = job.on_hang if job is not None else None
    # `attach` follows one attempt: the launch that started the run chose whether to start it again.
    retries = 0 if where == "attach" else cluster.retries if opts.retries is None else opts.retries
    policy = restarts(retries, opts.on_hang or inventory_on_hang or "stop", source=cluster.source, where=where,
                      given=opts.retries is not None, on_hang_given=opts.on_hang is not None)
    return RunSettings(hang_timeout=inventory_hang if opts.hang_timeout is None else opts.hang_timeout,
                       on_hang=policy.on_hang, retries=policy.retries, retry_wait=opts.retry_wait,
                       retry_cooldown=opts.retry_cooldown, grace=opts.grace, straggler_factor=opts.straggler_factor,
                       straggler_hold=opts.straggler_hold, notes=policy.notes)
