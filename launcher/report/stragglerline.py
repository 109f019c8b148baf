"""What the launcher says of a straggler (`launcher.watch.straggler` finds them): one line for a launch's console,
`inv status` and `inv top`'s callers."""

from __future__ import annotations

from launcher.watch.straggler import Straggler


def straggler_line(found: Straggler, node: str, one_look: bool = False) -> str:
    """What a launch's console and `inv status` say: `straggler: node-1 r3 at 0.45x the median rate for 60 s`,
    `straggler: node-1 r3 enters the collectives last: the others wait 0.15 s a step for it (62% of their time)`, or
    `straggler: node-1 r3: 41% of each step computing (forward) against a median of 23%; the others wait for it`."""
    if found.late is not None:
        wait = f"wait {found.lost_s:.2f} s a step for it" if found.lost_s is not None else "wait for it"
        return (
            f"straggler: {node} r{found.key} enters the collectives last ({found.late.last_share:.0%} of them): "
            f"the others {wait} ({found.late.wait_share:.0%} of their time)"
        )
    if found.forward is not None:
        return (
            f"straggler: {node} r{found.key}: {found.forward:.0%} of each step computing (forward) against a "
            f"median of {found.median_forward or 0.0:.0%}; the others wait for it"
        )
    held = "" if one_look else f" for {found.for_s:.0f} s"  # one look (`inv top --once`, status) holds nothing
    return f"straggler: {node} r{found.key} at {found.share or 0.0:.2f}x the median rate{held}"
