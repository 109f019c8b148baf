"""Which run `inv stop/status/logs` act on when no `--run` is given: a pure choice from what the nodes list.

Each node picking its own newest run stopped another inventory's run on a node the two share (run A on node-1 and
node-2, run B on node-2 and node-3: `inv stop --hosts A.yaml` stopped B on node-2 and left A running there). So
the controller asks every node for its runs, each with the nodes it was started on (the node's command.json), and
chooses one run for the whole inventory:

- a run belongs to this inventory when it was started from it (each run records the inventory's path on the
  controller); a run recorded without one (an older launcher's) when every node it was started on is one of the
  inventory's hosts (a run of another inventory that shares a node does not; a run with --exclude or a retry on
  fewer nodes does);
- of those, the one still running somewhere; several running: refused, with the list (name one with --run);
- none running: the newest (run ids sort by their start time), so `inv status` shows how the last run ended.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.errors import LauncherError


@dataclass(frozen=True)
class ListedRun:
    """One run as one node lists it."""

    run_id: str
    state: str
    """running, exited, stopped or lost (the node's view)."""
    nodes: tuple[str, ...] | None = None
    """The nodes the run was started on (None: a run recorded before the launcher wrote them)."""
    inventory: str | None = None
    """The inventory it was started from, as the controller resolved its path (None: recorded before that)."""


@dataclass(frozen=True)
class Choice:
    run_id: str
    why: str
    """One sentence for the console: which run, and why that one."""


def choose_run(
    source: str, hosts: Sequence[str], listings: Mapping[str, Sequence[ListedRun]], inventory_id: str | None = None
) -> Choice | None:
    """The run of the inventory `source` (its `hosts`; `inventory_id`: its path as runs record it) to act on, from
    each reachable node's `listings`; None when the nodes have no run at all.

    Raises `LauncherError` when only other inventories' runs are there, or when several of this one's are running
    (the sentence lists them).
    """
    inventory = set(hosts)
    nodes_of: dict[str, set[str]] = {}
    started_from: dict[str, str | None] = {}
    running: dict[str, list[str]] = {}
    for node, runs in listings.items():
        for run in runs:
            where = nodes_of.setdefault(run.run_id, set())
            where.update(run.nodes if run.nodes is not None else (node,))
            started_from[run.run_id] = started_from.get(run.run_id) or run.inventory
            if run.state == "running":
                running.setdefault(run.run_id, []).append(node)

    def belongs(run_id: str) -> bool:
        recorded = started_from[run_id]
        if recorded is not None and inventory_id is not None:
            return recorded == inventory_id
        return nodes_of[run_id] <= inventory

    ours = sorted(r for r in nodes_of if belongs(r))
    if not nodes_of:
        return None
    if not ours:
        others = ", ".join(sorted(nodes_of)[-5:])
        raise LauncherError(
            f"no run of {source} on its nodes"
            + (f" (other runs there: {others}); " if others else "; ")
            + "give one with --run"
        )
    live = [r for r in ours if r in running]
    if len(live) > 1:
        listed = "; ".join(f"{r} (running on {', '.join(sorted(running[r]))})" for r in live)
        raise LauncherError(f"{len(live)} runs of {source} are running: {listed}; name one with --run")
    if live:
        return Choice(live[0], f"run {live[0]}: the run of {source} that is running (no --run given)")
    return Choice(ours[-1], f"run {ours[-1]}: the newest run of {source}, none is running (no --run given)")
