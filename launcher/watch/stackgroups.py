"""Every rank's stack, as an answer and not a dump (pure): group the ranks by where they are, the innermost frame
that explains their wait (`launcher.watch.frames`) and the user's own frame that led there, and name the odd ones
out.

`ranks 0,2,3 wait in all_reduce (train.py:88); rank 1 (node-0, pid 4242) is in time.sleep (train.py:80)`
`ranks 0-2 wait in backward (DDP's gradient all-reduce), called from trainer.fit (boring.py:20); rank 3 (node-1,
pid 4242) is in time.sleep (boring.py:12, in training_step)`
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.ranges import numbers_text
from launcher.watch.frames import Frame, called_back, user_frame, wait_of

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.*)$')
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+")
STUCK_STATES = ("T", "t", "Z", "D", "X")
"""/proc states of a process that makes no progress by itself: stopped, a zombie, in uninterruptible sleep, dead."""


@dataclass(frozen=True)
class RankStack:
    """One worker's answer: its place in the run, its state, and its main thread's frames (innermost first)."""

    node: str
    rank: int
    local_rank: int
    pid: int
    state: str | None
    state_name: str | None
    frames: tuple[Frame, ...] = ()
    text: str | None = None
    """The whole dump (every thread), as the worker wrote it."""
    why: str | None = None
    """Why there is no stack (stopped, a zombie, no hook, no answer in time)."""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)
    """Anything else the node said (py-spy's dump, the wait channel, CPU seconds)."""
    helpers: tuple[RankStack, ...] = field(default=(), compare=False)
    """The rank's helpers (DataLoader and compile workers, carrying its RANK), each its own stack: not ranks."""
    parent: int | None = None
    """A helper's parent process (the rank's own process, or a helper of it); None for a rank."""

    @property
    def place(self) -> str:
        """Where the rank is, in a few words: `wait in all_reduce (train.py:88)`, `wait in backward (DDP's gradient
        all-reduce), called from trainer.fit (boring.py:20)`, `is in time.sleep (train.py:80)`."""
        frames = self.frames
        if not frames:
            if self.state in STUCK_STATES:
                return f"is {self.state_name} (state {self.state})"
            return f"gave no stack ({self.why or 'no answer'})"
        wait, index = wait_of(frames), user_frame(frames)
        user = frames[index] if index is not None else None
        where = user.where if user is not None else frames[0].where
        if index is not None and called_back(frames, index):
            where += f", in {frames[index].func}"  # a trainer called the user's hook: which one
        if wait is not None and not wait.on_users_line:
            head = f"wait in {wait.name}" + (f" ({wait.note})" if wait.note else "")
            call = user.call() if user is not None else None
            if user is None or (wait.note is None and call is not None and call.split(".")[-1] == wait.name):
                return f"{head} ({where})"  # the user's line calls it: the line says all
            return f"{head}, called from {call or user.func} ({where})"
        if wait is not None:
            return f"is in {wait.name} ({where})"
        if user is not None:  # busy: in its own code (the function says what), or in a library's it called
            what = user.func if user is frames[0] and user.func != "<module>" else (user.call() or user.func)
            return f"is in {what} ({where})"
        return f"is in {frames[0].func} ({frames[0].where})"


def parse_dump(text: str | None, lines: Mapping[str, str] | None = None) -> tuple[Frame, ...]:
    """The main thread's frames (innermost first) of a faulthandler dump: the thread that runs the script's own
    code (most often the one that took the signal, "Current thread"), else the first."""
    threads: list[tuple[bool, list[Frame]]] = []
    for row in (text or "").splitlines():
        if _THREAD.match(row):
            threads.append((row.startswith("Current thread"), []))
            continue
        match = _FRAME.match(row)
        if match and threads:
            path, number = match["file"], int(match["line"])
            threads[-1][1].append(Frame(path, number, match["func"].strip(), (lines or {}).get(f"{path}:{number}")))
    if not threads:
        return ()
    with_script = [t for t in threads if any(not f.library and f.func == "<module>" for f in t[1])]
    chosen = with_script or [t for t in threads if t[0]] or threads
    return tuple(chosen[0][1])


def rank_stacks(node: str, workers: Iterable[Mapping[str, Any]]) -> list[RankStack]:
    """One node's `stacks` answer as RankStacks: the ranks, each with its helpers (the entries marked `helper`)."""
    helpers: dict[int, list[RankStack]] = {}
    ranks = []
    for w in workers:
        if w.get("helper"):
            helpers.setdefault(int(w["owner"]), []).append(_stack(node, w))
        else:
            ranks.append(w)
    return [replace(_stack(node, w), helpers=tuple(helpers.get(int(w["pid"]), ()))) for w in ranks]


def _stack(node: str, w: Mapping[str, Any]) -> RankStack:
    extra = {k: w[k] for k in ("pyspy", "wchan", "cpu_s", "unread") if w.get(k) is not None}
    return RankStack(
        node,
        int(w["rank"]),
        int(w["local_rank"]),
        int(w["pid"]),
        w.get("state"),
        w.get("state_name"),
        parse_dump(w.get("stack"), w.get("lines")),
        w.get("stack"),
        w.get("why"),
        extra,
        parent=w.get("parent"),
    )


def answer(stacks: Sequence[RankStack]) -> str:
    """Where every rank is, the largest group first; a group of one after the first names its node and pid (the odd
    one out)."""
    groups: dict[str, list[RankStack]] = {}
    for stack in sorted(stacks, key=lambda s: s.rank):
        groups.setdefault(stack.place, []).append(stack)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0].rank))
    parts = []
    for i, (place, members) in enumerate(ordered):
        if len(members) > 1:
            parts.append(f"ranks {numbers_text([s.rank for s in members])} {_plural(place)}")
            continue
        s = members[0]
        who = f"rank {s.rank} ({s.node}, pid {s.pid})" if i > 0 or len(stacks) == 1 else f"rank {s.rank}"
        parts.append(f"{who} {_singular(place)}")
    return "; ".join(parts) if parts else "no worker of the run was found"


def _plural(place: str) -> str:
    return "are" + place[2:] if place.startswith("is ") else place


def _singular(place: str) -> str:
    return "waits" + place[4:] if place.startswith("wait ") else place


def stack_file(stack: RankStack) -> str:
    """What `<node>-r<rank>.txt` holds: who, its state, the dump as written, and py-spy's where it answered; then
    each of its helpers the same way, marked as a helper."""
    text = _stack_text(stack, f"node {stack.node}, rank {stack.rank} (local rank {stack.local_rank}), pid {stack.pid}")
    for helper in stack.helpers:
        text += "\n" + _stack_text(
            helper,
            f"--- helper of rank {stack.rank}: pid {helper.pid} (child of "
            f"{helper.parent}; a DataLoader or compile worker) ---",
        )
    return text


def _stack_text(stack: RankStack, title: str) -> str:
    head = [
        title,
        f"state: {stack.state_name or '?'} ({stack.state or '?'})"
        + (f", waiting in the kernel at {stack.extra['wchan']}" if stack.extra.get("wchan") else ""),
        f"where: {stack.place}",
    ]
    if stack.why:
        head.append(f"no stack: {stack.why}")
    body = [stack.text or ""]
    if stack.extra.get("pyspy"):
        body += ["--- py-spy dump --native ---", str(stack.extra["pyspy"])]
    return "\n".join(head) + "\n\n" + "\n".join(body).rstrip("\n") + "\n"


def from_answers(answers: Mapping[str, Mapping[str, Any] | str]) -> tuple[list[RankStack], dict[str, str]]:
    """Every node's `stacks` answer (or why it gave none) -> RankStacks and failures."""
    stacks: list[RankStack] = []
    failures: dict[str, str] = {}
    for node, reply in answers.items():
        if isinstance(reply, str):
            failures[node] = reply
        else:
            stacks += rank_stacks(node, reply.get("workers", []))
    return stacks, failures
