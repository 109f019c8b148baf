"""The checkout's own tasks (`inv sandbox.up`, `inv sandbox.down`, `inv demo`, `inv bench`), beside the installed
ones (launcher/tasks.py, what `ddpl` runs): they need this checkout (devtools/sandbox, train/, bench/, hosts/), which
the wheel does not ship. `checkout_namespace` is what this checkout's tasks.py gives `inv`."""

from __future__ import annotations

import shlex
from typing import Any

from invoke import Collection

from devtools import sandbox
from devtools.sandbox import Sandbox
from launcher import app, options
from launcher.app.hosts import load_inventory
from launcher.app.job import JobArgs
from launcher.app.pages import page_now
from launcher.cliconfig import SECTION
from launcher.config.model import DEFAULT_MASTER_PORT
from launcher.paths import relative
from launcher.plan.launchplan import new_run_id
from launcher.settings import Settings
from launcher.taskkit import (
    reported,  # the installed tasks' way with errors: one line, its exit code
    task,
)
from launcher.taskkit import task_settings as settings_of  # the settings as the installed tasks read them
from launcher.tasks import ns as installed


def bring_up(nodes: int, nproc_per_node: int = 1, master_port: int = DEFAULT_MASTER_PORT,
             slurm: bool = False, tell: bool = True, **where: Any) -> Sandbox:
    """The sandbox up, and what to try on it (`tell`; not where the caller takes it down itself: the demo).
    `where`: sandbox.up's place for it (state_dir, inventory, base_addr, ...; a test's own)."""
    box = sandbox.up(nodes, nproc_per_node=nproc_per_node, master_port=master_port, slurm=slurm, **where)
    print(f"sandbox: {len(box.nodes)} sshd node(s) up "
          f"({', '.join(f'{n.name}={n.addr}:{n.port}' for n in box.nodes)}); inventory {relative(box.inventory)}",
          flush=True)  # before the launch's lines, whatever the buffering of a pipe
    if box.slurm_conf is None:
        if tell:
            print(f"try: inv launch --hosts {relative(box.inventory)}    (and `inv sandbox.down` when done)")
        return box
    print(f"sandbox: SLURM cluster up (slurmctld, a slurmd on each node, partition main); config {box.slurm_conf}")
    # SLURM's commands find this cluster only through SLURM_CONF: the shell that runs them needs it.
    print(f"try: export SLURM_CONF={shlex.quote(str(box.slurm_conf))}; "
          f"salloc -N {len(box.nodes)} inv launch --slurm --hosts {relative(box.inventory)}"
          "    (and `inv sandbox.down` when done)")
    return box


def bring_down(**where: Any) -> None:
    for line in sandbox.down(**where):
        print(line)


def run_demo(settings: Settings | None = None, **where: Any) -> int:
    """Bring up 2 sshd nodes x 2 processes, train the reference DDP program on them, always bring them down (no
    `try:` line: they are gone when it ends). `where`: the sandbox's place (bring_up's; a test's own)."""
    box = bring_up(2, nproc_per_node=2, tell=False, **where)
    run_id, settings = new_run_id(), settings or Settings()
    try:
        # The run's page before the nodes go down (a page written by a process of its own, as after a launch, would
        # race the sandbox's end and could find no node to ask).
        code = app.launch(str(box.inventory), JobArgs(script="train/ddp.py", args="--epochs 2"), run_id=run_id,
                          settings=settings.updated({"page": False}, "the demo"))
        page = page_now(load_inventory(str(box.inventory)), run_id, settings)
        if page is not None:
            print(f"the run's page: {relative(page)}", flush=True)
        return code
    finally:
        bring_down(**{k: v for k, v in where.items() if k == "state_dir"})


def run_bench(quick: bool = False, only: str | None = None) -> int:
    """The checkout's benchmarks (`python -m bench.run`), from its root: bench/ is no part of the installed package."""
    import subprocess
    import sys

    from launcher.paths import REPO

    argv = [sys.executable, "-m", "bench.run", *(["--quick"] if quick else []), *(["--only", only] if only else [])]
    return subprocess.run(argv, cwd=REPO).returncode


@task(help={"nodes": "how many sshd nodes", "nproc-per-node": "worker processes per node in the inventory",
            "master-port": "rendezvous port written to the inventory",
            "slurm": "also start a real SLURM cluster on the nodes (munged, slurmctld, a slurmd in each node); "
                     "prints the SLURM_CONF to export for srun/salloc"})
@reported
def sandbox_up(c, nodes=2, nproc_per_node=1, master_port=options.DEFAULT_MASTER_PORT, slurm=False):
    """Start N real sshd 'nodes' on 127.0.0.2.. (own hostname and /etc/hosts each); writes hosts/sandbox.yaml."""
    nproc = options.whole_number("nproc_per_node", nproc_per_node, 1, options.MAX_NPROC_PER_NODE)
    port = options.whole_number("master_port", master_port, 1, 65535)
    bring_up(options.whole_number("nodes", nodes, 1), nproc_per_node=nproc, master_port=port, slurm=slurm)


@task
@reported
def sandbox_down(c):
    """Stop the sandbox's sshd nodes (exactly the processes it started)."""
    bring_down()


@task(help={"quick": "fewer sizes and repeats (a few minutes)",
            "only": "comma-separated figures: fanout,job,doctor,stop,logs,cpu,failures,sync,elastic,hang,top,net,"
                    "startup"})
@reported
def bench(c, quick=False, only=None):
    """Benchmarks on the sandbox against an ssh loop, pdsh and local torchrun: table, JSON, picture in bench/results/"""
    return run_bench(quick=quick, only=only)


@task
@reported
def demo(c):
    """Sandbox of 2 nodes x 2 processes, launch train/ddp.py on it, bring it down (even on failure)."""
    return run_demo(settings_of(c))


def checkout_namespace() -> Collection:
    """A checkout's tasks (its tasks.py: `inv`): the installed ones, and the sandbox, the demo and the bench, which
    need the checkout (train/, bench/, hosts/)."""
    sandbox = Collection("sandbox")
    sandbox.add_task(sandbox_up, "up")
    sandbox.add_task(sandbox_down, "down")
    whole = Collection(*installed.tasks.values(), *installed.collections.values(), demo, bench, sandbox)
    whole.configure({SECTION: options.config_defaults()})
    return whole
