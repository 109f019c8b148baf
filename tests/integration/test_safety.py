"""Hostile input, host keys, secrets, atomic start and connection errors, on real sshd nodes."""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.observe import free_port, reserve_base_addr
from launcher.config.fields import RESERVED_ENV
from launcher.config.inventory import load_inventory
from launcher.node.wire import RUNS_ROOT
from launcher.plan.request import log_tail_settings, stacks_settings
from launcher.run.actions import agent_command, agent_input
from launcher.transport.connections import connect_all
from tests.helpers import inv, node_runs, run_id_of, run_processes, runs_on
from tests.support.nodeenv import node_python

pytestmark = pytest.mark.integration


def set_inventory(path: Path, **changes: object) -> None:
    data = yaml.safe_load(path.read_text())
    for key, value in changes.items():
        if key in ("env",):
            data["defaults"][key] = value
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data, allow_unicode=True))


# --- quoting: arbitrary text reaches the program byte for byte, through ssh and the node agent ----------

_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40)


@pytest.fixture(scope="module")
def node_zero(tmp_path_factory):
    from devtools import sandbox

    root = tmp_path_factory.mktemp("quoting")
    base, lock = reserve_base_addr()  # held while the module's node lives: the factory's sandboxes skip it
    try:
        box = sandbox.up(1, state_dir=root / "state", inventory=root / "inv.yaml", base_addr=base,
                         python=node_python())
        cluster = load_inventory(box.inventory)
        nodes, failures = connect_all(cluster)
        assert not failures
        yield cluster, nodes["node-0"]
        nodes["node-0"].close()
    finally:
        sandbox.down(root / "state")
        lock.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(_TEXT, max_size=4), value=_TEXT, workdir_name=_TEXT.filter(lambda s: s not in ("", ".", "..")
                                                                                   and "/" not in s))
def test_any_text_reaches_the_program_exactly(node_zero, tmp_path_factory, args, value, workdir_name) -> None:
    cluster, node = node_zero
    host = cluster.hosts[0]
    workdir = tmp_path_factory.mktemp("wd") / workdir_name
    workdir.mkdir()
    out = workdir / "out.json"
    program = ("import json,os,sys; json.dump({'argv': sys.argv[1:], 'env': os.environ['HOSTILE'], "
               "'cwd': os.getcwd()}, open('out.json', 'w'))")
    run_id = f"20000101-000000-{secrets.token_hex(3)}"
    request = {"action": "start", "run_dir": f"{RUNS_ROOT}/{run_id}/node-0", "mark": f"{run_id}/node-0",
               "workdir": str(workdir), "argv": [host.python, "-c", program, *args], "expand_home": [0],
               "env": {"HOSTILE": value}, "launcher_env": {}, "secret_names": [], "detach": False, "grace": 5.0,
               "heartbeat_timeout": 30.0, "alive_interval": 5.0, "unset_env": list(RESERVED_ENV),
               "away_after_s": 15.0, "attach_tail_bytes": 65536, "reattach": False,
               "socket_ifname": None, "master_addr": "node-0", "master_port": 29500, "log_tail": log_tail_settings(),
               **stacks_settings(), "watch": True}
    channel = node.open_channel(agent_command(host.python))
    channel.send(agent_input(request) + b"go\n")  # stdin stays open: EOF would mean "launcher gone"
    result = channel.collect(timeout=30)
    channel.close()
    assert result.exit_code == 0, result.stderr
    seen = json.loads(out.read_text())
    assert seen == {"argv": args, "env": value, "cwd": str(workdir)}


# --- host keys ---------------------------------------------------------------------------------------------


def other_key(tmp_path: Path) -> str:
    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return " ".join(key.with_suffix(".pub").read_text().split()[:2])


def test_a_changed_host_key_is_refused_naming_the_line(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/sleeper.py")
    lines = box.known_hosts.read_text().splitlines()
    addr = lines[1].split()[0]
    lines[1] = f"{addr} {other_key(tmp_path)}"
    box.known_hosts.write_text("\n".join(lines) + "\n")
    for policy in ("strict", "accept-new"):
        set_inventory(box.inventory, host_key_policy=policy)
        result = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs", timeout=60)
        assert result.returncode == 1
        assert f"node-1: host-key-changed: the host key of {addr[1:].replace(']', '')}" in result.stderr, result.stderr
        assert f"{box.known_hosts}:2" in result.stderr, result.stderr
        assert f"ssh-keygen -f {box.known_hosts} -R " in result.stderr, result.stderr  # the file that holds the line
        assert "nothing was started" in result.stderr


def test_unknown_host_strict_refuses_accept_new_learns_once(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/echo_args.py")
    lines = box.known_hosts.read_text().splitlines()
    box.known_hosts.write_text(lines[0] + "\n")  # node-1 unknown
    strict = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs", timeout=60)
    assert strict.returncode == 1
    assert "node-1: host-key-unknown" in strict.stderr and "ssh-keyscan" in strict.stderr
    set_inventory(box.inventory, host_key_policy="accept-new")
    result = inv("status", "--hosts", str(box.inventory), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    learned = box.known_hosts.read_text().splitlines()
    assert len(learned) == 2 and learned[1].split()[1:] == lines[1].split()[1:]


# --- secrets -------------------------------------------------------------------------------------------------


def test_secrets_never_show_in_argv_dry_run_logs_or_run_dir(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/sleeper.py", script_args=["0.2"])
    secret = f"s3cret-{secrets.token_hex(8)}"
    set_inventory(box.inventory, env={"ECHO_TOKEN": {"from_env": "LAUNCHER_TEST_TOKEN", "secret": True},
                                      "PLAIN": "visible"})
    env = {"LAUNCHER_TEST_TOKEN": secret}
    logs = tmp_path / "logs"
    dry = inv("launch", "--hosts", str(box.inventory), "--dry-run", env=env)
    assert dry.returncode == 0 and "ECHO_TOKEN='<secret>'" in dry.stdout, dry.stdout
    assert secret not in dry.stdout + dry.stderr
    started = inv("launch", "--hosts", str(box.inventory), "--detach", log_dir=logs, env=env, timeout=60)
    assert started.returncode == 0, started.stderr
    run_id = run_id_of(started.stderr)
    try:
        deadline = time.monotonic() + 30
        while len(run_processes(run_id)) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = run_processes(run_id)
        assert len(pids) >= 4
        for pid in pids:
            assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()  # what `ps` shows
        workers = [p for p in pids if b"sleeper.py" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert any(secret.encode() in Path(f"/proc/{p}/environ").read_bytes() for p in workers)  # it arrived
    finally:
        inv("stop", "--hosts", str(box.inventory), "--run", run_id, timeout=60)
    run_dirs = [node_runs(box, i) / run_id for i in range(2)]
    assert all(d.is_dir() for d in run_dirs)
    for folder in (*run_dirs, logs):
        for path in folder.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
    command = json.loads((run_dirs[0] / "node-0" / "command.json").read_text())
    assert command["secret_env"] == ["ECHO_TOKEN"] and "ECHO_TOKEN" not in command["env"]


def test_a_missing_from_env_variable_is_an_error_before_connecting(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(1, torchrun="stand-in", master_port=free_port(), script="tests/scripts/sleeper.py")
    set_inventory(box.inventory, env={"TOKEN": {"from_env": "LAUNCHER_SURELY_UNSET", "secret": True}})
    result = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs")
    assert result.returncode == 1
    assert "node-0: env TOKEN is to be copied from $LAUNCHER_SURELY_UNSET, which is not set here" in result.stderr


# --- atomic start and connection errors ------------------------------------------------------------------


def test_a_node_that_cannot_start_stops_the_others(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/sleeper.py",
                       python_override={1: "/nonexistent/python3"})
    result = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", log_dir=tmp_path / "logs", timeout=60)
    assert result.returncode == 1
    assert "could not start: node-1:" in result.stderr and "/nonexistent/python3" in result.stderr, result.stderr
    # node-0 was ready and waiting for `go`: it is told to stop instead, so nothing started anywhere.
    assert "; nothing was started" in result.stderr, result.stderr
    assert run_processes(run_id_of(result.stderr)) == []
    assert runs_on(box) == []


def test_connection_errors_are_one_line_per_node_with_a_fix(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(1, master_port=free_port())
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts TCP, never speaks SSH
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    config = tmp_path / "ssh_config"
    node = box.nodes[0]
    config.write_text(
        f"Host stranger\n  HostName {node.addr}\n  Port {node.port}\n  User root\n  IdentityFile {stranger}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {box.known_hosts}\n"
        f"Host silent\n  HostName 127.0.0.1\n  Port {silent.getsockname()[1]}\n  User root\n"
        f"  IdentityFile {stranger}\n  IdentitiesOnly yes\n"
        f"Host refused\n  HostName 127.0.0.1\n  Port {free_port()}\n  User root\n"
    )
    inventory = tmp_path / "bad.yaml"
    inventory.write_text(yaml.safe_dump({
        "ssh_config": str(config),
        "hosts": ["stranger", "silent", "refused", "no-such-node.invalid",
                  {"name": "keyless", "identity_file": str(tmp_path / "missing_key")}],
        "job": {"script": "x.py"},
    }))
    t0 = time.monotonic()
    result = inv("launch", "--hosts", str(inventory), "--connect-timeout", "3", log_dir=tmp_path / "logs")
    silent.close()
    assert result.returncode == 1
    assert time.monotonic() - t0 < 20
    err = result.stderr
    assert "cannot reach 5 node(s); nothing was started" in err, err
    assert "stranger: auth:" in err and "ssh-copy-id" in err, err
    assert "silent: timeout:" in err, err
    assert "refused: refused: connection refused" in err, err
    assert "no-such-node.invalid: unresolvable:" in err, err
    assert "keyless: key-file: identity_file" in err and "missing_key does not exist" in err, err
    assert "Traceback" not in err


# --- host keys in global known_hosts files (GlobalKnownHostsFile) ------------------------------------------


def with_global_known_hosts(box, tmp_path: Path, user_lines: list[str], global_lines: list[str]) -> Path:
    """Point the sandbox's inventory at an ssh config whose GlobalKnownHostsFile is a file of `global_lines`."""
    box.known_hosts.write_text("".join(f"{line}\n" for line in user_lines))
    global_file = tmp_path / "ssh_known_hosts"
    global_file.write_text("".join(f"{line}\n" for line in global_lines))
    config = tmp_path / "ssh_config"
    config.write_text(box.ssh_config.read_text() + f"\nHost *\n    GlobalKnownHostsFile {global_file}\n")
    set_inventory(box.inventory, ssh_config=str(config))
    return global_file


def test_host_key_in_a_global_known_hosts_file_is_trusted_and_never_copied(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, master_port=free_port())
    lines = box.known_hosts.read_text().splitlines()
    global_file = with_global_known_hosts(box, tmp_path, lines[:1], ["# managed by the admins", lines[1]])
    for policy in ("strict", "accept-new"):
        set_inventory(box.inventory, host_key_policy=policy)
        nodes, failures = connect_all(load_inventory(box.inventory))
        for node in nodes.values():
            node.close()
        assert not failures and sorted(nodes) == ["node-0", "node-1"], failures
    assert box.known_hosts.read_text().splitlines() == lines[:1]  # nothing learnt, nothing copied from /etc
    assert global_file.read_text().splitlines() == ["# managed by the admins", lines[1]]


def test_host_key_changed_in_a_global_known_hosts_file_is_refused_naming_it(make_sandbox, tmp_path: Path) -> None:
    """A host the global file records with another key is changed, not unknown: accept-new must not learn it."""
    box = make_sandbox(2, master_port=free_port())
    lines = box.known_hosts.read_text().splitlines()
    addr = lines[1].split()[0]
    global_file = with_global_known_hosts(box, tmp_path, lines[:1], ["# managed by the admins",
                                                                     f"{addr} {other_key(tmp_path)}"])
    for policy in ("strict", "accept-new"):
        set_inventory(box.inventory, host_key_policy=policy)
        nodes, failures = connect_all(load_inventory(box.inventory))
        for node in nodes.values():
            node.close()
        assert sorted(nodes) == ["node-0"] and [f.kind for f in failures] == ["host-key-changed"], failures
        message = str(failures[0])
        assert f"differs from the one in {global_file}:2" in message, message
        assert f"ssh-keygen -f {global_file} -R " in message, message
        assert "\n" not in message
    assert box.known_hosts.read_text().splitlines() == lines[:1]


def test_host_key_the_user_recorded_passes_beside_a_stale_global_one(make_sandbox, tmp_path: Path) -> None:
    """As OpenSSH: a key is good when any known_hosts file records it (Paramiko alone would read /etc's only)."""
    box = make_sandbox(2, master_port=free_port())
    lines = box.known_hosts.read_text().splitlines()
    with_global_known_hosts(box, tmp_path, lines, [f"{lines[1].split()[0]} {other_key(tmp_path)}"])
    nodes, failures = connect_all(load_inventory(box.inventory))
    for node in nodes.values():
        node.close()
    assert not failures and sorted(nodes) == ["node-0", "node-1"], failures
