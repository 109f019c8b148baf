"""DeepSpeed/MPI hostfiles: one host a line, slots optional; the same Cluster and checks as an inventory."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from launcher.config.hostfile import load_hosts, looks_like_hostfile, parse_hostfile
from launcher.config.inventory import load_inventory
from launcher.config.model import EnvFile, EnvVar, ForwardEnv, Job
from launcher.errors import InventoryError
from launcher.plan.launchplan import plan_launch

SRC = "hosts.txt"


def error(text: str, defaults: dict | None = None, job: dict | None = None, **kwargs: str) -> str:
    with pytest.raises(InventoryError) as info:
        parse_hostfile(textwrap.dedent(text), SRC, defaults, job, **kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


# --- the format ----------------------------------------------------------------------------------------------


def test_deepspeeds_good_hostfile_with_empty_lines_and_comments() -> None:
    cluster = parse_hostfile("""
    worker-1 slots=2
    worker-2 slots=2

    localhost slots=1
    123.23.12.10 slots=2

    #worker-1 slots=3
    # this is a comment

    """, SRC)
    assert [(h.name, h.nproc_per_node) for h in cluster.hosts] == [
        ("worker-1", 2), ("worker-2", 2), ("localhost", 1), ("123.23.12.10", 2)]
    assert cluster.source == SRC
    assert cluster.world_size == 7


def test_slots_are_optional_trailing_comments_and_tabs_are_fine() -> None:
    cluster = parse_hostfile("a\nb slots=8   # the big one\n\tc\tslots=2#x\nmissingslots\n", SRC)
    assert [(h.name, h.nproc_per_node) for h in cluster.hosts] == [("a", 1), ("b", 8), ("c", 2), ("missingslots", 1)]


def test_node_ranks_follow_the_lines_and_master_is_the_first_host() -> None:
    cluster = parse_hostfile("zeta slots=2\nalpha slots=2\n", SRC)
    assert [h.name for h in cluster.hosts] == ["zeta", "alpha"]
    assert (cluster.rendezvous.master_addr, cluster.rendezvous.master_port) == ("zeta", 29500)
    assert not cluster.rendezvous.master_addr_explicit
    plan = plan_launch(cluster, Job("t.py"), run_id="r")
    assert [n.rank_offset for n in plan.nodes] == [0, 2]


def test_lines_of_the_hosts_are_kept() -> None:
    cluster = parse_hostfile("# hosts\n\nworker-1 slots=8\nworker-2\n", SRC)
    assert cluster.lines == {"hosts": 3, "hosts[0]": 3, "hosts[0].name": 3, "hosts[0].nproc_per_node": 3,
                             "hosts[1]": 4, "hosts[1].name": 4}


@pytest.mark.parametrize(("text", "sentence"), [
    ("a\nb slots=eight\n", "hosts.txt:2: 'slots=eight' is not slots=N with N a positive integer"),
    ("a slots=0\n", "hosts.txt:1: 'slots=0' is not slots=N with N a positive integer"),
    ("a slots=-1\n", "hosts.txt:1: 'slots=-1' is not slots=N with N a positive integer"),
    ("a slots=\n", "hosts.txt:1: 'slots=' is not slots=N with N a positive integer"),
    ("a slots=2 slots=3\n", "hosts.txt:1: gives slots= twice"),
    ("a slots=1025\n", "hosts.txt:1: 'slots=1025' is more than 1024 (worker processes on one node)"),
    ("a\nb slots=1000000000\n", "hosts.txt:2: 'slots=1000000000' is more than 1024 (worker processes on one node)"),
    pytest.param("a slots=" + "9" * 5000 + "\n", "hosts.txt:1: 'slots=" + "9" * 63 + "…' is more than 1024 "
                 "(worker processes on one node)", id="5000 digits"),  # int() of 5,000 digits would raise
    ("a max_slots=8\n", "hosts.txt:1: 'max_slots=8' is not slots=N; a line is NAME or NAME slots=N"),
    ("worker-1 slots=2\nthis is bad slots=1\n", "hosts.txt:2: 'is' is not slots=N; a line is NAME or NAME slots=N"),
    ("worker-1 slots=2\nworker-2 slots=1\nworker-1 slots=1\n", "hosts.txt:3: host 'worker-1' is listed twice "
     "(also line 1)"),
    ("gpu01:4\n", "hosts.txt:1: 'gpu01:4' is MPICH's NAME:N form; write gpu01 slots=4"),
    ("a\n-oProxyCommand=x\n", "hosts.txt:2: '-oProxyCommand=x' is not a host name, ssh alias or IP address "
     "(a line is NAME or NAME slots=N)"),
    ("a\nb;c slots=1\n", "hosts.txt:2: 'b;c' is not a host name, ssh alias or IP address "
     "(a line is NAME or NAME slots=N)"),
    ("a\nhosts:\n", "hosts.txt:2: 'hosts:' is not a host name, ssh alias or IP address "
     "(a line is NAME or NAME slots=N)"),
    ("\n# nothing\n\n", "hosts.txt: no hosts: list one per line (a line is NAME or NAME slots=N; # starts a comment)"),
    ("", "hosts.txt: no hosts: list one per line (a line is NAME or NAME slots=N; # starts a comment)"),
])
def test_errors_name_the_file_and_line(text: str, sentence: str) -> None:
    assert error(text) == sentence


def test_ipv6_names_keep_their_colons() -> None:
    cluster = parse_hostfile("fe80::1%eth0 slots=2\n::1\n", SRC)
    assert [h.name for h in cluster.hosts] == ["fe80::1%eth0", "::1"]


# --- defaults and job, as invoke.yaml's launcher.defaults and launcher.job would give them --------------------


def test_defaults_apply_and_slots_win_over_their_nproc_per_node() -> None:
    defaults = {"user": "ubuntu", "python": "/opt/venv/bin/python", "workdir": "~/project", "nproc_per_node": 4,
                "env": {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": 4}, "setup": "module load cuda",
                "forward_env": ["WANDB_*"], "env_file": "conf/.env", "socket_ifname": "auto"}
    cluster = parse_hostfile("a slots=8\nb\n", "hosts/hosts.txt", defaults, {"script": "train.py", "args": ["-e", 3]})
    a, b = cluster.hosts
    assert (a.nproc_per_node, b.nproc_per_node) == (8, 4)
    for host in (a, b):
        assert (host.user, host.python, host.workdir, host.socket_ifname) == (
            "ubuntu", "/opt/venv/bin/python", "~/project", "auto")
        assert host.env == (EnvVar("NCCL_DEBUG", value="WARN"), EnvVar("OMP_NUM_THREADS", value="4"))
        assert host.setup == ("module load cuda",)
        assert host.forward_env == (ForwardEnv("WANDB_*"),)
        assert host.env_file == EnvFile("conf/.env")  # relative to invoke.yaml's folder, not the hostfile's
    assert cluster.job == Job("train.py", ("-e", "3"))


def test_a_relative_env_file_is_relative_to_the_defaults_file() -> None:
    cluster = parse_hostfile("a\n", SRC, {"env_file": ".env"}, defaults_source="/etc/launcher/invoke.yaml")
    assert cluster.hosts[0].env_file == EnvFile("/etc/launcher/.env")


def test_no_defaults_means_the_built_in_ones() -> None:
    host = parse_hostfile("a\n", SRC).hosts[0]
    assert (host.python, host.workdir, host.nproc_per_node, host.env) == ("python3", "~", 1, ())
    assert parse_hostfile("a\n", SRC).job is None


@pytest.mark.parametrize(("defaults", "sentence"), [
    ({"port": "22"}, "invoke.yaml: launcher.defaults.port: must be a port number from 1 to 65535, got '22' (str)"),
    ({"nproc_per_nod": 8}, "invoke.yaml: launcher.defaults.nproc_per_nod: unknown key 'nproc_per_nod'; did you mean "
     "'nproc_per_node'?"),
    ({"nproc_per_node": "eight"}, "invoke.yaml: launcher.defaults.nproc_per_node: must be a positive integer or "
     "\"auto\", got 'eight' (str)"),
    ({"env": {"RANK": "0"}}, "invoke.yaml: launcher.defaults.env.RANK: torchrun sets RANK for every worker; "
     "remove it from env"),
    ({"env": {"TOKEN": {"value": ["hunter2"], "secret": True}}}, "invoke.yaml: launcher.defaults.env.TOKEN.value: "
     "must be a string or a number, got a value of type list (not shown: the entry is secret)"),
    ({"setup": ["a #b"]}, "invoke.yaml: launcher.defaults.setup[0]: has a shell comment ('#b'), which would hide the "
     "rest of the node's command line; put it on a YAML comment line instead"),
    ({"name": "x"}, "invoke.yaml: launcher.defaults.name: unknown key 'name'; known keys: user, port, identity_file, "
     "python, workdir, nproc_per_node, env, setup, forward_env, env_file, socket_ifname, container"),
    ([1], "invoke.yaml: launcher.defaults: must be a mapping, got [1] (list)"),
])
def test_bad_defaults_name_the_config_file_and_key(defaults: dict, sentence: str) -> None:
    assert error("a\nb\n", defaults) == sentence


@pytest.mark.parametrize(("job", "sentence"), [
    ({"args": ["x"]}, "invoke.yaml: launcher.job: has no `script:` (the training script, relative to workdir), "
                      "`module:` (run as `python -m`) or `command:` (a program, not Python)"),
    ({"script": "t.py", "args": "--x 1"}, "invoke.yaml: launcher.job.args: must be a list of words, "
     "got '--x 1' (str)"),
    ({"script": "t.py", "arg": []}, "invoke.yaml: launcher.job.arg: unknown key 'arg'; did you mean 'args'?"),
])
def test_bad_job_names_the_config_file_and_key(job: dict, sentence: str) -> None:
    assert error("a\n", None, job) == sentence


def test_the_defaults_source_can_be_named() -> None:
    assert error("a\n", {"port": 0}, defaults_source="~/.invoke.yaml") == (
        "~/.invoke.yaml: launcher.defaults.port: must be a port number from 1 to 65535, got 0 (int)")


# --- telling a hostfile from an inventory --------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "worker-1 slots=8\n", "worker-1\n", "# comment\n\n  worker-1   slots=2  # x\nhosts:\n", "10.0.0.1\n",
    "a slots=eight\n", "a max_slots=2\n", "fe80::1\n", "localhost slots=1",
])
def test_hostfiles(text: str) -> None:
    assert looks_like_hostfile(text)


@pytest.mark.parametrize("text", [
    "hosts: [a]\n", "# an inventory\nhosts:\n  - a\n", "---\nhosts: [a]\n", "- a\n- b\n", "[a, b]\n", "{hosts: [a]}\n",
    "", "\n# only comments\n", "hosts:\n", "defaults: {user: x}\n", "this is bad slots=1\n", "a b\n", "a: b\n",
    "%YAML 1.1\n---\nhosts: [a]\n", "'a'\n",
])
def test_not_hostfiles(text: str) -> None:
    assert not looks_like_hostfile(text)


def test_the_example_inventory_is_not_a_hostfile() -> None:
    path = Path(__file__).resolve().parents[2] / "hosts" / "example.yaml"
    assert not looks_like_hostfile(path.read_text(encoding="utf-8"))


# --- load_hosts ----------------------------------------------------------------------------------------------


def test_load_hosts_reads_a_hostfile(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text("worker-1 slots=4\nworker-2 slots=4\n")
    cluster = load_hosts(path, {"python": "/venv/bin/python"}, {"script": "t.py"})
    assert [(h.name, h.nproc_per_node, h.python) for h in cluster.hosts] == [
        ("worker-1", 4, "/venv/bin/python"), ("worker-2", 4, "/venv/bin/python")]
    assert cluster.source == str(path) and cluster.job == Job("t.py")
    path.write_text("worker-1 slots=4\nworker-2 slots=four\n")
    with pytest.raises(InventoryError) as info:
        load_hosts(path)
    assert str(info.value) == f"{path}:2: 'slots=four' is not slots=N with N a positive integer"


def test_load_hosts_reads_an_inventory_as_load_inventory_does(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("hosts: [a, {name: b, nproc_per_node: 2}]\njob: {script: t.py}\n")
    # an inventory is self-contained: the defaults and job meant for hostfiles are not used
    assert load_hosts(path, {"python": "/elsewhere/python"}, {"script": "other.py"}) == load_inventory(path)
    path.write_text("hosts:\n  - a\n  - name: b\n    port: '22'\n")
    with pytest.raises(InventoryError) as info:
        load_hosts(path)
    assert str(info.value) == f"{path}:4: hosts[1].port: must be a port number from 1 to 65535, got '22' (str)"


def test_load_hosts_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as info:
        load_hosts(tmp_path / "nope")
    assert str(info.value).startswith(f"{tmp_path / 'nope'}: no such file: `inv init --hosts NODE1,NODE2` writes one")
    with pytest.raises(InventoryError, match="cannot read it"):
        load_hosts(tmp_path)


def test_a_huge_slots_count_is_refused_before_exclude_lists_its_gpus(tmp_path: Path) -> None:
    from tests.helpers import inv

    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("a slots=1000000000\nb\n")
    start = time.monotonic()
    result = inv("launch", "--hosts", str(hostfile), "--exclude", "a:0", "--dry-run", timeout=60)
    assert time.monotonic() - start < 30  # not 10**9 indices
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"error: {hostfile}:1: 'slots=1000000000' is more than 1024 (worker processes on one "
                             "node)\n")
