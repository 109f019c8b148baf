"""Where a task's nodes come from (the shared opening of every task): the inventory or hostfile, the `--include`/
`--exclude` choice, and the project whose tree `--sync` sends."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from launcher.config.container import with_image
from launcher.config.hostfile import DEFAULTS_SOURCE, load_hosts
from launcher.config.model import Cluster, SyncSpec
from launcher.config.selection import select_hosts
from launcher.errors import UsageError


@dataclass(frozen=True)
class Hosts:
    """Where a task's nodes come from: `--hosts`, what a hostfile takes from invoke.yaml, `--include`/`--exclude`."""

    path: str
    """An inventory (YAML, self-contained) or a DeepSpeed/MPI hostfile (`worker-1 slots=8`)."""
    defaults: Mapping[str, Any] | None = None
    """invoke.yaml's `launcher.defaults`, for a hostfile: any key a host may set, and
    `hostfile.HOSTFILE_SETTINGS` (how this machine reaches the nodes: ssh_config, host_key_policy)."""
    job: Mapping[str, Any] | None = None
    """invoke.yaml's `launcher.job`, for a hostfile; `--script`/`--args` replace it as they replace an inventory's."""
    include: str | None = None
    """`--include` in DeepSpeed's syntax (`worker-1:0,2@worker-2`): only these hosts (and GPUs)."""
    exclude: str | None = None
    """`--exclude`: every host but these (or without these GPUs)."""
    project: Path | None = None
    """The user's project (the installed command's: `launcher.project.find_root`): a relative `sync.src` starts
    there, and a submitted SLURM job; None: the current folder, and this checkout."""
    defaults_source: str = DEFAULTS_SOURCE
    """The settings file `defaults` and `job` come from, as messages name it."""
    image: str | None = None
    """`--image`: the container image every node runs the job in, over the inventory's `container.image`."""


def load_inventory(hosts: str | Hosts) -> Cluster:
    """The cluster every task works on: the inventory or hostfile, then the `--include`/`--exclude` choice.

    A wrong `--include`/`--exclude` is a `SelectionError` of one sentence naming the option and the host, exit code 2.
    """
    spec = hosts if isinstance(hosts, Hosts) else Hosts(hosts)
    cluster = load_hosts(spec.path, spec.defaults, spec.job, spec.defaults_source)
    try:
        cluster = with_image(cluster, spec.image)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return select_hosts(cluster, spec.include, spec.exclude)  # SelectionError: the command line is wrong (exit 2)


def with_project_src(cluster: Cluster, hosts: str | Hosts) -> Cluster:
    """The cluster whose `sync` sends the project's tree wherever in the project the command was run: a relative
    `sync.src` (default `.`) starts at the installed command's project root."""
    project = hosts.project if isinstance(hosts, Hosts) else None
    if project is None:
        return cluster
    spec = cluster.sync or SyncSpec()
    return replace(cluster, sync=replace(spec, src=str(project / Path(spec.src).expanduser())))
