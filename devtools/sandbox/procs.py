"""The controller's one reader of /proc: a process's state and identity, families, command line and namespaces."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

Ident = tuple[int, int]
"""(pid, start time): one process, even after its pid is reused."""


class Stat(NamedTuple):
    """The fields of /proc/PID/stat the sandbox and its tests use."""

    state: str
    """R, S, D, T, Z (zombie), X (dead), ..."""
    ppid: int
    """The parent's pid (1, or a subreaper's, once the parent has died)."""
    pgrp: int
    """The process group's id."""
    start_time: int
    """Clock ticks after boot (field 22): with the pid, it names one process."""


def pids() -> list[int]:
    """Every process id in /proc right now (zombies included)."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def stat(pid: int) -> Stat | None:
    """A process's state, parent, group and start time from /proc/PID/stat; None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return Stat(fields[0], int(fields[1]), int(fields[2]), int(fields[19]))


def start_time(pid: int) -> int:
    """When `pid` started (clock ticks after boot); -1 when there is no such process."""
    found = stat(pid)
    return found.start_time if found else -1


def alive(pid: int, start: int | None = None) -> bool:
    """`pid` exists and is no zombie (pid 1 may take seconds to reap one); given `start`, it is still that process."""
    found = stat(pid)
    return found is not None and found.state not in ("Z", "X") and (start is None or found.start_time == start)


def table() -> dict[int, Stat]:
    """pid -> Stat of every live (not zombie) process."""
    found: dict[int, Stat] = {}
    for pid in pids():
        if (entry := stat(pid)) and entry.state not in ("Z", "X"):
            found[pid] = entry
    return found


def exe(pid: int) -> str | None:
    """The executable `pid` runs (" (deleted)" left off, as after a package upgrade); None when unreadable."""
    try:
        return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        return None


def family(
    roots: Iterable[int], groups: Iterable[int] = (), processes: Mapping[int, Stat] | None = None
) -> list[Ident]:
    """(pid, start time) of the live processes below `roots` or in the process `groups`, and below those.

    The roots themselves are left out. `processes` is a `table()` already taken (one scan serves many questions).
    A process whose parent died hangs under pid 1 (or a subreaper): only its group, if any, still links it.
    """
    processes = table() if processes is None else processes
    root_pids, group_ids = set(roots), set(groups)
    below: dict[int, list[int]] = {}
    found: set[int] = set()
    for pid, entry in processes.items():
        below.setdefault(entry.ppid, []).append(pid)
        if entry.pgrp in group_ids and pid not in root_pids:
            found.add(pid)
    todo = [*root_pids, *found]
    while todo:
        for child in below.get(todo.pop(), []):
            if child not in found and child not in root_pids:
                found.add(child)
                todo.append(child)
    return sorted((pid, processes[pid].start_time) for pid in found)


def pids_mentioning(text: str) -> list[int]:
    """Live processes but this one whose command line contains `text` (a zombie's is empty)."""
    needle = text.encode()
    found: list[int] = []
    for pid in pids():
        try:
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid() and alive(pid)]


def namespace(pid: int, kind: str = "uts") -> int | None:
    """The inode of `pid`'s namespace of `kind` (uts, mnt, ...); None when gone or unreadable."""
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


class Namespaces:
    """Namespaces of some processes, held open while other processes are matched against them.

    An open namespace cannot be freed, so its inode cannot be reused by a namespace made meanwhile: a match is a
    process of the held one even after every process we held it through has died. This process's own namespace
    is never held (it would match the whole machine).
    """

    def __init__(self, kind: str = "uts"):
        self.kind = kind
        self._held: dict[int, int] = {}  # inode -> open file descriptor
        self._own = namespace(os.getpid(), kind)

    def hold(self, pid: int, start: int) -> None:
        """Hold the namespace of process (`pid`, `start`), if it is still that process and not in ours."""
        try:
            fd = os.open(f"/proc/{pid}/ns/{self.kind}", os.O_RDONLY)
        except OSError:
            return
        inode = os.fstat(fd).st_ino
        # Checked after opening: the namespace is the one of that process, not of a process with its pid now.
        if inode == self._own or inode in self._held or not alive(pid, start):
            os.close(fd)
            return
        self._held[inode] = fd

    def __contains__(self, pid: object) -> bool:
        return bool(self._held) and isinstance(pid, int) and namespace(pid, self.kind) in self._held

    def close(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held.clear()

    def __enter__(self) -> Namespaces:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
