"""SSH to every node at once (launcher/transport/ is the only package that imports Fabric or Paramiko).

`connect_all` opens one connection per node, all in parallel, and returns either a `Node` or a typed
`NodeFailure` for each host (`launcher.transport.failures.classify`). A `Node` runs commands on channels of that one
connection, so probing, starting and streaming a run cost one SSH handshake per node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import paramiko
from fabric import Config, Connection

from launcher.config.model import Cluster, Host
from launcher.errors import LauncherError, NodeFailure
from launcher.limits import FD_RESERVE, FDS_PER_NODE
from launcher.parallel import parallel, waves
from launcher.settings import DEFAULT_CONNECT_TIMEOUT, DEFAULT_FANOUT, DEFAULT_SSH, SshSettings
from launcher.transport.channel import Channel, ExecTimeout, Result, _exec
from launcher.transport.failures import classify
from launcher.transport.hostkeys import host_key_order, policy_for
from launcher.transport.sshconfig import (
    MAX_JUMP_DEPTH,
    SSH_G_TIMEOUT,
    SSHTarget,
    hop_target,
    parse_jumps,
    resolve_target,
)
from launcher.transport.sshsettings import IDLE_POLL_S

# Paramiko logs a traceback from its own threads when a handshake fails; the failure reaches the user as one
# typed line instead, so keep its log from falling through to Python's last-resort stderr handler.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
log = logging.getLogger(__name__)


@dataclass
class Node:
    """An open SSH connection to one node; commands run on channels of it."""

    name: str
    target: SSHTarget
    connection: Connection
    timeout: float = DEFAULT_CONNECT_TIMEOUT
    """The user's connect timeout: it bounds opening a channel and starting its command too."""
    gateways: tuple[Connection, ...] = ()
    """The ProxyJump hops' connections, first hop first (Fabric leaves them open: closed with the node)."""
    connected_at: float = field(default_factory=time.time)
    """When the connection was open (wall clock): the run's page's 'SSH connected'."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def open_channel(self, command: str) -> Channel:
        """Start `command` on the node; the returned channel streams its stdin, stdout and stderr.

        Both the channel's opening and the command's start wait at most `timeout`: an sshd that stops answering
        after the connection was made raises `ExecTimeout`, instead of holding the launcher before any other
        timeout applies.
        """
        with self._lock:  # opening channels on one transport from several threads is not safe
            transport = self.connection.client.get_transport()
            if transport is None or not transport.is_active():
                raise ConnectionError(f"{self.name}: the SSH connection is closed")
            try:
                chan = transport.open_session(timeout=self.timeout)
            except paramiko.SSHException as exc:
                if "Timeout" in str(exc):
                    raise ExecTimeout(self.name, "open a session", self.timeout) from None
                raise
        _exec(chan, command, self.timeout, self.name)
        return Channel(self.name, chan)

    @property
    def alive(self) -> bool:
        """Whether the connection is still up as far as Paramiko knows (a dropped one is not; a silent one may be)."""
        transport = self.connection.client.get_transport()
        return transport is not None and transport.is_active()

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
        for gateway in reversed(self.gateways):  # Fabric leaves a ProxyJump's connections open
            gateway.close()


def _connection(target: SSHTarget, timeout: float, policy: str, gateway: Connection | None) -> Connection:
    identities = [p for p in target.identity_files if os.path.exists(p)]
    checker, known = policy_for(target, policy)
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
        "transport_factory": host_key_order(known.keys),
    }
    # Our own resolution already applied the ssh config; stop Fabric from applying ~/.ssh/config again, and from
    # taking a connect timeout of its own (from a Fabric config file) beside the one above.
    config = Config(overrides={"load_ssh_configs": False, "timeouts": {"connect": None}}, lazy=True)
    conn = Connection(
        target.hostname,
        user=target.user,
        port=target.port,
        config=config,
        connect_kwargs=connect_kwargs,
        gateway=gateway,
    )
    conn.client.set_missing_host_key_policy(checker)
    return conn


def connect(host: Host, cluster: Cluster, ssh: SshSettings = DEFAULT_SSH) -> Node | NodeFailure:
    """Open an authenticated connection to one host, or say why not.

    `ssh.connect_timeout` bounds the TCP connect, the SSH handshake and authentication; `ssh.keepalive` sets the
    SSH keepalives (None: the ssh config's `ServerAliveInterval`, 0: none).
    """
    timeout, keepalive = ssh.connect_timeout, ssh.keepalive
    try:
        target = resolve_target(host, cluster.ssh_config)
    except (OSError, subprocess.SubprocessError) as exc:
        return NodeFailure(host.name, "ssh", f"cannot read the ssh config: {exc}")
    if target.explicit_identity and not os.path.exists(target.explicit_identity):
        return NodeFailure(
            host.name,
            "key-file",
            f"identity_file {target.explicit_identity} does not exist",
            "fix `identity_file` in the inventory",
        )
    opened: list[tuple[Connection, SSHTarget]] = []
    failing = target
    try:
        gateway = None
        if target.proxy_jump:
            gateway = _open_jumps(target.proxy_jump, cluster, timeout, opened)
        failing = target
        conn = _connection(target, timeout, cluster.host_key_policy, gateway)
        opened.append((conn, target))
        conn.open()
    except Exception as exc:
        for half_open, _ in opened:  # a handshake that timed out still has Paramiko's reader thread and socket
            with contextlib.suppress(Exception):
                half_open.client.close()
        failing = opened[-1][1] if opened and not isinstance(exc, LauncherError) else target
        failure = classify(failing, exc)
        if failing is not target:
            return NodeFailure(
                host.name, failure.kind, f"via the jump host {failing.name}: {failure.detail}", failure.fix
            )
        return NodeFailure(host.name, failure.kind, failure.detail, failure.fix)
    for each, each_target in opened:
        _keep_alive(each, each_target.server_alive_interval if keepalive is None else keepalive)
        _idle_poll(each)
    return Node(host.name, target, conn, timeout, tuple(c for c, _ in opened[:-1]))


def _open_jumps(
    spec: str, cluster: Cluster, timeout: float, opened: list[tuple[Connection, SSHTarget]], depth: int = 0
) -> Connection:
    """Connect ProxyJump's hops in order, each through the one before (`ssh -J a,b`), and return the last.

    As OpenSSH does: each hop is resolved through the ssh config; the first hop's own ProxyJump is followed, the
    later hops are reached through the hop before them. Each hop's host key is checked under the same policy.
    Every connection is added to `opened` as it is made (a failure is the last one's).
    """
    if depth >= MAX_JUMP_DEPTH:
        raise LauncherError(f"ProxyJump goes {MAX_JUMP_DEPTH} jump hosts deep (a loop in the ssh config?)")
    gateway = None
    for index, hop in enumerate(parse_jumps(spec)):
        target = hop_target(hop, cluster.ssh_config)
        if index == 0 and target.proxy_jump:
            gateway = _open_jumps(target.proxy_jump, cluster, timeout, opened, depth + 1)
        conn = _connection(target, timeout, cluster.host_key_policy, gateway)
        opened.append((conn, target))
        conn.open()  # here, not inside the next hop's open: a failure is this hop's
        gateway = conn
    assert gateway is not None  # parse_jumps gives at least one hop
    return gateway


def _keep_alive(conn: Connection, seconds: float) -> None:
    """SSH keepalives every `seconds` (Paramiko counts whole seconds, at least 1); none for 0."""
    transport = conn.client.get_transport()
    if seconds > 0 and transport is not None:
        transport.set_keepalive(int(max(1, seconds)))


def _idle_poll(conn: Connection) -> None:
    """Paramiko's reader thread wakes every IDLE_POLL_S from now on, not every 0.1 s (its handshake is over)."""
    transport = conn.client.get_transport()
    if transport is not None:
        transport.sock.settimeout(IDLE_POLL_S)


def connect_all(
    cluster: Cluster,
    hosts: Iterable[Host] | None = None,
    ssh: SshSettings = DEFAULT_SSH,
    on_connect: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, Node], list[NodeFailure]]:
    """Connect to every host at once; returns the open nodes (in inventory order) and the failures.

    `on_connect(done, total)` is called as each connection succeeds or fails (for progress lines). Each connection
    is `connect`'s; at most `ssh.fanout` handshakes are under way at a time (a bounded thread pool).
    """
    hosts = list(cluster.hosts if hosts is None else hosts)
    if not hosts:
        return {}, []
    ensure_descriptors(len(hosts))
    workers = _workers(ssh.fanout, len(hosts))
    # Each connection is bounded by its timeout (and `ssh -G`'s 10 s); the whole wait too, wave by wave.
    limit = (ssh.connect_timeout + SSH_G_TIMEOUT + 5) * waves(len(hosts), workers)
    began = time.time()
    found = parallel(
        lambda h: connect(h, cluster, ssh),
        hosts,
        workers,
        limit,
        None if on_connect is None else lambda done: on_connect(done, len(hosts)),
    )
    outcomes = [
        o
        if isinstance(o, Node | NodeFailure)
        else NodeFailure(
            h.name,
            "timeout",
            f"no connection within {limit:g} s" if o is None else f"{type(o).__name__}: {o}",
            "is the node up, and does a firewall let you through?",
        )
        for h, o in zip(hosts, found, strict=True)
    ]
    nodes = {o.name: o for o in outcomes if isinstance(o, Node)}
    failures = [o for o in outcomes if isinstance(o, NodeFailure)]
    for node in nodes.values():
        log.debug(
            "%s: connected to %s@%s:%s in %.2f s",
            node.name,
            node.target.user,
            node.target.hostname,
            node.target.port,
            node.connected_at - began,
        )
    for failure in failures:
        log.info("%s: no connection: %s: %s", failure.host, failure.kind, failure.detail)
    return nodes, failures


def ensure_descriptors(nodes: int) -> None:
    """Raise the soft limit on open files to the hard one, and say so at once when `nodes` cannot fit under it.

    Each node holds a few descriptors for the whole run (its socket, Paramiko's channel pipe, a selector); past the
    usual soft limit (1024 on Linux: ~250 nodes; 256 on macOS: ~60) a reader thread died and the run failed as
    "stopped answering".
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = FD_RESERVE + FDS_PER_NODE * nodes
    if soft != resource.RLIM_INFINITY and soft < need:
        target = hard if hard == resource.RLIM_INFINITY else min(hard, max(need, soft))
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < need:
        raise LauncherError(
            f"{nodes} node(s) need about {need} open files here and this process may open {soft} "
            f"(its hard limit: {hard if hard != resource.RLIM_INFINITY else 'unlimited'}); raise it "
            f"with `ulimit -n {need}` (or ask for a higher hard limit), or use fewer nodes at once"
        )


def _workers(fanout: int, count: int) -> int:
    """Threads for `count` nodes under a limit of `fanout` (a wrong limit is a bug of the caller: options checks it)."""
    if isinstance(fanout, bool) or not isinstance(fanout, int) or fanout < 1:
        raise ValueError(f"fanout must be a whole number >= 1, got {fanout!r}")
    return min(fanout, count)


def close_all(nodes: Iterable[Node]) -> None:
    for node in nodes:
        node.close()


def run_all(
    nodes: Sequence[Node],
    command: str | dict[str, str],
    stdin: bytes | dict[str, bytes] = b"",
    timeout: float | None = None,
    fanout: int = DEFAULT_FANOUT,
) -> dict[str, Result | NodeFailure]:
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
    workers = _workers(fanout, len(nodes))
    # A channel opens and its command starts within each node's connect timeout; `timeout` bounds the rest.
    limit = None if timeout is None else (timeout + max(n.timeout for n in nodes) + 5) * waves(len(nodes), workers)
    found = parallel(one, nodes, workers, limit)
    return {
        n.name: r
        if isinstance(r, Result | NodeFailure)
        else NodeFailure(
            n.name, "timeout", f"no answer within {limit:g} s", "is the node overloaded, or its sshd stuck?"
        )
        for n, r in zip(nodes, found, strict=True)
    }
