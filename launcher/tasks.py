"""The launcher's Invoke tasks, one definition for both commands: `ddpl` (installed: `ns`) and a checkout's `inv`
(its tasks.py: `checkout_ns`, with the sandbox, demo and bench). Each parses its options and calls `launcher.app`.

A project's own tasks.py can add them: `ns = Collection(its_task, ...)`, then `ns.add_collection(launcher.tasks.ns,
"ddp")` (docs/usage.md's lines: a file of plain `@task`s has no namespace until it names one).
"""

from __future__ import annotations

import gc

# The imports below make ~60,000 objects that live as long as the process: no collection walks them while they are
# made, none walks them later (frozen), nor at the exit (a task's `inv` start and exit: 26 ms less).
gc.disable()


from invoke import Collection, Exit

from launcher import app, options
from launcher.cliconfig import SECTION
from launcher.doctor import FAST_CHECKS
from launcher.errors import USAGE
from launcher.inittask import init
from launcher.runtasks import logs, report, stacks, status, stop, top
from launcher.settings import HANG_TIMEOUT_HELP, HEARTBEAT_TIMEOUT_HELP, ON_NONFINITE_HELP, SILENCE_TIMEOUT_HELP
from launcher.taskkit import (
    ARGS_HELP,
    COMMAND_HELP,
    EXCLUDE_HELP,
    HOSTS_HELP,
    IMAGE_HELP,
    INCLUDE_HELP,
    MODULE_HELP,
    PULL_HELP,
    PULL_TIMEOUT_HELP,
    SCRIPT_HELP,
    VERBOSE_HELP,
    hosts_from,
    none_given,
    reported,
    script_args,
    slurm_job,
    task,
    task_hosts,
    task_settings,
    verbose_on,
)

gc.freeze()
gc.enable()


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
        "on-nonfinite": ON_NONFINITE_HELP,
        "slurm": "inside a SLURM allocation (salloc, sbatch): run on its nodes as one srun step, the first node the "
        "master; the inventory gives everything else",
        "image": IMAGE_HELP,
        "pull": PULL_HELP,
        "pull-timeout": PULL_TIMEOUT_HELP,
        "verbose": VERBOSE_HELP,
    }
)
@reported
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
    on_nonfinite=None,
    module=None,
    command=None,
    json=False,
    image=None,
    pull=False,
    pull_timeout=None,
    verbose=False,
):
    """Start torchrun on every node of the inventory (or of the SLURM allocation) at once; stream their output."""
    verbose_on(verbose)
    given = options.Given(
        detach=detach,
        grace=grace,
        connect_timeout=connect_timeout,
        probe_timeout=probe_timeout,
        pull_timeout=pull_timeout,
        silence_timeout=silence_timeout,
        heartbeat_timeout=heartbeat_timeout,
        retries=retries,
        hang_timeout=hang_timeout,
        on_hang=on_hang,
        on_nonfinite=on_nonfinite,
    )
    if json and not dry_run:
        raise Exit("error: --json goes with --dry-run", USAGE)
    return app.launch(
        task_hosts(c, hosts, include, exclude, image),
        app.JobArgs(script, module, command, script_args(args)),
        dry_run=dry_run,
        doctor=not skip_doctor,
        sync=sync,
        slurm=slurm,
        settings=task_settings(c, given),
        as_json=json,
        hosts_from=hosts_from(c, hosts),
        pull=pull,
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
        "on-nonfinite": ON_NONFINITE_HELP,
        "force": "take the run over even from a launcher its nodes hear now (another terminal or machine): that "
        "launcher lets go (exit code 129); without it such a run is refused, naming that launcher",
        "verbose": VERBOSE_HELP,
    }
)
@reported
def attach(
    c,
    hosts=None,
    run=None,
    grace=None,
    silence_timeout=None,
    heartbeat_timeout=None,
    hang_timeout=None,
    on_hang=None,
    on_nonfinite=None,
    force=False,
    verbose=False,
):
    """Take over an attached run whose launcher is gone (asleep, killed, another terminal): its output from where this
    machine's copy stopped, Ctrl-C stops it everywhere, and the run's exit code."""
    verbose_on(verbose)
    settings = task_settings(
        c,
        options.Given(
            grace=grace,
            silence_timeout=silence_timeout,
            heartbeat_timeout=heartbeat_timeout,
            hang_timeout=hang_timeout,
            on_hang=on_hang,
            on_nonfinite=on_nonfinite,
        ),
    )
    return app.attach(task_hosts(c, hosts), run, settings=settings, force=force)


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
        "image": IMAGE_HELP,
        "pull": PULL_HELP,
        "pull-timeout": PULL_TIMEOUT_HELP,
        "verbose": VERBOSE_HELP,
    }
)
@reported
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
    image=None,
    pull=False,
    pull_timeout=None,
    verbose=False,
):
    """Check every node before a launch: versions, DNS from every node, master port, script, GPUs; say the fix."""
    verbose_on(verbose)
    if job:
        slurm_job(job, include=include, exclude=exclude, connect_timeout=connect_timeout, slurm=slurm)
    elif slurm:
        none_given(
            "--slurm (the allocation names the nodes)",
            include=include,
            exclude=exclude,
            connect_timeout=connect_timeout,
        )
    given = options.Given(connect_timeout=connect_timeout, probe_timeout=probe_timeout, pull_timeout=pull_timeout)
    return app.doctor(
        task_hosts(c, hosts, include, exclude, image),
        as_json=json,
        checks="fast" if fast else "all",
        settings=task_settings(c, given),
        net=net,
        slurm=slurm,
        job=job,
        net_all_gpus=net_all_gpus,
        job_args=app.JobArgs(script, module, command),
        pull=pull,
    )


@task(
    help={
        "hosts": HOSTS_HELP,
        "connect-timeout": "seconds to wait for each node's SSH connection",
        "silence-timeout": "a node that takes no data for this many seconds (a hung disk) fails its sync",
    }
)
@reported
def sync(c, hosts=None, connect_timeout=None, silence_timeout=None):
    """Make every node's workdir hold this project tree (git's file list, .gitignore, sync.exclude); only changed
    files travel, all nodes at once; nothing on a node is deleted."""
    return app.sync(
        task_hosts(c, hosts),
        task_settings(c, options.Given(connect_timeout=connect_timeout, silence_timeout=silence_timeout)),
    )


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
@reported
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
        task_hosts(c, hosts),
        options.whole_number("nodes", nodes, 1),
        partition=partition,
        time=time,
        gpus_per_node=gpus_per_node,
        dry_run=dry_run,
        job=app.JobArgs(script, module, command, script_args(args)),
        skip_doctor=skip_doctor,
        job_name=job_name,
        settings=task_settings(c),
    )


slurm = Collection("slurm")
slurm.add_task(slurm_submit, "submit")
ns = Collection(launch, attach, sync, doctor, stop, status, logs, stacks, top, report, init, slurm)
"""The installed command's tasks (`ddpl`), and what a project's own tasks.py may add as a collection."""
ns.configure({SECTION: options.config_defaults()})  # the defaults' one home is launcher/settings.py
