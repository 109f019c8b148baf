"""The run's timeline as data (pure): each node's series (launcher/node/agent/series.py, samples of totals) turned into
rates on the launcher's clock, seconds from the command's start: steps per second and the share of time waiting for
data per rank, CPU (the ranks' own processes, in % of one core), memory and GPUs per node; and, for many ranks, the
bands the page draws instead of a line each (the median, the middle half, the extremes) with the slowest ranks named.

A rank's steps per second come from its steps' own times (its first optimizer step, then each sample's count with
its last step's time), never from when a sample happened to look: the 5 s samples of a run that trains for one
second, or the time before its first step, would say a tenth of its rate. Its mean is the rate a training loop says
of itself: the steps from its first optimizer step to its last, over the time between.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.limits import REPORT_NAMED, REPORT_POINTS
from launcher.settings import STRAGGLER_FACTOR

GIB = float(1 << 30)
CPU, RSS, STEPS, BATCHES, DATA_S, FORWARD_S, T_STEP, LOSS_SUM, LOSS_N, LOSS = range(10)
"""The places of a rank's numbers in a sample (launcher/node/agent/series.py; an older node's has fewer: T_STEP and
the loss's are absent)."""
STILL_S = 1.0
"""A rank whose count has not moved for two of its steps and this long is drawn at 0 steps/s from then: its record is
rewritten at most every 0.1 s (launcher/node/common/bounds.py RECORD_FLUSH_S), so a count that old is one that
stopped."""

Values = tuple[float | None, ...]


@dataclass(frozen=True)
class RankLine:
    node: str
    rank: int
    t: tuple[float, ...]
    """The samples' times (data_share's)."""
    steps_per_s: Values
    """Steps a second over the stretch that ends at the same place of `step_t` (its first value: where it began)."""
    data_share: Values
    step_t: tuple[float, ...] = ()
    rate: float | None = None
    """Steps a second from its first optimizer step to its last (each process's, when it started again)."""
    steps: int | None = None
    """Its last count of optimizer steps (its last process's)."""
    data_mean: float | None = None
    """Its share of time waiting for data, over the samples' stretches in which it drew batches."""
    loss: LossLine | None = None
    """Its loss (None: the hook read none)."""

    def mean_rate(self) -> float | None:
        return self.rate


@dataclass(frozen=True)
class LossLine:
    """A rank's loss over the run: the mean of its steps' losses over each stretch between samples."""

    t: tuple[float, ...]
    mean: Values
    last: float | str | None
    """Its last step's loss (`nan`, `inf`: where it went non-finite)."""
    low: float | None
    """The lowest stretch's mean."""
    nonfinite_t: float | None = None
    """When a sample first found its last loss non-finite."""
    nonfinite_steps: int | None = None
    """... and the rank's step count then."""


@dataclass(frozen=True)
class NodeLine:
    node: str
    t: tuple[float, ...]
    cpu_percent: Values
    """The node's ranks' own processes together, in % of one core."""
    mem_gib: Values
    """The node's memory in use (total less available)."""
    gpus: tuple[tuple[int, tuple[float, ...], Values, Values], ...] = ()
    """(GPU index, times, utilisation %, memory used GiB) of each GPU of the run."""


@dataclass(frozen=True)
class Band:
    """A figure's many lines as one band over time buckets: the extremes, the middle half, the median."""

    t: tuple[float, ...]
    low: tuple[float, ...]
    q1: tuple[float, ...]
    median: tuple[float, ...]
    q3: tuple[float, ...]
    high: tuple[float, ...]


@dataclass(frozen=True)
class Timeline:
    ranks: tuple[RankLine, ...]
    nodes: tuple[NodeLine, ...]
    end: float
    """The last sample's time."""

    def slowest(self) -> tuple[RankLine, ...]:
        """The ranks whose mean step rate is below the straggler factor's share of the median rank's, slowest first,
        REPORT_NAMED at most: the page names them."""
        rated = [r for r in self.ranks if r.mean_rate() is not None]
        if not rated:
            return ()
        median = statistics.median(r.mean_rate() or 0.0 for r in rated)
        slow = [r for r in rated if (r.mean_rate() or 0.0) < STRAGGLER_FACTOR * median]
        return tuple(sorted(slow, key=lambda r: (r.mean_rate() or 0.0, r.rank))[:REPORT_NAMED])


def timeline(
    series: Mapping[str, Sequence[Mapping[str, Any]]],
    offset: Mapping[str, float],
    began: float,
    first_steps: Mapping[tuple[str, int], float] | None = None,
) -> Timeline:
    """Every node's samples as lines on the launcher's clock (each a node's time moved by its clock's offset);
    `first_steps`: each (node, rank)'s first optimizer step on that clock (its start phases), where its steps begin."""
    ranks, nodes, end = [], [], 0.0
    for node, samples in series.items():
        samples = sorted((s for s in samples if isinstance(s.get("t"), int | float)), key=lambda s: s["t"])
        shift = offset.get(node, 0.0) - began
        pairs = list(itertools.pairwise(samples))
        if not pairs:
            continue
        end = max(end, samples[-1]["t"] + shift)
        times = tuple(round(s["t"] + shift, 2) for s in samples)  # a rate's line begins where its first stretch does
        for rank in sorted({int(k) for s in samples for k in s.get("ranks", {})}):
            steps = step_line(samples, str(rank), shift, (first_steps or {}).get((node, rank)))
            step_t, rates = _thin(steps.t, steps.rates)
            t, data = _thin(times, _stretches(tuple(_share(a, b, str(rank), DATA_S) for a, b in pairs)))
            ranks.append(
                RankLine(
                    node,
                    rank,
                    t,
                    rates,
                    data,
                    step_t,
                    steps.rate,
                    steps.count,
                    _data_mean(pairs, str(rank)),
                    loss_line(samples, str(rank), shift),
                )
            )
        cpu = _stretches(tuple(_cpu(a, b) for a, b in pairs))
        mem = tuple(None if s.get("mem_used") is None else s["mem_used"] / GIB for s in samples)
        thinned, cpu_thinned, mem_thinned = _thin(times, cpu, mem)
        nodes.append(NodeLine(node, thinned, cpu_thinned, mem_thinned, gpus=_gpus(samples, shift)))
    return Timeline(tuple(sorted(ranks, key=lambda r: r.rank)), tuple(nodes), round(end, 1))


def _stretches(values: Values) -> Values:
    """Rates between samples, one a stretch, placed at both its ends' samples' times as the page draws them (steps:
    each value back to the point before it): the first stretch's value at the first sample too."""
    return values[:1] + values


@dataclass(frozen=True)
class StepLine:
    t: tuple[float, ...]
    rates: Values
    rate: float | None
    count: int | None


def step_line(samples: Sequence[Mapping[str, Any]], rank: str, shift: float, first: float | None) -> StepLine:
    """A rank's steps/s from its steps' own times: a stretch from each count to the next (the first from its first
    optimizer step, count 1; a sample without its last step's time counts at its own); a count that fell is a process
    that started again (a gap, then a new first count); a count still for two of its steps and STILL_S reads 0 from
    that sample on. The mean: the steps of the stretches over their seconds."""
    moves: list[tuple[float, int]] = [] if first is None else [(first, 1)]
    t: list[float] = []
    rates: list[float | None] = []
    done, spent, count, resumed = 0, 0.0, None, None
    for sample in samples:
        numbers = _numbers(sample, rank)
        if numbers is None or not numbers[STEPS]:
            continue  # no record, or no step yet
        count, seen = numbers[STEPS], sample["t"] + shift
        when = seen if len(numbers) <= T_STEP or numbers[T_STEP] is None else numbers[T_STEP] + shift
        if moves and count < moves[-1][1]:  # a process that started again: a gap in the line, then its own counts
            if t:
                t.append(t[-1])
                rates.append(None)
            moves = []
        if not moves:
            moves, resumed = [(when, count)], None
            continue
        at, before = moves[-1]
        if count == before:
            if len(moves) > 1 and seen - at > 2 * (at - moves[-2][0]) / (before - moves[-2][1]) + STILL_S:
                t.append(round(seen, 2))
                rates.append(0.0)
                resumed = seen
            continue
        if when <= at:
            continue
        since = resumed if resumed is not None and resumed < when else at
        rate = round((count - before) / (when - since), 3)
        if len(moves) == 1:
            t.append(round(at, 2))
            rates.append(rate)
        t.append(round(when, 2))
        rates.append(rate)
        done, spent, resumed = done + count - before, spent + when - at, None
        moves.append((when, count))
    return StepLine(tuple(t), tuple(rates), round(done / spent, 3) if spent > 0 else None, count)


def loss_line(samples: Sequence[Mapping[str, Any]], rank: str, shift: float) -> LossLine | None:
    """A rank's loss from its samples' totals of finite losses: each stretch's mean (a total lower than before is a
    process that started again: its own totals); None where no sample has one."""
    t: list[float] = []
    means: list[float | None] = []
    before, last, nonfinite = (0.0, 0), None, None  # type: tuple[float, int], Any, tuple[float, int | None] | None
    for sample in samples:
        numbers = _numbers(sample, rank)
        if numbers is None or len(numbers) <= LOSS or numbers[LOSS_N] is None:
            continue
        total, count = float(numbers[LOSS_SUM]), int(numbers[LOSS_N])
        if count < before[1]:
            before = (0.0, 0)
        if count > before[1]:
            t.append(round(sample["t"] + shift, 2))
            means.append((total - before[0]) / (count - before[1]))
        before, last = (total, count), numbers[LOSS]
        if nonfinite is None and isinstance(last, str):
            nonfinite = (round(sample["t"] + shift, 2), numbers[STEPS])
    if not t and last is None:
        return None
    thinned_t, thinned = _thin_exact(tuple(t), tuple(means))
    known = [m for m in means if m is not None]
    return LossLine(thinned_t, thinned, last, min(known) if known else None, *(nonfinite or (None, None)))


def _thin_exact(t: tuple[float, ...], values: Values) -> tuple[tuple[float, ...], Values]:
    """`_thin` without rounding (a loss of 1e-4 is no 0)."""
    if len(t) <= REPORT_POINTS:
        return t, values
    size = -(-len(t) // REPORT_POINTS)
    groups = range(0, len(t), size)
    kept = [[v for v in values[i : i + size] if v is not None] for i in groups]
    return (
        tuple(t[min(i + size, len(t)) - 1] for i in groups),
        tuple(sum(found) / len(found) if found else None for found in kept),
    )


def _data_mean(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], rank: str) -> float | None:
    """The share of time waiting for data over the stretches between two samples in which the rank drew batches
    (the time before its loop, or after it, is no wait for data)."""
    waited = spent = 0.0
    for a, b in pairs:
        before, after = _numbers(a, rank), _numbers(b, rank)
        if before is None or after is None or None in (before[BATCHES], after[BATCHES], before[DATA_S], after[DATA_S]):
            continue
        if after[BATCHES] > before[BATCHES]:
            waited += after[DATA_S] - before[DATA_S]
            spent += b["t"] - a["t"]
    return round(min(1.0, max(0.0, waited / spent)), 3) if spent > 0 else None


def _numbers(sample: Mapping[str, Any], rank: str) -> list[Any] | None:
    found = (sample.get("ranks") or {}).get(rank)
    return found if isinstance(found, list) and len(found) > FORWARD_S else None


def _rate(a: Mapping[str, Any], b: Mapping[str, Any], rank: str, at: int) -> float | None:
    """Counts a second between two samples; a count lower than before is a process that started again."""
    first, second = _numbers(a, rank), _numbers(b, rank)
    dt = b["t"] - a["t"]
    if second is None or second[at] is None or dt <= 0:
        return None
    before = first[at] if first is not None and first[at] is not None else 0
    moved = second[at] - before if second[at] >= before else second[at]
    return round(moved / dt, 3)


def _share(a: Mapping[str, Any], b: Mapping[str, Any], rank: str, at: int) -> float | None:
    rate = _rate(a, b, rank, at)
    return None if rate is None else round(min(1.0, max(0.0, rate)), 3)


def _cpu(a: Mapping[str, Any], b: Mapping[str, Any]) -> float | None:
    rates = [r for rank in (b.get("ranks") or {}) if (r := _rate(a, b, rank, CPU)) is not None]
    return round(100.0 * sum(rates), 1) if rates else None


def _gpus(
    samples: Sequence[Mapping[str, Any]], shift: float
) -> tuple[tuple[int, tuple[float, ...], Values, Values], ...]:
    found: dict[int, list[tuple[float, float | None, float | None]]] = {}
    for sample in samples:
        for row in sample.get("gpus") or []:
            index, util, used = row[0], row[1], row[2]
            found.setdefault(int(index), []).append(
                (round(sample["t"] + shift, 2), util, None if used is None else used / GIB)
            )
    return tuple(
        (index, *_thin(tuple(r[0] for r in rows), tuple(r[1] for r in rows), tuple(r[2] for r in rows)))
        for index, rows in sorted(found.items())
    )


def _thin(t: tuple[float, ...], *lines: Values) -> tuple[Any, ...]:
    """At most REPORT_POINTS points: consecutive ones averaged together (a page of a run of days stays small)."""
    if len(t) <= REPORT_POINTS:
        return (t, *lines)
    size = -(-len(t) // REPORT_POINTS)
    groups = range(0, len(t), size)
    return (
        tuple(t[min(i + size, len(t)) - 1] for i in groups),
        *(tuple(_mean(line[i : i + size]) for i in groups) for line in lines),
    )


def _mean(values: Sequence[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return round(sum(found) / len(found), 3) if found else None


def band(
    times: Sequence[Sequence[float]], lines: Sequence[Values], end: float, buckets: int = REPORT_POINTS
) -> Band | None:
    """Many lines as one band: each line's values placed in `buckets` time buckets over [0, end], then per bucket
    the lowest, the quartiles, the median and the highest of the lines that have a value there."""
    if end <= 0:
        return None
    width = end / buckets
    cells: list[list[float]] = [[] for _ in range(buckets)]
    for t, line in zip(times, lines, strict=True):
        for when, value in zip(t, line, strict=True):
            if value is not None and when >= 0:
                cells[min(buckets - 1, int(when / width))].append(value)
    rows = [(round((i + 0.5) * width, 2), sorted(c)) for i, c in enumerate(cells) if c]
    if not rows:
        return None

    def quart(values: list[float]) -> tuple[float, float]:
        if len(values) < 2:
            return values[0], values[0]
        q = statistics.quantiles(values, n=4)
        return q[0], q[2]

    return Band(
        tuple(t for t, _ in rows),
        tuple(c[0] for _, c in rows),
        tuple(quart(c)[0] for _, c in rows),
        tuple(statistics.median(c) for _, c in rows),
        tuple(quart(c)[1] for _, c in rows),
        tuple(c[-1] for _, c in rows),
    )


TIMELINE_FROM_ZERO = 0.3
"""The timeline's axis starts at 0 unless its first sample comes later than this share of it."""


def timeline_left(line: Timeline, marks: Sequence[Any], span: float) -> float:
    """Where the timeline's axis begins: 0, or a little before its first sample and mark where those come late
    (the start took most of a short run: a 0.6 s run was a sliver of a 0-12 s axis; its start has its own chart)."""
    times = [ts[0] for ts in (*(r.t for r in line.ranks), *(n.t for n in line.nodes)) if len(ts)]
    first = min([*times, *(m.t for m in marks)], default=0.0)
    return 0.0 if first < TIMELINE_FROM_ZERO * span else max(0.0, first - 0.05 * (span - first))


LABEL_WIDTH = 0.012
"""The share of the time axis one character of a mark's number takes (7 pt on an 11 in figure), and the gap between
two labels: marks closer than their labels' width share one label (`1, 2`), never printed over each other."""


def mark_labels(marks: Sequence[Any], span: float) -> list[tuple[float, str, str]]:
    """Each mark's number above the figure, (time, text, kind of its first mark): marks closer than their labels'
    width (LABEL_WIDTH of `span` a character, one more between labels) share one label, `1, 2` or `3-6`."""
    groups: list[list[tuple[int, Any]]] = []
    for number, mark in enumerate(marks, start=1):
        if groups:
            last = groups[-1]
            width = (len(_label_numbers([n for n, _ in last])) + len(str(number)) + 2) * LABEL_WIDTH * span / 2
            if mark.t - last[0][1].t < width:
                last.append((number, mark))
                continue
        groups.append([(number, mark)])
    return [(g[0][1].t, _label_numbers([n for n, _ in g]), g[0][1].kind) for g in groups]


def _label_numbers(numbers: Sequence[int]) -> str:
    """`1`, `1, 2`, `3-6`: consecutive numbers (every group's are) past two as a range."""
    if len(numbers) <= 2:
        return ", ".join(str(n) for n in numbers)
    return f"{numbers[0]}-{numbers[-1]}"
