"""The application layer: what each task does, between parsing its options (tasks.py) and the core modules: load,
plan, run, render. Every task comes through here, its SLURM forms too (`--slurm`, `--job`: `launcher.app.slurm`);
nothing below imports it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.app.job import JobWords, job_of
from launcher.config.hostfile import DEFAULTS_SOURCE, load_hosts
from launcher.config.model import Cluster, SyncSpec
from launcher.config.selection import select_hosts
from launcher.errors import LauncherError, UsageError
from launcher.options import DEFAULT_MASTER_PORT, Options
from launcher.paths import command_name, relative
from launcher.plan.launch import plan_launch
from launcher.run import attempts
from launcher.run import launch as run_launch
from launcher.run.gate import ConnectionsFirst
from launcher.run.wiring import Wiring
from launcher.transport.settings import SshSettings

if TYPE_CHECKING:  # each task imports what it alone uses (a launch: no rich, no doctor with --skip-doctor)
    from launcher.doctor.evidence import Report

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
    project: Path | None = None
    """The user's project (the installed command's: `launcher.project.find_root`): a relative `sync.src` starts
    there, and a submitted SLURM job; None: the current folder, and this checkout."""
    defaults_source: str = DEFAULTS_SOURCE
    """The settings file `defaults` and `job` come from, as messages name it."""


def load_inventory(hosts: str | Hosts) -> Cluster:
    """The cluster every task works on: the inventory or hostfile, then the `--include`/`--exclude` choice.

    A wrong `--include`/`--exclude` is a `SelectionError` of one sentence naming the option and the host, exit code 2.
    """
    spec = hosts if isinstance(hosts, Hosts) else Hosts(hosts)
    cluster = load_hosts(spec.path, spec.defaults, spec.job, spec.defaults_source)
    return select_hosts(cluster, spec.include, spec.exclude)  # SelectionError: the command line is wrong (exit 2)


def _project_tree(cluster: Cluster, hosts: str | Hosts) -> Cluster:
    """The cluster whose `sync` sends the project's tree wherever in the project the command was run: a relative
    `sync.src` (default `.`) starts at the installed command's project root."""
    project = hosts.project if isinstance(hosts, Hosts) else None
    if project is None:
        return cluster
    spec = cluster.sync or SyncSpec()
    return replace(cluster, sync=replace(spec, src=str(project / Path(spec.src).expanduser())))


def launch(hosts: str | Hosts, job: JobWords | None = None, *, dry_run: bool = False, doctor: bool = True,
           sync: bool = False, slurm: bool = False, opts: Options | None = None, wiring: Wiring | None = None,
           run_id: str | None = None) -> int:
    """Start the job on every node at once (with `slurm`: on the allocation's nodes, one srun step). `run_id`: the
    run's id (default: a new one), which a caller may need before the run ends (`launcher.api`)."""
    cluster = load_inventory(hosts)
    opts, wiring = opts or Options(), wiring or Wiring()
    if slurm:
        from launcher.app import slurm as on_slurm

        return on_slurm.launch_slurm(cluster, job_of(cluster, job or JobWords()), dry_run=dry_run, doctor=doctor,
                                     sync=sync, opts=opts, wiring=wiring)
    plan = plan_launch(cluster, job_of(cluster, job or JobWords()), run_id,  # a PlanError names the inventory
                       hang_timeout=opts.hang_timeout, retries=opts.retries)
    if dry_run:
        from launcher.plan.request import shown_request

        wiring.out.write("\n".join([plan.dry_run_text(), "", *shown_request(plan, opts)]) + "\n")
        return 0
    if doctor and wiring.gate is None:
        from launcher.doctor.collect import doctor_gate

        wiring = replace(wiring, gate=doctor_gate(opts, wiring.err))
    if sync:  # over the run's own connections, before the doctor's checks (its script check then passes)
        from launcher.sync import push as code_sync

        gate = wiring.gate or ConnectionsFirst()  # the doctor's checks, if on, run in the agents' sessions
        before = code_sync.before_launch(_project_tree(plan.cluster, hosts), wiring.err,
                                         stall_timeout=opts.silence_timeout, outputs=(opts.log_dir,))
        wiring = replace(wiring, gate=replace(gate, before=before))
    if plan.retries and opts.detach:  # no launcher stays to start it again
        if opts.retries:
            raise UsageError("--retries needs an attached run: a detached run has no launcher to start it again")
        wiring.err.write(f"note: {cluster.source}: retries: {plan.retries} does not apply to a detached run\n")
        plan = replace(plan, retries=0)
    if not plan.retries:
        return run_launch.launch_run(plan, opts, wiring)
    from launcher.doctor.collect import between_attempts

    return attempts.launch_with_retries(plan, opts, wiring, plan.retries, between_attempts(opts, doctor))


def sync(hosts: str | Hosts, opts: Options | None = None, wiring: Wiring | None = None) -> int:
    """Make every node's workdir (or the inventory's sync.dest) hold this tree; 1 when a node could not be synced."""
    from launcher.sync import push as code_sync

    opts, wiring = opts or Options(), wiring or Wiring()
    return code_sync.sync_hosts(_project_tree(load_inventory(hosts), hosts), ssh=SshSettings.of(opts), out=wiring.out,
                                stall_timeout=opts.silence_timeout, outputs=(opts.log_dir,))


def doctor(hosts: str | Hosts, *, as_json: bool = False, checks: str = "all", opts: Options | None = None,
           net: bool = False, slurm: bool = False, job: str | None = None, wiring: Wiring | None = None,
           net_all_gpus: bool = False, words: JobWords | None = None) -> int:
    """Probe every node once, in parallel; print a table (or JSON) of findings; 1 when any check fails. With `net`,
    then measure the network between the nodes with the run's own backend (a `net` column; with `net_all_gpus` one
    rank a GPU). With `slurm` (in an allocation) or `job`, the allocation's nodes, each reached through a step of the
    job instead of SSH. `words`: the job to check, as launch's --script, --module or --command name it."""
    from launcher import doctor as doctor_checks
    from launcher.report.states import console

    wiring = wiring or Wiring()
    report = doctor_report(hosts, checks=checks, opts=opts, net=net, slurm=slurm, job=job, wiring=wiring,
                           net_all_gpus=net_all_gpus, words=words)
    if as_json:
        wiring.out.write(doctor_checks.report_json(report) + "\n")
    else:
        doctor_checks.render_table(report, console(wiring.out))
    return 0 if report.ok else 1


def doctor_report(hosts: str | Hosts, *, checks: str = "all", opts: Options | None = None, net: bool = False,
                  slurm: bool = False, job: str | None = None, wiring: Wiring | None = None,
                  net_all_gpus: bool = False, words: JobWords | None = None) -> Report:
    """The doctor's findings on every node (what `doctor` prints): `launcher.doctor.evidence.Report`; the job checked
    is the one `words` name, else the inventory's."""
    from launcher import doctor as doctor_checks

    opts, wiring = opts or Options(), wiring or Wiring()
    cluster = load_inventory(hosts)
    if words is not None and words.given() is not None:
        cluster = replace(cluster, job=job_of(cluster, words))
    if slurm or job:
        from launcher.app import slurm as on_slurm

        return on_slurm.slurm_doctor(cluster, job, checks=checks, net=net, opts=opts, wiring=wiring,
                                     all_gpus=net_all_gpus)
    report = doctor_checks.run_doctor(cluster, ssh=SshSettings.of(opts), checks=checks,
                                      probe_timeout=opts.probe_timeout)
    if net:
        from launcher.doctor.net import with_net  # torchrun on every node: only when asked

        report = with_net(report, cluster, opts, all_gpus=net_all_gpus)
    return report


def status(hosts: str | Hosts, run_id: str | None = None, opts: Options | None = None, *, job: str | None = None,
           wiring: Wiring | None = None) -> int:
    """Per node: the run's state, exit code and times, and what the launcher kept about it (a hang's answer,
    stragglers, attempts); with `job`, a SLURM batch job's state."""
    opts, wiring = opts or Options(), wiring or Wiring()
    run_launch.check_run_id(run_id)  # a usage error before any node is contacted
    if job:
        from launcher.app import slurm as on_slurm

        return on_slurm.job_status(job, opts, wiring)
    from launcher.report.hangs import latest_answer
    from launcher.report.states import console, problems, say, state_table
    from launcher.run import control as run_control
    from launcher.watch.straggler import stragglers_of

    states = run_control.status(load_inventory(hosts), run_id, opts, wiring=wiring)
    con = console(wiring.out)
    shown = run_id or next((s.run_id for s in states if s.run_id), None)
    con.print(state_table(f"run {shown or '(none)'} on {len(states)} node(s)", states, stop=False))
    problems(con, states)
    hang = latest_answer(opts.log_dir, shown) if shown else None
    if hang is not None:
        say(con, f"last {hang}")
    for line in stragglers_of(opts.log_dir, shown) if shown else []:
        say(con, line)
    tried = attempts.read_attempts(opts.log_dir, shown) if shown else []
    if len(tried) > 1:
        say(con, f"run {shown} is one of {len(tried)} attempts of a launch (--retries):")
        for attempt in tried:
            say(con, f"  {attempt.line()}")
    return 1 if any(s.state in ("unreachable", "error") for s in states) else 0


def stop(hosts: str | Hosts, run_id: str | None = None, opts: Options | None = None, *, job: str | None = None,
         wiring: Wiring | None = None) -> int:
    """Stop a run on every node (TERM, grace, KILL) and say what was left; with `job`, scancel a SLURM job."""
    opts, wiring = opts or Options(), wiring or Wiring()
    run_launch.check_run_id(run_id)  # a usage error before any node is contacted
    if job:
        from launcher.app import slurm as on_slurm

        return on_slurm.job_stop(job, opts, wiring)
    from launcher.report.states import console, problems, say, state_table
    from launcher.run import control as run_control

    states = run_control.stop(load_inventory(hosts), run_id, opts, wiring=wiring)
    con = console(wiring.out)
    if all(s.found == 0 and s.state not in ("unreachable", "error") for s in states):
        say(con, f"nothing was running on {len(states)} node(s)"
            + (f" (run {states[0].run_id})" if states and states[0].run_id else ""))
    else:
        shown = run_id or next((s.run_id for s in states if s.run_id), None)
        con.print(state_table(f"stop run {shown or '(none)'}", states, stop=True))
    problems(con, states)
    left = sum(s.left for s in states)
    if left:
        con.print(f"[red]{left} process(es) of the run could not be killed[/]")
    return 1 if left or any(s.state in ("unreachable", "error") for s in states) else 0


def logs(hosts: str | Hosts, run_id: str | None = None, node: str | None = None, rank: int | None = None,
         follow: bool = False, opts: Options | None = None, *, job: str | None = None,
         wiring: Wiring | None = None) -> int:
    """Replay a run's log from its nodes (with `follow`, until it ends); with `job`, a SLURM job's output file."""
    opts, wiring = opts or Options(), wiring or Wiring()
    run_launch.check_run_id(run_id)  # a usage error before any node is contacted
    if job:
        from launcher.app import slurm as on_slurm

        return on_slurm.job_logs(job, follow, opts, wiring)
    from launcher.run import control as run_control

    return run_control.logs(load_inventory(hosts), run_id, node=node, rank=rank, follow=follow, opts=opts,
                            wiring=wiring)


def stacks(hosts: str | Hosts, run_id: str | None = None, opts: Options | None = None, job: str | None = None,
           wiring: Wiring | None = None) -> int:
    """Every rank's stack of a running run, grouped, and kept under logs/<run id>/; 1 when no node answered.
    With `job`, the run inside that SLURM batch job, reached through the job's own steps."""
    opts, wiring = opts or Options(), wiring or Wiring()
    run_launch.check_run_id(run_id)  # a usage error before any node is contacted
    if job:
        from launcher.app import slurm as on_slurm

        report = on_slurm.job_stacks(job, load_inventory(hosts), run_id, opts, wiring)
    else:
        from launcher.run.takestacks import collect_stacks

        report = collect_stacks(load_inventory(hosts), run_id, opts, wiring.err)
    for line in report.lines():
        wiring.out.write(line + "\n")
    return 0 if report.stacks else 1


def top(hosts: str | Hosts, run_id: str | None = None, opts: Options | None = None, *, once: bool = False,
        as_json: bool = False, job: str | None = None, wiring: Wiring | None = None) -> int:
    """Every node and rank of a running run at once: live (q quits, the run goes on), or one look (`once`)."""
    from launcher.run import topfeed as run_top

    opts, wiring = opts or Options(), wiring or Wiring()
    run_launch.check_run_id(run_id)  # a usage error before any node is contacted
    cluster = load_inventory(hosts)
    if job:
        from launcher.app import slurm as on_slurm

        cluster, nodes = on_slurm.job_nodes(job, cluster, opts)
        return run_top.top(cluster, run_id, opts, wiring, once=once, as_json_too=as_json, nodes=nodes)
    return run_top.top(cluster, run_id, opts, wiring, once=once, as_json_too=as_json)


def slurm_submit(hosts: str | Hosts, nodes: int, *, opts: Options | None = None, wiring: Wiring | None = None,
                 **batch: Any) -> int:
    """Submit `inv launch --slurm` as a SLURM batch job on `nodes` nodes (`batch`: partition, time, gpus_per_node,
    job_name, dry_run, job (JobWords), skip_doctor); print its job id. The job starts in the project of `hosts`
    (the installed command's) or in this checkout."""
    from launcher.app import slurm as on_slurm

    spec = hosts if isinstance(hosts, Hosts) else Hosts(hosts)
    return on_slurm.slurm_submit(spec.path, nodes, opts=opts or Options(), wiring=wiring or Wiring(),
                                 project=spec.project, **batch)


def init(names: list[str], output: Path, *, workdir: str, script: str, master_port: int = DEFAULT_MASTER_PORT,
         python: str | None = None, nproc_per_node: int | None = None, ssh_config: str | None = None,
         doctor_too: bool = True, default_output: bool = True, opts: Options | None = None,
         wiring: Wiring | None = None) -> int:
    """Write a commented inventory for the nodes `names` from what they say over SSH (their python with torch, their
    GPUs), then run the doctor on it and say the next command. 0 once the inventory is written (the doctor's
    findings are its advice), 1 when a node's python is still to be set in it; a file at `output` is never
    overwritten, and none is written when no node has a python with torch."""
    from launcher.app.newcluster import write_inventory

    opts, wiring = opts or Options(), wiring or Wiring()
    name = command_name()
    found = write_inventory(names, output, workdir=workdir, job={"script": script, "args": []},
                            master_port=master_port, python=python, nproc_per_node=nproc_per_node,
                            ssh_config=ssh_config, opts=opts, err=wiring.err, command=name)
    wiring.out.write(f"wrote {relative(output)}: {len(found)} node(s), "
                     + ", ".join(f"{f.name} {f.python or 'python3 (no torch found)'} x{f.nproc}" for f in found)
                     + "\n")
    hosts = "" if default_output else f" --hosts {relative(output)}"
    unknown = [f.name for f in found if f.python is None]
    if unknown:
        wiring.err.write(f"no python with torch was found on {', '.join(unknown)}: set `python:` for "
                         f"{'it' if len(unknown) == 1 else 'them'} in {relative(output)}, or install torch there\n")
    code = doctor(str(output), opts=opts, wiring=wiring) if doctor_too else 0
    if code:
        wiring.out.write(f"the doctor found problems (above): fix them in {relative(output)} or on the nodes; a "
                         f"missing {script} is what --sync copies. Then: {name} doctor{hosts}\n")
    wiring.out.write(f"next: {name} launch{hosts} --dry-run, then {name} launch{hosts} --sync (this project to every "
                     "workdir first)\n")
    return 1 if unknown else 0


def init_example(output: Path, *, wiring: Wiring | None = None) -> int:
    """Write the reference inventory at `output` (every key, what it does and its default), never over a file; no
    node is asked."""
    from launcher.app.newcluster import write_example

    wiring, name = wiring or Wiring(), command_name()
    write_example(output, name)
    wiring.out.write(f"wrote {relative(output)}: every key of an inventory, what it does and its default; copy the "
                     f"lines you need into yours (`{name} init --hosts gpu01,gpu02` writes one from what your nodes "
                     "say)\n")
    return 0


def main_error(exc: LauncherError) -> tuple[str, int]:
    """The message and exit code a task shows for a launcher error (one sentence, no traceback)."""
    return str(exc), getattr(exc, "exit_code", 1) or 1


__all__ = ["Hosts", "JobWords", "doctor", "doctor_report", "init", "init_example", "launch", "load_inventory", "logs",
           "main_error", "slurm_submit", "stacks", "status", "stop", "sync", "top"]
