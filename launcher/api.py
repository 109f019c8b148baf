"""The launcher as a Python API, for notebooks, pipelines and tests: what `ddpl` does, as calls that return typed
results and raise typed errors (`launcher.errors`), never exit the process.

    from launcher import api

    result = api.launch("hosts/cluster.yaml", script="train.py", args=["--epochs", "3"])
    print(result.ok, result.run_id, result.logs, result.root_cause)

    run = api.launch("hosts/cluster.yaml", detach=True)   # a handle: status, top, stacks, logs, stop, wait
    print(run.top().ranks[0].steps_per_s)
    run.stop()

    result = api.attach("hosts/cluster.yaml")   # an attached run whose launcher is gone (asleep, killed), to its end

    findings = api.doctor("hosts/cluster.yaml").findings

Paths are Python's: relative to the current folder. No settings file is read: options are arguments (`grace=5`,
`log_dir="runs"`, `retries=2`: any setting of `launcher.settings` by its name, checked as the command line's). A
KeyboardInterrupt while a launch is attached stops the run on every node, as Ctrl-C does, then reaches the caller;
each call closes its connections, ends its threads and gives back the signal handlers it set.
"""

from __future__ import annotations

import io
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import wraps
from pathlib import Path
from typing import IO, Any, ParamSpec, TypeVar, cast

from launcher import app
from launcher.app import runs
from launcher.doctor.evidence import Finding, Report
from launcher.errors import LauncherError, RunFailed, StillRunning
from launcher.events import Ended, NodeEnd, Reattached, Started
from launcher.limits import API_WAIT_POLL_S
from launcher.options import from_config
from launcher.paths import API, called_as
from launcher.plan.launchplan import new_run_id
from launcher.results import NodeResult, NodeTop, RankTop, RunPage, RunResult, TopSnapshot
from launcher.run.actions import check_run_id
from launcher.run.control import NodeState
from launcher.run.run_io import RunIO
from launcher.run.takestacks import StacksReport
from launcher.settings import Settings

Lines = Callable[[str], None]
"""Called with each line (without its newline), from the launcher's threads: it must not block for long."""


class _LineStream(io.TextIOBase):
    """A text stream that hands each whole line to a function (the console's writes, whatever their cuts)."""

    def __init__(self, deliver: Lines):
        super().__init__()
        self.deliver, self.pending, self.lock = deliver, "", threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.deliver(line)
        return len(text)

    def isatty(self) -> bool:
        return False

    def end(self) -> None:
        rest, self.pending = self.pending, ""
        if rest:
            self.deliver(rest)


P = ParamSpec("P")
R = TypeVar("R")


def _api(fn: Callable[P, R]) -> Callable[P, R]:
    """A call of the API: the launcher's messages name its calls where it has them (`launcher.paths.hint`)."""

    @wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        with called_as(API):
            return fn(*args, **kwargs)

    return call


def _settings(given: Mapping[str, Any], detach: bool = False) -> Settings:
    """The keywords as `Settings`, each checked as the command line's are (a wrong one: a LauncherError)."""
    values = {**given, **({"detach": True} if detach else {})}
    if values.get("log_dir") is not None:
        values["log_dir"] = Path(values["log_dir"])
    return from_config({}, values, given_by="the caller")


def _quiet() -> RunIO:
    return RunIO(out=io.StringIO(), err=io.StringIO())


def _stream(deliver: Lines | None, default: IO[str]) -> IO[str]:
    # a text stream by io's own base class, which typeshed does not count as an IO[str]
    return default if deliver is None else cast(IO[str], _LineStream(deliver))


@_api
def launch(
    hosts: str | Path,
    script: str | None = None,
    *,
    module: str | None = None,
    command: str | None = None,
    args: Sequence[str] | None = None,
    detach: bool = False,
    sync: bool = False,
    doctor: bool = True,
    include: str | None = None,
    exclude: str | None = None,
    image: str | None = None,
    pull: bool = False,
    on_output: Lines | None = None,
    on_message: Lines | None = None,
    **options: Any,
) -> RunResult | Run:
    """Start a job on every node of the inventory (or hostfile) `hosts`, as `ddpl launch` does.

    `script`, `module`, `command` (one of them) and `args` (a list of words) replace the inventory's job; by default
    it runs as it says. Attached (the default): returns the run's `RunResult` once it ends, a failed run too
    (`result.check()` raises its `RunFailed`); each line of output goes to `on_output` (default: this process's
    stdout, prefixed by node and rank as on the console), the launcher's own lines to `on_message` (default:
    stderr). `detach=True`: returns a `Run` handle once the run started. A run that could not start raises (a
    `ConnectError`, `DoctorFailed`, `RunFailed`); `sync`, `doctor`, `include`, `exclude`, `image` (the container image
    on every node) and `pull` (it first, on every node at once) are `ddpl launch`'s.
    """
    settings = _settings(options, detach)
    spec = app.Hosts(str(hosts), include=include, exclude=exclude, image=image)
    job_args = app.JobArgs(script, module, command, None if args is None else shlex.join(str(a) for a in args))
    run_id = new_run_id()
    ended = _attended(
        lambda run_io: app.launch(
            spec, job_args, doctor=doctor, sync=sync, settings=settings, run_id=run_id, run_io=run_io, pull=pull
        ),
        lambda: run_id,
        settings,
        on_output,
        on_message,
        raising=detach,
    )
    return Run(run_id, spec, settings) if ended is None else ended


@_api
def attach(
    hosts: str | Path,
    run_id: str | None = None,
    *,
    on_output: Lines | None = None,
    on_message: Lines | None = None,
    force: bool = False,
    **options: Any,
) -> RunResult:
    """Take over an attached run whose launcher is gone (a laptop that slept past its reconnects, a killed process,
    another machine), as `ddpl attach` does: its output from where this machine's copy stopped (to `on_output` and
    `on_message`, as `launch`'s), heartbeats again, a KeyboardInterrupt stops it everywhere; returns its `RunResult`
    once it ends. `run_id`: default, the inventory's running run. A run whose launcher its nodes still hear raises
    LauncherError unless `force` (that launcher then lets go)."""
    settings = _settings(options)
    chosen = [check_run_id(run_id) or ""]
    ended = _attended(
        lambda run_io: app.attach(
            app.Hosts(str(hosts)), run_id, settings=settings, run_io=run_io, on_run=chosen.append, force=force
        ),
        lambda: chosen[-1],
        settings,
        on_output,
        on_message,
    )
    assert ended is not None  # followed to its end (not `raising`)
    return ended


def _attended(
    call: Callable[[RunIO], int],
    run_id: Callable[[], str],
    settings: Settings,
    on_output: Lines | None,
    on_message: Lines | None,
    raising: bool = False,
) -> RunResult | None:
    """An attached run followed to its end: its `RunResult` (a failed run's too; None with
    `raising`: a detached launch, where an error is the answer, as when nothing started). Each node's end is taken
    from the run's events."""
    ends: dict[str, NodeEnd] = {}
    started: list[str] = []

    def heard(event: Any) -> None:
        if isinstance(event, Ended):
            ends[event.node] = event.end
        elif isinstance(event, Started | Reattached):
            started.append(event.node)

    out, err = _stream(on_output, sys.stdout), _stream(on_message, sys.stderr)
    try:
        code = call(RunIO(out=out, err=err, on_event=heard))
    except RunFailed as exc:
        if raising or not started:  # nothing runs: the error is the answer
            raise
        return _ended(run_id(), settings, exc.ends or tuple(ends.values()), exc)
    finally:
        for stream in (out, err):
            if isinstance(stream, _LineStream):
                stream.end()
    if code == 130:  # interrupted: the run was stopped on every node, as Ctrl-C does; the caller hears it too
        raise KeyboardInterrupt
    return None if raising else _ended(run_id(), settings, tuple(ends.values()), None, code)


def _ended(
    run_id: str, settings: Settings, ends: Sequence[NodeEnd], error: RunFailed | None, code: int = 0
) -> RunResult:
    nodes = tuple(NodeResult(e.node, e.kind.value, e.exit_code, e) for e in ends)
    if error is None:
        return RunResult(run_id, code == 0, code, nodes, settings.output.log_dir / run_id)
    return RunResult(
        run_id,
        False,
        error.exit_code,
        nodes,
        settings.output.log_dir / run_id,
        str(error),
        error.node,
        error.rank,
        error,
    )


@_api
def doctor(
    hosts: str | Path,
    script: str | None = None,
    *,
    module: str | None = None,
    command: str | None = None,
    checks: str = "all",
    net: bool = False,
    include: str | None = None,
    exclude: str | None = None,
    image: str | None = None,
    **options: Any,
) -> Report:
    """The doctor's findings on every node, as `ddpl doctor` shows them: `report.ok`, `report.findings` (each a
    `Finding`: host, check, status, detail, fix), `report.failures`. `checks="fast"`: only launch's start checks.
    `script`, `module` or `command`: the job to check (as `launch` takes them), instead of the inventory's; `image`:
    the container image to look into on every node (`--image`)."""
    spec = app.Hosts(str(hosts), include=include, exclude=exclude, image=image)
    return app.doctor_report(
        spec,
        checks=checks,
        settings=_settings(options),
        net=net,
        run_io=_quiet(),
        job_args=app.JobArgs(script, module, command),
    )


@_api
def run(hosts: str | Path, run_id: str | None = None, **options: Any) -> Run:
    """A handle on a run started earlier, from here or elsewhere: `run_id`, or (None) the one of this inventory that
    is running, else its newest, as `ddpl status` and `ddpl stop` choose."""
    return Run(check_run_id(run_id), app.Hosts(str(hosts)), _settings(options))


@dataclass(frozen=True)
class Run:
    """A run on the nodes (a detached one, or one found by `run`): ask them how it goes, take its stacks, read its
    logs, stop it, wait for its end."""

    run_id: str | None
    """None: the inventory's running run, else its newest, chosen by each call."""
    hosts: app.Hosts
    settings: Settings

    @_api
    def status(self) -> list[NodeState]:
        """Each node's state of the run (running, exited with its code, stopped, lost, unreachable)."""
        return runs.states(self.hosts, self.run_id, self.settings, _quiet())

    @_api
    def top(self) -> TopSnapshot:
        """One look at every node and rank (a few seconds long), as `ddpl top --once --json`."""
        return TopSnapshot.of(runs.top_snapshot(self.hosts, self.run_id, self.settings, _quiet()))

    @_api
    def stacks(self) -> StacksReport:
        """Every rank's Python stack, grouped by where the ranks are (`report.lines()` as `ddpl stacks` says it)."""
        return runs.stacks_of(self.hosts, self.run_id, self.settings, _quiet())

    @_api
    def logs(self, node: str | None = None, rank: int | None = None) -> str:
        """The run's log so far, from its nodes, each line prefixed by node and rank (one node's, one rank's)."""
        out, err = io.StringIO(), io.StringIO()
        if app.logs(self.hosts, self.run_id, node=node, rank=rank, settings=self.settings, run_io=RunIO(out, err)):
            raise LauncherError(f"run {self.run_id}: the logs of some nodes could not be read: {err.getvalue()}")
        return out.getvalue()

    @_api
    def stop(self) -> list[NodeState]:
        """Stop the run on every node (TERM, the grace period, KILL); each node's state after."""
        return runs.stopped(self.hosts, self.run_id, self.settings, _quiet())

    @_api
    def report(self) -> RunPage:
        """Write the run's page (`logs/<run id>/report.html`, as `ddpl report`) and say where, with its figures."""
        path, page = runs.written_page(self.hosts, self.run_id, self.settings, _quiet())
        summary = dict(page.summary(), page=str(path))
        return RunPage(path, page.headline, summary.get("first_step_s"), summary)

    @_api
    def wait(self, timeout: float | None = None, poll_s: float = API_WAIT_POLL_S) -> RunResult:
        """Wait until no node runs it (a `StillRunning` error after `timeout` seconds); how each node's part ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            states = self.status()
            if not any(s.state == "running" for s in states):
                shown = self.run_id or next((s.run_id for s in states if s.run_id), None) or "(none)"
                return _states_result(shown, self.settings, states)
            if deadline is not None and time.monotonic() >= deadline:
                raise StillRunning(f"run {self.run_id} is still running after {timeout:g} s")
            time.sleep(poll_s)


def _states_result(run_id: str, settings: Settings, states: Sequence[NodeState]) -> RunResult:
    """A detached run's end from its nodes' states: the first node (by its end) that did not exit 0 is the cause."""
    nodes = tuple(NodeResult(s.host, s.state, s.exit_code) for s in states)
    failed = sorted(
        (s for s in states if s.state != "exited" or s.exit_code != 0),
        key=lambda s: s.ended_at if s.ended_at is not None else float("inf"),
    )
    if not failed:
        return RunResult(run_id, True, 0, nodes, settings.output.log_dir / run_id)
    first = failed[0]
    how = f"exit code {first.exit_code}" if first.state == "exited" else f"{first.state} {first.detail}".strip()
    return RunResult(
        run_id,
        False,
        first.exit_code or 1,
        nodes,
        settings.output.log_dir / run_id,
        f"run {run_id} FAILED: {first.host}: {how}",
        first.host,
    )


__all__ = [
    "Finding",
    "NodeResult",
    "NodeTop",
    "RankTop",
    "Report",
    "Run",
    "RunPage",
    "RunResult",
    "StacksReport",
    "TopSnapshot",
    "doctor",
    "launch",
    "run",
]
