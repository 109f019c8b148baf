"""What `inv top` knows of a run (pure): every node's snapshot (launcher/node/top.py) as the view last saw it, each
rank with its node, the figures the straggler rule reads, the ranks worth a row first, and `--json`'s object.
Rendering is launcher/report/toptables.py and topview.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.watch.straggler import Straggler

RANK_FIELDS = ("rank", "local_rank", "pid", "state", "cpu_percent", "cpu_s", "rss_bytes", "last_output_s",
               "steps_per_s", "step", "last_line", "steps", "batches", "batches_per_s", "forward_share", "data_share",
               "record", "helpers")
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


def flagged(row: Mapping[str, Any], stragglers: Mapping[Any, Straggler]) -> bool:
    """A rank worth a row before the quiet healthy ones: a straggler, stopped, stuck, a zombie, or its record off."""
    return (row["rank"] in stragglers or (row.get("state") or "") in ("D", "T", "t", "Z")
            or str(row.get("record") or "").startswith("off"))
