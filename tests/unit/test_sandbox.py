"""The sandbox: pure renderers, then real sshd nodes reached with the real OpenSSH client."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devtools import sandbox
from devtools.sandbox import SandboxError, SandboxNode
from devtools.sandbox.limits import SANDBOX_MAX_NODES
from launcher.config.inventory import load_inventory

# ---------------------------------------------------------------------------------------------------------
# Pure helpers.


def test_node_addresses_count_up_from_the_base() -> None:
    assert sandbox.node_addresses("127.0.0.2", 3) == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert sandbox.node_addresses("127.0.3.255", 2) == ["127.0.3.255", "127.0.4.0"]
    many = sandbox.node_addresses("127.0.0.2", 256)  # past 127.0.0.255, and never on 127.0.1.1 (the trap's)
    assert len(set(many)) == 256 and "127.0.1.1" not in many and many[-1] == "127.0.1.2"


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


def test_render_inventory_env_is_every_nodes_default_and_the_launcher_reads_it(tmp_path: Path) -> None:
    text = sandbox.render_inventory(ssh_config=tmp_path / "ssh_config", names=["node-0", "node-1"],
                                    python="/venv/bin/python", workdir=tmp_path, nproc_per_node=1, master_port=29600,
                                    script="job.py", env={"PYTHONPATH": "/stand/in"})
    assert yaml.safe_load(text)["defaults"]["env"] == {"PYTHONPATH": "/stand/in"}
    (tmp_path / "sandbox.yaml").write_text(text)
    cluster = load_inventory(tmp_path / "sandbox.yaml")
    assert [[(v.name, v.value) for v in host.env] for host in cluster.hosts] == [[("PYTHONPATH", "/stand/in")]] * 2


def test_node_command_execs_sshd_in_its_own_namespaces() -> None:
    argv = sandbox.node_command("node-1", Path("/s/node-1/hosts"), Path("/s/node-1/sshd_config"))
    assert argv[:6] == ["unshare", "--uts", "--mount", "--propagation", "private", "/bin/sh"]
    assert "--fork" not in argv  # without it unshare execs: the pid we record is sshd's
    assert argv[-1].endswith("exec /usr/sbin/sshd -D -e -f /s/node-1/sshd_config")


@pytest.mark.parametrize("nodes", [0, SANDBOX_MAX_NODES + 1])
def test_up_refuses_bad_node_counts(nodes: int, tmp_path: Path) -> None:
    try:
        with pytest.raises(SandboxError, match=f"1 to {SANDBOX_MAX_NODES} nodes"):
            sandbox.up(nodes, state_dir=tmp_path / "state", inventory=tmp_path / "inv.yaml")
    finally:  # a count it failed to refuse started real sshd nodes (201 once stayed up for the rest of a suite)
        if (tmp_path / "state" / "sandbox.json").exists():
            sandbox.down(tmp_path / "state")
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


def test_each_node_keeps_its_runs_in_its_own_cache_home() -> None:
    text = sandbox.render_sshd_config("127.0.0.3", 2222, Path("/s/k"), Path("/s/p"), Path("/s/a"),
                                      Path("/s/node-1/cache"))
    assert "SetEnv XDG_CACHE_HOME=/s/node-1/cache" in text.splitlines()
    assert sandbox.node_cache(Path("/s"), 1) == Path("/s/node-1/cache")
