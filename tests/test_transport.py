"""Transport pure parts: ssh config resolution (as OpenSSH does it), host key policies, failure messages."""

from __future__ import annotations

import socket
from pathlib import Path

import paramiko
import pytest
from paramiko.ssh_exception import NoValidConnectionsError

from launcher.inventory import parse_inventory
from launcher.transport import SSHTarget, _AcceptNewPolicy, _connection, classify, resolve_target


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


@pytest.mark.parametrize(("exc", "kind", "words"), [
    (socket.gaierror(-2, "Name or service not known"), "unresolvable", "cannot resolve"),
    (NoValidConnectionsError({("127.0.0.1", 22): ConnectionRefusedError()}), "refused", "connection refused"),
    (TimeoutError(), "timeout", "no answer"),
    (paramiko.SSHException("Error reading SSH protocol banner"), "timeout", "no SSH greeting"),
    (paramiko.SSHException("No existing session"), "timeout", "no SSH greeting"),
    (paramiko.AuthenticationException("no"), "auth", "refused every key"),
    (paramiko.SSHException("Server '[h]:22' not found in known_hosts"), "host-key-unknown", "not in known_hosts"),
    (ValueError("odd"), "ssh", "ValueError: odd"),
])
def test_failures_are_typed_with_a_fix(exc: BaseException, kind: str, words: str) -> None:
    failure = classify(SSHTarget(name="gpu01", hostname="10.0.0.1", port=22, user="me"), exc)
    assert failure.kind == kind and failure.host == "gpu01" and words in failure.detail
    assert "\n" not in str(failure)


def test_log_lines_get_node_and_rank_prefixes_and_stay_whole() -> None:
    import io

    from launcher.logs import NodeLog

    log = NodeLog("node-1", 1, 6, rank_offset=2, mirror=None, colour=False)
    out = io.StringIO()
    stream = b"torchrun banner\n[default0]:first\n[default1]:sec" + b"ond\r\n[0]:not a rank tag\n[default1]:tail"
    for i in range(0, len(stream), 7):  # arbitrary chunk boundaries, as a channel delivers them
        log.feed(stream[i:i + 7], out)
    log.close(out)
    assert out.getvalue().splitlines() == ["node-1     | torchrun banner", "node-1 r2  | first", "node-1 r3  | second",
                                           "node-1     | [0]:not a rank tag", "node-1 r3  | tail"]
    assert list(log.tail)[-2:] == ["[0]:not a rank tag", "[local rank 1] tail"]
