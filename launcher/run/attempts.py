"""A launch that survives a lost node: attempts of a run, each on the nodes that are left (`inv launch --retries`).

Each attempt is a whole run (`launch_run`, its own run id, logs and atomic start). After an attempt that failed
because a node was lost or its processes were killed (`rootcause.retry_reason`; never after the script's own
error), the launcher waits `retry_wait`, runs the doctor's fast checks on the nodes not blacklisted, and starts the
next attempt on those that pass, if at least the rendezvous' MIN remain, with the job's `resume_args` added. Each
node kept is first swept of the previous attempt over a new channel (a lost or silent node may still hold its
workers: GPU memory, a checkpoint half-written) and must be confirmed empty, or it sits out. The decisions are
`launcher/plan/retry.py`'s; every attempt's folder of logs holds `attempts.json`, which `inv status` shows, however the
attempt ended (one that could not start too).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from launcher.config.model import Cluster
from launcher.errors import LauncherError, RunFailed
from launcher.options import Options
from launcher.plan.launch import LaunchPlan, plan_launch
from launcher.plan.retry import Attempt, blacklisted, next_nodes, resumed, summary
from launcher.report import rootcause
from launcher.run import control as run_control
from launcher.run.wiring import Wiring

ATTEMPTS_FILE = "attempts.json"
"""In each attempt's log folder (`<log_dir>/<run id>/`): every attempt of its launch so far."""

AttemptCheck = Callable[[Cluster], Mapping[str, str]]
"""Nodes of a cluster that cannot take part (name -> why): the doctor's fast checks between attempts."""


def launch_with_retries(plan: LaunchPlan, opts: Options, wiring: Wiring, retries: int, health: AttemptCheck) -> int:
    """`run_launch.launch_run`, again on what is left after a lost node, up to `retries` more times."""
    from launcher.run import launch as run_launch  # here: `inv status` reads the attempts, and starts nothing

    attempts: list[Attempt] = []
    failures: dict[str, list[float]] = {}
    first = plan
    elastic = plan.cluster.rendezvous.elastic
    # A static run is planned again for the nodes left; a c10d one needs its MIN.
    low = elastic.nodes_range(len(plan.nodes))[0] if elastic.backend == "c10d" else 1
    while True:
        attempt = Attempt(len(attempts) + 1, plan.run_id, tuple(c.host.name for c in plan.nodes),
                          _master_name(plan.cluster))
        attempts.append(attempt)
        _record(opts.log_dir, attempts)
        try:
            code = run_launch.launch_run(plan, opts, wiring)
        except (LauncherError, KeyboardInterrupt) as exc:
            if isinstance(exc, RunFailed):
                plan = _after_failure(exc, attempt, attempts, first, opts, wiring, failures, health, low, retries)
                continue
            # It could not start (the doctor's checks, a connection) or was interrupted while starting: recorded
            # as ended, never left "running" for `inv status`.
            interrupted = isinstance(exc, KeyboardInterrupt)
            why = "interrupted while starting" if interrupted else f"could not start: {_first_line(exc)}"
            attempts[-1] = replace(attempt, ended_at=time.time(), outcome="interrupted" if interrupted else
                                   "failed-final", why=why)
            _record(opts.log_dir, attempts)
            if len(attempts) > 1:
                wiring.err.write("\n".join(["attempts:", *(f"  {line}" for line in summary(attempts))]) + "\n")
            raise
        attempts[-1] = replace(attempt, ended_at=time.time(), outcome="ok" if code == 0 else "interrupted",
                               why="exit 0" if code == 0 else f"exit {code}")
        _record(opts.log_dir, attempts)
        if len(attempts) > 1:
            wiring.err.write("\n".join(["attempts:", *(f"  {line}" for line in summary(attempts))]) + "\n")
        return code


def _after_failure(exc: RunFailed, attempt: Attempt, attempts: list[Attempt], first: LaunchPlan, opts: Options,
                   wiring: Wiring,
                   failures: dict[str, list[float]], health: AttemptCheck, low: int, retries: int) -> LaunchPlan:
    """Record a failed attempt; the next attempt's plan, or raise the failure when it is final."""
    reason = rootcause.retry_reason(list(exc.ends)) if exc.ends else None
    final = reason is None or exc.exit_code == 130 or len(attempts) > retries
    outcome = "interrupted" if exc.exit_code == 130 else "failed-final" if final else "failed"
    why = reason or _first_line(exc) or "failed"
    attempts[-1] = replace(attempt, ended_at=time.time(), outcome=outcome, why=why, cause=exc.node)
    _record(opts.log_dir, attempts)
    if final:
        raise _with_attempts(exc, attempts, retries, reason) from None
    if exc.node is not None:
        failures.setdefault(exc.node, []).append(time.time())
    try:
        plan = _next_plan(first, opts, wiring, failures, health, low, retries, reason, attempts)
    except KeyboardInterrupt:  # between attempts nothing runs: there is nothing to stop
        lines = ["interrupted between attempts: nothing is running", "attempts:",
                 *(f"  {line}" for line in summary(attempts))]
        raise RunFailed("\n".join(lines), 130, node=exc.node) from None
    return plan


def _next_plan(first: LaunchPlan, opts: Options, wiring: Wiring, failures: dict[str, list[float]],
               health: AttemptCheck, low: int, retries: int, reason: str, attempts: list[Attempt]) -> LaunchPlan:
    """Wait, check the nodes, and plan the next attempt on those that may take part; raise when too few are left.

    Every attempt is planned from the first one's nodes: a node left out once (a failed check, a cool-down over)
    takes part again as soon as it passes."""
    done = len(attempts)
    wiring.err.write(f"attempt {done} of {retries + 1} failed: {reason}; checking the nodes again in "
                   f"{opts.retry_wait:g} s (retry {done} of {retries})\n")
    time.sleep(opts.retry_wait)
    inventory = first.cluster
    out = blacklisted(failures, time.time(), opts.retry_cooldown)
    candidates = next_nodes(inventory, out).cluster
    if candidates.hosts:
        out.update(health(candidates))
    kept = next_nodes(inventory, out).cluster
    if kept.hosts:
        out.update(_sweep(kept, attempts[-1], opts, wiring))
    chosen = next_nodes(inventory, out)
    for name, why in chosen.dropped.items():
        wiring.err.write(f"  {name} sits out: {why}\n")
    if len(chosen.cluster.hosts) < low:
        lines = [f"cannot retry: {len(chosen.cluster.hosts)} node(s) left, the run needs at least {low}",
                 *(f"  {name}: {why}" for name, why in chosen.dropped.items()), "attempts:",
                 *(f"  {line}" for line in summary(attempts))]
        raise RunFailed("\n".join(lines), 1, node=attempts[-1].cause)
    if chosen.new_master is not None:
        wiring.err.write(f"  new master: {chosen.new_master} (the old one sits out)\n")
    job = resumed(first.job)
    names = ", ".join(h.name for h in chosen.cluster.hosts)
    added = f", with {' '.join(job.resume_args)}" if job.resume_args else ""
    wiring.err.write(f"attempt {done + 1}: {len(chosen.cluster.hosts)} node(s) ({names}){added}\n")
    return plan_launch(chosen.cluster, job, hang_timeout=first.hang_timeout, retries=first.retries)


def _sweep(cluster: Cluster, previous: Attempt, opts: Options, wiring: Wiring) -> dict[str, str]:
    """Stop what is left of the previous attempt on every node kept (over a new channel, its silent agent too);
    the nodes that cannot be confirmed empty, and why: they sit out the next attempt."""
    states = run_control.stop(cluster, previous.run_id, opts, sweep=True, wiring=wiring)
    out = {}
    for state in states:
        if state.state in ("unreachable", "error"):
            out[state.host] = f"could not be confirmed free of attempt {previous.number}: {state.detail}"
        elif state.left:
            out[state.host] = f"{state.left} process(es) of attempt {previous.number} could not be stopped there"
        elif state.found:
            wiring.err.write(f"  {state.host}: stopped {state.found} process(es) left of attempt {previous.number}\n")
    return out


def _master_name(cluster: Cluster) -> str:
    rdzv = cluster.rendezvous
    return next((h.name for h in cluster.hosts if rdzv.master_addr in (h.name, h.addr)), rdzv.master_addr)


def _first_line(exc: Exception) -> str:
    lines = str(exc).splitlines()
    return next((line for line in lines if line.startswith("root cause")), lines[0] if lines else "")


def _with_attempts(exc: RunFailed, attempts: list[Attempt], retries: int, reason: str | None) -> RunFailed:
    """The last attempt's failure, with every attempt's line (and why there is no other) when there were retries."""
    if retries == 0 or exc.exit_code == 130:
        return exc
    if not exc.ends:
        why = "not retried: the run could not start (a retry would not either)"
    elif reason is None:
        why = "not retried: the script itself failed (a retry would fail the same way)"
    else:
        why = f"no retry left ({retries} allowed)"
    lines = [str(exc), "attempts:", *(f"  {line}" for line in summary(attempts)), why]
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
