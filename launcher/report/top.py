"""What `inv top` shows (pure): every node's snapshot (launcher/node/top.py) as one JSON object, or as the tables of
the live view and of `--once`: a row per node (load, memory, GPUs) and a row per rank (its helpers beside it: their
count, CPU and memory), stragglers marked."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from launcher.plan.straggler import Straggler
from launcher.report.units import human_bytes

RANK_FIELDS = ("rank", "local_rank", "pid", "state", "cpu_percent", "cpu_s", "rss_bytes", "last_output_s",
               "steps_per_s", "step", "last_line", "steps", "batches", "batches_per_s", "forward_share", "data_share",
               "record", "helpers")
NODE_FIELDS = ("load1", "cpus", "mem_total_bytes", "mem_available_bytes", "gpus")


@dataclass(frozen=True)
class NodeView:
    """One node as the view last saw it: its snapshot, or why there is none (unreachable, its run ended)."""

    name: str
    snapshot: Mapping[str, Any] | None = None
    problem: str | None = None


def ranks_of(views: Sequence[NodeView]) -> list[dict[str, Any]]:
    """Every rank of every node with a snapshot, in rank order, each with its node's name."""
    rows = [{"node": v.name, **r} for v in views if v.snapshot for r in v.snapshot.get("ranks", [])]
    return sorted(rows, key=lambda r: r["rank"])


def rates(views: Sequence[NodeView]) -> dict[int, float | None]:
    return {r["rank"]: r.get("steps_per_s") for r in ranks_of(views)}


def forward_shares(views: Sequence[NodeView]) -> dict[int, float | None]:
    return {r["rank"]: r.get("forward_share") for r in ranks_of(views)}


def as_json(run_id: str, views: Sequence[NodeView], stragglers: Mapping[Any, Straggler]) -> dict[str, Any]:
    """`inv top --once --json`: {"run", "nodes": [...], "ranks": [...]} (GPU fields where a node has GPUs)."""
    nodes = []
    for view in views:
        node: dict[str, Any] = {"node": view.name, "reachable": view.snapshot is not None, "problem": view.problem}
        node.update({k: (view.snapshot or {}).get(k) for k in NODE_FIELDS})
        nodes.append(node)
    ranks = []
    for row in ranks_of(views):
        found = stragglers.get(row["rank"])
        ranks.append({"node": row["node"], **{k: row.get(k) for k in RANK_FIELDS}, "straggler": found is not None,
                      "straggler_by": None if found is None else found.kind,
                      "share_of_median": None if found is None or found.share is None else round(found.share, 3)})
    return {"run": run_id, "nodes": nodes, "ranks": ranks}


def size(value: float | None) -> str:
    return "–" if value is None else human_bytes(value)


def _gpus(gpus: Sequence[Mapping[str, Any]] | None) -> str:
    if not gpus:
        return "–"
    def util(g: Mapping[str, Any]) -> str:  # nvidia-smi says [N/A] where a GPU does not report it
        return "–" if g.get("util_percent") is None else f"{g['util_percent']}%"

    return "  ".join(f"{g.get('index')}: {util(g)} {size(g.get('mem_used_bytes'))}/"
                     f"{size(g.get('mem_total_bytes'))}" for g in gpus)


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
        table.add_row(view.name, f"{snap.get('load1', 0):.2f} ({snap.get('cpus')} CPUs)", used, _gpus(snap.get("gpus")))
    return table


def _number(value: float | None, form: str) -> str:
    return "–" if value is None else format(value, form)


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _rate(row: Mapping[str, Any], found: Straggler | None) -> str:
    if row.get("steps_per_s") is None and row.get("step") is None and not row.get("steps"):
        rate = "off" if (row.get("record") or "").startswith("off") else "no progress lines"
    else:
        rate = _number(row.get("steps_per_s"), ".2f")
    if found is not None and found.kind == "rate":
        rate += f" SLOW {found.share:.2f}x"
    return rate


def _helpers(helpers: Sequence[Mapping[str, Any]] | None) -> str:
    """A rank's helpers in a cell: how many, their CPU % and memory together."""
    if not helpers:
        return ""
    cpu = sum(h.get("cpu_percent") or 0.0 for h in helpers)
    return f"{len(helpers)}: {cpu:.0f}% {size(sum(h.get('rss_bytes') or 0 for h in helpers))}"


def _forward(row: Mapping[str, Any], found: Straggler | None) -> str:
    share = _share(row.get("forward_share"))
    return share + " SLOW" if found is not None and found.kind == "forward" else share


_CELLS: tuple[tuple[str, bool, str | None, Callable[[Mapping[str, Any], Straggler | None], str]], ...] = (
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
    ("last line", False, None, lambda r, _: r.get("last_line") or ""),
)
"""The rank table's columns: name, right-aligned, the field without which no rank has it (the column is left out, so
a run that only prints lines keeps its narrow table), and the cell."""


def rank_table(views: Sequence[NodeView], stragglers: Mapping[Any, Straggler]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", expand=True)
    rows = ranks_of(views)
    cells = [c for c in _CELLS if c[2] is None or any(r.get(c[2]) for r in rows)]
    for name, right, _, _ in cells:
        table.add_column(name, justify="right" if right else "left", no_wrap=True,
                         overflow="ellipsis", ratio=1 if name == "last line" else None)
    for row in rows:
        found = stragglers.get(row["rank"])
        table.add_row(*(cell(row, found) for _, _, _, cell in cells), style="bold red" if found is not None else None)
    return table


def view(run_id: str, views: Sequence[NodeView], stragglers: Mapping[Any, Straggler], follow: int | None = None,
         footer: Sequence[str] = (), height: int = 50) -> RenderableType:
    """The live view's screen: the nodes, the ranks, the followed rank's last lines (as many as the terminal's
    `height` leaves room for), and the keys."""
    parts: list[RenderableType] = [Text(f"run {run_id}", style="bold"), node_table(views), Text(""),
                                   rank_table(views, stragglers)]
    if follow is not None:
        rows = ranks_of(views)
        row = next((r for r in rows if r["rank"] == follow), None)
        room = height - len(views) - len(rows) - len(footer) - 9  # titles, headers, borders, keys
        lines = ((row or {}).get("tail") or [])[-max(3, room):]
        parts.append(Panel("\n".join(lines) or "(no lines yet)", title=f"r{follow} ({(row or {}).get('node', '?')})",
                           title_align="left"))
    parts += [Text(line) for line in footer]
    parts.append(Text("q quit (the run goes on)   s stacks   l follow the next rank's log", style="dim"))
    return Group(*parts)
