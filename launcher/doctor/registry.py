"""The doctor's check registry and the helpers checks share: each check registered once by name, with whether
`launch` runs it first; `launcher.doctor.checklist` says the order of the table's columns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.config.model import Host
from launcher.doctor.evidence import Evidence, Finding

CheckFunction = Callable[[Evidence], list[Finding]]


@dataclass(frozen=True)
class Check:
    """A registered check: its name (a column of the table), whether `launch` runs it first, and its function."""

    name: str
    fast: bool
    run: CheckFunction
    containers: bool = False
    """A check of container hosts alone (`container:`): a cluster with none has no column for it."""


_REGISTRY: dict[str, Check] = {}
"""Name -> check (`launcher.doctor.checklist.CHECKS` orders them)."""


def check(name: str, *, fast: bool = False, containers: bool = False) -> Callable[[CheckFunction], CheckFunction]:
    """Register the decorated function as the check `name`; `fast` puts it in the launch's start gate; `containers`:
    it looks at container hosts alone."""

    def register(function: CheckFunction) -> CheckFunction:
        if name in _REGISTRY:
            raise ValueError(f"the doctor check {name!r} is registered twice")
        _REGISTRY[name] = Check(name, fast, function, containers)
        return function

    return register


def listed(hosts: Iterable[str], limit: int = 4) -> str:
    hosts = list(hosts)
    if len(hosts) <= limit:
        return ", ".join(hosts)
    return f"{', '.join(hosts[:limit])} and {len(hosts) - limit} more"


def majority(values: Mapping[str, Any], prefer: Any = None) -> Any:
    """The most common value; a tie goes to `prefer` when it is among the tied, else to the first seen."""
    counts = Counter(values.values())
    best = max(counts.values())
    tied = [v for v, c in counts.items() if c == best]
    return prefer if prefer in tied else tied[0]


def answers_of(ev: Evidence) -> dict[str, dict[str, Any]]:
    """The hosts that answered, in inventory order: with the node's facts, or a container host's answer without them
    (its image could not be run: its `container` part says why; its TCP check was made on the host all the same)."""
    return {h.name: o for h in ev.cluster.hosts if isinstance(o := ev.outcomes.get(h.name), dict)}


def probes_of(ev: Evidence) -> dict[str, dict[str, Any]]:
    """The hosts whose probe answered with the node's facts (a container host's: from inside its image), in
    inventory order."""
    return {h: o for h, o in answers_of(ev).items() if "python" in o}


def master_host(ev: Evidence) -> Host:
    """torchrun's rendezvous store runs on node rank 0: the first host."""
    return ev.cluster.hosts[0]


def compare(ev: Evidence, values: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The majority value (ties: the master's) and the hosts that have it."""
    major = majority(values, values.get(master_host(ev).name))
    return major, [h for h, v in values.items() if v == major]
