"""What the Python API (`launcher.api`) returns: typed results of a run, its nodes, `top`'s snapshot and the run's
page, each a frozen value made from what the commands found."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from launcher.errors import RunFailed
from launcher.events import NodeEnd


@dataclass(frozen=True)
class NodeResult:
    """How one node's part of a run ended."""

    node: str
    state: str
    """An attached run's `launcher.events.EndKind` (exited, lost, silent, ...); a detached run's agent state
    (exited, stopped, lost, unreachable, ...)."""
    exit_code: int | None
    """torchrun's exit code on the node, when it exited."""
    end: NodeEnd | None = None
    """An attached run's whole record of the node's end (its last lines, errors, who asked it to stop)."""


@dataclass(frozen=True)
class RunResult:
    """A run's end: every node's, the root cause of a failure, where its logs are."""

    run_id: str
    ok: bool
    """Every node's part ended well (an elastic run that went on without a lost node too)."""
    exit_code: int
    """What `ddpl launch` exits with: 0, or the failed rank's code (124 for a hang the launcher stopped)."""
    nodes: tuple[NodeResult, ...]
    logs: Path
    """The controller's copy of each node's output: <log_dir>/<run id>/<node>.log (an attached run's)."""
    root_cause: str | None = None
    """The failure's report (the first failing node and rank, its exit code, its last lines), as the console says."""
    failed_node: str | None = None
    failed_rank: int | None = None
    error: RunFailed | None = field(default=None, repr=False)

    def check(self) -> RunResult:
        """This result, or its `RunFailed` raised when the run failed."""
        if self.error is not None:
            raise self.error
        if not self.ok:
            raise RunFailed(self.root_cause or f"run {self.run_id} failed", self.exit_code or 1, node=self.failed_node)
        return self


@dataclass(frozen=True)
class NodeTop:
    """One node in `Run.top()` (`ddpl top --once --json`'s `nodes`)."""

    node: str
    reachable: bool
    problem: str | None = None
    load1: float | None = None
    cpus: int | None = None
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    gpus: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True)
class RankTop:
    """One rank in `Run.top()` (`ddpl top --once --json`'s `ranks`); `data` holds every field as the JSON has it."""

    node: str
    rank: int
    local_rank: int | None = None
    pid: int | None = None
    state: str | None = None
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    last_output_s: float | None = None
    steps_per_s: float | None = None
    step: int | None = None
    steps: int | None = None
    batches: int | None = None
    forward_share: float | None = None
    data_share: float | None = None
    last_line: str | None = None
    straggler: bool = False
    straggler_by: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class TopSnapshot:
    """One look at every node and rank of a running run."""

    run_id: str
    nodes: tuple[NodeTop, ...]
    ranks: tuple[RankTop, ...]

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> TopSnapshot:
        """From `ddpl top --once --json`'s object (fields it has beyond these stay in each rank's `data`)."""
        nodes = tuple(
            _pick(NodeTop, {**n, "gpus": None if n.get("gpus") is None else tuple(n["gpus"])})
            for n in data.get("nodes", [])
        )
        return cls(data["run"], nodes, tuple(_pick(RankTop, {**r, "data": r}) for r in data.get("ranks", [])))


@dataclass(frozen=True)
class RunPage:
    """A run's page as `Run.report()` wrote it."""

    path: Path
    """logs/<run id>/report.html"""
    headline: str
    """`command -> first optimizer step on every rank: 41.2 s; the slowest node, ...`, or why there is no figure."""
    first_step_s: float | None
    summary: Mapping[str, Any]
    """What `ddpl report --json` says: the start's phases, the ranks, the marks, each node's end."""


T = TypeVar("T")


def _pick(kind: type[T], row: Mapping[str, Any]) -> T:
    return kind(**{f.name: row[f.name] for f in fields(kind) if f.name in row})  # type: ignore[arg-type]
