"""SSH to every node at once: the only module that imports Fabric or Paramiko.

`connect_all` opens one connection per node, all in parallel, and returns either a `Node` or a typed
`NodeFailure` for each host. A `Node` runs commands on channels of that one connection, so probing,
starting and streaming a run cost one SSH handshake per node.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from fabric import Config, Connection
from paramiko.ssh_exception import NoValidConnectionsError

from launcher.errors import NodeFailure
from launcher.inventory import Cluster, Host
from launcher.options import DEFAULT_CONNECT_TIMEOUT

# Paramiko logs a traceback from its own threads when a handshake fails; the failure reaches the user as one
# typed line instead, so keep its log from falling through to Python's last-resort stderr handler.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass(frozen=True)
class SSHTarget:
    """How to reach one host, as OpenSSH itself would (its config already applied)."""

    name: str
    hostname: str
    port: int = 22
    user: str | None = None
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    known_hosts_files: tuple[str, ...] = ()
    proxy_jump: str | None = None
    explicit_identity: str | None = None
    """The inventory's identity_file, which must exist (unlike ssh's default candidates)."""


def resolve_target(host: Host, ssh_config: str | None) -> SSHTarget:
    """Resolve an inventory host through ssh config, never through local DNS.

    OpenSSH's `ssh -G` applies the config exactly as `ssh` would (Include, Match, wildcards), which Paramiko's
    own parser does not; without an `ssh` binary we fall back to Paramiko's parser.
    """
    args = ["ssh", "-G"]
    if ssh_config:
        args += ["-F", os.path.expanduser(ssh_config)]
    if host.user:
        args += ["-l", host.user]
    if host.port:
        args += ["-p", str(host.port)]
    args += ["--", host.name]
    options: dict[str, list[str]] = {}
    if shutil.which("ssh"):
        out = subprocess.run(args, capture_output=True, text=True, timeout=10, check=False)
        if out.returncode == 0:
            for line in out.stdout.splitlines():
                key, _, value = line.partition(" ")
                options.setdefault(key.lower(), []).append(value)
    if not options:
        options = _paramiko_options(host.name, ssh_config)

    def first(key: str, default: str | None = None) -> str | None:
        return options.get(key, [default])[0]

    known = tuple(os.path.expanduser(p) for v in options.get("userknownhostsfile", ["~/.ssh/known_hosts"])
                  for p in v.split())
    jump = first("proxyjump")
    identity = os.path.expanduser(host.identity_file) if host.identity_file else None
    identities = tuple(os.path.expanduser(p) for p in options.get("identityfile", []))
    return SSHTarget(
        name=host.name,
        hostname=first("hostname", host.name) or host.name,
        port=host.port or int(first("port", "22") or 22),
        user=host.user or first("user"),
        identity_files=((identity,) if identity else ()) + identities,
        identities_only=(first("identitiesonly", "no") or "no").lower() == "yes",
        known_hosts_files=known,
        proxy_jump=None if jump in (None, "none") else jump,
        explicit_identity=identity,
    )


def _paramiko_options(name: str, ssh_config: str | None) -> dict[str, list[str]]:
    path = Path(os.path.expanduser(ssh_config or "~/.ssh/config"))
    if not path.exists():
        return {}
    found = paramiko.SSHConfig.from_path(str(path)).lookup(name)
    return {k.lower(): (v if isinstance(v, list) else [str(v)]) for k, v in found.items()}


@dataclass
class Result:
    """What a finished remote command gave back."""

    exit_code: int
    stdout: bytes
    stderr: bytes


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """OpenSSH's `accept-new`: learn an unknown host's key once and write it down; a changed key is still
    refused (Paramiko raises BadHostKeyException before ever asking a policy)."""

    _lock = threading.Lock()

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        Path(self.known_hosts).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._lock, open(self.known_hosts, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # other launchers may be learning keys at the same moment
            f.write(line)


@dataclass
class Node:
    """An open SSH connection to one node; commands run on channels of it."""

    name: str
    target: SSHTarget
    connection: Connection
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def open_channel(self, command: str) -> Channel:
        """Start `command` on the node; the returned channel streams its stdin, stdout and stderr."""
        with self._lock:  # opening channels on one transport from several threads is not safe
            transport = self.connection.client.get_transport()
            if transport is None or not transport.is_active():
                raise ConnectionError(f"{self.name}: the SSH connection is closed")
            chan = transport.open_session(timeout=DEFAULT_CONNECT_TIMEOUT)
        chan.exec_command(command)
        return Channel(self.name, chan)

    def run(self, command: str, stdin: bytes = b"", timeout: float | None = None) -> Result:
        """Run `command` to its end, feeding it `stdin`; returns its exit code and output."""
        channel = self.open_channel(command)
        try:
            if stdin:
                channel.send(stdin)
            channel.close_stdin()
            return channel.collect(timeout)
        finally:
            channel.close()

    def close(self) -> None:
        self.connection.close()


class Channel:
    """One running remote command: write to its stdin, read its stdout/stderr as they come, get its exit code."""

    def __init__(self, node: str, chan: paramiko.Channel):
        self.node = node
        self._chan = chan

    def send(self, data: bytes) -> bool:
        """Write to the command's stdin; False when the channel is already gone."""
        try:
            self._chan.sendall(data)
            return True
        except (OSError, EOFError, paramiko.SSHException):
            return False

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self._chan.shutdown_write()

    def wait_readable(self, timeout: float) -> None:
        """Block until there is output, the command ended, or `timeout` passed."""
        import select

        select.select([self._chan], [], [], timeout)

    def read(self) -> tuple[bytes, bytes]:
        """Whatever stdout and stderr hold now (empty when nothing new)."""
        out = self._chan.recv(1 << 16) if self._chan.recv_ready() else b""
        err = self._chan.recv_stderr(1 << 16) if self._chan.recv_stderr_ready() else b""
        return out, err

    @property
    def finished(self) -> bool:
        """True once the command exited and all its output has been read.

        sshd may send the exit status before the last data: only the end of the stream (EOF, or the channel
        closing) says nothing more is coming.
        """
        chan = self._chan
        return (chan.exit_status_ready() and (chan.eof_received or chan.closed)
                and not chan.recv_ready() and not chan.recv_stderr_ready())

    @property
    def closed(self) -> bool:
        """True when the connection under the channel is gone (the node dropped off)."""
        transport = self._chan.get_transport()
        return self._chan.closed or transport is None or not transport.is_active()

    def exit_code(self) -> int:
        """The command's exit status; -1 when the connection broke before it said."""
        return self._chan.recv_exit_status() if self._chan.exit_status_ready() else -1

    def collect(self, timeout: float | None = None) -> Result:
        """Read everything until the command ends; on timeout the result has exit code -1."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        while True:
            o, e = self.read()
            out += o
            err += e
            if self.finished:
                o, e = self.read()
                return Result(self.exit_code(), bytes(out + o), bytes(err + e))
            if self.closed and not o and not e:
                return Result(-1, bytes(out), bytes(err))
            if deadline is not None and time.monotonic() > deadline:
                return Result(-1, bytes(out), bytes(err))
            if not o and not e:
                self.wait_readable(0.2)

    def close(self) -> None:
        self._chan.close()


def _connection(target: SSHTarget, timeout: float, policy: str, gateway: Connection | None) -> Connection:
    identities = [p for p in target.identity_files if os.path.exists(p)]
    connect_kwargs = {
        "key_filename": identities,
        "look_for_keys": False,  # ssh -G already listed the default key files
        "allow_agent": not target.identities_only,
        "banner_timeout": timeout,
        "auth_timeout": timeout,
    }
    # Our own resolution already applied the ssh config; stop Fabric from applying ~/.ssh/config again.
    config = Config(overrides={"load_ssh_configs": False}, lazy=True)
    conn = Connection(target.hostname, user=target.user, port=target.port, config=config,
                      connect_timeout=timeout, connect_kwargs=connect_kwargs, gateway=gateway)
    client = conn.client
    known = [p for p in target.known_hosts_files if os.path.exists(p)]
    for path in known:
        client.load_host_keys(path)
    if policy == "accept-new":
        client.set_missing_host_key_policy(_AcceptNewPolicy(target.known_hosts_files[0]))
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return conn


def _known_hosts_line(target: SSHTarget) -> str:
    """`file:line` of the known_hosts entry for the target, for the 'changed host key' message."""
    name = target.hostname if target.port == 22 else f"[{target.hostname}]:{target.port}"
    for path in target.known_hosts_files:
        try:
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines, 1):
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line) if line.strip() else None
            if entry is None:
                continue
            for pattern in entry.hostnames:
                if pattern == name or (pattern.startswith("|1|") and
                                       paramiko.HostKeys.hash_host(name, pattern) == pattern):
                    return f"{path}:{number}"
    return "known_hosts"


def classify(target: SSHTarget, exc: BaseException) -> NodeFailure:
    """Turn whatever the SSH stack raised into a one-line failure with the likely fix."""
    where = f"{target.hostname}:{target.port}"
    name = target.name
    if isinstance(exc, socket.gaierror):
        return NodeFailure(name, "unresolvable", f"cannot resolve {target.hostname!r}",
                           "check the name, or give it a `HostName` in your ssh config or an address in the inventory")
    if isinstance(exc, paramiko.BadHostKeyException):
        line = _known_hosts_line(target)
        return NodeFailure(name, "host-key-changed",
                           f"the host key of {where} differs from the one in {line}: refusing to connect",
                           f"if the node was reinstalled, verify the new key and remove that line "
                           f"(`ssh-keygen -R {_key_name(target)}`)")
    if isinstance(exc, NoValidConnectionsError | ConnectionRefusedError):
        return NodeFailure(name, "refused", f"connection refused by {where}",
                           "is sshd running on the node, and is the port right?")
    # A server that accepts TCP but never completes the handshake: Paramiko says "banner" or, when its reader
    # thread gave up first, "No existing session".
    if isinstance(exc, paramiko.SSHException) and ("banner" in str(exc) or "No existing session" in str(exc)):
        return NodeFailure(name, "timeout", f"{where} accepted the connection but sent no SSH greeting in time",
                           "is it an SSH server on that port, and is the node overloaded?")
    if isinstance(exc, socket.timeout | TimeoutError):
        return NodeFailure(name, "timeout", f"no answer from {where} in time",
                           "is the node up, and does a firewall let you through?")
    if isinstance(exc, paramiko.AuthenticationException):
        user = target.user or os.environ.get("USER", "you")
        return NodeFailure(name, "auth", f"{user}@{where} refused every key offered",
                           "check `user` and `identity_file`, or run `ssh-copy-id` for that node")
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return NodeFailure(name, "host-key-unknown", f"{where} is not in known_hosts (host_key_policy: strict)",
                           f"check its fingerprint and run `ssh-keyscan -p {target.port} {target.hostname} >> "
                           f"~/.ssh/known_hosts`, or set `host_key_policy: accept-new`")
    if isinstance(exc, OSError):
        return NodeFailure(name, "refused", f"cannot connect to {where}: {exc.strerror or exc}",
                           "is the node up and the address right?")
    return NodeFailure(name, "ssh", f"{type(exc).__name__}: {exc}")


def _key_name(target: SSHTarget) -> str:
    return target.hostname if target.port == 22 else f"[{target.hostname}]:{target.port}"


def connect(host: Host, cluster: Cluster, timeout: float = DEFAULT_CONNECT_TIMEOUT) -> Node | NodeFailure:
    """Open an authenticated connection to one host, or say why not."""
    try:
        target = resolve_target(host, cluster.ssh_config)
    except (OSError, subprocess.SubprocessError) as exc:
        return NodeFailure(host.name, "ssh", f"cannot read the ssh config: {exc}")
    if target.explicit_identity and not os.path.exists(target.explicit_identity):
        return NodeFailure(host.name, "key-file", f"identity_file {target.explicit_identity} does not exist",
                           "fix `identity_file` in the inventory")
    gateway = None
    try:
        if target.proxy_jump:
            jump_host = Host(name=target.proxy_jump.split(",")[0], addr="", python="", workdir="",
                             nproc_per_node=1)
            jump = resolve_target(jump_host, cluster.ssh_config)
            gateway = _connection(jump, timeout, cluster.host_key_policy, None)
        conn = _connection(target, timeout, cluster.host_key_policy, gateway)
        conn.open()
    except Exception as exc:
        return classify(target, exc)
    return Node(host.name, target, conn)


def connect_all(cluster: Cluster, hosts: Iterable[Host] | None = None, timeout: float = DEFAULT_CONNECT_TIMEOUT,
                on_connect: Callable[[int, int], None] | None = None,
                ) -> tuple[dict[str, Node], list[NodeFailure]]:
    """Connect to every host at once; returns the open nodes (in inventory order) and the failures.

    `on_connect(done, total)` is called as each connection succeeds or fails (for progress lines).
    """
    hosts = list(cluster.hosts if hosts is None else hosts)
    if not hosts:
        return {}, []
    with ThreadPoolExecutor(max_workers=min(64, len(hosts))) as pool:
        futures = [pool.submit(connect, h, cluster, timeout) for h in hosts]
        if on_connect is not None:
            for done, _ in enumerate(as_completed(futures), 1):
                on_connect(done, len(hosts))
        outcomes = [f.result() for f in futures]
    nodes = {o.name: o for o in outcomes if isinstance(o, Node)}
    failures = [o for o in outcomes if isinstance(o, NodeFailure)]
    return nodes, failures


def close_all(nodes: Iterable[Node]) -> None:
    for node in nodes:
        node.close()


def run_all(nodes: Sequence[Node], command: str | dict[str, str], stdin: bytes | dict[str, bytes] = b"",
            timeout: float | None = None) -> dict[str, Result | NodeFailure]:
    """Run a command (the same, or one per node name) on every node in parallel and collect the results."""
    def one(node: Node) -> Result | NodeFailure:
        cmd = command[node.name] if isinstance(command, dict) else command
        data = stdin[node.name] if isinstance(stdin, dict) else stdin
        try:
            return node.run(cmd, data, timeout)
        except Exception as exc:
            return classify(node.target, exc)

    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=min(64, len(nodes))) as pool:
        return dict(zip([n.name for n in nodes], pool.map(one, nodes), strict=True))
