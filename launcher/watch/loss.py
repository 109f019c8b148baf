"""What the run learns (pure): each rank's loss as its node's beats carry it (the workers' hook reads the scalar that
`backward` is called on, launcher/node/worker/hook.py; launcher/node/agent/records.py passes it on), and three rules:

- **Non-finite**: a rank whose loss was NaN or infinite at a step its optimizer took (torch's GradScaler skips a
  step whose gradients overflowed: such a step is counted, never flagged). Said at once, with the first step and
  rank; in data parallelism the all-reduce carries it to every rank at the next step, so the first is the cause.
  A non-finite loss that the optimizer stepped on has poisoned the weights of every rank: `--on-nonfinite stop`
  (the default) ends the run there, before it burns hours and writes NaN checkpoints over good ones.
- **Outlier**: the same data distribution gives every rank about the same mean loss; a rank whose mean over the
  window is `LOSS_OUTLIER_RATIO` x the median (`outlier_ratios`) for `LOSS_OUTLIER_STEPS` steps is reading other data
  (a corrupt shard, shuffled labels) and averages its gradients into everyone's. Only positive losses (a ratio of
  log-likelihoods that can be negative says nothing), only above (a rank that learns faster is no alarm).
- **Spike**: the median rank's mean loss `LOSS_SPIKE_RATIO` x its lowest so far, on `LOSS_SPIKE_LOOKS` looks in a row:
  a spike or a divergence. A mark on the page and a line, never a stop: runs recover from spikes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

LOSS_OUTLIER_RATIO = 2.0
"""A rank whose mean loss over the window is this many times the median of the others' reads other data
(launcher/watch/loss.py): ranks of one data distribution sit within tens of percent of each other."""
LOSS_OUTLIER_STEPS = 100
"""... once it has sat there for this many of its steps (a few unlucky batches are no shard)."""
LOSS_SPIKE_RATIO = 3.0
"""The median rank's mean loss this many times its lowest so far is a spike, or a divergence."""
NONFINITE_WAIT_S = 5.0
"""A non-finite loss is told once every rank is known through its step, or this long after it was first seen: the
all-reduce carries a NaN to every rank at the next step, and the node whose beat comes first would name a follower
(a rank 0 whose step 41 went NaN from rank 1's step 40)."""
LOSS_SPIKE_LOOKS = 3
"""... on this many looks in a row (the beats: a second apart)."""
NONFINITE_EXIT = 65
"""The launcher's exit code when it stopped a run whose loss went NaN or infinite (`--on-nonfinite stop`): sysexits'
EX_DATAERR (the data, or what the run made of it, went wrong), a code no shell and no torchrun gives."""
NON_FINITE = ("nan", "inf", "-inf")
"""A non-finite loss as the beats carry it (JSON has no NaN)."""


def loss_value(value: Any) -> float | None:
    """A beat's loss as a float (nan and the infinities too); None where there is none."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value in NON_FINITE:
        return float(value)
    return None


def loss_text(value: Any) -> str:
    """A loss as the console says it: 4 significant digits, `nan`, `inf`."""
    number = loss_value(value)
    if number is None:
        return "-"
    return str(value) if not math.isfinite(number) else f"{number:.4g}"


def outlier_ratios(means: Mapping[int, float], ratio: float = LOSS_OUTLIER_RATIO) -> dict[int, float]:
    """{rank: its mean loss / the median of the others'} of the ranks whose mean is `ratio` x the median (every
    rank's from three ranks on: one low rank among few others would halve the others' median; the other rank's of
    two); none under two ranks or for losses that are not positive."""
    if len(means) < 2:
        return {}
    middle = statistics.median(means.values())
    found = {}
    for rank, mean in means.items():
        median = statistics.median([m for other, m in means.items() if other != rank])
        against = middle if len(means) > 2 else median
        if median > 0 and against > 0 and mean >= ratio * against:
            found[rank] = round(mean / median, 2)
    return found


@dataclass(frozen=True)
class NonFinite:
    """A rank's first step whose loss was not finite."""

    rank: int
    node: str
    step: int
    value: str
    last_finite: float | None
    last_finite_step: int | None
    followed: tuple[tuple[int, int], ...] = ()
    """(rank, its first non-finite step) of the ranks that went non-finite after it (the all-reduce)."""

    kind = "nonfinite"

    def line(self) -> str:
        before = (
            f"its last finite: {loss_text(self.last_finite)} at step {self.last_finite_step:,}"
            if self.last_finite is not None and self.last_finite_step
            else "no finite loss before it"
        )
        if self.followed:
            after = ", ".join(f"rank {rank} at step {step:,}" for rank, step in self.followed)
            others = f"the others followed ({after}): the all-reduce carries it"
        else:
            others = "the other ranks' losses are finite"
        return f"rank {self.rank} ({self.node}): loss is {self.value} at step {self.step:,} ({before}); {others}"


@dataclass(frozen=True)
class Outlier:
    """A rank whose mean loss sits far above the others'."""

    rank: int
    node: str
    ratio: float
    steps: int

    kind = "outlier"

    def line(self) -> str:
        return (
            f"rank {self.rank} ({self.node}): its loss has been {self.ratio:.1f}x the median of the other ranks "
            f"for {self.steps:,} steps: its data?"
        )


@dataclass(frozen=True)
class Spike:
    """The run's loss well above its lowest, for a while."""

    step: int
    value: float
    low: float
    low_step: int

    kind = "spike"

    def line(self) -> str:
        return (
            f"the loss rose to {loss_text(self.value)} at step {self.step:,}, {self.value / self.low:.1f}x its low "
            f"of {loss_text(self.low)} (step {self.low_step:,}): a spike, or the run diverges"
        )


Finding = NonFinite | Outlier | Spike


@dataclass
class _Rank:
    node: str
    step: int | None = None
    loss: Any = None
    mean: float | None = None
    nonfinite: Mapping[str, Any] | None = None
    skipped: int = 0


@dataclass
class LossWatch:
    """The rules over the beats, each finding said once (an outlier again once it has cleared)."""

    outlier_ratio: float = LOSS_OUTLIER_RATIO
    outlier_steps: int = LOSS_OUTLIER_STEPS
    spike_ratio: float = LOSS_SPIKE_RATIO
    spike_looks: int = LOSS_SPIKE_LOOKS
    ranks: dict[int, _Rank] = field(default_factory=dict)
    told_nonfinite: bool = False
    nonfinite_seen: float | None = None
    """When (the caller's clock) a non-finite loss was first seen, until it is told."""
    nonfinite_wait_s: float = NONFINITE_WAIT_S
    nodes: frozenset[str] = frozenset()
    """The run's nodes: a non-finite loss waits for a beat of each (one not heard from yet may hold the first)."""
    outlying_since: dict[int, int] = field(default_factory=dict)
    """rank -> its step when it first sat above the others (cleared when it no longer does)."""
    told_outliers: set[int] = field(default_factory=set)
    low: tuple[float, int] | None = None
    """The median rank's lowest mean loss so far, and the step it was at."""
    high_looks: int = 0
    told_spike: bool = False

    def feed(self, node: str, ranks: Iterable[Mapping[str, Any]]) -> None:
        """One node's beat: its ranks' loss fields."""
        for found in ranks:
            if "loss" not in found:
                continue
            rank = self.ranks.setdefault(int(found["rank"]), _Rank(node))
            rank.node, rank.loss, rank.step = node, found.get("loss"), found.get("loss_step")
            mean = found.get("loss_mean")
            rank.mean = float(mean) if isinstance(mean, int | float) and math.isfinite(mean) else None
            rank.nonfinite = found.get("nonfinite") or None
            rank.skipped = int(found.get("loss_skipped") or 0)

    def look(self, now: float = 0.0) -> list[Finding]:
        """What is new since the last look, at `now` (seconds, any clock the caller keeps)."""
        found: list[Finding] = []
        first = self._nonfinite(now)
        if first is not None:
            found.append(first)
        found.extend(self._outliers())
        spike = self._spike()
        if spike is not None:
            found.append(spike)
        return found

    def first_nonfinite(self) -> NonFinite | None:
        """The rank that went non-finite first, whether told or not (the hang's and the end's words)."""
        bad = {rank: r for rank, r in self.ranks.items() if r.nonfinite}
        if not bad:
            return None
        rank, first = min(bad.items(), key=lambda item: (int(item[1].nonfinite["step"]), item[0]))  # type: ignore[index]
        info = first.nonfinite
        assert info is not None
        followed = tuple(
            sorted(
                ((other, int(r.nonfinite["step"])) for other, r in bad.items() if other != rank and r.nonfinite),
                key=lambda item: (item[1], item[0]),
            )
        )
        last = info.get("last_finite")
        return NonFinite(
            rank,
            first.node,
            int(info["step"]),
            str(info.get("value") or "nan"),
            float(last) if isinstance(last, int | float) else None,
            info.get("last_finite_step"),
            followed,
        )

    def _nonfinite(self, now: float) -> NonFinite | None:
        if self.told_nonfinite:
            return None
        first = self.first_nonfinite()
        if first is None:
            return None
        self.nonfinite_seen = now if self.nonfinite_seen is None else self.nonfinite_seen
        heard = {r.node for r in self.ranks.values()} >= self.nodes
        known = heard and all(r.nonfinite or (r.step or 0) >= first.step for r in self.ranks.values())
        if not known and now - self.nonfinite_seen < self.nonfinite_wait_s:
            return None  # a rank not heard from through that step may have gone non-finite before it
        self.told_nonfinite = True
        return first

    def _outliers(self) -> list[Outlier]:
        means = {rank: r.mean for rank, r in self.ranks.items() if r.mean is not None and r.step}
        high = outlier_ratios(means, self.outlier_ratio)
        found = []
        for rank in means:
            step = int(self.ranks[rank].step or 0)
            if rank not in high:
                self.outlying_since.pop(rank, None)
                self.told_outliers.discard(rank)
                continue
            since = self.outlying_since.setdefault(rank, step)
            if step - since >= self.outlier_steps and rank not in self.told_outliers:
                self.told_outliers.add(rank)
                found.append(Outlier(rank, self.ranks[rank].node, high[rank], step - since))
        return found

    def _spike(self) -> Spike | None:
        means = [r.mean for r in self.ranks.values() if r.mean is not None]
        steps = [r.step for r in self.ranks.values() if r.step]
        if not means or not steps:
            return None
        median, step = statistics.median(means), max(steps)
        if self.low is None or median < self.low[0]:
            self.low = (median, step)
        low, low_step = self.low
        if low <= 0 or median < self.spike_ratio * low:
            self.high_looks = 0
            if median < (1 + self.spike_ratio) / 2 * low:
                self.told_spike = False  # back down: a later spike is told again
            return None
        self.high_looks += 1
        if self.high_looks < self.spike_looks or self.told_spike:
            return None
        self.told_spike = True
        return Spike(step, median, low, low_step)
