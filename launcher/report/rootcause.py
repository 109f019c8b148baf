"""How a failed run is said (pure): its root cause's block and the failed rank's own words, and how every other node
ended. Which node's end is the root cause, and how the run ended, are decided in `launcher.plan.ends`."""

from __future__ import annotations

from launcher.errors import RunFailed
from launcher.events import SELF_STOPS, EndKind, NodeEnd
from launcher.plan.ends import collateral, failed_rank, first_failure, headline, raised_by, root_cause_block
from launcher.report.lines import RANK_WORDS, rank_lines, without_noise


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
        before = own[: len(own) - own[::-1].index(what) - 1] if what in own else own
        at = next((i for i in range(len(before) - 1, -1, -1) if before[i].lstrip().startswith('File "')), None)
        if at is None:
            return [f"exception : {what}"]
        source = [x.strip() for x in before[at + 1 : at + 2] if x.startswith("    ") and x.strip("^~ ")]
        return [f"exception : {what}", f"raised at : {before[at].strip()}", *(f"            {x}" for x in source)]
    said = without_noise(own)[-RANK_WORDS:]
    return ["last lines: (no exception)", *(f"  {x}" for x in said)] if said else []


def failed_on_its_own(end: NodeEnd, block: list[str]) -> bool:
    """A node asked to stop whose own rank had already failed (its root-cause `block` names a worker's exit code,
    not a signal, nor a peer lost): a failure of its own, not the launcher's doing."""
    _, _, code = failed_rank(block)
    return bool(block) and not collateral(end) and code is not None and 0 < code < 128


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
    return RunFailed(
        "\n".join(lines),
        code,
        node=origin.node if origin else None,
        rank=rank,
        tail=origin.tail if origin else (),
        ends=tuple(ends),
    )
