"""What `inv top` knows of a run (pure): every node's snapshot (launcher/node/agent/sampler.py) as the view last saw it,
each rank with its node, the figures the straggler rule reads, what each look judges (`TopJudge`: the stragglers, by
arrival where every rank's collectives are known, and the ranks behind a collective, judged once the others have
waited long by the hang watch's own verdict on two looks at the stacks), the ranks worth a row first and the fields
that say why, and `--json`'s object. Rendering is launcher/report/toptables.py and topview.py."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.limits import TOP_BEHIND_HANG_S, TOP_BEHIND_SAY_S, TOP_WHY_GAP
from launcher.watch.arrival import Arrivals, Behind
from launcher.watch.loss import outlier_ratios
from launcher.watch.straggler import Straggler, StragglerWatch, lateness
from launcher.watch.verdict import Verdict, judge_stacks

RANK_FIELDS = (
    "rank",
    "local_rank",
    "pid",
    "state",
    "cpu_percent",
    "cpu_s",
    "rss_bytes",
    "last_output_s",
    "steps_per_s",
    "step",
    "last_line",
    "steps",
    "batches",
    "batches_per_s",
    "forward_share",
    "data_share",
    "record",
    "helpers",
    "loss",
    "loss_step",
    "loss_mean",
    "nonfinite",
    "loss_skipped",
    "loss_state",
    "loss_outlier",
)
NODE_FIELDS = ("load1", "cpus", "mem_total_bytes", "mem_available_bytes", "gpus", "gpus_age_s", "gpus_error")


@dataclass(frozen=True)
class NodeView:
    """One node as the view last saw it: its snapshot, or why there is none (unreachable, its run ended)."""

    name: str
    snapshot: Mapping[str, Any] | None = None
    problem: str | None = None


def ranks_of(views: Sequence[NodeView]) -> list[dict[str, Any]]:
    """Every rank of every node with a snapshot, in rank order, each with its node's name."""
    rows = [{"node": v.name, **r} for v in views if v.snapshot for r in v.snapshot.get("ranks", [])]
    means = {r["rank"]: r["loss_mean"] for r in rows if isinstance(r.get("loss_mean"), int | float)}
    high = outlier_ratios(means)  # a look's (top judges each look alone, as it does stragglers)
    rows = [{**r, "loss_outlier": high.get(r["rank"])} for r in rows]
    return sorted(rows, key=lambda r: r["rank"])


def rates(views: Sequence[NodeView]) -> dict[int, float | None]:
    return {r["rank"]: r.get("steps_per_s") for r in ranks_of(views)}


def forward_shares(views: Sequence[NodeView]) -> dict[int, float | None]:
    return {r["rank"]: r.get("forward_share") for r in ranks_of(views)}


def as_json(
    run_id: str,
    views: Sequence[NodeView],
    stragglers: Mapping[Any, Straggler],
    behind: Sequence[RankBehind] = (),
    sources: Mapping[int, str | None] | None = None,
) -> dict[str, Any]:
    """`inv top --once --json`: {"run", "nodes": [...], "ranks": [...]} (GPU fields where a node has GPUs; each rank's
    collectives' source, the collective it is behind in, and how it straggles)."""
    nodes = []
    for view in views:
        node: dict[str, Any] = {"node": view.name, "reachable": view.snapshot is not None, "problem": view.problem}
        node.update({k: (view.snapshot or {}).get(k) for k in NODE_FIELDS})
        nodes.append(node)
    ranks = []
    behind_of = behind_ranks(behind)
    for row in ranks_of(views):
        found, late = stragglers.get(row["rank"]), behind_of.get(row["rank"])
        ranks.append(
            {
                "node": row["node"],
                **{k: row.get(k) for k in RANK_FIELDS},
                "straggler": found is not None,
                "straggler_by": None if found is None else found.kind,
                "share_of_median": None if found is None or found.share is None else round(found.share, 3),
                "lost_s_per_step": None if found is None else found.lost_s,
                "collectives_source": (sources or {}).get(row["rank"]),
                "behind": None
                if late is None
                else {
                    "collective": late.behind.collective,
                    "last": late.behind.late[row["rank"]],
                    "waited_s": late.waited_s,
                    "hang_suspected": late.hang,
                    "judged": late.found(row["rank"]),
                    "verdict": None if late.verdict is None else late.verdict.line(),
                },
            }
        )
    return {"run": run_id, "nodes": nodes, "ranks": ranks}


STILL_STATES = ("D", "T", "t", "Z")
"""A rank in one of these /proc states is flagged: in uninterruptible sleep, stopped, a zombie."""


def flagged(row: Mapping[str, Any], stragglers: Mapping[Any, Straggler], behind: Collection[int] = ()) -> bool:
    """A rank worth a row before the quiet healthy ones: a straggler, behind a collective, stopped, stuck, a zombie,
    or its record off."""
    return (
        row["rank"] in stragglers
        or row["rank"] in behind
        or (row.get("state") or "") in STILL_STATES
        or str(row.get("record") or "").startswith("off")
        or bool(row.get("nonfinite"))
        or row.get("loss_outlier") is not None
    )


def telling(
    rows: Sequence[Mapping[str, Any]], stragglers: Mapping[Any, Straggler], behind: Collection[int] = ()
) -> set[str]:
    """The fields that say why the flagged ranks of `rows` (every rank) are flagged, whose columns a narrow view
    keeps: a share of each step (waiting for data, in the forward) at least TOP_WHY_GAP above the median rank's, a
    state that makes no progress."""
    marked = [row for row in rows if flagged(row, stragglers, behind)]
    found = {"state"} if any((row.get("state") or "") in STILL_STATES for row in marked) else set()
    if any(row.get("nonfinite") or row.get("loss_outlier") is not None for row in marked):
        found.add("loss")
    for name in ("data_share", "forward_share"):
        known = [row[name] for row in rows if row.get(name) is not None]
        if len(known) >= 2 and any(
            row.get(name) is not None and row[name] - statistics.median(known) >= TOP_WHY_GAP for row in marked
        ):
            found.add(name)
    return found


@dataclass(frozen=True)
class RankBehind:
    """A collective some ranks never entered, as `inv top` says it: how long the ranks that entered it have waited
    in it, whether that is long enough to look at the stacks, and the verdict on them (the hang watch's)."""

    behind: Behind
    waited_s: float
    due: bool = False
    """Waited in for TOP_BEHIND_HANG_S: two looks at every rank's stack are due (again, once a verdict is as old)."""
    looking: bool = False
    """The looks were asked for and no verdict has come yet."""
    verdict: Verdict | None = None
    """The last verdict on two looks while ranks were behind in it (`launcher.watch.verdict.judge_stacks`)."""

    @property
    def ranks(self) -> tuple[int, ...]:
        """The ranks that never entered the collective (the others of `behind.late` entered it, not the newest)."""
        return tuple(sorted(rank for rank, last in self.behind.late.items() if last < self.behind.seq))

    @property
    def hang(self) -> bool:
        """A hang suspected: the verdict said so (never the wait alone: a rank behind may be evaluating)."""
        return self.verdict is not None and self.verdict.hang

    def found(self, rank: int) -> str | None:
        """What the verdict found the rank to be (`at work`, `stuck`); None: not judged."""
        return None if self.verdict is None else self.verdict.of_rank(rank)


def behind_ranks(behind: Sequence[RankBehind]) -> dict[int, RankBehind]:
    """rank -> the first collective it never entered."""
    found: dict[int, RankBehind] = {}
    for said in behind:
        for rank in said.ranks:
            found.setdefault(rank, said)
    return found


@dataclass(frozen=True)
class Look:
    """What one look of `inv top` judged."""

    stragglers: dict[Hashable, Straggler]
    behind: list[RankBehind]
    sources: dict[int, str | None]
    """rank -> where its collectives come from (None: it has none)."""


@dataclass
class TopJudge:
    """Each look's judgement, with what it keeps between looks: the straggler watch's hold, every rank's collectives
    (each node's snapshot fed once: a live view draws the same snapshot more than once), when each collective
    with ranks behind was first seen (its wait where no arrival time of it has come yet), when its ranks' stacks were
    last asked for and the verdict on them.

    `hold_s` is 0 in every view: a row marks what each look finds, as `--once` does (a row can be taken back; a
    launch's console line cannot, so the launch holds: `LaunchStragglers`)."""

    factor: float
    hold_s: float = 0.0
    say_s: float = TOP_BEHIND_SAY_S
    hang_s: float = TOP_BEHIND_HANG_S
    arrivals: Arrivals = field(default_factory=Arrivals)
    fed: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    first_seen: dict[tuple[str, int], float] = field(default_factory=dict)
    asked: dict[tuple[str, int], float] = field(default_factory=dict)
    """(group, collective) -> when two looks at the stacks were last asked for while ranks were behind in it."""
    verdicts: dict[tuple[str, int], Verdict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.watch = StragglerWatch(self.factor, self.hold_s)

    def look(self, views: Sequence[NodeView], now_wall: float, now: float) -> Look:
        """The stragglers (as of monotonic `now`) and the collectives ranks have been behind in for `say_s` at least
        (as of wall time `now_wall`)."""
        for view in views:
            if view.snapshot is not None and self.fed.get(view.name) is not view.snapshot:
                self.fed[view.name] = view.snapshot
                self.arrivals.feed(view.snapshot.get("ranks", []), now_wall)
        found = self.watch.look(now, rates(views), forward_shares(views), lateness(self.arrivals, now_wall))
        return Look(found, self._behind(now_wall), self.arrivals.sources())

    def asking(self, look: Look, now_wall: float) -> bool:
        """Whether two looks at the stacks are due (a collective waited in for `hang_s`, not asked about for as long);
        if so, they count as asked for now (a look that fails is not asked again at once)."""
        due = [(said.behind.group, said.behind.seq) for said in look.behind if said.due]
        self.asked.update((key, now_wall) for key in due)
        return bool(due)

    def judge(
        self,
        first: Mapping[str, Mapping[str, Any] | str],
        second: Mapping[str, Mapping[str, Any] | str],
        apart_s: float,
        now_wall: float,
    ) -> Verdict | None:
        """The hang watch's verdict on two looks at every rank's stack (each node's `stacks` answer, or why none),
        kept for each collective that still has ranks behind it; None where none has (they caught up meanwhile)."""
        judged = judge_stacks(first, second, apart_s, self.arrivals, now_wall)
        if not judged.behind:
            return None
        self.verdicts.update(((b.group, b.seq), judged.verdict) for b in judged.behind)
        return judged.verdict

    def _behind(self, now_wall: float) -> list[RankBehind]:
        found = self.arrivals.behind(now_wall)
        if found is None:  # not every rank's collectives known and fresh: nothing said, nothing forgotten
            return []
        keys = {(b.group, b.seq) for b in found}
        self.first_seen = {key: self.first_seen.get(key, now_wall) for key in keys}
        self.asked = {key: at for key, at in self.asked.items() if key in keys}
        self.verdicts = {key: verdict for key, verdict in self.verdicts.items() if key in keys}
        said = []
        for behind in found:
            key, waited = (behind.group, behind.seq), round(now_wall - self._since(behind), 1)
            due = waited >= self.hang_s and now_wall - self.asked.get(key, -float("inf")) >= self.hang_s
            if waited >= self.say_s:
                said.append(
                    RankBehind(
                        behind, waited, due, key in self.asked and key not in self.verdicts, self.verdicts.get(key)
                    )
                )
        return said

    def _since(self, behind: Behind) -> float:
        """When the first rank that entered the collective entered it (its node's clock), or when a look first saw
        it, whichever is earlier (a controller's clock behind the nodes' would put the arrival in the future)."""
        times = self.arrivals.arrived.get(behind.group, {}).get(behind.seq, {})
        entered = [at for rank, at in times.items() if rank in behind.entered]
        return min([*entered, self.first_seen[(behind.group, behind.seq)]])


TwoStacks = Callable[[], tuple[Mapping[str, Any], Mapping[str, Any]]]
"""Two looks at every rank's stack, HANG_LOOKS_APART_S apart: each node's `stacks` answer, or why there is none
(`launcher.run.takestacks.two_looks`)."""
