"""How an attached launch ends when its run did not fail but the launcher lost it (pure): its terminal closed and it
left the run to the nodes, another launcher took the run over (`attach`), or the nodes stopped their part because no
launcher was heard from for the heartbeat timeout. None of them is a training failure: each says what happened, what
the run's state is, and what to run (exit code launcher.limits.AWAY_EXIT)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from launcher.events import EndKind, NodeEnd
from launcher.node.wire import HEARTBEAT_TIMEOUT
from launcher.plan.ends import Absence, RunEnd, ended_how


def left_line(run_id: str, nodes: int, bound: float | None, attach: str) -> str:
    """This launcher's terminal closed (SIGHUP): the run goes on without it."""
    line = (
        f"the launcher's terminal closed: run {run_id} goes on on its {nodes} node(s) without it; `{attach}` takes "
        "it back from any terminal"
    )
    if bound is None:
        return line + "; it goes on until it ends or `stop` ends it"
    return line + f"; with no launcher heard from for {bound:g} s (--heartbeat-timeout) its nodes stop it"


RESTART_WORDS = "the run did not fail: a new launch starts it over, from its last checkpoint if it saves and loads one"
"""What starting a run again does, in words true of every script: the launcher cannot know whether it checkpoints."""


def taken_line(run_id: str, ends: Sequence[NodeEnd]) -> str | None:
    """Another launcher took the run over: this one lets go (None when none did)."""
    taken = [e for e in ends if e.kind == EndKind.TAKEN]
    if not taken:
        return None
    by = taken[0].stop_reason or "taken over by another launcher"
    return (
        f"run {run_id} was {by} (`attach`) on {', '.join(e.node for e in taken)}: this launcher lets go; the run "
        "goes on there"
    )


def away_line(run_id: str, ends: Sequence[NodeEnd], bound: float | None) -> str | None:
    """The nodes stopped their part because no launcher was heard from for the bound (None when none did): the run
    ended for want of a launcher, not by a failure of its own; every node's end is said."""
    stopped = [e.node for e in ends if e.stop_reason == HEARTBEAT_TIMEOUT]
    if not stopped:
        return None
    others = [
        f"{e.node}: {ended_how(e)}" + (" (its peer stopped)" if e.failed else "") for e in ends if e.node not in stopped
    ]
    return (
        f"run {run_id}: no launcher was heard from for {bound or 0:g} s (--heartbeat-timeout), so "
        f"{', '.join(stopped)} stopped {'its' if len(stopped) == 1 else 'their'} part by "
        f"{'itself' if len(stopped) == 1 else 'themselves'}"
        + (f"; {'; '.join(others)}" if others else "")
        + f"; {RESTART_WORDS}"
    )


def attached_line(run_id: str, away: Mapping[str, float | None]) -> str:
    """`attach` took the run: on how many nodes, and how long they had been without a launcher."""
    known = [seconds for seconds in away.values() if seconds is not None]
    ended = [name for name, seconds in away.items() if seconds is None]
    line = f"attached to run {run_id} on {len(away)} node(s)"
    if known:
        line += f"; its nodes had heard no launcher for {max(known):.0f} s"
    if ended:
        line += f"; it had ended on {', '.join(ended)} meanwhile"
    return line


def _clock(when: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(when))


def cut_off_line(since: float, until: float | None) -> str:
    """No node can be reached at once: this machine's network, most likely; the run goes on on its nodes."""
    line = (
        f"no node of the run can be reached since {_clock(since)} (this machine's network?): the run goes on on "
        "its nodes; "
    )
    if until is None:
        return line + "trying again until one answers (with no --heartbeat-timeout they keep it)"
    return line + f"trying again until {_clock(until)}, when they stop it by themselves unless a launcher is back"


def cut_off_end_line(run_id: str, ends: Sequence[NodeEnd], bound: float | None) -> str | None:
    """The launcher gave up after its nodes' bound with no node reached: no failure of the run's (None unless every
    node was lost so)."""
    if not ends or any(e.kind != EndKind.LOST for e in ends):
        return None
    return (
        f"run {run_id}: no node could be reached for {bound or 0:g} s (--heartbeat-timeout; this machine's "
        f"network?), so its nodes stopped the run by themselves, as no launcher was heard from; {RESTART_WORDS}"
    )


def absence_line(
    ended: RunEnd, ends: Sequence[NodeEnd], run_id: str, nodes: int, bound: float | None, attach: str
) -> str:
    """How a launcher lost a run that did not fail, in words: its terminal closed (`attach`: the command that takes
    it back), another took it over, no node could be reached, or no launcher was heard from for the heartbeat
    `bound`."""
    if ended.absence == Absence.LEFT:
        return left_line(run_id, nodes, bound, attach)
    line = {
        Absence.TAKEN: taken_line(run_id, list(ends)),
        Absence.CUT_OFF: cut_off_end_line(run_id, list(ends), bound),
        Absence.NO_LAUNCHER: away_line(run_id, list(ends), bound),
    }[ended.absence]  # type: ignore[index]
    assert line is not None  # run_end said which: its line has something to say
    return line
