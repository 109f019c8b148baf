"""A sync's outcomes (pure): what one node's sync did, and how it is told: a line a node, what was sent or why
not, and the summary line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from launcher.errors import NodeFailure
from launcher.sync.tree import size_text


@dataclass(frozen=True)
class NodeSync:
    """What one node's sync did."""

    node: str
    dest: str
    """The destination as the node resolved it."""
    sent: int
    """Entries sent (files and links)."""
    bytes: int
    """Content bytes sent."""
    unchanged: int
    seconds: float
    via: str | None = None
    """The node the files came through (`sync.relay`); None: straight from the controller."""
    unreached: tuple[tuple[str, str], ...] = ()
    """The nodes this one should have passed the stream on to and could not, and why."""
    relay_failed: str | None = None
    """Why its files came straight from the controller after all: the relay that failed it."""
    done_at: float = 0.0
    """When the controller knew it done (wall clock; 0: not known): the run's page's 'sync done'."""


def outcome_lines(outcomes: Mapping[str, NodeSync | NodeFailure]) -> list[str]:
    """One line per node: what was sent, or the one-sentence failure."""
    lines = []
    for outcome in outcomes.values():
        if isinstance(outcome, NodeSync):
            via = f" through {outcome.via}" if outcome.via else ""
            lines.append(
                f"{outcome.node}: sent {outcome.sent} file(s), {size_text(outcome.bytes)}{via} in "
                f"{outcome.seconds:.2f}s; {outcome.unchanged} unchanged -> {outcome.dest}"
            )
            if outcome.relay_failed:
                lines.append(f"{outcome.node}: sent straight from here: the relay through {outcome.relay_failed}")
        else:
            lines.append(f"{outcome}")
    return lines


def summary(outcomes: Mapping[str, NodeSync | NodeFailure], seconds: float) -> str:
    done = [o for o in outcomes.values() if isinstance(o, NodeSync)]
    lost = sum(getattr(o, "crossed", 0) for o in outcomes.values() if isinstance(o, NodeFailure))
    text = (
        f"synced {len(done)}/{len(outcomes)} node(s) in {seconds:.1f}s: {sum(o.sent for o in done)} file(s), "
        f"{size_text(sum(o.bytes for o in done))} sent"
    )
    relayed = [o for o in done if o.via]
    if relayed:
        text += (
            f" ({size_text(sum(o.bytes for o in done if not o.via))} from here, the rest node to node: "
            f"{len(relayed)} node(s) through another)"
        )
    return text + (
        f"; {size_text(lost)} more crossed the wire to the nodes that failed, discarded there" if lost else ""
    )
