"""The sandbox's SLURM cluster on paper: its folder, slurm.conf (one node per sandbox node, each at its sshd's
address), the TaskProlog that gives each node's tasks that node's own cache home, and free ports (pure but for
the port probe)."""

from __future__ import annotations

import hashlib
import socket
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from devtools.sandbox.limits import SANDBOX_CPUS_PER_NODE, SandboxError
from devtools.sandbox.render import config_path

SLURM_DIR_NAME = "slurm"
"""The sandbox's SLURM files live in STATE_DIR/slurm/."""


SLURM_CONF_NAME = "slurm.conf"


TASK_PROLOG = "task_prolog.sh"


_SUN_PATH_MAX = 107  # a unix socket's path, less its NUL


# A job step's unix socket in its node's spool is NODE_JOB.STEP: job ids to 999 (a fresh cluster each up) must fit,
# with a batch job's step id (SLURM_BATCH_SCRIPT, 4294967291).
_STEP_SOCKET = "{name}_999.4294967291"


class SlurmNode(NamedTuple):
    """One slurmd of the sandbox's cluster."""

    name: str
    """Its SLURM node name, the sandbox node's hostname: node-0, node-1, ..."""
    addr: str
    """The sandbox node's loopback address (slurmctld and srun reach its slurmd there)."""
    port: int
    """slurmd's TCP port: unique on the machine, as every slurmd listens on all addresses."""


def slurm_dir(state_dir: Path) -> Path:
    """The folder of the SLURM cluster of the sandbox in `state_dir`."""
    return Path(state_dir).absolute() / SLURM_DIR_NAME


def spool_dir(state_dir: Path) -> Path:
    """The slurmds' spool: a short folder of its own, as a step's unix socket lives there (at most 107 bytes of
    path) and a state folder (pytest's, say) may be long."""
    tag = hashlib.sha256(str(Path(state_dir).absolute()).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"launcher-slurm-{tag}"


def slurm_conf_path(state_dir: Path) -> Path:
    """The slurm.conf of the sandbox in `state_dir` (written by `up(..., slurm=True)`)."""
    return slurm_dir(state_dir) / SLURM_CONF_NAME


def slurm_env(state_dir: Path) -> dict[str, str]:
    """Environment entries that point SLURM's commands (srun, sinfo, salloc, ...) at the sandbox's cluster."""
    return {"SLURM_CONF": str(slurm_conf_path(state_dir))}


def render_task_prolog(homes: Mapping[str, Path]) -> str:
    """The TaskProlog: its `export` lines set a task's environment; each node's tasks get that node's cache home."""
    cases = "".join(f"    {name}) echo export XDG_CACHE_HOME={config_path(home)} ;;\n" for name, home in homes.items())
    return f"#!/bin/sh\ncase \"$SLURMD_NODENAME\" in\n{cases}esac\n"


def render_slurm_conf(folder: Path, ctld_port: int, nodes: Sequence[SlurmNode], cpus: int = SANDBOX_CPUS_PER_NODE,
                      spool: Path | None = None) -> str:
    """slurm.conf of a cluster whose every file (state, logs, pid files) is under `folder`, and its unix sockets (the
    slurmds' spool, munge's) under `spool` (default: `folder`), a short folder: a socket's path has at most 107 bytes,
    and pytest's folders grow a digit every few hundred runs."""
    if not nodes:
        raise SandboxError("a SLURM cluster needs at least one node.")
    base = config_path(folder)  # slurm.conf has no quoting, and '%' is one of its tokens
    spool_base = config_path(spool or folder)
    longest = max(len(f"{spool_base}/{n.name}/{_STEP_SOCKET.format(name=n.name)}") for n in nodes)
    if longest > _SUN_PATH_MAX or len(f"{spool_base}/munge.socket") > _SUN_PATH_MAX:
        raise SandboxError(
            f"the sandbox's state folder {folder.parent} is too long for SLURM: a unix socket under it"
            f" would take {max(longest, len(spool_base) + 13)} of at most {_SUN_PATH_MAX} characters; use a shorter"
            " one."
        )
    lines = [
        "# Written by the launcher's sandbox (`inv sandbox.up --slurm`); use it with SLURM_CONF=THIS_FILE.",
        "ClusterName=sandbox",
        # Host-namespace daemons and every node's /etc/hosts agree on localhost; the port is this cluster's own.
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={spool_base}/munge.socket",  # a socket too: in the short folder
        f"StateSaveLocation={base}/state",
        # %n: one spool per node, SPOOL/node-0/...; a short folder: a step's socket path has at most 107 bytes.
        f"SlurmdSpoolDir={spool_base}/%n",
        f"SlurmctldPidFile={base}/slurmctld.pid",
        f"SlurmdPidFile={base}/slurmd-%n.pid",
        f"SlurmctldLogFile={base}/log/slurmctld.log",
        f"SlurmdLogFile={base}/log/slurmd-%n.log",
        # No cgroups here: processes are tracked by parent pid, and tasks are not bound to CPUs.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        # Every slurmd sees the whole machine: take the node sizes below as they are, not as slurmd counts them.
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MpiDefault=none",
        "KillWait=5",
        # Each node's own cache home for its tasks, as its sshd gives its sessions (srun passes the caller's on).
        f"TaskProlog={base}/{TASK_PROLOG}",
        *(f"NodeName={n.name} NodeAddr={n.addr} Port={n.port} CPUs={cpus} State=UNKNOWN" for n in nodes),
        f"PartitionName=main Nodes={_node_list([n.name for n in nodes])} Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def _node_list(names: Sequence[str]) -> str:
    """node-[0-N] when the names are node-0..node-N, else a comma-separated list."""
    if len(names) > 1 and list(names) == [f"node-{i}" for i in range(len(names))]:
        return f"node-[0-{len(names) - 1}]"
    return ",".join(names)


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on every address right now (the daemons bind 0.0.0.0)."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):  # held together, so the kernel hands out distinct ports
            sock = socket.socket()
            held.append(sock)
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()
