"""`inv top` and the hang watch judge a rank behind a collective as one (#60 item 10): rank 1 of the recorded gloo
run never entered all_reduce #46, which rank 0 entered and waits in; rank 1 is at work (evaluating, outside any
wait). The watch said `not a hang (... rank 1 ... is at work ...)`, while `inv top` said `hang suspected: r1 never
entered all_reduce #46 ...` from the wait alone. Both now take two looks at the stacks and judge them with
`launcher.watch.verdict.judge_stacks`, and say it in its words."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any
from unittest import mock

from rich.console import Console

from launcher.events import HangRuledOut, NodeEvent, StacksTaken
from launcher.node.wire import STACKS
from launcher.report.hangs import ruled_out_line
from launcher.report.toptables import view
from launcher.report.topview import TopScreen, show_once
from launcher.run.hangcheck import HangCheck
from launcher.run.topfeed import judged_once
from launcher.watch.topmodel import NodeView, as_json
from tests.unit.test_arrival import recorded
from tests.unit.test_hang_check import Channel, Session
from tests.unit.test_top import recorded_views

WAITING = """Current thread 0x00007f0000000002 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2850 in all_reduce
  File "/home/u/job.py", line 30 in <module>
"""
EVALUATING = """Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/job.py", line 14 in evaluate
  File "/home/u/job.py", line 38 in <module>
"""
STUCK = """Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/job.py", line 28 in <module>
"""
LINES = {"/home/u/job.py:30": "dist.all_reduce(x)", "/home/u/job.py:14": "total += model(x).sum()",
         "/home/u/job.py:28": "time.sleep(600)"}


def answers(rank1: str) -> dict[str, Any]:
    """Each node's `stacks` answer: rank 0 waits in the all_reduce, rank 1 as given; every rank's collectives as
    its worker's thread read them (the recording's)."""
    collectives = {r["rank"]: r["collectives"] for r in recorded("hang")[0]}
    return {f"node-{rank}": {"workers": [{"rank": rank, "local_rank": 0, "pid": 4000 + rank, "state": "R",
                                          "state_name": "running", "stack": stack, "why": None, "lines": LINES,
                                          "collectives": collectives[rank]}], "nccl": {}}
            for rank, stack in ((0, WAITING), (1, rank1))}


@dataclass
class Run:
    """An attached run's handle as the watch's look sees it: each node answers `stacks` at the next step."""

    replies: dict[str, Any]
    check: HangCheck

    def __post_init__(self) -> None:
        self.said: list[tuple[str, str]] = []
        self.sessions = {name: Session(name, Channel(name, self.said)) for name in self.replies}
        self.events: list[NodeEvent] = []
        self._answered = 0

    def on_event(self, event: NodeEvent) -> None:
        self.events.append(event)

    def step(self, timeout: float) -> None:
        for node, word in self.said[self._answered:]:
            assert word == STACKS
            reply = self.replies[node]
            assert self.check.takes(StacksTaken(node, 0.0, tuple(reply["workers"]), {}))
        self._answered = len(self.said)

    def stop(self, kill: bool = False, why: str = "asked") -> None:
        raise AssertionError("a rank at work is no hang: nothing is stopped")


def watch_line(replies: dict[str, Any]) -> str:
    """What an attached launch's hang watch prints of the run (no progress for 31 s)."""
    check = HangCheck(30.0, keep=False, apart_s=0.01)
    check.watch.start(0.0)
    run = Run(replies, check)
    check.look(run, 31.0)
    [event] = run.events
    assert isinstance(event, HangRuledOut)
    return ruled_out_line(event)


def top_once(views: list[NodeView], replies: dict[str, Any], now: float) -> list[str]:
    """`inv top --once` into an 80-column terminal: its two looks at the stacks are `replies` both times."""
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    with mock.patch("launcher.run.topfeed.time.time", return_value=now), \
            mock.patch.dict("os.environ", {"COLUMNS": "80"}):
        show_once("run-x", views, judged_once(views, 0.8, lambda: (replies, replies)), out)
    return re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()).splitlines()


def test_a_rank_behind_at_work_is_behind_at_work_in_top_and_not_a_hang_in_both_in_the_same_words() -> None:
    views, wall = recorded_views("hang")
    replies = answers(EVALUATING)
    watched = watch_line(replies)
    why = re.search(r"but (not a hang \(.*\)): rank", watched)
    assert why and "rank 1 (node-1, pid 4001) is at work: it is in evaluate (job.py:14), outside any wait" in watched
    lines = top_once(views, replies, wall + 25.0)  # rank 0 has waited in all_reduce #46 for 34 s
    text = "\n".join(lines)
    assert "hang suspected" not in text, text
    row = next(line for line in lines if re.match(r"node-1\s+r1\s", line))
    assert "BEHIND, at work" in row, text
    said = " ".join(line.strip() for line in lines[lines.index(next(line for line in lines
                                                                      if line.startswith("r1 behind"))):])
    assert said.startswith("r1 behind 34 s, at work: not a hang ("), text
    assert why.group(1) in said, (why.group(1), said)  # the watch's words, whole (--once wraps: no line is cut)


def test_a_rank_behind_that_is_stuck_is_a_hang_in_top_as_in_the_watch() -> None:
    views, wall = recorded_views("hang")
    lines = top_once(views, answers(STUCK), wall + 25.0)
    text = " ".join(line.strip() for line in lines)
    row = next(line for line in lines if re.match(r"node-1\s+r1\s", line))
    assert "BEHIND, stuck" in row, "\n".join(lines)
    assert ("r1 behind 34 s, stuck: hang suspected (rank 1 never entered all_reduce #46 of default_pg (its last: #45), "
            "which rank 0 entered; rank 1 (node-1, pid 4001) is in time.sleep (job.py:28), its stack unchanged in 3 "
            "s)") in text, text


def test_the_live_view_looks_at_the_stacks_once_the_others_have_waited_long_and_then_says_the_verdict() -> None:
    views, wall = recorded_views("hang")  # each look: the next snapshots (a node sends one a second)
    asked: list[float] = []

    def two_stacks() -> tuple[dict[str, Any], dict[str, Any]]:
        asked.append(wall)
        return answers(EVALUATING), answers(EVALUATING)

    screen = TopScreen("run-x", SimpleNamespace(), 0.8, io.StringIO(), list, two_stacks)  # type: ignore[arg-type]
    clock = mock.patch("launcher.report.topview.time.time")
    with clock as now:
        now.return_value = wall + 10.0  # 19 s: said, not judged
        look = screen._look(recorded_views("hang")[0])
        assert [b.waited_s for b in look.behind] == [19.1] and not asked
        now.return_value = wall + 25.0  # 34 s: the looks are asked for, on a thread of their own
        look = screen._look(recorded_views("hang")[0])
        screen_lines = _screen(view("run-x", views, look.stragglers, behind=look.behind, height=24, width=80))
        assert "r1 behind 34 s, judging its stack: never entered all_reduce #46 of default_pg" in screen_lines, \
            screen_lines
        _wait(lambda: screen.looked is not None)
        now.return_value = wall + 28.0
        look = screen._look(recorded_views("hang")[0])
        assert asked == [wall]  # asked once: not again before TOP_BEHIND_HANG_S
    lines = _screen(view("run-x", views, look.stragglers, behind=look.behind, height=24, width=80))
    assert any(re.match(r"node-1\s+r1\s.*BEHIND, at work", line) for line in lines), "\n".join(lines)
    assert any(line.startswith("r1 behind 37 s, at work: not a hang (rank 1 never entered all_reduce #46")
               for line in lines), "\n".join(lines)
    assert not any("hang suspected" in line for line in lines), "\n".join(lines)


def _screen(renderable: object, width: int = 80, height: int = 24) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, height=height, color_system=None).print(renderable)
    return [line.rstrip() for line in out.getvalue().rstrip("\n").splitlines()]


def _wait(done: Any, timeout: float = 5.0) -> None:
    until = time.monotonic() + timeout
    while not done() and time.monotonic() < until:
        threading.Event().wait(0.01)
    assert done()


def test_once_json_says_the_verdict_on_a_rank_behind() -> None:
    """The value `top --once --json` prints and the API's Run.top() returns (`topfeed.snapshot`: one look, judged)."""
    views, wall = recorded_views("hang")
    with mock.patch("launcher.run.topfeed.time.time", return_value=wall + 25.0):
        look = judged_once(views, 0.8, lambda: (answers(EVALUATING), answers(EVALUATING)))
    value = json.loads(json.dumps(as_json("run-x", views, look.stragglers, look.behind, look.sources)))
    behind = value["ranks"][1]["behind"]
    assert (behind["hang_suspected"], behind["judged"]) == (False, "at work"), behind
    assert behind["verdict"].startswith("not a hang (rank 1 never entered all_reduce #46 of default_pg"), behind
