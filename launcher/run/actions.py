"""What every command does with the nodes' agents (launcher/node/agent/agent.py): connect to every node (all or none, or
those that answer), and one action a node, all nodes in parallel (stop, status, logs, stacks, report, top's feed).
Light on purpose: `inv status` imports this, not the launch's supervision (launcher.run.launch).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import IO, Any

from launcher.config.model import Cluster, Host
from launcher.errors import ConnectError, NodeFailure, UsageError
from launcher.limits import NODE_TIMING, heartbeat_interval
from launcher.node.wire import RUN_ID_PATTERN
from launcher.settings import Settings, SshSettings
from launcher.transport.channel import Result
from launcher.transport.connections import Node, close_all, connect_all, run_all
from launcher.transport.program import host_command, node_program, program_input, python_command

AGENT_SOURCE = node_program("agent.agent")

agent_command = python_command


def agent_input(request: dict[str, Any]) -> bytes:
    """The agent's source and one request (with the agent's `timing`), for its stdin."""
    return program_input(AGENT_SOURCE, {**request, "timing": NODE_TIMING})


def check_run_id(run_id: str | None) -> str | None:
    """A run id given by a user, checked against the pattern every run id has (None means the latest); a usage
    error (exit code 2) otherwise."""
    if run_id is not None and not re.fullmatch(RUN_ID_PATTERN, run_id):
        raise UsageError(f"--run must be a run id like 20261122-031500-a1b2c3, got {run_id[:60]!r}")
    return run_id


class _Progress:
    """`connected 14/16`-style progress: one rewritten line on a terminal, one plain line otherwise."""

    def __init__(self, err: IO[str]):
        self.err = err
        self.tty = err.isatty()

    def update(self, text: str) -> None:
        if self.tty:
            self.err.write(f"\r\x1b[K{text}")
            self.err.flush()

    def done(self, text: str) -> None:
        self.err.write(f"\r\x1b[K{text}\n" if self.tty else f"{text}\n")
        self.err.flush()


def run_ssh(settings: Settings) -> SshSettings:
    """A run's connections: SSH keepalives as often as heartbeats keep NAT and firewall state of a quiet run alive."""
    return replace(settings.ssh, keepalive=heartbeat_interval(settings.run.silence_timeout))


def connect_or_fail(cluster: Cluster, hosts: Iterable[Host], settings: Settings, err: IO[str]) -> dict[str, Node]:
    """Connect to every host at once; any failure closes the rest and raises `ConnectError`."""
    progress = _Progress(err)
    hosts = list(hosts)
    progress.update(f"connecting to {len(hosts)} node(s)")
    t0 = time.monotonic()
    nodes, failures = connect_all(
        cluster, hosts, run_ssh(settings), on_connect=lambda done, total: progress.update(f"connected {done}/{total}")
    )
    if failures:
        close_all(nodes.values())
        progress.done(f"connected {len(nodes)}/{len(hosts)}")
        raise ConnectError(failures)
    progress.done(f"connected {len(nodes)}/{len(hosts)} in {time.monotonic() - t0:.1f}s")
    return nodes


@contextlib.contextmanager
def reached(
    cluster: Cluster, ssh: SshSettings, given: Mapping[str, Any] | None = None
) -> Iterator[tuple[dict[str, Any], list[NodeFailure]]]:
    """The nodes an action works on, and those it could not reach: the `given` ones (a SLURM job's steps), or a new
    SSH connection to every host that answers, closed after."""
    if given is not None:
        yield dict(given), []
        return
    nodes, failures = connect_all(cluster, cluster.hosts, ssh)
    try:
        yield nodes, failures
    finally:
        close_all(nodes.values())


def agent_action(
    nodes: dict[str, Node], cluster: Cluster, request: dict[str, Any], timeout: float | None = 60
) -> dict[str, Result | NodeFailure]:
    hosts = [h for h in cluster.hosts if h.name in nodes]
    commands = {h.name: host_command(h) for h in hosts}
    inputs = {h.name: agent_input({**request, "node": h.name}) for h in hosts}
    return run_all([nodes[h.name] for h in hosts], commands, inputs, timeout)
