"""Which nodes of an attached run are out of reach, and since when (pure, the clock passed in): a node silent past its
limit, a node whose session is lost and not back within its bound, a stop that is over while some nodes are out of
reach, this machine cut off from every node at once. `launcher.run.handle` looks each step and ends the nodes so."""

from __future__ import annotations

from collections.abc import Sequence

from launcher.events import EndKind, NodeEnd
from launcher.run.nodesession import Session


def cut_off_since(
    sessions: Sequence[Session], cut_off: float | None, now: float, silence_timeout: float
) -> float | None:
    """Since when (monotonic) no node of the run can be reached at all, while that lasts: every live node's session
    lost for the silence timeout (this launcher's own network, most likely: a laptop's Wi-Fi). A node heard from since
    the first outage began (its end, as its peers fail after a node died) says this machine's network works."""
    live = [s for s in sessions if s.end is None]
    out = [s.outage for s in live if s.outage is not None]
    if not out:
        return None
    if cut_off is not None:
        return cut_off
    first = min(out)
    if (
        len(out) == len(live)
        and now - first > silence_timeout
        and not any(s.heard > first for s in sessions if s.outage is None)
    ):
        return first
    return None


def stop_over(sessions: Sequence[Session], stop_deadline: float | None) -> bool:
    """A stop is under way and every node that can be reached has ended: waiting for a reconnect (out of reach) would
    only hold up the run's end (the sweep still tries to stop it over a new connection). Where none has ended (this
    machine's network, most likely), the stop's deadline gives the stop a chance to get out."""
    return (
        stop_deadline is not None
        and any(s.end is not None for s in sessions)
        and all(s.end is not None or s.outage is not None for s in sessions)
    )


def silence_limit(session: Session, silence_timeout: float, probe_timeout: float) -> float:
    """How long a node may send nothing: the silence timeout; before its agent is ready, the probe's too (it may be
    starting its python from a cold network filesystem)."""
    return silence_timeout if session.ready else max(silence_timeout, probe_timeout)


def out_of_reach(
    session: Session, now: float, limit: float, outage_bound: float, stop_deadline: float | None, over: bool
) -> NodeEnd | None:
    """The end of a node that is out of reach now, as of `now` and the wall clock `wall` (None: it is not):
    lost (its session gone, not back within the bound, or the stop over), silent past its limit, or no end by the
    stop's deadline."""
    silent = now - session.heard
    if session.outage is not None:
        if silent > max(limit, outage_bound) or (stop_deadline or now) < now or over:
            # one that fell silent with its connection up stopped answering; one whose connection went was lost
            kind = EndKind.SILENT if session.lost_how == "silent" else EndKind.LOST
            return NodeEnd(session.name, kind, 0.0, silent_for=now - session.outage)
        return None
    if silent > limit:
        return NodeEnd(session.name, EndKind.SILENT, 0.0, asked_to_stop=session.asked_to_stop, silent_for=silent)
    if stop_deadline is not None and now > stop_deadline:
        return NodeEnd(session.name, EndKind.UNANSWERED, 0.0, asked_to_stop=True)
    return None
