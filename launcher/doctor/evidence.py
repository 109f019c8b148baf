"""What the doctor's checks read (`Evidence`) and what they say (`Finding`, gathered in a `Report`): data only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from launcher.config.model import Cluster
from launcher.errors import NodeFailure

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True)
class Finding:
    """One check's verdict on one node."""

    host: str
    check: str
    """One of CHECKS."""
    status: Status
    detail: str
    """What was found, in a line."""
    fix: str = ""
    """What to do about it (empty when ok)."""
    note: bool = False
    """An ok worth a line under the table all the same (a `python:` that is a wrapper)."""


@dataclass(frozen=True)
class ProbeFailed:
    """The probe ran on the node but gave no answer: its exit code and the tail of its output."""

    exit_code: int
    """-1 when it did not finish in time (0: it ended well but printed no answer)."""
    stderr: str = ""
    stdout: str = ""

    @property
    def last_line(self) -> str:
        """Its last line of output (stderr's, else stdout's), or ""."""
        text = (self.stderr or self.stdout).strip()
        return text.splitlines()[-1] if text else ""


Outcome = dict[str, Any] | NodeFailure | ProbeFailed
"""Per node: the probe's JSON answer, why SSH failed, or why the probe failed."""


@dataclass(frozen=True)
class Evidence:
    """Everything the pure checks look at."""

    cluster: Cluster
    outcomes: Mapping[str, Outcome]
    """Host name -> outcome, for every host of the cluster."""
    listener: Mapping[str, Any] | None = None
    """The master's listen-mode answer ({"free": ...}), {"failed": why}, or None when none was started."""
    clock: tuple[float, float] | None = None
    """The controller's time.time() just before the probes were sent and just after the last answer."""
    probe_timeout: float | None = None
    """How long each probe had to answer (for the message of one that ran out of it, and the slow threshold)."""
    probe_times: Mapping[str, float] = field(default_factory=dict)
    """Host -> seconds from sending its probe to its answer (or to giving up on it), for every host probed."""
    gpus_in_use: bool = False
    """The nodes' GPUs are expected to be in use (`doctor --job` on a running job: its own run is on them): a busy
    GPU is said, not failed."""
    local_script: tuple[str, bool] | None = None
    """Where the job's script is in the tree `launch --sync` sends from this machine, and whether it is there (None:
    not a script job, or a sync to another folder than the workdir): what a node that lacks it can be given."""


@dataclass(frozen=True)
class Report:
    """What the doctor found: the findings, each node's probe data, and how long it took."""

    source: str
    """The inventory file."""
    hosts: tuple[str, ...]
    checks: tuple[str, ...]
    """The checks that were run, in column order."""
    findings: tuple[Finding, ...]
    probes: Mapping[str, dict[str, Any] | None]
    """Host -> the probe's answer (None when there is none; `errors` says why)."""
    errors: Mapping[str, str] = field(default_factory=dict)
    listener: Mapping[str, Any] | None = None
    probe_times: Mapping[str, float] = field(default_factory=dict)
    """Host -> seconds from sending its probe to its answer, or to giving up on it (absent: no connection)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """connect_s, probe_s, total_s (seconds, on the controller)."""
    net: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    """With --net: host -> busbw_gbps, latency_ms, links (Gbit/s to each neighbour), slow."""
    net_group: Mapping[str, Any] = field(default_factory=dict)
    """With --net: the whole group's all_reduce (backend, world, busbw_gbps, at_bytes, latency_ms, sizes)."""

    @property
    def ok(self) -> bool:
        """No check failed (warnings allowed)."""
        return not self.failures

    @property
    def failures(self) -> list[Finding]:
        """The failed findings, in order."""
        return [f for f in self.findings if f.status == "fail"]

    @property
    def problems(self) -> list[Finding]:
        """Failures and warnings, in order."""
        return [f for f in self.findings if f.status != "ok"]
