"""`inv launch --slurm`: the plan's run as one srun step of the allocation, supervised like a run over SSH.

The plan, the agents' requests, the doctor's checks in the start session, the supervision, the prefixed output and
the root cause are the SSH launch's own (`run_start.run_attached`); only the sessions differ: the tasks of one step
(`step.SrunStep`) instead of an SSH channel per node.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from launcher.errors import LauncherError
from launcher.options import Options
from launcher.plan.commands import LaunchPlan
from launcher.run import start as run_start
from launcher.run.nodeenv import resolve_env
from launcher.slurm.allocation import cpus_per_task
from launcher.slurm.step import SrunStep
from launcher.transport.channel import Result
from launcher.transport.program import host_command


@dataclass
class SlurmNode:
    """One allocated node, for what the supervision runs beside the step (the sweep after a dead agent)."""

    name: str
    env: dict[str, str]
    timeout: float = 0.0
    """No connection to open first (run_all adds a node's connect timeout to its bound): srun's step is the run."""

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> Result:
        """Run `command` on this node as a step of its own (`--overlap`: the run's step holds its CPUs)."""
        argv = ["srun", "--overlap", "--nodes", "1", "--ntasks", "1", "--nodelist", self.name, "--input", "all",
                "/bin/sh", "-c", command]
        try:
            done = subprocess.run(argv, input=stdin, capture_output=True, env=self.env, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            return Result(-1, exc.stdout or b"", exc.stderr or b"", timed_out=timeout)
        except OSError as exc:  # no srun here
            return Result(127, b"", f"srun: {exc}".encode())
        return Result(done.returncode, done.stdout, done.stderr)


def launch_step(plan: LaunchPlan, opts: Options) -> int:
    """Start the plan as one srun step and follow it to its end (as `run_start.launch_run` does over SSH)."""
    if opts.detach:
        raise LauncherError("--detach does not apply to --slurm: submit the job instead (`inv slurm.submit`), "
                            "then `inv status/logs/stop --job ID`")
    commands = {host_command(c.host) for c in plan.nodes}
    if len(commands) > 1:
        raise LauncherError(f"{plan.cluster.source}: under SLURM every node starts the same command (one srun "
                            "step), but the hosts' python or setup differ")
    env = dict(os.environ)
    envs = {c.host.name: resolve_env(c, env) for c in plan.nodes}
    # Static ranks: one lost task ends the step (srun's --kill-on-bad-exit). An elastic group goes on without it.
    static = plan.cluster.rendezvous.elastic.backend != "c10d"
    step = SrunStep([c.host.name for c in plan.nodes], commands.pop(), kill_on_bad_exit=static,
                    job_name=plan.run_id, env=env, cpus_per_task=cpus_per_task(env))
    nodes = {c.host.name: SlurmNode(c.host.name, env) for c in plan.nodes}
    try:
        return run_start.run_attached(plan, opts, nodes, envs, opener=step.open)
    finally:
        for note in step.close(opts.grace):
            opts.err.write(f"note: {note}\n")
