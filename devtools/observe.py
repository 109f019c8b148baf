"""What the bench and the tests look at on a sandbox: free ports and subnets, a run's processes, families of
processes, sshd's. Read from /proc through `devtools.sandbox.procs` (the sandbox's own reader) where it has the
question; the questions only the bench and the tests ask are answered here, out of the product package. The tests'
support re-exports this module: tests may import the bench, the bench imports nothing of the tests."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import tempfile
import time
from pathlib import Path

from devtools.sandbox import procs
from devtools.sandbox.limits import SandboxError
from launcher.node.wire import RUN_ID_ENV

__all__ = [
    "children",
    "free_port",
    "gone",
    "parent",
    "pids_with_env",
    "process_name",
    "processes_mentioning",
    "reserve_base_addr",
    "run_processes",
    "sshd_family",
    "subnets_for",
]


def reserve_base_addr(first: int = 10, last: int = 250, span: int = 1) -> tuple[str, contextlib.ExitStack]:
    """A base address 127.0.K.2 (K from `first` to `last`) such that no other sandbox on this machine holds any of
    127.0.K.x to 127.0.(K+span-1).x: `span` /24s for a sandbox of more than 254 nodes (256 from 127.0.K.2 end at
    127.0.(K+1).1).

    Held through a lock file per K (tests, benchmarks and people share this machine's loopback range); keep the
    returned handle open while the sandbox lives, close it to free them.
    """
    for k in range(first, last - span + 2):
        held = contextlib.ExitStack()
        try:
            for j in range(k, k + span):
                lock_file = Path(tempfile.gettempdir()) / f"launcher-sandbox-127.0.{j}.lock"
                handle = held.enter_context(open(lock_file, "a"))  # noqa: SIM115 (held by the ExitStack)
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.close()
            continue
        return f"127.0.{k}.2", held
    raise SandboxError(f"no {span} free sandbox subnet(s) in a row left in 127.0.{first}-{last}.x")


def subnets_for(nodes: int) -> int:
    """The /24s a sandbox of `nodes` from 127.0.K.2 spans."""
    return (nodes + 2 + 255) // 256


PORTS = range(20000, 32000)
"""Where `free_port` looks: below Linux's ephemeral range (32768-60999), which every outgoing connection (the many
ssh clients of tests running side by side) draws its local port from."""
_HELD: list[object] = []
"""The lock files of the ports this process was given, open until it exits."""


def free_port() -> int:
    """A TCP port free on every address right now and given to no other process of the tests or the bench (a master
    port: every sandbox node shares one port space). The kernel's own choice (bind to port 0) is an ephemeral port,
    which an outgoing connection may take a moment later; and tests on several workers ask at once: so a port is
    held through a lock file per port, as `reserve_base_addr`'s subnets are, and taken outside the ephemeral range."""
    start = PORTS.start + (os.getpid() * 7919) % len(PORTS)  # each process starts elsewhere: fewer lock files tried
    for i in range(len(PORTS)):
        port = PORTS.start + (start - PORTS.start + i) % len(PORTS)
        handle = open(Path(tempfile.gettempdir()) / f"launcher-test-port-{port}.lock", "a")  # noqa: SIM115
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                handle.close()
                continue
        _HELD.append(handle)
        return port
    raise SandboxError(f"no free port left in {PORTS.start}-{PORTS.stop - 1}")


def pids_with_env(prefix: bytes) -> list[int]:
    """Live processes on this machine (so on every sandbox node) with an environment entry starting with `prefix`."""
    found = []
    for pid in procs.pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:  # gone, or not ours
            continue
        if any(var.startswith(prefix) for var in environ.split(b"\0")):
            found.append(pid)
    return found


def kill_marked(needle: bytes, timeout: float = 10.0) -> int:
    """KILL every process whose environment carries `needle`; returns how many there were."""
    pids = pids_with_env(needle)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while pids_with_env(needle) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(pids)


def end_runs_under(cache: Path) -> int:
    """KILL what is left of every run whose directory a node keeps under `cache` (its processes carry the run's mark):
    an attached run whose launcher died lives on within its heartbeat bound, a detached one until stopped; a test or a
    bench that is over must not leave either to the next. How many processes there were."""
    runs = cache / "ddp-launcher" / "runs"
    marks = [f"{RUN_ID_ENV}={run.name}/{node.name}".encode() for run in (runs.iterdir() if runs.is_dir() else ())
             for node in run.iterdir() if node.is_dir()]
    return sum(kill_marked(mark) for mark in marks)


def run_processes(run_id: str) -> list[int]:
    """Live processes of a launcher run on any sandbox node: each carries DDP_LAUNCHER_RUN=<run id>/<node>."""
    return pids_with_env(f"{RUN_ID_ENV}={run_id}/".encode())


def gone(pid: int) -> bool:
    """No such process, or a zombie waiting for pid 1 to reap it."""
    return not procs.alive(pid)


def processes_mentioning(text: str) -> list[int]:
    """Live pids whose command line mentions `text` (sshd keeps `-f STATE/node-i/sshd_config` in its title)."""
    return procs.pids_mentioning(text)


def children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    return sorted(child for child, entry in procs.table().items() if entry.ppid == pid)


def process_name(pid: int) -> str | None:
    """The command name of `pid` (/proc/PID/comm: kept when a program rewrites its title); None when gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def parent(pid: int) -> int:
    """The parent of `pid`; raises when there is no such process."""
    found = procs.stat(pid)
    if found is None:
        raise ProcessLookupError(f"process {pid} is gone")
    return found.ppid


def sshd_family(listener: int) -> list[int]:
    """The node's sshd listener and every sshd process under it (not the agent or torchrun they serve)."""
    family, todo = [], [listener]
    while todo:
        pid = todo.pop()
        if process_name(pid) == "sshd":
            family.append(pid)
            todo += children(pid)
    return family


def signal_each(pids: list[int], sig: int) -> list[int]:
    """Send `sig` to each of `pids`; returns those it reached. One that ended since it was listed (a session's sshd
    closing as a detached launch returns) is passed over: it has nothing left to stop or continue."""
    reached = []
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
        reached.append(pid)
    return reached
