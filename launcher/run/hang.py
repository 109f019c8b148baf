"""A run alive but stuck, as the attached handle sees it: when its `HangWatch` (launcher.plan.hang) says no rank
made progress for the hang timeout, every node's agent takes its workers' stacks (the `stacks` word), and the
handle either stops the run (the report then says where every rank was; exit code 124) or keeps it and looks
again one timeout later (`--on-hang keep`). Under SLURM the same words travel on the step's stdin."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from launcher.events import HangSuspected
from launcher.node.protocol import STACKS, word_line
from launcher.options import STACKS_MARGIN_S, STACKS_WAIT_S

if TYPE_CHECKING:
    from launcher.run.handle import RunHandle


def look(handle: RunHandle, now: float) -> None:
    """No progress anywhere for the hang timeout: every rank's stack, then stop the run or keep it."""
    if (handle.watch is None or handle.stacks_taken is not None or handle.hang is not None
            or handle.stop_deadline is not None or handle.start_failure is not None or not handle.sessions
            or not all(s.started for s in handle.sessions.values())):
        return
    quiet = handle.watch.suspected(now)
    if quiet is None:
        return
    running = [s for s in handle.sessions.values() if s.end is None]
    handle.stacks_taken = taken = {}
    for session in running:
        session.channel.send(word_line(STACKS), block=False)
    until = time.monotonic() + STACKS_WAIT_S + STACKS_MARGIN_S
    try:
        while any(s.name not in taken and s.end is None for s in running) and time.monotonic() < until:
            handle.step(0.2)
    finally:
        handle.stacks_taken = None
    answers: dict[str, Any] = {s.name: {"workers": list(taken[s.name].workers), "nccl": taken[s.name].nccl}
                               if s.name in taken else
                               f"no stacks within {STACKS_WAIT_S + STACKS_MARGIN_S:g} s" for s in running}
    kept = handle.opts.on_hang == "keep"
    event = HangSuspected("", time.time(), quiet, answers, kept)
    handle.on_event(event)
    if kept:
        handle.watch.rearm(time.monotonic())
    else:
        handle.hang = event
        handle.stop()
