"""An attached run's look at a suspected hang (launcher.run.hangcheck), over a stand-in for the run's handle: the
words each node gets, the verdict's consequences (stop, keep, go on), and NCCL's dumps asked for before a stop."""

from __future__ import annotations

import base64
import pickle
from dataclasses import dataclass, field
from pathlib import Path

from launcher.events import HangRuledOut, HangSuspected, NcclDumps, NodeEvent, StacksTaken
from launcher.node.wire import DUMPS, STACKS
from launcher.report.hangs import hang_report, ruled_out_line
from launcher.run.hangcheck import HangCheck

SITE = "/venv/lib/python3.11/site-packages"
WAITING = f"""Current thread 0x00007f0000000002 (most recent call first):
  File "{SITE}/torch/distributed/distributed_c10d.py", line 2850 in all_reduce
  File "/home/u/job.py", line 30 in <module>
"""
SLEEPING = """Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/job.py", line 28 in <module>
"""
SAVING = """Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/job.py", line 14 in save_checkpoint
  File "/home/u/job.py", line 38 in <module>
"""
ITEM = """Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/job.py", line 32 in <module>
"""
LINES = {"/home/u/job.py:28": "time.sleep(600)", "/home/u/job.py:30": "dist.all_reduce(x)",
         "/home/u/job.py:32": "print(loss.item())"}


def worker(rank: int, stack: str) -> dict:
    return {"rank": rank, "local_rank": 0, "pid": 4240 + rank, "state": "S", "state_name": "sleeping",
            "stack": stack, "why": None, "lines": LINES}


@dataclass
class Channel:
    node: str
    said: list[tuple[str, str]]

    def send(self, data: bytes, block: bool = True) -> bool:
        self.said.append((self.node, data.decode().strip()))
        return True


@dataclass
class Session:
    name: str
    channel: Channel
    end: object = None


@dataclass
class Run:
    """The handle as the look sees it: each node answers a word at the next step."""

    stacks: dict[str, str]
    check: HangCheck
    dumps: dict[str, bytes] = field(default_factory=dict)
    """What each node's `dumps` answer carries (default: b"dump", no dump of torch's)."""
    said: list[tuple[str, str]] = field(default_factory=list)
    events: list[NodeEvent] = field(default_factory=list)
    stopped: bool = False

    def __post_init__(self) -> None:
        self.sessions = {name: Session(name, Channel(name, self.said)) for name in self.stacks}
        self._answered = 0

    def on_event(self, event: NodeEvent) -> None:
        self.events.append(event)

    def step(self, timeout: float) -> None:
        for node, word in self.said[self._answered:]:
            rank = sorted(self.stacks).index(node)
            if word == STACKS:
                event: NodeEvent = StacksTaken(node, 0.0, (worker(rank, self.stacks[node]),), {})
            else:
                data = base64.b64encode(self.dumps.get(node, b"dump")).decode()
                event = NcclDumps(node, 0.0, {f"nccl_trace_rank_{rank}": data}, (rank,))
            assert self.check.takes(event)  # the handle hands the look its answers, and shows them to nobody else
        self._answered = len(self.said)

    def stop(self, kill: bool = False, why: str = "asked") -> None:
        self.stopped = True


def suspected_run(stacks: dict[str, str], keep: bool = False, dumps: dict[str, bytes] | None = None) -> Run:
    check = HangCheck(15.0, keep, apart_s=0.01)
    check.watch.start(0.0)
    return Run(stacks, check, dumps=dumps or {})


def recorder_dump(enqueued: int, completed: int) -> bytes:
    return pickle.dumps({"pg_config": {"0": {"desc": "default_pg"}}, "pg_status": {"0": {
        "last_enqueued_collective": enqueued, "last_completed_collective": completed}}, "entries": []}, protocol=2)


def test_a_rank_in_a_cuda_synchronisation_asks_the_flight_recorder_which_says_it_waits_on_a_collective() -> None:
    run = suspected_run({"node-0": ITEM, "node-1": SLEEPING},
                        dumps={"node-0": recorder_dump(11, 10), "node-1": recorder_dump(10, 10)})
    run.check.look(run, 16.0)
    assert [word for _, word in run.said] == [STACKS, STACKS, STACKS, STACKS, DUMPS, DUMPS]  # asked once
    [event] = run.events
    assert isinstance(event, HangSuspected) and run.stopped
    assert event.why == ("rank 0 waits in a collective, and rank 1 is stuck; no stack moved in 0.01 s; NCCL's flight "
                         "recorder: collective #11 of default_pg has not completed on rank 0; rank 1 never entered it "
                         "(its last: #10)")


def test_a_cuda_synchronisation_the_recorder_does_not_explain_goes_on_and_its_dumps_are_kept(tmp_path: Path) -> None:
    run = suspected_run({"node-0": ITEM, "node-1": SLEEPING})  # the dumps are no torch's: nothing said in flight
    run.check.look(run, 16.0)
    [event] = run.events
    assert isinstance(event, HangRuledOut) and not run.stopped
    assert event.why.endswith("(rank 0 waits in a CUDA synchronisation; NCCL's flight recorder sent no dump)")
    assert event.answers["node-1"]["nccl"] == {"nccl_trace_rank_1": "ZHVtcA=="}  # the launch keeps them


def test_a_hang_asks_for_the_flight_recorder_then_stops_the_run() -> None:
    run = suspected_run({"node-0": WAITING, "node-1": SLEEPING})
    run.check.look(run, 10.0)
    assert run.said == []  # not yet: 10 s without progress
    run.check.look(run, 16.0)
    assert [word for _, word in run.said] == [STACKS, STACKS, STACKS, STACKS, DUMPS, DUMPS]
    [event] = run.events
    assert isinstance(event, HangSuspected) and not event.kept and run.stopped and run.check.hang is event
    assert event.answers["node-1"]["nccl"] == {"nccl_trace_rank_1": "ZHVtcA=="}  # beside its stacks
    assert event.why == "rank 0 waits in a collective, and rank 1 is stuck; no stack moved in 0.01 s"


def test_the_hang_report_says_why_it_is_one(tmp_path: Path) -> None:
    run = suspected_run({"node-0": WAITING, "node-1": SLEEPING})
    run.check.look(run, 16.0)
    [event] = run.events
    assert isinstance(event, HangSuspected)
    lines = hang_report("20261125-000000-abcdef", event, tmp_path)
    assert lines[:2] == ["hang suspected (no progress for 16 s): rank 0 waits in all_reduce (job.py:30); rank 1 "
                         "(node-1, pid 4241) is in time.sleep (job.py:28)",
                         "why a hang: rank 0 waits in a collective, and rank 1 is stuck; no stack moved in 0.01 s"]
    nccl = next(tmp_path.glob("20261125-000000-abcdef/stacks-*/nccl"))  # the dumps asked for, beside the stacks
    assert lines[-2:] == [f"NCCL flight recorder: 2 dump(s) in {nccl}; read them with `torchfrtrace {nccl} -p "
                          "nccl_trace_rank_`", "stopping the run (--on-hang keep would keep it)"]


def test_a_kept_hang_goes_on_and_is_looked_at_one_timeout_later() -> None:
    run = suspected_run({"node-0": WAITING, "node-1": SLEEPING}, keep=True)
    run.check.look(run, 16.0)
    assert isinstance(run.events[0], HangSuspected) and run.events[0].kept and not run.stopped
    assert run.check.watch.suspected(16.5) is None


def test_no_hang_says_what_was_seen_in_one_line_and_the_run_goes_on() -> None:
    run = suspected_run({"node-0": SAVING, "node-1": WAITING})
    run.check.look(run, 16.0)
    [event] = run.events
    assert isinstance(event, HangRuledOut) and not run.stopped and run.check.hang is None
    assert DUMPS not in [word for _, word in run.said]
    assert ruled_out_line(event) == ("no progress for 16 s, but not a hang (rank 0 is busy, not waiting): rank 0 is "
                                     "in save_checkpoint (job.py:14); rank 1 (node-1, pid 4241) waits in all_reduce "
                                     "(job.py:30); the run goes on")
    assert run.check.watch.suspected(16.5) is None  # looked at again one timeout later


def test_progress_while_the_stacks_are_taken_ends_the_look_quietly() -> None:
    run = suspected_run({"node-0": WAITING, "node-1": SLEEPING})
    step = run.step

    def step_with_a_line(timeout: float) -> None:
        step(timeout)
        run.check.watch.observe(17.0, "node-1", [{"rank": 1, "quiet_s": 0.0}])

    run.step = step_with_a_line  # type: ignore[method-assign]
    run.check.look(run, 16.0)
    assert run.events == [] and not run.stopped
