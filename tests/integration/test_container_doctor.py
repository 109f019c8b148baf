"""The doctor on container hosts (`container:`), on real sshd nodes with a real runtime (podman as root here, each node
its own storage): it checks the image, not the host. The same image on every node passes and is shown by its id; a
node whose image differs under the same tag is named with both ids and how far apart they were built, and a launch
refuses it before anything starts; a runtime that is not there, or that this user cannot use (docker without its
daemon, as on this machine), is said with its fix; `--pull` pulls on every node at once, from a registry served here,
and a pull that fails says the runtime's own words and starts nothing. No probe here imports torch."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devtools import podman as pm
from devtools.observe import free_port
from launcher.doctor.checks_image import short_id
from tests.helpers import inv, runs_on
from tests.support import containers as ct
from tests.support.nodeenv import node_python
from tests.support.registry import Registry

pytestmark = pytest.mark.integration

WHY_NOT = pm.unavailable()
if WHY_NOT is not None:
    pytest.skip(WHY_NOT, allow_module_level=True)

DAY_S = 86400


@pytest.fixture
def roots() -> Iterator[tuple[Path, list[ct.ContainerNodes]]]:
    """Where the nodes' podman roots go, and the container nodes a test makes; the roots discarded at its end, pass or
    fail. A short folder: with a storage root of 48 characters or more, podman 4.3 ends every `podman run` 20 s late
    here (its conmon timeout; a 46-character root: 0.15 s), and pytest's tmp_path is longer."""
    folder = Path(tempfile.mkdtemp(prefix="ddpl-cd-", dir="/tmp"))
    made: list[ct.ContainerNodes] = []
    try:
        yield folder, made
    finally:
        for nodes in made:
            ct.discard(nodes)
        shutil.rmtree(folder, ignore_errors=True)


def make(roots: tuple[Path, list[ct.ContainerNodes]], make_sandbox, **kwargs) -> ct.ContainerNodes:
    folder, made = roots
    nodes = ct.container_nodes(make_sandbox, folder, torchrun="stand-in", master_port=free_port(), **kwargs)
    made.append(nodes)
    return nodes


def doctor(inventory: Path, *args: str) -> tuple[int, dict, str]:
    """`inv doctor --fast --json`: its exit code, its report, its stderr."""
    done = inv("doctor", "--hosts", str(inventory), "--fast", "--json", *args, timeout=240)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


def image_findings(report: dict) -> dict[str, dict]:
    return {f["host"]: f for f in report["findings"] if f["check"] == "image"}


def test_the_same_image_on_every_node_passes_and_the_table_shows_its_id(roots, make_sandbox, tmp_path) -> None:
    nodes = make(roots, make_sandbox)
    _, image_id = ct.shared_image()
    done = inv("doctor", "--hosts", str(nodes.sandbox.inventory), timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"✓ node-0 image: {ct.TAG} {short_id(image_id)}, built 2001-09-09 01:46 UTC, the same on every node " \
           "(podman)" in done.stdout, done.stdout
    # The versions are the image's python's, read inside it (here the node venv, mounted at its own path).
    code, report, _ = doctor(nodes.sandbox.inventory)
    assert code == 0, report
    for node in ("node-0", "node-1"):
        probe = report["nodes"][node]["probe"]
        assert probe["container"]["id"] == image_id and probe["container"]["kind"] == "podman"
        assert probe["python"]["executable"].startswith(str(Path(node_python()).parents[1]))
        assert probe["tcp"]["ok"]  # the TCP check, made on the host
    assert nodes.left() == {}  # the probes' containers went with their ends (--rm)
    # A launch's start gate runs the same checks in the image, and they pass (what the run then does in its
    # container is tests/integration/test_containers.py's; nothing of it is left here either way).
    launched = inv("launch", "--hosts", str(nodes.sandbox.inventory), "--command", "/bin/true",
                   log_dir=tmp_path / "logs", timeout=240)
    assert re.search(r"checked 10 things on 2 node\(s\) in [\d.]+s: ssh, image, python, .* all passed",
                     launched.stderr), launched.stderr
    assert nodes.left() == {}


def test_a_node_whose_image_differs_is_named_and_a_launch_refuses_it(roots, make_sandbox, tmp_path) -> None:
    nodes = make(roots, make_sandbox, differing={1: "other"})
    _, image_id = ct.shared_image()
    other = pm.image_id(ct.TAG, nodes.envs[1])
    code, report, _ = doctor(nodes.sandbox.inventory)
    found = image_findings(report)
    assert code == 1 and found["node-0"]["status"] == "ok"
    assert found["node-1"]["detail"] == (f"node-1 has {ct.TAG} = {short_id(other)}, built at the same second as the "
                                         f"others' {short_id(image_id)}")
    assert "launch --pull" in found["node-1"]["fix"]

    before = set(runs_on(nodes.sandbox))
    launched = inv("launch", "--hosts", str(nodes.sandbox.inventory), "--script", "train/ddp.py",
                   log_dir=tmp_path / "logs", timeout=240)
    assert "the doctor found 1 problem(s); nothing was started" in launched.stderr, launched.stderr
    assert launched.returncode == 1, launched.stdout + launched.stderr
    assert f"node-1 has {ct.TAG} = {short_id(other)}" in launched.stderr, launched.stderr
    assert set(runs_on(nodes.sandbox)) == before  # nothing started anywhere
    assert nodes.left() == {}  # the containers held before `go` were removed

    # The same tag built three days before the others': said in days.
    older = pm.rootfs_tar(tmp_path / "older.tar", marker="older")
    os.utime(older, (pm.IMAGE_MTIME - 3 * DAY_S, pm.IMAGE_MTIME - 3 * DAY_S))
    pm.podman(nodes.envs[1], "import", "--quiet", str(older), ct.TAG)
    older_id = pm.image_id(ct.TAG, nodes.envs[1])
    _, report, _ = doctor(nodes.sandbox.inventory)
    assert image_findings(report)["node-1"]["detail"] == (
        f"node-1 has {ct.TAG} = {short_id(older_id)}, built 3 days before the others' {short_id(image_id)}")


def test_a_runtime_that_is_not_there_or_not_usable_is_said_with_its_fix(roots, make_sandbox, tmp_path) -> None:
    nodes = make(roots, make_sandbox)
    # node-1's logins find no runtime at all: its own python runs with a PATH of an empty folder.
    (tmp_path / "empty").mkdir()
    narrow = tmp_path / "narrow-python"
    narrow.write_text(f'#!/bin/sh\nPATH={tmp_path / "empty"} exec {node_python()} "$@"\n')
    narrow.chmod(0o755)
    data = yaml.safe_load(nodes.sandbox.inventory.read_text())
    data["hosts"] = [{"name": "node-0", "container": {"runtime": "docker"}},
                     {"name": "node-1", "container": {"runtime": "docker", "host_python": str(narrow)}}]
    nodes.sandbox.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    code, report, _ = doctor(nodes.sandbox.inventory)
    found = image_findings(report)
    assert code == 1
    assert found["node-1"]["detail"] == "node-1: no docker on PATH"
    assert found["node-1"]["fix"].startswith("install docker on node-1")
    docker = shutil.which("docker")
    working = docker is not None and subprocess.run([docker, "info"], capture_output=True).returncode == 0
    if docker is None:
        assert found["node-0"]["detail"] == "node-0: no docker on PATH"
    elif not working:  # this machine: docker's client, no daemon
        assert found["node-0"]["detail"].startswith("docker is not usable by this user on node-0: ")
        assert re.search(r"Cannot connect to the Docker daemon|permission denied", found["node-0"]["detail"]), found
        assert "docker's daemon" in found["node-0"]["fix"] or "docker group" in found["node-0"]["fix"]
    else:
        assert found["node-0"]["detail"].startswith(f"{ct.TAG} is not on node-0 (docker: ")
    # The host's own checks still ran (its port and TCP check); the image's python had nothing to say.
    assert {f["check"] for f in report["findings"] if f["host"] == "node-0"} >= {"ssh", "image", "port", "tcp"}
    assert not any(f["check"] in ("python", "torch") for f in report["findings"])


def test_pull_pulls_on_every_node_and_a_failed_pull_starts_nothing(roots, make_sandbox, tmp_path) -> None:
    shared, image_id = ct.shared_image()
    registry = Registry(tmp_path / "registry")
    try:
        served = registry.add(ct.TAG, pm.podman_env(shared / "root"), "ddpl/train", "1")
        conf = registry.registries_conf(tmp_path / "registries.conf")
        nodes = make(roots, make_sandbox, container={"image": served},
                     session_env={"CONTAINERS_REGISTRIES_CONF": str(conf)})
        inventory = str(nodes.sandbox.inventory)
        code, report, said = doctor(nodes.sandbox.inventory)  # not pulled yet
        assert code == 1 and "launch --pull" in image_findings(report)["node-0"]["fix"]
        code, report, said = doctor(nodes.sandbox.inventory, "--pull")
        assert code == 0, said
        for node in ("node-0", "node-1"):
            assert re.search(rf"^{node}: pulled {re.escape(served)} \({short_id(image_id)}\) in \d+\.\d s$", said,
                             re.M), said
        assert {f["status"] for f in image_findings(report).values()} == {"ok"}

        missing = f"{registry.address}/ddpl/train:absent"
        before = set(runs_on(nodes.sandbox))
        launched = inv("launch", "--hosts", inventory, "--image", missing, "--pull", "--script", "train/ddp.py",
                       log_dir=tmp_path / "logs", timeout=240)
        assert launched.returncode == 1, launched.stdout + launched.stderr
        for node in ("node-0", "node-1"):
            line = next(x for x in launched.stderr.splitlines() if x.startswith(f"{node}: pull failed: "))
            assert "manifest unknown" in line, launched.stderr
        assert launched.stderr.strip().splitlines()[-1] == (
            "error: the image could not be pulled on node-0, node-1 (the node's line above says why): nothing was "
            "started"), launched.stderr
        assert set(runs_on(nodes.sandbox)) == before and nodes.left() == {}
    finally:
        registry.close()
