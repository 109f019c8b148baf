"""What a user does (#34): install the wheel into a fresh venv without torch, then from their own git project (a
subfolder of it) `ddpl init` a new cluster, `ddpl doctor`, `ddpl launch --sync`, watch a detached run (`top --once
--json`, `stacks`) and stop it; run a module and a command; pass a torchrun option; and the Python API.

One module fixture builds the wheel and the venv once and starts one sandbox of two sshd nodes: the steps run in
order against it (each test is one step; a later one uses what an earlier one left, as the user's session would).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import launcher
from tests.conftest import SandboxFactory, free_port
from tests.helpers import REPO, run_id_of
from tests.support.installed import build_wheel, user_project, user_venv
from tests.support.nodeenv import node_python

NODES = 2


@dataclass
class Session:
    """The user's machine: the venv's bin folder, their project, a home of their own, the nodes and their workdir."""

    bin: Path
    project: Path
    home: Path
    ssh_config: Path
    workdir: Path
    master_port: int

    def env(self) -> dict[str, str]:
        mine = {k: v for k, v in os.environ.items()
                if not k.startswith(("DDPL_", "INVOKE_", "PYTHON", "VIRTUAL_ENV"))}
        return {**mine, "HOME": str(self.home), "PATH": f"{self.bin}:{mine.get('PATH', '')}"}

    def ddpl(self, *args: str, where: str = "src", timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """`ddpl ARGS` as the user types it, in a subfolder of their project."""
        return subprocess.run(["ddpl", *args], cwd=self.project / where, env=self.env(), capture_output=True,
                              text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    root = tmp_path_factory.mktemp("installed")
    wheel = build_wheel(root / "build")
    bin_folder = user_venv(root / "venv", wheel)
    factory = SandboxFactory(root / "nodes")
    # The nodes' logins find the interpreter with torch as `python3` (what `ddpl init` tries first).
    box = factory(NODES, login_rc=f"export PATH={Path(node_python()).parent}:$PATH\n")
    try:
        (root / "home").mkdir()
        yield Session(bin_folder, user_project(root / "project"), root / "home", box.ssh_config, root / "work",
                      free_port())
    finally:
        factory.close()


def test_the_wheel_installs_ddpl_without_torch(user: Session) -> None:
    python = user.bin / "python"
    assert subprocess.run([python, "-c", "import torch"], capture_output=True).returncode != 0
    where = subprocess.run([python, "-c", "import launcher; print(launcher.__file__)"], capture_output=True,
                           text=True, env=user.env(), cwd=user.project).stdout
    assert "site-packages" in where and str(REPO) not in where  # the installed copy, not this checkout
    version = user.ddpl("--version")
    assert version.returncode == 0 and version.stdout.startswith(f"ddpl {launcher.__version__}"), version.stderr
    listed = user.ddpl("--list").stdout
    for name in ("launch", "doctor", "stop", "status", "logs", "stacks", "top", "sync", "init", "slurm.submit"):
        assert f"  {name} " in listed, listed
    assert "sandbox" not in listed and "demo" not in listed  # they need a checkout
    shipped = subprocess.run([python, "-c", "import importlib.util as u; print([n for n in ('devtools', 'bench', "
                              "'tests', 'launcher.sandbox') if u.find_spec(n)])"], capture_output=True, text=True,
                             env=user.env(), cwd=user.bin).stdout
    assert shipped.strip() == "[]", shipped  # the wheel is the product: no sandbox, bench or tests in it
    completion = user.ddpl("--print-completion-script", "bash")
    assert completion.returncode == 0 and "complete -F" in completion.stdout
    module = subprocess.run([python, "-m", "launcher", "--version"], capture_output=True, text=True)
    assert module.stdout.startswith(f"ddpl {launcher.__version__}")


def test_init_writes_the_inventory_from_what_the_nodes_say(user: Session) -> None:
    done = user.ddpl("init", "--hosts", "node-0,node-1", "--ssh-config", str(user.ssh_config), "--workdir",
                     str(user.workdir), "--master-port", str(user.master_port))
    assert done.returncode == 0, done.stderr + done.stdout
    inventory = user.project / "hosts" / "cluster.yaml"  # the project's, though ddpl ran in src/
    data = yaml.safe_load(inventory.read_text())
    assert data["hosts"] == ["node-0", "node-1"]
    assert data["defaults"] == {"python": str(Path(node_python()).parent / "python3"), "workdir": str(user.workdir),
                                "nproc_per_node": 1}  # no GPUs: one process a node
    assert data["job"] == {"script": "train.py", "args": []}
    assert "# a minimal DDP script to start from: examples/ddp_minimal.py" in inventory.read_text()  # a comment only
    assert "train.py is missing on node-0" in done.stdout  # the doctor ran: the code is not there yet
    assert "next: ddpl launch --dry-run, then ddpl launch --sync" in done.stdout
    again = user.ddpl("init", "--hosts", "node-0")
    assert again.returncode == 2 and "is there already" in again.stderr
    example = user.ddpl("init", "--example")  # the reference, shipped in the wheel: the user has no checkout
    assert example.returncode == 0, example.stderr
    assert (user.project / "hosts" / "example.yaml").read_text().startswith("# A reference, not a first copy")
    # The job passes one of torchrun's own options through (it reaches the workers as ROLE_NAME).
    data["job"]["torchrun"] = ["--role", "trainer"]
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))


def test_launch_sync_sends_the_project_and_runs_it(user: Session) -> None:
    done = user.ddpl("launch", "--sync")
    assert done.returncode == 0, done.stderr + done.stdout
    sums = {line.split("sha256=")[1] for line in done.stdout.splitlines() if "CHECKSUM" in line}
    assert len(sums) == 1 and done.stdout.count("CHECKSUM") == NODES
    assert "role=trainer" in done.stdout  # job.torchrun's --role reached torchrun
    synced = {p.relative_to(user.workdir).as_posix() for p in user.workdir.rglob("*") if p.is_file()}
    assert {"train.py", "pkg/train.py", "run.sh", "ddpl.yaml", "src/notes.md"} <= synced
    assert not synced & {"tasks.py", "pyproject.toml", "invoke.yaml", "launcher/__init__.py"}  # not the launcher's
    assert os.access(user.workdir / "run.sh", os.X_OK)
    assert (user.project / "logs" / run_id_of(done.stderr)).is_dir()  # the project's log_dir, not src/'s
    again = user.ddpl("launch", "--sync", "--args=--steps 1")  # the first run's logs are in the project now
    assert again.returncode == 0, again.stderr + again.stdout
    assert "left out logs/: the launcher's own output" in again.stderr
    assert not (user.workdir / "logs").exists()  # the launcher's own outputs never travel, ignored or not
    assert user.ddpl("doctor").returncode == 0


def test_a_detached_run_is_watched_and_stopped(user: Session) -> None:
    started = user.ddpl("launch", "--detach", "--skip-doctor", "--args=--steps 100000")
    assert started.returncode == 0, started.stderr
    run_id = run_id_of(started.stderr)
    assert "ddpl status" in started.stderr  # the hint names the command in use
    deadline = time.monotonic() + 60
    while True:  # its workers start a moment after the launch returns
        look = user.ddpl("top", "--once", "--json")
        assert look.returncode == 0, look.stderr
        snapshot = json.loads(look.stdout)
        if len(snapshot["ranks"]) == NODES or time.monotonic() > deadline:
            break
    assert snapshot["run"] == run_id and sorted(r["rank"] for r in snapshot["ranks"]) == [0, 1]
    stacks = user.ddpl("stacks")
    assert stacks.returncode == 0 and f"run {run_id}: " in stacks.stdout, stacks.stderr + stacks.stdout
    stopped = user.ddpl("stop")
    assert stopped.returncode == 0 and f"stop run {run_id}" in stopped.stdout, stopped.stderr + stopped.stdout
    status = user.ddpl("status", "--run", run_id)
    assert "running" not in status.stdout.split("\n", 1)[1]


def test_a_module_and_a_command_run(user: Session) -> None:
    module = user.ddpl("launch", "--skip-doctor", "--module", "pkg.train")
    assert module.returncode == 0, module.stderr
    assert "module __main__ rank 0 role=trainer" in module.stdout and "module __main__ rank 1" in module.stdout
    command = user.ddpl("launch", "--skip-doctor", "--command", "./run.sh", "--args", "a 'b c'")
    assert command.returncode == 0, command.stderr
    assert "command rank 1 of 2: a b c" in command.stdout


def test_the_api_runs_attached_then_detached_and_leaves_nothing_behind(user: Session) -> None:
    done = subprocess.run([user.bin / "python", "api_script.py"], cwd=user.project, env=user.env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["nodes"] == ["exited", "exited"] and report["sums"] == 1, report
    assert report["logs"] == f"logs/{report['run_id']}"
    assert report["interrupted"] and "running" not in report["after_interrupt"], report
    assert report["top_ranks"] == [0, 1] and set(report["stop"]) == {"stopped"} and "running" not in report["wait"]
    # Run.report(): the run's page (#49), with the charts the README shows, from a plain install (#69)
    assert report["page"] == [True, "report.html", True, True, True, True], report
    assert report["clean_after_first"] and report["clean_after_interrupt"] and report["clean_at_end"], report["left"]
