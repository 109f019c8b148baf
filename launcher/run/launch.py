"""A run's start across nodes: every node's part at once, then (attached) streamed, failing fast, to its end.

The node side is `launcher/node/agent/agent.py`, sent over each node's SSH connection; `launcher.run.handle` drives an
attached run; this module wires it to the console, the log mirror and the root-cause report. After the start,
`launcher.run.control` stops, tells and replays a run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.config.model import Cluster
from launcher.plan.launchplan import LaunchPlan
from launcher.run.actions import connect_or_fail
from launcher.run.control import run_and_nodes
from launcher.run.journal import Journal
from launcher.run.nodeenv import NodeEnv, resolve_env
from launcher.run.run_io import RunIO
from launcher.run.runconsole import Hangup, RunConsole
from launcher.run.sessions import SessionOpener
from launcher.settings import Settings
from launcher.trace import run_trace
from launcher.transport.connections import close_all

log = logging.getLogger(__name__)


def launch_run(plan: LaunchPlan, run_io: RunIO | None = None) -> int:
    """Start the plan on every node at once and (unless detached) stream it to its end.

    Returns 0 when every node's torchrun exited 0 (130 when interrupted); raises `RunFailed` with the root cause.
    """
    run_io, settings = run_io or RunIO(), plan.settings
    folder = settings.output.log_dir / plan.run_id
    with run_trace(folder):
        _planned(plan)
        journal = Journal(plan.run_id, folder)  # the run's page's account, from the command's start
        cluster = plan.cluster
        envs = {c.host.name: resolve_env(c, dict(os.environ)) for c in plan.nodes}  # before connecting anywhere
        nodes = connect_or_fail(cluster, cluster.hosts, settings, run_io.err)
        for name in (c.host.name for c in plan.nodes):  # each node's own moment: a slow handshake shows as its bar
            journal.phase([name], "connected", nodes[name].connected_at)
        try:
            # e.g. --sync; the checks run inside the agents' sessions
            for name, when in (run_io.gate.prepare(cluster, nodes) if run_io.gate is not None else {}).items():
                journal.phase([name], "synced", when)
            return run_attached(plan, run_io, nodes, envs, journal=journal)
        finally:
            close_all(nodes.values())


def _planned(plan: LaunchPlan) -> None:
    """The trace's first lines of a run: its nodes, and the settings it uses that were set, with where from."""
    run = plan.settings.run
    log.info(
        "run %s: %d node(s) (%s), master %s:%d; %s",
        plan.run_id,
        len(plan.nodes),
        ", ".join(c.host.name for c in plan.nodes),
        plan.cluster.rendezvous.master_addr,
        plan.cluster.rendezvous.master_port,
        "detached" if run.detach else "attached",
    )
    for name, source in plan.settings.sources.items():
        log.debug("setting %s = %r (%s)", name, plan.settings.value(name), source)


def run_attached(
    plan: LaunchPlan,
    run_io: RunIO,
    nodes: Mapping[str, Any],
    envs: dict[str, NodeEnv],
    opener: SessionOpener | None = None,
    journal: Journal | None = None,
) -> int:
    """Start and follow a run on the console over open `nodes` (or the sessions `opener` starts: an srun step).
    `journal`: the run's account for its page, begun at the command's start (else begun now).

    SIGTERM counts as Ctrl-C meanwhile: the run is stopped on every node. SIGHUP (the terminal closed) leaves the run
    to its nodes: it goes on within the heartbeat bound, and `attach` takes it back from any terminal.
    """
    folder = plan.settings.output.log_dir / plan.run_id
    with run_trace(folder), _interrupt_on({signal.SIGTERM: KeyboardInterrupt, signal.SIGHUP: Hangup}):
        return RunConsole(plan, run_io, dict(nodes), envs, opener, journal or Journal(plan.run_id, folder)).execute()


def attach_run(
    cluster: Cluster,
    plan_for: Callable[[Cluster, str], LaunchPlan],
    run_id: str | None,
    settings: Settings,
    run_io: RunIO,
    on_run: Callable[[str], None] | None = None,
    force: bool = False,
) -> int:
    """Take over an attached run that lives on its nodes, whose launcher is gone (`attach`): each node's console from
    where this machine's copy of its log stopped (none: its last lines), heartbeats again, Ctrl-C stops it
    everywhere; returns (or raises) as its launch would have. `plan_for(nodes' cluster, run id)` is the run's plan
    (the application layer's: the inventory's job); `on_run` hears the run's id once chosen; `force` takes it from a
    launcher its nodes still hear."""
    nodes = connect_or_fail(cluster, cluster.hosts, settings, run_io.err)
    try:
        run_id, names = run_and_nodes(cluster, nodes, run_id, settings, run_io.err, force)
        if on_run is not None:
            on_run(run_id)
        plan = plan_for(replace(cluster, hosts=tuple(h for h in cluster.hosts if h.name in names)), run_id)
        folder = settings.output.log_dir / run_id
        journal = Journal.resumed(run_id, folder)
        journal.mark("attach", f"run taken over by `attach` on {', '.join(names)}")
        offsets = {name: _size(folder / f"{name}.log") for name in names}
        with run_trace(folder), _interrupt_on({signal.SIGTERM: KeyboardInterrupt, signal.SIGHUP: Hangup}):
            log.info("attach: run %s on %s; this machine's log copies end at %s", run_id, ", ".join(names), offsets)
            return RunConsole(plan, run_io, {n: nodes[n] for n in names}, {}, None, journal, offsets).execute()
    finally:
        close_all(nodes.values())


def _size(path: Path) -> int | None:
    """A local copy's size: where a node's log goes on for this machine (None: it has none)."""
    try:
        return path.stat().st_size
    except OSError:
        return None


@contextlib.contextmanager
def _interrupt_on(raised: Mapping[signal.Signals, type[BaseException]]) -> Iterator[None]:
    """While a run is attached, raise these exceptions on these signals in the main thread (Ctrl-C's, or a hangup's)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise raised[signal.Signals(signum)]

    previous = {s: signal.signal(s, interrupt) for s in raised}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
