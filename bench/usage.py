"""What a command costs while it runs: peak threads, open file descriptors and resident memory of its process tree.

A thread samples /proc every 20 ms: the process and its descendants (found through /proc/PID/task/TID/children,
so no scan of every process on the machine), and keeps the largest sums seen. For the launcher the tree is its
Python process and its `ssh -G` children; for the ssh loop, bash and its N ssh clients; for pdsh, pdsh and its ssh
clients. A sample can miss a peak shorter than 20 ms: these are lower bounds, good to compare one method with
another and one N with the next.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

INTERVAL_S = 0.02


@dataclass
class Peak:
    """The largest values seen in one sample (each its own maximum over the run)."""

    processes: int = 0
    threads: int = 0
    fds: int = 0
    rss_kb: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"processes": self.processes, "threads": self.threads, "fds": self.fds, "rss_kb": self.rss_kb}


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(w) for w in f.read().split()]
        except OSError:
            continue
    return found


def _one(pid: int) -> tuple[int, int, int] | None:
    """(threads, fds, rss kB) of one process; None once it is gone (or a zombie without memory)."""
    threads = rss = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    threads = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError, IndexError):
        return None
    return threads, fds, rss


def sample_tree(root: int) -> Peak:
    """One sample of `root` and its descendants."""
    peak = Peak()
    todo = [root]
    while todo:
        pid = todo.pop()
        one = _one(pid)
        if one is None:
            continue
        peak.processes += 1
        peak.threads += one[0]
        peak.fds += one[1]
        peak.rss_kb += one[2]
        todo += _children(pid)
    return peak


class Sampler:
    """Samples a process tree on a thread of its own until `stop()`; `peak` holds the largest values seen."""

    def __init__(self, root: int, interval: float = INTERVAL_S):
        self.root = root
        self.interval = interval
        self.peak = Peak()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._done.is_set():
            now = sample_tree(self.root)
            self.peak.processes = max(self.peak.processes, now.processes)
            self.peak.threads = max(self.peak.threads, now.threads)
            self.peak.fds = max(self.peak.fds, now.fds)
            self.peak.rss_kb = max(self.peak.rss_kb, now.rss_kb)
            self._done.wait(self.interval)

    def stop(self) -> Peak:
        self._done.set()
        self._thread.join(5)
        return self.peak
