"""The run's page as data (pure): from what the launch kept (its journal) and what each node answered (`report`:
state, each rank's start phases, the series its supervisor sampled, its log's end), the start as a waterfall and its
headline, the run's marks, each node's end. Every time is seconds from the command's start, by the launcher's clock
(a node's own times moved by its clock's offset). The timeline's numbers are launcher.report.pageseries'; drawing and
HTML are launcher.report.page's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.limits import REPORT_MAX_ROWS, REPORT_NAMED
from launcher.report.pageend import ANSWERED, Mark, NodeExit, Retried, end_rows, few, node_exit, run_end
from launcher.report.pageloss import learning_line
from launcher.report.pageseries import Timeline, timeline

__all__ = ["PHASES", "Bar", "Mark", "NodeExit", "Page", "build_page", "end_rows", "rank_phases"]

PHASES = (
    ("connected", "SSH connected", "connecting"),
    ("synced", "sync done", "the sync"),
    ("ready", "checks done", "the checks"),
    ("torchrun", "torchrun started", "waiting for every node"),
    ("container", "container started", "the container's start (image, create, start)"),
    ("hook", "workers started", "starting the workers"),
    ("torch", "import torch done", "the imports"),
    ("rdzv", "init_process_group called", "the script's own setup"),
    ("pg", "process group ready", "the rendezvous"),
    ("batch", "first batch", "the first batch"),
    ("step", "first optimizer step", "the first step"),
)
"""(name, what the page calls the moment, what it calls the time before it), in the order a start goes through them:
the launcher's own (journal.json) first, then each rank's (the hook's phases/<pid>)."""
LAUNCHER_PHASES = ("connected", "synced", "ready", "torchrun")
RANK_SPREAD_S = 1.0
"""A node's ranks get bars of their own when their start phases lie further apart than this."""
STRAGGLER_TEXT = re.compile(r"straggler: (\S+) r(\d+)")


@dataclass(frozen=True)
class Bar:
    """One row of the waterfall: a node (rank None: its last rank's times) or one of its ranks."""

    node: str
    rank: int | None
    phases: tuple[tuple[str, float], ...]
    """(phase name, seconds from the command's start), in PHASES' order, those that happened."""

    def at(self, name: str) -> float | None:
        return next((t for n, t in self.phases if n == name), None)

    def longest(self) -> tuple[str, float] | None:
        """What took longest before a phase: (what the page calls that time, seconds)."""
        gaps, before = [], 0.0
        for name, t in self.phases:
            gaps.append((t - before, name))
            before = t
        if not gaps:
            return None
        seconds, name = max(gaps)
        return next(p[2] for p in PHASES if p[0] == name), seconds


@dataclass(frozen=True)
class Page:
    run_id: str
    command_start: float
    headline: str
    first_step_s: float | None
    """Command -> first optimizer step on every rank (None: not every rank stepped)."""
    slowest: tuple[str, str, float] | None
    """(node, what took it longest, seconds) of the node whose ranks stepped last."""
    bars: tuple[Bar, ...]
    hidden_bars: int
    marks: tuple[Mark, ...]
    exits: tuple[NodeExit, ...]
    root_cause: str
    logs: str
    duration_s: float | None
    timeline: Timeline
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What the page could not know (a node it could not reach now, whose figures are those it gave before)."""
    stopped: str = ""
    """How a stop the user asked for ended the run ("" when none did)."""
    never: str = ""
    """Why the launch never started anything ("" when it did)."""
    unreached: tuple[str, ...] = ()
    """The nodes that could not answer when the page was written (`notes` say whose figures are from before)."""
    attempts: tuple[str, ...] = ()
    """Each attempt of the launch this run belongs to (`--retries`, `--on-hang restart`), a line each: how it ended,
    which node sat out, where the next resumed from, how long after a hang the run trained again."""
    launch_s: float | None = None
    """With `attempts`: seconds from the launch's first attempt's start to its last one's end (None: one runs)."""

    @property
    def learning(self) -> str:
        """What the run learnt, in a line under the headline: the loss's finding (a non-finite loss, a rank far from
        the others, a spike: the launch's marks, or a detached run's samples), else where the loss went; "" when no
        rank's loss was read."""
        return learning_line(self.marks, self.timeline)

    def summary(self) -> dict[str, Any]:
        """What `--json` says of the page."""
        return {
            "run": self.run_id,
            "headline": self.headline,
            "first_step_s": self.first_step_s,
            "slowest": None
            if self.slowest is None
            else {"node": self.slowest[0], "in": self.slowest[1], "seconds": round(self.slowest[2], 1)},
            "duration_s": self.duration_s,
            "root_cause": self.root_cause or None,
            "stopped": self.stopped or None,
            "never_started": self.never or None,
            "logs": self.logs,
            "nodes": {
                e.node: {
                    "state": e.state,
                    "exit_code": e.exit_code,
                    "raised": list(e.raised),
                    "detail": e.detail or None,
                }
                for e in self.exits
            },
            "marks": [{"t": round(m.t, 1), "kind": m.kind, "node": m.node, "text": m.text} for m in self.marks],
            "start": [{"node": b.node, "rank": b.rank, "phases": dict(b.phases)} for b in self.bars],
            "ranks": [
                {
                    "node": r.node,
                    "rank": r.rank,
                    "steps": r.steps,
                    "steps_per_s": r.mean_rate(),
                    "data_share": r.data_mean,
                    "loss": None if r.loss is None else r.loss.last,
                    "loss_min": None if r.loss is None else r.loss.low,
                    "loss_nonfinite_by_step": None if r.loss is None else r.loss.nonfinite_steps,
                }
                for r in self.timeline.ranks
            ],
            "loss": {
                "line": self.learning or None,
                "events": [
                    {"t": round(m.t, 1), "node": m.node, "text": m.text} for m in self.marks if m.kind == "loss"
                ],
            },
            "notes": list(self.notes),
            "unreached": list(self.unreached),
            "attempts": list(self.attempts),
            "launch_s": None if self.launch_s is None else round(self.launch_s, 1),
        }


def rank_phases(lines: list[str]) -> tuple[int | None, int, dict[str, float]]:
    """A process's phases file as (rank, restart, {phase: wall}): each phase's first line counts."""
    rank: int | None = None
    restart, found = 0, {}  # type: int, dict[str, float]
    for line in lines:
        parts = line.split()
        if len(parts) != 5:
            continue
        try:
            when = float(parts[1])
            rank = int(parts[2]) if parts[2].isdigit() else rank
            restart = int(parts[4]) if parts[4].isdigit() else restart
        except ValueError:
            continue
        found.setdefault(parts[0], when)
    return rank, restart, found


def build_page(
    run_id: str,
    journal: Mapping[str, Any] | None,
    answers: Mapping[str, Mapping[str, Any]],
    logs: str,
    offsets: Mapping[str, float] | None = None,
    retried: Retried | None = None,
    notes: Sequence[str] = (),
    attempts: Sequence[str] = (),
    launch_s: float | None = None,
) -> Page:
    """The page of a run: `answers` are each node's `report` answer in the inventory's order (a node that could not
    answer: {"state": "unreachable", "detail": why}); `offsets` each node's clock against this one where the journal
    has none (a detached run's page made elsewhere); `retried`: the attempt of a launch with retries this run was,
    where the launcher started it again; `notes`: what the page could not know."""
    journal = journal or {}
    known = journal.get("nodes") or {}
    offset = {n: float((known.get(n) or {}).get("offset", (offsets or {}).get(n, 0.0))) for n in answers}
    began = journal.get("command_start") or _earliest(answers, offset)
    bars, spread, marks = _start(answers, known, offset, began)
    marks += _journal_marks(journal, began)
    exits = tuple(node_exit(node, answer, offset[node], began) for node, answer in answers.items())
    started = _started(journal, known, answers)
    spares = {m.get("node") for m in journal.get("marks") or () if m.get("kind") == "spare"}
    end = run_end(journal.get("end") or {}, exits, started, retried, spares)
    if end.never:
        exits = tuple(replace(e, detail=e.detail or "nothing was started here") for e in exits)
    shown, hidden = _rows(bars, spread)
    first, slowest, headline = _headline(bars, spread)
    hung = hang_said(end.root_cause)
    headline = f"{hung}; {headline}" if hung else headline  # what ended it first: the rest is how far it got
    ended = [e.ended for e in exits if e.ended is not None]
    said = journal.get("end") or {}
    duration = max(ended) if ended else (said["t"] - began if said.get("t") and started else None)
    first_steps = {
        (b.node, b.rank): at
        for ranks in spread.values()
        for b in ranks
        if b.rank is not None and (at := b.at("step")) is not None
    }
    return Page(
        run_id,
        began,
        f"never started: {end.never}" if end.never else headline,
        first,
        slowest,
        tuple(shown),
        hidden,
        _grouped([*marks, *end.marks]),
        exits,
        end.root_cause,
        logs,
        None if duration is None else round(duration, 1),
        timeline({n: a.get("series") or [] for n, a in answers.items()}, offset, began, first_steps),
        tuple(notes),
        end.stopped,
        end.never,
        attempts=tuple(attempts),
        launch_s=launch_s,
    )


def _started(journal: Mapping[str, Any], known: Mapping[str, Any], answers: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether the run began anywhere: a node's torchrun in the journal, a node that answered with a run, or an end
    the journal does not say and the nodes do not deny."""
    return (
        any("torchrun" in (known.get(n) or {}) for n in answers)
        or any(a.get("state") in ANSWERED for a in answers.values())
        or not (journal.get("end") or all(a.get("state") == "none" for a in answers.values()))
    )


def _start(
    answers: Mapping[str, Mapping[str, Any]], known: Mapping[str, Any], offset: Mapping[str, float], began: float
) -> tuple[list[Bar], dict[str, list[Bar]], list[Mark]]:
    """Each node's bar (its launcher phases, its last rank's), each of its ranks' bars, and a mark of each rank's
    process that started again (its phases: a restart count)."""
    bars, marks, spread = [], [], {}
    for node, answer in answers.items():
        own = {k: float(v) - began for k, v in (known.get(node) or {}).items() if k in LAUNCHER_PHASES}
        if answer.get("container_started"):  # held since `ready`, it costs the start only what is left at `go`
            own["container"] = max(float(answer["container_started"]) + offset[node] - began, own.get("torchrun", 0.0))
        ranks: dict[int, dict[str, float]] = {}
        for lines in (answer.get("phases") or {}).values():
            rank, restart, found = rank_phases(lines)
            if rank is None or not found:
                continue
            if restart:
                marks.append(
                    Mark(
                        found.get("hook", min(found.values())) + offset[node] - began,
                        "restart",
                        f"{node} r{rank}: workers started again (restart {restart})",
                        node,
                    )
                )
                continue
            ranks[rank] = {k: v + offset[node] - began for k, v in found.items()}
        names = [p[0] for p in PHASES]
        last = {k: max(r[k] for r in ranks.values() if k in r) for k in names if any(k in r for r in ranks.values())}
        bars.append(Bar(node, None, _ordered({**own, **last})))
        spread[node] = [Bar(node, rank, _ordered({**own, **times})) for rank, times in sorted(ranks.items())]
    return bars, spread, marks


def _grouped(marks: list[Mark]) -> tuple[Mark, ...]:
    """The marks by time; past REPORT_NAMED marks of one kind, each about a node (every node stopped, 256 nodes' ends
    or reconnects, any kind a newer launcher notes), the first few as they are and the rest as one mark that counts
    them (a figure of 256 dashed lines says nothing)."""
    kept: list[Mark] = []
    for kind in dict.fromkeys(m.kind for m in marks):
        mine = sorted((m for m in marks if m.kind == kind), key=lambda m: m.t)
        if len(mine) <= REPORT_NAMED or any(m.node is None for m in mine):
            kept += mine
            continue
        kept += mine[: REPORT_NAMED - 1]
        rest = mine[REPORT_NAMED - 1 :]
        names = ", ".join(m.node or "?" for m in rest)
        kept.append(
            Mark(rest[0].t, kind, f"{len(rest)} more ({kind}) from {rest[0].t:.0f} to {rest[-1].t:.0f} s: {few(names)}")
        )
    return tuple(sorted(kept, key=lambda m: m.t))


def _ordered(times: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple((name, round(times[name], 3)) for name, _, _ in PHASES if name in times)


def _earliest(answers: Mapping[str, Mapping[str, Any]], offset: Mapping[str, float]) -> float:
    """Without a journal, the run's start: the earliest time any node knows of it."""
    found = [float(a["started_at"]) + offset[n] for n, a in answers.items() if a.get("started_at")]
    return min(found) if found else 0.0


def _journal_marks(journal: Mapping[str, Any], began: float) -> list[Mark]:
    marks = []
    for mark in journal.get("marks") or []:
        node = mark.get("node")
        if mark.get("kind") == "straggler" and node is None:
            found = STRAGGLER_TEXT.search(mark.get("text", ""))
            node = found.group(1) if found else None
        marks.append(Mark(float(mark["t"]) - began, str(mark.get("kind")), str(mark.get("text", "")), node))
    return marks


def _rows(bars: list[Bar], spread: Mapping[str, list[Bar]]) -> tuple[list[Bar], int]:
    """The waterfall's rows: each node, its ranks too where they differ, the slowest nodes first past
    REPORT_MAX_ROWS (with how many were left out)."""
    if len(bars) > REPORT_MAX_ROWS:
        return _slowest_first(bars)[:REPORT_MAX_ROWS], len(bars) - REPORT_MAX_ROWS
    rows: list[Bar] = []
    for bar in bars:
        rows.append(bar)
        ranks = spread.get(bar.node, [])
        if len(ranks) > 1 and _differ(ranks) and len(rows) + len(ranks) <= REPORT_MAX_ROWS:
            rows += ranks
    return rows, 0


def _slowest_first(bars: list[Bar]) -> list[Bar]:
    """The nodes in the order the headline judges them: one that never stepped first, then those that stepped last
    (within RANK_SPREAD_S: every node leaves the rendezvous together), of those the one that came to the rendezvous
    last first (it held the others up, who spent that time waiting in it)."""
    ends = [b.phases[-1][1] for b in bars if b.phases]
    last = max(ends, default=0.0)

    def lateness(bar: Bar) -> tuple[bool, bool, float, float]:
        end = bar.phases[-1][1] if bar.phases else 0.0
        came = bar.at("rdzv") or bar.at("torch") or bar.at("hook") or 0.0
        return bar.at("step") is None, end >= last - RANK_SPREAD_S, came, end

    return sorted(bars, key=lateness, reverse=True)


def _differ(ranks: list[Bar]) -> bool:
    for name, _, _ in PHASES:
        times = [t for t in (r.at(name) for r in ranks) if t is not None]
        if times and max(times) - min(times) > RANK_SPREAD_S:
            return True
    return False


def hang_said(root_cause: str) -> str:
    """`stopped on a hang: rank 1 (node-1, pid 812) is in time.sleep (train.py:80)` from a run's end words where the
    launcher stopped it for a hang or a stall; "" otherwise."""
    found = re.search(r"(hang suspected|stalled) \((?:[^()]|\([^()]*\))*\): (.*?)(?:\. logs: |\n|$)", root_cause)
    if found is None:
        return ""
    what = "a hang" if found.group(1) == "hang suspected" else "a stall"
    return f"stopped on {what}: {found.group(2)}"


def _headline(
    bars: list[Bar], spread: Mapping[str, list[Bar]]
) -> tuple[float | None, tuple[str, str, float] | None, str]:
    ranks = [r for node in spread.values() for r in node]
    stepped = [r for r in ranks if r.at("step") is not None]
    if not ranks:
        return None, None, "no rank recorded its start (a run from before the page, or nothing started)"
    if len(stepped) < len(ranks):
        never = ", ".join(f"{r.node} r{r.rank}" for r in ranks if r.at("step") is None)
        return None, None, (f"not every rank made an optimizer step ({len(stepped)} of {len(ranks)}; not {few(never)})")
    first = round(max(r.at("step") or 0.0 for r in stepped), 1)
    last = _slowest_first(bars)[0]  # the waterfall's first row where nodes are left out
    longest = last.longest()
    if longest is None:
        return first, None, f"command -> first optimizer step on every rank: {first:.1f} s"
    what, seconds = longest
    took = f"{seconds:.1f}" if seconds < 10 else f"{seconds:.0f}"
    return (
        first,
        (last.node, what, seconds),
        (
            f"command -> first optimizer step on every rank: {first:.1f} s; the "
            f"slowest node, {last.node}: {took} s in {what}"
        ),
    )
