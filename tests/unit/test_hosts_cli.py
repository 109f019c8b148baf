"""`--hosts` takes a DeepSpeed/MPI hostfile for every task (settings from invoke.yaml's `launcher.defaults` and
`launcher.job`); `--include`/`--exclude` choose hosts and GPUs on launch and doctor.

Wrong input is found before anything connects; one real launch on sandbox nodes runs exactly the ranks asked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher import app
from launcher.config.model import DEFAULT_MASTER_PORT
from launcher.errors import USAGE, InventoryError, PlanError
from tests.helpers import inv
from tests.support.hostfiles import config_file

EXAMPLE = "hosts/example.yaml"


# --- the cluster every task loads -------------------------------------------------------------------------------


def test_a_hostfile_takes_defaults_and_job_from_the_config(hostfile: Path) -> None:
    cluster = app.load_inventory(app.Hosts(str(hostfile), {"python": "/opt/venv/bin/python", "setup": "module load x"},
                                           {"script": "train.py"}))
    assert [(h.name, h.nproc_per_node, h.python, h.setup) for h in cluster.hosts] == [
        ("worker-1", 4, "/opt/venv/bin/python", ("module load x",)),
        ("worker-2", 4, "/opt/venv/bin/python", ("module load x",))]
    assert cluster.job is not None and cluster.job.script == "train.py"
    assert (cluster.ssh_config, cluster.host_key_policy) == (None, "strict")


def test_a_hostfile_is_reached_through_the_ssh_config_the_defaults_name(hostfile: Path) -> None:
    cluster = app.load_inventory(app.Hosts(str(hostfile), {"ssh_config": "~/.ssh/cluster.conf",
                                                           "host_key_policy": "accept-new", "user": "ubuntu"}))
    assert (cluster.ssh_config, cluster.host_key_policy) == ("~/.ssh/cluster.conf", "accept-new")
    assert {h.user for h in cluster.hosts} == {"ubuntu"}


@pytest.mark.parametrize(("defaults", "sentence"), [
    ({"host_key_policy": "yes"},
     "invoke.yaml: launcher.defaults.host_key_policy: must be one of strict, accept-new, got 'yes' (str)"),
    ({"ssh_config": ""}, "invoke.yaml: launcher.defaults.ssh_config: must be a non-empty string, got '' (str)"),
    ({"ssh_config": ["a"]}, "invoke.yaml: launcher.defaults.ssh_config: must be a non-empty string, got ['a'] (list)"),
    ({"pyton": "x"}, "invoke.yaml: launcher.defaults.pyton: unknown key 'pyton'; did you mean 'python'?"),
])
def test_wrong_defaults_for_a_hostfile_name_invoke_yaml_and_the_key(hostfile: Path, defaults: dict,
                                                                    sentence: str) -> None:
    with pytest.raises(InventoryError) as caught:
        app.load_inventory(app.Hosts(str(hostfile), defaults))
    assert str(caught.value) == sentence, str(caught.value)  # the inventory's own checks, naming invoke.yaml


def test_an_inventory_ignores_the_defaults_meant_for_hostfiles() -> None:
    plain = app.load_inventory(EXAMPLE)
    given = app.load_inventory(app.Hosts(EXAMPLE, {"python": "/elsewhere", "ssh_config": "/x", "host_key_policy": "?"},
                                         {"script": "other.py"}))
    assert given == plain


def test_include_and_exclude_choose_hosts_and_gpus(hostfile: Path) -> None:
    chosen = app.load_inventory(app.Hosts(str(hostfile), include="worker-1:1,3@worker-2"))
    assert [(h.name, h.nproc_per_node) for h in chosen.hosts] == [("worker-1", 2), ("worker-2", 4)]
    assert chosen.hosts[0].gpus == (1, 3) and chosen.hosts[1].gpus is None
    rest = app.load_inventory(app.Hosts(str(hostfile), exclude="worker-1"))
    assert [h.name for h in rest.hosts] == ["worker-2"]
    assert (rest.rendezvous.master_addr, rest.rendezvous.master_port) == ("worker-2", DEFAULT_MASTER_PORT)


def test_a_wrong_choice_is_a_usage_error(hostfile: Path) -> None:
    with pytest.raises(PlanError) as caught:
        app.load_inventory(app.Hosts(str(hostfile), include="worker-3"))
    assert caught.value.exit_code == USAGE == 2
    assert str(caught.value) == (f"{hostfile}: --include 'worker-3': no host 'worker-3' in the inventory; did you "
                                 "mean 'worker-2'?")


# --- the command line: one sentence, exit 2, nothing contacted -----------------------------------------------------


@pytest.mark.parametrize(("task", "args", "sentence"), [
    ("launch", ["--include", "nope"], "--include 'nope': no host 'nope' in the inventory; the hosts are worker-1, "
                                      "worker-2"),
    ("launch", ["--include", "worker-2:4"], "--include 'worker-2:4': worker-2 has GPU indices 0 to 3 "
                                            "(nproc_per_node 4), not 4"),
    ("launch", ["--exclude", "worker-1@worker-2"], "--exclude 'worker-1@worker-2' leaves no host to run on"),
    ("launch", ["--include", "worker-1", "--exclude", "worker-2"],
     "--include and --exclude cannot be used together; give one of them"),
    ("launch", ["--include", "worker-1:x"], "--include 'worker-1:x': 'x' is not a GPU index (0, 1, 2, ...)"),
    ("doctor", ["--exclude", "worker-9"], "--exclude 'worker-9': no host 'worker-9' in the inventory; did you mean "
                                          "'worker-2'?"),
    ("doctor", ["--include", "@"], "--include '@': a host name is empty (hosts are separated by @)"),
])
def test_a_wrong_include_or_exclude_exits_2_with_one_sentence(hostfile: Path, task: str, args: list[str],
                                                              sentence: str) -> None:
    result = inv(task, "--hosts", str(hostfile), *args, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip() == f"error: {hostfile}: {sentence}"
    assert result.stdout == "" and "connect" not in result.stderr


def test_include_works_on_a_yaml_inventory_too() -> None:
    result = inv("launch", "--hosts", EXAMPLE, "--include", "gpu01", "--dry-run", timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("run ") and ": 1 node(s), world size 8, " in result.stdout.splitlines()[0]
    assert "node 0: gpu01" in result.stdout and "gpu02" not in result.stdout


def test_a_hostfile_dry_run_shows_the_config_defaults_and_the_choice(hostfile: Path, tmp_path: Path) -> None:
    conf = config_file(tmp_path, {"python": "/opt/venv/bin/python", "setup": [". /opt/venv/bin/activate"]},
                       {"script": "train/ddp.py", "args": ["--epochs", 2]})
    result = inv("-f", str(conf), "launch", "--hosts", str(hostfile), "--exclude", "worker-2:0,1", "--dry-run",
                 timeout=60)
    assert result.returncode == 0, result.stderr
    first, *rest = result.stdout.splitlines()
    assert ": 2 node(s), world size 6, rendezvous at worker-1:29500" in first
    commands = [line for line in rest if line.startswith("  $ ")]
    assert len(commands) == 2
    assert all(c.startswith("  $ . /opt/venv/bin/activate && ") for c in commands)
    assert all("/opt/venv/bin/python -m torch.distributed.run" in c and c.endswith("train/ddp.py --epochs 2")
               for c in commands)
    assert "CUDA_VISIBLE_DEVICES='<GPUs 2,3 among those the node shows>'" in commands[1]
    assert "--nproc-per-node 2" in commands[1]


def test_script_on_the_command_line_replaces_the_configs_job(hostfile: Path, tmp_path: Path) -> None:
    conf = config_file(tmp_path, job={"script": "train/ddp.py"})
    result = inv("-f", str(conf), "launch", "--hosts", str(hostfile), "--script", "other.py", "--dry-run", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "torch.distributed.run" in result.stdout and "train/ddp.py" not in result.stdout


def test_wrong_config_defaults_are_named_in_one_sentence(hostfile: Path, tmp_path: Path) -> None:
    conf = config_file(tmp_path, {"port": "22"})
    result = inv("-f", str(conf), "status", "--hosts", str(hostfile), timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == ("error: invoke.yaml: launcher.defaults.port: must be a port number from 1 to "
                                     "65535, got '22' (str)")
    assert result.stdout == ""
    assert "Traceback" not in result.stderr


def test_a_hostfile_without_a_job_asks_for_one(hostfile: Path) -> None:
    result = inv("launch", "--hosts", str(hostfile), "--dry-run", timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"error: {hostfile}: no job to run: add a `job: {{script: ...}}` entry, or "
                                     "pass --script (--module, --command)")


# --- on real sshd nodes --------------------------------------------------------------------------------------------




def test_the_words_after_a_double_dash_are_the_scripts_arguments_and_args_beside_them_is_refused() -> None:
    # torchrun, deepspeed and most launchers take them so (they were dropped without a word: #69 item 1)
    result = inv("launch", "--hosts", EXAMPLE, "--include", "gpu01", "--dry-run", "--", "--steps", "200",
                 "--name", "a b", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--steps 200 --name 'a b'" in result.stdout, result.stdout
    both = inv("launch", "--hosts", EXAMPLE, "--args", "--steps 1", "--dry-run", "--", "--steps", "200", timeout=60)
    assert both.returncode == USAGE and "--args and the words after `--` both give" in both.stderr, both.stderr
