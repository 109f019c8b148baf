"""What the doctor sends each node (pure): the probe's program, its request, the master listener's, the TCP check's
numbers, and the `gate` section of a launch's start request that asks an agent for the same."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.config.model import Cluster, Host
from launcher.doctor.checks_net import requested_names
from launcher.limits import (
    LISTEN_WINDOW_S,
    LISTENER_MARGIN_S,
    NVIDIA_SMI_TIMEOUT_S,
    RESOLVE_WORKERS,
    SMI_SHARE,
    TOKEN_READ_S,
)
from launcher.settings import DEFAULT_PROBE_TIMEOUT
from launcher.transport.program import node_program, program_input, python_command

PROBE_SOURCE = node_program("probe.probe")
"""The node side of the doctor: a stdlib-only script, sent to each node on its stdin."""

probe_command = python_command
"""The probe's command line on a node: its interpreter and the fixed bootstrap (`launcher.transport.program`)."""


def probe_input(request: Mapping[str, Any]) -> bytes:
    """The probe's source and its request, for its stdin."""
    return program_input(PROBE_SOURCE, request)


def probe_request(
    cluster: Cluster, host: Host, checks: str, connect: Mapping[str, Any] | None, timeout: float = DEFAULT_PROBE_TIMEOUT
) -> dict[str, Any]:
    """What one node's probe is asked (pure), `timeout` its probe_timeout: nvidia-smi gets its bound, or a share of
    the probe's time when that is short, so the probe still answers and says nvidia-smi did not (a probe cut off
    would read as a python that hangs at start)."""
    rdzv = cluster.rendezvous
    request: dict[str, Any] = {
        "mode": "probe",
        "checks": checks,
        "names": requested_names(cluster),
        "resolve_workers": RESOLVE_WORKERS,
        "master_addr": rdzv.master_addr,
        "master_port": rdzv.master_port,
        "is_master": host.name == cluster.hosts[0].name,
        "workdir": host.workdir,
        "python": host.python,
        "gpu_timeout_s": min(NVIDIA_SMI_TIMEOUT_S, timeout * SMI_SHARE),
    }
    request.update(job_request(cluster, host))
    if host.gpus is not None:  # --include host:0,2: among the GPUs the node shows (its own CUDA_VISIBLE_DEVICES)
        request["gpus"] = list(host.gpus)
    visible = next((v.value for v in host.env if v.name == "CUDA_VISIBLE_DEVICES" and v.value is not None), None)
    if visible is not None:
        request["cuda_visible_devices"] = visible
    if connect:
        request["connect"] = dict(connect)
    return request


def job_request(cluster: Cluster, host: Host) -> dict[str, Any]:
    """What a probe is asked of the job that will run (pure): its form and value (`{"module": "pkg.train"}`), and the
    PATH and PYTHONPATH the inventory sets for it on `host`, where the probe looks for its command or module."""
    if cluster.job is None:
        return {}
    form, value = cluster.job.form
    paths = {v.name: v.value for v in host.env if v.name in ("PATH", "PYTHONPATH") and v.value is not None}
    return {form: value, **({"job_env": paths} if paths else {})}


def listen_request(cluster: Cluster, token: str, timeout: float) -> dict[str, Any]:
    """What the master's listen-mode probe is asked (pure): it outlives the probes' `timeout` (probe_timeout) by a
    margin, so a slow node's TCP check still finds it."""
    return {
        "mode": "listen",
        "master_port": cluster.rendezvous.master_port,
        "token": token,
        "max_s": timeout + LISTENER_MARGIN_S,
    }


def connect_section(token: str, timeout: float) -> dict[str, Any]:
    """The `connect` part of each probe's request (pure): every number its TCP check uses."""
    return {"token": token, "window": min(LISTEN_WINDOW_S, timeout / 2), "token_read_s": TOKEN_READ_S}


def session_token(run_id: str) -> str:
    """What the master's agent answers every connection with during a launch's check: this run's own words."""
    return f"ddp-launcher {run_id}"


def session_section(cluster: Cluster, host: Host, run_id: str, timeout: float) -> dict[str, Any]:
    """The `gate` part of a launch's start request for `host` (pure): every request and
    number the agent needs to probe, to hold the master's listener (master only) and to connect to it."""
    token = session_token(run_id)
    section: dict[str, Any] = {
        "probe": probe_request(cluster, host, "fast", None, timeout),
        "connect": connect_section(token, timeout),
    }
    if host.name == cluster.hosts[0].name:
        section["listen"] = listen_request(cluster, token, timeout)
    return section
