"""Where stacks are kept and how a suspected hang is told: `logs/<run id>/stacks-<time>/<node>-r<rank>.txt`, the
answer in `answer.txt` beside them (what `inv status` shows), and the console's lines."""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from launcher.events import HangRuledOut, HangSuspected
from launcher.node.wire import NCCL_PREFIX
from launcher.watch.flightrec import sent_dumps
from launcher.watch.stackgroups import RankStack, answer, from_answers, stack_file
from launcher.watch.verdict import verdict_line


def write_stacks(log_dir: Path, run_id: str, stacks: Sequence[RankStack], when: float | None = None) -> Path:
    """`<log_dir>/<run id>/stacks-<time>/<node>-r<rank>.txt`, one a rank; the folder."""
    stamp = _dt.datetime.fromtimestamp(when) if when is not None else _dt.datetime.now()
    folder = log_dir / run_id / f"stacks-{stamp:%Y%m%d-%H%M%S}"
    folder.mkdir(parents=True, exist_ok=True)
    for stack in stacks:
        (folder / f"{stack.node}-r{stack.rank}.txt").write_text(stack_file(stack), encoding="utf-8")
    return folder


def write_nccl(
    folder: Path, answers: Mapping[str, Mapping[str, Any] | str], dumps: Mapping[str, bytes] | None = None
) -> list[str]:
    """The NCCL flight recorder dumps the nodes sent, into `<folder>/nccl/`; the line that says how to read them
    (with `--allow-incomplete-ranks` when a rank the nodes listed has no dump: torchfrtrace refuses a partial set).
    `dumps`: the answers' dumps already decoded (`flightrec.sent_dumps`), where the caller reads them too."""
    if dumps is None:
        dumps = sent_dumps(answers)
    if not dumps:
        return []
    nccl = folder / "nccl"
    nccl.mkdir(parents=True, exist_ok=True)
    for name, data in dumps.items():
        (nccl / Path(name).name).write_bytes(data)
    found = [p.name for p in nccl.iterdir()]  # with those of nodes that sent theirs before
    dumped = {name[len(NCCL_PREFIX) :] for name in found if name.startswith(NCCL_PREFIX)}
    listed = {
        str(w["rank"]) for reply in answers.values() if not isinstance(reply, str) for w in reply.get("workers") or ()
    }
    partial = " --allow-incomplete-ranks" if listed - dumped else ""
    return [
        f"NCCL flight recorder: {len(found)} dump(s) in {nccl}; read them with `torchfrtrace {nccl} -p "
        f"{NCCL_PREFIX}{partial}`"
    ]


def hang_report(run_id: str, event: HangSuspected, log_dir: Path) -> list[str]:
    """A suspected hang's lines for the console (the first is the answer), its stacks kept under log_dir."""
    stacks, failures = from_answers(event.answers)
    folder = write_stacks(log_dir, run_id, stacks, event.time)
    said = "stalled" if event.stall else "hang suspected"
    first = f"{said} (no progress for {event.quiet_s:.0f} s): {answer(stacks)}"
    why = [f"why {'a stall' if event.stall else 'a hang'}: {event.why}"] if event.why else []
    (folder / "answer.txt").write_text("\n".join([first, *why]) + "\n", encoding="utf-8")
    _keep_verdict(folder, event)
    lines = [
        first,
        *why,
        *(f"{node}: no stacks ({why})" for node, why in sorted(failures.items())),
        f"stacks of every rank: {folder}",
        *write_nccl(folder, event.answers),
    ]
    lines.append(
        "the run goes on (--on-hang keep): stacks again after another timeout without progress"
        if event.kept
        else "stopping this attempt (--on-hang restart: what follows is said below)"
        if event.restarting
        else "stopping the run (--on-hang keep would keep it)"
    )
    return lines


def _keep_verdict(folder: Path, event: HangSuspected) -> None:
    """Beside the stacks: the verdict as data (its words, the ranks that held the run up, the step it had reached) and
    each rank's collectives as the second look read them, for what follows (a restart) and for whoever reads later."""
    collectives = {
        f"{node}-r{w.get('rank')}": w.get("collectives")
        for node, reply in sorted(event.answers.items())
        if isinstance(reply, dict)
        for w in reply.get("workers") or ()
        if not w.get("helper")
    }
    kept = {
        "why": event.why,
        "quiet_s": round(event.quiet_s, 1),
        "step": event.step,
        "counted": event.counted,
        "suspects": [{"node": node, "rank": rank} for node, rank in event.suspects],
        "collectives": collectives,
    }
    (folder / "verdict.json").write_text(json.dumps(kept, indent=1), encoding="utf-8")


def ruled_out_line(event: HangRuledOut) -> str:
    """The one console line of a run without progress whose stacks say it is not hung."""
    stacks, failures = from_answers(event.answers)
    seen = "; ".join([answer(stacks)] + [f"{node}: no stacks ({why})" for node, why in sorted(failures.items())])
    return f"no progress for {event.quiet_s:.0f} s, but {verdict_line(False, event.why)}: {seen}; the run goes on"


def latest_answer(log_dir: Path, run_id: str) -> str | None:
    """The last suspected hang's answer of a run, as kept by `hang_report` (for `inv status`)."""
    found = sorted((log_dir / run_id).glob("stacks-*/answer.txt"))
    return found[-1].read_text(encoding="utf-8").strip() if found else None
