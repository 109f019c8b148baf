"""The doctor's I/O: connect, run the probe (launcher/node/probe/probe.py) on every node at once, evaluate the answers.

`inv doctor` opens probe sessions of its own (`run_doctor`). A launch asks each node's one agent session to probe
instead (`DoctorGate`: `session_section` is what the agent is sent, `judge` decides before `go`). What each node is
sent: launcher.doctor.request.
"""

from __future__ import annotations

import dataclasses
import secrets
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from launcher.config.model import Cluster, Host, Job, SyncSpec
from launcher.doctor.checklist import evaluate, selected_checks
from launcher.doctor.evidence import Evidence, Outcome, ProbeFailed, Report
from launcher.doctor.request import connect_section, listen_request, probe_input, probe_request, session_section
from launcher.errors import DoctorFailed, NodeFailure
from launcher.node.wire import probe_answer
from launcher.parallel import parallel
from launcher.paths import hint
from launcher.run.gate import Before
from launcher.settings import DEFAULT_FANOUT, DEFAULT_PROBE_TIMEOUT, DEFAULT_SSH, Settings, SshSettings
from launcher.transport.channel import Result
from launcher.transport.connections import Node, close_all, connect_all
from launcher.transport.failures import classify
from launcher.transport.program import host_command

if TYPE_CHECKING:
    from launcher.events import NodeFacts

CheckMode = Literal["all", "fast"]


def local_script(cluster: Cluster) -> tuple[str, bool] | None:
    """Where the job's script is in the tree `launch --sync` sends from this machine (sync.src: the current folder,
    or the project's), and whether it is there; None for a job that is no script, a script given by an absolute
    path, or a sync into another folder than the workdir."""
    if cluster.job is None or cluster.job.form[0] != "script":
        return None
    script, spec = cluster.job.form[1], cluster.sync or SyncSpec()
    if spec.dest is not None or script.startswith(("/", "~")):
        return None
    path = (Path(spec.src).expanduser() / script).absolute()
    return str(path), path.is_file()


def _outcome(result: Result | NodeFailure) -> Outcome:
    if isinstance(result, NodeFailure):
        return result
    out, err = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
    answer = probe_answer(out)
    if answer is not None and (result.exit_code == 0 or "error" not in answer):  # a request it refused: exit 2
        return answer
    return ProbeFailed(result.exit_code, err[-2000:], out[-2000:])


def _start_listener(node: Node, cluster: Cluster, token: str, timeout: float) -> Any:
    """Open the master's listen-mode session; its stdin stays open until every probe has answered."""
    host = cluster.host(node.name)
    channel = node.open_channel(host_command(host))
    channel.send(probe_input(listen_request(cluster, token, timeout)))
    return channel


def _run_timed(
    nodes: Sequence[Node], commands: Mapping[str, str], inputs: Mapping[str, bytes], timeout: float
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
    found = parallel(one, nodes, DEFAULT_FANOUT)  # each probe bounded by `timeout`; Ctrl-C is not held by them
    return {
        n.name: r
        if isinstance(r, tuple)
        else (classify(n.target, r if isinstance(r, Exception) else TimeoutError("no answer")), 0.0)
        for n, r in zip(nodes, found, strict=True)
    }


def _probe_all(
    cluster: Cluster, nodes: Mapping[str, Node], checks: str, timeout: float
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
    inputs = {h.name: probe_input(probe_request(cluster, h, checks, connect, timeout)) for h in hosts}
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


def run_doctor(
    cluster: Cluster,
    nodes: Mapping[str, Node] | None = None,
    ssh: SshSettings = DEFAULT_SSH,
    checks: CheckMode = "all",
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
    gpus_in_use: bool = False,
) -> Report:
    """Probe every node (connecting to those not in `nodes`, and closing only those) and check the results.

    Two bounds, one per phase: `ssh.connect_timeout` for each SSH connection (a dead node fails within it), then
    `probe_timeout` for each probe's answer once sent (a hung one fails within it; a slow one is timed and warned).
    `gpus_in_use`: a running job's own nodes (`doctor --job`), whose busy GPUs are its run's.
    """
    start = time.monotonic()
    ours = {h.name for h in cluster.hosts}
    given = {name: node for name, node in (nodes or {}).items() if name in ours}
    missing = [h for h in cluster.hosts if h.name not in given]
    opened, failures = connect_all(cluster, missing, ssh) if missing else ({}, [])
    connected = time.monotonic()
    try:
        outcomes, times, listener, clock = _probe_all(cluster, {**given, **opened}, checks, probe_timeout)
    finally:
        close_all(opened.values())
    probed = time.monotonic()
    outcomes.update({f.host: f for f in failures})
    timings = {
        "connect_s": round(connected - start, 3),
        "probe_s": round(probed - connected, 3),
        "total_s": round(time.monotonic() - start, 3),
    }
    return _report(
        Evidence(cluster, outcomes, listener, clock, probe_timeout, times, gpus_in_use, local_script(cluster)),
        checks,
        timings,
    )


def _report(ev: Evidence, checks: CheckMode, timings: Mapping[str, float]) -> Report:
    """Evaluate the evidence; every host gets an outcome (one with none was never connected to)."""
    cluster, outcomes = ev.cluster, dict(ev.outcomes)
    for host in cluster.hosts:  # connect_all answers for every host; this only guards against surprises
        outcomes.setdefault(host.name, NodeFailure(host.name, "ssh", "no connection was made"))
    ev = dataclasses.replace(ev, outcomes=outcomes)
    errors = {
        h: str(o) if isinstance(o, NodeFailure) else f"probe exit {o.exit_code}: {o.last_line or 'no output'}"
        for h, o in outcomes.items()
        if not isinstance(o, dict)
    }
    return Report(
        source=cluster.source,
        hosts=tuple(h.name for h in cluster.hosts),
        checks=selected_checks(checks, cluster),
        findings=tuple(evaluate(ev, checks)),
        probes={h.name: o if isinstance(o := outcomes[h.name], dict) else None for h in cluster.hosts},
        errors=errors,
        listener=ev.listener,
        probe_times={h.name: ev.probe_times[h.name] for h in cluster.hosts if h.name in ev.probe_times},
        timings=dict(timings),
    )


def _session_outcome(host: str, facts: NodeFacts) -> Outcome:
    """One node's outcome from what its agent session said (`launcher.events.NodeFacts`)."""
    if facts.failure is not None:
        return NodeFailure(host, "ssh", facts.failure)
    if facts.probe is not None:
        return facts.probe if facts.tcp is None else {**facts.probe, "tcp": facts.tcp}
    if facts.timed_out:
        return ProbeFailed(-1)
    return ProbeFailed(facts.exit_code if facts.exit_code not in (None, 0) else 1, "\n".join(facts.messages))


@dataclass
class DoctorGate:
    """The doctor's fast checks for `launch`, inside each node's one agent session (a start gate: `RunIO.gate`).

    The agent probes before it says `ready` (the master holds master_port meanwhile), the launcher sends `tcp` once
    every node has answered, then `judge` looks at it all: `go` when every check passed, `abort` everywhere
    otherwise, so nothing starts anywhere (`launcher.run.handle.RunHandle.start`). Called with (cluster, nodes),
    it runs the same checks over probe sessions of their own instead.
    """

    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    """Seconds each node's probe has to answer, from sending its session's request to its `probed` event."""
    in_session: bool = True
    """The checks run in the agents' start sessions (`launcher.run.gate.StartGate`)."""
    ssh: SshSettings = DEFAULT_SSH
    """For the standalone form only: how the SSH connections it opens are made (the launch has its own)."""
    before: Before | None = None
    """What runs on the open connections before the sessions start (`launch --sync`: the code first)."""
    on_pass: Callable[[Report, float], None] | None = None
    """Told the report (warnings only) and the seconds the checks took, when they all passed."""
    full_report: bool = True
    """A failure's last line says where the full report is (not under SLURM: the doctor there needs the job)."""
    named_job: Job | None = None
    """The job the command line named over the inventory's: the full report's command names it too."""

    def __call__(self, cluster: Cluster, nodes: Mapping[str, Node]) -> Report:
        """The fast checks on open connections, over probe sessions of their own; raises DoctorFailed."""
        report = run_doctor(cluster, nodes, self.ssh, checks="fast", probe_timeout=self.probe_timeout)
        if not report.ok:
            raise DoctorFailed(report, self.more(cluster))
        return report

    def more(self, cluster: Cluster) -> str | None:
        """The failure's last line: the doctor's command on this inventory, with the job the command line named
        (`--script nope.py`: the one checked), or its call from the API."""
        if not self.full_report:
            return None
        form, value = self.named_job.form if self.named_job is not None else ("", "")
        job = f" --{form} {shlex.quote(value)}" if form else ""
        called = f"api.doctor({cluster.source!r}" + (f", {form}={value!r})" if form else ")")
        return f"the full report: `{hint(f'doctor --hosts {cluster.source}{job}', called)}`"

    def prepare(self, cluster: Cluster, nodes: dict[str, Node]) -> Mapping[str, float]:
        """Before the agents' sessions open: `before`, if any (when it was done on each node)."""
        return self.before(cluster, nodes) if self.before is not None else {}

    def node_section(self, cluster: Cluster, host: Host, run_id: str) -> dict[str, Any]:
        return session_section(cluster, host, run_id, self.probe_timeout)

    def with_before(self, before: Before) -> DoctorGate:
        return dataclasses.replace(self, before=before)

    def judge(
        self, cluster: Cluster, facts: Mapping[str, NodeFacts], clock: tuple[float, float], seconds: float
    ) -> Report:
        """The fast checks on what every agent session said; raises DoctorFailed when one fails."""
        outcomes = {name: _session_outcome(name, f) for name, f in facts.items()}
        master = facts.get(cluster.hosts[0].name)
        listener = master.listener if master is not None and master.probe is not None else None
        times = {name: f.took for name, f in facts.items() if f.took is not None}
        report = _report(
            Evidence(cluster, outcomes, listener, clock, self.probe_timeout, times, local_script=local_script(cluster)),
            "fast",
            {"probe_s": round(seconds, 3), "total_s": round(seconds, 3)},
        )
        if not report.ok:
            raise DoctorFailed(report, self.more(cluster))
        if self.on_pass is not None:
            self.on_pass(report, seconds)
        return report


default_gate = DoctorGate()
"""The fast checks with the default limits: called, over sessions of their own; as `RunIO.gate`, inside the
launch's agent sessions."""


def doctor_gate(settings: Settings, err: IO[str], named_job: Job | None = None) -> DoctorGate:
    """The doctor's fast checks inside launch's agent sessions; a line says they passed, with any warnings (a
    failure raises DoctorFailed, and nothing starts anywhere)."""

    def passed(report: Report, seconds: float) -> None:
        err.write(
            f"checked {len(report.checks)} things on {len(report.hosts)} node(s) in "
            f"{seconds:.1f}s: {', '.join(report.checks)} all passed "
            "(--skip-doctor skips)\n"
        )
        for found in report.problems:  # warnings only: a failure raised before this
            err.write(f"  warning: {found.host} {found.check}: {found.detail}\n")

    return DoctorGate(probe_timeout=settings.run.probe_timeout, ssh=settings.ssh, on_pass=passed, named_job=named_job)


def between_attempts(settings: Settings, doctor: bool = True) -> Callable[[Cluster], dict[str, str]]:
    """What `--retries` checks before each next attempt: the nodes that fail the doctor's fast checks (with
    `doctor` off, those that cannot be reached), each with why (`launcher.run.attempts.AttemptCheck`)."""

    def failing(cluster: Cluster) -> dict[str, str]:
        if not doctor:
            nodes, failures = connect_all(cluster, cluster.hosts, settings.ssh)
            close_all(nodes.values())
            return {f.host: str(f) for f in failures}
        report = run_doctor(cluster, ssh=settings.ssh, checks="fast", probe_timeout=settings.run.probe_timeout)
        out: dict[str, str] = {}
        for found in report.failures:
            out.setdefault(found.host, f"the doctor's {found.check} check failed: {found.detail}")
        return out

    return failing
