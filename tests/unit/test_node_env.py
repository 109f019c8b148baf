"""Nodes that share nothing: forwarded variables, env files and the socket interface, from the inventory to torchrun.

The controller's resolution (`launcher.run.nodeenv`) and the agent's environment building are tested here without
SSH; one integration test launches on real sshd nodes and looks at what arrived, and where secrets did not go.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from launcher.config.fields import RESERVED_ENV, SOCKET_ENV
from launcher.config.inventory import parse_inventory
from launcher.config.model import ForwardEnv
from launcher.errors import LauncherError
from launcher.node import wire
from launcher.node.agent import runner
from launcher.node.common import netif
from launcher.plan.launchplan import NodeCommand, plan_launch
from launcher.plan.request import start_request
from launcher.run.nodeenv import NodeEnv, resolve_env
from tests.support.agentrun import run_agent

BASE = """
defaults: {python: /usr/bin/python3}
rendezvous: {master_addr: node-0, master_port: 29411}
job: {script: train.py}
"""


def node(tmp_path: Path, hosts: str = "[node-0]", index: int = 0, **defaults: object) -> NodeCommand:
    """One node's command from an inventory in `tmp_path` with these defaults."""
    data = yaml.safe_load(BASE)
    data["defaults"].update(defaults)
    data["hosts"] = yaml.safe_load(hosts)
    source = tmp_path / "inv.yaml"
    return plan_launch(parse_inventory(yaml.safe_dump(data), str(source))).nodes[index]


def env_file(tmp_path: Path, text: str, name: str = "node.env") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- controller: forward_env, env_file, precedence, reserved names, secrets ---------------------------------


def test_forward_env_copies_the_names_its_globs_match(tmp_path: Path) -> None:
    command = node(tmp_path, forward_env=["WANDB_*", "HF_?OKEN", "EXACT"])
    environ = {"WANDB_PROJECT": "p", "WANDB_MODE": "offline", "WANDBX": "no", "wandb_lower": "no",
               "HF_TOKEN": "t", "HF_XTOKEN": "no", "EXACT": "e", "EXACTLY": "no", "PATH": "/bin"}
    assert dict(resolve_env(command, environ)) == {"WANDB_PROJECT": "p", "WANDB_MODE": "offline", "HF_TOKEN": "t",
                                                   "EXACT": "e"}
    assert dict(resolve_env(command, {})) == {}  # a pattern that matches nothing here sends nothing


def test_precedence_env_file_then_forward_env_then_socket_ifname_then_env(tmp_path: Path) -> None:
    path = env_file(tmp_path, "ONLY_FILE=file\nBOTH=file\nALL=file\nNCCL_SOCKET_IFNAME=eth9\n")
    environ = {"BOTH": "forwarded", "ALL": "forwarded", "GLOO_SOCKET_IFNAME": "eth8"}
    command = node(tmp_path, env_file=str(path), forward_env=["BOTH", "ALL", "GLOO_*"], env={"ALL": "explicit"})
    assert dict(resolve_env(command, environ)) == {
        "ONLY_FILE": "file", "BOTH": "forwarded", "ALL": "explicit",
        "NCCL_SOCKET_IFNAME": "eth9", "GLOO_SOCKET_IFNAME": "eth8"}  # no socket_ifname: theirs go through
    # With socket_ifname, the agent sets both (it alone knows what auto finds): an env file or a glob does not win.
    with_socket = replace(command, socket_ifname="ib0")
    resolved = resolve_env(with_socket, environ)
    assert dict(resolved) == {"ONLY_FILE": "file", "BOTH": "forwarded", "ALL": "explicit"}
    request = start_request(plan_launch(parse_inventory(BASE + "hosts: [node-0]\n", "i.yaml")), with_socket,
                            resolved)
    assert request["socket_ifname"] == "ib0" and not set(SOCKET_ENV) & set(request["env"])
    node_env = runner.torchrun_env(request, {"NCCL_SOCKET_IFNAME": "login-value"})
    assert [node_env[name] for name in SOCKET_ENV] == ["=ib0", "ib0"]  # NCCL: that interface only, not a prefix


def test_names_torchrun_sets_are_never_sent_from_an_env_file_or_a_forwarded_glob(tmp_path: Path) -> None:
    path = env_file(tmp_path, "RANK=3\nMASTER_ADDR=10.9.9.9\nLOCAL_RANK=1\nTORCHELASTIC_RUN_ID=x\nKEEP=1\n")
    command = node(tmp_path, env_file=str(path), forward_env=["TORCH?LASTIC_X"])
    environ = {"TORCHELASTIC_X": "1", "RANK": "5"}
    assert dict(resolve_env(command, environ)) == {"KEEP": "1"}
    # The inventory refuses patterns that name them; whatever pattern gets through, the names stay here.
    everything = replace(command, env_file=None, forward_env=(ForwardEnv("*"),))
    environ = {**{name.replace("*", "X"): "stale" for name in RESERVED_ENV}, "WORLD_SIZEX": "ok"}
    assert dict(resolve_env(everything, environ)) == {"WORLD_SIZEX": "ok"}


def test_secret_names_come_from_secret_patterns_files_and_env(tmp_path: Path) -> None:
    path = env_file(tmp_path, "FILE_KEY=abc\nSHARED=from-file\n")
    command = node(tmp_path, env_file={"path": str(path), "secret": True},
                   forward_env=["WANDB_*", {"pattern": "WANDB_API_*", "secret": True}],
                   env={"TOKEN": {"from_env": "MY_TOKEN", "secret": True}, "PLAIN": "1", "SHARED": "explicit"})
    environ = {"WANDB_PROJECT": "p", "WANDB_API_KEY": "k3y", "MY_TOKEN": "t0k"}
    resolved = resolve_env(command, environ)
    assert dict(resolved) == {"FILE_KEY": "abc", "SHARED": "explicit", "WANDB_PROJECT": "p", "WANDB_API_KEY": "k3y",
                              "TOKEN": "t0k", "PLAIN": "1"}
    # Any secret source makes a name secret: SHARED's value is env's, but the secret file named it too.
    assert resolved.secret_names == {"FILE_KEY", "SHARED", "WANDB_API_KEY", "TOKEN"}
    assert "k3y" not in repr(resolved) and "t0k" not in repr(resolved) and "abc" not in repr(resolved)
    plan = plan_launch(parse_inventory(BASE + "hosts: [node-0]\n", "i.yaml"))
    request = start_request(plan, command, resolved)
    assert request["secret_names"] == ["FILE_KEY", "SHARED", "TOKEN", "WANDB_API_KEY"]
    assert request["env"] == dict(resolved)
    assert (request["unset_env"], request["master_addr"], request["master_port"]) == (list(RESERVED_ENV), "node-0",
                                                                                      29411)
    plain = node(tmp_path, env_file=str(path))  # the same file, not marked secret: nothing of it is
    assert resolve_env(plain, {}).secret_names == frozenset()


def test_env_file_is_read_by_dotenvs_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTROLLER_HOME", "/home/me")
    env_file(tmp_path, "# a comment\nexport A=1  # trailing\nB=\"two words\"\nC='single quoted'\n"
                       "D=${A}/x\nE=\nF=${CONTROLLER_HOME}/data\n")
    command = node(tmp_path, env_file="node.env")  # relative: to the inventory's folder
    assert dict(resolve_env(command, {})) == {"A": "1", "B": "two words", "C": "single quoted", "D": "1/x", "E": "",
                                              "F": "/home/me/data"}


@pytest.mark.parametrize(("text", "sentence"), [
    ("A=1\nghp_s3cret0123456789abcdef\n",  # a token pasted without its name
     "node-0: env_file {path}, line 2: has no `=`; write NAME=value (NAME= for an empty value)"),
    ("A=1\nB='s3cret never closed\n", "node-0: env_file {path}, line 2: cannot be read as NAME=value"),
    ("my-key=s3cret\n", "node-0: env_file {path}, line 1: the name before `=` is not a variable name (letters, "
                        "digits and _, not starting with a digit)"),
    ("A=1\n\n9s3cret0123456789=x\n", "node-0: env_file {path}, line 3: the name before `=` is not a variable "
                                     "name (letters, digits and _, not starting with a digit)"),
])
@pytest.mark.parametrize("secret", [True, False])
def test_env_file_errors_name_host_file_and_line_never_a_value(tmp_path: Path, text: str, sentence: str,
                                                               secret: bool) -> None:
    path = env_file(tmp_path, text)
    with pytest.raises(LauncherError) as caught:
        resolve_env(node(tmp_path, env_file={"path": str(path), "secret": secret}), {})
    assert str(caught.value) == sentence.format(path=path)
    assert "s3cret" not in str(caught.value)


def test_an_env_file_that_cannot_be_read_is_one_error_naming_host_and_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.env"
    command = node(tmp_path, hosts="[node-0, {name: node-1, env_file: " + str(missing) + "}]", index=1)
    with pytest.raises(LauncherError) as caught:
        resolve_env(command, {})
    assert str(caught.value) == (f"node-1: env_file {missing} cannot be read (No such file or directory); create it, "
                                 "or change env_file in the inventory")
    with pytest.raises(LauncherError, match=r"^node-0: env_file .* cannot be read \(Is a directory\)"):
        resolve_env(node(tmp_path, env_file=str(tmp_path)), {})


def test_a_plain_dict_env_keeps_the_inventorys_secrets(tmp_path: Path) -> None:
    command = node(tmp_path, env={"TOKEN": {"value": "x", "secret": True}})
    plan = plan_launch(parse_inventory(BASE + "hosts: [node-0]\n", "i.yaml"))
    assert start_request(plan, command, {"TOKEN": "x"})["secret_names"] == ["TOKEN"]
    assert resolve_env(command, {}) == {"TOKEN": "x"} and isinstance(resolve_env(command, {}), NodeEnv)


# --- the agent: the login environment, the socket interface ------------------------------------------------


def test_agent_constants_match_the_controllers() -> None:
    assert wire.SOCKET_ENV == SOCKET_ENV


@pytest.mark.parametrize(("name", "removed"), [
    ("RANK", True), ("MASTER_ADDR", True), ("TORCHELASTIC_RUN_ID", True), ("TORCHELASTIC_", True),
    ("RANKS", False), ("MY_RANK", False), ("TORCHELASTIC", False), ("rank", False),
])
def test_unset_env_removes_exact_names_and_star_globs(name: str, removed: bool) -> None:
    assert runner.unset_match(name, list(RESERVED_ENV)) is removed


def test_torchrun_env_drops_stale_login_values_before_adding_the_requests() -> None:
    request = {"unset_env": list(RESERVED_ENV), "socket_ifname": "lo", "env": {"A": "request", "KEEP": "request"},
               "launcher_env": {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[x]"}, "mark": "20260101-000000-abcdef/node1"}
    login = {"RANK": "5", "MASTER_ADDR": "stale", "TORCHELASTIC_X": "1", "KEEP": "login", "HOME": "/root",
             "PYTHONUNBUFFERED": "0", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "stale"}
    assert runner.torchrun_env(request, login) == {
        "KEEP": "request", "HOME": "/root", "PYTHONUNBUFFERED": "0", "A": "request", "NCCL_SOCKET_IFNAME": "=lo",
        "GLOO_SOCKET_IFNAME": "lo", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[x]", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        wire.RUN_ID_ENV: request["mark"]}


@pytest.mark.parametrize(("wanted", "found"), [("auto", "lo"), ("ib7", "ib7"), (None, None)])
def test_socket_ifname_auto_finds_the_interface_to_the_master_and_names_pass_through(wanted, found) -> None:
    request = {"socket_ifname": wanted, "master_addr": "127.0.0.1", "master_port": 29400}
    assert runner.socket_ifname(request) == (found, None)


def test_socket_ifname_auto_on_the_master_picks_the_interface_holding_its_address() -> None:
    # On the master's node the route to its own address is via lo; peers reach it on the interface that holds it.
    held = [(name, addr) for name, addr, _ in netif._ipv4_ifaces() if not addr.startswith("127.")]
    if not held:
        pytest.skip("no non-loopback IPv4 interface here")
    name, addr = held[0]
    assert netif.route_iface(addr, 29400) == (name, None)
    assert netif.route_iface("127.0.0.5", 29400) == ("lo", None)  # on lo's subnet: what a sandbox node sees


# --- the agent, run as the launcher runs it (request on stdin) ----------------------------------------------


def test_the_agent_keeps_a_stale_login_rank_from_torchrun_and_sets_the_socket_interface(tmp_path: Path) -> None:
    login = {"RANK": "5", "LOCAL_RANK": "3", "MASTER_ADDR": "10.9.9.9", "TORCHELASTIC_X": "1", "KEEP_ME": "yes"}
    code, events, run_dir = run_agent(tmp_path, login, socket_ifname="auto",
                                      env={"FROM_REQUEST": "r", "SECRET_X": "hush-1234"}, secret_names=["SECRET_X"])
    assert code == 0, events
    seen = json.loads((tmp_path / "env.json").read_text())
    assert not {"RANK", "LOCAL_RANK", "MASTER_ADDR", "TORCHELASTIC_X"} & set(seen)
    assert (seen["KEEP_ME"], seen["FROM_REQUEST"], seen["SECRET_X"]) == ("yes", "r", "hush-1234")
    assert (seen["NCCL_SOCKET_IFNAME"], seen["GLOO_SOCKET_IFNAME"]) == ("=lo", "lo")
    recorded = json.loads((run_dir / "command.json").read_text())
    assert "hush-1234" not in (run_dir / "command.json").read_text()
    assert recorded["secret_env"] == ["SECRET_X"] and recorded["unset_env"] == list(RESERVED_ENV)
    assert recorded["env"] == {"NCCL_SOCKET_IFNAME": "=lo", "GLOO_SOCKET_IFNAME": "lo", "FROM_REQUEST": "r"}


def test_an_explicit_interface_passes_through_and_none_sets_nothing(tmp_path: Path) -> None:
    login = {"NCCL_SOCKET_IFNAME": "from-login"}
    code, events, _ = run_agent(tmp_path, login, socket_ifname="ib7")
    assert code == 0, events
    seen = json.loads((tmp_path / "env.json").read_text())
    assert (seen["NCCL_SOCKET_IFNAME"], seen["GLOO_SOCKET_IFNAME"]) == ("=ib7", "ib7")
    code, events, _ = run_agent(tmp_path, login)
    assert code == 0, events
    seen = json.loads((tmp_path / "env.json").read_text())
    assert seen["NCCL_SOCKET_IFNAME"] == "from-login" and "GLOO_SOCKET_IFNAME" not in seen  # the node's own


def test_socket_ifname_auto_that_finds_nothing_starts_nothing(tmp_path: Path) -> None:
    code, events, run_dir = run_agent(tmp_path, {}, socket_ifname="auto", master_addr="no-such-node.invalid")
    assert code == 2
    [error] = [e["message"] for e in events if e["event"] == "error"]
    assert error.startswith("node1: socket_ifname auto found no interface toward master_addr no-such-node.invalid: "
                            "it does not resolve here ("), error
    assert error.endswith("; name the interface in the inventory (socket_ifname: eth0)")
    assert not run_dir.exists() and not (tmp_path / "env.json").exists()
    assert not [e for e in events if e["event"] == "started"]


# --- on real sshd nodes -----------------------------------------------------------------------------------


def test_inv_launch_never_quotes_a_token_in_an_env_file_or_inventory_error(tmp_path: Path) -> None:
    from tests.helpers import inv

    token = f"ghp_{secrets.token_hex(12)}"
    (tmp_path / ".env").write_text(f"A=1\n\n{token}\n")  # pasted without its name
    bare = tmp_path / "bare.yaml"
    bare.write_text("defaults: {env_file: {path: .env, secret: true}}\nhosts: [nowhere-1]\njob: {script: t.py}\n")
    result = inv("launch", "--hosts", str(bare), timeout=60)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"error: nowhere-1: env_file {tmp_path}/.env, line 3: has no `=`; write NAME=value "
                             "(NAME= for an empty value)\n")
    forgotten = tmp_path / "forgotten.yaml"
    forgotten.write_text(f"hosts:\n  - name: a\n    env:\n      HF_TOKEN: {{secret: true, {token}}}\n")
    result = inv("launch", "--hosts", str(forgotten), "--dry-run", timeout=60)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"error: {forgotten}:4: hosts[0].env.HF_TOKEN: has an unknown key (not shown: the "
                             "entry is secret); known keys: value, from_env, secret\n")


# --- the GPUs `--include host:0,2` chose, on a node whose login already sets CUDA_VISIBLE_DEVICES --------------------


@pytest.mark.parametrize(("login", "env", "gpus", "visible"), [
    ({}, {}, None, None),  # nothing chosen, nothing set: all the node's GPUs
    ({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, {}, None, "4,5,6,7"),  # the node's own value stands
    ({}, {}, [0, 2], "0,2"),
    ({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, {}, [0, 2], "4,6"),  # a shared node's allocation: places in it
    ({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, {}, [1], "GPU-bb"),
    ({"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "1,3"}, [1], "3"),  # the inventory's env first
])
def test_the_chosen_gpus_are_mapped_through_the_nodes_own_cuda_visible_devices(tmp_path: Path, login, env, gpus,
                                                                               visible) -> None:
    code, events, run_dir = run_agent(tmp_path, login, env=env, gpus=gpus)
    assert code == 0, events
    seen = json.loads((tmp_path / "env.json").read_text())
    assert seen.get("CUDA_VISIBLE_DEVICES") == visible
    assert seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # CUDA numbers the GPUs as nvidia-smi does
    assert json.loads((run_dir / "command.json").read_text())["visible_devices"] == (visible if gpus else None)


def test_a_node_that_shows_fewer_gpus_than_chosen_starts_nothing_and_its_order_is_kept(tmp_path: Path) -> None:
    login = {"CUDA_VISIBLE_DEVICES": "4,5", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    code, events, run_dir = run_agent(tmp_path, login, gpus=[0, 2])
    assert code == 2 and not run_dir.exists() and not (tmp_path / "env.json").exists()
    (error,) = [e for e in events if e["event"] == "error"]
    assert error["message"] == ("node1: GPU 2 chosen (--include/--exclude), but this node's own "
                                "CUDA_VISIBLE_DEVICES=4,5 shows 2 GPU(s); name GPUs the node shows, or the whole host")
    code, events, _ = run_agent(tmp_path, login, gpus=[1])
    assert code == 0, events
    seen = json.loads((tmp_path / "env.json").read_text())
    assert (seen["CUDA_VISIBLE_DEVICES"], seen["CUDA_DEVICE_ORDER"]) == ("5", "FASTEST_FIRST")  # the node's own order
