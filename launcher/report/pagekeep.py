"""What a run's page keeps between two writes (pure): each node's last real answer, so that a page written when a node
cannot be reached (released, down, its run folder gone) keeps every figure the page had, and says which nodes it could
not reach and from when their figures are. `launcher.app.pages` reads and writes the kept answers beside the page."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.report.pageend import ANSWERED

UNREACHED = ("unreachable", "error")
"""A node's states when it could not say anything of the run (`none` is an answer: it has no such run)."""


@dataclass
class Kept:
    """The answers a page is built from, and what it says of them."""

    answers: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    saved: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What to keep for the next write: node -> {"at": when it answered, "answer": its answer}."""
    notes: list[str] = field(default_factory=list)
    unreached: list[str] = field(default_factory=list)
    """The nodes that could not answer now."""


def kept_answers(fresh: Mapping[str, Mapping[str, Any]], saved: Mapping[str, Mapping[str, Any]], now: float) -> Kept:
    """Each node's answer now where it gave one about the run, else the one it gave before (a note says so); a node
    that could not answer is named whatever is kept of it."""
    out = Kept(saved={n: dict(v) for n, v in saved.items() if isinstance(v, Mapping)})
    for node, answer in fresh.items():
        state = answer.get("state")
        before = out.saved.get(node)
        old = before.get("answer") if before and isinstance(before.get("answer"), Mapping) else None
        if state in ANSWERED or old is None:
            out.answers[node] = answer
            if state in ANSWERED:
                out.saved[node] = {"at": now, "answer": dict(answer)}
        else:
            out.answers[node] = old
        if state in UNREACHED:
            out.unreached.append(node)
            why = str(answer.get("detail") or state)
            out.notes.append(
                f"{node} could not be reached now ({why}): "
                + (
                    f"its figures are what it said at {_clock(before)}"
                    if old is not None
                    else "the page has nothing of it but what the launch itself saw"
                )
            )
        elif old is not None and state not in ANSWERED:
            out.notes.append(
                f"{node} no longer has the run ({state}): its figures are what it said at {_clock(before)}"
            )
    return out


def _clock(saved: Mapping[str, Any] | None) -> str:
    at = (saved or {}).get("at")
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if isinstance(at, int | float) else "an earlier write"
