"""What the run learnt, in a line under the page's headline (pure): the loss rules' finding where the launch said
one (launcher/watch/loss.py, its marks), a rank that went non-finite in a detached run's samples, else where the
loss went."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from launcher.report.pageend import Mark
from launcher.report.pageseries import Timeline


def learning_line(marks: Sequence[Mark], line: Timeline) -> str:
    """`Page.learning`: the first non-finite loss, a rank far from the others, a spike (the marks' words), a
    non-finite loss a sample found, else the ranks' median loss from its first stretch to its last step; "" where
    no rank's loss was read."""
    said = [m.text for m in marks if m.kind == "loss"]
    for word in ("loss is", "its data?", "spike"):
        found = next((text for text in said if word in text), None)
        if found is not None:
            return f"loss: {found}"
    losses = [r for r in line.ranks if r.loss is not None]
    bad = [(r.loss.nonfinite_t, r.rank, r.node, r.loss) for r in losses if r.loss and r.loss.nonfinite_t is not None]
    if bad:
        _, rank, node, loss = min(bad, key=lambda found: (found[0], found[1]))
        return f"loss: rank {rank} ({node}) was {loss.last} by step {loss.nonfinite_steps}"
    starts = [next((v for v in r.loss.mean if v is not None), None) for r in losses if r.loss is not None]
    ends = [r.loss.last for r in losses if r.loss is not None and isinstance(r.loss.last, int | float)]
    known = [v for v in starts if v is not None]
    if not known or not ends:
        return ""
    return (
        f"loss: from {statistics.median(known):.4g} to {statistics.median(ends):.4g} (the ranks' median), "
        f"finite on every rank"
    )
