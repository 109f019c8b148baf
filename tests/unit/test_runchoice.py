"""Which run stop/status/logs act on without --run: the pure choice from the nodes' lists of runs."""

from __future__ import annotations

import pytest

from launcher.errors import LauncherError
from launcher.plan.runchoice import ListedRun, choose_run

A, B, OLD = "20261124-100000-aaaaaa", "20261124-110000-bbbbbb", "20261124-090000-000000"


def run(run_id: str, state: str, *nodes: str) -> ListedRun:
    return ListedRun(run_id, state, tuple(nodes) or None)


def test_another_inventorys_run_on_a_shared_node_is_never_chosen() -> None:
    listings = {"node-1": [run(A, "running", "node-1", "node-2")],
                "node-2": [run(A, "running", "node-1", "node-2"), run(B, "running", "node-2", "node-3")]}
    choice = choose_run("A.yaml", ["node-1", "node-2"], listings)
    assert choice is not None and choice.run_id == A
    assert choice.why == f"run {A}: the run of A.yaml that is running (no --run given)"
    assert choose_run("B.yaml", ["node-2", "node-3"], {"node-2": listings["node-2"]}).run_id == B


def test_a_run_on_fewer_nodes_belongs_to_the_inventory_and_the_running_one_wins() -> None:
    # attempt 1 ended on three nodes; attempt 2 (a retry without node-2) runs on two
    listings = {"node-0": [run(OLD, "exited", "node-0", "node-1", "node-2"), run(A, "running", "node-0", "node-1")],
                "node-1": [run(OLD, "exited", "node-0", "node-1", "node-2"), run(A, "running", "node-0", "node-1")]}
    assert choose_run("c.yaml", ["node-0", "node-1", "node-2"], listings).run_id == A


def test_none_running_gives_the_newest_and_no_runs_at_all_gives_none() -> None:
    listings = {"n": [run(OLD, "exited", "n"), run(A, "stopped", "n")]}
    choice = choose_run("c.yaml", ["n"], listings)
    assert choice.run_id == A and choice.why == f"run {A}: the newest run of c.yaml, none is running (no --run given)"
    assert choose_run("c.yaml", ["n"], {"n": []}) is None


def test_runs_recorded_without_their_nodes_count_where_they_are() -> None:
    assert choose_run("c.yaml", ["n", "m"], {"n": [run(A, "running")], "m": [run(A, "running")]}).run_id == A


def test_ambiguity_and_foreign_runs_are_refused_with_the_list() -> None:
    both = {"n": [run(A, "running", "n"), run(B, "running", "n")]}
    with pytest.raises(LauncherError) as err:
        choose_run("c.yaml", ["n"], both)
    assert str(err.value) == (f"2 runs of c.yaml are running: {A} (running on n); {B} (running on n); name one with "
                              "--run")
    with pytest.raises(LauncherError) as err:
        choose_run("c.yaml", ["n"], {"n": [run(B, "running", "n", "other")]})
    assert str(err.value) == f"no run of c.yaml on its nodes (other runs there: {B}); give one with --run"


def test_a_run_is_chosen_by_the_inventory_that_started_it_when_runs_record_it() -> None:
    """Run A from inventory A on node-0 and node-1; run B from inventory B on node-1 alone: both are within A's
    hosts, but only A was started from A (its recorded path says so); B's inventory gets B."""
    a = ListedRun(A, "running", ("node-0", "node-1"), "/work/A.yaml")
    b = ListedRun(B, "running", ("node-1",), "/work/B.yaml")
    listings = {"node-0": [a], "node-1": [a, b]}
    assert choose_run("A.yaml", ["node-0", "node-1"], listings, "/work/A.yaml").run_id == A
    assert choose_run("B.yaml", ["node-1"], {"node-1": [a, b]}, "/work/B.yaml").run_id == B
    with pytest.raises(LauncherError, match=r"2 runs of A\.yaml are running"):  # without the record: ambiguous
        choose_run("A.yaml", ["node-0", "node-1"], {"node-0": [run(A, "running", "node-0", "node-1")],
                                                     "node-1": [run(A, "running", "node-0", "node-1"),
                                                                run(B, "running", "node-1")]})
    old = ListedRun(OLD, "exited", ("node-0",))  # recorded before the inventory was: judged by its nodes
    assert choose_run("A.yaml", ["node-0"], {"node-0": [old]}, "/work/A.yaml").run_id == OLD
