"""A local cluster for tests and demos: N real sshd servers on loopback addresses, each its own hostname, and
optionally a real SLURM cluster on them."""

from devtools.sandbox.limits import SandboxError
from devtools.sandbox.nodes import (
    DEFAULT_INVENTORY,
    DEFAULT_STATE_DIR,
    PATH_ONLY_RC,
    REPO_ROOT,
    Sandbox,
    SandboxNode,
    down,
    load,
    running,
    stop_node,
    up,
)
from devtools.sandbox.render import (
    SSHD,
    TRAP_ADDR,
    node_addresses,
    node_cache,
    node_command,
    node_name,
    render_hosts,
    render_inventory,
    render_known_hosts,
    render_ssh_config,
    render_sshd_config,
)
from devtools.sandbox.slurmconf import SLURM_CONF_NAME, SlurmNode, render_slurm_conf, slurm_conf_path, slurm_env
from devtools.sandbox.start import default_python

__all__ = [
    "DEFAULT_INVENTORY",
    "DEFAULT_STATE_DIR",
    "PATH_ONLY_RC",
    "REPO_ROOT",
    "SLURM_CONF_NAME",
    "SSHD",
    "TRAP_ADDR",
    "Sandbox",
    "SandboxError",
    "SandboxNode",
    "SlurmNode",
    "default_python",
    "down",
    "load",
    "node_addresses",
    "node_cache",
    "node_command",
    "node_name",
    "render_hosts",
    "render_inventory",
    "render_known_hosts",
    "render_slurm_conf",
    "render_ssh_config",
    "render_sshd_config",
    "running",
    "slurm_conf_path",
    "slurm_env",
    "stop_node",
    "up",
]
