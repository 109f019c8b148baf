"""What every rank did with its collectives, across the run (pure): the ranks *behind* (a hang's suspects) and the
rank that *arrives last* (the straggler), from each rank's collectives as its node's beats carry them
(launcher/node/worker/collectives.py reads torch's flight recorder inside each worker; launcher/node/agent/records.py
passes each arrival on once).

Why not the host's time: CUDA is asynchronous, so a rank waiting for a slow or stuck peer blocks at whatever
synchronisation comes first (a `.item()`, a forward's allocation), and its wait lands there. What it cannot hide is
the collective it *entered*: a rank whose last enqueued collective of a group is older than the group's newest is
behind, whatever its CPU or its stack says; in lockstep data parallelism the rank that enters each collective last
holds the others back for the difference.

Arrival times are each rank's wall clock (torch's `time_created_ns`): nodes' clocks must agree to well under a
step (NTP keeps them within milliseconds).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.limits import ARRIVALS_KEPT, COLLECTIVES_FRESH_S
from launcher.watch.flightrec import ranks_text

MIN_SPAN_S = 1.0
"""Arrivals over less than this are too few to say who holds the others back."""


@dataclass(frozen=True)
class Behind:
    """A collective some ranks of its group entered and others did not."""

    group: str
    desc: str
    seq: int
    """The first collective the ranks behind did not enter (the one the others wait in)."""
    name: str | None
    late: Mapping[int, int]
    """Each rank behind -> its last enqueued collective in the group."""
    entered: tuple[int, ...]

    @property
    def collective(self) -> str:
        return f"{self.name or 'collective'} #{self.seq} of {self.desc}"

    def line(self) -> str:
        """`rank 1 never entered all_reduce #101 of default_pg (its last: #100), which rank 0 entered`."""
        lasts: dict[int, list[int]] = {}
        for rank, last in sorted(self.late.items()):
            lasts.setdefault(last, []).append(rank)
        parts = [
            f"{ranks_text(ranks)} never entered {self.collective} "
            f"({'its' if len(ranks) == 1 else 'their'} last: #{last})"
            for last, ranks in sorted(lasts.items())
        ]
        return "; ".join(parts) + f", which {ranks_text(self.entered)} entered"


@dataclass(frozen=True)
class Stuck:
    """A collective every rank of its group entered and none completed: the collective itself (network, NCCL)."""

    group: str
    desc: str
    seq: int
    name: str | None
    ranks: tuple[int, ...]

    def line(self) -> str:
        return (
            f"every rank of {self.desc} ({ranks_text(self.ranks)}) entered {self.name or 'collective'} #{self.seq} "
            "and none completed it: the collective itself is stuck (the network, or NCCL)"
        )


@dataclass(frozen=True)
class Late:
    """A rank that arrives last at the collectives, over a window."""

    rank: int
    wait_share: float
    """The others' wait for it, per second of the window (0.6: they wait 60% of their time)."""
    last_share: float
    """The share of the window's collectives it entered last."""
    collectives: int
    """The collectives of the window, entered by every rank of their group."""


@dataclass
class _Seen:
    groups: Mapping[str, Mapping[str, Any]]
    source: str | None
    read_at: float
    """The wall time its worker read them (the beat's time less their age)."""


@dataclass
class Arrivals:
    """Each rank's collectives as the beats bring them: the last status of its groups, and the arrival times."""

    fresh_s: float = COLLECTIVES_FRESH_S
    kept: int = ARRIVALS_KEPT
    seen: dict[int, _Seen | None] = field(default_factory=dict)
    """rank -> its collectives as last read (None: the rank has none: no recorder, or its torch too old)."""
    arrived: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)
    """group -> collective -> rank -> when the rank entered it (wall seconds)."""
    names: dict[tuple[str, int], str] = field(default_factory=dict)
    members: dict[str, set[int]] = field(default_factory=dict)
    """group -> the ranks that reported it."""
    stopped: dict[int, str] = field(default_factory=dict)
    """rank -> why its worker's thread stopped reading its collectives (it never will again)."""
    stepped: dict[int, float | None] = field(default_factory=dict)
    """rank -> when its first optimizer step ended (wall seconds; None: not yet, or no step the hook sees)."""

    def feed(self, ranks: Iterable[Mapping[str, Any]], now: float) -> None:
        """One node's beat (its ranks' `collectives`), at wall time `now`."""
        for rank in ranks:
            number, found = int(rank["rank"]), rank.get("collectives")
            first = rank.get("first_step_at")
            self.stepped[number] = float(first) if isinstance(first, int | float) else self.stepped.get(number)
            if isinstance(found, Mapping) and found.get("why"):
                self.stopped[number] = str(found["why"])
            if not isinstance(found, Mapping) or not found.get("source"):
                self.seen[number] = None
                continue
            groups = found.get("groups") or {}
            self.seen[number] = _Seen(groups, str(found["source"]), now - float(found.get("age_s") or 0.0))
            for group in groups:
                self.members.setdefault(group, set()).add(number)
            for group, rows in (found.get("arrivals") or {}).items():
                by_seq = self.arrived.setdefault(group, {})
                for seq, name, at in rows:
                    by_seq.setdefault(int(seq), {})[number] = float(at)
                    self.names[(group, int(seq))] = str(name)
                for old in sorted(by_seq)[: -self.kept]:
                    del by_seq[old]
                    self.names.pop((group, old), None)

    def sources(self) -> dict[int, str | None]:
        """rank -> where its figures come from (`flight recorder`, `nccl flight recorder`; None: none)."""
        return {rank: None if seen is None else seen.source for rank, seen in self.seen.items()}

    def recording(self) -> bool:
        """Whether the run's recorders keep its collectives: any rank's has process groups in it (with
        TORCH_FR_BUFFER_SIZE=0 torch has a recorder that keeps nothing). A rank without them yet (its thread reads
        a second after the process group is made) does not turn the rule by arrival off: the others show it is
        coming; a rank whose thread stopped (its file says why) does: its arrivals will never come."""
        return not self.stopped and any(s is not None and s.groups for s in self.seen.values())

    def status(self, now: float) -> dict[int, Mapping[str, Mapping[str, Any]]] | None:
        """Every rank's groups, when every rank has them read within `fresh_s`; None otherwise (the rules that
        need them stand aside)."""
        if not self.seen or any(s is None or now - s.read_at > self.fresh_s for s in self.seen.values()):
            return None
        return {rank: seen.groups for rank, seen in self.seen.items() if seen is not None}

    def _name(self, group: str, seq: int, groups: Iterable[Mapping[str, Mapping[str, Any]]]) -> str | None:
        for status in groups:
            flight = status.get(group, {}).get("in_flight")
            if isinstance(flight, list) and len(flight) == 2 and flight[0] == seq and flight[1]:
                return str(flight[1])
        return self.names.get((group, seq))

    def behind(self, now: float) -> list[Behind] | None:
        """The collectives some ranks did not enter while others did; None: not every rank's status is known."""
        status = self.status(now)
        if status is None:
            return None
        found = []
        for group in sorted({g for groups in status.values() for g in groups}):
            enqueued = {rank: int(groups[group]["enqueued"]) for rank, groups in status.items() if group in groups}
            newest = max(enqueued.values())
            late = {rank: last for rank, last in enqueued.items() if last < newest}
            if not late:
                continue
            seq = min(late.values()) + 1
            entered = tuple(sorted(rank for rank, last in enqueued.items() if last >= seq))
            found.append(
                Behind(group, _desc(status, group), seq, self._name(group, seq, status.values()), late, entered)
            )
        return found

    def stuck(self, now: float) -> list[Stuck]:
        """The collectives every rank of a group entered and none completed."""
        status = self.status(now) or {}
        found = []
        for group in sorted({g for groups in status.values() for g in groups}):
            rows = {rank: groups[group] for rank, groups in status.items() if group in groups}
            enqueued = {int(row["enqueued"]) for row in rows.values()}
            if len(rows) < 2 or len(enqueued) != 1:
                continue
            seq = enqueued.pop()
            if seq >= 0 and all(int(row["completed"]) < seq for row in rows.values()):
                found.append(
                    Stuck(
                        group, _desc(status, group), seq, self._name(group, seq, status.values()), tuple(sorted(rows))
                    )
                )
        return found

    def lateness(self, now: float, window_s: float) -> dict[int, Late] | None:
        """Over the collectives of the last `window_s` that every rank of their group entered: for each rank that
        entered any of them last, the share of the time the others waited for it, and how often it was last. None:
        too few arrivals to say yet.

        The others' wait is the union of their waits, not the sum: the buckets of one backward all wait for the
        same late rank at once, and on a GPU a fast rank enqueues collectives ahead of its peers (CUDA runs
        asynchronously until a synchronisation), so that a rank a few steps behind is late to each collective by
        those steps. Counted once, the wait can never exceed the time it spans.

        Once every rank has ended an optimizer step, only the collectives entered after the last of those first
        steps count: the start (the model's broadcast, a trainer's barriers while one rank still imports or loads
        its data) is no training step, and the rank slowest to start is no straggler of the run."""
        if any(s is None or not s.groups for s in self.seen.values()):
            return None  # a rank's collectives not read yet: the arrivals of the others would blame one of them
        firsts = [self.stepped.get(rank) for rank in self.seen]
        trained_from = max(firsts) if firsts and None not in firsts else None  # type: ignore[type-var]
        waits: dict[int, list[tuple[float, float]]] = {}
        lasts: dict[int, int] = {}
        count, first, latest = 0, float("inf"), float("-inf")
        for group, arrivals in self.arrived.items():
            members = self.members.get(group, set())
            if len(members) < 2:
                continue
            for times in arrivals.values():
                if set(times) != members or max(times.values()) < now - window_s:
                    continue
                if trained_from is not None and min(times.values()) < trained_from:
                    continue
                last = max(times, key=lambda rank: times[rank])
                others = [at for rank, at in times.items() if rank != last]
                waits.setdefault(last, []).append((statistics.median(others), times[last]))
                lasts[last] = lasts.get(last, 0) + 1
                count += 1
                first, latest = min(first, *times.values()), max(latest, *times.values())
        if not count or latest - first < MIN_SPAN_S:
            return None
        span = latest - first  # the stretch the arrivals cover (the newest reach here some seconds late)
        return {
            rank: Late(rank, round(_covered(spans) / span, 4), round(lasts[rank] / count, 3), count)
            for rank, spans in waits.items()
        }


def _covered(spans: list[tuple[float, float]]) -> float:
    """The seconds covered by the union of the (start, end) spans."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def answered(answers: Mapping[str, Mapping[str, Any] | str]) -> list[dict[str, Any]]:
    """Each rank's collectives in the nodes' answers to `stacks` (launcher/node/agent/stackdump.py `collect`), as a
    beat's ranks for `Arrivals.feed`: read at the moment of the look."""
    return [
        {"rank": w["rank"], "collectives": w.get("collectives")}
        for reply in answers.values()
        if not isinstance(reply, str)
        for w in reply.get("workers") or ()
        if not w.get("helper")
    ]


def _desc(status: Mapping[int, Mapping[str, Mapping[str, Any]]], group: str) -> str:
    for groups in status.values():
        desc = groups.get(group, {}).get("desc")
        if desc and desc != group:
            return str(desc)
    return f"group {group}"
