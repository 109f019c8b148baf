"""Stragglers (pure): a rank that holds the others back, for long enough.

Data parallel training runs at the pace of its slowest rank: every all_reduce waits for it. The ways to see it:
- By rate, for ranks that do not synchronise (or count their steps before the wait): a rank is *slow* when its
  rate is below `factor` x the median of all ranks with a rate (two at least).
- By arrival, in lockstep data parallelism, where every rank has the same step rate: the slow rank is the one that
  enters the collectives last (`launcher.watch.arrival`, from every rank's flight recorder). When no rank is slow by
  rate, the rank that causes most of the others' wait is *slow* when they wait for it at least 1 - `factor` of
  their time (0.2 by default: without it they would run 1.25x as fast). A rank that waits is never flagged.
- By forward share, only where the collectives are not known (torch before 2.7): the slow rank spends more of each
  step between a batch and its backward; a rank whose forward share is above the median / `factor` and at least
  `FORWARD_GAP` above it is *slow*. On a GPU that time is someone else's wait (CUDA is asynchronous), and under
  the HF Trainer an all_gather sits in it: the arrival rule replaces it wherever it can.
Rates and shares come from each rank's progress record or its lines (launcher/node/agent/sampler.py). A slow rank is a
*straggler* once it has been slow for `hold_s` without a break. `inv top --once` judges one look (hold 0).

An attached launch applies it to each node's `alive` beats (`launcher.run.launchstragglers`); the words are
`launcher.report.stragglerline`.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.limits import FORWARD_GAP, STRAGGLER_WINDOW_S
from launcher.watch.arrival import Arrivals, Late


def slow_ranks(rates: Mapping[Any, float | None], factor: float) -> dict[Hashable, float]:
    """{rank: its rate / the median rate} of the ranks below `factor` x the median; none under two rates."""
    known = {key: rate for key, rate in rates.items() if rate is not None}
    if len(known) < 2:
        return {}
    median = statistics.median(known.values())
    if median <= 0:
        return {}
    return {key: rate / median for key, rate in known.items() if rate < factor * median}


def heavy_ranks(
    shares: Mapping[Any, float | None], factor: float, gap: float = FORWARD_GAP
) -> dict[Hashable, tuple[float, float]]:
    """{rank: (its forward share, the median share)} of the ranks whose share of each step spent in the forward is
    above the median / `factor` and at least `gap` above it; none under two shares."""
    known = {key: share for key, share in shares.items() if share is not None}
    if len(known) < 2:
        return {}
    median = statistics.median(known.values())
    return {key: (share, median) for key, share in known.items() if share > median / factor and share - median >= gap}


def late_ranks(late: Mapping[Any, Late], factor: float) -> dict[Hashable, Late]:
    """{rank: its lateness} of the rank the others wait for most, when they wait for it at least 1 - `factor` of
    their time and it causes most of their wait."""
    if not late:
        return {}
    key, worst = max(late.items(), key=lambda item: item[1].wait_share)
    total = sum(found.wait_share for found in late.values())
    if worst.wait_share >= 1.0 - factor and worst.wait_share > total / 2:
        return {key: worst}
    return {}


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
    late: Late | None = None
    """Flagged by its arrival: how long the others wait for it."""
    lost_s: float | None = None
    """... in seconds a step (the others' wait for it over the median step rate; None without a rate)."""

    @property
    def kind(self) -> str:
        """`rate`, `arrival` or `forward`: which rule flagged it."""
        return "arrival" if self.late is not None else "rate" if self.forward is None else "forward"


@dataclass
class StragglerWatch:
    """Looks at every rank's rates (and forward shares) over time; a rank slow for `hold_s` without a break is a
    straggler."""

    factor: float
    hold_s: float
    slow_since: dict[Hashable, float] = field(default_factory=dict)
    said: set[Hashable] = field(default_factory=set)
    """Stragglers already told (the launch's console says each once)."""

    def look(
        self,
        now: float,
        rates: Mapping[Any, float | None],
        forward: Mapping[Any, float | None] | None = None,
        late: Mapping[Any, Late] | None = None,
    ) -> dict[Hashable, Straggler]:
        """The stragglers as of this look (keys of ranks no longer slow are forgotten). When no rank is slow by its
        rate (the rates agree, as in lockstep DDP): the arrival rule where `late` is known (every rank's
        collectives: `Arrivals.lateness`, {} when no rank is late), else the forward rule."""
        found = {key: Straggler(key, share, 0.0) for key, share in slow_ranks(rates, self.factor).items()}
        known = {key: rate for key, rate in rates.items() if rate is not None}
        median = statistics.median(known.values()) if known else 0.0
        if not found and late is not None:
            found = {
                key: Straggler(
                    key,
                    _of(rates.get(key), median),
                    0.0,
                    late=behind,
                    lost_s=round(behind.wait_share / median, 3) if median > 0 else None,
                )
                for key, behind in late_ranks(late, self.factor).items()
            }
        elif not found:
            found = {
                key: Straggler(key, _of(rates.get(key), median), 0.0, share, middle)
                for key, (share, middle) in heavy_ranks(forward or {}, self.factor).items()
            }
        self.slow_since = {key: self.slow_since.get(key, now) for key in found}
        return {
            key: replace(straggler, for_s=now - self.slow_since[key])
            for key, straggler in found.items()
            if now - self.slow_since[key] >= self.hold_s
        }

    def new(self, found: Mapping[Hashable, Straggler]) -> list[Straggler]:
        """The stragglers of `found` not told before, once each."""
        fresh = [s for key, s in found.items() if key not in self.said]
        self.said.update(found)
        return fresh


def _of(rate: float | None, median: float) -> float | None:
    return rate / median if rate is not None and median > 0 else None


def lateness(arrivals: Arrivals, now: float) -> dict[int, Late] | None:
    """What the arrival rule reads at wall time `now`: every rank's lateness over the window ({} until every rank's
    arrivals cover it), where the run's recorders keep its collectives (None otherwise: the forward rule then)."""
    if not arrivals.recording():
        return None
    return dict(arrivals.lateness(now, STRAGGLER_WINDOW_S) or {})
