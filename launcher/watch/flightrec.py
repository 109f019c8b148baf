"""What NCCL's flight recorder says of each rank's collectives (pure): the collective a rank enqueued that has not
completed, and the ranks that never enqueued it.

On a GPU a rank stuck behind a hung collective shows none on its Python stack: the all-reduce runs as a kernel, and
the host waits on the stream behind it, in a CUDA synchronisation on the user's own line (`loss.item()`), spinning.
Seen on an H100 (torch 2.11, NCCL 2.28): DDP's gradient all-reduce of a rank whose peer slept, the rank's main thread
in `loss.item()` for the whole hang. Its flight recorder tells: per process group the last collective enqueued and
the last completed (`pg_status`), and each collective's sequence number, name, state and Python frames (`entries`).

The dumps are pickles that torch writes (dicts, lists, strings, numbers): read by an unpickler that refuses every
global, so a dump cannot run code here (https://docs.python.org/3/library/pickle.html#restricting-globals).
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.node.wire import NCCL_PREFIX
from launcher.ranges import numbers_text
from launcher.watch.frames import is_library


@dataclass(frozen=True)
class InFlight:
    """A collective a rank enqueued that has not completed: the oldest one of its process group."""

    group: str
    """The process group's name in the dump ("0"), as `pg_status` keys it."""
    group_desc: str
    """What the program called it (`default_pg`), or its name."""
    seq: int
    """Its collective sequence number in the group (torch's `collective_seq_id`)."""
    name: str
    """all_reduce, all_reduce_barrier, broadcast, ... (`nccl:` left off), or `collective` when the entry is gone."""
    where: str | None
    """The innermost frame of the user's that called it (`train.py:88`); None from a thread of torch's (DDP's
    gradient all-reduce runs on the autograd thread)."""


@dataclass(frozen=True)
class Collectives:
    """One rank's collectives as its dump says them."""

    rank: int
    last: Mapping[str, int]
    """Process group name -> the last collective enqueued."""
    in_flight: InFlight | None


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight recorder dump names {module}.{name}: not read")


def read_dump(data: bytes, rank: int) -> Collectives | None:
    """A rank's dump -> its collectives; None when it is no dump of torch's (or one of a shape not known here)."""
    try:
        dump = _NoGlobals(io.BytesIO(data)).load()
    except Exception:  # any bytes at all: a stand-in's, a cut-off file, a refused global
        return None
    if not isinstance(dump, dict) or not isinstance(dump.get("pg_status"), dict):
        return None
    found = dump.get("pg_config")
    config: dict[Any, Any] = found if isinstance(found, dict) else {}
    entries = [e for e in dump.get("entries") or () if isinstance(e, dict) and not e.get("is_p2p")]
    last: dict[str, int] = {}
    in_flight = None
    for group, status in sorted(dump["pg_status"].items()):
        if not isinstance(status, dict):
            continue
        enqueued, completed = status.get("last_enqueued_collective"), status.get("last_completed_collective")
        if not isinstance(enqueued, int) or not isinstance(completed, int):
            continue
        last[str(group)] = enqueued
        if enqueued > completed and in_flight is None:
            named = config.get(group)
            desc = named.get("desc") if isinstance(named, dict) else None
            in_flight = _oldest(entries, str(group), desc or str(group), completed + 1)
    return Collectives(rank, last, in_flight)


def _oldest(entries: list[dict[str, Any]], group: str, desc: str, seq: int) -> InFlight:
    entry = next((e for e in entries if e.get("collective_seq_id") == seq and _group_of(e) == group), None)
    if entry is None:  # the ring buffer moved past it
        return InFlight(group, desc, seq, "collective", None)
    name = str(entry.get("profiling_name") or "collective").rpartition(":")[2]
    return InFlight(group, desc, seq, name, _user_frame(entry.get("frames") or []))


def _group_of(entry: Mapping[str, Any]) -> str:
    group = entry.get("process_group")
    return str(group[0]) if isinstance(group, (list, tuple)) and group else str(entry.get("pg_id"))


def _user_frame(frames: list[Any]) -> str | None:
    """The innermost frame outside torch and the standard library (as the stacks read it), as `file.py:line`."""
    for frame in frames:
        if isinstance(frame, dict) and not is_library(str(frame.get("filename", ""))):
            return f"{str(frame.get('filename', '?')).rpartition('/')[2]}:{frame.get('line', '?')}"
    return None


def sent_dumps(answers: Mapping[str, Mapping[str, Any] | str]) -> dict[str, bytes]:
    """Every dump the nodes sent (file name -> its bytes), decoded once for what is kept (`hangs.write_nccl`) and
    what is read (`recorded`); one that is not base64 is left out of both."""
    found: dict[str, bytes] = {}
    for reply in answers.values():
        if isinstance(reply, str):
            continue
        for name, data in (reply.get("nccl") or {}).items():
            try:
                found[name] = base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError, TypeError):
                continue
    return found


def recorded(dumps: Mapping[str, bytes]) -> dict[int, Collectives]:
    """The dumps torch wrote (`<prefix><rank>`) -> rank -> its collectives."""
    found: dict[int, Collectives] = {}
    for name, raw in dumps.items():
        rank = name[len(NCCL_PREFIX) :]
        if not name.startswith(NCCL_PREFIX) or not rank.isdigit():
            continue
        read = read_dump(raw, int(rank))
        if read is not None:
            found[int(rank)] = read
    return found


def from_answers(answers: Mapping[str, Mapping[str, Any] | str]) -> dict[int, Collectives]:
    """Every node's answer's dumps ({name: base64}) -> rank -> its collectives, for the dumps torch wrote."""
    return recorded(sent_dumps(answers))


def behind(recorded: Mapping[int, Collectives], flight: InFlight) -> list[tuple[int, int]]:
    """The ranks whose dump shows they never enqueued `flight` (rank, its last in that group), in rank order."""
    return sorted(
        (c.rank, c.last[flight.group])
        for c in recorded.values()
        if flight.group in c.last and c.last[flight.group] < flight.seq
    )


def flight_line(flight: InFlight) -> str:
    """`all_reduce #11 of default_pg (gpu_hang.py:27)`."""
    return f"{flight.name} #{flight.seq} of {flight.group_desc}" + (f" ({flight.where})" if flight.where else "")


def in_flight_said(recorded: Mapping[int, Collectives]) -> str:
    """`all_reduce #11 of default_pg has not completed on rank 0; rank 1 never entered it (its last: #10)`, for the
    ranks whose collectives are in flight (the ranks of one collective said once); "" when none is."""
    flights: dict[InFlight, list[int]] = {}
    for rank, collectives in sorted(recorded.items()):
        if collectives.in_flight is not None:
            flights.setdefault(collectives.in_flight, []).append(rank)
    parts = []
    for flight, ranks in flights.items():
        lasts: dict[int, list[int]] = {}
        for rank, last in behind(recorded, flight):
            lasts.setdefault(last, []).append(rank)
        never = "".join(
            f"; {ranks_text(late)} never entered it ({'its' if len(late) == 1 else 'their'} last: #{last})"
            for last, late in sorted(lasts.items())
        )
        parts.append(f"{flight_line(flight)} has not completed on {ranks_text(ranks)}{never}")
    return "; ".join(parts)


def ranks_text(ranks: Sequence[int]) -> str:
    """`rank 3`, `ranks 0-2,4`."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {numbers_text(sorted(ranks))}"
