"""What each task does, between parsing its options (tasks.py) and the core modules: load, plan, run, render."""

from __future__ import annotations

import datetime as _dt
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from launcher import errors
from launcher.config.hostfile import load_hosts
from launcher.config.model import DEFAULT_MASTER_PORT, Cluster, Job
from launcher.config.selection import select_hosts
from launcher.errors import LauncherError, UsageError
from launcher.options import Options
from launcher.paths import relative
from launcher.plan.commands import plan_launch
from launcher.run import attempts
from launcher.run import start as run_start
from launcher.run.gate import ConnectionsFirst
from launcher.transport.sessions import close_all, connect_all

if TYPE_CHECKING:  # each task imports what it alone uses (a launch: no rich, no doctor with --skip-doctor)
    from rich.console import Console
    from rich.table import Table

    from launcher.run import actions as run_actions
    from launcher.sandbox import Sandbox

USAGE = errors.USAGE
"""Exit code for wrong input on the command line (found before anything is contacted); tasks.py uses it too."""


@dataclass(frozen=True)
class Hosts:
    """Where a task's nodes come from: `--hosts`, what a hostfile takes from invoke.yaml, `--include`/`--exclude`."""

    path: str
    """An inventory (YAML, self-contained) or a DeepSpeed/MPI hostfile (`worker-1 slots=8`)."""
    defaults: Mapping[str, Any] | None = None
    """invoke.yaml's `launcher.defaults`, for a hostfile: any key a host may set, and
    `hostfile.HOSTFILE_SETTINGS` (how this machine reaches the nodes: ssh_config, host_key_policy)."""
    job: Mapping[str, Any] | None = None
    """invoke.yaml's `launcher.job`, for a hostfile; `--script`/`--args` replace it as they replace an inventory's."""
    include: str | None = None
    """`--include` in DeepSpeed's syntax (`worker-1:0,2@worker-2`): only these hosts (and GPUs)."""
    exclude: str | None = None
    """`--exclude`: every host but these (or without these GPUs)."""


def load_inventory(hosts: str | Hosts) -> Cluster:
    """The cluster every task works on: the inventory or hostfile, then the `--include`/`--exclude` choice.

    A wrong `--include`/`--exclude` is a `SelectionError` of one sentence naming the option and the host, exit code 2.
    """
    spec = hosts if isinstance(hosts, Hosts) else Hosts(hosts)
    cluster = load_hosts(spec.path, spec.defaults, spec.job)
    return select_hosts(cluster, spec.include, spec.exclude)  # SelectionError: the command line is wrong (exit 2)


def _job(cluster: Cluster, script: str | None, args: str | None) -> Job:
    """The inventory's job, with the script and/or arguments replaced from the command line."""
    base = cluster.job
    if script is None and base is None:
        raise LauncherError(f"{cluster.source}: no job to run: add a `job: {{script: ...}}` entry, or pass --script")
    try:
        words = tuple(shlex.split(args)) if args is not None else None
    except ValueError as exc:
        raise LauncherError(f"--args: cannot split {args!r}: {exc}") from None
    if base is None:
        return Job(script=str(script), args=words or ())
    return replace(base, script=script or base.script, args=base.args if words is None else words)


def launch(hosts: str | Hosts, *, script: str | None = None, args: str | None = None, dry_run: bool = False,
           doctor: bool = True, sync: bool = False, slurm: bool = False, opts: Options | None = None) -> int:
    cluster = load_inventory(hosts)
    opts = opts or Options()
    if slurm:  # the allocation's nodes, one srun step
        from launcher.slurm import commands as slurm_commands

        return slurm_commands.launch_slurm(cluster, _job(cluster, script, args), dry_run=dry_run, doctor=doctor,
                                     sync=sync, opts=opts)
    plan = plan_launch(cluster, _job(cluster, script, args))  # a PlanError names the inventory
    if dry_run:
        opts.out.write(plan.describe() + "\n")
        return 0
    if doctor and opts.preflight is None:
        from launcher.doctor.collect import launch_preflight

        opts.preflight = launch_preflight(opts)
    if sync:  # over the run's own connections, before the doctor's checks (its script check then passes)
        from launcher.sync import push as code_sync

        gate = opts.preflight or ConnectionsFirst()  # the doctor's checks, if on, run in the agents' sessions
        opts.preflight = replace(gate, before=code_sync.before_launch(cluster, opts.err,
                                                                      stall_timeout=opts.silence_timeout))
    retries = cluster.retries if opts.retries is None else opts.retries
    if retries and opts.detach:  # no launcher stays to start it again
        if opts.retries:
            raise UsageError("--retries needs an attached run: a detached run has no launcher to start it again")
        opts.err.write(f"note: {cluster.source}: retries: {retries} does not apply to a detached run\n")
        retries = 0
    if not retries:
        return run_start.launch_run(plan, opts)
    return attempts.launch_with_retries(plan, opts, retries, _health_check(opts, doctor))


def _health_check(opts: Options, doctor: bool) -> attempts.HealthCheck:
    """Between attempts: the nodes that fail the doctor's fast checks (or, with --skip-doctor, cannot be reached)."""

    def failing(cluster: Cluster) -> dict[str, str]:
        if not doctor:
            nodes, failures = connect_all(cluster, cluster.hosts, opts.connect_timeout)
            close_all(nodes.values())
            return {f.host: str(f) for f in failures}
        from launcher import doctor as doctor_checks

        report = doctor_checks.run_doctor(cluster, connect_timeout=opts.connect_timeout, checks="fast",
                                          probe_timeout=opts.probe_timeout)
        out: dict[str, str] = {}
        for found in report.failures:
            out.setdefault(found.host, f"the doctor's {found.check} check failed: {found.detail}")
        return out

    return failing


def sync(hosts: str | Hosts, opts: Options | None = None) -> int:
    """Make every node's workdir (or the inventory's sync.dest) hold this tree; 1 when a node could not be synced."""
    from launcher.sync import push as code_sync

    opts = opts or Options()
    return code_sync.sync_hosts(load_inventory(hosts), connect_timeout=opts.connect_timeout, out=opts.out,
                                stall_timeout=opts.silence_timeout)


def doctor(hosts: str | Hosts, *, as_json: bool = False, checks: str = "all", opts: Options | None = None,
           net: bool = False, slurm: bool = False, job: str | None = None) -> int:
    """Probe every node once, in parallel; print a table (or JSON) of findings; 1 when any check fails. With `net`,
    then measure the network between the nodes with the run's own backend (a `net` column). With `slurm` (in an
    allocation) or `job`, the allocation's nodes, each reached through a step of the job instead of SSH."""
    from launcher import doctor as doctor_checks

    opts = opts or Options()
    cluster = load_inventory(hosts)
    if slurm or job:
        from launcher.slurm import commands as slurm_commands

        report = slurm_commands.slurm_doctor(cluster, job, checks=checks, net=net, opts=opts)
    else:
        report = doctor_checks.run_doctor(cluster, connect_timeout=opts.connect_timeout, checks=checks,
                                          probe_timeout=opts.probe_timeout)
        if net:
            from launcher.doctor.net import with_net  # torchrun on every node: only when asked

            report = with_net(report, cluster, opts)
    if as_json:
        opts.out.write(doctor_checks.report_json(report) + "\n")
    else:
        doctor_checks.render_table(report, _console(opts))
    return 0 if report.ok else 1


def _console(opts: Options) -> Console:
    """A console on the task's output; wide enough for a table when it is a file or a pipe, not a terminal."""
    from rich.console import Console

    return Console(file=opts.out, width=None if opts.out.isatty() else 160)


def _when(ts: float | None) -> str:
    return _dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else ""


_COLOURS = {"running": "green", "exited": "cyan", "stopped": "yellow", "none": "dim",
            "unreachable": "red", "error": "red", "lost": "red"}


def _state_table(title: str, states: list[run_actions.NodeState], stop: bool) -> Table:
    """One row per node. Title and cells are `Text`: node names, run ids and states come from users and nodes,
    and a `[/]` in them must print as it is, never be read as Rich markup."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title), title_justify="left")
    for column in ("node", "run", "state", "exit", "started", "ended", *(("stopped", "left") if stop else ())):
        table.add_column(column)
    for s in states:
        cells = [s.host, s.run_id or "", s.state, "" if s.exit_code is None else s.exit_code, _when(s.started_at),
                 _when(s.ended_at), *((s.found, s.left) if stop else ())]
        row = [Text(str(cell)) for cell in cells]
        row[2].stylize(_COLOURS.get(str(s.state), "white"))
        table.add_row(*row)
    return table


def _problems(console: Console, states: list[run_actions.NodeState]) -> None:
    for s in states:
        if s.detail:
            console.print(f"{s.host}: {s.detail}", markup=False, highlight=False)


def status(hosts: str | Hosts, run_id: str | None = None, opts: Options | None = None) -> int:
    from launcher.report.hangs import latest_answer
    from launcher.run import actions as run_actions
    from launcher.run.stragglers import stragglers_of

    cluster = load_inventory(hosts)
    states = run_actions.status(cluster, run_id, opts)
    console = _console(opts or Options())
    shown = run_id or next((s.run_id for s in states if s.run_id), None)
    console.print(_state_table(f"run {shown or '(none)'} on {len(states)} node(s)", states, stop=False))
    _problems(console, states)
    hang = latest_answer((opts or Options()).log_dir, shown) if shown else None
    if hang is not None:
        console.print(f"last {hang}", markup=False, highlight=False)
    for line in stragglers_of((opts or Options()).log_dir, shown) if shown else []:
        console.print(line, markup=False, highlight=False)
    tried = attempts.read_attempts((opts or Options()).log_dir, shown) if shown else []
    if len(tried) > 1:
        console.print(f"run {shown} is one of {len(tried)} attempts of a launch (--retries):", markup=False,
                      highlight=False)
        for attempt in tried:
            console.print(f"  {attempt.line()}", markup=False, highlight=False)
    return 1 if any(s.state in ("unreachable", "error") for s in states) else 0


def stop(hosts: str | Hosts, run_id: str | None = None, opts: Options | None = None) -> int:
    from launcher.run import actions as run_actions

    cluster = load_inventory(hosts)
    states = run_actions.stop(cluster, run_id, opts)
    console = _console(opts or Options())
    if all(s.found == 0 and s.state not in ("unreachable", "error") for s in states):
        console.print(f"nothing was running on {len(states)} node(s)"
                      + (f" (run {states[0].run_id})" if states and states[0].run_id else ""),
                      markup=False, highlight=False)
    else:
        shown = run_id or next((s.run_id for s in states if s.run_id), None)
        console.print(_state_table(f"stop run {shown or '(none)'}", states, stop=True))
    _problems(console, states)
    left = sum(s.left for s in states)
    if left:
        console.print(f"[red]{left} process(es) of the run could not be killed[/]")
    return 1 if left or any(s.state in ("unreachable", "error") for s in states) else 0


def logs(hosts: str | Hosts, run_id: str | None = None, node: str | None = None, rank: int | None = None,
         follow: bool = False, opts: Options | None = None) -> int:
    from launcher.run import actions as run_actions

    return run_actions.logs(load_inventory(hosts), run_id, node=node, rank=rank, follow=follow, opts=opts)


def stacks(hosts: str | Hosts, run_id: str | None = None, opts: Options | None = None, job: str | None = None) -> int:
    """Every rank's stack of a running run, grouped, and kept under logs/<run id>/; 1 when no node answered.
    With `job`, the run inside that SLURM batch job, reached through the job's own steps."""
    opts = opts or Options()
    if job:
        from launcher.slurm import commands as slurm_commands

        report = slurm_commands.job_stacks(job, load_inventory(hosts), run_id, opts)
    else:
        from launcher.run.stacks import collect_stacks

        report = collect_stacks(load_inventory(hosts), run_id, opts)
    for line in report.lines():
        opts.out.write(line + "\n")
    return 0 if report.stacks else 1


def top(hosts: str | Hosts, run_id: str | None = None, opts: Options | None = None, *, once: bool = False,
        as_json: bool = False, job: str | None = None) -> int:
    """Every node and rank of a running run at once: live (q quits, the run goes on), or one look (`once`)."""
    from launcher.run import topview  # rich's Live and the terminal: only this task needs them

    opts = opts or Options()
    cluster = load_inventory(hosts)
    if job:
        from launcher.slurm import commands as slurm_commands

        cluster, nodes = slurm_commands.job_nodes(job, cluster, opts)
        return topview.top(cluster, run_id, opts, once=once, as_json_too=as_json, nodes=nodes)
    return topview.top(cluster, run_id, opts, once=once, as_json_too=as_json)


def sandbox_up(nodes: int, nproc_per_node: int = 1, master_port: int = DEFAULT_MASTER_PORT,
               slurm: bool = False) -> Sandbox:
    from launcher import sandbox  # a test and demo tool: off the import path of every other task

    box = sandbox.up(nodes, nproc_per_node=nproc_per_node, master_port=master_port, slurm=slurm)
    print(f"sandbox: {len(box.nodes)} sshd node(s) up "
          f"({', '.join(f'{n.name}={n.addr}:{n.port}' for n in box.nodes)}); inventory {relative(box.inventory)}")
    if box.slurm_conf is None:
        print(f"try: inv launch --hosts {relative(box.inventory)}    (and `inv sandbox.down` when done)")
        return box
    print(f"sandbox: SLURM cluster up (slurmctld, a slurmd on each node, partition main); config {box.slurm_conf}")
    # SLURM's commands find this cluster only through SLURM_CONF: the shell that runs them needs it.
    print(f"try: export SLURM_CONF={shlex.quote(str(box.slurm_conf))}; "
          f"salloc -N {len(box.nodes)} inv launch --slurm --hosts {relative(box.inventory)}"
          "    (and `inv sandbox.down` when done)")
    return box


def sandbox_down() -> None:
    from launcher import sandbox

    for line in sandbox.down():
        print(line)


def demo() -> int:
    """Bring up 2 sshd nodes x 2 processes, train the reference DDP program on them, always bring them down."""
    box = sandbox_up(2, nproc_per_node=2)
    try:
        return launch(str(box.inventory), script="train/ddp.py", args="--epochs 2")
    finally:
        sandbox_down()


def main_error(exc: LauncherError) -> tuple[str, int]:
    """The message and exit code a task shows for a launcher error (one sentence, no traceback)."""
    return str(exc), getattr(exc, "exit_code", 1) or 1


__all__ = ["Hosts", "demo", "doctor", "launch", "load_inventory", "logs", "main_error", "sandbox_down", "sandbox_up",
           "stacks", "status", "stop", "sync", "top"]
