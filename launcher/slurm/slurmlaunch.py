"""`inv launch --slurm`: the plan's run as one srun step of the allocation, supervised like a run over SSH.

The plan, the agents' requests, the doctor's checks in the start session, the supervision, the prefixed output and
the root cause are the SSH launch's own (`run_launch.run_attached`); only the sessions differ: the tasks of one step
(`step.SrunStep`) instead of an SSH channel per node.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from launcher.errors import LauncherError
from launcher.paths import hint
from launcher.plan.launchplan import LaunchPlan
from launcher.run import launch as run_launch
from launcher.run.nodeenv import resolve_env
from launcher.run.run_io import RunIO
from launcher.slurm import pyxis
from launcher.slurm.allocation import cpus_per_task
from launcher.slurm.step import SrunStep
from launcher.transport.channel import Result
from launcher.transport.program import host_command
from launcher.transport.sshconfig import SSHTarget


class StepProcess:
    """A command on one node as an srun step, its stdin open: the doctor's listener (`open_channel`)."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )

    def send(self, data: bytes, block: bool = True) -> bool:
        if self._proc.stdin is None:
            return False
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except OSError:  # srun ended: its output says why
            return False
        return True

    def close_stdin(self) -> None:
        # Taken from the Popen too: its communicate() (in collect) would flush a closed stdin and raise.
        stdin, self._proc.stdin = self._proc.stdin, None
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.close()

    def collect(self, timeout: float | None = None) -> Result:
        try:
            out, err = self._proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return Result(-1, b"", b"", timed_out=timeout)
        return Result(self._proc.returncode, out, err)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


@dataclass
class SlurmNode:
    """One allocated node, reached through steps of its job: what the supervision runs beside the run's step (the
    sweep after a dead agent), and the doctor's probes and listener under SLURM."""

    name: str
    env: dict[str, str]
    timeout: float = 0.0
    """No connection to open first (run_all adds a node's connect timeout to its bound): srun's step is the run."""

    @property
    def target(self) -> SSHTarget:
        """Its name where a failure is said (`transport.failures.classify`): no SSH reaches it."""
        return SSHTarget(self.name, self.name, 0)

    def _argv(self, command: str) -> list[str]:
        # --overlap: the run's step, or a job's own, holds the node's CPUs.
        return [
            "srun",
            "--overlap",
            "--nodes",
            "1",
            "--ntasks",
            "1",
            "--nodelist",
            self.name,
            "--input",
            "all",
            "/bin/sh",
            "-c",
            command,
        ]

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> Result:
        """Run `command` on this node as a step of its own."""
        try:
            done = subprocess.run(self._argv(command), input=stdin, capture_output=True, env=self.env, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            return Result(-1, exc.stdout or b"", exc.stderr or b"", timed_out=timeout)
        except OSError as exc:  # no srun here
            return Result(127, b"", f"srun: {exc}".encode())
        return Result(done.returncode, done.stdout, done.stderr)

    def open_channel(self, command: str) -> StepProcess:
        """Start `command` on this node as a step of its own, its stdin kept open."""
        return StepProcess(self._argv(command), self.env)


def slurm_nodes(names: Iterable[str], env: dict[str, str]) -> dict[str, SlurmNode]:
    """Each node of the job `env` names, by name, reached through steps of that job."""
    return {name: SlurmNode(name, env) for name in names}


def launch_step(plan: LaunchPlan, run_io: RunIO, env: dict[str, str] | None = None, overlap: bool = False) -> int:
    """Start the plan as one srun step and follow it to its end (as `run_launch.launch_run` does over SSH): in this
    allocation, or in the job `env` names (`overlap`: beside the job's own steps)."""
    if plan.settings.run.detach:
        raise LauncherError(
            f"--detach does not apply to --slurm: submit the job instead (`{hint('slurm.submit')}`), "
            f"then `{hint('status/logs/stop --job ID')}`"
        )
    env = dict(os.environ if env is None else env)
    plan, image = pyxis.in_image(plan, env)  # the tasks in the image (pyxis), or refused before anything starts
    commands = {host_command(c.host) for c in plan.nodes}
    if len(commands) > 1:
        raise LauncherError(
            f"{plan.cluster.source}: under SLURM every node starts the same command (one srun "
            "step), but the hosts' python or setup differ"
        )
    envs = {c.host.name: resolve_env(c, env) for c in plan.nodes}
    # Static ranks: one lost task ends the step (srun's --kill-on-bad-exit). An elastic group goes on without it.
    static = plan.cluster.rendezvous.elastic.backend != "c10d"
    step = SrunStep(
        [c.host.name for c in plan.nodes],
        commands.pop(),
        kill_on_bad_exit=static,
        job_name=plan.run_id,
        env=env,
        cpus_per_task=cpus_per_task(env),
        overlap=overlap,
        container=image,
    )
    nodes = slurm_nodes((c.host.name for c in plan.nodes), env)
    try:
        return run_launch.run_attached(plan, run_io, nodes, envs, opener=step.open)
    finally:
        for note in step.close(plan.settings.run.grace):
            run_io.err.write(f"note: {note}\n")
