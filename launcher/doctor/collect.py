"""The doctor's I/O: connect, run the probe (launcher/probe.py) on every node at once, evaluate the answers."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any, Literal

from launcher.doctor.checks import evaluate, requested_names, selected_checks
from launcher.doctor.evidence import Evidence, Outcome, ProbeFailed, Report
from launcher.errors import DoctorFailed, NodeFailure
from launcher.inventory import Cluster, Host
from launcher.options import DEFAULT_CONNECT_TIMEOUT, DEFAULT_PROBE_TIMEOUT
from launcher.remote import host_command, program_input, python_command
from launcher.transport import Node, Result, classify, close_all, connect_all

CheckMode = Literal["all", "fast"]

PROBE_SOURCE = resources.files("launcher").joinpath("probe.py").read_text(encoding="utf-8")
"""The node side of the doctor: a stdlib-only script, sent to each node on its stdin."""
LISTEN_WINDOW_S = 3.0
"""How long a node keeps retrying a refused connection to the master's listener (which may still be starting)."""
TOKEN_READ_S = 2.0
"""How long a node waits for the listener's token once connected (no answer: something else listens there)."""
LISTENER_MARGIN_S = 5.0
"""The master's listener lives this much longer than the probes may take (it stops earlier when they have answered)."""

probe_command = python_command
"""The probe's command line on a node: its interpreter and the fixed bootstrap (`launcher.remote`)."""


def probe_input(request: Mapping[str, Any]) -> bytes:
    """The probe's source and its request, for its stdin."""
    return program_input(PROBE_SOURCE, request)


def probe_request(cluster: Cluster, host: Host, checks: str, connect: Mapping[str, Any] | None) -> dict[str, Any]:
    """What one node's probe is asked (pure)."""
    rdzv = cluster.rendezvous
    request: dict[str, Any] = {
        "mode": "probe", "checks": checks, "names": requested_names(cluster),
        "master_addr": rdzv.master_addr, "master_port": rdzv.master_port,
        "is_master": host.name == cluster.hosts[0].name, "workdir": host.workdir,
        "script": cluster.job.script if cluster.job else None,
    }
    visible = next((v.value for v in host.env if v.name == "CUDA_VISIBLE_DEVICES" and v.value is not None), None)
    if visible is not None:
        request["cuda_visible_devices"] = visible
    if connect:
        request["connect"] = dict(connect)
    return request


def _outcome(result: Result | NodeFailure) -> Outcome:
    if isinstance(result, NodeFailure):
        return result
    out, err = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
    if result.exit_code == 0:
        try:
            answer = json.loads(out.strip().splitlines()[-1])
            if isinstance(answer, dict):
                return answer
        except (ValueError, IndexError):
            pass
    return ProbeFailed(result.exit_code if result.exit_code != 0 else 1, err[-2000:], out[-2000:])


def listen_request(cluster: Cluster, token: str, timeout: float) -> dict[str, Any]:
    """What the master's listen-mode probe is asked (pure): it outlives the probes' `timeout` (probe_timeout) by a
    margin, so a slow node's TCP check still finds it."""
    return {"mode": "listen", "master_port": cluster.rendezvous.master_port, "token": token,
            "max_s": timeout + LISTENER_MARGIN_S}


def connect_section(token: str, timeout: float) -> dict[str, Any]:
    """The `connect` part of each probe's request (pure): every number its TCP check uses."""
    return {"token": token, "window": min(LISTEN_WINDOW_S, timeout / 2), "token_read_s": TOKEN_READ_S}


def _start_listener(node: Node, cluster: Cluster, token: str, timeout: float) -> Any:
    """Open the master's listen-mode session; its stdin stays open until every probe has answered."""
    host = cluster.host(node.name)
    channel = node.open_channel(host_command(host))
    channel.send(probe_input(listen_request(cluster, token, timeout)))
    return channel


def _run_timed(nodes: Sequence[Node], commands: Mapping[str, str], inputs: Mapping[str, bytes], timeout: float
               ) -> dict[str, tuple[Result | NodeFailure, float]]:
    """Run each node's probe, all at once; per node its result and the seconds from sending it to its answer."""

    def one(node: Node) -> tuple[Result | NodeFailure, float]:
        sent = time.monotonic()
        try:
            result: Result | NodeFailure = node.run(commands[node.name], inputs[node.name], timeout)
        except Exception as exc:  # the connection dropped: a typed failure, never a traceback
            result = classify(node.target, exc)
        return result, round(time.monotonic() - sent, 3)

    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=min(64, len(nodes))) as pool:
        return dict(zip([n.name for n in nodes], pool.map(one, nodes), strict=True))


def _probe_all(cluster: Cluster, nodes: Mapping[str, Node], checks: str, timeout: float
               ) -> tuple[dict[str, Outcome], dict[str, float], dict[str, Any] | None, tuple[float, float]]:
    """Every connected node's outcome and probe time, the master listener's answer, and the controller's clock."""
    master = cluster.hosts[0]
    token = secrets.token_hex(8)
    listener: dict[str, Any] | None = None
    channel = None
    if master.name in nodes:
        try:
            channel = _start_listener(nodes[master.name], cluster, token, timeout)
        except Exception as exc:  # the connection dropped: said as a port finding, never a traceback
            listener = {"failed": str(classify(nodes[master.name].target, exc))}
    connect = connect_section(token, timeout) if channel is not None else None
    hosts = [h for h in cluster.hosts if h.name in nodes]
    commands = {h.name: host_command(h) for h in hosts}
    inputs = {h.name: probe_input(probe_request(cluster, h, checks, connect)) for h in hosts}
    sent = time.time()
    try:
        results = _run_timed([nodes[h.name] for h in hosts], commands, inputs, timeout)
        received = time.time()
        if channel is not None:
            channel.close_stdin()  # every probe has answered: the listener can stop
            answer = _outcome(channel.collect(2.0))
            if isinstance(answer, dict):
                listener = answer
            elif isinstance(answer, ProbeFailed) and answer.exit_code not in (126, 127):
                listener = {"failed": (answer.stderr.strip().splitlines() or [f"exit {answer.exit_code}"])[-1]}
            # 126/127: the master's python is missing; its python finding says so.
    finally:
        if channel is not None:
            channel.close()
    outcomes = {h: _outcome(result) for h, (result, _) in results.items()}
    times = {h: took for h, (result, took) in results.items() if not isinstance(result, NodeFailure)}
    return outcomes, times, listener, (sent, received)


def run_doctor(cluster: Cluster, nodes: Mapping[str, Node] | None = None,
               connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, checks: CheckMode = "all",
               probe_timeout: float = DEFAULT_PROBE_TIMEOUT) -> Report:
    """Probe every node (connecting to those not in `nodes`, and closing only those) and check the results.

    Two bounds, one per phase: `connect_timeout` for each SSH connection (a dead node fails within it), then
    `probe_timeout` for each probe's answer once sent (a hung one fails within it; a slow one is timed and warned).
    """
    names = selected_checks(checks)
    start = time.monotonic()
    ours = {h.name for h in cluster.hosts}
    given = {name: node for name, node in (nodes or {}).items() if name in ours}
    missing = [h for h in cluster.hosts if h.name not in given]
    opened, failures = connect_all(cluster, missing, connect_timeout) if missing else ({}, [])
    connected = time.monotonic()
    try:
        outcomes, times, listener, clock = _probe_all(cluster, {**given, **opened}, checks, probe_timeout)
    finally:
        close_all(opened.values())
    probed = time.monotonic()
    outcomes.update({f.host: f for f in failures})
    for host in cluster.hosts:  # connect_all answers for every host; this only guards against surprises
        outcomes.setdefault(host.name, NodeFailure(host.name, "ssh", "no connection was made"))
    findings = evaluate(Evidence(cluster, outcomes, listener, clock, probe_timeout, times), checks)
    errors = {h: str(o) if isinstance(o, NodeFailure) else f"probe exit {o.exit_code}"
              for h, o in outcomes.items() if not isinstance(o, dict)}
    return Report(
        source=cluster.source,
        hosts=tuple(h.name for h in cluster.hosts),
        checks=names,
        findings=tuple(findings),
        probes={h.name: o if isinstance(o := outcomes[h.name], dict) else None for h in cluster.hosts},
        errors=errors,
        listener=listener,
        probe_times={h.name: times[h.name] for h in cluster.hosts if h.name in times},
        timings={"connect_s": round(connected - start, 3), "probe_s": round(probed - connected, 3),
                 "total_s": round(time.monotonic() - start, 3)},
    )


def preflight(cluster: Cluster, nodes: Mapping[str, Node], *, probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
              connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> Report:
    """The fast checks on the launch's open connections; raises DoctorFailed when one fails.

    Returns the report otherwise: its warnings (a slow node among them) are for the launch to show.
    """
    report = run_doctor(cluster, nodes, connect_timeout=connect_timeout, checks="fast", probe_timeout=probe_timeout)
    if not report.ok:
        raise DoctorFailed(report)
    return report
