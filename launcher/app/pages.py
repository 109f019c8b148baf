"""The run's page (`report`, and after a run's end by itself): every node asked once for what it kept of the run
(its agent's `report`: state, the ranks' start phases, the series its supervisor sampled, its log's end), the launch's
own journal read from `logs/<run id>/`, the page built (launcher.report.pagedata) and written there as
`report.html` (launcher.report.page).

After an attached launch, and at a detached run's first `status` or `logs` after its end, the page is written by a
process of its own (`page_later`): the command returns as it would without it. An attached `launch --slurm` writes
it before it returns (`page_now`): in a batch job, the job and every process it left end with the command.

Each write keeps the nodes' answers beside the page (`answers.json.gz`): a later write that cannot reach a node
(released, down) builds the page from what that node said before and says so, never an emptier page over a full one.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.config.model import Cluster
from launcher.errors import LauncherError, NodeFailure
from launcher.limits import (
    REPORT_BACKGROUND_TIMEOUT_S,
    REPORT_LOG_TAIL_BYTES,
    REPORT_SERIES_BYTES,
    REPORT_TRACE_BYTES,
)
from launcher.report.pagedata import Page, build_page
from launcher.report.pageend import Retried
from launcher.report.pagekeep import kept_answers
from launcher.run.actions import agent_action, reached
from launcher.run.journal import read_journal
from launcher.run.run_io import RunIO
from launcher.settings import Settings

PAGE_FILE = "report.html"
ANSWERS_FILE = "answers.json.gz"
"""Beside the page: each node's last answer about the run, with when it gave it (`launcher.report.pagekeep`)."""


def page_path(settings: Settings, run_id: str) -> Path:
    """Where a run's page is (or will be): `logs/<run id>/report.html`."""
    return settings.output.log_dir / run_id / PAGE_FILE


ENDED = ("exited", "stopped", "lost")
"""A node's states once its part of the run is over (`none`: it never had one)."""


def report_request(run_id: str) -> dict[str, Any]:
    """The agent's `report` request: the run, and how much of a node's log and series it may send."""
    return {
        "action": "report",
        "run_id": run_id,
        "tail_bytes": REPORT_LOG_TAIL_BYTES,
        "series_bytes": REPORT_SERIES_BYTES,
        "trace_bytes": REPORT_TRACE_BYTES,
    }


def write_page(
    cluster: Cluster, run_id: str | None, settings: Settings, err: Any, given: Mapping[str, Any] | None = None
) -> tuple[Path, Page]:
    """Ask every node, build the page, write it; (its path, the page: its `unreached` the nodes that could not answer,
    whose figures are those they gave before). `given`: the nodes as a SLURM job's steps reach them
    (`launcher.slurm.slurmlaunch.SlurmNode`), else each over SSH. Raises, leaving the page as it was, when no node
    answered and nothing of theirs was kept (a page from before the kept answers)."""
    from launcher.report.page import render
    from launcher.run.control import chosen_run

    with reached(cluster, settings.ssh, given) as (nodes, failures):
        if run_id is None and not nodes:
            raise LauncherError(
                f"could not reach any node of {cluster.source} ({_failures(failures)}) to find its "
                f"newest run: give the run's id (--run; this machine's runs are in {settings.output.log_dir})"
            )
        run_id = run_id or chosen_run(cluster, nodes, settings, err)
        if run_id is None:
            raise LauncherError(f"no run on the nodes of {cluster.source} to write a page of")
        asked = time.time()
        results: dict[str, Any] = agent_action(nodes, cluster, report_request(run_id), settings.run.action_timeout)
        answered = time.time()
    results.update({f.host: f for f in failures})
    answers, offsets = {}, {}
    for host in cluster.hosts:
        answers[host.name] = _answer(results.get(host.name))
        node_time = answers[host.name].get("node_time")
        if isinstance(node_time, int | float):  # the node's clock against ours, the round trip's middle
            offsets[host.name] = (asked + answered) / 2 - node_time
    folder, path = settings.output.log_dir / run_id, page_path(settings, run_id)
    saved = _read_saved(folder)
    kept = kept_answers(answers, saved, answered)
    if len(kept.unreached) == len(answers) and not saved and path.exists():
        raise LauncherError(f"could not reach {_failures(failures) or 'any node'}: {path} is as it was")
    page = build_page(
        run_id,
        read_journal(folder),
        kept.answers,
        f"{folder}/",
        offsets,
        _retried(settings, run_id),
        kept.notes,
        *_attempts(settings, run_id),
    )
    page = replace(page, unreached=tuple(kept.unreached))
    folder.mkdir(parents=True, exist_ok=True)
    _write(path, render(page).encode("utf-8"))
    _write_traces(folder, answers)
    if kept.saved != saved:
        _write(folder / ANSWERS_FILE, gzip.compress(json.dumps(kept.saved).encode("utf-8"), mtime=0))
    return path, page


def _write_traces(folder: Path, answers: Mapping[str, Any]) -> None:
    """Each node's agent trace (the end of its agent.log) beside the page, as `<node>.agent.log`: with the launcher's
    own (launcher.log), what a bug report sends."""
    for node, answer in answers.items():
        trace = answer.get("trace") if isinstance(answer, dict) else None
        if isinstance(trace, str) and trace:
            _write(folder / f"{node}.agent.log", trace.encode("utf-8"))


def _failures(failures: list[NodeFailure]) -> str:
    return "; ".join(str(f) for f in failures)


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all: a reader (a browser, the next write) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _read_saved(folder: Path) -> dict[str, Any]:
    """The answers an earlier write kept ({} where none did, or they cannot be read)."""
    try:
        found = json.loads(gzip.decompress((folder / ANSWERS_FILE).read_bytes()))
    except (OSError, ValueError, EOFError):
        return {}
    return found if isinstance(found, dict) else {}


def _retried(settings: Settings, run_id: str) -> Retried | None:
    """The attempt this run was, where its launch (`--retries`) started the run again after it."""
    from launcher.run.attempts import read_attempts

    attempts = read_attempts(settings.output.log_dir, run_id)
    for index, attempt in enumerate(attempts):
        if attempt.run_id == run_id and attempt.outcome == "failed":
            after = attempts[index + 1].run_id if index + 1 < len(attempts) else None
            return Retried(attempt.number, len(attempts), attempt.why, after)
    return None


def _attempts(settings: Settings, run_id: str) -> tuple[list[str], float | None]:
    """Each attempt's line of the launch this run belongs to (none where it had one attempt), and the seconds from
    its first attempt's start to its last one's end (None while one runs)."""
    from launcher.plan.retry import summary
    from launcher.run.attempts import read_attempts

    attempts = read_attempts(settings.output.log_dir, run_id)
    if len(attempts) < 2:
        return [], None
    last = attempts[-1].ended_at
    return summary(attempts), None if last is None else last - attempts[0].started_at


def _answer(result: Any) -> dict[str, Any]:
    """A node's `report` answer; one that could not answer says why, as its state's detail."""
    if result is None:
        return {"state": "unreachable", "detail": "not asked"}
    if isinstance(result, NodeFailure):
        return {"state": "unreachable", "detail": f"{result.kind}: {result.detail}"}
    try:
        answer = json.loads(result.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"state": "error", "detail": result.stderr.decode("utf-8", "replace").strip()[-300:]}
    return answer if isinstance(answer, dict) else {"state": "error", "detail": "not an answer"}


def page_due(settings: Settings, run_id: str | None, states: list[str]) -> bool:
    """Whether a run's page is to be written now: pages are on, the run is over on every node that had it, and no
    page is there yet (a detached run's first status or logs after its end)."""
    had = [s for s in states if s != "none"]
    return bool(
        settings.output.page
        and run_id
        and had
        and all(s in ENDED for s in had)
        and not page_path(settings, run_id).exists()
    )


def page_later(cluster: Cluster, run_ids: Sequence[str | None], settings: Settings, if_ended: bool = False) -> None:
    """The runs' pages written by a process of its own, which this command does not wait for (None: the run
    `status` would choose); `if_ended`: only once the run is over on every node and has no page yet (`page_due`,
    from one short session a node). What it could not do goes into `logs/<run id>/report.err`."""
    if not settings.output.page or not run_ids:
        return
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", "from launcher.app.pages import later; later()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # a Ctrl-C at the terminal is not its
        assert child.stdin is not None
        child.stdin.write(pickle.dumps((cluster, run_ids, settings, if_ended)))
        child.stdin.close()
    except (OSError, pickle.PicklingError):
        pass  # no page; `report` writes it


def later() -> None:
    """`page_later`'s process: the pages, each within REPORT_BACKGROUND_TIMEOUT_S."""
    import signal

    from launcher.run import control

    cluster, run_ids, settings, if_ended = pickle.loads(sys.stdin.buffer.read())

    def too_long(signum: int, frame: Any) -> None:  # into report.err, as any other reason (the default would be mute)
        raise TimeoutError(f"no page within {REPORT_BACKGROUND_TIMEOUT_S:.0f} s of the run's end")

    signal.signal(signal.SIGALRM, too_long)
    signal.alarm(int(REPORT_BACKGROUND_TIMEOUT_S))
    with open(os.devnull, "w") as quiet:
        for run_id in run_ids:
            try:
                if if_ended:
                    found = control.status(cluster, run_id, settings, RunIO(out=quiet, err=quiet))
                    run_id = run_id or next((s.run_id for s in found if s.run_id), None)
                    if not page_due(settings, run_id, [s.state for s in found]):
                        continue
                write_page(cluster, run_id, settings, quiet)
            except Exception as exc:
                if run_id is not None:
                    _why(settings, run_id, exc)


def page_now(cluster: Cluster, run_id: str, settings: Settings, given: Mapping[str, Any] | None = None) -> Path | None:
    """A run's page before the command returns: an attached `launch --slurm`'s (in a batch job the job ends with it,
    and a process left to write the page would end with the job: one short step a node, `given`), the demo's (its
    nodes go down next). Its path; None when pages are off or it could not be written (why: in
    `logs/<run id>/report.err`, as `page_later`'s)."""
    if not settings.output.page:
        return None
    try:
        with open(os.devnull, "w") as quiet:
            return write_page(cluster, run_id, settings, quiet, given)[0]
    except Exception as exc:
        _why(settings, run_id, exc)
        return None


def _why(settings: Settings, run_id: str, exc: Exception) -> None:
    folder = settings.output.log_dir / run_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.err").write_text(f"{type(exc).__name__}: {exc}\n", encoding="utf-8")
