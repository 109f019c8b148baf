"""The sandbox: pure renderers, then real sshd nodes reached with the real OpenSSH client."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from devtools import sandbox
from devtools.observe import free_port, gone, processes_mentioning
from devtools.sandbox import Sandbox, SandboxError

# ---------------------------------------------------------------------------------------------------------
# Pure helpers.


# ---------------------------------------------------------------------------------------------------------
# Real sshd nodes.


def ssh(sb: Sandbox, node: str, command: str) -> subprocess.CompletedProcess[str]:
    argv = ["ssh", "-F", str(sb.ssh_config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", node, command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.mark.integration
def test_nodes_have_their_own_hostname_and_hosts(make_sandbox) -> None:
    host_hosts, host_name = Path("/etc/hosts").read_bytes(), socket.gethostname()
    sb = make_sandbox(2, master_port=free_port())
    node0, node1 = ssh(sb, "node-0", "hostname"), ssh(sb, "node-1", "hostname; getent hosts node-0")
    assert (node0.returncode, node0.stdout) == (0, "node-0\n"), node0.stderr
    assert node1.returncode == 0, node1.stderr
    assert node1.stdout.split() == ["node-1", sb.nodes[0].addr, "node-0"]
    assert Path("/etc/hosts").read_bytes() == host_hosts
    assert socket.gethostname() == host_name
    assert sandbox.running(sb.state_dir) == {"node-0": True, "node-1": True}


@pytest.mark.integration
def test_nodes_can_log_in_with_a_bashrc_of_their_own(make_sandbox) -> None:
    # The bench's nodes: this machine's root .bashrc (pyenv init) stays this machine's, and is left as it was.
    bashrc = Path("~/.bashrc").expanduser()
    if not bashrc.exists():
        pytest.skip("the login user has no ~/.bashrc to cover")
    before = bashrc.read_bytes()
    sb = make_sandbox(2, master_port=free_port(), login_rc="export DDP_NODE_RC=own-login\n")
    for node in ("node-0", "node-1"):
        seen = ssh(sb, node, "echo $DDP_NODE_RC")
        assert (seen.returncode, seen.stdout) == (0, "own-login\n"), seen.stderr
    assert bashrc.read_bytes() == before
    assert subprocess.run(["bash", "-ic", "echo ${DDP_NODE_RC:-none}"], capture_output=True,
                          text=True).stdout.strip().splitlines()[-1] == "none"


@pytest.mark.integration
def test_inventory_matches_the_sandbox(make_sandbox, tmp_path: Path) -> None:
    port = free_port()
    sb = make_sandbox(2, master_port=port, nproc_per_node=2, python_override={1: "/other/python"})
    data = yaml.safe_load(sb.inventory.read_text())
    assert data["ssh_config"] == str(sb.ssh_config)
    assert data["host_key_policy"] == "strict"
    assert Path(data["defaults"]["python"]).is_absolute() and "shims" not in data["defaults"]["python"]
    assert data["defaults"]["workdir"] == str(sandbox.REPO_ROOT)
    assert data["defaults"]["nproc_per_node"] == 2
    assert data["hosts"] == ["node-0", {"name": "node-1", "python": "/other/python"}]
    assert data["rendezvous"] == {"master_addr": "node-0", "master_port": port}
    assert data["job"] == {"script": "train/ddp.py", "args": []}
    assert sandbox.load(sb.state_dir) == sb


@pytest.mark.integration
def test_down_stops_listeners_and_sessions(make_sandbox) -> None:
    sb = make_sandbox(2)
    # A session left running: down must stop what runs under the listener too.
    argv = ["ssh", "-F", str(sb.ssh_config), "-o", "BatchMode=yes", "node-1", "echo $$; exec sleep 60"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as client:
        session_pid = int(client.stdout.readline())
        lines = sandbox.down(sb.state_dir)
        assert [line.split(": ")[-1] for line in lines] == ["stopped", "stopped"]
        assert all(gone(node.pid) for node in sb.nodes)
        deadline = time.monotonic() + 5
        while not gone(session_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(session_pid)
        assert client.wait(timeout=10) != 0
    assert processes_mentioning(str(sb.state_dir)) == []
    assert sandbox.running(sb.state_dir) == {}
    assert sandbox.down(sb.state_dir) == [f"no sandbox is up in {sb.state_dir}; nothing to stop."]


def still_open(sockets: list[socket.socket], seconds: float) -> list[socket.socket]:
    """The sockets whose server end is not closed within `seconds` (read to EOF or reset; a banner may come first)."""
    deadline, found = time.monotonic() + seconds, []
    for sock in sockets:
        try:
            while True:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                if not sock.recv(4096):
                    break
        except TimeoutError:
            found.append(sock)
        except OSError:  # reset: closed too
            pass
    return found


@pytest.mark.integration
def test_down_stops_the_connections_a_dying_listener_forked(make_sandbox) -> None:
    # Connections keep arriving while down stops the node: what the listener forks after down's last look has
    # no parent once the listener is gone (and a session of its own), and must be stopped all the same.
    sb = make_sandbox(1)
    node, clients, done = sb.nodes[0], [], threading.Event()

    def connect() -> None:
        while not done.is_set():
            try:
                client = socket.create_connection((node.addr, node.port), timeout=1)
            except OSError:
                time.sleep(0.001)
                continue
            clients.append(client)
            with contextlib.suppress(OSError):
                client.sendall(b"SSH-2.0-test\r\n")  # past the banner: sshd holds it for its login grace time

    thread = threading.Thread(target=connect)
    thread.start()
    try:
        time.sleep(0.1)
        assert [line.split(": ")[-1] for line in sandbox.down(sb.state_dir)] == ["stopped"]
    finally:
        done.set()
        thread.join()
    try:
        assert len(clients) > 1
        assert still_open(clients, 10) == []
        assert processes_mentioning(str(sb.state_dir)) == []
    finally:
        for client in clients:
            client.close()


@pytest.mark.integration
def test_up_again_after_down(make_sandbox) -> None:
    first = make_sandbox(1)
    sandbox.down(first.state_dir)
    again = sandbox.up(
        1, state_dir=first.state_dir, inventory=first.inventory, base_addr=first.nodes[0].addr, ssh_port=2222
    )
    assert again.nodes[0].pid != first.nodes[0].pid
    assert ssh(again, "node-0", "hostname").stdout == "node-0\n"


@pytest.mark.integration
def test_unresolvable_node(make_sandbox) -> None:
    sb = make_sandbox(2, unresolvable={1: [0]})
    assert ssh(sb, "node-1", "getent hosts node-0").returncode == 2  # getent: key not found
    assert ssh(sb, "node-0", "getent hosts node-1").stdout.split()[0] == sb.nodes[1].addr


@pytest.mark.integration
def test_self_loopback_trap(make_sandbox) -> None:
    sb = make_sandbox(2, self_loopback_trap=[1])
    assert ssh(sb, "node-1", "getent hosts node-1").stdout.split()[0] == "127.0.1.1"
    assert ssh(sb, "node-0", "getent hosts node-1").stdout.split()[0] == sb.nodes[1].addr


@pytest.mark.integration
def test_stop_node_leaves_the_others(make_sandbox) -> None:
    sb = make_sandbox(3)
    sandbox.stop_node(sb.state_dir, 1)
    assert sandbox.running(sb.state_dir) == {"node-0": True, "node-1": False, "node-2": True}
    assert ssh(sb, "node-1", "true").returncode == 255
    assert ssh(sb, "node-2", "hostname").stdout == "node-2\n"
    lines = sandbox.down(sb.state_dir)
    assert [line.split(": ")[-1] for line in lines] == ["stopped", "already stopped", "stopped"]


@pytest.mark.integration
def test_up_twice_in_one_state_dir(make_sandbox) -> None:
    sb = make_sandbox(1)
    with pytest.raises(SandboxError, match=r"already up .*inv sandbox\.down"):
        sandbox.up(1, state_dir=sb.state_dir, inventory=sb.inventory, base_addr="127.0.9.2")
    assert sandbox.running(sb.state_dir) == {"node-0": True}


@pytest.mark.integration
def test_port_taken_stops_what_started(make_sandbox) -> None:
    base = make_sandbox.reserve_base()
    node1_addr = sandbox.node_addresses(base, 2)[1]
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past runs' TIME_WAITs on this port
        squatter.bind((node1_addr, 2222))
        squatter.listen()
        with pytest.raises(SandboxError, match=rf"node-1 \({node1_addr}:2222\).*already in use"):
            make_sandbox(2, base_addr=base)
    state_dir = make_sandbox.state_dirs[-1]
    assert not (state_dir / "sandbox.json").exists()
    assert processes_mentioning(str(state_dir)) == []
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((base, 2222), timeout=2).close()


@pytest.mark.integration
def test_down_from_another_process(make_sandbox) -> None:
    sb = make_sandbox(2)
    code = f"from devtools import sandbox; print('|'.join(sandbox.down({str(sb.state_dir)!r})))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=sandbox.REPO_ROOT, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert [line.split(": ")[-1] for line in result.stdout.strip().split("|")] == ["stopped", "stopped"]
    assert all(gone(node.pid) for node in sb.nodes)
    assert sandbox.running(sb.state_dir) == {}


@pytest.mark.integration
def test_up_over_a_sandbox_whose_nodes_died(make_sandbox) -> None:
    sb = make_sandbox(2)
    for index in range(2):
        sandbox.stop_node(sb.state_dir, index)
    again = sandbox.up(2, state_dir=sb.state_dir, inventory=sb.inventory, base_addr=sb.nodes[0].addr, ssh_port=2222)
    assert sandbox.running(again.state_dir) == {"node-0": True, "node-1": True}


