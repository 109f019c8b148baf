"""Which nodes of a c10d run stand by as spares (pure): torch's rendezvous takes at most its maximum of nodes, and a
host of the inventory past it keeps its torchrun waiting in the rendezvous, with no worker, until the group ends
(then torchrun ends on the store gone: `RendezvousConnectionError`, exit code 1) or needs it (a node left).

A node is a spare once the run's other nodes have had workers for SPARE_AFTER_S while it had none: workers start
within a second or two of each other after a rendezvous, so a node merely slower to spawn them is never one. Only
where the run can have one: a c10d rendezvous whose maximum is under its hosts' count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.config.model import Elastic
from launcher.limits import SPARE_AFTER_S


@dataclass
class SpareWatch:
    """The run's spares, from every node's `alive` beats (times: the controller's monotonic clock)."""

    possible: bool
    """A c10d run on more hosts than its rendezvous's maximum: some stand by."""
    hosts: int = 0
    most: int = 0
    """The run's hosts, and the most its group takes."""
    on_found: Callable[[str], None] = lambda node: None
    """Told once a node is found a spare (the console says so, and folds torchrun's lines on its end)."""
    worked: set[str] = field(default_factory=set)
    """The nodes that have had workers (a spare the group took later is one of them: no longer a spare)."""
    spares: set[str] = field(default_factory=set)
    _since: dict[str, float] = field(default_factory=dict)
    """Since when a node has had no worker while others have."""

    @classmethod
    def of(cls, elastic: Elastic, hosts: int) -> SpareWatch:
        most = elastic.nodes_range(hosts)[1]
        return cls(elastic.backend == "c10d" and most < hosts, hosts, most)

    def line(self, node: str) -> str:
        return (
            f"{node} stands by as a spare: the c10d group takes {self.most} of the {self.hosts} hosts "
            "(rendezvous.nodes); its torchrun waits in the rendezvous, no worker on it, until the run ends or needs it"
        )

    def observe(self, now: float, node: str, ranks: Iterable[Mapping[str, Any]]) -> bool:
        """One node's beat; whether it made the node a spare (once: `on_found` is told)."""
        if not self.possible:
            return False
        if list(ranks):
            self.worked.add(node)
            self.spares.discard(node)
            self._since.pop(node, None)
            return False
        if node in self.worked or node in self.spares or not self.worked - {node}:
            return False
        since = self._since.setdefault(node, now)
        if now - since < SPARE_AFTER_S:
            return False
        self.spares.add(node)
        self.on_found(node)
        return True
