"""Transport: ssh config resolution (as OpenSSH does it), host key policies, failure messages; connect timeouts,
keepalives and non-blocking sends against real listeners and sshd nodes (marked `integration`)."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import paramiko
import pytest
from paramiko.ssh_exception import NoValidConnectionsError

from launcher.config.inventory import parse_inventory
from launcher.transport.connections import _connection
from launcher.transport.failures import classify
from launcher.transport.hostkeys import _AcceptNewPolicy, _host_matches, _known_keys
from launcher.transport.sshconfig import SSHTarget, resolve_target


def test_ssh_config_include_and_wildcards_are_honoured(tmp_path: Path) -> None:
    """Paramiko ignores `Include`; many users' ~/.ssh/config rely on it, so resolution goes through `ssh -G`."""
    (tmp_path / "cluster.conf").write_text("Host gpu*\n  User trainer\n  Port 2201\n"
                                           f"  IdentityFile {tmp_path}/key\n  IdentitiesOnly yes\n"
                                           "Host gpu01\n  HostName 10.1.2.3\n")
    config = tmp_path / "config"
    config.write_text(f"Include {tmp_path}/cluster.conf\n")
    cluster = parse_inventory(f"ssh_config: {config}\nhosts: [gpu01, {{name: gpu02, user: root, port: 22}}]\n")
    one = resolve_target(cluster.hosts[0], cluster.ssh_config)
    assert (one.hostname, one.port, one.user, one.identities_only) == ("10.1.2.3", 2201, "trainer", True)
    assert one.identity_files[0] == f"{tmp_path}/key"
    two = resolve_target(cluster.hosts[1], cluster.ssh_config)
    assert (two.hostname, two.port, two.user) == ("gpu02", 22, "root")  # the inventory overrides ssh config


def test_no_connection_ever_accepts_an_unknown_key_silently(tmp_path: Path) -> None:
    target = SSHTarget(name="a", hostname="127.0.0.1", known_hosts_files=(str(tmp_path / "known_hosts"),))
    strict = _connection(target, 1.0, "strict", None).client._policy
    assert isinstance(strict, paramiko.RejectPolicy)
    learn = _connection(target, 1.0, "accept-new", None).client._policy
    assert isinstance(learn, _AcceptNewPolicy) and not isinstance(learn, paramiko.AutoAddPolicy)


@pytest.mark.parametrize(("exc", "kind", "detail"), [
    (socket.gaierror(-2, "Name or service not known"), "unresolvable", "cannot resolve"),
    (NoValidConnectionsError({("127.0.0.1", 22): ConnectionRefusedError()}), "refused", "connection refused"),
    (TimeoutError(), "timeout", "no answer"),
    (paramiko.SSHException("Error reading SSH protocol banner"), "timeout", "no SSH greeting"),
    (paramiko.SSHException("No existing session"), "timeout", "no SSH greeting"),
    (paramiko.AuthenticationException("no"), "auth", "refused every key"),
    (paramiko.SSHException("Server '[h]:22' not found in known_hosts"), "host-key-unknown", "not in known_hosts"),
    (ValueError("odd"), "ssh", "ValueError: odd"),
])
def test_failures_are_typed_with_a_fix(exc: BaseException, kind: str, detail: str) -> None:
    failure = classify(SSHTarget(name="gpu01", hostname="10.0.0.1", port=22, user="me"), exc)
    assert failure.kind == kind and failure.host == "gpu01" and detail in failure.detail
    assert "\n" not in str(failure)


def test_log_lines_get_node_and_rank_prefixes_and_stay_whole() -> None:
    import io

    from launcher.report.lines import NodeLog

    log = NodeLog("node-1", 1, 6, rank_offset=2, colour=False)
    out = io.StringIO()
    stream = b"torchrun banner\n[default0]:first\n[default1]:sec" + b"ond\r\n[0]:not a rank tag\n[default1]:tail"
    for i in range(0, len(stream), 7):  # arbitrary chunk boundaries, as a channel delivers them
        log.feed(stream[i:i + 7], out)
    log.close(out)
    assert out.getvalue().splitlines() == ["node-1     | torchrun banner", "node-1 r2  | first", "node-1 r3  | second",
                                           "node-1     | [0]:not a rank tag", "node-1 r3  | tail"]
    assert list(log.tail)[-2:] == ["[0]:not a rank tag", "[local rank 1] tail"]


def test_ssh_config_gives_global_known_hosts_and_keepalive(tmp_path: Path) -> None:
    """`ssh -G` prints GlobalKnownHostsFile (OpenSSH's two /etc files by default) and ServerAliveInterval."""
    config = tmp_path / "config"
    config.write_text(f"Host tuned\n  GlobalKnownHostsFile {tmp_path}/g1 {tmp_path}/g2\n  ServerAliveInterval 7\n"
                      "  UserKnownHostsFile none\n")
    cluster = parse_inventory(f"ssh_config: {config}\nhosts: [tuned, plain]\n")
    tuned = resolve_target(cluster.hosts[0], cluster.ssh_config)
    assert tuned.global_known_hosts_files == (f"{tmp_path}/g1", f"{tmp_path}/g2")
    assert tuned.server_alive_interval == 7 and tuned.known_hosts_files == ()  # `none` is no file called "none"
    plain = resolve_target(cluster.hosts[1], cluster.ssh_config)
    assert plain.global_known_hosts_files == ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
    assert plain.server_alive_interval == 0


def test_known_keys_come_from_user_then_global_files_with_their_lines(tmp_path: Path) -> None:
    """Comments, blanks and @-marker lines skipped, blanks of any width, hashed names, wildcards and `!`."""
    keys = [paramiko.Ed25519Key.from_private_key_file(str(_keygen(tmp_path / f"k{i}"))) for i in range(3)]
    line = [f"{k.get_name()} {k.get_base64()}" for k in keys]
    user, system = tmp_path / "known_hosts", tmp_path / "ssh_known_hosts"
    hashed = paramiko.HostKeys.hash_host("[10.0.0.1]:2222")
    user.write_text(f"# mine\n\n[10.0.0.9]:2222 {line[0]}\n{hashed} {line[1]}\n")
    system.write_text(f"@revoked * {line[2]}\n[10.0.0.*]:2222,!bad  {line[2]}  comment\n@cert-authority * {line[0]}\n")
    target = SSHTarget(name="a", hostname="10.0.0.1", port=2222, known_hosts_files=(str(user),),
                       global_known_hosts_files=(str(system), str(tmp_path / "absent")))
    found = _known_keys(target)
    assert [(k.key, k.where) for k in found] == [(keys[1], f"{user}:4"), (keys[2], f"{system}:2")]


def _keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


@pytest.mark.parametrize(("patterns", "name", "matches"), [
    (["[10.0.0.1]:2222"], "[10.0.0.1]:2222", True),  # brackets are literal, not a character class
    (["[10.0.0.1]:2222"], "[10.0.0.1]:2223", False),
    (["gpu*.cluster", "10.0.0.?"], "GPU07.cluster", True),
    (["gpu*.cluster", "!gpu13.cluster"], "gpu13.cluster", False),
    ([paramiko.HostKeys.hash_host("[10.0.0.1]:2222")], "[10.0.0.1]:2222", True),
    ([paramiko.HostKeys.hash_host("10.0.0.1")], "10.0.0.2", False),
])
def test_known_hosts_names_match_as_openssh_reads_them(patterns: list[str], name: str, matches: bool) -> None:
    assert _host_matches(patterns, name) is matches


# --- against real listeners and sshd ------------------------------------------------------------------------


# --- host keys and ProxyJump as OpenSSH has them (#20.8-10) -------------------------------------------------------


