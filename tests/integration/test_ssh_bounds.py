"""Every SSH wait has a bound: a server that stops answering after the connection was made, and the open files
that many nodes need (#21.3, #21.4). The stalled server is a real in-process Paramiko server; the limits are real
rlimits of a real `inv` process."""

from __future__ import annotations

import re
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest
import yaml

from launcher.config.inventory import parse_inventory
from launcher.errors import NodeFailure
from launcher.settings import SshSettings
from launcher.transport.channel import ExecTimeout
from launcher.transport.connections import Node, connect
from launcher.transport.failures import classify
from tests.helpers import REPO


class _StallingServer(paramiko.ServerInterface):
    """Takes any key and opens sessions, then never answers an exec request (a stuck sshd after the handshake)."""

    def __init__(self, release: threading.Event):
        self.release = release

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.release.wait(60)  # the server's own thread: nothing more is answered meanwhile
        return False


@pytest.fixture
def stalling_node(tmp_path: Path) -> Iterator[Path]:
    """An inventory of one host whose sshd stalls every exec request; yields the inventory's path."""
    host_key = paramiko.ECDSAKey.generate()
    client_key = paramiko.ECDSAKey.generate()
    key_file = tmp_path / "id_ecdsa"
    client_key.write_private_key_file(str(key_file))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    (tmp_path / "ssh_config").write_text(
        f"Host stuck\n    HostName 127.0.0.1\n    Port {port}\n    User me\n    IdentityFile {key_file}\n"
        f"    IdentitiesOnly yes\n    UserKnownHostsFile {tmp_path / 'known_hosts'}\n")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(yaml.safe_dump({"ssh_config": str(tmp_path / "ssh_config"), "hosts": ["stuck"],
                                         "defaults": {"python": "python3", "workdir": str(tmp_path)},
                                         "job": {"script": "train.py"}}))
    release = threading.Event()
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while not release.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(conn)
            transport.add_server_key(host_key)
            transport.start_server(server=_StallingServer(release))
            transports.append(transport)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield inventory
    finally:
        release.set()
        listener.close()
        for transport in transports:
            transport.close()


def test_a_command_the_server_never_starts_fails_within_the_connect_timeout(stalling_node: Path) -> None:
    cluster = parse_inventory(stalling_node.read_text(), str(stalling_node))
    node = connect(cluster.hosts[0], cluster, SshSettings(1.5))
    assert isinstance(node, Node), node
    t0 = time.monotonic()
    try:
        with pytest.raises(ExecTimeout) as raised:
            node.open_channel("true")
        took = time.monotonic() - t0
        failure = classify(node.target, raised.value)
    finally:
        node.close()
    assert 1.4 < took < 1.5 + 1, took
    assert isinstance(failure, NodeFailure)
    assert failure.detail.endswith("did not start the command within 1.5 s (connect_timeout)")


def test_inv_doctor_and_launch_return_from_a_stalled_sshd(stalling_node: Path) -> None:
    for task in ("doctor", "launch"):
        t0 = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "invoke", task, "--hosts", str(stalling_node),
                                 "--connect-timeout", "2"], cwd=REPO, capture_output=True, text=True, timeout=60,
                                check=False)
        took = time.monotonic() - t0
        assert result.returncode == 1, result.stdout + result.stderr
        said = " ".join((result.stdout + result.stderr).split())  # the doctor's table wraps its cells
        # the first channel's command never starts; a second channel on the same stuck server is not even opened
        assert re.search(r"did not (start the command|open a session) within 2 s \(connect_timeout\)", said), said
        assert "Traceback" not in result.stdout + result.stderr
        assert took < 2 + 8, f"inv {task} took {took:.1f} s"  # interpreter start, then one bounded wait


def _limited(soft: int, hard: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return apply


@pytest.mark.parametrize("hard", [48, 4096], ids=["hard limit too low", "soft limit raised"])
def test_open_files_are_raised_to_the_hard_limit_or_refused_at_once(tmp_path: Path, hard: int) -> None:
    inventory = tmp_path / "many.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": [f"gpu{i:02d}.invalid" for i in range(40)],
                                         "defaults": {"python": "python3", "workdir": "/w"}}))
    result = subprocess.run([sys.executable, "-m", "invoke", "doctor", "--hosts", str(inventory), "--connect-timeout",
                             "1"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
                            preexec_fn=_limited(48, hard))
    out = result.stdout + result.stderr
    assert "Traceback" not in out and "Too many open files" not in out
    if hard == 48:
        assert result.returncode == 1
        assert result.stderr.strip() == (
            "error: 40 node(s) need about 304 open files here and this process may open 48 (its hard limit: 48); "
            "raise it with `ulimit -n 304` (or ask for a higher hard limit), or use fewer nodes at once")
    else:
        assert "open files" not in out  # raised to what 40 nodes need: each node gets its own finding
        assert out.count("cannot resolve") >= 40, out
