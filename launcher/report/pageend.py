"""A run's end as its page says it (pure): each node's end (its state, exit code and time, its ranks' exception lines,
how a stop ended its processes), then the run's: the root cause of a failure, a stop the user asked for (no failure:
its mark, and how each node's processes ended), a launch that never started anything, an attempt the launcher
started again (`--retries`: the words its console said); and the end table's rows.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.limits import AWAY_EXIT, INTERRUPTED_EXIT, REPORT_MAX_ROWS, REPORT_NAMED, STOPPED_EXIT
from launcher.report.lines import NodeLog

ANSWERED = ("running", "exited", "stopped", "lost")
"""A node's states that say it had the run (`none`: it never had it; `unreachable`, `error`: it could not say)."""


@dataclass(frozen=True)
class Mark:
    t: float
    kind: str
    """hang, hang-ruled-out, straggler, left, stop, restart, end; or any other the journal holds (its text, at its
    time)."""
    text: str
    node: str | None = None


@dataclass(frozen=True)
class NodeExit:
    node: str
    state: str
    exit_code: int | None
    ended: float | None
    raised: tuple[str, ...] = ()
    """`rN: <exception line>` of each rank whose traceback ended in the node's log."""
    detail: str = ""
    stop_at: float | None = None
    """When a stop began on the node (seconds from the command's start), where one did."""
    stop: Mapping[str, Any] | None = None
    """How that stop ended its processes, as the node recorded it (launcher/node/agent/runner.py `stop_run`)."""


@dataclass(frozen=True)
class Retried:
    """This run was one attempt of a launch with `--retries`, and the launcher started the run again after it."""

    number: int
    of: int
    why: str
    """How it ended, as the console said it (`node-1: torchrun was killed by signal 9`)."""
    next_run: str | None


@dataclass(frozen=True)
class RunEnd:
    root_cause: str
    """The failure's words ("" when nothing failed)."""
    stopped: str
    """How a stop that is no failure ended the run: the user's, or its nodes' own when no launcher was heard from for
    the heartbeat timeout ("" when none did)."""
    never: str
    """Why the launch never started anything ("" when it did)."""
    marks: tuple[Mark, ...]
    """The user's stop, and each node that ended badly."""


def node_exit(node: str, answer: Mapping[str, Any], offset: float, began: float) -> NodeExit:
    """A node's end from its `report` answer (its times moved onto the page's clock)."""
    ended = answer.get("ended_at")
    log = NodeLog(node, 0, len(node), None, False)
    log.format((answer.get("log_tail") or "").encode())
    log.format_rest()
    raised = tuple(
        f"r{rank if rank is not None else local}: {line}" for local, (rank, line) in sorted(log.raised.items())
    )
    stop = answer.get("stop") if isinstance(answer.get("stop"), dict) else None
    at = stop.get("at") if stop else None
    return NodeExit(
        node,
        str(answer.get("state", "error")),
        answer.get("exit_code"),
        None if ended is None else round(float(ended) + offset - began, 1),
        raised,
        str(answer.get("detail") or (stop_sentence(stop, answer.get("exit_code")) if stop else "")),
        None if not isinstance(at, int | float) else round(float(at) + offset - began, 1),
        stop,
    )


def stop_sentence(stop: Mapping[str, Any], exit_code: int | None) -> str:
    """How a stop ended a node's processes, from what its stop recorded (launcher/node/agent/runner.py `stop_run`)."""
    code = "" if exit_code is None else f" (exit code {exit_code})"
    if stop.get("killed"):
        return (
            f"{stop['killed']} process(es) had not ended {float(stop.get('grace') or 0):g} s after TERM: killed{code}"
        )
    took = stop.get("term_s")
    within = "" if not isinstance(took, int | float) else " at once" if took < 0.05 else f" within {took:.1f} s"
    if stop.get("alone"):
        return (
            f"its ranks ended on TERM{within}; torchrun, left without them, was then killed{code}: a stop does "
            "not wait for torchrun's own shutdown"
        )
    return f"ended on TERM{within}{code}"


def run_end(
    end: Mapping[str, Any],
    exits: Sequence[NodeExit],
    started: bool,
    retried: Retried | None = None,
    spares: Collection[str | None] = (),
) -> RunEnd:
    """The run's end: `end` the launch's own (its journal's: code, text), `started` whether anything started;
    `spares`: nodes that stood by in a c10d run (their end is no failure)."""
    text = str(end.get("text") or "")
    if not started:
        never = text or "no node has this run: it never started there (or its folders were removed)"
        return RunEnd(text, "", never.splitlines()[0], ())
    failed = [
        e
        for e in exits
        if e.node not in spares and (e.state == "lost" or (e.exit_code not in (0, None) and e.state != "stopped"))
    ]
    stopped = [e for e in exits if e.state == "stopped"]
    if end.get("code") == AWAY_EXIT and text:  # no launcher was heard from for the bound: its nodes stopped it
        times = [e.stop_at for e in stopped if e.stop_at is not None] or [e.ended for e in stopped if e.ended]
        sentence = f"stopped by its nodes, not a failure: {text.splitlines()[0]}"
        return RunEnd(
            "",
            sentence,
            "",
            (Mark(min(times), "stop", "stopped by its nodes: no launcher heard from"),) if times else (),
        )
    own = [e for e in stopped if e.stop and e.stop.get("why")]
    if own and not text:  # a detached run's nodes stopped it themselves (--on-nonfinite stop): that is its cause
        first = min(own, key=lambda e: e.stop_at if e.stop_at is not None else float("inf"))
        said = f"stopped by its nodes (--on-nonfinite stop): {first.node}: {first.stop['why']}"  # type: ignore[index]
        at = first.stop_at if first.stop_at is not None else first.ended
        return RunEnd(said, "", "", (Mark(at, "loss", said, first.node),) if at is not None else ())
    if stopped and not failed and (not text or end.get("code") in (INTERRUPTED_EXIT, STOPPED_EXIT)):
        return _stopped_by_user(stopped, end.get("code") == INTERRUPTED_EXIT)
    marks = tuple(
        Mark(e.ended, "end", f"{e.node}: {e.state}" + (f" (exit code {e.exit_code})" if e.exit_code else ""), e.node)
        for e in exits
        if e.ended is not None and (e.state != "exited" or e.exit_code)
    )
    if retried is not None:
        again = f"; the launcher started the run again as run {retried.next_run}" if retried.next_run else ""
        return RunEnd(f"attempt {retried.number} of {retried.of} failed: {retried.why}{again}", "", "", marks)
    return RunEnd(text or _first_failure(failed), "", "", marks)


def _stopped_by_user(stopped: Sequence[NodeExit], ctrl_c: bool) -> RunEnd:
    """A stop the user asked for (`stop`, the API's, Ctrl-C): its mark at its start, and how the processes ended."""
    times = [e.stop_at for e in stopped if e.stop_at is not None] or [e.ended for e in stopped if e.ended is not None]
    how = " (Ctrl-C)" if ctrl_c else ""
    at = f" at {min(times):.1f} s" if times else ""
    sentence = f"stopped by the user{at}{how}, not a failure{_every_node(stopped)}"
    return RunEnd("", sentence, "", (Mark(min(times), "stop", f"stopped by the user{how}"),) if times else ())


def _every_node(stopped: Sequence[NodeExit]) -> str:
    """How the stop ended every node's processes, where it ended them alike (the longest of their times)."""
    stops = [e.stop for e in stopped if e.stop is not None]
    kinds = {"killed" if s.get("killed") else "alone" if s.get("alone") else "term" for s in stops}
    mixed = kinds == {"term", "alone"}  # the ranks ended on TERM everywhere; torchrun ended by itself on some nodes
    if len(stops) < len(stopped) or (len(kinds) != 1 and not mixed):
        return " (each node's end below)"
    terms = [float(t) for s in stops if (t := s.get("term_s")) is not None]
    merged = {
        "grace": max(float(s.get("grace") or 0) for s in stops),
        "alone": kinds == {"alone"},
        "killed": sum(int(s.get("killed") or 0) for s in stops),
        "term_s": max(terms) if len(terms) == len(stops) else None,
    }
    codes = {e.exit_code for e in stopped}
    sentence = stop_sentence(merged, codes.pop() if len(codes) == 1 else None)
    if mixed:
        alone = sum(1 for s in stops if s.get("alone"))
        sentence += (
            f"; torchrun, left without its ranks, was then killed on {alone} of the {len(stops)} nodes: a "
            "stop does not wait for torchrun's own shutdown"
        )
    return f": {sentence}" if "killed" in kinds else f": on every node, {sentence}"


def _first_failure(failed: Sequence[NodeExit]) -> str:
    """Without the launch's words (a detached run): the first node that failed, by its end."""
    if not failed:
        return ""
    first = sorted(failed, key=lambda e: e.ended if e.ended is not None else float("inf"))[0]
    said = f"; {first.raised[0]}" if first.raised else ""
    return f"root cause: {first.node} {first.state} (exit code {first.exit_code}){said}"


def end_rows(exits: Sequence[NodeExit]) -> list[NodeExit]:
    """The end table's rows: a node each where few; past REPORT_MAX_ROWS a node with an exception keeps its own row
    (REPORT_MAX_ROWS of them) and the others that ended alike (state, exit code) share one that names a few of them
    and counts the rest, with the latest end: 256 nodes that exited 0 are one row."""
    if len(exits) <= REPORT_MAX_ROWS:
        return list(exits)
    own = [e for e in exits if e.raised][:REPORT_MAX_ROWS]
    listed = {e.node for e in own}
    alike: dict[tuple[str, int | None, str], list[NodeExit]] = {}
    for e in exits:
        if e.node not in listed:
            alike.setdefault((e.state, e.exit_code, e.detail), []).append(e)
    rows = list(own)
    for (state, exit_code, detail), group in alike.items():
        ended = max((e.ended for e in group if e.ended is not None), default=None)
        names = few(", ".join(e.node for e in group)) if len(group) > 1 else group[0].node
        rows.append(NodeExit(names, state, exit_code, ended, (), detail))
    return rows


def few(text: str) -> str:
    """A list of names, the first REPORT_NAMED of them and how many more."""
    names = text.split(", ")
    if len(names) <= REPORT_NAMED:
        return text
    return ", ".join(names[:REPORT_NAMED]) + f" and {len(names) - REPORT_NAMED} more"
