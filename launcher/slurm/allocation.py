"""The nodes of the SLURM allocation this launcher runs in, as the cluster the plan is made for.

Inside `salloc` or an `sbatch` script SLURM names the nodes (`SLURM_JOB_NODELIST`, `node-[0-3]`); `scontrol show
hostnames` expands them, in the order SLURM numbers them (`SLURM_NODEID`). The inventory still says everything
else (defaults, job, rendezvous port, env); its host list only lends settings to the nodes it names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace

from launcher.config.model import Cluster
from launcher.errors import LauncherError
from launcher.paths import hint
from launcher.slurm.jobs import failure, run_slurm

NOT_IN_ALLOCATION = (
    "--slurm runs inside a SLURM allocation (SLURM_JOB_ID is not set): start it under `salloc "
    "-N 2 {launch}`, in an sbatch script, or submit with `{submit}`"
)
"""Said outside an allocation; `{launch}` and `{submit}` the commands in the caller's words (`launcher.paths.hint`)."""


def allocation_cluster(cluster: Cluster, names: Sequence[str]) -> Cluster:
    """`cluster` on the allocation's nodes: node i is the allocation's node i, the master the first node.

    A node the inventory names keeps its entry; any other gets the first host's settings (the inventory's defaults
    when, as usual for SLURM, it lists one host or hosts with no settings of their own).
    """
    if not names:
        raise LauncherError("the SLURM allocation has no nodes (SLURM_JOB_NODELIST is empty)")
    known = {h.name: h for h in cluster.hosts}
    template = cluster.hosts[0]
    hosts = tuple(known.get(name) or replace(template, name=name, addr=name) for name in names)
    rendezvous = replace(cluster.rendezvous, master_addr=hosts[0].addr)
    return replace(cluster, hosts=hosts, rendezvous=rendezvous, sync=None, retries=0)


def allocation_nodes(env: Mapping[str, str]) -> list[str]:
    """The allocation's node names, in SLURM's node-id order (`scontrol show hostnames $SLURM_JOB_NODELIST`)."""
    if not env.get("SLURM_JOB_ID"):
        raise LauncherError(NOT_IN_ALLOCATION.format(launch=hint("launch --slurm ..."), submit=hint("slurm.submit")))
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    shown = run_slurm(["scontrol", "show", "hostnames", nodelist], env=env)
    if shown.returncode != 0:
        raise LauncherError(f"scontrol show hostnames {nodelist!r} failed: {failure(shown)}")
    return shown.stdout.split()


def cpus_per_task(env: Mapping[str, str]) -> int | None:
    """CPUs for each node's one task: the job's `--cpus-per-task`, else all the job holds on its smallest node.

    srun 22.05 no longer reads SLURM_CPUS_PER_TASK, and a step's task gets one CPU by default: under task/cgroup
    torchrun and every worker of the node would then share that one CPU.
    """
    if env.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return int(env["SLURM_CPUS_PER_TASK"])
    counts = [int(n) for n in re.findall(r"(\d+)(?:\(x\d+\))?", env.get("SLURM_JOB_CPUS_PER_NODE", ""))]
    return min(counts) if counts else None
