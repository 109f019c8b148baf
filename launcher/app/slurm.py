"""The application layer's SLURM forms (`launcher.app` dispatches here): `launch --slurm` in an allocation,
`slurm.submit`, `doctor --slurm/--job`, and `status/logs/stop/stacks/top --job` on a submitted job."""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

from launcher.app.hosts import Hosts
from launcher.app.job import JobArgs
from launcher.config.model import Cluster, Job
from launcher.doctor.collect import CheckMode, doctor_gate, run_doctor
from launcher.doctor.evidence import Report
from launcher.errors import LauncherError, UsageError
from launcher.limits import JOB_DOCTOR_PORT_SHIFT, SLURM_STOP_WAIT
from launcher.paths import REPO, hint, relative, task_call
from launcher.plan.dryrun import dry_run_text
from launcher.plan.launchplan import LaunchPlan, plan_launch
from launcher.plan.settings import for_run
from launcher.run.run_io import RunIO
from launcher.run.takestacks import StacksReport, collect_stacks
from launcher.settings import Settings
from launcher.slurm import allocation, batch, jobs
from launcher.slurm import slurmlaunch as slurm_launch
from launcher.slurm.jobs import JobState


def launch_slurm(
    cluster: Cluster, job: Job, *, dry_run: bool, doctor: bool, sync: bool, settings: Settings, run_io: RunIO
) -> int:
    """`launch --slurm`: the same plan on the allocation's nodes, started as one srun step."""
    for given, option, reason in (
        (sync, "--sync", "the nodes of a SLURM cluster share the job's files"),
        (settings.run.detach, "--detach", f"submit the job instead (`{hint('slurm.submit')}`)"),
    ):
        if given:
            raise UsageError(f"{option} does not apply to --slurm ({reason})")
    settings = for_run(settings, cluster, job, where="slurm")
    for note in settings.run.notes:
        run_io.err.write(note + "\n")
    names = allocation.allocation_nodes(os.environ)
    plan = plan_launch(allocation.allocation_cluster(cluster, names), job, settings=settings)
    if dry_run:
        run_io.out.write(dry_run_text(plan) + "\n")
        return 0
    if doctor and run_io.gate is None:  # the standalone `inv doctor` reaches nodes over SSH, not in a job
        run_io = replace(run_io, gate=replace(doctor_gate(settings, run_io.err), full_report=False))
    try:
        return slurm_launch.launch_step(plan, run_io)
    finally:
        from launcher.app.pages import page_now

        page_now(
            plan.cluster,
            plan.run_id,
            settings,
            slurm_launch.slurm_nodes((c.host.name for c in plan.nodes), dict(os.environ)),
        )


def _slurm_log_dir(settings: Settings) -> Path:
    """Where submitted jobs keep their script, output and end record: absolute, as the job starts elsewhere."""
    return (settings.output.log_dir / jobs.LOG_SUBDIR).absolute()


def _umask() -> int:
    """This process's umask (reading it means setting it: set it back at once)."""
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _job_hosts(hosts: str, start: Path) -> str:
    """`--hosts` as the job, started in `start`, finds it (relative to it when inside it)."""
    path = Path(hosts)
    if not path.is_file():
        raise UsageError(f"--hosts: no inventory or hostfile at {hosts!r}")
    try:
        return str(path.resolve().relative_to(start))
    except ValueError:
        return str(path.resolve())


def slurm_submit(
    hosts: str,
    nodes: int,
    *,
    partition: str | None = None,
    time: str | None = None,
    gpus_per_node: str | None = None,
    dry_run: bool = False,
    job: JobArgs | None = None,
    skip_doctor: bool = False,
    job_name: str | None = None,
    project: Path | None = None,
    settings: Settings,
    run_io: RunIO,
) -> int:
    """Write the batch script that runs `inv launch --slurm` on `nodes` nodes and submit it (with `dry_run`, print
    it); prints the job id and what to do with it. `project`: the installed command's project (the job starts there
    and runs `python -m launcher`); None: this checkout and its tasks.py."""
    log_dir = _slurm_log_dir(settings)
    start = REPO if project is None else project.resolve()
    job = job or JobArgs()
    command = batch.launch_command(
        sys.executable,
        _job_hosts(hosts, start),
        script=job.script,
        module=job.module,
        command=job.command,
        args=job.args,
        skip_doctor=skip_doctor,
        runner="invoke" if project is None else "launcher",
    )  # the same code runs
    spec = batch.BatchSpec(
        nodes=nodes,
        log_dir=str(log_dir),
        workdir=str(start),
        command=command,
        job_name=job_name or batch.DEFAULT_JOB_NAME,
        partition=partition,
        time=time,
        gpus_per_node=gpus_per_node,
        umask=_umask(),
    )
    text = batch.render_batch_script(spec)  # checks every option first
    if dry_run:
        run_io.out.write(text)
        return 0
    _submit(text, log_dir, run_io.out)
    return 0


def _submit(text: str, log_dir: Path, out: IO[str]) -> None:
    """Submit the batch script `text`, kept in `log_dir` beside the job's output, and say the job id and what to do
    with it."""
    pending = log_dir / f"submit-{_dt.datetime.now():%Y%m%d-%H%M%S}-{os.getpid()}.sh"
    job_id = jobs.submit(text, pending)
    script_path = log_dir / f"slurm-{job_id}.sh"
    try:
        pending.replace(script_path)  # beside its output; sbatch keeps its own copy, so the name may change
    except OSError:  # the job is submitted: its script keeps its first name
        script_path = pending
    name = task_call("")
    out.write(
        f"submitted batch job {job_id}\n"
        f"  script: {relative(script_path)}\n"
        f"  output: {relative(Path(batch.output_path(log_dir, job_id)))}\n"
        f"  {name}status --job {job_id}\n  {name}logs --job {job_id} --follow\n"
        f"  {name}stop --job {job_id}\n"
    )


def _job_lines(state: JobState) -> list[str]:
    """One line per fact SLURM (or the job's end record) gave about a job."""
    lines = [f"job {state.job_id}", f"state: {state.state}"]
    if state.exit_code is not None:
        lines.append(f"exit code: {state.exit_code}" + (f" (signal {state.signal})" if state.signal else ""))
    if state.reason:
        lines.append(f"reason: {state.reason}")
    if state.nodes:
        lines.append(f"nodes: {state.nodes}")
    if state.output:
        lines.append(f"output: {relative(state.output)}")
    lines.append(f"from: {state.source}")
    return lines


def _unknown_job(job_id: str, log_dir: Path) -> LauncherError:
    return LauncherError(
        f"SLURM knows no job {job_id}: squeue and scontrol do not list it (they forget an ended job "
        "after MinJobAge, 300 s by default), no accounting (sacct) remembers it, and there is no end "
        f"record at {relative(Path(batch.record_path(log_dir, job_id)))}"
    )


def _known_job(job_id: str, log_dir: Path) -> JobState:
    """The job's state; a LauncherError when nothing knows the job."""
    state = jobs.job_state(job_id, log_dir)
    if not state.known:
        raise _unknown_job(state.job_id, log_dir)
    return state


def job_status(job_id: str, settings: Settings, run_io: RunIO) -> int:
    """A SLURM batch job's state, exit code, nodes and output file, one line each."""
    state = _known_job(job_id, _slurm_log_dir(settings))
    run_io.out.write("\n".join(_job_lines(state)) + "\n")
    return 0


def job_logs(job_id: str, follow: bool, settings: Settings, run_io: RunIO) -> int:
    """Print a SLURM batch job's output file (the launch's prefixed lines); with `follow`, until the job ends."""
    log_dir = _slurm_log_dir(settings)
    state, found = (jobs.follow if follow else jobs.read)(job_id, run_io.out, log_dir)
    if not found and not state.known:  # an output file alone is enough: it outlives what SLURM remembers
        raise _unknown_job(state.job_id, log_dir)
    if not found and state.ended:  # SLURM writes it on the job's first node: a log dir not shared with this one
        where = relative(state.output or log_dir)
        raise LauncherError(
            f"job {state.job_id} ({state.state}) left no output at {where}: "
            "SLURM writes it on the job's first node, so the log dir must be shared with this one"
        )
    if not found:
        run_io.err.write(
            f"job {state.job_id} is {state.state}"
            + (f" ({state.reason})" if state.reason else "")
            + ": no output yet (--follow waits)\n"
        )
    elif follow:
        run_io.err.write(
            f"job {state.job_id} ended: {state.state}"
            + (f", exit code {state.exit_code}" if state.exit_code is not None else "")
            + "\n"
        )
    return 0


def job_stop(job_id: str, settings: Settings, run_io: RunIO) -> int:
    """scancel a SLURM batch job and wait until SLURM has ended its processes on every node; 1 when it has not."""
    log_dir = _slurm_log_dir(settings)
    before = _known_job(job_id, log_dir)
    if before.ended:
        run_io.out.write(f"job {before.job_id} had already ended ({before.state}): nothing to stop\n")
        return 0
    started = time.monotonic()
    after = jobs.cancel(before.job_id, SLURM_STOP_WAIT, log_dir)
    took = time.monotonic() - started
    where = f" on {before.nodes}" if before.nodes else ""
    if not after.ended:
        run_io.out.write(
            f"job {after.job_id} is still {after.state} {took:.0f}s after scancel: SLURM has not ended "
            f"all its processes{where} (see `scontrol show job {after.job_id}`)\n"
        )
        return 1
    run_io.out.write(
        f"stopped job {after.job_id} (was {before.state}{where}) in {took:.1f}s: {after.state}; "
        "SLURM lists no process of it\n"
    )
    return 0


def job_nodes(job_id: str, cluster: Cluster, settings: Settings) -> tuple[Cluster, dict[str, slurm_launch.SlurmNode]]:
    """A running batch job's nodes, each reached through a step of the job (`srun --overlap`, as its owner may run
    from any login node), and the inventory on them (it gives python and workdir)."""
    state = _known_job(job_id, _slurm_log_dir(settings))
    if state.ended or not state.nodes:
        raise LauncherError(f"job {state.job_id} is {state.state}: it runs nothing to look at")
    env = {**os.environ, "SLURM_JOB_ID": state.job_id, "SLURM_JOBID": state.job_id, "SLURM_JOB_NODELIST": state.nodes}
    names = allocation.allocation_nodes(env)
    return allocation.allocation_cluster(cluster, names), slurm_launch.slurm_nodes(names, env)


def slurm_doctor(
    cluster: Cluster,
    job_id: str | None,
    *,
    checks: CheckMode,
    net: bool,
    settings: Settings,
    run_io: RunIO,
    all_gpus: bool = False,
) -> Report:
    """`inv doctor --slurm` in an allocation, or `--job ID` on a running job: the same checks and `--net`, each
    node's probe a step of the job (`srun --overlap`) where SSH would be, the measurement one step of all."""
    if job_id is None:
        env = dict(os.environ)
        on_job = allocation.allocation_cluster(cluster, allocation.allocation_nodes(env))
        nodes = slurm_launch.slurm_nodes((host.name for host in on_job.hosts), env)
    else:
        on_job, nodes = job_nodes(job_id, cluster, settings)
        env = next(iter(nodes.values())).env
        held = on_job.rendezvous.master_port
        port = held + JOB_DOCTOR_PORT_SHIFT if held + JOB_DOCTOR_PORT_SHIFT <= 65535 else held - JOB_DOCTOR_PORT_SHIFT
        on_job = replace(on_job, rendezvous=replace(on_job.rendezvous, master_port=port))
        run_io.err.write(f"note: job {job_id}'s run holds master_port {held}: checking and measuring on {port}\n")
    # A running job's GPUs hold its own run. A SlurmNode runs commands and opens channels as an SSH Node does,
    # through steps of the job (its channel a StepProcess): the doctor's probes take either.
    report = run_doctor(
        on_job,
        nodes,  # type: ignore[arg-type]
        checks=checks,
        probe_timeout=settings.run.probe_timeout,
        gpus_in_use=job_id is not None,
    )
    if not net:
        return report
    from launcher.doctor.net import with_net  # torch on every node: only when asked

    def start(plan: LaunchPlan, quiet_run_io: RunIO) -> int:
        return slurm_launch.launch_step(plan, quiet_run_io, env=env, overlap=job_id is not None)

    return with_net(report, on_job, settings, start, all_gpus)


def job_stacks(job_id: str, cluster: Cluster, run_id: str | None, settings: Settings, run_io: RunIO) -> StacksReport:
    """`inv stacks --job ID`: every rank's stack of the run inside a running batch job."""
    on_job, nodes = job_nodes(job_id, cluster, settings)
    return collect_stacks(on_job, run_id, settings, run_io.err, nodes)


def submit(
    hosts: str | Hosts, nodes: int, *, settings: Settings | None = None, run_io: RunIO | None = None, **batch: Any
) -> int:
    """Submit `inv launch --slurm` as a SLURM batch job on `nodes` nodes (`batch`: partition, time, gpus_per_node,
    job_name, dry_run, job (JobArgs), skip_doctor); print its job id. The job starts in the project of `hosts`
    (the installed command's) or in this checkout."""
    spec = hosts if isinstance(hosts, Hosts) else Hosts(hosts)
    return slurm_submit(
        spec.path, nodes, settings=settings or Settings(), run_io=run_io or RunIO(), project=spec.project, **batch
    )
