"""Whether a run without progress is hung, from every rank's stack looked at twice, a few seconds apart (pure).

A hang: no rank's main thread moved between the two two_stacks, every rank waits (its innermost frame explains a wait,
`launcher.watch.frames`, or /proc says it is stopped, a zombie, in uninterruptible sleep), and at least one waits
for its peers in a collective or DDP's backward. Anything else is not a hang, and says why: a rank whose stack moved,
one busy outside any wait (a checkpoint being written, an evaluation pass, a slow first step), one that gave no
stack, or ranks that all wait on something other than each other (a sleep, data). A false verdict stops a healthy
run, so in doubt the run goes on.

First of all the collectives (`launcher.watch.arrival`, from each rank's flight recorder, read inside the worker):
where some ranks of a group entered a collective that others did not, the ranks behind are the suspects, whatever the
others' stacks or CPU say (on a GPU a rank waiting for a stuck peer spins in whatever synchronisation comes first).
Then the suspect itself decides: its stack unchanged in a wait (a sleep, a lock, a collective of another group, its
DataLoader's workers stuck in the dataset: the worker named) is a hang; a suspect at work (its stack moved, its
loader workers moved, it computes or writes outside any wait, it is in uninterruptible I/O) is not, and the line says
what it does. Every rank of a group in one collective, none completed, and no stack moved: the collective itself.

Without the collectives (no recorder: torch before 2.7; a rank whose thread could not read them lately), the stacks
alone: on a GPU a rank behind a hung collective waits in a CUDA synchronisation (`loss.item()`), not in the
collective: NCCL runs it as a kernel. Such a rank waits for its peers when NCCL's flight recorder dumps show it
enqueued a collective that has not completed (`launcher.watch.flightrec`); without their word the verdict asks for
them.

One judgment: an attached launch's hang watch (no progress for the hang timeout) and `inv top` (a rank behind a
collective the others have waited in for TOP_BEHIND_HANG_S) both take two looks and judge them with `judge_stacks`, and
both say the verdict in `verdict_line`'s words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.watch.arrival import Arrivals, Behind, Stuck, answered
from launcher.watch.flightrec import Collectives, in_flight_said, ranks_text
from launcher.watch.flightrec import from_answers as recorded_in
from launcher.watch.frames import Wait, in_dataset, wait_of
from launcher.watch.stackgroups import STUCK_STATES, RankStack, from_answers

ASLEEP = "asleep"
"""A Wait that only /proc tells: the rank's own line was not read, and it sleeps without CPU."""
ASLEEP_CPU_SHARE = 0.02
"""A rank that used at most this share of a CPU between two looks is asleep, not at work."""
AT_WORK, STUCK = "at work", "stuck"
"""What the verdict found a rank behind a collective to be (`inv top` marks its row `BEHIND, at work`)."""


def verdict_line(hang: bool, why: str) -> str:
    """A verdict in the words the hang watch and `inv top` both print: `not a hang (WHY)`, `hang suspected (WHY)`."""
    return f"{'hang suspected' if hang else 'not a hang'} ({why})"


@dataclass(frozen=True)
class Verdict:
    hang: bool
    why: str
    """What decided it, in a few words: `rank 0 is busy, not waiting`."""
    asks_recorder: bool = False
    """Only NCCL's flight recorder can tell: a rank waits in a CUDA synchronisation, and no dump was read."""
    working: tuple[int, ...] = ()
    """The ranks behind a collective found at work (where the collectives named the suspects)..."""
    held: tuple[int, ...] = ()
    """... and those found stuck."""
    suspects: tuple[tuple[str, int], ...] = ()
    """(node, rank) of each rank that holds a hang up: behind its group and stuck, or stuck outside any collective
    while the others wait in one; none where every rank is in the same stuck collective."""
    idle: bool = False
    """Not a hang, but no work goes on anywhere: every rank waits, none for the others, and neither its stack nor a
    DataLoader worker of its moved (a sleep, a dead filesystem, a stuck loader). Long enough, a stall
    (`launcher.run.hangcheck`)."""

    def line(self) -> str:
        return verdict_line(self.hang, self.why)

    def of_rank(self, rank: int) -> str | None:
        """What the verdict found a rank behind to be (AT_WORK, STUCK); None: not a suspect it looked at."""
        return AT_WORK if rank in self.working else STUCK if rank in self.held else None


@dataclass(frozen=True)
class HangJudgment:
    """Two looks at every rank's stack as the nodes answered them, what every rank's collectives said at the second,
    and the verdict on them."""

    before: list[RankStack]
    after: list[RankStack]
    unanswered: list[str]
    behind: list[Behind]
    stuck: list[Stuck]
    verdict: Verdict


def judge_stacks(
    first: Mapping[str, Mapping[str, Any] | str],
    second: Mapping[str, Mapping[str, Any] | str],
    apart_s: float,
    arrivals: Arrivals,
    wall: float,
) -> HangJudgment:
    """The verdict on two two_stacks, each node's `stacks` answer (or why there is none), `apart_s` seconds apart: every
    rank's collectives as the second look read them go into `arrivals` first (the freshest there are). What the hang
    watch (`launcher.run.hangcheck`) and `inv top` (`launcher.watch.topmodel`) both judge by: one judgment."""
    before, failed_before = from_answers(first)
    after, failed = from_answers(second)
    arrivals.feed(answered(second), wall)
    behind, stuck = arrivals.behind(wall) or [], arrivals.stuck(wall)
    unanswered = sorted(set(failed) | set(failed_before))
    return HangJudgment(
        before, after, unanswered, behind, stuck, judge(before, after, apart_s, unanswered, behind=behind, stuck=stuck)
    )


def with_dumps(judged: HangJudgment, answers: Mapping[str, Any], apart_s: float) -> Verdict:
    """The verdict once NCCL's flight recorder's dumps came with the answers (asked where `judged.verdict` said a hang,
    or asked for them): where the collectives did not decide (no rank behind), the stacks again, with the dumps'
    word on what each rank enqueued."""
    if judged.behind:
        return judged.verdict
    return judge(judged.before, judged.after, apart_s, judged.unanswered, recorded_in(answers), stuck=judged.stuck)


def add_dumps(answers: dict[str, Any], more: Mapping[str, Any], newer: bool = True) -> None:
    """Add the flight recorder dumps of `more` (each node's answer, or its dumps alone) to each node's answer; a dump
    of the same name replaces the answer's where `more` is the newer."""
    for name, reply in more.items():
        dumps = reply.get("nccl") if isinstance(reply, dict) else None
        if dumps and isinstance(answers.get(name), dict):
            had = answers[name].get("nccl") or {}
            answers[name] = {**answers[name], "nccl": {**had, **dumps} if newer else {**dumps, **had}}


def judge(
    first: Sequence[RankStack],
    second: Sequence[RankStack],
    apart_s: float,
    unanswered: Sequence[str] = (),
    recorded: Mapping[int, Collectives] | None = None,
    behind: Sequence[Behind] = (),
    stuck: Sequence[Stuck] = (),
) -> Verdict:
    """The verdict on two looks at every rank's stack, `apart_s` seconds apart; `unanswered`: the nodes that sent
    no stacks at either look (their ranks are unknown); `recorded`: what NCCL's flight recorder dumps say of each
    rank's collectives (None: not asked); `behind` and `stuck`: what every rank's collectives say now
    (`Arrivals.behind`, `.stuck`)."""
    if unanswered:
        return Verdict(False, f"{', '.join(sorted(unanswered))} sent no stacks")
    if not second:
        return Verdict(False, "no worker of the run was found")
    if behind:
        return _suspects(first, second, apart_s, behind)
    before = {(s.node, s.rank): s for s in first}
    moved = [s for s in second if _moved(before.get((s.node, s.rank)), s)]
    if stuck and not moved:
        return Verdict(True, f"{'; '.join(s.line() for s in stuck)}; no stack moved in {apart_s:g} s")
    if moved:
        return Verdict(False, f"the stack of {_who(moved)} moved between two looks {apart_s:g} s apart")
    waits = {(s.node, s.rank): _wait(before.get((s.node, s.rank)), s, apart_s) for s in second}
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
            return Verdict(
                False,
                "no rank waits for the others in a collective, unless NCCL's flight recorder says "
                f"{_who(syncing)} {_verb(syncing, 'waits', 'wait')} on one",
                asks_recorder=True,
            )
        if syncing:
            told = "shows no collective in flight" if recorded else "sent no dump"
            return Verdict(
                False,
                f"no rank waits for the others in a collective ({_who(syncing)} "
                f"{_verb(syncing, 'waits', 'wait')} in a CUDA synchronisation; NCCL's flight "
                f"recorder {told})",
            )
        return Verdict(False, "no rank waits for the others in a collective", idle=not _helpers_moved(first, second))
    others = [s for s in second if s not in peers]
    also = f", and {_who(others)} {_verb(others, 'is', 'are')} stuck" if others else ""
    return Verdict(
        True,
        f"{_who(peers)} {_verb(peers, 'waits', 'wait')} in a collective{also}; no stack moved "
        f"in {apart_s:g} s{_recorder(recorded)}",
        suspects=tuple((s.node, s.rank) for s in others),
    )


def _suspects(
    first: Sequence[RankStack], second: Sequence[RankStack], apart_s: float, behind: Sequence[Behind]
) -> Verdict:
    """The ranks behind are the suspects: a hang when each of them is stuck, not when any is at work."""
    told = "; ".join(b.line() for b in behind)
    before = {s.rank: s for s in first}
    now = {s.rank: s for s in second}
    found = {
        rank: _suspect(before.get(rank), now.get(rank), apart_s)
        for rank in sorted({rank for b in behind for rank in b.late})
    }
    working = tuple(rank for rank, (held, _) in found.items() if not held)
    held = tuple(rank for rank, (stuck, _) in found.items() if stuck)
    what = {rank: f"rank {rank}{_at(now.get(rank))} {does}" for rank, (_, does) in found.items()}
    if working:
        return Verdict(False, f"{told}; but {'; '.join(what[r] for r in working)}", working=working, held=held)
    suspects = tuple((now[r].node, r) for r in held if r in now)
    return Verdict(True, f"{told}; {'; '.join(what[r] for r in held)}", held=held, suspects=suspects)


def _at(stack: RankStack | None) -> str:
    return "" if stack is None else f" ({stack.node}, pid {stack.pid})"


def _suspect(before: RankStack | None, after: RankStack | None, apart_s: float) -> tuple[bool, str]:
    """(whether a rank behind is stuck, what it does)."""
    if after is None:
        return False, "gave no stack"
    if not after.frames:
        if after.state == "D":
            return False, "is in uninterruptible I/O (state D): at work"
        if after.state in STUCK_STATES:
            return True, f"is {after.state_name} (state {after.state})"
        return False, f"gave no stack ({after.why or 'no answer'})"
    if _moved(before, after):
        return False, f"is at work: its stack moved in {apart_s:g} s (it {_said(after.place)})"
    wait = _wait(before, after, apart_s)
    if wait is None:
        return False, f"is at work: it {_said(after.place)}, outside any wait"
    if wait.kind == ASLEEP:
        return True, f"{_said(after.place)}, {wait.note}"
    if wait.kind == "data":
        return _loader(before, after, apart_s)
    return True, f"{_said(after.place)}, its stack unchanged in {apart_s:g} s"


def _wait(before: RankStack | None, after: RankStack, apart_s: float) -> Wait | None:
    """What a rank waits on: its innermost frame's word (`launcher.watch.frames`); where that frame is the user's and
    its line was not read (its file changed since the rank started: people edit a script while it trains), /proc's
    word: asleep (state S) without a CPU tick between the two looks."""
    wait = wait_of(after.frames)
    if wait is not None or not after.frames:
        return wait
    inner = after.frames[0]
    unread = after.extra.get("unread") or {}
    if inner.library or inner.source is not None or inner.file not in unread:
        return None
    was, now = (before.extra.get("cpu_s") if before is not None else None), after.extra.get("cpu_s")
    if after.state != "S" or was is None or now is None or now - was > ASLEEP_CPU_SHARE * apart_s:
        return None
    name = inner.file.rsplit("/", 1)[-1]
    return Wait(
        ASLEEP,
        "a call that sleeps",
        f"asleep without CPU in {apart_s:g} s ({name} {unread[inner.file]}: its line there now is not the one it runs)",
    )


def _loader(before: RankStack | None, after: RankStack, apart_s: float) -> tuple[bool, str]:
    """A rank that waits for its DataLoader: stuck when a worker of its is stuck in the dataset's code."""
    earlier = {h.pid: h for h in (before.helpers if before is not None else ())}
    busy = [h for h in after.helpers if in_dataset(h.frames)]
    moving = [h for h in busy if _moved(earlier.get(h.pid), h)]
    if moving:
        worker = moving[0]
        return False, f"waits for its DataLoader, whose worker pid {worker.pid} is at work (it {_said(worker.place)})"
    if busy:
        worker = busy[0]
        return True, (
            f"waits for its DataLoader worker pid {worker.pid}, stuck: it {_said(worker.place)}, its "
            f"stack unchanged in {apart_s:g} s"
        )
    return True, f"{_said(after.place)}, its stack unchanged in {apart_s:g} s"


def _said(place: str) -> str:
    """A place (`wait in all_reduce (...)`, `is in time.sleep (...)`) said of one rank."""
    return "waits" + place[4:] if place.startswith("wait ") else place


def _recorder(recorded: Mapping[int, Collectives] | None) -> str:
    said = in_flight_said(recorded or {})
    return f"; NCCL's flight recorder: {said}" if said else ""


def _helpers_moved(first: Sequence[RankStack], second: Sequence[RankStack]) -> bool:
    """Whether a helper of any rank (a DataLoader worker) is elsewhere than at the first look: work goes on there."""
    before = {(s.node, s.rank): {h.pid: h for h in s.helpers} for s in first}
    return any(_moved(before.get((s.node, s.rank), {}).get(h.pid), h) for s in second for h in s.helpers)


def _moved(before: RankStack | None, after: RankStack) -> bool:
    """Whether a rank's main thread is elsewhere than at the first look (or it is another process, or was not seen)."""
    return before is None or before.pid != after.pid or before.frames != after.frames


def _who(stacks: Sequence[RankStack]) -> str:
    return ranks_text([s.rank for s in stacks])


def _verb(stacks: Sequence[RankStack], one: str, many: str) -> str:
    return one if len(stacks) == 1 else many
