"""Stopping nodes: only the processes we started and their families, TERM, a grace period, KILL, until none is left."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from contextlib import suppress

from devtools.sandbox import procs
from devtools.sandbox.limits import SANDBOX_STOP_GRACE_S, SANDBOX_STOP_LIMIT_S, SandboxError
from devtools.sandbox.procs import Ident
from devtools.sandbox.render import SSHD


def stop_families(leaders: Sequence[Ident]) -> set[int]:
    """Stop `leaders` (the node processes we started) and their families until none is left; return the pids
    that needed SIGKILL. Raises SandboxError naming the processes still alive after SANDBOX_STOP_LIMIT_S.

    A node's family: what its shell runs before it execs sshd (in the leader's process group), every sshd process
    of the node (found by the node's UTS namespace: a listener that dies orphans the connections it forked after
    our last look, and they start sessions of their own), everything below those, and the groups of all of them.
    A run started detached leaves the sshd sessions behind, so it is no one's family and outlives the node.
    """
    killed: set[int] = set()
    groups = {pid for pid, _ in leaders}
    deadline = time.monotonic() + SANDBOX_STOP_LIMIT_S
    with procs.Namespaces("uts") as nodes:
        while True:
            for leader in leaders:  # held before any signal, so that what the leader forks can still be found
                nodes.hold(*leader)
            _, targets, groups = scan(leaders, groups, nodes)
            if not targets:
                return killed
            if time.monotonic() > deadline:
                left = ", ".join(str(pid) for pid, _ in targets)
                raise SandboxError(f"could not stop processes {left} within {SANDBOX_STOP_LIMIT_S:g} s; "
                                   "kill them by hand.")
            killed |= terminate(targets)


def scan(leaders: Sequence[Ident], groups: set[int], nodes: procs.Namespaces,
         strays: frozenset[str] = frozenset({SSHD})) -> tuple[list[Ident], list[Ident], set[int]]:
    """From one look at the process table: the live leaders; every target (them, the processes of the `strays`
    executables in the nodes' namespaces, the families of both); and the process groups to follow next time (the
    targets', and those of `groups` that still have a member; never this process's own)."""
    table = procs.table()
    # A group without a live member never gets one again, and its id may then be reused: forget it.
    groups = groups & {entry.pgrp for entry in table.values()}
    live = [(pid, start) for pid, start in leaders if pid in table and table[pid].start_time == start]
    found = [(pid, entry.start_time) for pid, entry in table.items()
             if strays and pid in nodes and procs.exe(pid) in strays]
    roots = sorted({*live, *found})
    targets = sorted({*roots, *procs.family([pid for pid, _ in roots], groups, table)})
    return live, targets, (groups | {table[pid].pgrp for pid, _ in targets}) - {os.getpgrp()}


def terminate(targets: Sequence[Ident], grace: float = SANDBOX_STOP_GRACE_S) -> set[int]:
    """SIGTERM, wait up to `grace`, then SIGKILL; return the pids that needed SIGKILL."""
    for pid, start in targets:
        _signal(pid, start, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (left := [t for t in targets if procs.alive(*t)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid, start in left:
        _signal(pid, start, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while any(procs.alive(*t) for t in left) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {pid for pid, _ in left}


def _signal(pid: int, start: int, sig: signal.Signals) -> None:
    """Signal (pid, start) only while it is that process, alive."""
    if procs.alive(pid, start):
        with suppress(ProcessLookupError):
            os.kill(pid, sig)
