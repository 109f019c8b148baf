"""Whether a run without progress is hung, from every rank's stack looked at twice, a few seconds apart (pure).

A hang: no rank's main thread moved between the two looks, every rank waits (its innermost frame explains a wait,
`launcher.report.frames`, or /proc says it is stopped, a zombie, in uninterruptible sleep), and at least one waits
for its peers in a collective or DDP's backward. Anything else is not a hang, and says why: a rank whose stack moved,
one busy outside any wait (a checkpoint being written, an evaluation pass, a slow first step), one that gave no
stack, or ranks that all wait on something other than each other (a sleep, data). A false verdict stops a healthy
run, so in doubt the run goes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from launcher.report.frames import wait_of
from launcher.report.ranges import numbers_text
from launcher.report.stacks import STUCK_STATES, RankStack


@dataclass(frozen=True)
class Verdict:
    hang: bool
    why: str
    """What decided it, in a few words: `rank 0 is busy, not waiting`."""


def judge(first: Sequence[RankStack], second: Sequence[RankStack], apart_s: float,
          unanswered: Sequence[str] = ()) -> Verdict:
    """The verdict on two looks at every rank's stack, `apart_s` seconds apart; `unanswered`: the nodes that sent
    no stacks at either look (their ranks are unknown)."""
    if unanswered:
        return Verdict(False, f"{', '.join(sorted(unanswered))} sent no stacks")
    if not second:
        return Verdict(False, "no worker of the run was found")
    before = {(s.node, s.rank): s for s in first}
    moved = [s for s in second if _moved(before.get((s.node, s.rank)), s)]
    if moved:
        return Verdict(False, f"the stack of {_who(moved)} moved between two looks {apart_s:g} s apart")
    waits = {(s.node, s.rank): wait_of(s.frames) for s in second}
    busy = [s for s in second if s.frames and waits[(s.node, s.rank)] is None]
    if busy:
        return Verdict(False, f"{_who(busy)} {_verb(busy, 'is', 'are')} busy, not waiting")
    unknown = [s for s in second if not s.frames and s.state not in STUCK_STATES]
    if unknown:
        return Verdict(False, f"{_who(unknown)} gave no stack")
    peers = [s for s in second if (w := waits[(s.node, s.rank)]) is not None and w.collective]
    if not peers:
        return Verdict(False, "no rank waits for the others in a collective")
    others = [s for s in second if s not in peers]
    stuck = f", and {_who(others)} {_verb(others, 'is', 'are')} stuck" if others else ""
    return Verdict(True, f"{_who(peers)} {_verb(peers, 'waits', 'wait')} in a collective{stuck}; no stack moved "
                         f"in {apart_s:g} s")


def _moved(before: RankStack | None, after: RankStack) -> bool:
    """Whether a rank's main thread is elsewhere than at the first look (or it is another process, or was not seen)."""
    return before is None or before.pid != after.pid or before.frames != after.frames


def _who(stacks: Sequence[RankStack]) -> str:
    ranks = sorted(s.rank for s in stacks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {numbers_text(ranks)}"


def _verb(stacks: Sequence[RankStack], one: str, many: str) -> str:
    return one if len(stacks) == 1 else many
