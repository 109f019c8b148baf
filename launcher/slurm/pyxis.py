"""A run in a container image under SLURM (`launch --slurm` with `container:`): srun's own containers, through the
pyxis plugin (`srun --container-image`), or a refusal in one sentence before anything starts.

With pyxis every task of the step runs in the image: the launcher's agent too, which then starts torchrun as on a
bare node (the image's `python` and setup lines). The node's home is mounted (the run's folder is under it), the
workdir and the inventory's mounts at their paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from launcher.config.model import Container
from launcher.errors import LauncherError
from launcher.plan.launchplan import LaunchPlan
from launcher.slurm.jobs import run_slurm

PYXIS_FLAG = "--container-image"
"""What srun's help lists where the pyxis plugin is installed."""


def has_pyxis(env: Mapping[str, str]) -> bool:
    """Whether this cluster's srun takes `--container-image` (pyxis): its help says so."""
    try:
        done = run_slurm(["srun", "--help"], env=env)
    except LauncherError:
        return False
    return PYXIS_FLAG in done.stdout + done.stderr


def in_image(plan: LaunchPlan, env: Mapping[str, str]) -> tuple[LaunchPlan, list[str]]:
    """The plan as the tasks run it inside pyxis's container (bare hosts: the agent is in the image already) and
    srun's container flags; the plan as it is, and none, without a container. Raises LauncherError where srun has
    no pyxis, or where the hosts' containers differ (one step runs one image)."""
    boxes = {c.host.container for c in plan.nodes}
    if boxes == {None}:
        return plan, []
    if len(boxes) > 1:
        raise LauncherError(
            f"{plan.cluster.source}: under SLURM every node runs one srun step, so one image, but the hosts' "
            "container settings differ"
        )
    box = next(iter(boxes))
    assert box is not None
    if not has_pyxis(env):
        raise LauncherError(
            f"{plan.cluster.source}: container.image {box.image}: this cluster's srun has no --container-image "
            "(the pyxis plugin), so --slurm cannot run the job in the image; launch over SSH without --slurm, "
            "or ask the cluster's admins for pyxis"
        )
    workdirs = sorted({c.workdir for c in plan.nodes if not c.workdir.startswith("~")})
    hosts = tuple(replace(h, container=None) for h in plan.cluster.hosts)
    bare = replace(
        plan,
        cluster=replace(plan.cluster, hosts=hosts),
        nodes=tuple(replace(c, host=replace(c.host, container=None)) for c in plan.nodes),
    )
    return bare, pyxis_flags(box, workdirs)


def pyxis_flags(box: Container, workdirs: list[str]) -> list[str]:
    """srun's flags for the image: the home mounted (the run's folder), the workdirs and the user's mounts."""
    mounts = [*(f"{w}:{w}" for w in workdirs), *(m if ":" in m else f"{m}:{m}" for m in box.mounts)]
    flags = [PYXIS_FLAG, box.image, "--container-mount-home"]
    if mounts:
        flags += ["--container-mounts", ",".join(mounts)]
    return flags
