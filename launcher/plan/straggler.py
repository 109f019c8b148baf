"""Stragglers (pure): a rank that holds the others back, for long enough.

Data parallel training runs at the pace of its slowest rank: every all_reduce waits for it. Two ways to see it:
- By rate, for ranks that do not synchronise (or count their steps before the wait): a rank is *slow* when its
  rate is below `factor` x the median of all ranks with a rate (two at least).
- By forward share, in lockstep DDP, where every rank has the same step rate: the slow rank spends more of each
  step computing its forward (the others wait for it in backward's all_reduce). When no rank is slow by rate, a
  rank whose forward share is above the median / `factor` and at least `FORWARD_GAP` above it is *slow*.
Rates and shares come from each rank's progress record or its lines (launcher/node/top.py). A slow rank is a
*straggler* once it has been slow for `hold_s` without a break. `inv top --once` judges one look (hold 0).
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from launcher.limits import FORWARD_GAP


def slow_ranks(rates: Mapping[Hashable, float | None], factor: float) -> dict[Hashable, float]:
    """{rank: its rate / the median rate} of the ranks below `factor` x the median; none under two rates."""
    known = {key: rate for key, rate in rates.items() if rate is not None}
    if len(known) < 2:
        return {}
    median = statistics.median(known.values())
    if median <= 0:
        return {}
    return {key: rate / median for key, rate in known.items() if rate < factor * median}


def heavy_ranks(shares: Mapping[Hashable, float | None], factor: float, gap: float = FORWARD_GAP
                ) -> dict[Hashable, tuple[float, float]]:
    """{rank: (its forward share, the median share)} of the ranks whose share of each step spent in the forward is
    above the median / `factor` and at least `gap` above it; none under two shares."""
    known = {key: share for key, share in shares.items() if share is not None}
    if len(known) < 2:
        return {}
    median = statistics.median(known.values())
    return {key: (share, median) for key, share in known.items() if share > median / factor and share - median >= gap}


@dataclass
class Straggler:
    """A rank flagged: how far below the median it is (rate) or how much more it computes (forward), and for how
    long it has been."""

    key: Hashable
    share: float | None
    """Its rate / the median rate at the last look (None: no rate)."""
    for_s: float
    forward: float | None = None
    """Flagged by its forward: its share of each step spent in the forward, at the last look."""
    median_forward: float | None = None
    """... and the median rank's."""

    @property
    def kind(self) -> str:
        """`rate` or `forward`: which rule flagged it."""
        return "rate" if self.forward is None else "forward"


@dataclass
class StragglerWatch:
    """Looks at every rank's rates (and forward shares) over time; a rank slow for `hold_s` without a break is a
    straggler."""

    factor: float
    hold_s: float
    slow_since: dict[Hashable, float] = field(default_factory=dict)
    said: set[Hashable] = field(default_factory=set)
    """Stragglers already told (the launch's console says each once)."""

    def look(self, now: float, rates: Mapping[Hashable, float | None],
             forward: Mapping[Hashable, float | None] | None = None) -> dict[Hashable, Straggler]:
        """The stragglers as of this look (keys of ranks no longer slow are forgotten). The forward rule applies
        when no rank is slow by its rate: the rates agree, as in lockstep DDP."""
        slow: dict[Hashable, tuple[float | None, float | None, float | None]] = {
            key: (share, None, None) for key, share in slow_ranks(rates, self.factor).items()}
        if not slow:
            known = {key: rate for key, rate in rates.items() if rate is not None}
            median = statistics.median(known.values()) if known else 0.0
            slow = {key: (rates[key] / median if rates.get(key) is not None and median > 0 else None, share, middle)
                    for key, (share, middle) in heavy_ranks(forward or {}, self.factor).items()}
        self.slow_since = {key: self.slow_since.get(key, now) for key in slow}
        return {key: Straggler(key, share, now - self.slow_since[key], mine, middle)
                for key, (share, mine, middle) in slow.items() if now - self.slow_since[key] >= self.hold_s}

    def new(self, found: Mapping[Hashable, Straggler]) -> list[Straggler]:
        """The stragglers of `found` not told before, once each."""
        fresh = [s for key, s in found.items() if key not in self.said]
        self.said.update(found)
        return fresh


def straggler_line(found: Straggler, node: str) -> str:
    """What a launch's console and `inv status` say: `straggler: node-1 r3 at 0.45x the median rate for 60 s`, or
    `straggler: node-1 r3: 41% of each step computing (forward) against a median of 23%; the others wait for it`."""
    if found.forward is not None:
        return (f"straggler: {node} r{found.key}: {found.forward:.0%} of each step computing (forward) against a "
                f"median of {found.median_forward or 0.0:.0%}; the others wait for it")
    return f"straggler: {node} r{found.key} at {found.share or 0.0:.2f}x the median rate for {found.for_s:.0f} s"
