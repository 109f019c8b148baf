"""Which node's end caused a failed run, and how to say it: pure functions over what the supervisor saw.

Like torch elastic's `ChildFailedError.get_first_failure()`: the first real event by time, never a node that only
stopped because the launcher (or a lost peer) told it to.
"""

from __future__ import annotations

from collections.abc import Sequence

from launcher.errors import RunFailed
from launcher.events import SELF_STOPS, EndKind, HangSuspected, NodeEnd
from launcher.limits import AWAY_EXIT, INTERRUPTED_EXIT, STOPPED_EXIT
from launcher.node.wire import HEARTBEAT_TIMEOUT, LAUNCHER_GONE
from launcher.plan.recovery import AttemptEnd
from launcher.report.lines import RANK_WORDS, failed_rank, rank_lines, root_cause_block, without_noise

# Messages of a worker that died only because a peer died first: never the root cause when another exists.
COLLATERAL = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator",
              "ProcessGroupNCCL", "Socket Timeout", "SignalException", "Signals.SIGTERM")


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
        return (f"root cause: {end.node} stopped its part by itself: no heartbeat from the launcher in time "
                f"(a frozen launcher or network)", 1, None)
    if end.stop_reason == LAUNCHER_GONE:
        return f"root cause: {end.node} stopped its part by itself: its connection to the launcher closed", 1, None
    if end.before_workers:
        return (f"root cause: {end.node}: torchrun ended ({ended_how(end)}) before it started any worker: it never "
                "completed the rendezvous", end.exit_code or 1, None)
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


def own_failure(end: NodeEnd) -> tuple[list[str], str | None]:
    """torchrun's root-cause block in a node's tail, and the exception line its failed rank printed."""
    block = root_cause_block(list(end.tail))
    return block, raised_by(end, failed_rank(block)[1])


def summary_lines(end: NodeEnd) -> list[str]:
    """What the report shows under the root cause: torchrun's block with, in place of its `To enable traceback see`
    notice, the failed rank's own words (`rank_words`); without a block, the node's last lines that are not noise
    (warnings, torch's log lines are never a cause)."""
    block, what = own_failure(end)
    if not block:
        return [f"  {line}" for line in without_noise(end.tail)[-15:]]
    out = []
    for line in block:
        if "To enable traceback" in line:
            out += [f"  {x}" for x in rank_said(end, failed_rank(block)[1], what)]
        else:
            out.append(f"  {line}")
    return out


def rank_said(end: NodeEnd, local: int | None, what: str | None) -> list[str]:
    """The failed rank's own words: its exception and the frame that raised it (its traceback's last), or, when it
    raised none, its last lines that are not noise."""
    own = rank_lines(end.tail, local) if local is not None else []
    if what:
        before = own[:len(own) - own[::-1].index(what) - 1] if what in own else own
        at = next((i for i in range(len(before) - 1, -1, -1) if before[i].lstrip().startswith('File "')), None)
        if at is None:
            return [f"exception : {what}"]
        source = [x.strip() for x in before[at + 1:at + 2] if x.startswith("    ") and x.strip("^~ ")]
        return [f"exception : {what}", f"raised at : {before[at].strip()}", *(f"            {x}" for x in source)]
    said = without_noise(own)[-RANK_WORDS:]
    return ["last lines: (no exception)", *(f"  {x}" for x in said)] if said else []


def failed_on_its_own(end: NodeEnd, block: list[str]) -> bool:
    """A node asked to stop whose own rank had already failed (its root-cause `block` names a worker's exit code,
    not a signal, nor a peer lost): a failure of its own, not the launcher's doing."""
    _, _, code = failed_rank(block)
    return bool(block) and not collateral(end) and code is not None and 0 < code < 128


def ended_how(end: NodeEnd) -> str:
    """A few words on how a node's part ended: `exit code 137`, `the connection was lost`, ..."""
    if end.kind == EndKind.EXITED:
        code = end.exit_code if end.exit_code is not None else 1
        return f"exit code {128 - code if code < 0 else code}"
    return {EndKind.LOST: "the connection was lost", EndKind.SILENT: f"silent for {end.silent_for:.0f} s",
            EndKind.AGENT_DIED: "the launcher's agent died", EndKind.UNANSWERED: "no answer to the stop",
            EndKind.START_ERROR: "it could not start"}[end.kind]


def run_failed(run_id: str, ends: list[NodeEnd], log_hint: str) -> RunFailed:
    """The report of a failed run: the root cause (node, rank, exit code, its log) and how the others ended."""
    origin = first_failure(ends)
    lines = [f"run {run_id} FAILED"]
    code, rank = 1, None
    if origin is not None:
        sentence, code, rank = headline(origin)
        lines += [sentence, *summary_lines(origin), *(f"  {t}" for t in origin.errors)]
    for end in ends:
        if end is origin or not end.failed:
            continue
        if end.stop_reason in SELF_STOPS:
            lines.append(f"{end.node}: stopped its part by itself too ({end.stop_reason})")
            continue
        block, said = own_failure(end)
        if end.asked_to_stop and not failed_on_its_own(end, block):
            why = "stopped by the launcher"
        else:
            why = "failed too" + (f": {said}" if said else "")
        what = f"exit code {end.exit_code}" if end.kind == EndKind.EXITED else end.kind.value
        lines.append(f"{end.node}: {what} ({why})")
    lines.append(log_hint)
    return RunFailed("\n".join(lines), code, node=origin.node if origin else None, rank=rank,
                     tail=origin.tail if origin else (), ends=tuple(ends))


LOST = {EndKind.LOST: "the connection to it was lost", EndKind.SILENT: "it stopped answering",
        EndKind.AGENT_DIED: "the launcher's agent on it died", EndKind.UNANSWERED: "it did not answer the stop"}


def attempt_end(code: int, ends: Sequence[NodeEnd], hang: HangSuspected | None = None) -> AttemptEnd:
    """How an attempt of a launch ended, from its exit code, every node's end and the hang that stopped it (if one
    did): what launcher.plan.recovery decides on. A node lost or a process killed by a signal is the node's; the
    script's own exception or exit code is the program's."""
    if code == 0:
        return AttemptEnd("ok", "exit 0")
    if code == INTERRUPTED_EXIT:
        return AttemptEnd("interrupted", "interrupted (Ctrl-C)")
    if code == STOPPED_EXIT:
        return AttemptEnd("stopped", "stopped from elsewhere")
    if hang is not None and not hang.kept:
        node, rank = hang.suspects[0] if hang.suspects else (None, None)
        return AttemptEnd("hang", hang.why, node, rank, hang.step)
    if code == AWAY_EXIT and (not ends or any(e.kind == EndKind.TAKEN for e in ends)):
        return AttemptEnd("left", "this launcher let the run go on without it")
    if not ends:
        return AttemptEnd("no-start", "it could not start")
    origin = first_failure(list(ends))
    if origin is None:
        return AttemptEnd("failed", f"exit {code}")
    if origin.kind in LOST:
        return AttemptEnd("lost", f"{origin.node} was lost: {LOST[origin.kind]}", origin.node)
    if origin.stop_reason in SELF_STOPS:
        return AttemptEnd("launcher-gone", f"{origin.node} lost the launcher ({origin.stop_reason})", origin.node)
    if origin.kind == EndKind.EXITED:
        _, _, worker_code = failed_rank(root_cause_block(list(origin.tail)))
        for killed, whose in ((origin.exit_code, "torchrun"), (worker_code, "a worker")):
            if killed is not None and (killed < 0 or killed > 128):
                signal = -killed if killed < 0 else killed - 128
                return AttemptEnd("killed", f"{origin.node}: {whose} was killed by signal {signal}", origin.node)
    return AttemptEnd("failed", headline(origin)[0], origin.node)
