"""What NCCL's flight recorder says decides a GPU hang (launcher.watch.flightrec, launcher.watch.verdict): a rank
behind a hung collective waits in a CUDA synchronisation on its own line (`loss.item()`), with no collective on its
Python stack. The dumps read here are real: torch 2.11 / NCCL 2.28 on an H100, two ranks, rank 1 asleep, rank 0 in
`dist.barrier` (h100_barrier_*), or in `loss.item()` behind DDP's all-reduce (h100_item_*), taken through the
launcher's pipes (tests/data/flight_recorder/)."""

from __future__ import annotations

import base64
import pickle
from pathlib import Path
from typing import Any

from launcher.watch.flightrec import Collectives, InFlight, from_answers, read_dump
from launcher.watch.stackgroups import RankStack, rank_stacks
from launcher.watch.verdict import judge

DATA = Path(__file__).parents[1] / "data" / "flight_recorder"
ITEM = """Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/train.py", line 32 in <module>
"""
SLEEP = """Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/train.py", line 25 in <module>
"""
LINES = {"/home/u/train.py:32": 'print(f"step {step} loss {loss.item():.4f}", flush=True)',
         "/home/u/train.py:25": "time.sleep(600)"}


def rank(node: str, number: int, stack: str) -> RankStack:
    worker = {"rank": number, "local_rank": 0, "pid": 4240 + number, "state": "R", "state_name": "running",
              "stack": stack, "why": None, "lines": LINES}
    [found] = rank_stacks(node, [worker])
    return found


def dump(enqueued: int, completed: int, entries: list[dict[str, Any]] = ()) -> bytes:
    """A dump as torch 2.11 writes it (its keys and shapes, as in the H100's)."""
    return pickle.dumps({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                         "pg_status": {"0": {"last_enqueued_collective": enqueued, "last_started_collective": -1,
                                             "last_completed_collective": completed}},
                         "entries": list(entries)}, protocol=2)


def entry(seq: int, state: str, name: str = "nccl:all_reduce", frames: list[dict] = ()) -> dict[str, Any]:
    return {"collective_seq_id": seq, "state": state, "profiling_name": name, "process_group": ("0", "default_pg"),
            "pg_id": 0, "is_p2p": False, "frames": list(frames)}


def test_the_h100_dumps_say_which_collective_is_in_flight_and_who_never_entered_it() -> None:
    waiting = read_dump((DATA / "h100_barrier_rank_0").read_bytes(), 0)
    asleep = read_dump((DATA / "h100_barrier_rank_1").read_bytes(), 1)
    assert waiting == Collectives(0, {"0": 11}, InFlight("0", "default_pg", 11, "all_reduce_barrier",
                                                         "gpu_hang.py:27"))
    assert asleep == Collectives(1, {"0": 10}, None)


def test_a_dump_that_names_a_global_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (tmp_path / "ran",))

    assert read_dump(pickle.dumps({"pg_status": {}, "x": Boom()}), 0) is None
    assert not (tmp_path / "ran").exists()
    assert read_dump(b"flight recorder of rank 0", 0) is None  # the CPU tests' stand-in bytes
    assert read_dump(pickle.dumps(["not", "a", "dump"]), 0) is None
    ring_moved = read_dump(dump(2000, 1990, [entry(1995, "completed")]), 3)
    assert ring_moved is not None and ring_moved.in_flight == InFlight("0", "default_pg", 1991, "collective", None)


def test_a_rank_in_loss_item_behind_a_collective_that_never_completes_is_a_hang() -> None:
    # As on the H100: rank 0's main thread on its own line, `loss.item()`, running (spinning); rank 1 asleep.
    look = [rank("node-0", 0, ITEM), rank("node-1", 1, SLEEP)]
    asked = judge(look, look, 3.0)
    assert not asked.hang and asked.asks_recorder, asked  # the stacks alone cannot tell
    # The dumps of that hang on the H100 (DDP's all-reduce, enqueued from torch's autograd thread: no user frame).
    answers = {f"node-{r}": {"nccl": {f"nccl_trace_rank_{r}": base64.b64encode(
                   (DATA / f"h100_item_rank_{r}").read_bytes()).decode()}} for r in (0, 1)}
    answers["node-2"] = "no answer to `dumps` within 10 s"
    verdict = judge(look, look, 3.0, recorded=from_answers(answers))
    assert verdict.hang, verdict.why
    assert verdict.why == ("rank 0 waits in a collective, and rank 1 is stuck; no stack moved in 3 s; NCCL's flight "
                           "recorder: all_reduce #11 of default_pg has not completed on rank 0; rank 1 never "
                           "entered it (its last: #10)")


def test_a_cuda_synchronisation_with_nothing_in_flight_is_no_hang() -> None:
    look = [rank("node-0", 0, ITEM), rank("node-1", 1, ITEM)]
    idle = {0: Collectives(0, {"0": 10}, None), 1: Collectives(1, {"0": 10}, None)}
    verdict = judge(look, look, 3.0, recorded=idle)
    assert not verdict.hang and not verdict.asks_recorder
    assert verdict.why == ("no rank waits for the others in a collective (ranks 0,1 wait in a CUDA synchronisation; "
                           "NCCL's flight recorder shows no collective in flight)")
    assert judge(look, look, 3.0, recorded={}).why.endswith("NCCL's flight recorder sent no dump)")


def test_the_recorder_groups_the_ranks_of_one_collective_and_those_behind_it() -> None:
    flight = InFlight("0", "default_pg", 7, "all_reduce", "train.py:40")
    recorded = {r: Collectives(r, {"0": 7}, flight) for r in (0, 1, 2, 4)}
    recorded |= {r: Collectives(r, {"0": last}, None) for r, last in ((3, 6), (5, 5), (6, 6))}
    look = [rank("node-0", r, ITEM) for r in (0, 1, 2, 4)] + [rank("node-1", r, SLEEP) for r in (3, 5, 6)]
    verdict = judge(look, look, 3.0, recorded=recorded)
    assert verdict.hang
    assert verdict.why.endswith("NCCL's flight recorder: all_reduce #7 of default_pg (train.py:40) has not completed "
                                "on ranks 0-2,4; rank 5 never entered it (its last: #5); ranks 3,6 never entered it "
                                "(their last: #6)"), verdict.why


TRAINER = """Current thread 0x00007f0000000002 (most recent call first):
  File "/venv/lib/python3.12/site-packages/transformers/trainer.py", line 3100 in _maybe_log_save_evaluate
  File "/venv/lib/python3.12/site-packages/transformers/trainer.py", line 2600 in _inner_training_loop
  File "/venv/lib/python3.12/site-packages/transformers/trainer.py", line 2200 in train
  File "/home/u/hf.py", line 20 in <module>
"""
TRAINER_LINES = {"/venv/lib/python3.12/site-packages/transformers/trainer.py:3100":
                 "tr_loss_scalar = self._nested_gather(tr_loss).mean().item()",
                 "/home/u/hf.py:20": "trainer.train()", **LINES}


def test_under_a_trainer_a_gpu_rank_waits_in_the_trainers_own_item_and_the_recorder_decides() -> None:
    worker = {"rank": 0, "local_rank": 0, "pid": 4240, "state": "R", "state_name": "running", "stack": TRAINER,
              "why": None, "lines": TRAINER_LINES}
    look = [*rank_stacks("node-0", [worker]), rank("node-1", 1, SLEEP)]
    assert look[0].place == "wait in .item (a CUDA synchronisation), called from trainer.train (hf.py:20)"
    assert judge(look, look, 3.0).asks_recorder
    flight = InFlight("0", "default_pg", 40, "all_reduce", None)
    recorded = {0: Collectives(0, {"0": 40}, flight), 1: Collectives(1, {"0": 39}, None)}
    verdict = judge(look, look, 3.0, recorded=recorded)
    assert verdict.hang and verdict.why.endswith("all_reduce #40 of default_pg has not completed on rank 0; rank 1 "
                                                 "never entered it (its last: #39)"), verdict.why
