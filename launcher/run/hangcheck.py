"""A run alive but stuck, as an attached run's handle finds it (`launcher.run.handle`): no progress for the hang
timeout (`launcher.watch.hang`), then every rank's stack twice, a few seconds apart, and the verdict on them
(`launcher.watch.verdict`). A hang: NCCL's flight recorder is asked for its dumps (the `dumps` message: torch's
debug-info pipes), then the run is stopped (exit code 124) or kept (`--on-hang keep`). Not a hang: one line says what
was seen, and the run goes on. Under SLURM the same messages travel on the step's stdin.

What is judged is watch/'s (pure, the time passed in); this module asks the nodes and carries the verdict out. The
handle's waiting thread runs all of it, taking events between the messages (`Waiter.step`): output goes on, a node
that ends is seen, and a stop message is never held back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from launcher.events import HangRuledOut, HangSuspected, NcclDumps, NodeEvent, StacksTaken
from launcher.limits import HANG_LOOKS_APART_S, NCCL_DUMP_WAIT_S, STACKS_MARGIN_S, STACKS_WAIT_S, STALL_FACTOR
from launcher.node.wire import DUMPS, STACKS, message_line
from launcher.watch.arrival import Arrivals
from launcher.watch.hang import HangWatch
from launcher.watch.verdict import Verdict, add_dumps, judge_stacks, with_dumps

log = logging.getLogger(__name__)


class Channel(Protocol):
    def send(self, data: bytes, block: bool = True) -> bool: ...


class Watched(Protocol):
    """What the look needs of a node's session (`launcher.run.sessions.Session`): read only."""

    @property
    def name(self) -> str: ...
    @property
    def end(self) -> object | None: ...
    @property
    def channel(self) -> Channel: ...


class Waiter(Protocol):
    """What the look needs of the run's handle (`RunHandle`)."""

    @property
    def sessions(self) -> Mapping[str, Watched]: ...
    @property
    def on_event(self) -> Callable[[NodeEvent], None]: ...

    def step(self, timeout: float) -> None: ...

    def stop(self, kill: bool = False, why: str = "asked") -> None: ...


class HangCheck:
    """The watch, the looks it starts, and the hang that stopped the run."""

    def __init__(self, timeout: float | None, keep: bool, apart_s: float = HANG_LOOKS_APART_S, restart: bool = False):
        self.watch = HangWatch(timeout)
        self.arrivals = Arrivals()
        """Every rank's collectives, from the same beats (the suspects: the ranks behind; the launch's straggler rule
        reads it too)."""
        self.keep = keep
        self.restart = restart
        """`--on-hang restart`: a hang stops this attempt, and what follows it is the attempts' decision."""
        self.apart_s = apart_s
        self.hang: HangSuspected | None = None
        """The hang that stopped the run (exit code 124)."""
        self._looking = False
        """A look is under way (its waits step the handle, which would start another)."""
        self._taking: type[NodeEvent] | None = None
        self._taken: dict[str, NodeEvent] = {}

    def observe(self, now: float, wall: float, node: str, progress: Iterable[Mapping[str, Any]]) -> None:
        """One node's beat, taken at `now` (monotonic) and `wall` (the wall clock): its ranks' progress (the watch)
        and collectives (the arrivals)."""
        progress = list(progress)
        self.watch.observe(now, node, progress)
        self.arrivals.feed(progress, wall)

    def takes(self, event: NodeEvent) -> bool:
        """Keep a node's answer to the message being waited on (its stacks, its dumps); True when it was one."""
        if self._taking is None or not isinstance(event, self._taking):
            return False
        self._taken[event.node] = event
        return True

    def look(self, run: Waiter, now: float) -> None:
        """When no rank made progress for the timeout: the two two_stacks, the verdict, and what follows from it."""
        quiet = None if self._looking else self.watch.suspected(now)
        if quiet is None:
            return
        self._looking = True
        try:
            self._judge(run, quiet)
        finally:
            self._looking = False

    def _judge(self, run: Waiter, quiet: float) -> None:
        log.info(
            "no progress for %.0f s (limit %s s): every rank's stack, twice, %g s apart",
            quiet,
            self.watch.limit(),
            self.apart_s,
        )
        mark = self.watch.last_progress
        first = self._ask(run, STACKS, StacksTaken, STACKS_WAIT_S + STACKS_MARGIN_S)
        until = time.monotonic() + self.apart_s
        while time.monotonic() < until and any(s.end is None for s in run.sessions.values()):
            run.step(min(0.2, max(0.0, until - time.monotonic())))
        second = self._ask(run, STACKS, StacksTaken, STACKS_WAIT_S + STACKS_MARGIN_S)
        if self.watch.last_progress != mark or not any(s.end is None for s in run.sessions.values()):
            log.info("progress came back while the stacks were taken (or the run ended): nothing to say")
            return  # progress came back while it was looked at (or the run ended): nothing to say
        answers = {name: _stacks_answer(reply) for name, reply in second.items()}
        looked = {name: _stacks_answer(reply) for name, reply in first.items()}
        add_dumps(answers, looked, newer=False)  # a node sends each dump once: those that came with the first look
        judged = judge_stacks(looked, answers, self.apart_s, self.arrivals, time.time())  # inv top judges by it too
        verdict = judged.verdict
        if verdict.hang or verdict.asks_recorder:
            # NCCL's flight recorder, asked through torch's pipes: a hang's evidence, and on a GPU what a rank in
            # a CUDA synchronisation waits on (a collective that has not completed, or nothing)
            dumps = self._ask(run, DUMPS, NcclDumps, NCCL_DUMP_WAIT_S + STACKS_MARGIN_S)
            add_dumps(
                answers, {name: {"nccl": reply.dumps} for name, reply in dumps.items() if isinstance(reply, NcclDumps)}
            )
            verdict = with_dumps(judged, answers, self.apart_s)
        log.info(
            "the verdict: %s: %s; suspects %s",
            "a hang" if verdict.hang else "not a hang",
            verdict.why,
            list(verdict.suspects),
        )
        stall = not verdict.hang
        if stall:
            stalled = self._stalled(run, verdict, quiet, answers)
            if stalled is None:
                return
            verdict, quiet = stalled
        event = HangSuspected(
            "",
            time.time(),
            quiet,
            answers,
            self.keep,
            verdict.why,
            verdict.suspects,
            self.watch.reached(),
            self.watch.counted(),
            self.restart and not self.keep,
            stall,
        )
        run.on_event(event)
        if self.keep:
            self.watch.rearm(time.monotonic())
        else:
            self.hang = event
            run.stop(why=f"{'a stall' if stall else 'a hang'}: {verdict.why}")

    def _stalled(
        self, run: Waiter, verdict: Verdict, quiet: float, answers: dict[str, Any]
    ) -> tuple[Verdict, float] | None:
        """Not a hang: a stall (its verdict, how long every rank was idle) when every look has found every rank idle
        for STALL_FACTOR hang timeouts; else None, once the line that says so and how far a stall is went out."""
        idle_for, bound = self.watch.idle_for(time.monotonic(), quiet, verdict.idle), self.watch.stall_after()
        if idle_for is not None and bound is not None and idle_for >= bound:
            words = (
                f"every rank has been idle for {idle_for:.0f} s ({bound:.0f} s: {STALL_FACTOR:g}x the hang timeout), "
                "none waiting for another: no work goes on anywhere"
            )
            return Verdict(True, words), idle_for
        why = verdict.why if idle_for is None else f"{verdict.why}; every rank idle {idle_for:.0f} s"
        why += "" if idle_for is None or bound is None else f" (a stall at {bound:.0f} s)"
        run.on_event(HangRuledOut("", time.time(), quiet, answers, why))
        self.watch.rearm(time.monotonic())
        return None

    def _ask(self, run: Waiter, message: str, answer: type[NodeEvent], wait_s: float) -> dict[str, NodeEvent | str]:
        """`message` to every node still running; each one's answer, or why there is none, within `wait_s`."""
        running = [s for s in run.sessions.values() if s.end is None]
        log.debug("%s sent to %s", message, ", ".join(s.name for s in running))
        self._taking, self._taken = answer, {}
        for session in running:
            session.channel.send(message_line(message), block=False)
        until = time.monotonic() + wait_s
        try:
            while any(s.name not in self._taken and s.end is None for s in running) and time.monotonic() < until:
                run.step(0.2)
        finally:
            self._taking = None
        log.debug("%s answered by %s", message, ", ".join(sorted(self._taken)) or "no node")
        return {s.name: self._taken.get(s.name, f"no answer to `{message}` within {wait_s:g} s") for s in running}


def _stacks_answer(reply: NodeEvent | str) -> dict[str, Any] | str:
    """A node's `stacks` answer as the report reads it (launcher.report.hangs.from_answers)."""
    if isinstance(reply, StacksTaken):
        return {"workers": list(reply.workers), "nccl": reply.nccl}
    return str(reply)
