"""A launch that survives a lost node or a hang: attempts of a run, each on the nodes that are left (`inv launch
--retries`, `--on-hang restart`).

Each attempt is a whole run (`launch_run`, its own run id, logs and atomic start), which says how it ended
(`launcher.plan.ends.RunEnd`, through `RunIO.on_end`). What follows is decided in one place,
launcher/plan/recovery.py (`after_attempt`: `Retry` or `Final`, from how it ended and the attempts before; `too_few`
when the nodes left cannot carry the next); this module only carries it out: it waits `retry_wait`, runs the doctor's
fast checks on the nodes the decision did not keep out, sweeps each node kept of the previous attempt over a new
channel (a lost, silent or hung node may still hold its workers: GPU memory, a checkpoint half-written) and needs it
confirmed empty, then starts the next attempt on those with the job's `resume_args` added. Every attempt's folder of
logs holds `attempts.json`, which `inv status` and the run's page show, however the attempt ended (one that could not
start too).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.config.model import Cluster
from launcher.errors import LauncherError, RunFailed
from launcher.events import Beat, HangSuspected
from launcher.node.wire import ATTEMPT_ENV
from launcher.plan.ends import RunEnd
from launcher.plan.launchplan import LaunchPlan, plan_launch
from launcher.plan.recovery import AttemptEnd, Final, How, Retry, after_attempt, outcome, restart_needs, too_few
from launcher.plan.retry import Attempt, NextNodes, next_nodes, resumed, summary, with_spares
from launcher.run import control as run_control
from launcher.run.run_io import RunIO
from launcher.settings import Settings
from launcher.trace import run_trace

log = logging.getLogger(__name__)

ATTEMPTS_FILE = "attempts.json"
"""In each attempt's log folder (`<log_dir>/<run id>/`): every attempt of its launch so far."""

AttemptCheck = Callable[[Cluster], Mapping[str, str]]
"""Nodes of a cluster that cannot take part (name -> why): the doctor's fast checks between attempts."""


class AttemptEvents:
    """What one attempt's events say beside its end: the hang that stopped it, where it resumed from and when every
    rank was training again (each is passed on to `run_io.on_event`)."""

    def __init__(self, run_io: RunIO):
        self.passed = run_io.on_event
        self.hang: HangSuspected | None = None
        self.resumed_from: int | None = None
        self.first_steps: dict[tuple[str, int], float] = {}

    def take(self, event: Any) -> None:
        if isinstance(event, HangSuspected) and not event.kept:
            self.hang = event
        elif isinstance(event, Beat):
            steps = [r["first_step"] for r in event.progress if isinstance(r.get("first_step"), int)]
            if steps:
                self.resumed_from = min(steps if self.resumed_from is None else [*steps, self.resumed_from])
            for rank in event.progress:
                if isinstance(rank.get("first_step_at"), int | float):
                    self.first_steps[(event.node, int(rank["rank"]))] = float(rank["first_step_at"])
        if self.passed is not None:
            self.passed(event)

    def noted(self, attempt: Attempt, end: AttemptEnd) -> Attempt:
        """The attempt with what its events said."""
        hang_since = None if self.hang is None else self.hang.time - self.hang.quiet_s
        return replace(
            attempt,
            ended_at=time.time(),
            how=end.how.value,
            step=end.step,
            cause=end.node,
            resumed_from=self.resumed_from,
            hang_since=hang_since,
            training_at=max(self.first_steps.values(), default=None),
        )


def launch_with_retries(plan: LaunchPlan, run_io: RunIO, health: AttemptCheck) -> int:
    """`run_launch.launch_run`, again as `after_attempt` decides, up to the plan's `retries` more times."""
    attempts: list[Attempt] = []
    ends: list[AttemptEnd] = []
    failures: dict[str, list[float]] = {}
    first, sat_out = plan, dict[str, str]()
    run, log_dir = plan.settings.run, plan.settings.output.log_dir
    needs = restart_needs(plan.cluster, len(plan.nodes))
    while True:
        attempt = Attempt(
            len(attempts) + 1,
            plan.run_id,
            tuple(c.host.name for c in plan.nodes),
            _master_name(plan.cluster),
            sat_out=dict(sat_out),
        )
        attempts.append(attempt)
        _record(log_dir, attempts)
        code, error, end, events = _attempt(plan, run_io, attempts)
        ends.append(end)
        if end.how.node_caused and end.node is not None:
            failures.setdefault(end.node, []).append(time.time())
        with run_trace(log_dir / plan.run_id):  # what follows this attempt goes in its trace
            decision = after_attempt(
                end,
                ends[:-1],
                nodes=attempt.nodes,
                min_nodes=needs,
                retries=run.retries,
                on_hang=run.on_hang,
                failures=failures,
                now=time.time(),
                cooldown=run.retry_cooldown,
            )
            log.info("attempt %d ended: %s (%s); %s", attempt.number, end.how, end.summary, decision)
            attempts[-1] = replace(events.noted(attempt, end), outcome=outcome(end, decision), why=end.summary)
            _record(log_dir, attempts)
            if isinstance(decision, Final):
                return _final(decision, code, error, attempts, run_io)
            try:
                chosen = _next_nodes(first, run_io, health, decision, attempts)
            except KeyboardInterrupt:  # between attempts nothing runs: there is nothing to stop
                lines = [
                    "interrupted between attempts: nothing is running",
                    "attempts:",
                    *(f"  {line}" for line in summary(attempts)),
                ]
                raise RunFailed("\n".join(lines), 130, node=end.node) from None
            ending = too_few(chosen, needs)
            log.info("next attempt: %s; sitting out: %s", [h.name for h in chosen.cluster.hosts], dict(chosen.dropped))
            if ending is not None:
                lines = [ending.text, "attempts:", *(f"  {line}" for line in summary(attempts))]
                raise RunFailed("\n".join(lines), 1, node=attempts[-1].cause)
            plan, sat_out = _next_plan(first, chosen, run_io, len(attempts)), dict(chosen.dropped)


def _attempt(
    plan: LaunchPlan, run_io: RunIO, attempts: list[Attempt]
) -> tuple[int, RunFailed | None, AttemptEnd, AttemptEvents]:
    """One attempt, the last of `attempts`, to its end: its exit code, its failure, how it ended (the run's own word,
    `RunIO.on_end`), what its events said. One that could not start is recorded as ended, and raises."""
    from launcher.run import launch as run_launch  # here: `inv status` reads the attempts, and starts nothing

    events, error = AttemptEvents(run_io), None
    heard: list[RunEnd] = []
    try:
        code = run_launch.launch_run(plan, replace(run_io, on_event=events.take, on_end=heard.append))
    except RunFailed as exc:
        code, error = exc.exit_code, exc
    except (LauncherError, KeyboardInterrupt) as exc:
        _could_not_start(exc, attempts[-1], attempts, plan.settings.output.log_dir, run_io)
        raise
    return code, error, heard[-1].end if heard else AttemptEnd(How.NO_START, "it could not start"), events


def _final(decision: Final, code: int, error: RunFailed | None, attempts: list[Attempt], run_io: RunIO) -> int:
    """The launch's end: its last attempt's code, or its failure, with every attempt's line where there were more."""
    if error is not None:
        raise _with_attempts(error, attempts, decision) from None
    if len(attempts) > 1:
        run_io.err.write("\n".join(["attempts:", *(f"  {line}" for line in summary(attempts))]) + "\n")
    return code


def _could_not_start(
    exc: BaseException, attempt: Attempt, attempts: list[Attempt], log_dir: Path, run_io: RunIO
) -> None:
    """An attempt that could not start (the doctor's checks, a connection) or was interrupted while starting:
    recorded as ended, never left "running" for `inv status`."""
    interrupted = isinstance(exc, KeyboardInterrupt)
    why = "interrupted while starting" if interrupted else f"could not start: {_first_line(exc)}"
    how = How.INTERRUPTED if interrupted else How.NO_START
    attempts[-1] = replace(
        attempt, ended_at=time.time(), outcome="interrupted" if interrupted else "failed-final", why=why, how=how.value
    )
    _record(log_dir, attempts)
    if len(attempts) > 1:
        run_io.err.write("\n".join(["attempts:", *(f"  {line}" for line in summary(attempts))]) + "\n")


def _next_nodes(
    first: LaunchPlan, run_io: RunIO, health: AttemptCheck, decision: Retry, attempts: list[Attempt]
) -> NextNodes:
    """Wait, check the nodes, sweep them of the last attempt: the nodes the next attempt may run on, and why each
    of the others sits out (the decision's, the checks', the sweep's).

    Every attempt is planned from the first one's nodes: a node left out once (a failed check, a cool-down over, a
    hang it held) takes part again as soon as nothing keeps it out."""
    done, run = len(attempts), first.settings.run
    run_io.err.write(
        f"attempt {done} of {run.retries + 1} failed: {decision.why}; checking the nodes again "
        f"in {run.retry_wait:g} s (retry {done} of {run.retries})\n"
    )
    time.sleep(run.retry_wait)
    inventory = first.cluster
    out = dict(decision.sit_out)
    candidates = next_nodes(inventory, out).cluster
    if candidates.hosts:
        out.update(health(candidates))
    kept = next_nodes(inventory, out).cluster
    if kept.hosts:
        out.update(_sweep(kept, attempts[-1], first.settings, run_io))
    chosen = next_nodes(inventory, out)
    for name, why in chosen.dropped.items():
        run_io.err.write(f"  {name} sits out: {why}\n")
    if not inventory.spares or len(chosen.cluster.hosts) >= len(first.nodes):
        return chosen
    return _take_spares(inventory, out, len(first.nodes), health, run_io)


def _take_spares(inventory: Cluster, out: dict[str, str], size: int, health: AttemptCheck, run_io: RunIO) -> NextNodes:
    """The next attempt's nodes with the inventory's spares that pass the checks in place of those that sit out, so
    that the run keeps its `size` (called only when one is needed: the spares are checked then)."""
    pool = replace(inventory, hosts=(*inventory.hosts, *inventory.spares))
    failed = dict(health(next_nodes(pool, out).cluster))  # the nodes kept again too: the rendezvous is checked whole
    passed = [h for h in inventory.spares if h.name not in failed and h.name not in out]
    for host in inventory.spares:
        if host.name in failed:
            run_io.err.write(f"  {host.name} (a spare) is not taken: {failed[host.name]}\n")
    chosen, taken = with_spares(inventory, out, passed, size)
    for host in taken:
        run_io.err.write(f"  {host.name} (a spare) takes a place: the run keeps its {size} node(s)\n")
    return chosen


def _next_plan(first: LaunchPlan, chosen: NextNodes, run_io: RunIO, done: int) -> LaunchPlan:
    """The next attempt's plan on the nodes chosen, with the job's resume_args; said on the console."""
    if chosen.new_master is not None:
        run_io.err.write(f"  new master: {chosen.new_master} (the old one sits out)\n")
    job = resumed(first.job)
    names = ", ".join(h.name for h in chosen.cluster.hosts)
    added = (
        f", with {' '.join(job.resume_args)}"
        if job.resume_args
        else f", the same arguments ({ATTEMPT_ENV}={done + 1}; job.resume_args adds some)"
    )
    run_io.err.write(f"attempt {done + 1}: {len(chosen.cluster.hosts)} node(s) ({names}){added}\n")
    return plan_launch(chosen.cluster, job, settings=first.settings, attempt=done + 1)


def _sweep(cluster: Cluster, previous: Attempt, settings: Settings, run_io: RunIO) -> dict[str, str]:
    """Stop what is left of the previous attempt on every node kept (over a new channel, its silent agent too);
    the nodes that cannot be confirmed empty, and why: they sit out the next attempt."""
    states = run_control.stop(cluster, previous.run_id, settings, sweep=True, run_io=run_io)
    out = {}
    for state in states:
        if state.state in ("unreachable", "error"):
            out[state.host] = f"could not be confirmed free of attempt {previous.number}: {state.detail}"
        elif state.left:
            out[state.host] = f"{state.left} process(es) of attempt {previous.number} could not be stopped there"
        elif state.found:
            run_io.err.write(f"  {state.host}: stopped {state.found} process(es) left of attempt {previous.number}\n")
    return out


def _master_name(cluster: Cluster) -> str:
    rdzv = cluster.rendezvous
    return next((h.name for h in cluster.hosts if rdzv.master_addr in (h.name, h.addr)), rdzv.master_addr)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return next((line for line in lines if line.startswith("root cause")), lines[0] if lines else "")


def _with_attempts(exc: RunFailed, attempts: list[Attempt], decision: Final) -> RunFailed:
    """The last attempt's failure, with every attempt's line and why no other follows (the decision's words)."""
    if exc.exit_code == 130:
        return exc
    lines = [str(exc), "attempts:", *(f"  {line}" for line in summary(attempts)), decision.text]
    return RunFailed("\n".join(lines), exc.exit_code, node=exc.node, rank=exc.rank, tail=exc.tail, ends=exc.ends)


def _record(log_dir: Path, attempts: list[Attempt]) -> None:
    """attempts.json in every attempt's log folder (best effort: a full disk must not end a run)."""
    data = json.dumps([a.as_json() for a in attempts], indent=1)
    for attempt in attempts:
        folder = log_dir / attempt.run_id
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = folder / f".{ATTEMPTS_FILE}.{os.getpid()}"
            tmp.write_text(data, encoding="utf-8")
            tmp.replace(folder / ATTEMPTS_FILE)
        except OSError:
            pass


def read_attempts(log_dir: Path, run_id: str) -> list[Attempt]:
    """The attempts of the launch that run `run_id` belongs to, as this machine recorded them (none: [])."""
    try:
        data = json.loads((log_dir / run_id / ATTEMPTS_FILE).read_text(encoding="utf-8"))
        return [Attempt(**{**a, "nodes": tuple(a["nodes"])}) for a in data]
    except (OSError, ValueError, TypeError, KeyError):
        return []
