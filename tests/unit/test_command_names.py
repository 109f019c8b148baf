"""Every message names the command the user typed (`ddpl`, `inv`, or the API's call) and files they have: the
installed command once said `inv doctor`, `inv status` and hosts/example.yaml, which a pip user does not have."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher import api
from launcher.config.inventory import parse_inventory
from launcher.doctor.collect import DoctorGate
from launcher.errors import InventoryError
from launcher.paths import API, called_as, command_name, detached_hint, hint
from tests.helpers import REPO, inv


def _ddpl(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("DDPL_", "INVOKE_"))},
           "HOME": str(cwd), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_missing_inventory_names_the_command_typed_and_how_to_get_one(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    shown = _ddpl(tmp_path, "launch")
    assert shown.returncode == 1
    assert shown.stderr.strip() == ("error: hosts/cluster.yaml: no such file: `ddpl init --hosts NODE1,NODE2` writes "
                                    "one from what your nodes say over SSH, `ddpl init --example` the reference "
                                    "(every key, what it does, its default)")
    checkout = inv("doctor", "--hosts", "hosts/no-such.yaml", timeout=60)
    assert "`inv init --hosts NODE1,NODE2` writes one" in checkout.stderr and "ddpl" not in checkout.stderr
    with pytest.raises(InventoryError, match="`ddpl init --example`"):  # the API has no init: the installed command
        api.doctor(tmp_path / "nope.yaml")


def test_init_example_writes_the_reference_a_pip_user_lacks(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "src").mkdir()
    shown = _ddpl(tmp_path / "src", "init", "--example")
    assert shown.returncode == 0, shown.stderr
    written = tmp_path / "hosts" / "example.yaml"  # the project's, from a subfolder too
    assert written.read_text() == (REPO / "hosts" / "example.yaml").read_text()
    assert shown.stdout.startswith(f"wrote {written}: every key of an inventory")
    again = _ddpl(tmp_path, "init", "--example")
    assert again.returncode == 2 and "hosts/example.yaml is there already" in again.stderr
    assert _ddpl(tmp_path, "init", "--example", "--hosts", "a").stderr.startswith("error: --hosts does not apply")


def test_the_start_gate_points_to_the_doctor_of_the_caller() -> None:
    cluster = parse_inventory(yaml.safe_dump({"hosts": ["a"], "defaults": {"python": "p", "workdir": "w"}}),
                              "hosts/c.yaml")
    with called_as("ddpl"):
        assert DoctorGate().more(cluster) == "the full report: `ddpl doctor --hosts hosts/c.yaml`"
    with called_as("inv"):
        assert DoctorGate().more(cluster) == "the full report: `inv doctor --hosts hosts/c.yaml`"
    with called_as(API):
        assert DoctorGate().more(cluster) == "the full report: `api.doctor('hosts/c.yaml')`"
        assert command_name() == "ddpl" and hint("init") == "ddpl init"  # no call of its own: the installed command
    assert DoctorGate(full_report=False).more(cluster) is None  # under SLURM


def test_a_detached_run_says_what_works_on_it_in_the_callers_words() -> None:
    with called_as("ddpl"):
        said = detached_hint("hosts/c.yaml")
    assert said == ("`ddpl status --hosts hosts/c.yaml`, `ddpl logs --hosts hosts/c.yaml --follow` and "
                    "`ddpl stop --hosts hosts/c.yaml` work on it")
    with called_as(API):
        assert "the Run handle api.launch returned" in detached_hint("hosts/c.yaml")


def test_the_task_layer_takes_the_name_from_invokes_config() -> None:
    """`inv` (Invoke's config, prefix `invoke`) and `ddpl` (its own config) each get their name in every message."""
    from invoke import Config, Context

    from launcher import taskkit
    from launcher.cliconfig import DdplConfig

    seen = []

    @taskkit.reported
    def body(c: Context) -> int:
        seen.append(command_name())
        return 0

    body(Context(Config()))
    body(Context(DdplConfig(lazy=True)))
    assert seen == ["inv", "ddpl"]


def test_a_hint_names_the_task_as_the_collection_the_user_added_it_under() -> None:
    """A project's tasks.py adds the launcher's as `ddp` (the README's snippet): `inv ddp.launch`'s hints say
    `inv ddp.doctor`, never `inv doctor` (`No idea what 'doctor' is!` there)."""
    from launcher.paths import task_prefix

    assert task_prefix("launch", ["inv", "ddp.launch", "--script", "launch"]) == "ddp."
    assert task_prefix("slurm.submit", ["inv", "-e", "ddp.slurm.submit"]) == "ddp."
    assert task_prefix("slurm.submit", ["inv", "slurm.submit"]) == ""
    assert task_prefix("launch", ["/usr/bin/ddpl", "launch", "--args", "x.launch"]) == ""
    assert task_prefix("launch", ["inv", "train.tools.ddp.launch"]) == "train.tools.ddp."
    with called_as("inv", "ddp."):
        assert hint("doctor --hosts h.yaml") == "inv ddp.doctor --hosts h.yaml"
        assert "`inv ddp.status --hosts h.yaml`" in detached_hint("h.yaml")
    with called_as("ddpl"):
        assert hint("doctor") == "ddpl doctor"


def test_a_projects_tasks_py_gets_its_collections_names_in_every_hint(tmp_path: Path) -> None:
    """The README's tasks.py, run by a project's `inv`: a missing inventory's hint names `inv ddp.init`."""
    readme = (REPO / "docs" / "usage.md").read_text()  # the README points there
    (block,) = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:] if "add_collection(ddp" in b]
    (tmp_path / "tasks.py").write_text(block)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}, "PYTHONPATH": str(REPO)}
    said = subprocess.run([sys.executable, "-m", "invoke", "ddp.doctor", "--hosts", "nope.yaml"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert said.returncode == 1, said.stderr
    assert "`inv ddp.init --hosts NODE1,NODE2` writes one" in said.stderr, said.stderr
    assert "`inv ddp.init --example`" in said.stderr
