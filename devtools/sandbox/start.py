"""Starting nodes: check the machine once, start each node's sshd in its own namespaces, wait until all accept."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from devtools.sandbox.limits import SandboxError
from devtools.sandbox.render import SSHD, node_name

# The sshd listeners this process started, kept so that stopping them also reaps them (no zombies).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def require_tools() -> str:
    """Fail early, in one sentence, on what would otherwise fail as N confusing sshd logs; return unshare's path."""
    if not os.access(SSHD, os.X_OK):
        raise SandboxError(f"{SSHD} is missing: install it with `apt-get install openssh-server`.")
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("ssh-keygen") is None:
        raise SandboxError("the sandbox needs `unshare` (util-linux) and `ssh-keygen` (openssh-client) on PATH.")
    probe = subprocess.run(
        [unshare, "--uts", "--mount", "--propagation", "private", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        raise SandboxError(
            "the sandbox needs root (or user namespaces) to give each node its own hostname and /etc/hosts:"
            f" `unshare --uts --mount` failed: {why}"
        )
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    return unshare


def start_node(folder: Path, argv: list[str]) -> subprocess.Popen[bytes]:
    """Start one node, logging to its folder; not waited on: it outlives this call."""
    with open(folder / "sshd.log", "wb") as log:
        # Own session: a Ctrl-C meant for the caller doesn't reach the nodes.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    _CHILDREN[proc.pid] = proc
    return proc


def reap() -> None:
    """Reap the listeners this process started that have exited, whoever stopped them."""
    for pid, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[pid]


def forget(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Reap `procs` (stopped by now) and stop tracking them."""
    for proc in procs:
        proc.poll()
        _CHILDREN.pop(proc.pid, None)


def wait_ready(
    state_dir: Path, addrs: Sequence[str], port: int, procs: Sequence[subprocess.Popen[bytes]], timeout: float
) -> None:
    """Return once every node's sshd has written its pid file and accepts TCP; raise with its log if one can't."""
    pending = set(range(len(procs)))
    deadline = time.monotonic() + timeout
    while pending:
        for i in sorted(pending):
            folder = state_dir / node_name(i)
            if procs[i].poll() is not None:
                why = last_lines(read_text(folder / "sshd.log"))
                raise SandboxError(f"{node_name(i)} ({addrs[i]}:{port}) did not start: {why}")
            # sshd writes its pid file only after it has bound: this tells our sshd from another server.
            if read_text(folder / "sshd.pid").strip() == str(procs[i].pid) and _accepts_tcp(addrs[i], port):
                pending.discard(i)
        if pending and time.monotonic() > deadline:
            i = min(pending)
            raise SandboxError(
                f"{node_name(i)} ({addrs[i]}:{port}) did not accept connections within {timeout:g} s:"
                f" {last_lines(read_text(state_dir / node_name(i) / 'sshd.log'))}"
            )
        if pending:
            time.sleep(0.02)


def _accepts_tcp(addr: str, port: int) -> bool:
    """Whether addr:port accepts a connection; we send a version line so sshd logs no aborted handshake."""
    try:
        with socket.create_connection((addr, port), timeout=1.0) as conn:
            conn.sendall(b"SSH-2.0-sandbox-probe\r\n")  # not waiting for sshd's banner: 20 ms a node
        return True
    except OSError:
        return False


def default_python() -> str:
    """This interpreter: the nodes share this machine's Python."""
    exe = Path(sys.executable).absolute()
    # Not resolved through symlinks: a venv's bin/python is a link, and resolving it would leave the venv.
    if exe.parent.name == "shims":  # a pyenv shim: call the interpreter it stands for
        exe = Path(sys.prefix) / "bin" / "python3"
    return str(exe)


def read_text(path: Path) -> str:
    """A log or pid file's text; "" while it does not exist."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def last_lines(text: str, count: int = 2) -> str:
    """The last `count` non-blank lines of a log, on one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[-count:]) if lines else "(sshd wrote nothing)"
