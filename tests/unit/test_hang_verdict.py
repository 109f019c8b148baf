"""The hang verdict on two looks at every rank's stack (launcher.watch.verdict), what a frame waits on
(launcher.watch.frames) and how the answer says it (launcher.watch.stackgroups), with canned faulthandler dumps."""

from __future__ import annotations

import pytest

from launcher.watch.frames import Frame, wait_of
from launcher.watch.stackgroups import RankStack, answer, parse_dump, rank_stacks
from launcher.watch.verdict import judge

SITE = "/venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"
HOOK = "/home/u/.cache/ddp-launcher/runs/20261125-000000-abcdef/node-0/hook/sitecustomize.py"
SPINNER = f"""Thread 0x00007f0000000009 (most recent call first):
  File "/home/u/job.py", line 9 in poll
  File "{STDLIB}/threading.py", line 982 in run
  File "{STDLIB}/threading.py", line 1045 in _bootstrap_inner
  File "{STDLIB}/threading.py", line 1002 in _bootstrap
"""
"""A thread of the job's that busy-polls (as NCCL's proxy thread does): in every rank, at every look."""
ALL_REDUCE = SPINNER + f"""Current thread 0x00007f0000000002 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 2850 in all_reduce
  File "{SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/u/job.py", line 30 in <module>
"""
SLEEP = SPINNER + """Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/job.py", line 28 in step
  File "/home/u/job.py", line 31 in <module>
"""
BARRIER = f"""Current thread 0x00007f0000000002 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 4100 in barrier
  File "{SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/u/job.py", line 40 in <module>
"""
SAVE = """Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/job.py", line 14 in save_checkpoint
  File "/home/u/job.py", line 38 in <module>
"""
BACKWARD = f"""Current thread 0x00007f0000000002 (most recent call first):
  File "{SITE}/torch/autograd/graph.py", line 829 in _engine_run_backward
  File "{SITE}/torch/autograd/__init__.py", line 347 in backward
  File "{SITE}/torch/_tensor.py", line 648 in backward
  File "{HOOK}", line 140 in backward
  File "{SITE}/lightning/pytorch/core/module.py", line 1100 in backward
  File "{SITE}/lightning/pytorch/loops/optimization/automatic.py", line 150 in backward_fn
  File "{SITE}/lightning/pytorch/trainer/trainer.py", line 561 in fit
  File "/home/u/boring.py", line 20 in <module>
"""
HOOK_SLEEP = f"""Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/boring.py", line 12 in training_step
  File "{SITE}/lightning/pytorch/strategies/strategy.py", line 390 in training_step
  File "{SITE}/lightning/pytorch/trainer/trainer.py", line 561 in fit
  File "/home/u/boring.py", line 20 in <module>
"""
LINES = {"/home/u/job.py:9": "spins += 1", "/home/u/job.py:28": "time.sleep(600)",
         "/home/u/job.py:30": "dist.all_reduce(x)", "/home/u/job.py:14": "total += 1",
         "/home/u/job.py:40": "dist.barrier()", "/home/u/boring.py:20": "trainer.fit(model)",
         "/home/u/boring.py:12": "time.sleep(600)"}


def rank(node: str, number: int, stack: str | None, state: str = "S", pid: int | None = None) -> RankStack:
    worker = {"rank": number, "local_rank": 0, "pid": pid or 4240 + number, "state": state,
              "state_name": {"S": "sleeping", "R": "running", "T": "stopped", "D": "in uninterruptible sleep"}[state],
              "stack": stack, "why": None if stack else "no answer within 5 s", "lines": LINES}
    [found] = rank_stacks(node, [worker])
    return found


def test_the_spinning_thread_hang_is_a_hang_and_the_answer_names_the_sleeping_rank() -> None:
    # Every rank's CPU is busy (the polling thread): only the stacks can tell, and the main threads do not move.
    look = [rank("node-0", 0, ALL_REDUCE), rank("node-1", 1, SLEEP)]
    verdict = judge(look, look, 3.0)
    assert verdict.hang, verdict.why
    assert verdict.why == "rank 0 waits in a collective, and rank 1 is stuck; no stack moved in 3 s"
    assert answer(look) == ("rank 0 waits in all_reduce (job.py:30); "
                            "rank 1 (node-1, pid 4241) is in time.sleep (job.py:28)")


def test_a_rank_whose_main_thread_moved_is_no_hang() -> None:
    first = [rank("node-0", 0, ALL_REDUCE), rank("node-1", 1, SAVE)]
    second = [rank("node-0", 0, ALL_REDUCE), rank("node-1", 1, SAVE.replace("line 14", "line 15"))]
    verdict = judge(first, second, 3.0)
    assert not verdict.hang and verdict.why == "the stack of rank 1 moved between two looks 3 s apart"
    restarted = [rank("node-0", 0, ALL_REDUCE), rank("node-1", 1, SAVE, pid=9999)]
    assert not judge(second, restarted, 3.0).hang


def test_a_checkpoint_written_while_the_others_wait_in_a_barrier_is_no_hang() -> None:
    look = [rank("node-0", 0, SAVE, "R"), rank("node-1", 1, BARRIER)]
    verdict = judge(look, look, 3.0)
    assert not verdict.hang and verdict.why == "rank 0 is busy, not waiting"
    assert answer(look) == "rank 0 is in save_checkpoint (job.py:14); rank 1 (node-1, pid 4241) waits in barrier " \
                           "(job.py:40)"


def test_ranks_that_sleep_with_none_in_a_collective_are_no_hang_but_idle() -> None:
    """Every rank waits, none for the others, nothing moved: not a hang (the run goes on), but idle, which the hang
    watch turns into a stall when it lasts; one rank at work anywhere is not idle."""
    look = [rank("node-0", 0, SLEEP), rank("node-1", 1, SLEEP)]
    verdict = judge(look, look, 3.0)
    assert not verdict.hang and verdict.idle
    assert verdict.why == "no rank waits for the others in a collective"
    evaluating = [rank("node-0", 0, SAVE, "R"), rank("node-1", 1, SLEEP)]
    assert not judge(evaluating, evaluating, 3.0).idle


def test_a_stopped_rank_is_stuck_and_a_rank_without_a_stack_is_a_doubt() -> None:
    stopped = [rank("node-0", 0, ALL_REDUCE), rank("node-0", 1, ALL_REDUCE), rank("node-1", 2, None, "T")]
    assert judge(stopped, stopped, 3.0).hang
    unanswered = [rank("node-0", 0, ALL_REDUCE), rank("node-1", 1, None, "R")]
    assert judge(unanswered, unanswered, 3.0).why == "rank 1 gave no stack"
    assert judge(stopped, stopped, 3.0, ["node-2"]).why == "node-2 sent no stacks"
    assert judge([], [], 3.0).why == "no worker of the run was found"


def test_every_rank_in_a_collective_that_does_not_move_is_a_hang() -> None:
    look = [rank("node-0", 0, ALL_REDUCE), rank("node-1", 1, BARRIER)]  # mismatched collectives
    verdict = judge(look, look, 3.0)
    assert verdict.hang and verdict.why == "ranks 0,1 wait in a collective; no stack moved in 3 s"


def test_ddp_backward_under_a_trainer_is_said_with_the_users_call_and_a_hooks_name() -> None:
    stacks = [rank("node-0", r, BACKWARD) for r in (0, 1)] + [rank("node-1", 2, BACKWARD),
                                                               rank("node-1", 3, HOOK_SLEEP)]
    assert answer(stacks) == ("ranks 0-2 wait in backward (DDP's gradient all-reduce), called from trainer.fit "
                              "(boring.py:20); rank 3 (node-1, pid 4243) is in time.sleep (boring.py:12, in "
                              "training_step)")
    assert judge(stacks, stacks, 3.0).hang


def frames(*rows: tuple[str, str], source: str | None = None) -> list[Frame]:
    """Frames innermost first from (file, function) pairs; `source`: the innermost frame's line."""
    return [Frame(path, 10, func, source if i == 0 else None) for i, (path, func) in enumerate(rows)]


USER = ("/home/u/train.py", "train")


@pytest.mark.parametrize(("stack", "kind", "name"), [
    (frames((f"{SITE}/torch/distributed/distributed_c10d.py", "broadcast"), USER), "collective", "broadcast"),
    (frames((f"{SITE}/torch/cuda/__init__.py", "synchronize"), USER), "cuda", "torch.cuda.synchronize"),
    (frames(USER, source="loss = out.sum().item()"), "cuda", ".item"),
    (frames((f"{STDLIB}/multiprocessing/queues.py", "get"), (f"{SITE}/torch/utils/data/dataloader.py", "_get_data"),
            (f"{SITE}/torch/utils/data/dataloader.py", "__next__"), USER), "data", "DataLoader.__next__"),
    (frames((f"{STDLIB}/threading.py", "wait"), USER), "lock", "threading.wait"),
    (frames((f"{STDLIB}/queue.py", "get"), USER), "lock", "queue.get"),
    (frames(USER, source="work.wait()"), "wait", "work.wait"),
    (frames(USER, source="time.sleep(5)  # a nap"), "sleep", "time.sleep"),
    # a trainer's own host-device synchronisation: Lightning's logging, HF Trainer's loss, torch's f-string format
    (frames((f"{SITE}/lightning/pytorch/trainer/connectors/logger_connector/result.py", "_get_cache"), USER,
            source="cache = value.item() if value.numel() == 1 else value"), "cuda", "value.item"),
    (frames((f"{SITE}/transformers/trainer.py", "_maybe_log_save_evaluate"), USER,
            source="tr_loss_scalar = self._nested_gather(tr_loss).mean().item()"), "cuda", ".item"),
])
def test_what_a_frame_waits_on(stack: list[Frame], kind: str, name: str) -> None:
    found = wait_of(stack)
    assert found is not None and (found.kind, found.name) == (kind, name)


@pytest.mark.parametrize("stack", [
    frames(USER, source="total += 1"),  # computing in the user's own code
    frames((f"{SITE}/torch/serialization.py", "save"), USER),  # a checkpoint being written
    frames((f"{SITE}/torch/distributed/checkpoint/filesystem.py", "_write_item"), USER),  # DCP writes files
    frames((f"{SITE}/torch/nn/modules/linear.py", "forward"), USER),  # an evaluation pass
    [],
])
def test_a_busy_rank_waits_on_nothing(stack: list[Frame]) -> None:
    assert wait_of(stack) is None


def test_the_main_thread_is_never_the_spinning_one() -> None:
    assert [f.func for f in parse_dump(ALL_REDUCE)] == ["all_reduce", "wrapper", "<module>"]


def _edited(number: int, cpu: tuple[float, float], state: str = "S") -> tuple[RankStack, RankStack]:
    """Two looks at a rank in job.py:28 (a `time.sleep` when it started) whose file changed since: the node read no
    line of it (`unread`), and /proc gave its CPU seconds at each look."""
    looks = []
    for cpu_s in cpu:
        worker = {"rank": number, "local_rank": 0, "pid": 4240 + number, "state": state, "state_name": "sleeping",
                  "stack": SLEEP, "why": None, "cpu_s": cpu_s,
                  "lines": {k: v for k, v in LINES.items() if not k.startswith("/home/u/job.py")},
                  "unread": {"/home/u/job.py": "changed since the rank started"}}
        looks.extend(rank_stacks("node-1", [worker]))
    return looks[0], looks[1]


def test_a_rank_in_a_file_edited_since_it_started_is_judged_by_its_process_not_by_the_new_line() -> None:
    # The line the node would read now is another (the user edited the script while it trained): a rank asleep with
    # no CPU between the looks still holds the others up; one that used CPU is at work.
    waiting = [rank("node-0", 0, ALL_REDUCE)]
    asleep = _edited(1, (2.0, 2.0))
    verdict = judge([waiting[0], asleep[0]], [waiting[0], asleep[1]], 3.0)
    assert verdict.hang, verdict.why
    assert verdict.why == "rank 0 waits in a collective, and rank 1 is stuck; no stack moved in 3 s"
    busy = _edited(1, (2.0, 4.5), state="R")
    verdict = judge([waiting[0], busy[0]], [waiting[0], busy[1]], 3.0)
    assert not verdict.hang and verdict.why == "rank 1 is busy, not waiting", verdict.why
