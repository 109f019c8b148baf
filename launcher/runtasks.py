"""The tasks on a run that is there (`stop`, `status`, `logs`, `stacks`, `report`, `top`): each parses its options and
calls `launcher.app`, on the inventory's nodes or, with `--job`, a SLURM job's. `launcher.tasks` adds them to `ns`."""

from __future__ import annotations

from invoke import Exit

from launcher import app, options
from launcher.errors import USAGE
from launcher.taskkit import HOSTS_HELP, JOB_HELP, RUN_HELP, reported, slurm_job, task, task_hosts, task_settings


@task(help={"hosts": HOSTS_HELP, "run": RUN_HELP, "grace": "seconds between TERM and KILL", "job": JOB_HELP})
@reported
def stop(c, hosts=None, run=None, grace=None, job=None):
    """Stop a run on every node: TERM, a grace period, KILL; then check nothing of it is left."""
    if job:  # scancel: SLURM's KillWait is the grace period
        slurm_job(job, hosts=hosts, run=run, grace=grace)
    return app.stop(task_hosts(c, hosts), run, task_settings(c, options.Given(grace=grace)), job=job)


@task(help={"hosts": HOSTS_HELP, "run": RUN_HELP, "job": JOB_HELP})
@reported
def status(c, hosts=None, run=None, job=None):
    """Per node: running / exited (code) / stopped / unreachable, and since when."""
    if job:
        slurm_job(job, hosts=hosts, run=run)
    return app.status(task_hosts(c, hosts), run, task_settings(c), job=job)


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
@reported
def logs(c, hosts=None, run=None, follow=False, node=None, rank=None, job=None):
    """Replay a run's log from the nodes, prefixed by node and rank."""
    if job:  # the job's output file holds every node's prefixed lines
        slurm_job(job, hosts=hosts, run=run, node=node, rank=rank)
    rank = options.whole_number("rank", rank) if rank is not None else None
    return app.logs(task_hosts(c, hosts), run, node=node, rank=rank, follow=follow, settings=task_settings(c), job=job)


@task(
    help={
        "hosts": HOSTS_HELP,
        "run": RUN_HELP,
        "job": "a SLURM job id (from the slurm.submit task): the run inside it, through steps of the job",
    }
)
@reported
def stacks(c, hosts=None, run=None, job=None):
    """Every rank's Python stack from every node, grouped by where the ranks are; the run goes on."""
    return app.stacks(task_hosts(c, hosts), run, task_settings(c), job=job)


@task(
    help={
        "hosts": HOSTS_HELP,
        "run": RUN_HELP,
        "json": "also print the page's figures as JSON (headline, first_step_s, slowest, marks, each node's end)",
        "job": "a running SLURM job id (from the slurm.submit task): the run inside it, through steps of the job",
    }
)
@reported
def report(c, hosts=None, run=None, json=False, job=None):
    """Write the run's page, logs/<run id>/report.html: its start as a waterfall, its timeline, its end."""
    return app.report(task_hosts(c, hosts), run, task_settings(c), as_json=json, job=job)


@task(
    help={
        "hosts": HOSTS_HELP,
        "run": RUN_HELP,
        "once": "one snapshot (after a few seconds' look), not the live view",
        "json": "with --once: the snapshot as JSON (run, nodes, ranks)",
        "job": "a SLURM job id (from the slurm.submit task): the run inside it, through steps of the job",
    }
)
@reported
def top(c, hosts=None, run=None, once=False, json=False, job=None):
    """A live view of every node and rank of a run: CPU, memory, GPUs, last line, steps/s, stragglers (q quits)."""
    if json and not once:
        raise Exit("error: --json goes with --once (the live view is for a terminal)", USAGE)
    return app.top(task_hosts(c, hosts), run, task_settings(c), once=once, as_json=json, job=job)
