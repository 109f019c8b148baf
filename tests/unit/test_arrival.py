"""The collectives across ranks (launcher.watch.arrival): the ranks behind a hang's collective, a collective stuck on
every rank, the rank that arrives last (the straggler rule by arrival), and the hang verdict that starts from them
(launcher.watch.verdict). The recorded cases are real collectives files of two gloo ranks
(tests/scripts/record_collectives.py), read as the node's agent reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.node.agent.records import RankCollectives
from launcher.report.stragglerline import straggler_line
from launcher.watch.arrival import Arrivals
from launcher.watch.stackgroups import RankStack, rank_stacks
from launcher.watch.straggler import StragglerWatch, lateness
from launcher.watch.verdict import judge
from tests.unit.test_hang_verdict import ALL_REDUCE, BACKWARD, BARRIER, HOOK, HOOK_SLEEP, SAVE, SITE, STDLIB, rank

DATA = Path(__file__).resolve().parents[1] / "data" / "collectives"


def recorded(case: str) -> tuple[list[dict[str, Any]], float]:
    """A recorded case as one node's beat (each rank's `collectives` as the agent passes them on), and the wall time
    the files were written (the beat's `now`)."""
    ranks, wall = [], 0.0
    for path in sorted((DATA / case).glob("rank*.json")):
        data = json.loads(path.read_text())
        wall = max(wall, data["wall"])
        ranks.append({"rank": data["rank"], "collectives": RankCollectives().fields(data, data["wall"])})
    return ranks, wall


def beat(groups: dict[int, tuple[int, int]], source: str | None = "flight recorder", age: float = 0.5,
         name: str = "all_reduce") -> list[dict[str, Any]]:
    """Ranks whose default group's last enqueued and completed collectives are given."""
    return [{"rank": rank, "collectives": None if source is None else {
        "source": source, "age_s": age, "arrivals": {}, "why": None,
        "groups": {"0": {"desc": "default_pg", "size": None, "enqueued": enq, "started": -1, "completed": done,
                         "in_flight": [done + 1, name] if enq > done else None}}}}
            for rank, (enq, done) in groups.items()]


def test_the_rank_that_never_entered_the_collective_is_behind_in_a_recorded_gloo_hang() -> None:
    ranks, wall = recorded("hang")
    arrivals = Arrivals()
    arrivals.feed(ranks, wall)
    [behind] = arrivals.behind(wall)
    assert list(behind.late) == [1] and behind.entered == (0,)
    assert behind.seq == behind.late[1] + 1 and behind.name == "all_reduce" and behind.desc == "default_pg"
    assert behind.line() == (f"rank 1 never entered all_reduce #{behind.seq} of default_pg (its last: "
                             f"#{behind.seq - 1}), which rank 0 entered")
    assert arrivals.sources() == {0: "flight recorder", 1: "flight recorder"}


def test_a_recorded_gloo_hang_is_judged_from_the_rank_behind_whatever_the_waiting_rank_does() -> None:
    ranks, wall = recorded("hang")
    arrivals = Arrivals()
    arrivals.feed(ranks, wall)
    # rank 0 as a GPU shows it: busy on a line nobody knows as a wait (the stacks alone said "not a hang")
    look = [rank("node-0", 0, SAVE, "R"), rank("node-1", 1, HOOK_SLEEP)]
    verdict = judge(look, look, 5.0, behind=arrivals.behind(wall))
    assert verdict.hang, verdict.why
    seq = arrivals.behind(wall)[0].seq
    assert verdict.why == (f"rank 1 never entered all_reduce #{seq} of default_pg (its last: #{seq - 1}), which "
                           "rank 0 entered; rank 1 (node-1, pid 4241) is in time.sleep (boring.py:12, in "
                           "training_step), its stack unchanged in 5 s")


def test_a_rank_behind_that_is_at_work_is_no_hang_and_the_line_says_what_it_does() -> None:
    arrivals = Arrivals()
    arrivals.feed(beat({0: (41, 40), 1: (40, 40)}, name="barrier"), 100.0)
    behind = arrivals.behind(100.0)
    writing = [rank("node-0", 0, BARRIER), rank("node-1", 1, SAVE, "R")]
    verdict = judge(writing, writing, 5.0, behind=behind)
    assert not verdict.hang
    assert verdict.why == ("rank 1 never entered barrier #41 of default_pg (its last: #40), which rank 0 entered; but "
                           "rank 1 (node-1, pid 4241) is at work: it is in save_checkpoint (job.py:14), outside any "
                           "wait")
    moved = [rank("node-0", 0, BARRIER), rank("node-1", 1, SAVE.replace("line 14", "line 15"))]
    assert "its stack moved in 5 s" in judge(writing, moved, 5.0, behind=behind).why
    in_io = [rank("node-0", 0, BARRIER), rank("node-1", 1, None, "D")]
    assert "uninterruptible I/O" in judge(in_io, in_io, 5.0, behind=behind).why
    stopped = [rank("node-0", 0, BARRIER), rank("node-1", 1, None, "T")]
    assert judge(stopped, stopped, 5.0, behind=behind).hang


FORKED = f"""  File "{STDLIB}/multiprocessing/process.py", line 108 in run
  File "{STDLIB}/multiprocessing/popen_fork.py", line 71 in _launch
  File "{STDLIB}/multiprocessing/process.py", line 121 in start
  File "{SITE}/torch/utils/data/dataloader.py", line 1176 in __init__
  File "{SITE}/torch/utils/data/dataloader.py", line 500 in __iter__
  File "/home/u/job.py", line 30 in <module>
"""
"""A DataLoader worker's frames below its loop: those of the rank it was forked from (as torch 2.13 shows them)."""
LOADER_WAIT = f"""Current thread 0x00007f0000000002 (most recent call first):
  File "{STDLIB}/selectors.py", line 415 in select
  File "{STDLIB}/multiprocessing/connection.py", line 947 in wait
  File "{STDLIB}/multiprocessing/queues.py", line 113 in get
  File "{SITE}/torch/utils/data/dataloader.py", line 1291 in _try_get_data
  File "{SITE}/torch/utils/data/dataloader.py", line 1464 in _get_data
  File "{SITE}/torch/utils/data/dataloader.py", line 725 in __next__
  File "{HOOK}", line 152 in __next__
  File "/home/u/job.py", line 30 in <module>
"""
WORKER_STUCK = f"""Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/data.py", line 7 in __getitem__
  File "{SITE}/torch/utils/data/_utils/fetch.py", line 54 in fetch
  File "{SITE}/torch/utils/data/_utils/worker.py", line 374 in _worker_loop
""" + FORKED
WORKER_IDLE = f"""Current thread 0x00007f0000000002 (most recent call first):
  File "{STDLIB}/selectors.py", line 415 in select
  File "{STDLIB}/multiprocessing/queues.py", line 113 in get
  File "{SITE}/torch/utils/data/_utils/worker.py", line 334 in _worker_loop
""" + FORKED


def loader_rank(*helpers: tuple[int, str]) -> RankStack:
    """Rank 1 waiting for its DataLoader, with its workers (pid, stack) as the node's agent reports them."""
    worker = {"rank": 1, "local_rank": 0, "pid": 4241, "state": "S", "state_name": "sleeping", "stack": LOADER_WAIT,
              "why": None, "lines": {"/home/u/data.py:7": "time.sleep(600)"}}
    [found] = rank_stacks("node-1", [worker, *({**worker, "pid": pid, "stack": text, "helper": True, "parent": 4241,
                                                "owner": 4241} for pid, text in helpers)])
    return found


def test_a_rank_waiting_for_its_loader_waits_on_data_and_its_workers_are_not_said_to() -> None:
    from launcher.watch.frames import in_dataset, wait_of

    loading = loader_rank((5001, WORKER_IDLE), (5002, WORKER_STUCK))
    assert wait_of(loading.frames) is not None and wait_of(loading.frames).kind == "data"  # type: ignore[union-attr]
    idle, stuck = loading.helpers
    assert wait_of(idle.frames).kind == "lock" and not in_dataset(idle.frames)  # type: ignore[union-attr]
    assert in_dataset(stuck.frames) and stuck.place == "is in time.sleep (data.py:7, in __getitem__)"


def test_a_dataloader_worker_stuck_in_the_dataset_is_a_hang_that_names_the_worker() -> None:
    arrivals = Arrivals()
    arrivals.feed(beat({0: (41, 40), 1: (40, 40)}), 100.0)
    loading = loader_rank((5001, WORKER_IDLE), (5002, WORKER_STUCK))
    look = [rank("node-0", 0, BACKWARD), loading]
    verdict = judge(look, look, 5.0, behind=arrivals.behind(100.0))
    assert verdict.hang, verdict.why
    assert verdict.why.endswith("rank 1 (node-1, pid 4241) waits for its DataLoader worker pid 5002, stuck: it is in "
                                "time.sleep (data.py:7, in __getitem__), its stack unchanged in 5 s")
    later = loader_rank((5001, WORKER_IDLE), (5002, WORKER_STUCK.replace("line 7", "line 8")))
    verdict = judge(look, [look[0], later], 5.0, behind=arrivals.behind(100.0))
    assert not verdict.hang and "whose worker pid 5002 is at work" in verdict.why


def test_every_rank_in_one_collective_that_none_completed_is_the_collective_itself() -> None:
    arrivals = Arrivals()
    arrivals.feed(beat({0: (41, 40), 1: (41, 40)}), 100.0)
    assert arrivals.behind(100.0) == []
    [stuck] = arrivals.stuck(100.0)
    spinning = [rank("node-0", 0, SAVE, "R"), rank("node-1", 1, SAVE, "R")]  # on a GPU: anywhere, spinning
    verdict = judge(spinning, spinning, 5.0, stuck=[stuck])
    assert verdict.hang
    assert verdict.why == ("every rank of default_pg (ranks 0,1) entered all_reduce #41 and none completed it: the "
                           "collective itself is stuck (the network, or NCCL); no stack moved in 5 s")


def test_without_every_ranks_collectives_fresh_the_stacks_decide_alone() -> None:
    arrivals = Arrivals()
    arrivals.feed(beat({0: (41, 40)}) + beat({1: (40, 40)}, source=None), 100.0)
    assert arrivals.behind(100.0) is None and arrivals.sources() == {0: "flight recorder", 1: None}
    stale = Arrivals()
    stale.feed(beat({0: (41, 40), 1: (40, 40)}, age=30.0), 100.0)
    assert stale.behind(100.0) is None
    look = [rank("node-0", 0, ALL_REDUCE), rank("node-1", 1, SAVE, "R")]
    assert judge(look, look, 5.0, behind=arrivals.behind(100.0) or []).why == "rank 1 is busy, not waiting"


def test_the_slow_rank_of_a_recorded_gloo_run_arrives_last_and_is_flagged_alone() -> None:
    ranks, wall = recorded("slow")
    arrivals = Arrivals()
    arrivals.feed(ranks, wall)
    late = lateness(arrivals, wall)
    assert late is not None
    # 0.1 s more a step of 0.15 s: rank 0 waits two thirds of its time for rank 1, which never waits
    assert late[1].last_share > 0.9 and late[1].wait_share == pytest.approx(0.67, abs=0.1), late
    assert late.get(0) is None or late[0].wait_share < 0.02, late
    found = StragglerWatch(0.8, 0.0).look(0.0, {0: 5.0, 1: 5.0}, {0: 0.9, 1: 0.1}, late)
    assert list(found) == [1] and found[1].kind == "arrival"
    assert found[1].lost_s == pytest.approx(late[1].wait_share / 5.0, abs=1e-3)
    assert straggler_line(found[1], "node-1").startswith("straggler: node-1 r1 enters the collectives last (")


def test_the_rank_behind_a_hang_on_an_h200_is_the_one_that_never_entered_nccls_all_reduce() -> None:
    # tests/gpu/gpu_hang.py item on NCCL: rank 1 asleep at step 5, rank 0 in loss.item() behind all_reduce #11
    ranks, wall = recorded("h200-item-hang")
    arrivals = Arrivals()
    arrivals.feed(ranks, wall)
    [behind] = arrivals.behind(wall)
    assert behind.line() == "rank 1 never entered all_reduce #11 of default_pg (its last: #10), which rank 0 entered"
    assert arrivals.sources() == {0: "nccl flight recorder", 1: "nccl flight recorder"}


def test_hf_trainers_slow_rank_on_an_h200_is_flagged_by_arrival_with_the_seconds_it_costs_a_step() -> None:
    # tests/scripts/hf_trainer.py on NCCL, rank 1's forward 0.15 s slower: each step's all_reduce waits for it
    ranks, wall = recorded("h200-hf-slow")
    arrivals = Arrivals()
    arrivals.feed(ranks, wall)
    late = lateness(arrivals, wall)
    assert late is not None and (0 not in late or late[0].wait_share < 0.05), late
    found = StragglerWatch(0.8, 0.0).look(0.0, {0: 5.92, 1: 5.92}, {0: 0.9, 1: 0.2}, late)
    assert list(found) == [1] and found[1].kind == "arrival"
    assert found[1].lost_s == pytest.approx(0.15, abs=0.02)


def test_a_rank_steps_behind_a_peer_that_enqueues_ahead_costs_at_most_the_step_not_its_lag_each_collective() -> None:
    # on a GPU, rank 0 enqueues up to a sync point ahead: rank 1, 0.1 s slower a step of 0.12 s, reaches each of the
    # 3 collectives a step 2 s after rank 0 (an H200 said "2.07 s a step" when each collective's lag was summed)
    recorded = Arrivals()
    arrivals: dict[int, list[list[object]]] = {0: [], 1: []}
    for step in range(250):
        for bucket in range(3):
            seq = step * 3 + bucket + 1
            arrivals[0].append([seq, "all_reduce", 1000.0 + step * 0.12 + bucket * 0.001])
            arrivals[1].append([seq, "all_reduce", 1002.0 + step * 0.12 + bucket * 0.001])
    wall = 1002.0 + 250 * 0.12
    recorded.feed([{"rank": rank, "collectives": {
        "source": "nccl flight recorder", "age_s": 0.5, "why": None, "arrivals": {"0": rows},
        "groups": {"0": {"desc": "default_pg", "size": 2, "enqueued": 750, "started": -1, "completed": 740,
                         "in_flight": None}}}} for rank, rows in arrivals.items()], wall)
    late = lateness(recorded, wall)
    assert late is not None and list(late) == [1] and 0.9 < late[1].wait_share <= 1.0, late
    found = StragglerWatch(0.8, 0.0).look(0.0, {0: 1 / 0.12, 1: 1 / 0.12}, None, late)
    assert list(found) == [1] and found[1].lost_s is not None and found[1].lost_s <= 0.12


def test_the_rank_slowest_to_start_is_no_straggler_once_every_rank_has_stepped() -> None:
    # Rank 0 enters the model's broadcast and a trainer's barrier 4 s after rank 1 (it still imported under a loaded
    # CPU); then rank 1, 0.1 s slower a step of 0.15 s, enters each all_reduce last (CI once named rank 0 here).
    def feed(first_step: dict[int, float | None]) -> Arrivals:
        rows: dict[int, list[list[object]]] = {0: [[1, "broadcast", 1004.0], [2, "barrier", 1004.1]],
                                               1: [[1, "broadcast", 1000.0], [2, "barrier", 1000.1]]}
        for step in range(40):
            rows[0].append([step + 3, "all_reduce", 1004.2 + step * 0.15])
            rows[1].append([step + 3, "all_reduce", 1004.3 + step * 0.15])
        found = Arrivals()
        found.feed([{"rank": rank, "first_step_at": first_step[rank], "collectives": {
            "source": "flight recorder", "age_s": 0.5, "why": None, "arrivals": {"0": rows[rank]},
            "groups": {"0": {"desc": "default_pg", "size": 2, "enqueued": 42, "started": -1, "completed": 42,
                             "in_flight": None}}}} for rank in rows], 1011.0)
        return found

    started = lateness(feed({0: None, 1: 1004.4}), 1011.0)  # not every rank has stepped: the start counts
    assert started is not None and started[0].wait_share > started[1].wait_share, started
    late = lateness(feed({0: 1004.4, 1: 1004.45}), 1011.0)
    assert late is not None and list(late) == [1] and late[1].wait_share > 0.5, late
    found = StragglerWatch(0.8, 0.0).look(0.0, {0: 6.6, 1: 6.6}, None, late)
    assert list(found) == [1] and found[1].kind == "arrival"


def test_no_rank_of_a_recorded_healthy_gloo_run_is_flagged_and_the_forward_rule_stands_aside() -> None:
    ranks, wall = recorded("healthy")
    arrivals = Arrivals()
    arrivals.feed(ranks, wall)
    late = lateness(arrivals, wall)
    assert late is not None
    # a waiting rank's forward share is high (its wait lands there): never flagged while the collectives are known
    assert StragglerWatch(0.8, 0.0).look(0.0, {0: 5.0, 1: 5.0}, {0: 0.9, 1: 0.1}, late) == {}
    assert list(StragglerWatch(0.8, 0.0).look(0.0, {0: 5.0, 1: 5.0}, {0: 0.9, 1: 0.1}, None)) == [0]


def test_each_arrival_is_passed_on_once_by_one_reader() -> None:
    data = {"source": "flight recorder", "wall": 10.0, "groups": {}, "why": "",
            "arrivals": {"0": [[1, "all_reduce", 9.0], [2, "all_reduce", 9.5]]}}
    reader = RankCollectives()
    assert reader.fields(data, 10.5)["arrivals"] == {"0": [[1, "all_reduce", 9.0], [2, "all_reduce", 9.5]]}
    data["arrivals"]["0"].append([3, "broadcast", 9.8])
    assert reader.fields(data, 11.0) == {"source": "flight recorder", "groups": {}, "age_s": 1.0, "why": None,
                                         "arrivals": {"0": [[3, "broadcast", 9.8]]}}
    assert reader.fields(None, 11.0) is None


def test_a_rank_whose_collectives_are_not_read_yet_neither_blames_the_others_nor_brings_the_forward_rule_back() -> None:
    ranks, wall = recorded("slow")
    arrivals = Arrivals()
    arrivals.feed([ranks[0], {"rank": 1, "collectives": None}, {"rank": 2, "collectives": ranks[1]["collectives"]}],
              wall)
    assert arrivals.recording() and lateness(arrivals, wall) == {}
    # the waiting ranks' forward shares are high: the forward rule would flag them
    assert StragglerWatch(0.8, 0.0).look(0.0, {0: 5.0, 1: 5.0, 2: 5.0}, {0: 0.9, 1: 0.1, 2: 0.1}, {}) == {}
    off = Arrivals()
    off.feed(beat({0: (0, 0), 1: (0, 0)}, source=None), wall)
    assert not off.recording() and lateness(off, wall) is None
    stopped = Arrivals()
    stopped.feed([ranks[0], {"rank": 1, "collectives": {"source": None, "groups": {}, "arrivals": {}, "age_s": 0.0,
                                                        "why": "AttributeError: partially initialized module"}}], wall)
    assert not stopped.recording() and lateness(stopped, wall) is None  # the forward rule, as without a recorder


def test_stacks_say_a_rank_behind_only_once_the_others_have_waited_for_it_not_one_step_apart() -> None:
    from launcher.run.takestacks import behind_said

    def answers(entered_at: float) -> dict:
        ranks = []
        for number, (enq, done) in {0: (101, 100), 1: (100, 100)}.items():
            rows = [[seq, "all_reduce", entered_at if seq == 101 else entered_at - 0.1] for seq in range(99, enq + 1)]
            ranks.append({"rank": number, "collectives": {
                "source": "flight recorder", "age_s": 0.2, "why": None, "arrivals": {"0": rows},
                "groups": {"0": {"desc": "default_pg", "size": 2, "enqueued": enq, "started": -1, "completed": done,
                                 "in_flight": [101, "all_reduce"] if enq > done else None}}}})
        return {"node-0": {"workers": ranks}}

    assert behind_said(answers(999.8), now=1000.0) == ""  # one step apart at the look: a healthy run (#69 item 3)
    assert behind_said(answers(988.0), now=1000.0) == (
        "rank 1 never entered all_reduce #101 of default_pg (its last: #100), which rank 0 entered 12 s ago")


def test_a_rank_behind_in_a_file_edited_since_it_started_is_stuck_when_it_sleeps_without_cpu() -> None:
    # issue 69 (12): the script was edited while its run hung; the line at job.py:14 is now another, unread.
    arrivals = Arrivals()
    arrivals.feed(beat({0: (41, 40), 1: (40, 40)}, name="barrier"), 100.0)
    behind = arrivals.behind(100.0)

    def edited(cpu_s: float) -> RankStack:
        worker = {"rank": 1, "local_rank": 0, "pid": 4241, "state": "S", "state_name": "sleeping", "stack": SAVE,
                  "why": None, "lines": {}, "cpu_s": cpu_s, "unread": {"/home/u/job.py": "changed since the rank "
                                                                                         "started"}}
        [found] = rank_stacks("node-1", [worker])
        return found

    waiting = rank("node-0", 0, BARRIER)
    verdict = judge([waiting, edited(3.0)], [waiting, edited(3.0)], 5.0, behind=behind)
    assert verdict.hang, verdict.why
    assert verdict.why.endswith("rank 1 (node-1, pid 4241) is in save_checkpoint (job.py:14), asleep without CPU in "
                                "5 s (job.py changed since the rank started: its line there now is not the one it "
                                "runs)"), verdict.why
    working = judge([waiting, edited(3.0)], [waiting, edited(5.5)], 5.0, behind=behind)
    assert not working.hang and "is at work" in working.why
