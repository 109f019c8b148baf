"""A container host's probe as it is sent and as it runs (no network, no runtime: a stand-in `docker` here): the
request the doctor and a launch's gate send (launcher/doctor/request.py), the runtime's command line the node
program builds (podman's and docker's: the GPUs, the user, the log driver), its answer for each runtime state, and
`--pull`'s lines and refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher import app
from launcher.app.pulling import NO_IMAGE, pull_images, pull_line
from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster
from launcher.doctor.request import (
    IMAGE_SOURCE,
    PROBE_SOURCE,
    connect_section,
    probe_input,
    probe_request,
    pull_request,
    session_section,
)
from launcher.errors import NodeFailure, UsageError
from launcher.node.common import containers
from launcher.node.probe import image
from launcher.plan.containerplan import start_script
from launcher.settings import Settings
from launcher.transport.channel import Result
from launcher.transport.program import BOOTSTRAP, program_line

IMAGE = "localhost/train:1"
IMAGE_ID = "sha256:" + "ab" * 32
DAEMON_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
STAND_IN = f"""#!/bin/sh
echo "$*" >> "$DOCKER_LOG"
case "$1" in
  image) [ -n "$PRESENT" ] && {{ echo '{IMAGE_ID} "2026-11-20T10:00:00.5Z"'; exit 0; }}
         echo "Error: No such image: $5" >&2; exit 1;;
  info) [ -n "$DAEMON" ] && exit 0; echo "{DAEMON_DOWN}" >&2; exit 1;;
  pull) echo "Error response from daemon: manifest for $2 not found: manifest unknown" >&2; exit 1;;
  run) while [ "$1" != "{IMAGE}" ]; do shift; done; shift; exec "$@";;
esac
"""
"""docker as a node without its daemon has it, or with it: the image there or not; `run` runs the command itself."""


def cluster(workdir: str = "~/project", setup: tuple[str, ...] = (), **container: Any) -> Cluster:
    data = {"defaults": {"python": sys.executable, "workdir": workdir, "nproc_per_node": 1, "setup": list(setup),
                         "container": {"image": IMAGE, **container}},
            "hosts": ["node-0", "node-1"], "rendezvous": {"master_addr": "127.0.0.1", "master_port": 29500},
            "job": {"script": "train.py"}}
    return parse_inventory(yaml.safe_dump(data), "hosts/test.yaml")


def test_a_container_hosts_probe_request_carries_the_image_the_probe_and_every_bound() -> None:
    nodes = cluster(setup=("source /opt/env.sh",), mounts=["/data"])
    connect = connect_section("t0ken", 30.0)
    request = probe_request(nodes, nodes.hosts[1], "all", connect, 30.0)
    assert request["mode"] == "image" and request["timeout_s"] == 30.0
    assert request["container"] == {"image": IMAGE, "runtime": "auto", "mounts": ["/data"], "options": [],
                                    "pull": "missing", "script": start_script(["source /opt/env.sh"])}
    assert request["python_argv"] == [sys.executable, "-S", "-c", BOOTSTRAP]
    assert request["program"] == program_line(PROBE_SOURCE)
    assert request["connect"] == connect and "connect" not in request["probe"]  # the TCP check stays on the host
    assert request["probe"]["mode"] == "probe" and request["probe"]["checks"] == "all"
    assert request["probe"]["python"] == sys.executable and not request["probe"]["is_master"]
    assert probe_input(request).startswith(program_line(IMAGE_SOURCE).encode() + b"\n")
    plain = probe_request(cluster(), cluster().hosts[0], "fast", None, 30.0)
    assert "script" not in plain["container"]  # no setup lines: the probe's python is the container's command
    bare = parse_inventory("hosts: [a]\n", "hosts/bare.yaml")
    assert probe_input(probe_request(bare, bare.hosts[0], "all", None, 9.0)).startswith(
        program_line(PROBE_SOURCE).encode())


def test_a_launchs_gate_asks_the_agent_for_the_same_look_into_the_image() -> None:
    nodes = cluster()
    section = session_section(nodes, nodes.hosts[0], "20261207-120000-abcdef", 20.0)
    assert section["probe"]["mode"] == "image" and "connect" not in section["probe"]
    assert section["probe"]["probe"]["master_port"] == 29500  # what the agent's `tcp` reads, inside the request
    assert section["listen"]["master_port"] == 29500 and section["connect"]["token"].endswith("abcdef")
    assert pull_request(nodes.hosts[0].container, 600.0) == {  # type: ignore[arg-type]
        "mode": "pull", "timeout_s": 600.0, "container": {"image": IMAGE, "runtime": "auto", "mounts": [],
                                                          "options": [], "pull": "missing", "script": 'exec "$@"'}}


def captured_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, program: str, setup: tuple[str, ...] = (),
                 workdir: Path | None = None) -> list[str]:
    """The runtime's command line that probe_inside builds (and the stdin it sends) on a node with NVIDIA's driver,
    as user 1000."""
    (tmp_path / "nvidiactl").touch()
    monkeypatch.setattr(containers, "NVIDIA_DEVICE", str(tmp_path / "nvidiactl"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 1000)
    seen: list[tuple[list[str], bytes]] = []

    def command(argv: list[str], deadline: float, data: bytes | None = None) -> tuple[int, str, str]:
        seen.append((argv, data or b""))
        return 0, json.dumps({"mode": "probe", "python": {"version": "3.11.7"}}) + "\n", ""

    monkeypatch.setattr(image, "command", command)
    nodes = cluster(workdir=str(workdir or tmp_path), setup=setup)
    request = probe_request(nodes, nodes.hosts[0], "fast", None, 30.0)
    answer, failed = image.probe_inside(request, program, 0.0)
    assert failed is None and answer is not None and answer["python"]["version"] == "3.11.7"
    (argv, data), = seen
    assert data.decode() == f"{request['program']}\n{json.dumps(request['probe'])}\n"
    return argv


def test_docker_gets_the_gpus_its_way_runs_as_the_nodes_user_and_has_no_log_driver(monkeypatch, tmp_path) -> None:
    argv = captured_run(monkeypatch, tmp_path, "/usr/bin/docker", setup=("source /opt/env.sh",))
    assert argv[:12] == ["/usr/bin/docker", "run", "--rm", "-i", "--network", "host", "--ipc", "host", "--pid",
                         "host", "--pull", "never"]  # the image inspected, never another pulled meanwhile
    assert argv[12:16] == ["-w", str(tmp_path), "-v", f"{tmp_path}:{tmp_path}"]
    assert argv[argv.index("--gpus") + 1] == "all" and argv[argv.index("--user") + 1] == "1000:1000"
    assert "--log-driver" not in argv and "--name" not in argv and "--label" not in argv  # unnamed, --rm
    assert argv[argv.index(IMAGE):] == [IMAGE, "/bin/sh", "-c", start_script(["source /opt/env.sh"]), "ddpl-setup",
                                        sys.executable, "-S", "-c", BOOTSTRAP]


def test_podman_gets_the_gpus_as_cdi_devices_keeps_its_user_and_passes_output_through(monkeypatch, tmp_path) -> None:
    argv = captured_run(monkeypatch, tmp_path, "/usr/bin/podman")
    assert argv[argv.index("--device") + 1] == "nvidia.com/gpu=all" and "--gpus" not in argv
    assert "--user" not in argv and argv[argv.index("--log-driver") + 1] == "passthrough"
    assert argv[argv.index(IMAGE):] == [IMAGE, sys.executable, "-S", "-c", BOOTSTRAP]  # no setup lines: no shell


def test_a_workdir_the_host_lacks_is_not_mounted_and_the_probe_starts_in_root(monkeypatch, tmp_path) -> None:
    argv = captured_run(monkeypatch, tmp_path, "/usr/bin/podman", workdir=tmp_path / "nowhere")
    assert argv[argv.index("-w") + 1] == "/" and str(tmp_path / "nowhere") not in " ".join(argv[:argv.index(IMAGE)])


def run_node(request: dict[str, Any], tmp_path: Path, **env: str) -> dict[str, Any]:
    """The node program, run as a node runs it (the bootstrap, its stdin), with the stand-in docker on PATH."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    docker = tmp_path / "bin" / "docker"
    docker.write_text(STAND_IN)
    docker.chmod(0o755)
    full = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "DOCKER_LOG": str(tmp_path / "log"),
            **env}
    done = subprocess.run([sys.executable, "-S", "-c", BOOTSTRAP], input=probe_input(request), env=full,
                          capture_output=True, timeout=60, check=True)
    return json.loads(done.stdout)


def test_the_node_program_says_each_state_of_docker_in_its_own_words(tmp_path: Path) -> None:
    nodes = cluster(workdir=str(tmp_path), runtime="docker")
    request = probe_request(nodes, nodes.hosts[0], "fast", None, 30.0)
    down = run_node(request, tmp_path)["container"]
    assert (down["runtime"], down["kind"], down["usable"], down["unusable"]) == (
        str(tmp_path / "bin" / "docker"), "docker", False, DAEMON_DOWN)
    missing = run_node(request, tmp_path, DAEMON="1")["container"]
    assert (missing["usable"], missing["present"]) == (True, False)
    assert missing["missing"] == f"Error: No such image: {IMAGE}"
    ran = run_node(request, tmp_path, DAEMON="1", PRESENT="1")  # the probe itself, run by the stand-in's `run`
    assert ran["container"]["id"] == IMAGE_ID and ran["container"]["created"] == "2026-11-20T10:00:00.5Z"
    assert ran["python"]["executable"] == sys.executable and ran["workdir"] == {"path": str(tmp_path), "exists": True}
    asked = (tmp_path / "log").read_text().splitlines()
    assert asked[:2] == [f"image inspect --format {image.INSPECT_FORMAT} {IMAGE}", "info"]  # info: only on a failure
    pulled = run_node(pull_request(nodes.hosts[0].container, 60.0), tmp_path, DAEMON="1")  # type: ignore[arg-type]
    assert pulled == {"pulled": False, "runtime": str(tmp_path / "bin" / "docker"), "seconds": pulled["seconds"],
                      "error": f"Error response from daemon: manifest for {IMAGE} not found: manifest unknown"}


def test_each_pull_is_one_line_with_its_id_and_time_or_the_runtimes_words() -> None:
    host = cluster().hosts[1]
    said = json.dumps({"pulled": True, "runtime": "/usr/bin/podman", "seconds": 12.34, "id": "1a2b3c4d5e6f7a8b" * 4})
    assert pull_line(host, IMAGE, Result(0, said.encode(), b""), 1800.0) == (
        f"node-1: pulled {IMAGE} (sha256:1a2b3c4d5e6f) in 12.3 s", None)
    why = "Error: initializing source docker://localhost/train:1: pinging container registry localhost: refused"
    failed = json.dumps({"pulled": False, "runtime": "/usr/bin/podman", "seconds": 0.1, "error": why})
    assert pull_line(host, IMAGE, Result(0, failed.encode(), b""), 1800.0) == (f"node-1: pull failed: {why}", why)
    late = Result(-1, b"", b"", timed_out=1830.0)
    assert pull_line(host, IMAGE, late, 1800.0)[0] == "node-1: pull failed: no answer within 1800 s (pull_timeout)"
    gone = NodeFailure("node-1", "refused", "connection refused")
    assert pull_line(host, IMAGE, gone, 1800.0)[0] == "node-1: pull failed: refused: connection refused"
    crashed = Result(127, b"", b"sh: 1: python3: not found\n")
    assert pull_line(host, IMAGE, crashed, 1800.0)[1] == "sh: 1: python3: not found"


def test_pull_needs_an_image_and_goes_with_neither_a_dry_run_nor_slurm(tmp_path: Path) -> None:
    bare = parse_inventory("hosts: [a, b]\n", "hosts/bare.yaml")
    with pytest.raises(UsageError, match="--pull needs a container image"):
        pull_images(bare, Settings(), open(os.devnull, "w"))  # noqa: SIM115 (nothing is written)
    assert NO_IMAGE.endswith("or --image")
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("hosts: [a]\ndefaults: {container: localhost/train:1}\njob: {script: train.py}\n")
    with pytest.raises(UsageError, match=r"--pull does not go with --dry-run"):
        app.launch(str(inventory), dry_run=True, pull=True)
    with pytest.raises(UsageError, match=r"--pull does not go with --slurm or --job"):
        app.doctor(str(inventory), slurm=True, pull=True)
    assert Settings().run.pull_timeout == 1800.0
