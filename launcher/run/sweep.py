"""Sweeps after a node's agent is gone: a node whose agent died (killed), went silent (stopped, stuck) or could not be
reached again may still run its part of the run, so the launcher stops it over a new channel (a new connection when
the old one is gone), the silent agent too. When that fails as well, the node's part may still run until its
heartbeat bound, and the report says so and what to run (`lines`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from launcher.events import EndKind
from launcher.limits import NODE_TIMING, SWEEP_MARGIN, action_timeout
from launcher.paths import hint, stop_call
from launcher.run.reattach import Reconnector
from launcher.run.sessions import Session
from launcher.transport.connections import Node
from launcher.transport.program import host_command, program_input

SWEPT = (EndKind.AGENT_DIED, EndKind.SILENT, EndKind.LOST)
"""Ends after which the node's part may live on without a launcher: the launcher stops it over a new channel. (A
node that did not confirm a stop in time is not waited for again: Ctrl-C returns within grace + STOP_MARGIN.)"""


class Sweeps:
    """The sweeps of one run, each on a thread of its own with the moment the launcher stops waiting for it."""

    def __init__(
        self,
        run_id: str,
        nodes: Mapping[str, Node],
        agent_source: str,
        grace: float,
        heartbeat_timeout: float | None,
        reconnector: Reconnector | None = None,
    ):
        self.run_id, self.nodes, self.agent_source = run_id, nodes, agent_source
        self.grace, self.heartbeat_timeout = grace, heartbeat_timeout
        """The run's stop's grace; how long a node's part lives on without a launcher (what `lines` says)."""
        self.reconnector = reconnector
        """Reaches a node whose connection is gone over a new one; without it (SLURM), the node's own."""
        self._threads: list[tuple[threading.Thread, float, str]] = []
        self.unswept: dict[str, str] = {}
        """Nodes whose sweep failed, and why: their part may still run."""

    def after(self, session: Session) -> None:
        """Stop the run on the session's node over a new channel (killing a silent agent too)."""
        host = session.command.host
        request: dict[str, Any] = {
            "action": "stop",
            "run_id": self.run_id,
            "node": session.name,
            "grace": self.grace,
            "kill_supervisor": (session.end is not None and session.end.kind != EndKind.AGENT_DIED),
            "owner": self.reconnector.owner.token if self.reconnector else None,
            "timing": NODE_TIMING,
        }

        def sweep() -> None:
            node = self.reconnector.reach(host) if self.reconnector is not None else self.nodes[session.name]
            if isinstance(node, str):
                self.unswept[session.name] = f"cannot connect: {node}"
                return
            try:
                result = node.run(
                    host_command(host), program_input(self.agent_source, request), timeout=action_timeout(self.grace)
                )
                why = (
                    f"no answer within {result.timed_out:g} s"
                    if result.timed_out is not None
                    else f"the stop exited with code {result.exit_code}"
                    if result.exit_code != 0
                    else None
                )
            except Exception as exc:  # the connection is gone too: the node's own watchdogs are all that is left
                why = str(exc) or type(exc).__name__
            if why is not None:
                self.unswept[session.name] = why

        thread = threading.Thread(target=sweep, daemon=True, name=f"sweep-{session.name}")
        # TERM, grace, KILL on the node, and a margin: whenever its sshd answers, nothing of the run is left then.
        self._threads.append((thread, time.monotonic() + self.grace + SWEEP_MARGIN, session.name))
        thread.start()

    def under_way(self) -> bool:
        """A sweep is still under way, and within its limit (a node gone silent can't hold us)."""
        return any(thread.is_alive() and time.monotonic() < until for thread, until, _ in self._threads)

    def settle(self) -> None:
        """Name the nodes whose sweep is still under way past its limit."""
        for thread, _, name in self._threads:
            if thread.is_alive():
                self.unswept.setdefault(name, f"no answer within {self.grace + SWEEP_MARGIN:g} s")

    def lines(self, source: str) -> list[str]:
        """For each node whose part could not be stopped over a new channel: what to run, and when it stops anyway."""
        bound = self.heartbeat_timeout
        by_itself = (
            "it goes on until it ends"
            if bound is None
            else f"it stops by itself {bound:g} s after it last heard a launcher, unless one attaches"
        )
        return [
            f"{name}: its part of the run may still be running (stopping it over a new connection failed: "
            f"{why}); {by_itself}; run "
            f"`{hint(f'stop --hosts {source} --run {self.run_id}', stop_call(source, self.run_id))}` to stop it "
            "now"
            for name, why in sorted(self.unswept.items())
        ]
