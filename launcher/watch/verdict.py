"""Whether a run without progress is hung, from every rank's stack looked at twice, a few seconds apart (pure).

A hang: no rank's main thread moved between the two looks, every rank waits (its innermost frame explains a wait,
`launcher.watch.frames`, or /proc says it is stopped, a zombie, in uninterruptible sleep), and at least one waits
for its peers in a collective or DDP's backward. Anything else is not a hang, and says why: a rank whose stack moved,
one busy outside any wait (a checkpoint being written, an evaluation pass, a slow first step), one that gave no
stack, or ranks that all wait on something other than each other (a sleep, data). A false verdict stops a healthy
run, so in doubt the run goes on.

On a GPU a rank behind a hung collective waits in a CUDA synchronisation (`loss.item()`), not in the collective:
NCCL runs it as a kernel. Such a rank waits for its peers when NCCL's flight recorder shows it enqueued a collective
that has not completed (`launcher.watch.flightrec`); without the recorder's word the verdict asks for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.watch.flightrec import Collectives, in_flight_said, ranks_text
from launcher.watch.frames import wait_of
from launcher.watch.stacks import STUCK_STATES, RankStack


@dataclass(frozen=True)
class Verdict:
    hang: bool
    why: str
    """What decided it, in a few words: `rank 0 is busy, not waiting`."""
    asks_recorder: bool = False
    """Only NCCL's flight recorder can tell: a rank waits in a CUDA synchronisation, and no dump was read."""


def judge(first: Sequence[RankStack], second: Sequence[RankStack], apart_s: float,
          unanswered: Sequence[str] = (), recorded: Mapping[int, Collectives] | None = None) -> Verdict:
    """The verdict on two looks at every rank's stack, `apart_s` seconds apart; `unanswered`: the nodes that sent
    no stacks at either look (their ranks are unknown); `recorded`: what NCCL's flight recorder dumps say of each
    rank's collectives (None: not asked)."""
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
    syncing = [s for s in second if (w := waits[(s.node, s.rank)]) is not None and w.kind == "cuda"]
    on_gpu = [s for s in syncing if (c := (recorded or {}).get(s.rank)) is not None and c.in_flight is not None]
    peers = [s for s in second if ((w := waits[(s.node, s.rank)]) is not None and w.collective) or s in on_gpu]
    if not peers:
        if syncing and recorded is None:
            return Verdict(False, "no rank waits for the others in a collective, unless NCCL's flight recorder says "
                                  f"{_who(syncing)} {_verb(syncing, 'waits', 'wait')} on one", asks_recorder=True)
        if syncing:
            told = "shows no collective in flight" if recorded else "sent no dump"
            return Verdict(False, f"no rank waits for the others in a collective ({_who(syncing)} "
                                  f"{_verb(syncing, 'waits', 'wait')} in a CUDA synchronisation; NCCL's flight "
                                  f"recorder {told})")
        return Verdict(False, "no rank waits for the others in a collective")
    others = [s for s in second if s not in peers]
    stuck = f", and {_who(others)} {_verb(others, 'is', 'are')} stuck" if others else ""
    return Verdict(True, f"{_who(peers)} {_verb(peers, 'waits', 'wait')} in a collective{stuck}; no stack moved "
                         f"in {apart_s:g} s{_recorder(recorded)}")


def _recorder(recorded: Mapping[int, Collectives] | None) -> str:
    said = in_flight_said(recorded or {})
    return f"; NCCL's flight recorder: {said}" if said else ""


def _moved(before: RankStack | None, after: RankStack) -> bool:
    """Whether a rank's main thread is elsewhere than at the first look (or it is another process, or was not seen)."""
    return before is None or before.pid != after.pid or before.frames != after.frames


def _who(stacks: Sequence[RankStack]) -> str:
    return ranks_text([s.rank for s in stacks])


def _verb(stacks: Sequence[RankStack], one: str, many: str) -> str:
    return one if len(stacks) == 1 else many
