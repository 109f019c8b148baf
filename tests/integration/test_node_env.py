"""Nodes that share nothing: forwarded variables, env files and the socket interface, from the inventory to torchrun.

The controller's resolution (`launcher.run.nodeenv`) and the agent's environment building are tested here without
SSH; one integration test launches on real sshd nodes and looks at what arrived, and where secrets did not go.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO


def env_file(tmp_path: Path, text: str, name: str = "node.env") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- controller: forward_env, env_file, precedence, reserved names, secrets ---------------------------------


# --- the agent: the login environment, the socket interface ------------------------------------------------


# --- the agent, run as the launcher runs it (request on stdin) ----------------------------------------------


# --- on real sshd nodes -----------------------------------------------------------------------------------

SHOW = """\
import json, os
names = sorted(k for k in os.environ if k.startswith("NE_") or k.endswith("_SOCKET_IFNAME"))
with open(os.path.join(os.environ["NE_OUT_DIR"], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({k: os.environ[k] for k in names}, f)
for k in names:
    if k not in ("NE_TOKEN", "NE_FILE_SECRET") and not k.startswith("NE_OUT"):
        print("%s=%s" % (k, os.environ[k]), flush=True)
"""


@pytest.mark.integration
def test_forwarded_and_file_variables_arrive_and_secrets_go_nowhere_else(make_sandbox, tmp_path: Path) -> None:
    from devtools.observe import free_port
    from tests.helpers import inv, node_runs, run_id_of

    token, file_secret = "tok-s3cret-4567", "file-s3cret-7890"
    script = tmp_path / "show_env.py"
    script.write_text(SHOW)
    out = tmp_path / "out"
    out.mkdir()
    box = make_sandbox(2, master_port=free_port(), script=str(script))
    plain = env_file(tmp_path, "NE_FILE=from-file\nNE_FWD_OVER=file\nRANK=7\nNCCL_SOCKET_IFNAME=eth9\n", "plain.env")
    hidden = env_file(tmp_path, f"NE_FILE_SECRET={file_secret}\n", "hidden.env")
    data = yaml.safe_load(box.inventory.read_text())
    data["defaults"].update({
        "env": {"NE_OUT_DIR": str(out), "NE_FWD_TOP": "explicit"},
        "forward_env": ["NE_FWD_*", {"pattern": "NE_TOKEN", "secret": True}],
        "env_file": str(plain),
        "socket_ifname": "auto",
    })
    data["hosts"] = ["node-0", {"name": "node-1", "env_file": {"path": str(hidden), "secret": True}}]
    box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    mine = {"NE_FWD_OVER": "forwarded", "NE_FWD_TOP": "forwarded", "NE_FWD_PLAIN": "plain", "NE_TOKEN": token}
    logs = tmp_path / "logs"

    dry = inv("launch", "--hosts", str(box.inventory), "--dry-run", log_dir=logs, env=mine)
    assert dry.returncode == 0, dry.stderr
    assert token not in dry.stdout + dry.stderr and file_secret not in dry.stdout + dry.stderr

    launched = inv("launch", "--hosts", str(box.inventory), log_dir=logs, env=mine)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert token not in launched.stdout + launched.stderr and file_secret not in launched.stdout + launched.stderr
    run_id = run_id_of(launched.stderr)

    zero, one = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    common = {"NE_OUT_DIR": str(out), "NE_FWD_OVER": "forwarded", "NE_FWD_TOP": "explicit", "NE_FWD_PLAIN": "plain",
              "NE_TOKEN": token, "NCCL_SOCKET_IFNAME": "=lo", "GLOO_SOCKET_IFNAME": "lo"}  # NCCL: lo exactly
    assert zero == {**common, "NE_FILE": "from-file"}
    assert one == {**common, "NE_FILE_SECRET": file_secret}  # node-1's env file replaces the defaults'
    for node_name in ("node-0", "node-1"):
        assert f"{node_name} r" in launched.stdout and "NCCL_SOCKET_IFNAME==lo" in launched.stdout

    for path in logs.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert token not in text and file_secret not in text, path
    for index in (0, 1):
        command_json = node_runs(box, index) / run_id / f"node-{index}" / "command.json"
        text = command_json.read_text()
        assert token not in text and file_secret not in text
        recorded = json.loads(text)
        assert "RANK" not in recorded["env"] and recorded["env"]["NCCL_SOCKET_IFNAME"] == "=lo"
        assert recorded["secret_env"] == (["NE_TOKEN"] if index == 0 else ["NE_FILE_SECRET", "NE_TOKEN"])


@pytest.mark.integration
def test_a_hosts_override_of_a_secret_default_is_never_shown_or_stored(make_sandbox, tmp_path: Path) -> None:
    from devtools.observe import free_port
    from tests.helpers import inv, node_runs, run_id_of

    default, override = f"ghp_default{secrets.token_hex(8)}", f"ghp_override{secrets.token_hex(8)}"
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "show_env.py"
    script.write_text(SHOW)
    box = make_sandbox(1, master_port=free_port(), script=str(script))
    data = yaml.safe_load(box.inventory.read_text())
    data["defaults"]["env"] = {"NE_OUT_DIR": str(out), "NE_TOKEN": {"value": default, "secret": True}}
    data["hosts"] = [{"name": "node-0", "env": {"NE_TOKEN": override}}]
    box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    logs = tmp_path / "logs"

    dry = inv("launch", "--hosts", str(box.inventory), "--dry-run", log_dir=logs)
    assert dry.returncode == 0, dry.stderr
    assert "NE_TOKEN='<secret>'" in dry.stdout, dry.stdout
    launched = inv("launch", "--hosts", str(box.inventory), log_dir=logs)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    for shown in (dry.stdout, dry.stderr, launched.stdout, launched.stderr):
        assert override not in shown and default not in shown
    assert json.loads((out / "rank0.json").read_text()) == {"NE_OUT_DIR": str(out), "NE_TOKEN": override}  # it arrived
    run_dir = node_runs(box, 0) / run_id_of(launched.stderr) / "node-0"
    for folder in (run_dir, logs):
        for path in folder.rglob("*"):
            if path.is_file():
                assert override.encode() not in path.read_bytes(), path
    assert json.loads((run_dir / "command.json").read_text())["secret_env"] == ["NE_TOKEN"]




def test_the_doctor_and_socket_ifname_auto_agree_on_a_name_with_several_addresses(tmp_path: Path) -> None:
    # The master's name resolves to two addresses, an unreachable one first (gai.conf ranks it higher) and then
    # 127.0.0.1, which this node's lo holds. Looking at the first address only (the probe's old way) routes
    # through the default interface; the agent looked at every address and chose lo. Both now ask one function.
    hosts, gai = tmp_path / "hosts", tmp_path / "gai.conf"
    hosts.write_text("127.0.0.1 localhost\n10.255.255.1 multi-master\n127.0.0.1 multi-master\n")
    gai.write_text("precedence ::ffff:10.255.255.0/120 100\nprecedence ::ffff:127.0.0.0/104 5\n")
    order = ("import socket; print(' '.join(i[4][0] for i in "
             "socket.getaddrinfo('multi-master', 29400, 0, socket.SOCK_DGRAM)))")
    script = (f"mount --bind {hosts} /etc/hosts && mount --bind {gai} /etc/gai.conf && "
              f"{sys.executable} -c \"{order}\" && "
              f"exec {sys.executable} -m tests.support.ifaces multi-master 29400 {tmp_path}")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    first_line, answer = done.stdout.splitlines()[0], json.loads(done.stdout.splitlines()[-1])
    assert first_line.split() == ["10.255.255.1", "127.0.0.1"]  # the name really has several, the held one last
    assert answer["probe"] == {"ip": "127.0.0.1", "iface": "lo"}, answer
    assert answer["agent"] == "lo", answer
