"""Which nodes of a c10d run stand by as spares (launcher.watch.spares), and how a run's end says theirs
(launcher.plan.ends): no failure, no root cause."""

from __future__ import annotations

from launcher.events import EndKind, NodeEnd
from launcher.limits import SPARE_AFTER_S
from launcher.plan.ends import How, Supervised, run_end
from launcher.watch.spares import SpareWatch

RANK = [{"rank": 0}]


def test_a_node_without_workers_while_the_others_train_is_a_spare_once_and_only_where_there_can_be_one() -> None:
    watch = SpareWatch(True)
    assert not watch.observe(0.0, "node-2", [])  # nothing started anywhere yet
    watch.observe(1.0, "node-0", RANK)
    assert not watch.observe(1.5, "node-2", [])  # others have workers: from here it counts
    assert not watch.observe(1.5 + SPARE_AFTER_S - 0.1, "node-2", [])  # slower to spawn them, maybe
    assert watch.observe(1.5 + SPARE_AFTER_S, "node-2", [])
    assert not watch.observe(30.0, "node-2", []) and watch.spares == {"node-2"}  # said once
    watch.observe(40.0, "node-2", RANK)  # the group took it (a node left): no longer a spare
    assert watch.spares == set()
    static = SpareWatch(False)
    static.observe(0.0, "node-0", RANK)
    assert not static.observe(0.0, "node-1", []) and not static.observe(100.0, "node-1", [])


def test_a_spares_failed_end_is_neither_the_runs_failure_nor_a_node_it_went_on_without() -> None:
    ends = [NodeEnd("node-0", EndKind.EXITED, 1.0, 0), NodeEnd("node-1", EndKind.EXITED, 1.0, 0),
            NodeEnd("node-2", EndKind.EXITED, 2.0, 1)]
    ended = run_end(ends, Supervised(2, spares=frozenset({"node-2"})))
    assert (ended.end.how, ended.code, ended.went_on_without) == (How.OK, 0, ())
    assert [e.node for e in ended.stood_by] == ["node-2"]
    without = run_end(ends, Supervised(2))  # as it was: a node the group went on without
    assert [e.node for e in without.went_on_without] == ["node-2"] and not without.stood_by
