"""The start gate: what a launch does before `go` (`RunIO.gate`): work on the open connections, and checks that
run inside every node agent's start session (the doctor's fast checks, `launcher.doctor.collect.DoctorGate`),
driven by `launcher.run.handle`. When the gate raises, every agent is told `abort`, and nothing starts anywhere: no
run directory, no process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from launcher.config.model import Cluster, Host
from launcher.events import NodeFacts
from launcher.transport.connections import Node

Before = Callable[[Cluster, dict[str, Node]], Mapping[str, float]]
"""Work on the open connections before any session opens (`launch --sync`): when it was done on each node."""


@runtime_checkable
class StartGate(Protocol):
    """What a launch does before `go` (`RunIO.gate`): work on the open connections before any session opens
    (`launch --sync`), and, when `in_session`, checks that every node's agent runs in its start session (the
    doctor's: `DoctorGate`)."""

    @property
    def probe_timeout(self) -> float: ...
    @property
    def in_session(self) -> bool: ...

    def prepare(self, cluster: Cluster, nodes: dict[str, Node]) -> Mapping[str, float]:
        """Work on the open connections before any session opens (`launch --sync`): when it was done on each node
        (wall clock, for the run's page), empty when there was none."""

    def node_section(self, cluster: Cluster, host: Host, run_id: str) -> dict[str, Any] | None:
        """The start request's `gate` part for this host (None: the agent checks nothing before `ready`)."""

    def judge(
        self, cluster: Cluster, facts: Mapping[str, NodeFacts], clock: tuple[float, float], seconds: float
    ) -> Any:
        """Raise a LauncherError when nothing may start; return otherwise."""

    def with_before(self, before: Before) -> StartGate:
        """This gate, with `before` as its work on the open connections."""


@dataclass(frozen=True)
class ConnectionsFirst:
    """A start gate that only works on the open connections (`launch --sync --skip-doctor`): no checks in the
    agents' sessions."""

    before: Before | None = None
    probe_timeout: float = 0.0
    in_session: bool = False

    def prepare(self, cluster: Cluster, nodes: dict[str, Node]) -> Mapping[str, float]:
        return self.before(cluster, nodes) if self.before is not None else {}

    def node_section(self, cluster: Cluster, host: Host, run_id: str) -> dict[str, Any] | None:
        return None

    def with_before(self, before: Before) -> ConnectionsFirst:
        return replace(self, before=before)

    def judge(
        self, cluster: Cluster, facts: Mapping[str, NodeFacts], clock: tuple[float, float], seconds: float
    ) -> None:
        return None
