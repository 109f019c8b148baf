"""Pure decisions of a launch with retries: which nodes the next attempt runs on, who the master is, what the job
adds, and how each attempt is told. The attempts themselves (I/O) are `launcher/run/attempts.py`.

Like Horovod's elastic driver: a node that fails the doctor's fast checks sits out the next attempt, and a node that
caused two failed attempts is blacklisted for a cool-down; unlike torchrun's own restarts, a new attempt may have a
new master (torchrun cannot move its c10d store).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from launcher.config.model import Cluster, Host, Job
from launcher.limits import FAILURES_TO_BLACKLIST


@dataclass(frozen=True)
class Attempt:
    """One start of a run across its nodes, and how it ended."""

    number: int
    run_id: str
    nodes: tuple[str, ...]
    master: str
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    outcome: str = "running"
    """running, ok, failed (retryable), failed-final, interrupted."""
    why: str = ""
    """How it ended, in a sentence (the root cause of a failure)."""
    cause: str | None = None
    """The node whose failure ended it, if one did."""
    how: str = ""
    """launcher.plan.recovery's word for its end (ok, lost, hang, ...); "" while it runs."""
    step: int | None = None
    """A hang's: the furthest step the ranks' lines named when it hung."""
    sat_out: dict[str, str] = field(default_factory=dict)
    """The nodes the decision after the previous attempt kept out of this one, and why."""
    resumed_from: int | None = None
    """The first step its ranks' lines named (where a resumed run went on from)."""
    hang_since: float | None = None
    """When it stopped making progress, where it hung (wall clock)."""
    training_at: float | None = None
    """When its last rank's first optimizer step ended (wall clock: the nodes')."""

    def line(self, previous: Attempt | None = None) -> str:
        """`attempt 2 (run 2026...) on node-0, node-2; master node-0; node-1 sat out (its rank 1 held the run up at
        step 12); resumed at step 10: exit 0 after 20 s; training again 31 s after the hang began`."""
        took = f" after {self.ended_at - self.started_at:.0f} s" if self.ended_at else ""
        sat = "".join(f"; {name} sat out ({why})" for name, why in self.sat_out.items())
        resumed = f"; resumed at step {self.resumed_from}" if self.resumed_from is not None and self.number > 1 else ""
        back = ""
        if previous is not None and previous.hang_since is not None and self.training_at is not None:
            back = f"; training again {self.training_at - previous.hang_since:.0f} s after the hang began"
        return (
            f"attempt {self.number} (run {self.run_id}) on {', '.join(self.nodes)}; master {self.master}{sat}"
            f"{resumed}: {self.why or self.outcome}{took}{back}"
        )

    def as_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class NextNodes:
    """Where the next attempt runs, and why each node left out is left out."""

    cluster: Cluster
    """The cluster of the next attempt: the kept hosts in inventory order, the master moved if it had to."""
    dropped: Mapping[str, str]
    """Node -> why it sits out this attempt."""
    new_master: str | None = None
    """The new master's name, when the old master is left out."""


def blacklisted(failures: Mapping[str, Sequence[float]], now: float, cooldown: float) -> dict[str, str]:
    """Nodes that caused FAILURES_TO_BLACKLIST failed attempts, whose cool-down (from the last) is not over."""
    out = {}
    for node, times in failures.items():
        if len(times) >= FAILURES_TO_BLACKLIST and now - times[-1] < cooldown:
            left = cooldown - (now - times[-1])
            out[node] = f"caused {len(times)} failed attempts; cooling down for {left:.0f} s more"
    return out


def next_nodes(cluster: Cluster, unavailable: Mapping[str, str]) -> NextNodes:
    """The cluster without the `unavailable` nodes (name -> why). The master is the first kept host when the old one
    is gone, even if the inventory named it: the old one cannot hold the rendezvous store."""
    kept = tuple(h for h in cluster.hosts if h.name not in unavailable)
    dropped = {h.name: unavailable[h.name] for h in cluster.hosts if h.name in unavailable}
    if not kept:
        return NextNodes(dataclasses.replace(cluster, hosts=()), dropped)
    rdzv = cluster.rendezvous
    old_master = next((h.name for h in cluster.hosts if rdzv.master_addr in (h.name, h.addr)), None)
    new_master = None
    if old_master is None or old_master in dropped or kept[0].name != cluster.hosts[0].name:
        # torchrun's store lives on the first node (node rank 0, or is_host for c10d): the master follows it.
        if kept[0].addr != rdzv.master_addr:
            new_master = kept[0].name
        rdzv = dataclasses.replace(rdzv, master_addr=kept[0].addr)
    return NextNodes(dataclasses.replace(cluster, hosts=kept, rendezvous=rdzv), dropped, new_master)


def with_spares(
    inventory: Cluster, unavailable: Mapping[str, str], spares: Sequence[Host], size: int
) -> tuple[NextNodes, tuple[Host, ...]]:
    """`next_nodes`, with as many of `spares` (the inventory's, in its order, each passed its checks) after the nodes
    it keeps as it takes to run on `size` nodes again; and the spares taken."""
    chosen = next_nodes(inventory, unavailable)
    taken = tuple(spares[: max(0, size - len(chosen.cluster.hosts))])
    if not taken:
        return chosen, ()
    return next_nodes(dataclasses.replace(inventory, hosts=(*inventory.hosts, *taken)), unavailable), taken


def resumed(job: Job) -> Job:
    """The job of a retried attempt: its arguments plus `resume_args` (once, however many retries)."""
    extra = tuple(job.resume_args)
    if not extra or tuple(job.args[-len(extra) :]) == extra:
        return job
    return dataclasses.replace(job, args=(*job.args, *extra))


def summary(attempts: Iterable[Attempt]) -> list[str]:
    """The report's lines: one per attempt (each after a hang says how long the run took to train again)."""
    done = list(attempts)
    return [a.line(done[i - 1] if i else None) for i, a in enumerate(done)]
