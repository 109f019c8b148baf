"""The launcher's Invoke tasks, one definition for both commands: `ddpl` (installed: `ns`) and a checkout's `inv`
(its tasks.py: `checkout_ns`, with the sandbox, demo and bench). Each parses its options and calls `launcher.app`.

A project's own tasks.py can add them: `ns = Collection(its_task, ...)`, then `ns.add_collection(launcher.tasks.ns,
"ddp")` (docs/usage.md's lines: a file of plain `@task`s has no namespace until it names one).
"""

from __future__ import annotations

import gc
import sys

# The imports below make ~60,000 objects that live as long as the process: no collection walks them while they are
# made, none walks them later (frozen), nor at the exit (a task's `inv` start and exit: 26 ms less).
gc.disable()

from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

from invoke import Collection, Context, Exit, Task
from invoke import task as invoke_task

from launcher import app, options, trace
from launcher.cliconfig import NOT_OPTIONS, SECTION, sources
from launcher.doctor import FAST_CHECKS
from launcher.errors import USAGE, LauncherError
from launcher.paths import called_as, invoked_as, relative, task_prefix
from launcher.project import check_owner, resolve
from launcher.settings import HANG_TIMEOUT_HELP, HEARTBEAT_TIMEOUT_HELP, SILENCE_TIMEOUT_HELP, Settings

gc.freeze()
gc.enable()

HOSTS_HELP = (
    "inventory, or DeepSpeed/MPI hostfile (`worker-1 slots=8` a line; every other setting from the "
    "defaults and job settings); default: the hosts setting (invoke.yaml's launcher.hosts, ddpl.yaml's "
    "hosts)"
)
INCLUDE_HELP = "only these hosts, DeepSpeed's syntax: worker-1:0,2@worker-2 (GPU indices after :, hosts joined by @)"
EXCLUDE_HELP = "every host but these (or without these GPUs), same syntax as --include"
RUN_HELP = "run id (default: the run of this inventory that is running, else its newest)"
JOB_HELP = "a SLURM job id (from the slurm.submit task): ask SLURM instead of the nodes"
SCRIPT_HELP = "script to run instead of the inventory's job.script (relative to each node's workdir)"
MODULE_HELP = "Python module to run instead of the inventory's job (torchrun -m MODULE)"
COMMAND_HELP = "program to run instead of the inventory's job, not under Python (torchrun --no-python COMMAND)"
ARGS_HELP = "arguments for the script, as one shell-quoted string (replaces job.args)"


class _Task(Task):
    """A task whose `--verbose` is `-v` too, the one short flag (as `ssh -v`, `pip -v`)."""

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        if name == "verbose":
            opts["names"] = [*opts["names"], "v"]
        return opts


def task(*args: Any, **kwargs: Any) -> Any:
    """Invoke's `@task` without its automatic short flags: made from each option's first letter, `-e` meant
    --detach in one task and --exclude in another, and --hang-timeout got a broken `--=STRING` (its `-h` is help's).
    Long options only, one meaning each, everywhere; but `--verbose`, which is `-v` too."""
    if args and callable(args[0]):
        return invoke_task(auto_shortflags=False, klass=_Task)(args[0])
    return invoke_task(*args, auto_shortflags=False, klass=_Task, **kwargs)


VERBOSE_HELP = (
    "also show the launcher's own trace on the console: connections, messages sent and heard, its "
    "decisions and why, timings (every run writes it to logs/<run id>/launcher.log anyway)"
)


def _verbose(on: bool) -> None:
    if on:
        trace.verbose()


def _reported(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a task body; a LauncherError becomes its message and exit code, never a traceback. Its messages name the
    command that runs it (`ddpl`, or `inv`: the prefix of Invoke's config) and the collection its tasks were added
    as in a project's tasks.py (`inv ddp.doctor`)."""
    path = fn.__name__.replace("_", ".")  # its name in `ns`: slurm_submit is the `submit` of `slurm`

    @wraps(fn)
    def wrapper(c: Context, *args: Any, **kwargs: Any) -> None:
        try:
            with called_as(invoked_as(c.config.prefix), task_prefix(path, sys.argv)):
                code = fn(c, *args, **kwargs)
        except LauncherError as exc:
            message, code = app.main_error(exc)
            raise Exit(f"error: {message}", code) from None
        if code:
            raise Exit(code=code)

    return wrapper


def _root(c: Context) -> Path | None:
    """The installed command's project folder (`launcher.cliconfig.DdplConfig`); None for a checkout's `inv`, whose
    settings' paths stay relative to the current folder."""
    return getattr(c.config, "project_root", None)


def _settings(c: Context, given: options.Given | None = None) -> Settings:
    """The `launcher:` settings (invoke.yaml, or ddpl's files), then the options the command line `given`, every
    number checked and noted with where it came from; a relative log_dir in ddpl's settings is the project's."""
    overrides = (given or options.Given()).values()
    try:
        config = {k: v for k, v in c.config.get(SECTION, {}).items() if k not in NOT_OPTIONS}
        root = _root(c)
        if root is None:
            return options.from_config(config, overrides, origins=sources(c.config))
        if config.get("log_dir") is not None:
            config["log_dir"] = str(resolve(config["log_dir"], root))
        return options.from_config(config, overrides, sources=sources(c.config), section="")
    except LauncherError as exc:
        raise Exit(f"error: {exc}", USAGE) from None


def _none_given(what: str, **others: Any) -> None:
    """Exit with a usage error when any of `others` was given: it does not apply to `what`."""
    given = [name for name, value in others.items() if value not in (None, False)]
    if given:
        raise Exit(f"error: --{given[0].replace('_', '-')} does not apply to {what}", USAGE)


def _slurm_job(job: str, **others: Any) -> str:
    """`--job` as given, once no option of a run over SSH comes with it (SLURM knows the job's nodes)."""
    _none_given("a SLURM job (--job)", **others)
    return job


def _inventory(c: Context) -> Path:
    """The `hosts` setting's inventory: in ddpl's settings, the project's (only when this user owns it)."""
    config = c.config.get(SECTION, {})
    root, path = _root(c), Path(config.get("hosts") or options.DEFAULT_HOSTS)
    if root is None:
        return path
    found = resolve(path, root)
    check_owner(found, c.config.safe_directories())
    return Path(relative(found))


def _hosts(c: Context, hosts: str | None, include: str | None = None, exclude: str | None = None) -> app.Hosts:
    """`--hosts` (default: the `hosts` setting), what a hostfile takes from the settings, and the hosts chosen."""
    config = c.config.get(SECTION, {})
    root = _root(c)
    where = sources(c.config).get("defaults", "invoke.yaml") if root is not None else "invoke.yaml"
    return app.Hosts(
        hosts or str(_inventory(c)),
        config.get("defaults"),
        config.get("job"),
        include,
        exclude,
        project=root,
        defaults_source=where,
    )


def _hosts_from(c: Context, hosts: str | None) -> str | None:
    """Where the inventory was named, unless at its default: `--hosts`, else the settings' file or variable."""
    found = sources(c.config).get("hosts")
    return "--hosts" if hosts else None if found in (None, "default") else found


@task(
    help={
        "hosts": HOSTS_HELP,
        "include": INCLUDE_HELP,
        "exclude": EXCLUDE_HELP,
        "script": SCRIPT_HELP,
        "module": MODULE_HELP,
        "command": COMMAND_HELP,
        "args": ARGS_HELP,
        "dry-run": "print each node's exact command and why each flag is there, and the settings the run uses that "
        "are not their defaults, with where each came from; start nothing",
        "json": "with --dry-run: also the request each node's agent gets, as JSON",
        "detach": "start the run and return; use status, logs and stop on it later",
        "sync": "first make every node's workdir hold this project tree, as the sync task does (over the same "
        "connections)",
        "skip-doctor": f"start without the doctor's fast checks ({', '.join(FAST_CHECKS)}) on every node",
        "grace": "seconds between TERM and KILL when the run is stopped",
        "connect-timeout": "seconds to wait for each node's SSH connection",
        "probe-timeout": "seconds each node's doctor probe (the fast checks before starting) has to answer",
        "silence-timeout": SILENCE_TIMEOUT_HELP,
        "heartbeat-timeout": HEARTBEAT_TIMEOUT_HELP,
        "retries": "start the run again (with job.resume_args) up to N times when it loses a node or its processes are "
        "killed, on the nodes that pass the doctor (default: the inventory's retries)",
        "hang-timeout": f"{HANG_TIMEOUT_HELP} (default: the hang_timeout setting, else the inventory's "
        "job.hang_timeout)",
        "on-hang": "what a suspected hang does once the stacks are taken: stop (exit code 124), keep, or restart "
        "(with --retries: again without the node that held it up)",
        "slurm": "inside a SLURM allocation (salloc, sbatch): run on its nodes as one srun step, the first node the "
        "master; the inventory gives everything else",
        "verbose": VERBOSE_HELP,
    }
)
@_reported
def launch(
    c,
    hosts=None,
    script=None,
    args=None,
    dry_run=False,
    detach=False,
    skip_doctor=False,
    grace=None,
    connect_timeout=None,
    probe_timeout=None,
    silence_timeout=None,
    heartbeat_timeout=None,
    sync=False,
    include=None,
    exclude=None,
    retries=None,
    slurm=False,
    hang_timeout=None,
    on_hang=None,
    module=None,
    command=None,
    json=False,
    verbose=False,
):
    """Start torchrun on every node of the inventory (or of the SLURM allocation) at once; stream their output."""
    _verbose(verbose)
    given = options.Given(
        detach=detach,
        grace=grace,
        connect_timeout=connect_timeout,
        probe_timeout=probe_timeout,
        silence_timeout=silence_timeout,
        heartbeat_timeout=heartbeat_timeout,
        retries=retries,
        hang_timeout=hang_timeout,
        on_hang=on_hang,
    )
    if json and not dry_run:
        raise Exit("error: --json goes with --dry-run", USAGE)
    return app.launch(
        _hosts(c, hosts, include, exclude),
        app.JobArgs(script, module, command, args),
        dry_run=dry_run,
        doctor=not skip_doctor,
        sync=sync,
        slurm=slurm,
        settings=_settings(c, given),
        as_json=json,
        hosts_from=_hosts_from(c, hosts),
    )


@task(
    help={
        "hosts": HOSTS_HELP,
        "run": "run id (default: the run of this inventory that is running)",
        "grace": "seconds between TERM and KILL when the run is stopped (Ctrl-C)",
        "silence-timeout": SILENCE_TIMEOUT_HELP,
        "heartbeat-timeout": HEARTBEAT_TIMEOUT_HELP,
        "hang-timeout": f"{HANG_TIMEOUT_HELP} (default: the inventory's)",
        "on-hang": "what a suspected hang does once the stacks are taken: stop (exit code 124) or keep",
        "verbose": VERBOSE_HELP,
    }
)
@_reported
def attach(
    c,
    hosts=None,
    run=None,
    grace=None,
    silence_timeout=None,
    heartbeat_timeout=None,
    hang_timeout=None,
    on_hang=None,
    verbose=False,
):
    """Take over an attached run whose launcher is gone (asleep, killed, another terminal): its output from where this
    machine's copy stopped, Ctrl-C stops it everywhere, and the run's exit code."""
    _verbose(verbose)
    settings = _settings(
        c,
        options.Given(
            grace=grace,
            silence_timeout=silence_timeout,
            heartbeat_timeout=heartbeat_timeout,
            hang_timeout=hang_timeout,
            on_hang=on_hang,
        ),
    )
    return app.attach(_hosts(c, hosts), run, settings=settings)


@task(
    help={
        "hosts": HOSTS_HELP,
        "include": INCLUDE_HELP,
        "exclude": EXCLUDE_HELP,
        "json": "print the findings as JSON (for scripts)",
        "fast": f"only the checks launch runs first ({', '.join(FAST_CHECKS)})",
        "net": "then measure the network between the nodes with the run's backend (one rank a node, all_reduce "
        "and a ring of pairs): a `net` column, each node's Gbit/s and latency, a slow node flagged",
        "net-all-gpus": "with --net: one rank a GPU (each node's nproc_per_node), as nccl-tests' -g: every NIC "
        "rail and NVLink in the measure",
        "connect-timeout": "seconds to wait for each node's SSH connection",
        "probe-timeout": "seconds each node's probe has to answer once sent (apart from --connect-timeout); "
        "a late answer is a warning with its time, none a failure",
        "slurm": "inside a SLURM allocation (salloc/sbatch): check its nodes, each probe a step of the job",
        "job": "a running SLURM job's id: check its nodes through steps beside its own (`srun --overlap`)",
        "script": "check this script instead of the inventory's job (as launch --script runs it)",
        "module": "check this module instead (importable by each node's python, as launch --module runs it)",
        "command": "check this program instead (on each node's PATH, as launch --command runs it)",
        "verbose": VERBOSE_HELP,
    }
)
@_reported
def doctor(
    c,
    hosts=None,
    json=False,
    fast=False,
    connect_timeout=None,
    probe_timeout=None,
    include=None,
    exclude=None,
    net=False,
    slurm=False,
    job=None,
    net_all_gpus=False,
    script=None,
    module=None,
    command=None,
    verbose=False,
):
    """Check every node before a launch: versions, DNS from every node, master port, script, GPUs; say the fix."""
    _verbose(verbose)
    if job:
        _slurm_job(job, include=include, exclude=exclude, connect_timeout=connect_timeout, slurm=slurm)
    elif slurm:
        _none_given(
            "--slurm (the allocation names the nodes)",
            include=include,
            exclude=exclude,
            connect_timeout=connect_timeout,
        )
    return app.doctor(
        _hosts(c, hosts, include, exclude),
        as_json=json,
        checks="fast" if fast else "all",
        settings=_settings(c, options.Given(connect_timeout=connect_timeout, probe_timeout=probe_timeout)),
        net=net,
        slurm=slurm,
        job=job,
        net_all_gpus=net_all_gpus,
        job_args=app.JobArgs(script, module, command),
    )


@task(
    help={
        "hosts": HOSTS_HELP,
        "connect-timeout": "seconds to wait for each node's SSH connection",
        "silence-timeout": "a node that takes no data for this many seconds (a hung disk) fails its sync",
    }
)
@_reported
def sync(c, hosts=None, connect_timeout=None, silence_timeout=None):
    """Make every node's workdir hold this project tree (git's file list, .gitignore, sync.exclude); only changed
    files travel, all nodes at once; nothing on a node is deleted."""
    return app.sync(
        _hosts(c, hosts), _settings(c, options.Given(connect_timeout=connect_timeout, silence_timeout=silence_timeout))
    )


@task(help={"hosts": HOSTS_HELP, "run": RUN_HELP, "grace": "seconds between TERM and KILL", "job": JOB_HELP})
@_reported
def stop(c, hosts=None, run=None, grace=None, job=None):
    """Stop a run on every node: TERM, a grace period, KILL; then check nothing of it is left."""
    if job:  # scancel: SLURM's KillWait is the grace period
        _slurm_job(job, hosts=hosts, run=run, grace=grace)
    return app.stop(_hosts(c, hosts), run, _settings(c, options.Given(grace=grace)), job=job)


@task(help={"hosts": HOSTS_HELP, "run": RUN_HELP, "job": JOB_HELP})
@_reported
def status(c, hosts=None, run=None, job=None):
    """Per node: running / exited (code) / stopped / unreachable, and since when."""
    if job:
        _slurm_job(job, hosts=hosts, run=run)
    return app.status(_hosts(c, hosts), run, _settings(c), job=job)


@task(
    help={
        "hosts": HOSTS_HELP,
        "run": RUN_HELP,
        "follow": "keep printing as the run writes, until it ends",
        "node": "only this node",
        "rank": "only this global rank's lines",
        "job": JOB_HELP,
    }
)
@_reported
def logs(c, hosts=None, run=None, follow=False, node=None, rank=None, job=None):
    """Replay a run's log from the nodes, prefixed by node and rank."""
    if job:  # the job's output file holds every node's prefixed lines
        _slurm_job(job, hosts=hosts, run=run, node=node, rank=rank)
    rank = options.whole_number("rank", rank) if rank is not None else None
    return app.logs(_hosts(c, hosts), run, node=node, rank=rank, follow=follow, settings=_settings(c), job=job)


@task(
    help={
        "hosts": HOSTS_HELP,
        "run": RUN_HELP,
        "job": "a SLURM job id (from the slurm.submit task): the run inside it, through steps of the job",
    }
)
@_reported
def stacks(c, hosts=None, run=None, job=None):
    """Every rank's Python stack from every node, grouped by where the ranks are; the run goes on."""
    return app.stacks(_hosts(c, hosts), run, _settings(c), job=job)


@task(
    help={
        "hosts": HOSTS_HELP,
        "run": RUN_HELP,
        "json": "also print the page's figures as JSON (headline, first_step_s, slowest, marks, each node's end)",
        "job": "a running SLURM job id (from the slurm.submit task): the run inside it, through steps of the job",
    }
)
@_reported
def report(c, hosts=None, run=None, json=False, job=None):
    """Write the run's page, logs/<run id>/report.html: its start as a waterfall, its timeline, its end."""
    return app.report(_hosts(c, hosts), run, _settings(c), as_json=json, job=job)


@task(
    help={
        "hosts": HOSTS_HELP,
        "run": RUN_HELP,
        "once": "one snapshot (after a few seconds' look), not the live view",
        "json": "with --once: the snapshot as JSON (run, nodes, ranks)",
        "job": "a SLURM job id (from the slurm.submit task): the run inside it, through steps of the job",
    }
)
@_reported
def top(c, hosts=None, run=None, once=False, json=False, job=None):
    """A live view of every node and rank of a run: CPU, memory, GPUs, last line, steps/s, stragglers (q quits)."""
    if json and not once:
        raise Exit("error: --json goes with --once (the live view is for a terminal)", USAGE)
    return app.top(_hosts(c, hosts), run, _settings(c), once=once, as_json=json, job=job)


@task(
    help={
        "hosts": HOSTS_HELP + "; the job's nodes are the allocation's, the inventory gives everything else",
        "nodes": "how many nodes to ask SLURM for (one launcher agent each)",
        "partition": "the SLURM partition (default: the cluster's default partition)",
        "time": "time limit in SLURM's form: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (default: the "
        "partition's)",
        "gpus-per-node": "GPUs to ask for on each node: a count, or type:count (default: none)",
        "job-name": "the job's name in squeue (default: ddp)",
        "dry-run": "print the batch script; submit nothing",
        "script": SCRIPT_HELP,
        "module": MODULE_HELP,
        "command": COMMAND_HELP,
        "args": ARGS_HELP,
        "skip-doctor": f"start without the doctor's fast checks ({', '.join(FAST_CHECKS)}) inside the job",
    }
)
@_reported
def slurm_submit(
    c,
    hosts=None,
    nodes=None,
    partition=None,
    time=None,
    gpus_per_node=None,
    job_name=None,
    dry_run=False,
    script=None,
    args=None,
    skip_doctor=False,
    module=None,
    command=None,
):
    """Submit `launch --slurm` as a SLURM batch job (sbatch) on N nodes; print its job id."""
    if nodes is None:
        raise Exit("error: --nodes is required: how many nodes to ask SLURM for", USAGE)
    return app.slurm_submit(
        _hosts(c, hosts),
        options.whole_number("nodes", nodes, 1),
        partition=partition,
        time=time,
        gpus_per_node=gpus_per_node,
        dry_run=dry_run,
        job=app.JobArgs(script, module, command, args),
        skip_doctor=skip_doctor,
        job_name=job_name,
        settings=_settings(c),
    )


@task(
    help={
        "hosts": "the nodes, comma-separated: gpu01,gpu02 (ssh aliases, DNS names or addresses; the first is node "
        "rank 0)",
        "output": "where to write the inventory (default: the `hosts` setting, hosts/cluster.yaml in the project); "
        "never over a file that is there",
        "workdir": "where your code is on each node (default: ~/ and this project's folder name)",
        "script": "the training script, relative to the workdir (default: train.py)",
        "python": "the interpreter with torch on every node (default: the first that has torch: the project's venv in "
        "the workdir, the login's python3, a venv or conda in the home, /opt/conda)",
        "nproc-per-node": "worker processes on each node (default: its GPU count from nvidia-smi, else 1)",
        "ssh-config": "an ssh config file to reach the nodes with, instead of ~/.ssh/config",
        "master-port": "the rendezvous port on the first node",
        "skip-doctor": "write the inventory only; run no doctor on it",
        "connect-timeout": "seconds to wait for each node's SSH connection",
        "example": f"write the reference inventory instead (every key, what it does, its default) to --output "
        f"(default: {options.DEFAULT_EXAMPLE} in the project); no node is asked",
    }
)
@_reported
def init(
    c,
    hosts=None,
    output=None,
    workdir=None,
    script="train.py",
    python=None,
    nproc_per_node=None,
    ssh_config=None,
    master_port=options.DEFAULT_MASTER_PORT,
    skip_doctor=False,
    connect_timeout=None,
    example=False,
):
    """Write a commented inventory for new nodes from what they say over SSH; run the doctor; say what is next.

    It asks each node for its python with torch and its GPUs (nproc_per_node), and never writes over a file."""
    if example:
        _none_given(
            "--example (no node is asked)",
            hosts=hosts,
            workdir=workdir,
            python=python,
            nproc_per_node=nproc_per_node,
            ssh_config=ssh_config,
            connect_timeout=connect_timeout,
        )
        return app.init_example(Path(output) if output else Path(relative(resolve(options.DEFAULT_EXAMPLE, _root(c)))))
    names = [name.strip() for name in (hosts or "").split(",") if name.strip()]
    if not names:
        raise Exit("error: --hosts names no node: give them comma-separated, gpu01,gpu02", USAGE)
    nproc = (
        None
        if nproc_per_node is None
        else options.whole_number("nproc_per_node", nproc_per_node, 1, options.MAX_NPROC_PER_NODE)
    )
    project = _root(c) or Path.cwd()
    if ssh_config and not ssh_config.startswith("~"):  # the inventory's ssh_config is read from wherever ddpl runs
        ssh_config = str(Path(ssh_config).absolute())
    return app.init(
        names,
        Path(output) if output else _inventory(c),
        workdir=workdir or f"~/{project.name}",
        script=script,
        master_port=options.whole_number("master_port", master_port, 1, 65535),
        python=python,
        nproc_per_node=nproc,
        ssh_config=ssh_config,
        doctor_too=not skip_doctor,
        default_output=output is None,
        settings=_settings(c, options.Given(connect_timeout=connect_timeout)),
    )


slurm = Collection("slurm")
slurm.add_task(slurm_submit, "submit")
ns = Collection(launch, attach, sync, doctor, stop, status, logs, stacks, top, report, init, slurm)
"""The installed command's tasks (`ddpl`), and what a project's own tasks.py may add as a collection."""
ns.configure({SECTION: options.config_defaults()})  # the defaults' one home is launcher/settings.py
