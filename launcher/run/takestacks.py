"""Every rank's stack of a running run, from every node at once, without stopping it (`inv stacks`; and a suspected
hang of an attached run, `launcher.run.handle`): each node's agent asks its workers (launcher/node/agent/stackdump.py),
the answer is grouped (`launcher.watch.stackgroups`), and the whole stacks are kept in
`logs/<run id>/stacks-<time>/<node>-r<rank>.txt`."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from launcher.config.model import Cluster
from launcher.errors import LauncherError, NodeFailure
from launcher.limits import HANG_LOOKS_APART_S, NCCL_DUMP_WAIT_S, NCCL_MAX_BYTES, STACKS_WAIT_S, TOP_BEHIND_SAY_S
from launcher.report.hangs import write_nccl, write_stacks
from launcher.run.actions import agent_action, check_run_id, reached
from launcher.run.control import _agent_error, chosen_run
from launcher.settings import Settings
from launcher.transport.channel import Result
from launcher.watch import flightrec
from launcher.watch.arrival import Arrivals, answered
from launcher.watch.stackgroups import RankStack, answer, from_answers


@dataclass(frozen=True)
class StacksReport:
    """What `inv stacks` found: the run, every rank's stack, the nodes that could not answer, and where it is kept."""

    run_id: str
    stacks: tuple[RankStack, ...]
    failures: Mapping[str, str]
    folder: Path | None
    nccl: tuple[str, ...] = ()
    """Where NCCL's flight recorder dumps went, and how to read them (GPU nodes only)."""
    in_flight: str = ""
    """What the dumps say of the collectives not completed (`launcher.watch.flightrec`); "" when none is."""
    behind: str = ""
    """The ranks behind a collective the others of their group entered, from every rank's collectives as its
    worker's thread read them (`launcher.watch.arrival`); "" when none is, or not every rank's are known."""

    def lines(self) -> list[str]:
        out = [f"run {self.run_id}: {answer(self.stacks)}"]
        if self.behind:
            out.append(f"collectives: {self.behind}")
        if self.in_flight:
            out.append(f"NCCL's flight recorder: {self.in_flight}")
        out += [f"{node}: no stacks ({why})" for node, why in sorted(self.failures.items())]
        if self.folder is not None:
            out.append(f"stacks of every rank: {self.folder}")
        return out + list(self.nccl)


def collect_stacks(
    cluster: Cluster, run_id: str | None, settings: Settings, err: IO[str], nodes: Mapping[str, Any] | None = None
) -> StacksReport:
    """Ask every node's agent for the stacks of the run's workers (by default the run of this inventory); over SSH,
    or over the `nodes` given (a SLURM job's, `launcher.slurm.slurmlaunch.SlurmNode`)."""
    check_run_id(run_id)
    with reached(cluster, settings.ssh, nodes) as (usable, failed):
        run_id, results = _ask(cluster, usable, run_id, settings, err)
    answers: dict[str, Mapping[str, Any] | str] = {f.host: str(f) for f in failed}
    answers.update(_answers(results))
    stacks, failures = from_answers(answers)
    if not stacks and not failures:
        raise LauncherError(f"run {run_id} has no live worker on {cluster.source}'s nodes: nothing to take stacks of")
    folder = write_stacks(settings.output.log_dir, run_id, stacks) if stacks else None
    dumps = flightrec.sent_dumps(answers)
    nccl = write_nccl(folder, answers, dumps) if folder is not None else []
    in_flight = flightrec.in_flight_said(flightrec.recorded(dumps))
    return StacksReport(run_id, tuple(stacks), failures, folder, tuple(nccl), in_flight, behind_said(answers))


Answers = dict[str, Mapping[str, Any] | str]
"""Each node's `stacks` answer, or why there is none."""


def _answers(results: Mapping[str, Result | NodeFailure]) -> Answers:
    answers: Answers = {}
    for name, result in results.items():
        if isinstance(result, NodeFailure):
            answers[name] = str(result)
            continue
        try:
            answers[name] = json.loads(result.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            answers[name] = _agent_error(result)
    return answers


def two_looks(
    cluster: Cluster, nodes: Mapping[str, Any], run_id: str, settings: Settings, apart_s: float = HANG_LOOKS_APART_S
) -> tuple[Answers, Answers]:
    """Every node's `stacks` answer (or why there is none) twice, `apart_s` seconds apart, over the connections
    given: what the hang watch judges (`launcher.watch.verdict.judge_stacks`), for `inv top`. Nothing is kept, and
    NCCL's recorder is not asked (a verdict reads the collectives every worker reads itself)."""
    request = {
        "action": "stacks",
        "run_id": run_id,
        "stacks_wait_s": STACKS_WAIT_S,
        "nccl_max_bytes": 0,
        "nccl_dump_wait_s": 0,
    }

    def look() -> Answers:
        return _answers(agent_action(dict(nodes), cluster, request, STACKS_WAIT_S + settings.run.action_timeout))

    first = look()
    time.sleep(apart_s)
    return first, look()


def behind_said(answers: Mapping[str, Mapping[str, Any] | str], now: float | None = None) -> str:
    """What every rank's collectives in the nodes' answers say of the ranks behind, where it lasts: the ranks that
    entered the collective have waited in it for TOP_BEHIND_SAY_S at least (in a healthy run one rank is often a
    collective behind another at a single look: said so, it read as a diagnosis); "" when nothing is (or not every
    rank's collectives are known, or when the others entered it is not)."""
    now = time.time() if now is None else now
    arrivals = Arrivals()
    arrivals.feed(answered(answers), now)
    said = []
    for behind in arrivals.behind(now) or ():
        entered = arrivals.arrived.get(behind.group, {}).get(behind.seq, {})
        if entered and now - max(entered.values()) >= TOP_BEHIND_SAY_S:
            said.append(f"{behind.line()} {now - max(entered.values()):.0f} s ago")
    return "; ".join(said)


def _ask(
    cluster: Cluster, nodes: dict[str, Any], run_id: str | None, settings: Settings, err: IO[str]
) -> tuple[str, dict[str, Result | NodeFailure]]:
    run_id = run_id or chosen_run(cluster, nodes, settings, err)
    if run_id is None:
        raise LauncherError(f"{cluster.source}: no run on its nodes to take stacks of")
    request = {
        "action": "stacks",
        "run_id": run_id,
        "stacks_wait_s": STACKS_WAIT_S,
        "nccl_max_bytes": NCCL_MAX_BYTES,
        "nccl_dump_wait_s": NCCL_DUMP_WAIT_S,
    }
    return run_id, agent_action(
        nodes, cluster, request, STACKS_WAIT_S * 2 + NCCL_DUMP_WAIT_S + settings.ssh.connect_timeout
    )
