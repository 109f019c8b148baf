"""`--pull` (launch, doctor): the container image pulled on every container host at once, before anything else, a
line for each node as its pull ends; the nodes whose pull failed, each with the runtime's own words (a launch then
starts nothing). The node side is launcher/node/probe/image.py's `pull`, under the host's own Python."""

from __future__ import annotations

import threading
from typing import IO

from launcher.config.model import Cluster, Host
from launcher.errors import NodeFailure, UsageError
from launcher.limits import PULL_MARGIN_S
from launcher.node.wire import probe_answer
from launcher.parallel import parallel
from launcher.settings import Settings
from launcher.transport.channel import Result
from launcher.transport.connections import Node, close_all, connect_all
from launcher.transport.failures import classify
from launcher.transport.program import host_command

NO_IMAGE = "--pull needs a container image on some node: the inventory's `container:` (defaults or a host), or --image"


def short_id(image_id: str | None) -> str:
    """`sha256:` and the first 12 hex digits (podman's ids have no prefix, docker's have)."""
    return "sha256:" + (image_id or "?").removeprefix("sha256:")[:12]


def pull_line(host: Host, image: str, outcome: Result | NodeFailure, timeout: float) -> tuple[str, str | None]:
    """A node's line once its pull of `image` ended, and why it failed (None: pulled)."""
    if isinstance(outcome, NodeFailure):
        why = f"{outcome.kind}: {outcome.detail}"
        return f"{host.name}: pull failed: {why}", why
    answer = probe_answer(outcome.stdout.decode("utf-8", "replace"))
    if answer is None or "pulled" not in answer:
        lines = outcome.stderr.decode("utf-8", "replace").strip().splitlines()
        why = (
            f"no answer within {timeout:g} s (pull_timeout)"
            if outcome.timed_out
            else (lines[-1] if lines else f"exit code {outcome.exit_code}")
        )
        return f"{host.name}: pull failed: {why}", why
    if not answer["pulled"]:
        why = str(answer.get("error") or "the runtime gave no reason")
        return f"{host.name}: pull failed: {why}", why
    return f"{host.name}: pulled {image} ({short_id(answer.get('id'))}) in {answer.get('seconds', 0.0):.1f} s", None


def pull_images(cluster: Cluster, settings: Settings, err: IO[str]) -> dict[str, str]:
    """Pull each container host's image on it, every node at once, each within pull_timeout; a line for each as it
    ends. The nodes whose pull failed, with why. A UsageError where no host runs in a container."""
    from launcher.doctor.request import probe_input, pull_request

    containers = {h.name: c for h in cluster.hosts if (c := h.container) is not None}
    if not containers:
        raise UsageError(NO_IMAGE)
    hosts = [cluster.host(name) for name in containers]
    timeout = settings.run.pull_timeout
    lock, failed = threading.Lock(), {}

    def said(host: Host, outcome: Result | NodeFailure) -> None:
        line, why = pull_line(host, containers[host.name].image, outcome, timeout)
        with lock:
            err.write(line + "\n")
            err.flush()
            if why is not None:
                failed[host.name] = why

    def pull(node: Node) -> None:
        host = cluster.host(node.name)
        request = probe_input(pull_request(containers[host.name], timeout))
        try:
            outcome: Result | NodeFailure = node.run(host_command(host), request, timeout + PULL_MARGIN_S)
        except Exception as exc:  # the connection dropped: a typed failure, never a traceback
            outcome = classify(node.target, exc)
        said(host, outcome)

    nodes, failures = connect_all(cluster, hosts, settings.ssh)
    try:
        for failure in failures:
            said(cluster.host(failure.host), failure)
        parallel(pull, list(nodes.values()), max(1, len(nodes)))  # every node at once: a pull is long, no waves
    finally:
        close_all(nodes.values())
    return {h.name: failed[h.name] for h in hosts if h.name in failed}


def pull_failed(failed: dict[str, str], what: str) -> str:
    """The one line that stops a launch (or fails the doctor) whose pull failed somewhere."""
    nodes = ", ".join(failed)
    return f"the image could not be pulled on {nodes} (the node's line above says why): {what}"
