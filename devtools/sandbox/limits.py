"""The sandbox's own numbers and its error (the checkout's tool: none of it is the product's)."""

from launcher.errors import LauncherError

SANDBOX_STOP_GRACE_S = 3.0
"""Seconds between TERM and KILL when a sandbox node is stopped."""
SANDBOX_STOP_LIMIT_S = 60.0
"""How long a stop may take in all before it gives up and names what it could not stop."""
SANDBOX_MAX_NODES = 512
"""The most sshd nodes one sandbox starts (each takes a loopback address, a few processes and ~5 MB): twice the
256 nodes the bench measures."""
SANDBOX_CPUS_PER_NODE = 2
"""CPUs each sandbox node declares to its slurmd."""


class SandboxError(LauncherError):
    """The sandbox cannot be started, found or stopped; the message says why and what to do."""
