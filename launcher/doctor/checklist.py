"""The doctor's checks run in order: the table's columns (`CHECKS`), the ones a launch runs (`FAST_CHECKS`), and
`evaluate`, from the probes' `Evidence` to `Finding`s. The checks themselves are pure functions, each registered once
by name (`launcher.doctor.registry`): those of each node's own setup (checks_node.py), its Python environment
(checks_python.py), its GPUs (checks_gpu.py), those between nodes (checks_net.py).
"""

from __future__ import annotations

# Importing them registers their checks.
from launcher.doctor import checks_gpu, checks_net, checks_node, checks_python  # noqa: F401
from launcher.doctor.evidence import Evidence, Finding
from launcher.doctor.registry import _REGISTRY, CheckFunction

CHECKS: tuple[str, ...] = (
    "ssh",
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


def selected_checks(checks: str) -> tuple[str, ...]:
    """The names of the checks a mode runs: "all" or "fast"."""
    if checks == "all":
        return CHECKS
    if checks == "fast":
        return FAST_CHECKS
    raise ValueError(f"checks must be 'all' or 'fast', got {checks!r}")


def evaluate(ev: Evidence, checks: str = "all") -> list[Finding]:
    """Run the selected checks; findings in inventory order, then check order."""
    names = selected_checks(checks)
    findings = [f for name in names for f in _REGISTRY[name].run(ev)]
    order = {h.name: i for i, h in enumerate(ev.cluster.hosts)}
    return sorted(findings, key=lambda f: (order.get(f.host, len(order)), names.index(f.check)))
