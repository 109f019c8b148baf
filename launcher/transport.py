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
import re
import select
import selectors
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
from launcher.options import DEFAULT_CONNECT_TIMEOUT, DEFAULT_FANOUT

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
    """The user's known_hosts files (`UserKnownHostsFile`); accept-new learns into the first."""
    global_known_hosts_files: tuple[str, ...] = ()
    """`GlobalKnownHostsFile` (by default /etc/ssh/ssh_known_hosts and ssh_known_hosts2): trusted, never written."""
    server_alive_interval: float = 0.0
    """`ServerAliveInterval`: seconds between keepalives, 0 for none."""
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

    def files(key: str, default: str) -> tuple[str, ...]:
        words = (p for v in options.get(key, [default]) for p in v.split())
        return tuple(os.path.expanduser(p) for p in words if p.lower() != "none")

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
        known_hosts_files=files("userknownhostsfile", "~/.ssh/known_hosts"),
        global_known_hosts_files=files("globalknownhostsfile", "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"),
        server_alive_interval=_seconds(first("serveraliveinterval", "0")),
        proxy_jump=None if jump in (None, "none") else jump,
        explicit_identity=identity,
    )


def _seconds(value: str | None) -> float:
    """`ssh -G` prints intervals in whole seconds; anything else (Paramiko's parser keeps '1m') counts as none."""
    try:
        return max(0.0, float(value or 0))
    except ValueError:
        return 0.0


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
    timed_out: float | None = None
    """The limit (seconds) it ran past without ending, if it did (exit_code is then -1)."""


@dataclass(frozen=True)
class _KnownKey:
    """A key that a known_hosts file records for a host, and where (`file:line`)."""

    key: paramiko.PKey
    where: str


def _known_keys(target: SSHTarget) -> list[_KnownKey]:
    """Every key recorded for the target, in the user's known_hosts files and then the global ones, as ssh reads them.

    Nothing here goes into Paramiko's own host-key stores, so nothing from a global file can ever be saved into the
    user's file.
    """
    name = _key_name(target)
    found = []
    for path in (*target.known_hosts_files, *target.global_known_hosts_files):
        try:
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines, 1):
            words = line.split()  # OpenSSH takes any run of blanks between fields; Paramiko one space or tab
            if not words or words[0].startswith(("#", "@")):  # @cert-authority, @revoked: not host keys
                continue
            if not _host_matches(words[0].split(","), name):  # names first: a global file may hold thousands
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(" ".join(words))
            except (paramiko.SSHException, ValueError):
                continue
            if entry is not None:
                found.append(_KnownKey(entry.key, f"{path}:{number}"))
    return found


def _host_matches(patterns: Sequence[str], name: str) -> bool:
    """OpenSSH's rule for a known_hosts name list: hashed names, `*` and `?` wildcards, and `!` vetoes the line."""
    name = name.lower()
    matched = False
    for pattern in patterns:
        if pattern.startswith("|1|"):
            matched = matched or paramiko.HostKeys.hash_host(name, pattern) == pattern
            continue
        regex = re.escape(pattern.removeprefix("!").lower()).replace(r"\*", ".*").replace(r"\?", ".")
        if re.fullmatch(regex, name):
            if pattern.startswith("!"):
                return False
            matched = True
    return matched


class _HostKeyChanged(paramiko.BadHostKeyException):
    """The host offered a key that no known_hosts file vouches for, while `where` records another one."""

    def __init__(self, hostname: str, got: paramiko.PKey, expected: _KnownKey):
        super().__init__(hostname, got, expected.key)
        self.where = expected.where


class _KnownHostsPolicy(paramiko.RejectPolicy):
    """OpenSSH's check against the user's and the global known_hosts files: the host is let in when any of them
    records the key it offers; a host recorded with other keys only is refused as changed, an unknown one as unknown.

    Paramiko's own check consults only one file set (global keys hide the user's) and is never given any key here:
    this policy decides every connection.
    """

    def __init__(self, known: Sequence[_KnownKey]):
        self.known = tuple(known)

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if any(k.key == key for k in self.known):
            return
        if self.known:
            same_type = [k for k in self.known if k.key.get_name() == key.get_name()]
            raise _HostKeyChanged(hostname, key, (same_type or list(self.known))[0])
        self.unknown_host(client, hostname, key)

    def unknown_host(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        super().missing_host_key(client, hostname, key)  # "Server ... not found in known_hosts"


class _AcceptNewPolicy(_KnownHostsPolicy):
    """OpenSSH's `accept-new`: as strict, except that a host no file knows has its key learnt once, into the user's
    first known_hosts file; a host that any file (a global one included) records with another key is still refused."""

    _lock = threading.Lock()

    def __init__(self, known: Sequence[_KnownKey], known_hosts: str):
        super().__init__(known)
        self.known_hosts = known_hosts

    def unknown_host(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        Path(self.known_hosts).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._lock, open(self.known_hosts, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # other launchers may be learning keys at the same moment
            f.write(line)


def _host_key_order(known: Sequence[_KnownKey]) -> Callable[..., paramiko.Transport]:
    """A Transport factory that asks the server for the key types known for it first, as OpenSSH orders
    HostKeyAlgorithms (Paramiko does it only for keys in its own stores, which stay empty here)."""
    types = {k.key.get_name() for k in known}

    def plain(algorithm: str) -> str:
        algorithm = algorithm.removesuffix("-cert-v01@openssh.com")
        return "ssh-rsa" if algorithm.startswith("rsa-sha2-") else algorithm

    def make(sock: object, **kwargs: object) -> paramiko.Transport:
        transport = paramiko.Transport(sock, **kwargs)
        options = transport.get_security_options()
        options.key_types = sorted(options.key_types, key=lambda algorithm: plain(algorithm) not in types)
        return transport

    return make


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
        gateway = self.connection.gateway
        self.connection.close()
        if isinstance(gateway, Connection):  # Fabric leaves a ProxyJump's connection open
            gateway.close()


_SEND_LOCK_WAIT = 0.1
"""Seconds a non-blocking send waits for another send on the same channel (a few bytes take microseconds)."""


def _writable(sock: object) -> bool:
    """True when `sock` takes data now: a socket, or under a ProxyJump the jump host's channel and its own socket."""
    if isinstance(sock, paramiko.Channel):
        transport = sock.get_transport()
        return (not sock.closed and not sock.eof_sent and sock.send_ready() and transport is not None
                and _writable(transport.sock))
    try:
        poller = select.poll()
        poller.register(sock, select.POLLOUT)
        return any(event & select.POLLOUT for _, event in poller.poll(0))
    except (OSError, ValueError, TypeError):
        return False


class Channel:
    """One running remote command: write to its stdin, read its stdout/stderr as they come, get its exit code."""

    def __init__(self, node: str, chan: paramiko.Channel):
        self.node = node
        self._chan = chan
        self._send_lock = threading.Lock()

    def send(self, data: bytes, block: bool = True, timeout: float | None = None) -> bool:
        """Write to the command's stdin; False when the channel is already gone, or (`timeout`) the node took none of
        the data for that many seconds (a node whose disk hung stops reading).

        With `block=False` it never waits on the node (heartbeats, stop words): it sends only when all of `data`
        goes at once (paramiko's `send_ready()` and the window, no key exchange under way, the socket writable)
        and returns False otherwise. It waits at most a moment for another send on this channel to end, so that
        words are never cut into each other, and gives up if that one is stuck.
        """
        if not self._send_lock.acquire(timeout=-1 if block else _SEND_LOCK_WAIT):
            return False
        try:
            if self._chan.eof_sent:  # after close_stdin Paramiko's sendall spins on 0 bytes until the channel closes
                return False
            if block:
                self._chan.settimeout(timeout)  # Paramiko waits for window space at most this long
                try:
                    self._chan.sendall(data)
                finally:
                    self._chan.settimeout(None)
                return True
            return self._takes_now(len(data)) and self._chan.send(data) == len(data)
        except (OSError, EOFError, paramiko.SSHException):
            return False
        finally:
            self._send_lock.release()

    def _takes_now(self, size: int) -> bool:
        """True when `size` bytes go out in one packet without waiting for the window, a rekey or the socket."""
        chan = self._chan
        transport = chan.get_transport()
        if chan.closed or transport is None or not transport.is_active() or not chan.send_ready():
            return False  # send_ready() is also True on a closed channel: "a send would fail at once"
        return (size <= min(chan.out_window_size, chan.out_max_packet_size - 64)  # Paramiko's own cut
                and transport.clear_to_send.is_set() and _writable(transport.sock))

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self._chan.shutdown_write()

    def wait_readable(self, timeout: float) -> None:
        """Block until there is output, the command ended, or `timeout` passed.

        Through `selectors` (epoll/poll), not `select.select`, which refuses a descriptor above 1024: each channel
        holds a pipe of its own, so ~330 nodes would get there.
        """
        with selectors.DefaultSelector() as selector:
            selector.register(self._chan, selectors.EVENT_READ)
            selector.select(timeout)

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
                return Result(-1, bytes(out), bytes(err), timed_out=timeout)
            if not o and not e:
                self.wait_readable(0.2)

    def close(self) -> None:
        self._chan.close()


def _connection(target: SSHTarget, timeout: float, policy: str, gateway: Connection | None) -> Connection:
    identities = [p for p in target.identity_files if os.path.exists(p)]
    known = _known_keys(target)
    # The timeout goes to Paramiko as is: Fabric's own `connect_timeout` is cut to whole seconds (`int()`) and a
    # resulting 0 is dropped as "no timeout", so `--connect-timeout 0.5` left TCP connect and key exchange unbounded.
    connect_kwargs = {
        "key_filename": identities,
        "look_for_keys": False,  # ssh -G already listed the default key files
        "allow_agent": not target.identities_only,
        "timeout": timeout,  # TCP connect, then the whole key exchange
        "banner_timeout": timeout,
        "auth_timeout": timeout,
        "channel_timeout": timeout,  # a ProxyJump's channel through this connection to the next host
        "transport_factory": _host_key_order(known),
    }
    # Our own resolution already applied the ssh config; stop Fabric from applying ~/.ssh/config again, and from
    # taking a connect timeout of its own (from a Fabric config file) beside the one above.
    config = Config(overrides={"load_ssh_configs": False, "timeouts": {"connect": None}}, lazy=True)
    conn = Connection(target.hostname, user=target.user, port=target.port, config=config,
                      connect_kwargs=connect_kwargs, gateway=gateway)
    if policy == "accept-new" and target.known_hosts_files:
        conn.client.set_missing_host_key_policy(_AcceptNewPolicy(known, target.known_hosts_files[0]))
    else:  # strict, or accept-new with `UserKnownHostsFile none`: nowhere to learn into
        conn.client.set_missing_host_key_policy(_KnownHostsPolicy(known))
    return conn


def classify(target: SSHTarget, exc: BaseException) -> NodeFailure:
    """Turn whatever the SSH stack raised into a one-line failure with the likely fix."""
    where = f"{target.hostname}:{target.port}"
    name = target.name
    if isinstance(exc, socket.gaierror):
        return NodeFailure(name, "unresolvable", f"cannot resolve {target.hostname!r}",
                           "check the name, or give it a `HostName` in your ssh config or an address in the inventory")
    if isinstance(exc, paramiko.BadHostKeyException):
        line = getattr(exc, "where", "known_hosts")
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


def connect(host: Host, cluster: Cluster, timeout: float = DEFAULT_CONNECT_TIMEOUT,
            keepalive: float | None = None) -> Node | NodeFailure:
    """Open an authenticated connection to one host, or say why not.

    `timeout` (seconds, fractions kept) bounds the TCP connect, the SSH handshake and authentication.
    `keepalive`: seconds between SSH keepalives; None takes the ssh config's `ServerAliveInterval`, 0 sends none.
    """
    try:
        target = resolve_target(host, cluster.ssh_config)
    except (OSError, subprocess.SubprocessError) as exc:
        return NodeFailure(host.name, "ssh", f"cannot read the ssh config: {exc}")
    if target.explicit_identity and not os.path.exists(target.explicit_identity):
        return NodeFailure(host.name, "key-file", f"identity_file {target.explicit_identity} does not exist",
                           "fix `identity_file` in the inventory")
    opened: list[tuple[Connection, SSHTarget]] = []
    try:
        gateway = None
        if target.proxy_jump:
            jump_host = Host(name=target.proxy_jump.split(",")[0], addr="", python="", workdir="",
                             nproc_per_node=1)
            jump = resolve_target(jump_host, cluster.ssh_config)
            gateway = _connection(jump, timeout, cluster.host_key_policy, None)
            opened.append((gateway, jump))
        conn = _connection(target, timeout, cluster.host_key_policy, gateway)
        opened.append((conn, target))
        conn.open()
    except Exception as exc:
        for half_open, _ in opened:  # a handshake that timed out still has Paramiko's reader thread and socket
            with contextlib.suppress(Exception):
                half_open.client.close()
        return classify(target, exc)
    for each, each_target in opened:
        _keep_alive(each, each_target.server_alive_interval if keepalive is None else keepalive)
    return Node(host.name, target, conn)


def _keep_alive(conn: Connection, seconds: float) -> None:
    """SSH keepalives every `seconds` (Paramiko counts whole seconds, at least 1); none for 0."""
    transport = conn.client.get_transport()
    if seconds > 0 and transport is not None:
        transport.set_keepalive(int(max(1, seconds)))


def connect_all(cluster: Cluster, hosts: Iterable[Host] | None = None, timeout: float = DEFAULT_CONNECT_TIMEOUT,
                on_connect: Callable[[int, int], None] | None = None, keepalive: float | None = None,
                fanout: int = DEFAULT_FANOUT) -> tuple[dict[str, Node], list[NodeFailure]]:
    """Connect to every host at once; returns the open nodes (in inventory order) and the failures.

    `on_connect(done, total)` is called as each connection succeeds or fails (for progress lines); `timeout` and
    `keepalive` are `connect`'s. At most `fanout` handshakes are under way at a time (a bounded thread pool).
    """
    hosts = list(cluster.hosts if hosts is None else hosts)
    if not hosts:
        return {}, []
    with ThreadPoolExecutor(max_workers=_workers(fanout, len(hosts))) as pool:
        futures = [pool.submit(connect, h, cluster, timeout, keepalive) for h in hosts]
        if on_connect is not None:
            for done, _ in enumerate(as_completed(futures), 1):
                on_connect(done, len(hosts))
        outcomes = [f.result() for f in futures]
    nodes = {o.name: o for o in outcomes if isinstance(o, Node)}
    failures = [o for o in outcomes if isinstance(o, NodeFailure)]
    return nodes, failures


def _workers(fanout: int, count: int) -> int:
    """Threads for `count` nodes under a limit of `fanout` (a wrong limit is a bug of the caller: options checks it)."""
    if isinstance(fanout, bool) or not isinstance(fanout, int) or fanout < 1:
        raise ValueError(f"fanout must be a whole number >= 1, got {fanout!r}")
    return min(fanout, count)


def close_all(nodes: Iterable[Node]) -> None:
    for node in nodes:
        node.close()


def run_all(nodes: Sequence[Node], command: str | dict[str, str], stdin: bytes | dict[str, bytes] = b"",
            timeout: float | None = None, fanout: int = DEFAULT_FANOUT) -> dict[str, Result | NodeFailure]:
    """Run a command (the same, or one per node name) on every node in parallel and collect the results.

    At most `fanout` commands run at a time: only for commands that finish on their own (never one that waits for
    the other nodes, as a launch's start does).
    """
    def one(node: Node) -> Result | NodeFailure:
        cmd = command[node.name] if isinstance(command, dict) else command
        data = stdin[node.name] if isinstance(stdin, dict) else stdin
        try:
            return node.run(cmd, data, timeout)
        except Exception as exc:
            return classify(node.target, exc)

    if not nodes:
        return {}
    with ThreadPoolExecutor(max_workers=_workers(fanout, len(nodes))) as pool:
        return dict(zip([n.name for n in nodes], pool.map(one, nodes), strict=True))
