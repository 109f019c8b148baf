"""The launch plan for nodes that share nothing: the unset variables, setup, forwarded variables, env file and socket
interface, in the node's commands, its shell line and the dry run."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from launcher.config.model import EnvFile, EnvVar, ForwardEnv, Job
from launcher.plan.dryrun import dry_run_text
from launcher.plan.launchplan import RESERVED_ENV, plan_launch
from tests.support.plans import HEAD, HETERO, NASTY_WORDS, ORDER_TEXT, UNSET, as_shell_reads, cluster

SHARE_NOTHING = """\
    defaults:
      workdir: ~/project
      setup: [source /opt/conda/bin/activate train, module load cuda/12.4]
      forward_env: [WANDB_*, {pattern: HF_TOKEN, secret: true}, WANDB_PROJECT]
      env_file: .env
      socket_ifname: auto
      env: {NCCL_DEBUG: WARN}
    hosts:
      - {name: gpu01, addr: 10.0.0.1}
      - name: gpu02
        setup: []
        forward_env: ~
        env_file: {path: /etc/train.env, secret: true}
        socket_ifname: ib0
      - name: gpu03
        env_file: ~
        socket_ifname: ~
        forward_env: [{pattern: AWS_*, secret: true}]
    job: {script: t.py}
"""


def test_reserved_env_is_importable_from_the_plan() -> None:
    assert RESERVED_ENV[0] == "RANK" and RESERVED_ENV[-1] == "TORCHELASTIC_*" and len(RESERVED_ENV) == 12


def test_node_commands_carry_the_hosts_new_fields() -> None:
    one, two, three = plan_launch(cluster(SHARE_NOTHING), run_id="r").nodes
    assert all(n.unset_env == RESERVED_ENV for n in (one, two, three))
    assert one.setup == ("source /opt/conda/bin/activate train", "module load cuda/12.4") == three.setup
    assert two.setup == ()
    assert one.forward_env == (ForwardEnv("WANDB_*"), ForwardEnv("HF_TOKEN", secret=True), ForwardEnv("WANDB_PROJECT"))
    assert two.forward_env == one.forward_env
    assert three.forward_env == (*one.forward_env, ForwardEnv("AWS_*", secret=True))
    assert (one.env_file, two.env_file, three.env_file) == (EnvFile(".env"), EnvFile("/etc/train.env", True), None)
    assert (one.socket_ifname, two.socket_ifname, three.socket_ifname) == ("auto", "ib0", None)
    assert all(n.env == (EnvVar("NCCL_DEBUG", value="WARN"),) for n in (one, two, three))


def test_shell_line_with_every_feature() -> None:
    one, two, three = plan_launch(cluster(SHARE_NOTHING), run_id="r").nodes
    unset = " ".join(UNSET) + " " + ORDER_TEXT
    torchrun = "python3 -m torch.distributed.run --nnodes 3"
    assert one.shell_line().startswith(
        "source /opt/conda/bin/activate train && module load cuda/12.4 && "
        f"cd \"$HOME\"/project && env {unset} '<from .env>' '<forwarded: WANDB_*>' HF_TOKEN='<secret>' "
        "WANDB_PROJECT=\"$WANDB_PROJECT\" NCCL_SOCKET_IFNAME='=<iface to 10.0.0.1>' "
        f"GLOO_SOCKET_IFNAME='<iface to 10.0.0.1>' NCCL_DEBUG=WARN {torchrun} --node-rank 0 ")
    assert two.shell_line().startswith(
        f"cd \"$HOME\"/project && env {unset} '<from /etc/train.env, secret>' '<forwarded: WANDB_*>' "
        "HF_TOKEN='<secret>' WANDB_PROJECT=\"$WANDB_PROJECT\" NCCL_SOCKET_IFNAME==ib0 GLOO_SOCKET_IFNAME=ib0 "
        f"NCCL_DEBUG=WARN {torchrun} --node-rank 1 ")
    assert three.shell_line().startswith(
        "source /opt/conda/bin/activate train && module load cuda/12.4 && "
        f"cd \"$HOME\"/project && env {unset} '<forwarded: WANDB_*>' HF_TOKEN='<secret>' "
        f"WANDB_PROJECT=\"$WANDB_PROJECT\" '<forwarded, secret: AWS_*>' NCCL_DEBUG=WARN {torchrun} --node-rank 2 ")


def test_placeholders_are_single_words_and_the_rest_round_trips() -> None:
    job = Job("t.py", tuple(w for w in NASTY_WORDS if w))
    for node, variables in zip(plan_launch(cluster(SHARE_NOTHING), job, run_id="r").nodes, (7, 7, 5), strict=True):
        line = node.shell_line()
        setup = "".join(f"{step} && " for step in node.setup)
        assert line.startswith(setup)
        argv = shlex.split(line[len(setup):])
        assert argv[:4 + len(HEAD)] == ["cd", "$HOME/project", "&&", "env", *HEAD]
        assert len(argv) == 4 + len(HEAD) + variables + len(node.argv)  # each placeholder is one word
        assert argv[-len(node.argv):] == as_shell_reads(node)


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
def test_a_real_shell_runs_setup_in_the_same_shell_and_sets_the_interface(tmp_path: Path) -> None:
    c = cluster("""\
        hosts:
          - name: a
            workdir: '~/my project'
            setup: ["export FROM_SETUP='set up; ok'", "cd /", "export SECOND=\\"$FROM_SETUP\\""]
            socket_ifname: eth1
            forward_env: [COPIED]
            env: {REF: {from_env: COPIED}}
    """)
    (tmp_path / "my project").mkdir()
    node = plan_launch(c, Job("t.py", ("a b",)), run_id="r").nodes[0]
    printer = ("""sh -c 'printf "%s\\0" "$PWD" "$FROM_SETUP" "$SECOND" "$NCCL_SOCKET_IFNAME" "$GLOO_SOCKET_IFNAME" """
               """"$COPIED" "$REF" "${RANK-unset}" "$@"' printer """)
    line = node.shell_line().replace(" python3 -m ", f" {printer}python3 -m ", 1)
    out = subprocess.run(["sh", "-c", line], capture_output=True, cwd=tmp_path, check=True, timeout=10,
                         env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "RANK": "3", "COPIED": "it's  $x"},
                         ).stdout.decode()
    home = [str(tmp_path) + w[1:] if i in node.home_args and w.startswith("~/") else w
            for i, w in enumerate(node.argv)]
    assert out.split("\0")[:-1] == [str(tmp_path / "my project"), "set up; ok", "set up; ok", "=eth1", "eth1",
                                    "it's  $x", "it's  $x", "unset", *home]


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX sh")
def test_a_line_with_placeholders_is_still_valid_shell() -> None:
    for node in plan_launch(cluster(SHARE_NOTHING), run_id="r").nodes:
        result = subprocess.run(["sh", "-n", "-c", node.shell_line()], capture_output=True, timeout=10)
        assert result.returncode == 0, (node.shell_line(), result.stderr)


def test_dry_run_text_says_what_each_new_setting_does() -> None:
    text = dry_run_text(plan_launch(cluster(SHARE_NOTHING), run_id="r"))
    assert ("\nunset from the node's login environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, "
            "ROLE_RANK, ROLE_WORLD_SIZE, GROUP_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_* "
            "(torchrun sets them)\n") in text
    node0 = text[text.index("node 0: gpu01"):text.index("node 1: gpu02")]
    node1 = text[text.index("node 1: gpu02"):text.index("node 2: gpu03")]
    node2 = text[text.index("node 2: gpu03"):text.index("\nunset from")]
    assert "  setup: 2 line(s) run first, in the shell that then starts torchrun\n" in node0
    assert "  forward_env: WANDB_*, HF_TOKEN (secret), WANDB_PROJECT: copied from your environment at launch\n" in node0
    assert "  env_file: .env is read on this machine at launch\n" in node0
    assert ("  socket_ifname auto: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME name the interface this node routes to "
            "10.0.0.1 through, found on the node at launch\n") in node0
    assert "setup:" not in node1
    assert "  env_file: /etc/train.env is read on this machine at launch; its values are secret, never shown\n" in node1
    assert ("  socket_ifname: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME are ib0 (the interface NCCL and gloo use)\n"
            in node1)
    assert "env_file" not in node2 and "socket_ifname" not in node2
    assert "  forward_env: WANDB_*, HF_TOKEN (secret), WANDB_PROJECT, AWS_* (secret): copied" in node2


def test_dry_run_text_without_new_settings_has_only_the_unset_line() -> None:
    text = dry_run_text(plan_launch(cluster(HETERO), run_id="r"))
    for word in ("setup:", "forward_env", "env_file", "socket_ifname", "sync:"):
        assert word not in text
    assert "unset from the node's login environment: RANK, " in text


def test_dry_run_text_says_what_sync_copies() -> None:
    text = dry_run_text(plan_launch(cluster("hosts: [a]\njob: {script: t.py}\nsync: {}\n"), run_id="r"))
    assert "\nsync: . (on this machine) to each node's workdir\n" in text
    text = dry_run_text(plan_launch(cluster("hosts: [a]\njob: {script: t.py}\nsync: {src: src, dest: /scratch/p, "
                               "exclude: [data/, '*.pt']}\n"), run_id="r"))
    assert "\nsync: src (on this machine) to /scratch/p, except data/, *.pt\n" in text


def test_secrets_of_new_settings_never_show() -> None:
    plan = plan_launch(cluster("""\
        hosts:
          - name: a
            forward_env: [{pattern: API_KEY, secret: true}]
            env_file: {path: secret.env, secret: true}
        job: {script: t.py}
    """), run_id="r")
    line = plan.nodes[0].shell_line()
    assert "$API_KEY" not in line and "API_KEY='<secret>'" in line and "'<from secret.env, secret>'" in line
    assert line in dry_run_text(plan)
