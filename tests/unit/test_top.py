"""inv top's pure parts: the straggler rules (by rate, by forward share, by arrival on recorded collectives), a rank's
progress from its lines, the JSON shape, the inventory's `job.progress`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.console import Console

from launcher.config.inventory import load_inventory
from launcher.errors import LauncherError
from launcher.node.agent.sampler import RankProgress
from launcher.options import DEFAULT_PROGRESS
from launcher.report.stragglerline import straggler_line
from launcher.report.toptables import rank_table
from launcher.watch.straggler import StragglerWatch, heavy_ranks, slow_ranks
from launcher.watch.topmodel import NodeView, TopJudge, as_json, forward_shares, rates
from tests.unit.test_arrival import recorded


def test_a_rank_below_the_factor_of_the_median_is_slow_and_none_without_two_rates() -> None:
    assert slow_ranks({0: 10.0, 1: 10.0, 2: 9.5, 3: 3.3}, 0.8) == {3: pytest.approx(3.3 / 9.75)}
    assert slow_ranks({0: 10.0, 1: 8.5}, 0.8) == {}  # 8.5 / 9.25 = 0.92
    assert slow_ranks({0: 10.0, 1: None}, 0.8) == {}  # one rate is no median
    assert slow_ranks({0: 0.0, 1: 0.0}, 0.8) == {}  # everyone stopped: nobody is behind


def test_a_straggler_is_flagged_after_the_hold_without_a_break_and_said_once() -> None:
    watch = StragglerWatch(0.8, 60.0)
    slow = {0: 10.0, 1: 10.0, 2: 10.0, 3: 4.5}
    assert watch.look(0.0, slow) == {}
    assert watch.look(59.0, slow) == {}
    found = watch.look(60.0, slow)
    assert list(found) == [3] and found[3].for_s == 60.0
    assert [s.key for s in watch.new(found)] == [3]
    assert watch.new(watch.look(61.0, slow)) == []  # told once
    assert straggler_line(found[3], "node-1") == "straggler: node-1 r3 at 0.45x the median rate for 60 s"
    assert watch.look(62.0, {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0}) == {}  # caught up: the clock starts again
    assert watch.look(100.0, slow) == {} and list(watch.look(160.0, slow)) == [3]


def feed(progress: RankProgress, text: str, now: float, history: bool = False) -> None:
    progress.feed(text, "stdout.log", 20, now, history)


def test_a_ranks_rate_is_steps_per_second_across_epochs_and_what_came_before_the_look_has_no_time() -> None:
    progress = RankProgress(re.compile(DEFAULT_PROGRESS), 30.0)
    feed(progress, "".join(f"epoch 0 step {i} loss 1.0\n" for i in range(50)), 0.0, history=True)
    assert progress.last_step == 49 and progress.rate(0.0) is None  # 50 old steps, but no times for them
    feed(progress, "epoch 0 step 50 loss 0.9\n", 1.0)
    feed(progress, "epoch 1 step 0 loss 0.8\nepoch 1 step 1 loss 0.8\n", 2.0)  # a new epoch counts from 0
    assert progress.total == 3 and progress.rate(2.0) == pytest.approx(2.0)
    assert progress.last_line == "epoch 1 step 1 loss 0.8"
    assert progress.rate(10.0) == pytest.approx(2 / 9)  # still for long: the rate falls toward 0


def test_tqdm_bars_and_unfinished_lines_count_when_they_end() -> None:
    progress = RankProgress(re.compile(DEFAULT_PROGRESS), 30.0)
    feed(progress, " 10%|#         | 10/100 [00:01<00:09, 9.9it/s]\r 20%|##        | 20/100 [00:02", 0.0)
    assert progress.last_step == 10  # the second bar has no end yet
    feed(progress, "<00:08, 9.9it/s]\r", 1.0)
    feed(progress, " 30%|###       | 30/100 [00:03<00:07, 9.9it/s]\r", 2.0)
    assert progress.last_step == 30 and progress.rate(2.0) == pytest.approx(10.0)


def test_the_json_snapshot_has_every_rank_in_order_with_its_node_and_straggler_flag() -> None:
    rank = {"local_rank": 0, "pid": 11, "state": "S", "cpu_percent": 50.0, "rss_bytes": 1 << 20,
            "last_output_s": 0.5, "steps_per_s": 10.0, "step": 7, "last_line": "step 7"}
    views = [NodeView("node-0", {"load1": 1.0, "cpus": 2, "mem_total_bytes": 8, "mem_available_bytes": 4,
                                 "gpus": None, "ranks": [{**rank, "rank": 1}, {**rank, "rank": 0}]}),
             NodeView("node-1", problem="node-1: connection timed out")]
    watch = StragglerWatch(0.8, 0.0)
    found = watch.look(0.0, {0: 10.0, 1: 2.0, 2: 10.0})
    snap = as_json("20261125-000000-abcdef", views, found)
    assert snap["run"] == "20261125-000000-abcdef"
    assert [(n["node"], n["reachable"]) for n in snap["nodes"]] == [("node-0", True), ("node-1", False)]
    assert [(r["node"], r["rank"], r["straggler"]) for r in snap["ranks"]] == [("node-0", 0, False),
                                                                             ("node-0", 1, True)]
    assert set(snap["ranks"][0]) >= {"node", "rank", "local_rank", "pid", "state", "cpu_percent", "rss_bytes",
                                     "last_output_s", "steps_per_s", "straggler"}


def test_the_loss_column_says_each_ranks_last_loss_a_nan_by_its_step_and_a_rank_far_above_the_others() -> None:
    rank = {"local_rank": 0, "pid": 11, "state": "S", "cpu_percent": 50.0, "rss_bytes": 1 << 20,
            "last_output_s": 0.5, "steps_per_s": 10.0, "step": 7, "last_line": "step 7", "loss_step": 7}
    losses = [(0.52, 0.5, None), (0.55, 0.55, None), (2.1, 2.2, None),
              ("nan", 0.5, {"step": 41, "value": "nan", "last_finite": 0.5, "last_finite_step": 40})]
    views = [NodeView("node-0", {"ranks": [{**rank, "rank": i, "loss": loss, "loss_mean": mean, "nonfinite": bad}
                                           for i, (loss, mean, bad) in enumerate(losses)]})]
    snap = as_json("r", views, {})
    assert [r["loss_outlier"] for r in snap["ranks"]] == [None, None, 4.4, None]  # 2.2 / the median of the others (0.5)
    text = _rendered(rank_table(views, {}))
    assert "loss" in text and "0.52" in text and "2.1 4.4x" in text and "nan at 41" in text, text


def test_job_progress_must_be_a_regular_expression_with_a_group(tmp_path: Path) -> None:
    def inventory(progress: str) -> Path:
        path = tmp_path / "cluster.yaml"
        path.write_text("hosts: [{name: a}]\nrendezvous: {master_addr: a}\n"
                        f"job: {{script: t.py, progress: '{progress}'}}\n")
        return path

    assert load_inventory(inventory(r"it (?P<step>\d+)")).job.progress == r"it (?P<step>\d+)"
    with pytest.raises(LauncherError, match=r"cluster.yaml:3: job.progress: is not a regular expression"):
        load_inventory(inventory("it ("))
    with pytest.raises(LauncherError, match=r"cluster.yaml:3: job.progress: has no group for the step number"):
        load_inventory(inventory(r"it \d+"))


def test_in_lockstep_the_rank_that_computes_more_of_each_step_is_the_straggler() -> None:
    rates = {0: 5.0, 1: 5.0, 2: 5.0, 3: 4.9}  # lockstep DDP: every rank at the slow one's pace
    forward = {0: 0.23, 1: 0.22, 2: 0.24, 3: 0.41}
    assert heavy_ranks(forward, 0.8) == {3: (0.41, pytest.approx(0.235))}
    assert heavy_ranks({0: 0.02, 1: 0.02, 2: 0.03}, 0.8) == {}  # 1.5x the median, but 0.01 apart: noise
    assert heavy_ranks({0: 0.5, 1: 0.55}, 0.8) == {}  # within the factor
    assert heavy_ranks({0: 0.3, 1: None}, 0.8) == {}  # one share is no median
    watch = StragglerWatch(0.8, 10.0)
    assert watch.look(0.0, rates, forward) == {}
    found = watch.look(10.0, rates, forward)
    assert list(found) == [3] and found[3].kind == "forward" and found[3].share == pytest.approx(4.9 / 5.0)
    assert straggler_line(found[3], "node-1") == (
        "straggler: node-1 r3: 41% of each step computing (forward) against a median of 24%; the others wait for it")
    # Ranks that do not synchronise: today's rule by rate, and the forward rule stays out of it.
    by_rate = StragglerWatch(0.8, 0.0).look(0.0, {0: 10.0, 1: 10.0, 2: 3.0}, {0: 0.2, 1: 0.6, 2: 0.2})
    assert list(by_rate) == [2] and by_rate[2].kind == "rate"


def test_the_json_snapshot_carries_records_helpers_and_the_forward_straggler() -> None:
    helper = {"pid": 12, "start": 5, "parent": 11, "state": "S", "cpu_s": 1.0, "cpu_percent": 30.0,
              "rss_bytes": 1 << 20}
    rank = {"local_rank": 0, "pid": 11, "state": "S", "cpu_percent": 50.0, "cpu_s": 2.0, "rss_bytes": 1 << 20,
            "last_output_s": None, "steps_per_s": 5.0, "step": None, "last_line": None, "steps": 40,
            "batches": 40, "batches_per_s": 5.0, "data_share": 0.05, "record": "on"}
    views = [NodeView("node-0", {"ranks": [{**rank, "rank": 0, "forward_share": 0.2, "helpers": [helper]},
                                           {**rank, "rank": 1, "forward_share": 0.5, "helpers": []}]}),
             NodeView("node-1", {"ranks": [{**rank, "rank": 2, "forward_share": 0.21, "helpers": []}]})]
    found = StragglerWatch(0.8, 0.0).look(0.0, rates(views), forward_shares(views))
    snap = as_json("20261125-000000-abcdef", views, found)
    first, second = snap["ranks"][0], snap["ranks"][1]
    assert first["helpers"] == [helper] and first["steps"] == 40 and first["record"] == "on"
    assert {"steps_per_s", "batches_per_s", "forward_share", "data_share", "helpers"} <= set(first)
    assert (second["straggler"], second["straggler_by"], second["share_of_median"]) == (True, "forward", 1.0)
    console = Console(width=200, record=True)
    console.print(rank_table(views, found))
    text = console.export_text()
    assert "1: 30% 1.0 MiB" in text and "50% SLOW" in text


def test_a_run_that_only_prints_lines_keeps_the_narrow_table() -> None:
    row = {"rank": 0, "local_rank": 0, "pid": 11, "state": "S", "cpu_percent": 5.0, "rss_bytes": 1 << 20,
           "last_output_s": 0.0, "steps_per_s": 9.6, "step": 56, "last_line": "rank 0 step 56", "record": None,
           "helpers": []}
    console = Console(width=80, record=True)
    console.print(rank_table([NodeView("node-0", {"ranks": [row]})], {}))
    text = console.export_text()
    assert "fwd" not in text and "helpers" not in text and "batches/s" not in text
    assert "node-0    r0" in text and "rank 0 step 56" in text  # what fits in 80 columns, as before records


def recorded_views(case: str, **fields: object) -> tuple[list[NodeView], float]:
    """A recorded gloo case (tests/data/collectives) as `inv top` sees it: each rank on a node of its own, in lockstep
    (the same rate), with its collectives as the node's snapshot carries them; and the wall time of the recording."""
    ranks, wall = recorded(case)
    rows = [{"rank": r["rank"], "local_rank": 0, "pid": 4000 + r["rank"], "state": "S", "cpu_percent": 99.0,
             "rss_bytes": 300 << 20, "last_output_s": 0.2, "steps_per_s": 5.0, "step": 60, "steps": 60,
             "record": "on", "forward_share": 0.9 if r["rank"] == 0 else 0.1, "last_line": f"rank {r['rank']} step 60",
             "collectives": r["collectives"], **fields} for r in ranks]
    return [NodeView(f"node-{row['rank']}", {"ranks": [row]}) for row in rows], wall


def test_top_flags_the_recorded_slow_rank_by_its_arrival_and_marks_what_the_others_lose() -> None:
    views, wall = recorded_views("slow")
    look = TopJudge(0.8, 0.0).look(views, wall, 0.0)
    assert list(look.stragglers) == [1] and look.stragglers[1].kind == "arrival"  # not rank 0's forward share
    lost = look.stragglers[1].lost_s
    assert lost is not None and lost == pytest.approx(0.13, abs=0.03)
    console = Console(width=120, record=True)
    console.print(rank_table(views, look.stragglers))
    row = next(line for line in console.export_text().splitlines() if " r1 " in line)
    assert f"5.00 SLOW +{lost:.2f} s/step" in row, row
    snap = as_json("run-x", views, look.stragglers, look.behind, look.sources)
    slow = snap["ranks"][1]
    assert (slow["straggler_by"], slow["lost_s_per_step"], slow["collectives_source"]) == ("arrival", lost,
                                                                                         "flight recorder")
    assert snap["ranks"][0]["straggler"] is False and snap["ranks"][0]["lost_s_per_step"] is None


def test_a_straggler_by_arrival_is_held_in_the_live_view_and_a_healthy_recording_flags_nobody() -> None:
    views, wall = recorded_views("slow")
    judge = TopJudge(0.8, 60.0)
    assert judge.look(views, wall, 0.0).stragglers == {}
    assert list(judge.look(views, wall + 1.0, 60.0).stragglers) == [1]  # the same snapshot: fed once, still late
    healthy, wall = recorded_views("healthy")
    look = TopJudge(0.8, 0.0).look(healthy, wall, 0.0)
    assert look.stragglers == {} and look.behind == []  # one collective apart at one look: reads a second apart


def test_the_json_says_each_ranks_collectives_source_and_the_collective_it_is_behind_in() -> None:
    views, wall = recorded_views("hang")
    views.append(NodeView("node-2", {"ranks": [{"rank": 2, "pid": 4002, "collectives": None}]}))
    look = TopJudge(0.8, 0.0).look(views, wall, 0.0)
    assert look.behind == [] and look.sources == {0: "flight recorder", 1: "flight recorder", 2: None}
    snap = as_json("run-x", views, look.stragglers, look.behind, look.sources)
    assert [(r["rank"], r["collectives_source"], r["behind"]) for r in snap["ranks"]] == [
        (0, "flight recorder", None), (1, "flight recorder", None), (2, None, None)]  # rank 2 has none: no judging
    views, wall = recorded_views("hang")
    look = TopJudge(0.8, 0.0).look(views, wall + 25.0, 0.0)
    snap = as_json("run-x", views, look.stragglers, look.behind, look.sources)
    # rank 0 entered all_reduce #46 9 s before the files were written: 34 s of waiting 25 s later
    assert snap["ranks"][1]["behind"] == {"collective": "all_reduce #46 of default_pg", "last": 45,
                                          "waited_s": 34.1, "hang_suspected": False, "judged": None, "verdict": None}
    assert look.behind[0].due  # its stacks are to be judged (the verdict then: test_top_verdict.py)
    assert snap["ranks"][0]["behind"] is None and snap["ranks"][1]["straggler_by"] is None


def _rendered(table) -> str:  # type: ignore[no-untyped-def]
    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()
