"""What `inv top` shows (pure): the tables of the live view and of `--once`, from the run as the watch has it
(launcher/watch/topmodel.py): a row per node (load, memory, GPUs) and a row per rank (its helpers beside it: their
count, CPU and memory), stragglers and ranks behind a collective marked, a line for each collective with ranks
behind."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from launcher.limits import TOP_BEHIND_LINES, TOP_GPU_REFRESH_S
from launcher.paths import hint
from launcher.ranges import numbers_text
from launcher.units import human_bytes
from launcher.watch.loss import loss_text
from launcher.watch.straggler import Straggler
from launcher.watch.topmodel import STILL_STATES, NodeView, RankBehind, behind_ranks, flagged, ranks_of, telling

GPU_OLD_S = 2 * TOP_GPU_REFRESH_S
"""A node's GPU answer older than this is shown with its age: nvidia-smi is slow or stuck there."""


def size(value: float | None) -> str:
    return "–" if value is None else human_bytes(value)


def _gpus(snap: Mapping[str, Any]) -> Text | str:
    """A node's GPU cell: the run's GPUs, each with its ranks (`1 r4: 87% 10.0 GiB/80.0 GiB`); one that cannot be read
    says why beside the others; the answer's age where it is old; why there is none (nvidia-smi stuck or failing)."""
    gpus, error, age = snap.get("gpus"), snap.get("gpus_error"), snap.get("gpus_age_s")
    if not gpus:
        return Text(error, style="red") if error else "–"

    def util(g: Mapping[str, Any]) -> str:  # nvidia-smi says [N/A] where a GPU does not report it
        return "–" if g.get("util_percent") is None else f"{g['util_percent']}%"

    def one(g: Mapping[str, Any]) -> str:
        ranks = "".join(f" r{r}" for r in g.get("ranks") or [])
        if g.get("error"):
            return f"{g.get('index')}{ranks}: {g['error']}"
        return f"{g.get('index')}{ranks}: {util(g)} {size(g.get('mem_used_bytes'))}/{size(g.get('mem_total_bytes'))}"

    text = "  ".join(one(g) for g in gpus)
    if age is not None and age >= GPU_OLD_S:
        text += f" ({age:.0f} s old)"
    return Text(text + (f" ({error})" if error else ""), style="yellow" if error else "")


def node_table(views: Sequence[NodeView]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("node", "load", "memory used", "GPUs"):
        table.add_column(name, no_wrap=True)
    for view in views:
        snap = view.snapshot
        if snap is None:
            table.add_row(view.name, Text(view.problem or "no answer yet", style="red"), "", "")
            continue
        total, free = snap.get("mem_total_bytes"), snap.get("mem_available_bytes")
        used = f"{size(total - free)} / {size(total)}" if total is not None and free is not None else "–"
        table.add_row(view.name, f"{snap.get('load1', 0):.2f} ({snap.get('cpus')} CPUs)", used, _gpus(snap))
    return table


def _number(value: float | None, form: str) -> str:
    return "–" if value is None else format(value, form)


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


class Marks(NamedTuple):
    """What a rank's row is marked with: the straggler it is, the collective it is behind in."""

    found: Straggler | None = None
    behind: RankBehind | None = None


def _rate(row: Mapping[str, Any], marks: Marks) -> str:
    """Steps a second, and why the rank is flagged: `SLOW 0.45x` (by rate), `SLOW +0.15 s/step` (by arrival: the
    others wait that long a step for it), `BEHIND` (a collective it never entered)."""
    if row.get("steps_per_s") is None and row.get("step") is None and not row.get("steps"):
        rate = "off" if (row.get("record") or "").startswith("off") else "no progress lines"
    else:
        rate = _number(row.get("steps_per_s"), ".2f")
    found = marks.found
    if found is not None and found.kind == "rate":
        rate += f" SLOW {found.share:.2f}x"
    elif found is not None and found.late is not None:  # by arrival
        lost = f"+{found.lost_s:.2f} s/step" if found.lost_s is not None else f"({found.late.wait_share:.0%} wait)"
        rate += f" SLOW {lost}"
    if marks.behind is None:
        return rate
    verdict = marks.behind.found(row["rank"])  # the verdict on its stacks: `BEHIND, at work`, `BEHIND, stuck`
    return rate + " BEHIND" + (f", {verdict}" if verdict else "")


def _helpers(helpers: Sequence[Mapping[str, Any]] | None) -> str:
    """A rank's helpers in a cell: how many, their CPU % and memory together."""
    if not helpers:
        return ""
    cpu = sum(h.get("cpu_percent") or 0.0 for h in helpers)
    return f"{len(helpers)}: {cpu:.0f}% {size(sum(h.get('rss_bytes') or 0 for h in helpers))}"


def _forward(row: Mapping[str, Any], marks: Marks) -> str:
    share = _share(row.get("forward_share"))
    return share + " SLOW" if marks.found is not None and marks.found.kind == "forward" else share


def _loss(row: Mapping[str, Any], _: Marks) -> str:
    """A rank's last loss; where it went non-finite, its value and step; an outlier, how far above the others."""
    bad = row.get("nonfinite")
    if bad:
        return f"{bad.get('value')} at {bad.get('step')}"
    said = loss_text(row.get("loss"))
    return f"{said} {row['loss_outlier']:.1f}x" if row.get("loss_outlier") is not None else said


_CELLS: tuple[tuple[str, bool, str | None, Callable[[Mapping[str, Any], Marks], str]], ...] = (
    ("node", False, None, lambda r, _: r["node"]),
    ("rank", True, None, lambda r, _: f"r{r['rank']}"),
    ("pid", True, None, lambda r, _: str(r["pid"])),
    ("state", False, None, lambda r, _: r.get("state") or "?"),
    ("CPU %", True, None, lambda r, _: _number(r.get("cpu_percent"), ".0f")),
    ("RSS", True, None, lambda r, _: size(r.get("rss_bytes"))),
    ("helpers", True, "helpers", lambda r, _: _helpers(r.get("helpers"))),
    ("quiet s", True, None, lambda r, _: _number(r.get("last_output_s"), ".0f")),
    ("steps/s", True, None, _rate),
    ("batches/s", True, "record", lambda r, _: _number(r.get("batches_per_s"), ".2f")),
    ("fwd", True, "record", _forward),
    ("data", True, "record", lambda r, _: _share(r.get("data_share"))),
    ("loss", True, "loss_step", _loss),
    ("last line", False, None, lambda r, _: r.get("last_line") or ""),
)
"""The rank table's columns: name, right-aligned, the field without which no rank has it (the column is left out, so
a run that only prints lines keeps its narrow table), and the cell."""


def rank_table(
    views: Sequence[NodeView],
    stragglers: Mapping[Any, Straggler],
    rows: Sequence[Mapping[str, Any]] | None = None,
    width: int | None = None,
    behind: Sequence[RankBehind] = (),
) -> Table:
    """The ranks' table (`rows`: those to show, in order; all by default). With the terminal's `width`, the columns
    that matter least are left out until the last line keeps `LAST_LINE_MIN` characters (and the node's name is
    never cut)."""
    rows = ranks_of(views) if rows is None else rows
    behind_of = behind_ranks(behind)

    def marks(row: Mapping[str, Any]) -> Marks:
        return Marks(stragglers.get(row["rank"]), behind_of.get(row["rank"]))

    cells = [c for c in _CELLS if c[2] is None or any(r.get(c[2]) for r in rows)]
    last_min = LAST_LINE_MIN
    if width is not None:
        why = {name for name, field in TELLS.items() if field in telling(ranks_of(views), stragglers, behind_of)}
        cells, last_min = _fitting(cells, rows, marks, width, why)
    table = Table(box=None, pad_edge=False, header_style="bold", expand=True)
    for name, right, _, _ in cells:
        table.add_column(
            name,
            justify="right" if right else "left",
            no_wrap=True,
            overflow="ellipsis",
            ratio=1 if name == "last line" else None,
            min_width=last_min if name == "last line" else None,
        )
    for row in rows:
        mark = marks(row)
        table.add_row(
            *(cell(row, mark) for _, _, _, cell in cells),
            style="bold red" if mark.found is not None or mark.behind is not None else None,
        )
    return table


LAST_LINE_MIN = 24
"""The last line keeps at least this many characters in a narrow terminal (it shrank to 9 in 80 columns)."""
DROPPED_FIRST = ("pid", "RSS", "helpers", "data", "batches/s", "state", "quiet s", "fwd", "CPU %")
"""The columns a narrow terminal loses, in order; node, rank, steps/s and the last line stay (the last line shrinks
below LAST_LINE_MIN only when nothing else is left to lose: a node's name is never cut), and so does a column that
says why a rank is flagged (`TELLS`)."""
TELLS = {"data": "data_share", "fwd": "forward_share", "state": "state", "loss": "loss"}
"""The columns that may say why a rank is flagged, and their fields (`launcher.watch.topmodel.telling`)."""


def _fitting(
    cells: list,
    rows: Sequence[Mapping[str, Any]],
    marks: Callable[[Mapping[str, Any]], Marks],
    width: int,
    why: Collection[str] = (),
) -> tuple[list, int]:
    """The columns that fit in `width` with the last line's least width, those named in `why` kept: rich cuts every
    column alike (the node's name too) when a table does not fit."""

    def natural(cell: tuple) -> int:
        name, _, _, make = cell
        return max([len(name), *(len(make(r, marks(r))) for r in rows)])

    def needed(kept: list) -> int:  # every column but the last line, and two spaces between columns
        return sum(natural(c) for c in kept if c[0] != "last line") + 2 * (len(kept) - 1)

    kept = list(cells)
    for name in (name for name in DROPPED_FIRST if name not in why):
        if needed(kept) + LAST_LINE_MIN <= width:
            return kept, LAST_LINE_MIN
        kept = [c for c in kept if c[0] != name]
    return kept, max(1, min(LAST_LINE_MIN, width - needed(kept)))


def _hidden_line(
    hidden: Sequence[Mapping[str, Any]], stragglers: Mapping[Any, Straggler], behind: Sequence[int]
) -> Text:
    def mark(row: Mapping[str, Any]) -> str:
        state = row.get("state") or ""
        said = (
            "behind"
            if row["rank"] in behind
            else "SLOW"
            if row["rank"] in stragglers
            else "loss " + _loss(row, Marks(None, None))
            if row.get("nonfinite") or row.get("loss_outlier") is not None
            else state
            if state in STILL_STATES
            else "record off"
        )
        return f"r{row['rank']} {said}"

    marks = [mark(r) for r in hidden if flagged(r, stragglers, behind)]  # hidden only for want of room: counted
    said = f"+{len(hidden)} ranks not shown, " + (
        f"{len(marks)} flagged: {', '.join(marks[:6])}" if marks else "none flagged"
    )
    said += f" and {len(marks) - 6} more" if len(marks) > 6 else ""
    said += f" ({hint('top --once')} shows every rank)"
    return Text(said, style="yellow", no_wrap=True, overflow="ellipsis")


def behind_lines(behind: Sequence[RankBehind], most: int | None = None, cut: bool = True) -> list[Text]:
    """A line for each collective with ranks behind (`most` of them, the others counted): `r1 behind: never entered
    all_reduce #101 of default_pg (22 s)`, where the seconds are how long the ranks that entered it have waited;
    once they have waited long, the verdict on two looks at the stacks in the hang watch's words: `r1 behind 34 s,
    at work: not a hang (...)`, `r1 behind 34 s, stuck: hang suspected (...)`. `cut`: one screen line each (the
    live view); else wrapped (`--once`)."""

    def text(value: str, style: str) -> Text:
        return Text(value, style=style, no_wrap=True, overflow="ellipsis") if cut else Text(value, style=style)

    def line(said: RankBehind) -> Text:
        who = f"r{numbers_text(said.ranks)}"
        if said.looking:  # the verdict's words, as they will come: `r1 behind 34 s, at work: ...`
            return text(
                f"{who} behind {said.waited_s:.0f} s, judging its stack: never entered {said.behind.collective}",
                "yellow",
            )
        if said.verdict is None:
            return text(f"{who} behind: never entered {said.behind.collective} ({said.waited_s:.0f} s)", "yellow")
        found = {said.found(rank) for rank in said.ranks}
        head = f"{who} behind {said.waited_s:.0f} s" + (
            f", {found.pop()}" if len(found) == 1 and None not in found else ""
        )
        return text(f"{head}: {said.verdict.line()}", "bold red" if said.hang else "yellow")

    shown = list(behind) if most is None or len(behind) <= most else list(behind[: most - 1])
    lines = [line(said) for said in shown]
    if len(shown) < len(behind):
        lines.append(
            text(
                f"+{len(behind) - len(shown)} more collectives with ranks behind ({hint('top --once')} says every one)",
                "yellow",
            )
        )
    return lines


def view(
    run_id: str,
    views: Sequence[NodeView],
    stragglers: Mapping[Any, Straggler],
    follow: int | None = None,
    footer: Sequence[str] = (),
    height: int = 50,
    width: int | None = None,
    behind: Sequence[RankBehind] = (),
) -> RenderableType:
    """The live view's screen, made to fit `height` lines (and `width` columns): the key line, the answer to a key
    and the ranks behind a collective (`behind_lines`) always have room; nodes and ranks that do not fit are said,
    and how many of them are flagged (`+4 ranks not shown, 1 flagged: r13 SLOW`, `none flagged`): flagged ranks come
    first (`flagged`: those behind, then stragglers, then the others), then the others in rank order; the followed
    rank's last lines take what room is left."""
    rows = ranks_of(views)
    keys = Text("q quit (the run goes on)   s stacks   l follow the next rank's log", style="dim")
    said = behind_lines(behind, TOP_BEHIND_LINES)
    late = behind_ranks(behind)
    panel = 5 if follow is not None else 0  # at least 3 lines and the panel's borders
    legend = any(r.get("record") for r in rows)  # a line for what the hook's columns mean
    room = height - 2 - len(footer) - 1 - panel - len(said) - legend  # title, blank; a key's answer; the keys
    problems = [v for v in views if v.snapshot is None]
    shown_nodes = (problems + [v for v in views if v.snapshot is not None])[: max(1, min(len(views), room // 4))]
    shown_nodes = [v for v in views if v in shown_nodes]
    room -= 1 + len(shown_nodes) + (1 if len(shown_nodes) < len(views) else 0)  # header, rows, "+N nodes"
    fit = max(1, room - 1 - (1 if len(rows) > room - 1 else 0))  # the table's header; "+N ranks"
    shown = sorted(
        rows,
        key=lambda r: (r["rank"] not in late, r["rank"] not in stragglers, not flagged(r, stragglers, late), r["rank"]),
    )[:fit]
    parts: list[RenderableType] = [Text(f"run {run_id}", style="bold"), node_table(shown_nodes)]
    if len(shown_nodes) < len(views):
        parts.append(Text(f"+{len(views) - len(shown_nodes)} nodes not shown", style="yellow"))
    table = rank_table(views, stragglers, shown, width, behind)
    parts += [Text(""), table]
    shown_columns = {str(c.header) for c in table.columns}
    meant = "   ".join(f"{name}: {words}" for name, words in COLUMNS_SAID.items() if name in shown_columns)
    if len(shown) < len(rows):
        parts.append(_hidden_line([r for r in rows if r not in shown], stragglers, list(late)))
    parts += said
    if follow is not None:
        row = next((r for r in rows if r["rank"] == follow), None)
        spare = max(3, room - 1 - len(shown) - (1 if len(shown) < len(rows) else 0) + panel - 2)
        lines = ((row or {}).get("tail") or [])[-spare:]
        parts.append(
            Panel(
                "\n".join(lines) or "(no lines yet)",
                title=f"r{follow} ({(row or {}).get('node', '?')})",
                title_align="left",
                height=min(len(lines), spare) + 2 if lines else 3,
            )
        )
    parts += [Text(line) for line in footer]
    if legend and meant:
        parts.append(Text(meant, style="dim"))
    parts.append(keys)
    return Group(*parts)


COLUMNS_SAID = {"fwd": "share of a step in its forward", "data": "share waiting for batches"}
"""What the live view's columns from the workers' hook mean, on one line under the table (under 80 columns)."""
