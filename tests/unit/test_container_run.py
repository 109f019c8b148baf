"""A run in a container, without a runtime: the inventory's `container:` and its errors, `--image`, what the node's
agent is asked and the words it starts the runtime with, the dry run's lines, and SLURM's pyxis (its flags, and the
refusal where srun has none, from a stand-in srun)."""

from __future__ import annotations

import ast
import os
import shlex
from pathlib import Path

import pytest

from launcher.config.container import with_image
from launcher.config.model import Container
from launcher.errors import LauncherError
from launcher.node.agent.container import BOOT, START, container_argv
from launcher.node.common.containers import run_words
from launcher.plan.containerplan import SETUP_FAILED, start_script
from launcher.plan.dryrun import dry_run_text
from launcher.plan.launchplan import plan_launch
from launcher.plan.request import start_request
from launcher.slurm import pyxis
from launcher.slurm.step import srun_argv
from launcher.transport.program import host_command
from tests.support.inventory import assert_error, parse

INVENTORY = """\
defaults:
  python: /opt/venv/bin/python
  setup: [source /opt/venv/bin/activate]
  container: {image: localhost/train:1, mounts: [/data, "~/cache:/cache:ro"], options: [--shm-size=8g]}
hosts:
  - a
  - {name: b, container: {pull: never, runtime: docker}}
  - {name: c, container: false}
job: {script: train.py}
"""


def test_a_hosts_container_is_merged_over_the_defaults_and_false_runs_it_bare() -> None:
    a, b, c = parse(INVENTORY).hosts
    assert a.container == Container("localhost/train:1", "auto", ("/data", "~/cache:/cache:ro"), ("--shm-size=8g",))
    assert b.container == Container("localhost/train:1", "docker", a.container.mounts, a.container.options, "never")
    assert c.container is None
    assert parse("hosts: [{name: a, container: nvcr.io/nvidia/pytorch:24.05-py3}]").hosts[0].container == Container(
        "nvcr.io/nvidia/pytorch:24.05-py3"
    )


@pytest.mark.parametrize(
    ("text", "entry", "reason"),
    [
        ("defaults: {container: {image: x, options: [--network=bridge]}}\nhosts: [a]", "defaults.container.options[0]",
         "--network is the launcher's: the run uses the node's network"),
        ("defaults: {container: {image: x, options: [-eTOKEN=1]}}\nhosts: [a]", "defaults.container.options[0]",
         "-e is the launcher's: write the variable in the host's env: (a secret's value is never on a command line)"),
        ("hosts: [{name: a, container: {mounts: [/data]}}]", "hosts[0].container",
         "has no `image:` (the image torchrun runs in)"),
        ("hosts: [{name: a, container: {image: x, mounts: [data]}}]", "hosts[0].container.mounts[0]",
         "must name absolute paths (or ~/...), got 'data'"),
        ("hosts: [{name: a, container: {image: x, mounts: ['/a:/b:rx']}}]", "hosts[0].container.mounts[0]",
         "must be PATH, SRC:DEST or SRC:DEST:ro"),
        ("hosts: [{name: a, container: {image: x, runtime: lxc}}]", "hosts[0].container.runtime",
         "must be one of auto, podman, docker, got 'lxc'"),
        ("hosts: [{name: a, container: {image: x, pull: sometimes}}]", "hosts[0].container.pull",
         "must be one of missing, always, never"),
        ("hosts: [{name: a, container: {image: '--privileged'}}]", "hosts[0].container.image",
         "must be an image reference"),
        ("hosts: [{name: a, container: {image: x, imgae: y}}]", "hosts[0].container.imgae",
         "unknown key 'imgae'; did you mean 'image'?"),
        ("defaults: {container: false}\nhosts: [a]", "defaults.container", "false turns a host's container off"),
    ],
)
def test_a_wrong_container_names_its_entry_and_why(text: str, entry: str, reason: str) -> None:
    assert_error(text, entry, reason)


def test_image_gives_every_host_the_image_and_keeps_each_ones_other_settings() -> None:
    cluster = with_image(parse(INVENTORY), "localhost/other:2")
    assert [h.container.image for h in cluster.hosts if h.container] == ["localhost/other:2"] * 3
    assert cluster.hosts[1].container.runtime == "docker" and cluster.hosts[2].container == Container(
        "localhost/other:2"
    )
    with pytest.raises(ValueError, match="--image must be an image reference"):
        with_image(parse(INVENTORY), "-v /:/host")


def test_the_agent_is_asked_for_the_image_and_the_setup_lines_run_in_its_shell() -> None:
    cluster = parse(INVENTORY)
    plan = plan_launch(cluster)
    request = start_request(plan, plan.nodes[0], {})
    assert request["container"] == {
        "image": "localhost/train:1",
        "runtime": "auto",
        "mounts": ["/data", "~/cache:/cache:ro"],
        "options": ["--shm-size=8g"],
        "pull": "missing",
        "script": start_script(("source /opt/venv/bin/activate",)),
    }
    assert "container" not in start_request(plan, plan.nodes[2], {})
    # On a container host the node's own python runs the launcher's programs, with no setup line (the image's).
    assert host_command(cluster.hosts[0]) == host_command(cluster.hosts[2].__class__(
        name="x", addr="x", python="python3", workdir="~", nproc_per_node=1))
    script = start_script(("false",))
    assert script.endswith('exec "$@"') and f"exit {SETUP_FAILED}" in script


def test_the_runtime_starts_one_named_labelled_container_on_the_nodes_network_ipc_and_pids(tmp_path: Path) -> None:
    spec = {"image": "localhost/train:1", "runtime": "podman", "mounts": ["/data", "/data"], "options": ["--x=1"],
            "pull": "never", "script": "exec \"$@\""}
    request = {"container": spec, "workdir": str(tmp_path), "mark": "20261207-1-ab/node-1"}
    argv = container_argv(request, "/runs", "/usr/bin/podman", ["python", "-m", "torch.distributed.run", "x.py"])
    image = argv.index("localhost/train:1")
    flags, inner = argv[:image], argv[image + 1:]
    assert flags[:2] == ["/usr/bin/podman", "run"] and "--rm" in flags and "-i" in flags
    for pair in (["--network", "host"], ["--ipc", "host"], ["--pid", "host"], ["--pull", "never"],
                 ["--name", "ddpl-20261207-1-ab-node-1"], ["--label", "ddpl.run=20261207-1-ab"],
                 ["--label", "ddpl.node=node-1"], ["--env", "DDP_LAUNCHER_RUN=20261207-1-ab/node-1"],
                 ["--log-driver", "passthrough"], ["-w", str(tmp_path)]):
        assert _has(flags, pair), (pair, flags)
    assert [flags[i + 1] for i, w in enumerate(flags) if w == "-v"] == [f"{tmp_path}:{tmp_path}", "/runs:/runs",
                                                                        "/data:/data"]
    assert flags[-1] == "--x=1" and "--sig-proxy=false" in flags
    assert inner[:4] == ["/bin/sh", "-c", 'exec "$@"', "ddpl-setup"]
    assert inner[4:9] == ["python", "-c", BOOT, START, str(tmp_path)] and inner[9:] == ["-m", "torch.distributed.run",
                                                                                       "x.py"]
    ast.parse(START, feature_version=(3, 8))  # the image's python may be as old as the node programs allow
    assert not any("TOKEN" in w for w in argv)


def _has(words: list[str], pair: list[str]) -> bool:
    return any(words[i:i + len(pair)] == pair for i in range(len(words)))


def test_a_probe_container_is_unnamed_and_the_dry_run_says_where_torchrun_runs() -> None:
    probe = run_words("/usr/bin/podman", {"image": "x"}, "/w", ["/w"])
    assert "--name" not in probe and "--rm" in probe and probe[-1] == "x"
    text = dry_run_text(plan_launch(parse(INVENTORY)))
    assert ("in container localhost/train:1 (podman, else docker; pull missing; named ddpl-<run id>-a, removed at "
            "its end)") in text
    assert "mounted at their paths: the workdir, the node's folder of runs, /data, ~/cache:/cache:ro" in text
    assert "more run options: --shm-size=8g" in text and "in container localhost/train:1 (docker; pull never" in text


def test_pyxis_runs_every_task_in_the_image_and_a_cluster_without_it_is_refused(tmp_path: Path) -> None:
    cluster = parse("defaults: {container: {image: localhost/train:1, mounts: [/data]}, workdir: /work}\n"
                    "hosts: [a, b]\njob: {script: train.py}")
    plan = plan_launch(cluster)
    srun = tmp_path / "srun"
    srun.write_text("#!/bin/sh\necho 'Usage: srun [OPTIONS(0)...]'\n")
    srun.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    with pytest.raises(LauncherError, match="this cluster's srun has no --container-image"):
        pyxis.in_image(plan, env)
    srun.write_text("#!/bin/sh\necho '      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH'\n")
    bare, flags = pyxis.in_image(plan, env)
    assert flags == ["--container-image", "localhost/train:1", "--container-mount-home", "--container-mounts",
                     "/work:/work,/data:/data"]
    assert all(c.host.container is None for c in bare.nodes)  # the agent is in the image: it starts torchrun itself
    argv = srun_argv(["a", "b"], "CMD", kill_on_bad_exit=True, job_name="r", container=flags)
    assert argv[argv.index("--container-image"):argv.index("/bin/sh")] == flags
    assert shlex.join(argv).endswith("/bin/sh -c CMD")
    mixed = plan_launch(parse("hosts: [{name: a, container: x}, {name: b, container: y}]\njob: {script: t.py}"))
    with pytest.raises(LauncherError, match="the hosts' container settings differ"):
        pyxis.in_image(mixed, env)
    assert pyxis.in_image(plan_launch(parse("hosts: [a]\njob: {script: t.py}")), env)[1] == []
