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
from conftest import free_port

from launcher import sandbox
from launcher.sandbox import Sandbox, SandboxError, SandboxNode
from tests.support.procs import gone, processes_mentioning

# ---------------------------------------------------------------------------------------------------------
# Pure helpers.


def test_node_addresses_count_up_from_the_base() -> None:
    assert sandbox.node_addresses("127.0.0.2", 3) == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert sandbox.node_addresses("127.0.3.255", 2) == ["127.0.3.255", "127.0.4.0"]


@pytest.mark.parametrize(("base", "count"), [("10.0.0.2", 1), ("127.255.255.250", 10), ("node-0", 1)])
def test_node_addresses_stay_in_loopback(base: str, count: int) -> None:
    with pytest.raises(SandboxError):
        sandbox.node_addresses(base, count)


def test_render_sshd_config() -> None:
    text = sandbox.render_sshd_config(
        "127.0.0.3", 2222, Path("/s/node-1/key"), Path("/s/node-1/sshd.pid"), Path("/s/authorized_keys")
    )
    lines = text.splitlines()
    for line in [
        "ListenAddress 127.0.0.3:2222",
        "HostKey /s/node-1/key",
        "PidFile /s/node-1/sshd.pid",
        "AuthorizedKeysFile /s/authorized_keys",
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "UsePAM no",
        "MaxStartups 100:30:200",
    ]:
        assert line in lines


def test_render_sshd_config_refuses_paths_sshd_would_misread() -> None:
    with pytest.raises(SandboxError, match="plain characters"):
        sandbox.render_sshd_config("127.0.0.2", 22, Path("/a b/key"), Path("/p"), Path("/k"))
    with pytest.raises(SandboxError):
        sandbox.render_sshd_config("127.0.0.2", 22, Path("/a%u/key"), Path("/p"), Path("/k"))


def test_render_ssh_config_has_one_strict_block_per_node() -> None:
    nodes = [SandboxNode("node-0", "127.0.0.2", 2222, 1), SandboxNode("node-1", "127.0.0.3", 2222, 2)]
    text = sandbox.render_ssh_config(nodes, Path("/s/id_ed25519"), Path("/s/known_hosts"))
    block = text.split("Host node-1\n")[1].splitlines()
    assert [line.strip() for line in block] == [
        "HostName 127.0.0.3",
        "Port 2222",
        "User root",
        "IdentityFile /s/id_ed25519",
        "IdentitiesOnly yes",
        "UserKnownHostsFile /s/known_hosts",
        "StrictHostKeyChecking yes",
    ]
    assert text.count("Host node-") == 2


def test_render_known_hosts_uses_bracketed_addr_and_port() -> None:
    text = sandbox.render_known_hosts([("127.0.0.2", 2222, "ssh-ed25519 AAAAkey node-0\n")])
    assert text == "[127.0.0.2]:2222 ssh-ed25519 AAAAkey\n"


def test_render_hosts_lists_every_node() -> None:
    text = sandbox.render_hosts(1, ["127.0.0.2", "127.0.0.3"])
    assert text == "127.0.0.1 localhost\n127.0.0.2 node-0\n127.0.0.3 node-1\n"


def test_render_hosts_faults() -> None:
    addrs = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert "node-0" not in sandbox.render_hosts(1, addrs, unresolvable=[0])
    trapped = sandbox.render_hosts(1, addrs, loopback_trap=True).splitlines()
    assert "127.0.1.1 node-1" in trapped
    assert "127.0.0.3 node-1" not in trapped
    assert "127.0.0.2 node-0" in trapped


def test_render_inventory_shape() -> None:
    text = sandbox.render_inventory(
        ssh_config=Path("/s/ssh_config"),
        names=["node-0", "node-1", "node-2"],
        python="/venv/bin/python",
        workdir=Path("/repo"),
        nproc_per_node=2,
        master_port=29600,
        script="train/ddp.py",
        script_args=["--epochs", "3"],
        python_override={2: "/other/python"},
    )
    assert text.startswith("# Written by `inv sandbox.up` for a local sandbox of 3 sshd nodes;")
    assert "  - {name: node-2, python: /other/python}" in text.splitlines()
    assert yaml.safe_load(text) == {
        "ssh_config": "/s/ssh_config",
        "host_key_policy": "strict",
        "defaults": {"python": "/venv/bin/python", "workdir": "/repo", "nproc_per_node": 2},
        "hosts": ["node-0", "node-1", {"name": "node-2", "python": "/other/python"}],
        "rendezvous": {"master_addr": "node-0", "master_port": 29600},
        "job": {"script": "train/ddp.py", "args": ["--epochs", "3"]},
    }


def test_node_command_execs_sshd_in_its_own_namespaces() -> None:
    argv = sandbox.node_command("node-1", Path("/s/node-1/hosts"), Path("/s/node-1/sshd_config"))
    assert argv[:6] == ["unshare", "--uts", "--mount", "--propagation", "private", "/bin/sh"]
    assert "--fork" not in argv  # without it unshare execs: the pid we record is sshd's
    assert argv[-1].endswith("exec /usr/sbin/sshd -D -e -f /s/node-1/sshd_config")


@pytest.mark.parametrize("nodes", [0, 201])
def test_up_refuses_bad_node_counts(nodes: int, tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="1 to 200 nodes"):
        sandbox.up(nodes, state_dir=tmp_path / "state", inventory=tmp_path / "inv.yaml")
    assert not (tmp_path / "state").exists()


def test_up_refuses_faults_on_missing_nodes(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="node 5"):
        sandbox.up(2, state_dir=tmp_path / "s", inventory=tmp_path / "i.yaml", unresolvable={0: [5]})


def test_no_sandbox_recorded(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="no sandbox is up"):
        sandbox.load(tmp_path)
    assert sandbox.down(tmp_path) == [f"no sandbox is up in {tmp_path}; nothing to stop."]
    assert sandbox.running(tmp_path) == {}


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
    code = f"from launcher import sandbox; print('|'.join(sandbox.down({str(sb.state_dir)!r})))"
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


def test_each_node_keeps_its_runs_in_its_own_cache_home() -> None:
    text = sandbox.render_sshd_config("127.0.0.3", 2222, Path("/s/k"), Path("/s/p"), Path("/s/a"),
                                      Path("/s/node-1/cache"))
    assert "SetEnv XDG_CACHE_HOME=/s/node-1/cache" in text.splitlines()
    assert sandbox.node_cache(Path("/s"), 1) == Path("/s/node-1/cache")
