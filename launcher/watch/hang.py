"""When a run that is alive may be stuck (pure): no rank has printed a line, and no rank's optimizer steps or
DataLoader batches have grown, for the hang timeout. Then every rank's stack decides (`launcher.watch.verdict`).

CPU time is never progress: a hung NCCL collective keeps a CPU busy (NCCL's proxy thread polls, a CUDA
synchronisation spins), and so does any thread of the job's that polls.

The timeout is the user's (`--hang-timeout S`, `launcher.hang_timeout`, the inventory's `job.hang_timeout`; 0 turns
the watch off) or, by default, learnt from the run itself so that it cannot fire on a healthy run that is quiet for
long: off until the run has shown progress twice (a line from any rank, or a rank's steps or batches growing, after
a quiet gap), then `HANG_FACTOR` times the longest quiet gap seen so far, and never under `HANG_FLOOR_S`. The agents
see each rank from outside (seconds since its last output line; its steps and batches where the worker's hook
counts them) and say so in their `alive` beats; `observe` takes them, `suspected` answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.limits import HANG_FACTOR, HANG_FLOOR_S, STALL_FACTOR

COUNTERS = ("steps", "batches")
"""A rank's counters in the beats (absent where the worker's hook does not count): any growth is progress."""


@dataclass
class HangWatch:
    """The whole run's progress, from every node's `alive` beats (times are the controller's monotonic clock)."""

    timeout: float | None = None
    """The user's timeout in seconds; None: learnt from the run (see the module); never 0 (no watch at all)."""
    floor: float = HANG_FLOOR_S
    factor: float = HANG_FACTOR
    started: float | None = None
    last_progress: float | None = None
    """When any rank last made progress (or the watch was started or rearmed)."""
    last_line: float | None = None
    """When the run last showed progress: a line or a counter's growth (the learnt timeout's gaps)."""
    gaps: int = 0
    """Progress that came after a quiet gap."""
    longest_gap: float = 0.0
    idle_since: float | None = None
    """Since when every look at the stacks has found every rank idle, with no progress since (None: the last did
    not)."""
    _seen: set[str] = field(default_factory=set)
    """The nodes that have had workers."""
    _lines: dict[tuple[str, int], float] = field(default_factory=dict)
    _counts: dict[tuple[str, int, str], int] = field(default_factory=dict)
    _steps: dict[tuple[str, int], int] = field(default_factory=dict)
    """Each rank's last step as its lines named it (the program's own count: a resumed run's goes on from its
    checkpoint's): where a hang caught the run (`reached`)."""

    def start(self, now: float) -> None:
        self.started = self.last_progress = now

    def observe(self, now: float, node: str, ranks: Iterable[Mapping[str, Any]]) -> None:
        """One node's beat: each rank's `quiet_s` (seconds since its last line, None before any), and its `steps`
        and `batches` where counted (None or absent otherwise). `cpu_s` is not looked at."""
        if self.started is None:
            self.start(now)
        ranks = list(ranks)
        # No worker on that node: torchrun is still starting them (the run's first, or that node's again), and
        # starting is not hanging. A node that never had one while others train is a spare (a c10d run's host past
        # its maximum): its beats are no progress, or its run's hang would never be found.
        if not ranks and (not self._seen or node in self._seen):
            self.last_progress = max(self.last_progress or now, now)
        if ranks:
            self._seen.add(node)
        for rank in ranks:
            key = (node, int(rank["rank"]))
            quiet = rank.get("quiet_s")
            if quiet is not None:
                self._line(now - float(quiet), key)
            for counter in COUNTERS:
                self._count(now, (*key, counter), rank.get(counter))
            step = rank.get("step")
            if isinstance(step, int) and not isinstance(step, bool):
                self._steps[key] = step

    def _line(self, at: float, key: tuple[str, int]) -> None:
        if self._lines.get(key) is not None and at <= self._lines[key] + 1e-6:
            return  # the same line as before
        self._lines[key] = at
        self._progress(at)

    def _count(self, now: float, key: tuple[str, int, str], value: Any) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            return
        before = self._counts.get(key)
        self._counts[key] = value
        # A first count above 0 grew since the start; a lower one is a restarted worker counting again.
        if value > (before if before is not None else 0):
            self._progress(now)

    def _progress(self, at: float) -> None:
        if self.last_line is not None and at > self.last_line:
            self.gaps += 1
            self.longest_gap = max(self.longest_gap, at - self.last_line)
        self.last_line = at if self.last_line is None else max(self.last_line, at)
        self.last_progress = max(self.last_progress or at, at)

    def limit(self) -> float | None:
        """Seconds without progress that make a hang suspected; None while the default has not learnt enough."""
        if self.timeout is not None:
            return self.timeout
        if self.gaps < 2:
            return None
        return max(self.floor, self.factor * self.longest_gap)

    def suspected(self, now: float) -> float | None:
        """Seconds without progress when that is long enough to look at the stacks, else None."""
        limit = self.limit()
        if limit is None or self.last_progress is None:
            return None
        quiet = now - self.last_progress
        return quiet if quiet >= limit else None

    def reached(self) -> int | None:
        """The furthest step any rank's lines named (None: no rank names its steps). Not the hook's counted steps:
        at a hang a fast loop's record lags by the steps of its last flush interval (nothing comes to write it), and
        a CI run said `after step 10` for a rank 11 steps in."""
        return max(self._steps.values(), default=None)

    def counted(self) -> int | None:
        """The optimizer steps every rank had made (the fewest any rank's hook counted: the step the run got past);
        None where no rank's hook counts them. Exact at a hang: the worker writes its counts once it is quiet
        (launcher/node/worker/hook.py `catch_up`), where a line may name a step it has not made (`before step 30`)."""
        counts = [value for (_, _, counter), value in self._counts.items() if counter == "steps"]
        return min(counts) if counts and max(counts) > 0 else None

    def idle_for(self, now: float, quiet: float, idle: bool) -> float | None:
        """A look found every rank idle (`idle`) or not, after `quiet` s without progress (or since the last look):
        for how long every look has found so, with no progress since; None when this one did not."""
        if not idle:
            self.idle_since = None
            return None
        if self.idle_since is None or (self.last_line is not None and self.last_line > self.idle_since):
            self.idle_since = now - quiet
        return now - self.idle_since

    def stall_after(self) -> float | None:
        """Seconds every rank must have been idle for a stall (STALL_FACTOR hang timeouts); None: no timeout yet."""
        limit = self.limit()
        return None if limit is None else STALL_FACTOR * limit

    def rearm(self, now: float) -> None:
        """After the stacks were looked at and the run goes on (not hung, or `--on-hang keep`): the next look one
        timeout later."""
        self.last_progress = now
