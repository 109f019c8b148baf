"""What the doctor sends each node (pure): the probe's program, its request, the master listener's, the TCP check's
numbers, and the `gate` section of a launch's start request that asks an agent for the same."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.config.model import Cluster, Container, Host
from launcher.doctor.checks_net import requested_names
from launcher.limits import (
    LISTEN_WINDOW_S,
    LISTENER_MARGIN_S,
    NVIDIA_SMI_TIMEOUT_S,
    RESOLVE_WORKERS,
    SMI_SHARE,
    TOKEN_READ_S,
)
from launcher.plan.containerplan import container_request
from launcher.settings import DEFAULT_PROBE_TIMEOUT
from launcher.transport.program import BOOTSTRAP, node_program, program_input, program_line, python_command

PROBE_SOURCE = node_program("probe.probe")
"""The node side of the doctor: a stdlib-only script, sent to each node on its stdin."""
IMAGE_SOURCE = node_program("probe.image")
"""A container host's side of it: the runtime and the image, then PROBE_SOURCE inside the image."""

probe_command = python_command
"""The probe's command line on a node: its interpreter and the fixed bootstrap (`launcher.transport.program`)."""


def probe_input(request: Mapping[str, Any]) -> bytes:
    """The probe's source (a container host's: the image's look, which runs the probe inside) and its request, for
    its stdin."""
    return program_input(IMAGE_SOURCE if request.get("mode") in ("image", "pull") else PROBE_SOURCE, request)


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
    return request if host.container is None else image_request(host, host.container, request, timeout)


def image_request(host: Host, container: Container, probe: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    """What a container host's look at its image is asked (pure; launcher/node/probe/image.py): the image and how to
    run it (the setup lines as the image's shell runs them, when there are any), the probe's program and request
    for inside it, the interpreter's words there; the TCP check (`connect`) stays on the host. `timeout`: all of it,
    the runtime's questions and the probe in the image (probe_timeout)."""
    spec = container_request(container, host.setup)
    if not host.setup:
        del spec["script"]  # the probe's python is the container's command itself
    inner = {key: value for key, value in probe.items() if key != "connect"}
    request: dict[str, Any] = {
        "mode": "image",
        "container": spec,
        "workdir": host.workdir,
        "python_argv": [host.python, "-S", "-c", BOOTSTRAP],
        "program": program_line(PROBE_SOURCE),
        "probe": inner,
        "timeout_s": timeout,
    }
    if "connect" in probe:
        request["connect"] = dict(probe["connect"])
    return request


def pull_request(container: Container, timeout: float) -> dict[str, Any]:
    """What `--pull` asks a container host (pure): its runtime pulls the image within `timeout` (pull_timeout)."""
    return {"mode": "pull", "container": container_request(container, ()), "timeout_s": timeout}


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
