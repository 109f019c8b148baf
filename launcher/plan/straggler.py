"""Stragglers (pure): a rank whose step rate stays below a share of the median rank's, for long enough.

Data parallel training runs at the pace of its slowest rank: every all_reduce waits for it, so a slow node shows as
every rank's rate dropping together, except in the rank's own output when its steps are counted before the wait.
What this sees is each rank's rate from its own progress lines (launcher/node/top.py). A rank is *slow* when its
rate is below `factor` x the median of all ranks with a rate (two at least); it is a *straggler* once it has been
slow for `hold_s` without a break. `inv top --once` judges one look (hold 0).
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field


def slow_ranks(rates: Mapping[Hashable, float | None], factor: float) -> dict[Hashable, float]:
    """{rank: its rate / the median rate} of the ranks below `factor` x the median; none under two rates."""
    known = {key: rate for key, rate in rates.items() if rate is not None}
    if len(known) < 2:
        return {}
    median = statistics.median(known.values())
    if median <= 0:
        return {}
    return {key: rate / median for key, rate in known.items() if rate < factor * median}


@dataclass
class Straggler:
    """A rank flagged: how far below the median it is, and for how long it has been."""

    key: Hashable
    share: float
    """Its rate / the median rate at the last look."""
    for_s: float


@dataclass
class StragglerWatch:
    """Looks at every rank's rates over time; a rank slow for `hold_s` without a break is a straggler."""

    factor: float
    hold_s: float
    slow_since: dict[Hashable, float] = field(default_factory=dict)
    said: set[Hashable] = field(default_factory=set)
    """Stragglers already told (the launch's console says each once)."""

    def look(self, now: float, rates: Mapping[Hashable, float | None]) -> dict[Hashable, Straggler]:
        """The stragglers as of this look (keys of ranks no longer slow are forgotten)."""
        slow = slow_ranks(rates, self.factor)
        self.slow_since = {key: self.slow_since.get(key, now) for key in slow}
        return {key: Straggler(key, share, now - self.slow_since[key]) for key, share in slow.items()
                if now - self.slow_since[key] >= self.hold_s}

    def new(self, found: Mapping[Hashable, Straggler]) -> list[Straggler]:
        """The stragglers of `found` not told before, once each."""
        fresh = [s for key, s in found.items() if key not in self.said]
        self.said.update(found)
        return fresh


def straggler_line(found: Straggler, node: str) -> str:
    """`straggler: node-1 r3 at 0.45x the median rate for 60 s`: what a launch's console and `inv status` say."""
    return f"straggler: {node} r{found.key} at {found.share:.2f}x the median rate for {found.for_s:.0f} s"
