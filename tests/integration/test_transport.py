"""Transport: ssh config resolution (as OpenSSH does it), host key policies, failure messages; connect timeouts,
keepalives and non-blocking sends against real listeners and sshd nodes (marked `integration`)."""

from __future__ import annotations

import dataclasses
import gc
import os
import resource
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.observe import free_port
from launcher.config.inventory import load_inventory, parse_inventory
from launcher.errors import NodeFailure
from launcher.settings import SshSettings
from launcher.transport.connections import Node, connect, connect_all, run_all

# --- against real listeners and sshd ------------------------------------------------------------------------


def _silent(sock: socket.socket) -> None:
    """Accept connections and never say a word."""
    sock.listen()
    held = []
    while True:
        try:
            held.append(sock.accept()[0])
        except OSError:
            return


def _greets_then_stalls(sock: socket.socket) -> None:
    """Send an SSH greeting, then never take part in the key exchange."""
    sock.listen()
    held = []
    while True:
        try:
            conn = sock.accept()[0]
        except OSError:
            return
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        held.append(conn)


@pytest.fixture
def listener(request: pytest.FixtureRequest) -> Iterator[int]:
    """A local port that misbehaves as `request.param` says; yields the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    filler = None
    if request.param == "full-backlog":  # the accept queue is full: the kernel drops new SYNs, connect() hangs
        sock.listen(0)
        filler = socket.create_connection(sock.getsockname())
    else:
        serve = _silent if request.param == "silent" else _greets_then_stalls
        threading.Thread(target=serve, args=(sock,), daemon=True).start()
    yield sock.getsockname()[1]
    sock.close()
    if filler is not None:
        filler.close()


@pytest.mark.integration
@pytest.mark.parametrize("listener", ["silent", "greets-then-stalls", "full-backlog"], indirect=True)
def test_a_fractional_connect_timeout_bounds_every_stage(listener: int) -> None:
    """0.5 s reaches Paramiko as 0.5 s: Fabric's own connect_timeout made it int(0.5) == 0, i.e. no timeout, so
    the TCP connect hung for the kernel's minutes and a stalled key exchange for Paramiko's 15 s."""
    cluster = parse_inventory(f"hosts: [{{name: 127.0.0.1, port: {listener}, user: root}}]\n")
    t0 = time.monotonic()
    outcome = connect(cluster.hosts[0], cluster, SshSettings(0.5))
    took = time.monotonic() - t0
    assert not isinstance(outcome, Node)
    assert outcome.kind == "timeout" and "\n" not in str(outcome), outcome
    assert took < 2, took


def _keepalives(node: Node) -> list[str]:
    """Record the global requests the node's transport sends from now on (Paramiko's keepalive is one)."""
    sent: list[str] = []
    transport = node.connection.client.get_transport()
    assert transport is not None
    transport.global_request = lambda kind, *args, **kwargs: sent.append(kind)
    return sent


@pytest.mark.integration
def test_keepalives_follow_the_ssh_config_unless_given(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(1, master_port=free_port())
    cluster = load_inventory(box.inventory)
    config = tmp_path / "alive_config"
    config.write_text(box.ssh_config.read_text() + "\nHost *\n    ServerAliveInterval 1\n")
    alive = dataclasses.replace(cluster, ssh_config=str(config))
    host = cluster.hosts[0]
    # below a second: Paramiko's least, 1 s
    given_nodes, failures = connect_all(cluster, ssh=SshSettings(keepalive=0.3))
    assert not failures
    nodes = {"config 1 s": connect(host, alive), "given 0.3 s": given_nodes[host.name],
             "config none": connect(host, cluster),
             "given 0 over config": connect(host, alive, SshSettings(keepalive=0))}
    sent = {label: _keepalives(node) for label, node in nodes.items() if isinstance(node, Node)}
    assert len(sent) == 4, nodes
    time.sleep(2.5)
    for node in nodes.values():
        node.close()
    assert "keepalive@lag.net" in sent["config 1 s"] and "keepalive@lag.net" in sent["given 0.3 s"], sent
    assert sent["config none"] == [] and sent["given 0 over config"] == [], sent


@pytest.mark.integration
def test_data_goes_in_aes_gcm_when_the_node_offers_it(make_sandbox) -> None:
    # One OpenSSL call a packet where CTR then HMAC take two: a sync's bytes cost the controller a fifth less CPU.
    box = make_sandbox(1, master_port=free_port())
    node = connect(load_inventory(box.inventory).hosts[0], load_inventory(box.inventory))
    assert isinstance(node, Node), node
    try:
        transport = node.connection.client.get_transport()
        assert (transport.local_cipher, transport.remote_cipher) == ("aes128-gcm@openssh.com",) * 2
        assert node.run("echo ok").stdout.strip() == b"ok"
    finally:
        node.close()


@pytest.mark.integration
def test_a_non_blocking_send_never_waits(make_sandbox) -> None:
    """A node that stops reading fills the window; a heartbeat must then be dropped, never waited for."""
    box = make_sandbox(1, master_port=free_port())
    cluster = load_inventory(box.inventory)
    node = connect(cluster.hosts[0], cluster)
    assert isinstance(node, Node), node
    try:
        stuck = node.open_channel("sleep 60")  # never reads its stdin
        chunk, sent, took = b"x" * 16384, 0, []
        for _ in range(600):  # the window (about 2 MB) and the pipe run out long before 9.8 MB
            t0 = time.monotonic()
            ok = stuck.send(chunk, block=False)
            took.append(time.monotonic() - t0)
            if not ok:
                break
            sent += len(chunk)
        assert not ok and 0 < sent < 8 << 20, sent
        assert not stuck.closed and max(took) < 0.5, max(took)
        stuck.close()
        t0 = time.monotonic()
        assert stuck.send(b"hb\n", block=False) is False and stuck.send(b"hb\n") is False
        ended = node.open_channel("true")
        ended.close_stdin()
        assert ended.send(b"hb\n", block=False) is False and ended.send(b"late") is False  # sendall spun here
        assert time.monotonic() - t0 < 0.5
        ended.close()
    finally:
        node.close()


@pytest.mark.integration
def test_a_proxy_jump_connects_sends_and_closes_both_hops(make_sandbox, tmp_path: Path) -> None:
    """node-1 through node-0: host keys checked on both hops, a non-blocking send through the jump host's channel,
    and closing the node closes the jump connection too (Fabric leaves it open)."""
    box = make_sandbox(2, master_port=free_port())
    config = tmp_path / "jump_config"
    config.write_text(box.ssh_config.read_text().replace("Host node-1\n", "Host node-1\n    ProxyJump node-0\n"))
    cluster = dataclasses.replace(load_inventory(box.inventory), ssh_config=str(config))
    node = connect(cluster.hosts[1], cluster, SshSettings(5))
    assert isinstance(node, Node), node
    gateway = node.connection.gateway
    try:
        assert node.run("hostname", timeout=30).stdout.strip() == b"node-1"
        channel = node.open_channel("cat >/dev/null")
        assert channel.send(b"hb\n", block=False) is True
        channel.close()
    finally:
        node.close()
    assert not gateway.is_connected


@pytest.mark.integration
def test_channels_wait_on_descriptors_above_1024(make_sandbox) -> None:
    """select.select refuses a descriptor above 1024 (each channel holds a pipe: ~330 nodes); waiting must not."""
    box = make_sandbox(1, master_port=free_port())
    cluster = load_inventory(box.inventory)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files ({hard}) is below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    node = connect(cluster.hosts[0], cluster)
    assert isinstance(node, Node), node
    # Every free descriptor below 1100 taken right before the channel's pipe is made (after connect(), which opens
    # and closes its own, and a collection: an earlier test's garbage could free a low one meanwhile).
    gc.collect()
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        channel = node.open_channel("sleep 0.3; echo late")
        assert channel._chan.fileno() > 1024
        channel.close_stdin()
        result = channel.collect(timeout=30)  # waits in wait_readable until the output comes
        assert (result.exit_code, result.stdout) == (0, b"late\n")
        channel.close()
    finally:
        node.close()
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.integration
def test_fanout_bounds_how_many_nodes_are_worked_on_at_once(make_sandbox) -> None:
    box = make_sandbox(3, master_port=free_port())
    cluster = load_inventory(box.inventory)
    nodes, failures = connect_all(cluster, ssh=SshSettings(fanout=1))
    assert not failures and list(nodes) == ["node-0", "node-1", "node-2"]
    try:
        t0 = time.monotonic()
        results = run_all(list(nodes.values()), "sleep 0.5; hostname", fanout=2)
        took = time.monotonic() - t0
        assert {name: r.stdout for name, r in results.items()} == {n: f"{n}\n".encode() for n in nodes}
        assert took >= 0.95, took  # two waves of 0.5 s: the third node waited for a free slot
        with pytest.raises(ValueError, match="fanout"):
            run_all(list(nodes.values()), "true", fanout=0)
    finally:
        for node in nodes.values():
            node.close()


# --- host keys and ProxyJump as OpenSSH has them (#20.8-10) -------------------------------------------------------


def _client_block(name: str, box, known_hosts: Path, *extra: str) -> str:
    return "\n".join([f"Host {name}", "    User root", f"    IdentityFile {box.identity_file}",
                      "    IdentitiesOnly yes", f"    UserKnownHostsFile {known_hosts}", *extra]) + "\n"


@pytest.mark.integration
def test_a_revoked_host_key_is_refused_as_openssh_refuses_it(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(1, master_port=free_port())
    node = box.nodes[0]
    recorded = box.known_hosts.read_text().splitlines()[0]  # "[addr]:port TYPE KEY": the node's real key
    known = tmp_path / "known_hosts"
    known.write_text(f"{recorded}\n@revoked {recorded}\n")  # still listed as a host key, and revoked
    config = tmp_path / "ssh_config"
    config.write_text(_client_block("node-0", box, known, f"    HostName {node.addr}", f"    Port {node.port}"))
    cluster = dataclasses.replace(load_inventory(box.inventory), ssh_config=str(config))
    failure = connect(cluster.hosts[0], cluster, SshSettings(5))
    assert isinstance(failure, NodeFailure) and failure.kind == "host-key-revoked"
    assert str(failure) == (
        f"node-0: host-key-revoked: REVOKED HOST KEY DETECTED: the host key of {node.addr}:{node.port} is marked as "
        f"revoked in {known}:2: refusing to connect (fix: this could mean that a stolen key is being used to "
        "impersonate this host: ask the node's administrator (never remove the @revoked line to get in))")
    # OpenSSH itself, with the same files: the same refusal.
    ssh = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", "node-0", "true"], capture_output=True,
                         text=True, timeout=30, check=False)
    assert ssh.returncode == 255 and "REVOKED HOST KEY DETECTED" in ssh.stderr, ssh.stderr
    # accept-new never learns its way around a revoked key either.
    learn = dataclasses.replace(cluster, host_key_policy="accept-new")
    known.write_text(f"@revoked {recorded}\n")
    again = connect(learn.hosts[0], learn, SshSettings(5))
    assert isinstance(again, NodeFailure) and again.kind == "host-key-revoked"
    assert known.read_text() == f"@revoked {recorded}\n"


@pytest.mark.integration
def test_host_key_alias_names_the_key_checked_and_learnt(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(1, master_port=free_port())
    node = box.nodes[0]
    key = " ".join(box.known_hosts.read_text().split()[1:3])
    known = tmp_path / "known_hosts"
    config = tmp_path / "ssh_config"
    config.write_text(_client_block("node-0", box, known, f"    HostName {node.addr}", f"    Port {node.port}",
                                    "    HostKeyAlias gpu-alias"))
    cluster = dataclasses.replace(load_inventory(box.inventory), ssh_config=str(config))
    known.write_text(f"[{node.addr}]:{node.port} {key}\n")  # under its address only: ssh would not find it
    refused = connect(cluster.hosts[0], cluster, SshSettings(5))
    assert isinstance(refused, NodeFailure) and refused.kind == "host-key-unknown"
    assert refused.detail == "gpu-alias is not in known_hosts (host_key_policy: strict)"
    known.write_text(f"gpu-alias {key}\n")
    ok = connect(cluster.hosts[0], cluster, SshSettings(5))
    assert isinstance(ok, Node), ok
    ok.close()
    known.write_text("")
    learnt = connect(cluster.hosts[0], dataclasses.replace(cluster, host_key_policy="accept-new"), SshSettings(5))
    assert isinstance(learnt, Node), learnt
    learnt.close()
    assert known.read_text() == f"gpu-alias {key}\n"  # learnt under the alias, as ssh writes it


@pytest.mark.integration
@pytest.mark.parametrize("how", ["two hops", "a hop's own ProxyJump"])
def test_a_node_reached_only_through_two_jump_hosts(make_sandbox, tmp_path: Path, how: str) -> None:
    """node-2 is `HostName node-2`, a name only the nodes resolve: it is reached through node-0, then node-1."""
    box = make_sandbox(3, master_port=free_port())
    n0, n1, n2 = box.nodes
    config = tmp_path / "ssh_config"
    known = box.known_hosts
    target = ["    HostName node-2", f"    Port {n2.port}", f"    HostKeyAlias [{n2.addr}]:{n2.port}"]
    if how == "two hops":  # `ssh -J jump0,root@ADDR:PORT`, the second hop written as user@host:port
        blocks = [_client_block("jump0", box, known, f"    HostName {n0.addr}", f"    Port {n0.port}"),
                  _client_block(n1.addr, box, known),
                  _client_block("node-2", box, known, *target, f"    ProxyJump jump0,root@{n1.addr}:{n1.port}")]
    else:  # the target names one jump host, which names its own
        blocks = [_client_block("jump0", box, known, f"    HostName {n0.addr}", f"    Port {n0.port}"),
                  _client_block("jump1", box, known, f"    HostName {n1.addr}", f"    Port {n1.port}",
                                "    ProxyJump jump0"),
                  _client_block("node-2", box, known, *target, "    ProxyJump jump1")]
    config.write_text("\n".join(blocks))
    cluster = dataclasses.replace(load_inventory(box.inventory), ssh_config=str(config))
    node = connect(cluster.hosts[2], cluster, SshSettings(10))
    assert isinstance(node, Node), node
    try:
        assert node.run("hostname", timeout=30).stdout.strip() == b"node-2"
        assert [g.host for g in node.gateways] == [n0.addr, n1.addr]
    finally:
        node.close()
    assert not any(g.is_connected for g in node.gateways)
    direct = dataclasses.replace(cluster, ssh_config=str(write_config(tmp_path, blocks[-1].split("    ProxyJump")[0])))
    failure = connect(direct.hosts[2], direct, SshSettings(5))
    assert isinstance(failure, NodeFailure) and failure.kind == "unresolvable"  # not reachable without the hops


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "direct_config"
    path.write_text(text)
    return path


@pytest.mark.integration
def test_a_failing_jump_host_is_named(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, master_port=free_port())
    n0, n1 = box.nodes
    config = tmp_path / "ssh_config"
    config.write_text(_client_block("jump0", box, box.known_hosts, f"    HostName {n0.addr}", "    Port 1")
                      + _client_block("node-1", box, box.known_hosts, f"    HostName {n1.addr}", f"    Port {n1.port}",
                                      "    ProxyJump jump0"))
    cluster = dataclasses.replace(load_inventory(box.inventory), ssh_config=str(config))
    failure = connect(cluster.hosts[1], cluster, SshSettings(5))
    assert isinstance(failure, NodeFailure)
    assert str(failure).startswith(f"node-1: refused: via the jump host jump0: connection refused by {n0.addr}:1")
