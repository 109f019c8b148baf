"""The container operations the launcher's `container:` runs will use, on this machine's podman (Debian's, with
runc): a test image built here with no registry, a secret that no command line and no `podman inspect` shows, the
same image id from the same files in every storage root, and a run's containers found and removed by label with
nothing of them left (torch inside on the host's network: the launches of tests/integration/test_containers.py).
docs/containers-findings.md says why each is done so; devtools/podman.py holds the how."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools import podman as pm
from devtools.observe import pids_with_env

pytestmark = pytest.mark.integration

WHY_NOT = pm.unavailable()
if WHY_NOT is not None:
    pytest.skip(WHY_NOT, allow_module_level=True)

TAG = "localhost/ddpl-test:1"


@dataclass
class Lab:
    root: Path
    env: dict[str, str]
    image: str


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    root = tmp_path_factory.mktemp("podman") / "root"
    try:
        image = pm.build_test_image(TAG, root)
        yield Lab(root, pm.podman_env(root), image)
    finally:
        pm.discard_root(root)


def start(lab: Lab, run: str, node: str, argv: list[str], *options: str, stdin_env: bool = False,
          ) -> subprocess.Popen[str]:
    """The node's container as the agent starts it: the podman client its child, output on its pipes."""
    args = pm.run_argv(TAG, run, node, argv, [*options, *pm.interpreter_mounts()], stdin_env=stdin_env)
    return subprocess.Popen(["podman", *args], env=lab.env, text=True, stdin=subprocess.PIPE if stdin_env else None,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_the_same_files_make_the_same_image_in_every_root_and_another_image_shadows_the_tag(
        lab: Lab, tmp_path: Path) -> None:
    again, other = tmp_path / "again", tmp_path / "other"
    try:
        assert pm.build_test_image(TAG, again) == lab.image
        # A node reading the shared store, with an image of its own under the same tag: its own is the one it runs.
        shadow = pm.build_test_image(TAG, other, marker="other", image_stores=[lab.root / "graph"])
        assert shadow != lab.image
        assert pm.image_id(TAG, pm.podman_env(other, [lab.root / "graph"])) == shadow
    finally:
        pm.discard_root(again)
        pm.discard_root(other)


def test_a_secret_given_on_stdin_is_in_no_command_line_and_no_inspect(lab: Lab) -> None:
    run, value = uuid.uuid4().hex[:12], "tok-" + uuid.uuid4().hex
    proc = start(lab, run, "n0", ["/bin/sh", "-c", 'echo "got=$TOKEN"; sleep 20'], stdin_env=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"TOKEN": value}))
        proc.stdin.close()
        assert proc.stdout.readline().strip() == f"got={value}"
        inspect = pm.podman(lab.env, "inspect", pm.container_name(run, "n0")).stdout
        assert f"DDP_LAUNCHER_RUN={run}/n0" in inspect and value not in inspect
        assert not [line for line in _command_lines() if value.encode() in line]
    finally:
        removed = pm.remove_by_label(f"{pm.RUN_LABEL}={run}", lab.env)
        proc.wait(timeout=pm.TIMEOUT_S)
    assert removed == [pm.container_name(run, "n0")]


def _command_lines() -> list[bytes]:
    """Every process's command line on this machine (what `ps` shows)."""
    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):  # ended meanwhile
            lines.append(Path(f"/proc/{pid}/cmdline").read_bytes())
    return lines


def test_a_run_is_found_and_removed_by_label_after_its_clients_died(lab: Lab) -> None:
    ours, theirs = uuid.uuid4().hex[:12], uuid.uuid4().hex[:12]
    deaf = ["/bin/sh", "-c", 'trap "" TERM; sleep 60 & wait']  # only a KILL ends it
    procs = [start(lab, run, node, deaf) for run, node in ((ours, "n0"), (ours, "n1"), (theirs, "n0"))]
    try:
        # Started (a client killed between the runtime's create and start is remove_by_label's other case).
        _wait_for(lambda: len(pids_with_env(f"DDP_LAUNCHER_RUN={ours}/".encode())) == 4
                  and len(pids_with_env(f"DDP_LAUNCHER_RUN={theirs}/".encode())) == 2)
        for proc in procs:  # a podman client that dies does not stop its container
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        assert pm.containers_by_label(f"{pm.RUN_LABEL}={ours}", lab.env) == [
            pm.container_name(ours, "n0"), pm.container_name(ours, "n1")]
        assert pm.containers_by_label([f"{pm.RUN_LABEL}={ours}", f"{pm.NODE_LABEL}=n1"], lab.env) == [
            pm.container_name(ours, "n1")]
        assert len(pids_with_env(f"DDP_LAUNCHER_RUN={ours}/".encode())) == 4
        began = time.monotonic()
        assert len(pm.remove_by_label(f"{pm.RUN_LABEL}={ours}", lab.env, grace=1)) == 2
        assert time.monotonic() - began < 8
        assert pids_with_env(f"DDP_LAUNCHER_RUN={ours}/".encode()) == []
        assert pm.containers_by_label(f"{pm.RUN_LABEL}={ours}", lab.env) == []
        assert pm.containers_by_label(f"{pm.RUN_LABEL}={theirs}", lab.env) == [pm.container_name(theirs, "n0")]
    finally:
        pm.remove_by_label(pm.RUN_LABEL, lab.env)
    assert pids_with_env(f"DDP_LAUNCHER_RUN={theirs}/".encode()) == []


def _wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
