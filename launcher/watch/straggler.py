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
Rates and shares come from each rank's progress record or its lines (launcher/node/top.py). A slow rank is a
*straggler* once it has been slow for `hold_s` without a break. `inv top --once` judges one look (hold 0).

An attached launch (`LaunchStragglers`) reads each node's `alive` beats (its ranks' rates and forward shares, with the
watch on): a new straggler of the whole run is told once on the console and kept in `logs/<run id>/stragglers.txt`,
where `inv status` finds it (`stragglers_of`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from launcher.limits import FORWARD_GAP, STRAGGLER_WINDOW_S
from launcher.options import Options
from launcher.watch.arrival import ArrivalBook, Late

FILE = "stragglers.txt"


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


def late_ranks(late: Mapping[Hashable, Late], factor: float) -> dict[Hashable, Late]:
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

    def look(self, now: float, rates: Mapping[Hashable, float | None],
             forward: Mapping[Hashable, float | None] | None = None,
             late: Mapping[Hashable, Late] | None = None) -> dict[Hashable, Straggler]:
        """The stragglers as of this look (keys of ranks no longer slow are forgotten). When no rank is slow by its
        rate (the rates agree, as in lockstep DDP): the arrival rule where `late` is known (every rank's
        collectives: `ArrivalBook.lateness`, {} when no rank is late), else the forward rule."""
        found = {key: Straggler(key, share, 0.0) for key, share in slow_ranks(rates, self.factor).items()}
        known = {key: rate for key, rate in rates.items() if rate is not None}
        median = statistics.median(known.values()) if known else 0.0
        if not found and late is not None:
            found = {key: Straggler(key, _of(rates.get(key), median), 0.0, late=behind,
                                    lost_s=round(behind.wait_share / median, 3) if median > 0 else None)
                     for key, behind in late_ranks(late, self.factor).items()}
        elif not found:
            found = {key: Straggler(key, _of(rates.get(key), median), 0.0, share, middle)
                     for key, (share, middle) in heavy_ranks(forward or {}, self.factor).items()}
        self.slow_since = {key: self.slow_since.get(key, now) for key in found}
        return {key: replace(straggler, for_s=now - self.slow_since[key]) for key, straggler in found.items()
                if now - self.slow_since[key] >= self.hold_s}

    def new(self, found: Mapping[Hashable, Straggler]) -> list[Straggler]:
        """The stragglers of `found` not told before, once each."""
        fresh = [s for key, s in found.items() if key not in self.said]
        self.said.update(found)
        return fresh


def _of(rate: float | None, median: float) -> float | None:
    return rate / median if rate is not None and median > 0 else None


def straggler_line(found: Straggler, node: str, one_look: bool = False) -> str:
    """What a launch's console and `inv status` say: `straggler: node-1 r3 at 0.45x the median rate for 60 s`,
    `straggler: node-1 r3 enters the collectives last: the others wait 0.15 s a step for it (62% of their time)`, or
    `straggler: node-1 r3: 41% of each step computing (forward) against a median of 23%; the others wait for it`."""
    if found.late is not None:
        wait = f"wait {found.lost_s:.2f} s a step for it" if found.lost_s is not None else "wait for it"
        return (f"straggler: {node} r{found.key} enters the collectives last ({found.late.last_share:.0%} of them): "
                f"the others {wait} ({found.late.wait_share:.0%} of their time)")
    if found.forward is not None:
        return (f"straggler: {node} r{found.key}: {found.forward:.0%} of each step computing (forward) against a "
                f"median of {found.median_forward or 0.0:.0%}; the others wait for it")
    held = "" if one_look else f" for {found.for_s:.0f} s"  # one look (`inv top --once`, status) holds nothing
    return f"straggler: {node} r{found.key} at {found.share or 0.0:.2f}x the median rate{held}"


class LaunchStragglers:
    """The straggler rule over an attached launch's beats; each new straggler said and kept."""

    def __init__(self, opts: Options, run_id: str, say: Callable[[str], None], book: ArrivalBook):
        self.path = opts.log_dir / run_id / FILE
        self.say = say
        self.watch = StragglerWatch(opts.straggler_factor, opts.straggler_hold)
        self.book = book
        """The run's collectives, fed from the same beats by the hang check (`HangCheck.observe`, before a beat
        reaches here): beats carry the ranks' progress only while hangs are watched for."""
        self.rates: dict[str, dict[int, float | None]] = {}
        self.forward: dict[str, dict[int, float | None]] = {}
        self.node_of: dict[int, str] = {}

    def beat(self, node: str, progress: Iterable[Mapping[str, Any]]) -> None:
        """One node's beat: its ranks' rates and forward shares now; any new straggler of the whole run is told."""
        progress = list(progress)
        self.rates[node] = {int(r["rank"]): r.get("steps_per_s") for r in progress}
        self.forward[node] = {int(r["rank"]): r.get("forward_share") for r in progress}
        self.node_of.update({rank: node for rank in self.rates[node]})
        merged = {rank: rate for rates in self.rates.values() for rank, rate in rates.items()}
        forward = {rank: share for shares in self.forward.values() for rank, share in shares.items()}
        late = lateness(self.book, time.time())
        for found in self.watch.new(self.watch.look(time.monotonic(), merged, forward, late)):
            line = straggler_line(found, self.node_of.get(found.key, "?"))  # type: ignore[call-overload]
            self.say(line)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as handle:
                    handle.write(line + "\n")
            except OSError:
                pass  # the console said it: a log folder that cannot be written is told elsewhere


def lateness(book: ArrivalBook, now: float) -> dict[Hashable, Late] | None:
    """What the arrival rule reads at wall time `now`: every rank's lateness over the window ({} until every rank's
    arrivals cover it), where the run's recorders keep its collectives (None otherwise: the forward rule then)."""
    if not book.recording():
        return None
    return dict(book.lateness(now, STRAGGLER_WINDOW_S) or {})


def stragglers_of(log_dir: Path, run_id: str) -> list[str]:
    """The stragglers an attached launch told for a run (for `inv status`)."""
    try:
        return (log_dir / run_id / FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
