"""The loss rules (launcher.watch.loss) over beats as the nodes' agents send them, and what a run stopped for its loss
ends with (launcher.plan.ends, launcher.plan.recovery)."""

from __future__ import annotations

from typing import Any

from launcher.events import EndKind, NodeEnd
from launcher.plan.ends import Supervised, run_end
from launcher.plan.recovery import Final, How, Reason, after_attempt
from launcher.watch.loss import NONFINITE_EXIT, LossWatch, NonFinite, loss_text, loss_value


def rank(number: int, step: int, mean: float | None, loss: Any = None, bad: dict | None = None,
         skipped: int = 0) -> dict[str, Any]:
    return {"rank": number, "loss": mean if loss is None else loss, "loss_step": step, "loss_mean": mean,
            "nonfinite": bad, "loss_skipped": skipped, "loss_state": "on"}


def test_the_first_rank_to_go_nonfinite_is_named_with_its_step_and_last_finite_loss_once() -> None:
    watch = LossWatch()
    watch.feed("node-0", [rank(0, 41, 2.4), rank(1, 41, 2.3)])
    assert watch.look() == []
    watch.feed("node-1", [rank(2, 41, None, "nan", {"step": 41, "value": "nan", "last_finite": 2.31,
                                                     "last_finite_step": 40})])
    [found] = watch.look()
    assert isinstance(found, NonFinite) and (found.rank, found.node, found.step) == (2, "node-1", 41)
    assert found.line() == ("rank 2 (node-1): loss is nan at step 41 (its last finite: 2.31 at step 40); the other "
                            "ranks' losses are finite")
    # the all-reduce carries it to the others at the next step: told once, the first rank stays the cause
    watch.feed("node-0", [rank(0, 42, None, "nan", {"step": 42, "value": "nan", "last_finite": 2.4,
                                                     "last_finite_step": 41})])
    assert watch.look() == []
    first = watch.first_nonfinite()
    assert first is not None and first.rank == 2 and first.followed == ((0, 42),)
    assert "the others followed (rank 0 at step 42)" in first.line()


def test_a_follower_whose_beat_comes_first_waits_for_the_others_and_the_rank_that_went_first_is_named() -> None:
    watch = LossWatch(nonfinite_wait_s=5.0)
    watch.feed("node-1", [rank(1, 38, 2.3)])
    watch.feed("node-0", [rank(0, 41, None, "nan", {"step": 41, "value": "nan", "last_finite": 0.04,
                                                     "last_finite_step": 40})])
    assert watch.look(100.0) == []  # rank 1 is known only to step 38: it may have gone first
    watch.feed("node-1", [rank(1, 41, None, "nan", {"step": 40, "value": "nan", "last_finite": 0.03,
                                                     "last_finite_step": 39})])
    [found] = watch.look(101.0)
    assert (found.rank, found.step, found.followed) == (1, 40, ((0, 41),))  # type: ignore[union-attr]
    unheard = LossWatch(nodes=frozenset({"node-0", "node-1"}))  # a node not heard from at all may hold the first
    unheard.feed("node-0", [rank(0, 41, None, "nan", {"step": 41, "value": "nan", "last_finite": 0.04,
                                                       "last_finite_step": 40})])
    assert unheard.look(100.0) == []
    late = LossWatch(nonfinite_wait_s=5.0)  # a rank never heard from again: told after the wait all the same
    late.feed("node-1", [rank(1, 38, 2.3)])
    late.feed("node-0", [rank(0, 41, None, "nan", {"step": 41, "value": "nan", "last_finite": 0.04,
                                                    "last_finite_step": 40})])
    assert late.look(100.0) == [] and late.look(104.0) == [] and [f.rank for f in late.look(105.0)] == [0]


def test_a_rank_reading_other_data_is_flagged_once_it_has_sat_high_for_its_steps_and_the_others_are_not() -> None:
    watch = LossWatch(outlier_steps=100)
    for step in range(0, 400, 20):
        watch.feed("node-0", [rank(0, step, 0.5), rank(1, step, 0.55)])
        watch.feed("node-1", [rank(2, step, 0.52), rank(3, step, 2.1)])
        found = watch.look()
        if step < 100:
            assert found == [], step
        elif found:
            [outlier] = found
            assert (outlier.kind, outlier.rank, outlier.steps) == ("outlier", 3, 100)
            assert outlier.line() == ("rank 3 (node-1): its loss has been 4.0x the median of the other ranks for "
                                      "100 steps: its data?")
            break
    else:
        raise AssertionError("rank 3 never flagged")
    watch.feed("node-1", [rank(2, 420, 0.52), rank(3, 420, 2.1)])
    assert watch.look() == []  # said once


def test_losses_that_can_be_negative_or_sit_below_the_others_are_no_outlier() -> None:
    watch = LossWatch(outlier_steps=0)
    for step in (10, 20, 30):
        watch.feed("node-0", [rank(0, step, -3.0), rank(1, step, -1.0), rank(2, step, -1.1)])
        assert watch.look() == []
    low = LossWatch(outlier_steps=0)
    for step in (10, 20, 30):
        low.feed("node-0", [rank(0, step, 0.1), rank(1, step, 1.0), rank(2, step, 1.1)])
        assert low.look() == []


def test_a_loss_that_rises_well_past_its_low_and_stays_there_is_marked_once() -> None:
    watch = LossWatch(spike_looks=3)
    found = []
    for step, mean in enumerate([3.0, 2.0, 1.0, 0.8, 0.9, 3.0, 3.1, 3.2, 3.3, 3.4], start=1):
        watch.feed("node-0", [rank(0, step * 10, mean), rank(1, step * 10, mean)])
        found += watch.look()
    [spike] = found
    assert spike.kind == "spike" and spike.step == 80
    assert spike.line() == ("the loss rose to 3.2 at step 80, 4.0x its low of 0.8 (step 40): a spike, or the run "
                            "diverges")


def test_beats_without_a_loss_say_nothing_and_values_read_as_json_carries_them() -> None:
    watch = LossWatch()
    watch.feed("node-0", [{"rank": 0, "steps": 5}, {"rank": 1, "steps": 5}])
    assert watch.look() == [] and watch.first_nonfinite() is None
    assert loss_value("nan") != loss_value("nan") and loss_value("-inf") == float("-inf") and loss_value(None) is None
    assert (loss_text(2.31234), loss_text("inf"), loss_text(None)) == ("2.312", "inf", "-")


def test_a_run_stopped_for_its_loss_ends_with_its_code_and_the_loss_as_the_cause_and_is_not_retried() -> None:
    bad = NonFinite(1, "node-1", 41, "nan", 2.31, 40)
    ends = [NodeEnd(name, EndKind.EXITED, 0.0, -15, asked_to_stop=True) for name in ("node-0", "node-1")]
    ended = run_end(ends, Supervised(2, nonfinite=bad))
    assert ended.code == NONFINITE_EXIT == 65
    assert (ended.end.how, ended.end.node, ended.end.rank, ended.end.step) == (How.NONFINITE, "node-1", 1, 41)
    assert ended.end.why.startswith("rank 1 (node-1): loss is nan at step 41")
    decision = after_attempt(ended.end, [], nodes=["node-0", "node-1"], min_nodes=2, retries=3, on_hang="stop",
                             failures={}, now=0.0, cooldown=0.0)
    assert isinstance(decision, Final) and decision.reason == Reason.LOSS_NONFINITE


def test_a_nodes_own_words_for_a_nonfinite_record_name_the_rank_step_and_last_finite_value() -> None:
    from launcher.node.agent.nonfinite import words

    record = {"bad": float("nan"), "bad_step": 40, "good": 0.0315518, "good_step": 39}
    assert words(record, 1) == "rank 1's loss was nan at step 40 (its last finite: 0.03155 at step 39)"
    first = {"bad": float("inf"), "bad_step": 1, "good": float("nan"), "good_step": 0}
    assert words(first, None) == "a rank's loss was inf at step 1 (no finite loss before it)"
