"""A launcher back from away, or a node whose connection came back: when it has read what its nodes printed
meanwhile, and how much that was (pure, over what the sessions have read).

The nodes say how long their log is at a moment after the return (the `position` word's answer, or the new session's
`attached` event); once every node's stream has been read that far, the launcher is where its nodes are, and says
so in one line (`the launcher was away 61 s; node-0, node-1 kept training; 412 lines caught up`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from launcher.events import CaughtUp, EndKind, Position, Reattached
from launcher.limits import CATCH_UP_WAIT_S


class Read(Protocol):
    """What a catch-up needs of a node's session (`launcher.run.nodesession.Session`): read only."""

    @property
    def received(self) -> int: ...
    @property
    def lines(self) -> int: ...
    @property
    def end(self) -> object | None: ...


@dataclass
class CatchUp:
    """One return: the launcher's own (`node` is "") or one node's connection."""

    node: str
    since: float
    """When the absence began (wall clock)."""
    away_s: float
    begun: float
    """When it came back (monotonic)."""
    lines_at: dict[str, int]
    """Each node's lines read when it came back."""
    targets: dict[str, int] = field(default_factory=dict)
    """The log's size each node said after the return: read that far, it is caught up."""

    def due(self, sessions: Mapping[str, Read], now: float, wait_s: float = CATCH_UP_WAIT_S) -> CaughtUp | None:
        """The caught-up event once every node still running has been read to its target (or `wait_s` passed)."""
        waiting = [
            n
            for n in self.lines_at
            if sessions[n].end is None and (n not in self.targets or sessions[n].received < self.targets[n])
        ]
        if waiting and now - self.begun < wait_s:
            return None
        lines = sum(max(0, sessions[n].lines - at) for n, at in self.lines_at.items())
        kept = tuple(n for n in self.lines_at if sessions[n].end is None)
        ended = tuple(n for n in self.lines_at if sessions[n].end is not None and not _taken(sessions[n].end))
        return CaughtUp(self.node, time.time(), self.away_s, self.since, lines, kept, ended, complete=not waiting)


def _taken(end: object) -> bool:
    return getattr(end, "kind", None) == EndKind.TAKEN


class Returns:
    """The returns whose backlog is being read: the launcher's own (`away`) and its nodes' reconnects."""

    def __init__(self) -> None:
        self.pending: list[CatchUp] = []

    def away(self, now: float, away_s: float, lines: dict[str, int]) -> None:
        """The launcher was frozen `away_s` seconds; `lines`: each node's lines read so far (each is asked where its
        log is now: `position`)."""
        if lines:
            self.pending.append(CatchUp("", time.time() - away_s, away_s, now, lines))

    def position(self, event: Position) -> None:
        for catchup in self.pending:
            if not catchup.node and event.node in catchup.lines_at:
                catchup.targets.setdefault(event.node, event.log_bytes)

    def reattached(self, event: Reattached, lines: int) -> None:
        """A node's new session during the run (its connection came back): read what it printed meanwhile."""
        if event.down_s is not None:
            self.pending.append(
                CatchUp(
                    event.node,
                    time.time() - event.down_s,
                    event.down_s,
                    time.monotonic(),
                    {event.node: lines},
                    {event.node: event.log_bytes},
                )
            )

    def due(self, sessions: Mapping[str, Read], now: float) -> list[CaughtUp]:
        """The returns caught up by now (each said once)."""
        done = [(catchup, catchup.due(sessions, now)) for catchup in self.pending]
        self.pending = [catchup for catchup, caught in done if caught is None]
        return [caught for _, caught in done if caught is not None]


def caught_up_line(event: CaughtUp) -> str | None:
    """The console's line for a return; None when there is nothing to say (another launcher took every node over)."""
    if not event.kept and not event.ended:
        return None
    kept = ", ".join(event.kept)
    lines = f"{event.lines} line{'s' if event.lines != 1 else ''} caught up" + (
        "" if event.complete else f" so far (still catching up after {CATCH_UP_WAIT_S:g} s)"
    )
    if not event.node:
        went = f"{kept} kept training" if event.kept else f"the run ended meanwhile on {', '.join(event.ended)}"
        return f"the launcher was away {event.away_s:.0f} s; {went}; {lines}"
    went = "its run went on" if event.kept else "its run had ended meanwhile"
    return f"{event.node}: the connection dropped and was opened again after {event.away_s:.1f} s; {went}; {lines}"
