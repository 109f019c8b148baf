"""When a run that is alive is stuck (pure): no rank has printed a line, and no rank's CPU time has grown
meaningfully, for the hang timeout.

The timeout is the user's (`--hang-timeout S`, `launcher.hang_timeout`, the inventory's `job.hang_timeout`; 0 turns
the watch off) or, by default, learnt from the run itself so that it cannot fire on a healthy run that prints
rarely: off until the run has printed progress twice (a line from any rank after a quiet gap), then `HANG_FACTOR`
times the longest quiet gap seen so far, and never under `HANG_FLOOR_S`. The agents see each rank from outside
(seconds since its last output line, CPU seconds from /proc) and say so in their `alive` beats; `observe` takes
them, `suspected` answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.config.model import Job
from launcher.limits import HANG_CPU_SHARE, HANG_FACTOR, HANG_FLOOR_S


def hang_timeout(given: float | None, job: Job) -> float | None:
    """The run's hang timeout: the command line's or invoke.yaml's, else the inventory's job's (None: learnt)."""
    return given if given is not None else job.hang_timeout


@dataclass
class HangWatch:
    """The whole run's progress, from every node's `alive` beats (times are the controller's monotonic clock)."""

    timeout: float | None = None
    """The user's timeout in seconds; None: learnt from the run (see the module); never 0 (no watch at all)."""
    floor: float = HANG_FLOOR_S
    factor: float = HANG_FACTOR
    cpu_share: float = HANG_CPU_SHARE
    started: float | None = None
    last_progress: float | None = None
    last_line: float | None = None
    """When any rank last printed a line."""
    gaps: int = 0
    """Lines that came after a quiet gap (progress printed)."""
    longest_gap: float = 0.0
    _cpu: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    _lines: dict[tuple[str, int], float] = field(default_factory=dict)

    def start(self, now: float) -> None:
        self.started = self.last_progress = now

    def observe(self, now: float, node: str, ranks: Iterable[Mapping[str, Any]]) -> None:
        """One node's beat: each rank's `quiet_s` (seconds since its last line, None before any) and `cpu_s`."""
        if self.started is None:
            self.start(now)
        ranks = list(ranks)
        if not ranks:  # no worker yet on that node (torchrun is still starting them): starting is not hanging
            self.last_progress = max(self.last_progress or now, now)
        for rank in ranks:
            key = (node, int(rank["rank"]))
            quiet = rank.get("quiet_s")
            if quiet is not None:
                self._line(now - float(quiet), key)
            cpu = rank.get("cpu_s")
            if cpu is not None:
                before = self._cpu.get(key)
                self._cpu[key] = (now, float(cpu))
                if before is not None and float(cpu) - before[1] > self.cpu_share * max(now - before[0], 1e-9):
                    self.last_progress = max(self.last_progress or now, now)

    def _line(self, at: float, key: tuple[str, int]) -> None:
        if self._lines.get(key) is not None and at <= self._lines[key] + 1e-6:
            return  # the same line as before
        self._lines[key] = at
        if self.last_line is not None and at > self.last_line:
            gap = at - self.last_line
            if gap > 0:
                self.gaps += 1
                self.longest_gap = max(self.longest_gap, gap)
        self.last_line = at if self.last_line is None else max(self.last_line, at)
        self.last_progress = max(self.last_progress or at, at)

    def limit(self) -> float | None:
        """Seconds without progress that make a hang; None while the default has not learnt enough."""
        if self.timeout is not None:
            return self.timeout
        if self.gaps < 2:
            return None
        return max(self.floor, self.factor * self.longest_gap)

    def suspected(self, now: float) -> float | None:
        """Seconds without progress when that is a hang, else None."""
        limit = self.limit()
        if limit is None or self.last_progress is None:
            return None
        quiet = now - self.last_progress
        return quiet if quiet >= limit else None

    def rearm(self, now: float) -> None:
        """After a hang was reported and the run kept (`--on-hang keep`): the next report one timeout later."""
        self.last_progress = now
