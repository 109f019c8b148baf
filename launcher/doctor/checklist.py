"""The doctor's checks run in order: the table's columns (`CHECKS`), the ones a launch runs (`FAST_CHECKS`), and
`evaluate`, from the probes' `Evidence` to `Finding`s. The checks themselves are pure functions, each registered once
by name (`launcher.doctor.registry`): those of each node's own setup (checks_node.py), a container host's runtime
and image (checks_image.py), its Python environment (checks_python.py), its GPUs (checks_gpu.py), those between
nodes (checks_net.py).
"""

from __future__ import annotations

from launcher.config.model import Cluster

# Importing them registers their checks.
from launcher.doctor import checks_gpu, checks_image, checks_net, checks_node, checks_python  # noqa: F401
from launcher.doctor.evidence import Evidence, Finding
from launcher.doctor.registry import _REGISTRY, CheckFunction

CHECKS: tuple[str, ...] = (
    "ssh",
    "image",
    "python",
    "torch",
    "dns",
    "hostname",
    "port",
    "tcp",
    "script",
    "gpus",
    "packages",
    "disk",
    "clock",
    "iface",
)
"""Every check, in column order."""
if set(CHECKS) != set(_REGISTRY):  # a check registered but given no column, or a column without its check
    raise RuntimeError(f"the doctor's columns and its checks differ: {sorted(set(CHECKS) ^ set(_REGISTRY))}")
FAST_CHECKS: tuple[str, ...] = tuple(name for name in CHECKS if _REGISTRY[name].fast)
"""What matters for starting a run: `launch` checks these before it starts anything."""


def check_function(name: str) -> CheckFunction:
    """The function registered as check `name`."""
    return _REGISTRY[name].run


def selected_checks(checks: str, cluster: Cluster | None = None) -> tuple[str, ...]:
    """The names of the checks a mode runs: "all" or "fast"; for `cluster`, those that apply to it (the container
    hosts' checks only where there is one)."""
    if checks == "all":
        names = CHECKS
    elif checks == "fast":
        names = FAST_CHECKS
    else:
        raise ValueError(f"checks must be 'all' or 'fast', got {checks!r}")
    if cluster is None or any(h.container is not None for h in cluster.hosts):
        return names
    return tuple(name for name in names if not _REGISTRY[name].containers)


def evaluate(ev: Evidence, checks: str = "all") -> list[Finding]:
    """Run the selected checks; findings in inventory order, then check order."""
    names = selected_checks(checks)
    findings = [f for name in names for f in _REGISTRY[name].run(ev)]
    order = {h.name: i for i, h in enumerate(ev.cluster.hosts)}
    return sorted(findings, key=lambda f: (order.get(f.host, len(order)), names.index(f.check)))
