"""How a run ended, and which node's end caused it (pure): the end's classification, beside the decisions that read
it (`launcher.plan.recovery`); report/ only says it.

Like torch elastic's `ChildFailedError.get_first_failure()`: the root cause is the first real event by time, never a
node that only stopped because the launcher (or a lost peer) told it to. An attached run's end (`run_end`) is one of:
this launcher lost a run that did not fail (it left it to its nodes, another launcher took it over, its nodes stopped
it for want of a launcher), the user stopped it, the hang watch stopped it, it was stopped from elsewhere, it
succeeded (an elastic group's too, without the nodes it lost), or it failed: a node lost, a process killed by a
signal, the script's own failure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from launcher.events import SELF_STOPS, EndKind, HangSuspected, NodeEnd
from launcher.limits import AWAY_EXIT, HANG_EXIT, INTERRUPTED_EXIT, STOPPED_EXIT
from launcher.node.wire import HEARTBEAT_TIMEOUT, LAUNCHER_GONE, STOPPED_ELSEWHERE
from launcher.plan.recovery import AttemptEnd, How
from launcher.watch.loss import NONFINITE_EXIT, NonFinite

COLLATERAL = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL communicator",
    "ProcessGroupNCCL",
    "Socket Timeout",
    "SignalException",
    "Signals.SIGTERM",
)
"""Messages of a worker that died only because a peer died first: never the root cause when another exists."""
LOST = {
    EndKind.LOST: "the connection to it was lost",
    EndKind.SILENT: "it stopped answering",
    EndKind.AGENT_DIED: "the launcher's agent on it died",
    EndKind.UNANSWERED: "it did not answer the stop",
}
"""A node's end that loses the node, and how an attempt's line says it."""


class Absence(str, Enum):
    """How this launcher lost a run that did not fail."""

    LEFT = "left"
    """Its terminal closed: the run goes on on its nodes without it."""
    TAKEN = "taken"
    """Another launcher took it over (`attach`): the run goes on there."""
    CUT_OFF = "cut-off"
    """No node could be reached, to the nodes' own bound: they stopped the run by themselves."""
    NO_LAUNCHER = "no-launcher"
    """Its nodes heard no launcher for the heartbeat bound and stopped their part."""


@dataclass(frozen=True)
class Supervised:
    """What an attached run's supervision saw by its end, beside each node's end."""

    needs: int
    """Nodes the group needs to go on (`recovery.group_needs`): an elastic group that keeps them succeeded."""
    interrupted: bool = False
    """The user stopped it (Ctrl-C, SIGTERM)."""
    left: bool = False
    """This launcher's terminal closed: it let the run go on without it."""
    cut_off: bool = False
    """No node could be reached until the nodes' own bound."""
    hang: HangSuspected | None = None
    """The hang the watch stopped the run for."""
    nonfinite: NonFinite | None = None
    """The non-finite loss the launcher stopped the run for (`--on-nonfinite stop`)."""
    spares: frozenset[str] = frozenset()
    """Nodes of a c10d run that stood by, no worker on them (launcher/watch/spares.py): their end is no failure."""


@dataclass(frozen=True)
class RunEnd:
    """How an attached run ended: the attempt's end the decisions read, the launch's exit code, and what the report
    says it with."""

    end: AttemptEnd
    code: int
    absence: Absence | None = None
    """How this launcher lost a run that did not fail (exit code AWAY_EXIT)."""
    origin: NodeEnd | None = None
    """The root cause: the node end that failed the run."""
    went_on_without: tuple[NodeEnd, ...] = ()
    """An elastic group that succeeded: the nodes it went on without."""
    stood_by: tuple[NodeEnd, ...] = ()
    """The spares' ends (a c10d run's hosts past its maximum, no worker on them): neither a failure nor a loss."""

    @property
    def going_on(self) -> bool:
        """The run lives on without this launcher."""
        return self.absence in (Absence.LEFT, Absence.TAKEN)


def run_end(ends: Sequence[NodeEnd], seen: Supervised) -> RunEnd:
    """An attached run's end, from every node's end and what its supervision saw."""
    ends = list(ends)
    if seen.left:
        return RunEnd(AttemptEnd(How.LEFT, "this launcher let the run go on without it"), AWAY_EXIT, Absence.LEFT)
    if any(e.kind == EndKind.TAKEN for e in ends):
        return RunEnd(AttemptEnd(How.LEFT, "another launcher took the run over"), AWAY_EXIT, Absence.TAKEN)
    if seen.cut_off:  # this launcher could reach no node: every node lost is the nodes' own stop, no failure
        if ends and all(e.kind == EndKind.LOST for e in ends):
            return _failed(ends, AWAY_EXIT, Absence.CUT_OFF)
    elif any(e.stop_reason == HEARTBEAT_TIMEOUT for e in ends):
        return _failed(ends, AWAY_EXIT, Absence.NO_LAUNCHER)
    if seen.interrupted:
        return RunEnd(AttemptEnd(How.INTERRUPTED, "interrupted (Ctrl-C)"), INTERRUPTED_EXIT)
    if seen.hang is not None:
        node, rank = seen.hang.suspects[0] if seen.hang.suspects else (None, None)
        hang = seen.hang
        return RunEnd(AttemptEnd(How.HANG, hang.why, node, rank, hang.step, counted=hang.counted), HANG_EXIT)
    if seen.nonfinite is not None:
        bad = seen.nonfinite
        return RunEnd(AttemptEnd(How.NONFINITE, bad.line(), bad.node, bad.rank, bad.step), NONFINITE_EXIT)
    stood_by = tuple(e for e in ends if e.node in seen.spares)
    failed = [e for e in ends if e.failed and e.node not in seen.spares]
    if not failed and any(e.stop_reason == STOPPED_ELSEWHERE for e in ends):
        return RunEnd(AttemptEnd(How.STOPPED, "stopped from elsewhere"), STOPPED_EXIT)
    if not failed:
        return RunEnd(AttemptEnd(How.OK, "exit 0"), 0, stood_by=stood_by)
    if len(ends) - len(failed) - len(stood_by) >= seen.needs:  # an elastic run that went on without the nodes it lost
        return RunEnd(AttemptEnd(How.OK, "exit 0"), 0, went_on_without=tuple(failed), stood_by=stood_by)
    return _failed([e for e in ends if e.node not in seen.spares])


def start_failed(interrupted: bool) -> RunEnd:
    """A run that could not start (130: its start was interrupted)."""
    if interrupted:
        return RunEnd(AttemptEnd(How.INTERRUPTED, "interrupted while starting"), INTERRUPTED_EXIT)
    return RunEnd(AttemptEnd(How.NO_START, "it could not start"), 1)


def _failed(ends: list[NodeEnd], code: int | None = None, absence: Absence | None = None) -> RunEnd:
    """A failed run's end: its root cause, the exit code it gives (`headline`'s, or `code`), how it ended."""
    origin = first_failure(ends)
    if origin is None:
        return RunEnd(AttemptEnd(How.FAILED, f"exit {code}"), code or 1, absence)
    _, given, _ = headline(origin)
    return RunEnd(_attempt_end(origin), given if code is None else code, absence, origin)


def _attempt_end(origin: NodeEnd) -> AttemptEnd:
    """How the attempt ended, from its root cause: a node lost or a process killed by a signal is the node's; the
    script's own exception or exit code is the program's."""
    if origin.kind in LOST:
        return AttemptEnd(How.LOST, f"{origin.node} was lost: {LOST[origin.kind]}", origin.node)
    if origin.stop_reason in SELF_STOPS:
        return AttemptEnd(How.LAUNCHER_GONE, f"{origin.node} lost the launcher ({origin.stop_reason})", origin.node)
    if origin.kind == EndKind.EXITED:
        _, _, worker_code = failed_rank(root_cause_block(list(origin.tail)))
        for killed, whose in ((origin.exit_code, "torchrun"), (worker_code, "a worker")):
            if killed is not None and (killed < 0 or killed > 128):
                signal = -killed if killed < 0 else killed - 128
                return AttemptEnd(How.KILLED, f"{origin.node}: {whose} was killed by signal {signal}", origin.node)
    return AttemptEnd(How.FAILED, headline(origin)[0], origin.node)


def collateral(end: NodeEnd) -> bool:
    """Its workers died because a peer did (their root-cause block says so)."""
    block = "\n".join(root_cause_block(list(end.tail)))
    return bool(block) and any(word in block for word in COLLATERAL)


def first_failure(ends: list[NodeEnd]) -> NodeEnd | None:
    """The root cause: the earliest failure the launcher did not cause, preferring one that is not collateral."""
    failed = [e for e in ends if e.failed]
    own = [e for e in failed if not e.asked_to_stop] or failed
    if not own:
        return None
    return min(own, key=lambda e: (collateral(e), e.time))


def headline(end: NodeEnd) -> tuple[str, int, int | None]:
    """(`root cause: ...` sentence, the launcher's exit code, the failed global rank if known)."""
    if end.kind == EndKind.SILENT:
        return f"root cause: {end.node} stopped answering (nothing for {end.silent_for:.0f} s)", 1, None
    if end.kind == EndKind.LOST:
        return f"root cause: {end.node}: the connection to the node was lost", 1, None
    if end.kind == EndKind.AGENT_DIED:
        return f"root cause: {end.node}: the launcher's agent on the node died before torchrun ended", 1, None
    if end.kind == EndKind.UNANSWERED:
        return f"root cause: {end.node} did not answer the stop in time", 1, None
    if end.stop_reason == HEARTBEAT_TIMEOUT:
        return (
            f"root cause: {end.node} stopped its part by itself: no heartbeat from the launcher in time "
            f"(a frozen launcher or network)",
            1,
            None,
        )
    if end.stop_reason == LAUNCHER_GONE:
        return f"root cause: {end.node} stopped its part by itself: its connection to the launcher closed", 1, None
    if end.before_workers:
        return (
            f"root cause: {end.node}: torchrun ended ({ended_how(end)}) before it started any worker: it never "
            "completed the rendezvous",
            end.exit_code or 1,
            None,
        )
    rank, local, worker_code = failed_rank(root_cause_block(list(end.tail)))
    # The worker's own exit code says more than torchrun's (which is 1 for any worker failure).
    code = worker_code if worker_code else (end.exit_code or 1)
    code = 128 - code if code < 0 else code  # a worker killed by signal N: 128+N, like a shell
    who = end.node + (f", rank {rank} (local rank {local})" if rank is not None else "")
    what = raised_by(end, local)
    return f"root cause: {who}, exit code {code}" + (f": {what}" if what else ""), code if code > 0 else 1, rank


def raised_by(end: NodeEnd, local: int | None) -> str | None:
    """The exception line the failed rank printed (its local rank's; the only one when the rank is not known)."""
    if local is None:
        return end.raised[0][2] if len(end.raised) == 1 else None
    return next((line for at, _, line in end.raised if at == local), None)


def went_on_without(ends: Sequence[NodeEnd], ended: RunEnd) -> str:
    """A c10d run that succeeded without some of its nodes: `2 node(s) exited 0 (node-0, node-2); node-1 left (exit
    code 137)`, or `...; node-1 stood by as a spare (no worker ran there)`."""
    spares = {e.node for e in ended.stood_by}
    finished = [e.node for e in ends if not e.failed and e.node not in spares]
    gone = [f"{e.node} left ({ended_how(e)})" for e in ended.went_on_without]
    gone += [f"{e.node} stood by as a spare (no worker ran there)" for e in ended.stood_by]
    return f"{len(finished)} node(s) exited 0 ({', '.join(finished)}); {'; '.join(gone)}"


def ended_how(end: NodeEnd) -> str:
    """A few words on how a node's part ended: `exit code 137`, `the connection was lost`, ..."""
    if end.kind == EndKind.EXITED:
        code = end.exit_code if end.exit_code is not None else 1
        return f"exit code {128 - code if code < 0 else code}"
    return {
        EndKind.LOST: "the connection was lost",
        EndKind.SILENT: f"silent for {end.silent_for:.0f} s",
        EndKind.AGENT_DIED: "the launcher's agent died",
        EndKind.UNANSWERED: "no answer to the stop",
        EndKind.START_ERROR: "it could not start",
        EndKind.TAKEN: "taken over",
    }[end.kind]


def root_cause_block(lines: list[str]) -> list[str]:
    """torchrun's "Root Cause (first observed failure)" block from a node's log tail, if it printed one."""
    for i, line in enumerate(lines):
        if "Root Cause (first observed failure)" in line:
            block: list[str] = []
            for rest in lines[i + 1 :]:
                if rest.startswith("=====") and block:
                    break
                block.append(rest)
            return block
    return []


def failed_rank(block: list[str]) -> tuple[int | None, int | None, int | None]:
    """(global rank, local rank, worker exit code) named in a root-cause block."""
    rank = local = code = None
    for line in block:
        match = re.search(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", line)
        if match:
            rank, local = int(match.group(1)), int(match.group(2))
        match = re.search(r"exitcode\s*:\s*(-?\d+)", line)
        if match:
            code = int(match.group(1))
    return rank, local, code
