"""The hang rule (launcher.watch.hang) and the grouped answer (launcher.watch.stackgroups), pure: no process."""

from __future__ import annotations

import pytest

from launcher.config.inventory import parse_inventory
from launcher.errors import InventoryError
from launcher.limits import HANG_FACTOR, HANG_FLOOR_S
from launcher.ranges import numbers_text
from launcher.watch.hang import HangWatch
from launcher.watch.stackgroups import answer, parse_dump, rank_stacks

BEAT = 5.0


def beats(watch: HangWatch, until: float, printing_every: float | None, cpu_per_s: float = 0.0,
          start: float = 0.0) -> list[float]:
    """Feed a 2-node x 2-rank run's beats every BEAT s from `start` to `until`; the times a hang was suspected."""
    suspected, t = [], start
    while t <= until:
        quiet = None if printing_every is None else t % printing_every
        for node in ("node-0", "node-1"):
            watch.observe(t, node, [{"rank": r, "quiet_s": quiet, "cpu_s": cpu_per_s * t} for r in (0, 1)])
        if watch.suspected(t) is not None:
            suspected.append(t)
        t += BEAT
    return suspected


def test_a_run_that_prints_every_20_s_for_2_minutes_is_never_suspected_by_default() -> None:
    watch = HangWatch()
    watch.start(0.0)
    assert beats(watch, 120.0, printing_every=20.0) == []
    assert watch.limit() == max(HANG_FLOOR_S, HANG_FACTOR * watch.longest_gap) >= HANG_FLOOR_S


def test_the_default_is_off_until_the_run_printed_progress_twice() -> None:
    watch = HangWatch()
    watch.start(0.0)
    assert beats(watch, 3 * HANG_FLOOR_S, printing_every=None) == []  # never printed: never suspected
    assert watch.limit() is None


def test_the_default_learns_from_the_longest_quiet_gap_and_fires_after_it() -> None:
    watch = HangWatch()
    watch.start(0.0)
    beats(watch, 600.0, printing_every=100.0)  # a line every 100 s: the limit is 4 x 100 s
    assert watch.limit() == pytest.approx(HANG_FACTOR * 100.0, abs=BEAT)
    last = watch.last_progress
    assert last is not None
    assert watch.suspected(last + HANG_FACTOR * 100.0 - 2 * BEAT) is None
    assert watch.suspected(last + HANG_FACTOR * 100.0 + 2 * BEAT) is not None


def test_a_given_timeout_fires_from_the_start() -> None:
    watch = HangWatch(15.0)
    watch.start(0.0)
    assert beats(watch, 40.0, printing_every=None)[0] == pytest.approx(15.0, abs=BEAT)


def test_every_rank_idle_in_every_look_for_four_timeouts_is_a_stall_and_progress_or_work_resets_it() -> None:
    watch = HangWatch(15.0)
    watch.start(0.0)
    assert watch.stall_after() == 60.0
    assert watch.idle_for(18.0, 18.0, idle=True) == 18.0  # the first look: idle since the last progress
    watch.rearm(18.0)
    assert watch.idle_for(36.0, 18.0, idle=True) == 36.0  # still idle, nothing moved: counted from the first
    assert watch.idle_for(54.0, 18.0, idle=False) is None  # one look with a rank at work: over
    assert watch.idle_for(72.0, 18.0, idle=True) == 18.0
    watch.observe(80.0, "node-0", [{"rank": 0, "quiet_s": 0.0}])  # a line: progress
    assert watch.idle_for(98.0, 18.0, idle=True) == 18.0


def test_cpu_time_is_never_progress_the_stacks_decide() -> None:
    # A hung NCCL collective keeps a CPU busy (its proxy thread polls): CPU time tells nothing. A rank that computes
    # silently is looked at, and its stack (busy, not waiting) keeps the run going (tests/unit/test_hang_verdict.py).
    watch = HangWatch(15.0)
    watch.start(0.0)
    assert beats(watch, 40.0, printing_every=None, cpu_per_s=1.0)[0] == pytest.approx(15.0, abs=BEAT)


def test_steps_or_batches_that_grow_are_progress_where_the_beats_have_them() -> None:
    watch = HangWatch(15.0)
    watch.start(0.0)
    for t in range(0, 65, 5):  # silent, but stepping; then only drawing batches
        counts = {"steps": t // 5, "batches": None} if t <= 30 else {"steps": 6, "batches": t}
        watch.observe(float(t), "node-0", [{"rank": 0, "quiet_s": None, "cpu_s": 0.0, **counts}])
        assert watch.suspected(float(t)) is None
    for t in range(65, 95, 5):  # neither grows: as good as silent
        watch.observe(float(t), "node-0", [{"rank": 0, "quiet_s": None, "steps": 6, "batches": 60}])
    assert watch.suspected(74.0) is None and watch.suspected(76.0) is not None  # the last batch came at 60 s
    learnt = HangWatch()
    learnt.start(0.0)
    for t in range(0, 601, 5):  # a step every 100 s, never a line: the default learns from the steps' gaps
        learnt.observe(float(t), "node-0", [{"rank": 0, "quiet_s": None, "steps": t // 100}])
    assert learnt.limit() == pytest.approx(max(HANG_FLOOR_S, HANG_FACTOR * 100.0))


def test_a_hangs_step_is_the_one_every_rank_made_by_its_hooks_count_not_a_line_that_names_a_later_one() -> None:
    # issue 69 (10): the hung rank printed `hanging before step 30` after its 29th step; its peer made step 30's
    # optimizer step and waits in the all_reduce after it.
    watch = HangWatch(15.0)
    watch.start(0.0)
    watch.observe(1.0, "node-0", [{"rank": 0, "quiet_s": 0.5, "steps": 30, "step": 29},
                                  {"rank": 1, "quiet_s": 0.5, "steps": 29, "step": 30}])
    assert (watch.reached(), watch.counted()) == (30, 29)
    plain = HangWatch(15.0)  # no hook's counts (a job without torch.optim): the lines' word alone
    plain.observe(1.0, "node-0", [{"rank": 0, "quiet_s": 0.5, "step": 29}])
    assert (plain.reached(), plain.counted()) == (29, None)


def test_a_3_minute_silent_save_and_a_silent_eval_pass_are_never_suspected_under_the_default() -> None:
    """A Lightning-like run under the learnt default: steps every 2 s (no lines), then a 3-minute checkpoint save
    (no step, no batch, no line, the CPU busy), then a silent eval pass (batches, no steps), then training again."""
    watch = HangWatch()
    watch.start(0.0)
    steps = batches = 0
    for t in range(0, 1200, 2):
        if t < 300 or t >= 660:  # training
            steps, batches = steps + 1, batches + 1
        elif 480 <= t < 660:  # the eval pass: batches only
            batches += 1
        # 300 <= t < 480: the save, nothing grows
        for node in ("node-0", "node-1"):
            watch.observe(float(t), node, [{"rank": r, "quiet_s": None, "cpu_s": float(t), "steps": steps,
                                            "batches": batches} for r in (0, 1)])
        assert watch.suspected(float(t)) is None, t
    assert watch.limit() is not None and watch.limit() >= HANG_FLOOR_S > 180  # learnt, and longer than the save


def test_a_kept_hang_is_reported_again_one_timeout_later() -> None:
    watch = HangWatch(10.0)
    watch.start(0.0)
    assert watch.suspected(11.0) is not None
    watch.rearm(11.0)
    assert watch.suspected(15.0) is None and watch.suspected(21.5) is not None


DIST = """Thread 0x00007f0000000001 (most recent call first):
  File "/venv/lib/python3.11/threading.py", line 324 in wait
Current thread 0x00007f0000000002 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2850 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/u/train.py", line 88 in step
  File "/home/u/train.py", line 95 in <module>
"""
SLEEP = """Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/train.py", line 80 in step
  File "/home/u/train.py", line 95 in <module>
"""


def worker(rank: int, stack: str | None, state: str = "S", why: str | None = None) -> dict:
    return {"rank": rank, "local_rank": rank % 2, "pid": 4240 + rank, "state": state,
            "state_name": {"S": "sleeping", "T": "stopped", "Z": "a zombie"}[state], "stack": stack, "why": why,
            "lines": {"/home/u/train.py:80": "time.sleep(100)", "/home/u/train.py:88": "dist.all_reduce(x)"}}


def test_the_answer_names_the_odd_rank_its_node_pid_and_line() -> None:
    stacks = rank_stacks("node-0", [worker(0, DIST), worker(1, SLEEP)]) + rank_stacks(
        "node-1", [worker(2, DIST), worker(3, DIST)])
    assert answer(stacks) == ("ranks 0,2,3 wait in all_reduce (train.py:88); "
                              "rank 1 (node-0, pid 4241) is in time.sleep (train.py:80)")


def test_ranks_that_cannot_answer_are_said_as_what_proc_says_they_are() -> None:
    stacks = rank_stacks("node-0", [worker(0, DIST), worker(1, DIST), worker(2, DIST)]) + rank_stacks(
        "node-1", [worker(3, None, "T", "it is stopped")])
    assert answer(stacks) == ("ranks 0-2 wait in all_reduce (train.py:88); "
                              "rank 3 (node-1, pid 4243) is stopped (state T)")
    assert "is a zombie (state Z)" in answer(rank_stacks("n", [worker(0, None, "Z")]))


def test_the_main_thread_is_the_one_that_runs_the_script() -> None:
    frames = parse_dump(DIST)
    assert [f.func for f in frames] == ["all_reduce", "wrapper", "step", "<module>"]
    assert parse_dump("") == () and parse_dump(None) == ()


@pytest.mark.parametrize(("ranks", "text"), [([0, 2, 3], "0,2,3"), ([0, 1, 2, 3], "0-3"), ([4], "4"), ([1, 2], "1,2")])
def test_rank_lists_are_short(ranks: list[int], text: str) -> None:
    assert numbers_text(ranks) == text


def test_the_inventorys_job_may_set_the_hang_timeout() -> None:
    text = "hosts: [a]\njob: {script: train.py, hang_timeout: 600}\n"
    assert parse_inventory(text, "inv.yaml").job.hang_timeout == 600.0
    assert parse_inventory("hosts: [a]\njob: {script: train.py}\n", "inv.yaml").job.hang_timeout is None
    with pytest.raises(InventoryError, match=r"^inv.yaml:2: job.hang_timeout: must be a number of seconds from 0 to "
                                             r"86400, got 'soon' \(str\)$"):
        parse_inventory("hosts: [a]\njob: {script: train.py, hang_timeout: soon}\n", "inv.yaml")



def test_a_spare_node_without_workers_does_not_hold_off_a_hang_of_the_nodes_that_train() -> None:
    # issue 69 (11a): a c10d run on 3 hosts with `rendezvous.nodes: 2` keeps the third as a spare, no workers on it;
    # its beats came every second and the hang watch never fired.
    watch = HangWatch(15.0)
    watch.start(0.0)
    watch.observe(0.0, "node-2", [])  # the first beats: nothing started anywhere yet, starting is no hang
    assert watch.suspected(10.0) is None
    for t in range(1, 40):
        training = [{"rank": 0, "quiet_s": max(0.0, t - 5.0), "steps": min(t, 5)}]
        watch.observe(float(t), "node-0", training)
        watch.observe(float(t), "node-2", [])
    assert watch.suspected(19.0) is None and watch.suspected(20.5) is not None  # the last step at 5 s
    restarting = HangWatch(15.0)  # a node whose workers torchrun starts again: starting, not a hang
    restarting.start(0.0)
    restarting.observe(0.0, "node-0", [{"rank": 0, "quiet_s": 0.0, "steps": 1}])
    restarting.observe(30.0, "node-0", [])
    assert restarting.suspected(31.0) is None
