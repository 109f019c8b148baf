"""`ddpl init`: the node program that finds a node's python with torch and its GPUs (run here as a node runs it),
the commented inventory written from what the nodes said (a valid one), and never a file written over."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.config.inventory import parse_inventory
from launcher.config.starter import EXAMPLE_LINE, Found, render_inventory
from launcher.errors import LauncherError
from launcher.limits import INIT_PYTHON_WAIT_S, INIT_SMI_WAIT_S
from launcher.transport.program import BOOTSTRAP, node_program, program_input
from tests.helpers import REPO
from tests.support.nodeenv import build_stdlib_env

JOB = {"script": "train.py", "args": []}


def seek(pythons: list[str], python: str = sys.executable) -> dict:
    """launcher/node/probe/seek.py's answer, run by `python` as a node's login python3 runs it."""
    request = {"pythons": pythons, "python_wait_s": INIT_PYTHON_WAIT_S, "smi_wait_s": INIT_SMI_WAIT_S}
    done = subprocess.run([python, "-S", "-c", BOOTSTRAP], input=program_input(node_program("probe.seek"), request),
                          capture_output=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_the_node_program_finds_the_first_python_with_torch(tmp_path: Path) -> None:
    bare = build_stdlib_env(tmp_path / "bare").python  # a venv without torch, first in line
    answer = seek([str(tmp_path / "none" / "bin" / "python"), str(bare), sys.executable, "python3"],
                  python=str(bare))
    assert answer["python"] == sys.executable
    assert [t["python"] for t in answer["tried"]] == [str(bare), sys.executable]  # a missing path is not tried
    assert answer["tried"][0] == {"python": str(bare), "torch": False, "why": "no torch"}
    assert answer["gpus"] == 0 and answer["cpus"] == os.cpu_count()


def test_the_login_python3_is_the_one_running_it(tmp_path: Path) -> None:
    answer = seek(["python3"])
    assert answer["python"] == sys.executable and len(answer["tried"]) == 1


def test_nodes_that_agree_share_the_defaults_and_the_text_is_a_valid_inventory() -> None:
    found = [Found("gpu1", "~/venv/bin/python", 8, 64), Found("gpu2", "~/venv/bin/python", 8, 64)]
    text = render_inventory(found, workdir="~/proj", job=JOB, master_port=29511, ssh_config="~/.ssh/cluster.conf")
    cluster = parse_inventory(text, "hosts/cluster.yaml")
    assert [h.name for h in cluster.hosts] == ["gpu1", "gpu2"]
    assert {(h.python, h.workdir, h.nproc_per_node) for h in cluster.hosts} == {("~/venv/bin/python", "~/proj", 8)}
    assert cluster.rendezvous.master_port == 29511 and cluster.ssh_config == "~/.ssh/cluster.conf"
    assert cluster.job is not None and cluster.job.script == "train.py"
    assert "# nvidia-smi lists 8 GPU(s) on every node" in text
    # A newcomer is pointed at the example to copy, in a comment: the job is the one given.
    assert "job:\n  # a minimal DDP script to start from: examples/ddp_minimal.py in the launcher's repository\n" \
           "  script: train.py\n  args: []\n" in text
    assert cluster.job.args == () and cluster.job == parse_inventory(text.replace(EXAMPLE_LINE, ""), "x.yaml").job
    assert "ddpl launch --sync" in text and "# torchrun: [--numa-binding, socket]" in text


def test_nodes_that_differ_get_their_own_values_and_what_was_not_found_is_said() -> None:
    found = [Found("a", "/opt/conda/bin/python", 4), Found("b", None, 0, 16, ("no interpreter with torch (...)",))]
    text = render_inventory(found, workdir="/a/workdir/long/enough/to/reach/the/comments/column", job=JOB,
                            master_port=29500)
    cluster = parse_inventory(text, "hosts/cluster.yaml")
    assert [(h.python, h.nproc_per_node) for h in cluster.hosts] == [("/opt/conda/bin/python", 4), ("python3", 1)]
    assert "# b: no interpreter with torch (...)" in text
    line = next(x for x in text.splitlines() if x.startswith("  - {name: b"))
    assert line.endswith("# no python with torch was found on b: set it"), line


def test_no_python_found_anywhere_is_written_once_where_setting_it_sets_every_host() -> None:
    """It was `python: python3` on every host and in defaults: setting the default changed nothing."""
    found = [Found("a", None, 0, 2, ("no interpreter with torch",)), Found("b", None, 0, 2)]
    text = render_inventory(found, workdir="~", job=JOB, master_port=29500)
    assert text.count("python:") == 1 and "no python with torch was found on any node: set it" in text
    assert "no GPUs (nvidia-smi): one process a node" in text
    assert {h.python for h in parse_inventory(text, "x.yaml").hosts} == {"python3"}
    edited = parse_inventory(text.replace("python: python3", "python: /v/bin/python"), "x.yaml")
    assert {h.python for h in edited.hosts} == {"/v/bin/python"}


def _init(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found: list[Found],
          image: str | None = None) -> tuple[int, str, Path]:
    """`init` on nodes that said `found` (no SSH): its exit code, its stderr, the inventory's path."""
    from launcher import app
    from launcher.app import newcluster
    from launcher.run.run_io import RunIO

    monkeypatch.setattr(newcluster, "seek", lambda cluster, workdir, settings, image=None: found)
    out, err, output = io.StringIO(), io.StringIO(), tmp_path / "hosts" / "cluster.yaml"
    code = app.init([f.name for f in found], output, workdir="~/p", script="train.py", doctor_too=False,
                    run_io=RunIO(out, err), image=image)
    return code, err.getvalue(), output


def test_init_writes_nothing_when_no_node_has_a_python_with_torch(tmp_path: Path, monkeypatch) -> None:
    """It wrote an inventory of python3s and exited 0: the user found out at the doctor, with a file to delete."""
    found = [Found("a", None, notes=("no interpreter with torch (tried python3: no torch)",)), Found("b", None)]
    with pytest.raises(LauncherError) as info:
        _init(tmp_path, monkeypatch, found)
    assert str(info.value).startswith("no python with torch was found on any node (a: no interpreter with torch "
                                      "(tried python3: no torch); b: no interpreter with torch); nothing was "
                                      "written: give the interpreter that has torch on the nodes (`")
    assert "init --python " in str(info.value)
    assert not (tmp_path / "hosts" / "cluster.yaml").exists()
    code, said, output = _init(tmp_path, monkeypatch, [Found("a", "~/v/bin/python"), Found("b", None)])
    assert code == 1 and output.exists()
    assert said.endswith("no python with torch was found on b: set `python:` for it in "
                         f"{output}, or install torch there\n"), said


def test_init_never_writes_over_a_file_and_needs_hosts(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "hosts").mkdir()
    (tmp_path / "hosts" / "cluster.yaml").write_text("mine\n")
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}

    def ddpl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)

    shown = ddpl("init", "--hosts", "gpu1,gpu2")
    assert shown.returncode == 2 and shown.stderr.startswith(
        "error: hosts/cluster.yaml is there already: `ddpl init` never writes over an inventory"), shown.stderr
    assert (tmp_path / "hosts" / "cluster.yaml").read_text() == "mine\n"
    assert ddpl("init").stderr.startswith("error: --hosts names no node")
    bad = ddpl("init", "--hosts", "a,-oProxyCommand=x", "--output", "other.yaml")
    assert bad.returncode == 1 and "--hosts: hosts[1].name: must be a host name" in bad.stderr
    image = ddpl("init", "--hosts", "a", "--output", "other.yaml", "--image", "-v")
    assert image.returncode == 2 and image.stderr.startswith("error: --image must be an image reference"), image.stderr


@pytest.mark.parametrize("python", ["~/venv/bin/python", "/usr/bin/python3"])
def test_given_python_and_processes_need_no_node(tmp_path: Path, python: str) -> None:
    """--python and --nproc-per-node given: nothing is asked of the nodes, the doctor skipped: the file at once."""
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    shown = subprocess.run([sys.executable, "-m", "launcher", "init", "--hosts", "n1,n2", "--python", python,
                            "--nproc-per-node", "2", "--skip-doctor", "--workdir", "/w"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    cluster = parse_inventory((tmp_path / "hosts" / "cluster.yaml").read_text(), "c.yaml")
    assert {(h.python, h.nproc_per_node, h.workdir) for h in cluster.hosts} == {(python, 2, "/w")}
    assert "next: ddpl launch --dry-run, then ddpl launch --sync" in shown.stdout


def test_init_with_an_image_needs_no_torch_on_the_hosts_and_asks_for_a_runtime(tmp_path: Path, monkeypatch) -> None:
    from launcher.app.newcluster import _found

    found = [_found("a", {"python": None, "runtime": "/usr/bin/podman", "gpus": 8, "cpus": 64}, "nvcr.io/x:1"),
             _found("b", {"python": None, "runtime": None, "gpus": 8, "cpus": 64}, "nvcr.io/x:1")]
    assert found[0].notes == () and found[1].notes == ("no podman or docker on PATH, which runs nvcr.io/x:1 (install "
                                                       "podman there)",)
    code, said, output = _init(tmp_path, monkeypatch, found, image="nvcr.io/x:1")
    assert code == 0 and said.startswith("asking 2 node(s) for their container runtime and their GPUs"), said
    text = output.read_text()
    cluster = parse_inventory(text, "hosts/cluster.yaml")
    assert {(h.python, h.container.image if h.container else None) for h in cluster.hosts} == {("python3",
                                                                                              "nvcr.io/x:1")}
    assert {h.container.host_python for h in cluster.hosts if h.container} == {"python3"}
    assert "# b: no podman or docker on PATH" in text and "launch --pull" in text
    assert "  python: python3                       # the image's python" in text


def test_the_node_program_names_the_runtime_it_would_use_for_init_image() -> None:
    from launcher.node.common.containers import runtime_path

    request = {"pythons": [], "python_wait_s": INIT_PYTHON_WAIT_S, "smi_wait_s": INIT_SMI_WAIT_S,
               "container": {"runtime": "auto"}}
    done = subprocess.run([sys.executable, "-S", "-c", BOOTSTRAP], input=program_input(node_program("probe.seek"),
                          request), capture_output=True, timeout=120, check=True)
    answer = json.loads(done.stdout)
    assert answer["python"] is None and answer["tried"] == [] and answer["runtime"] == runtime_path({})
