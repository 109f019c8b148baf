"""The doctor's `image` check on container hosts, from evidence alone (no runtime, no network): the node's runtime,
the image there, the probe inside it, the GPUs it sees, and the same image on every node; and how the other checks
read a container host's answer."""

from __future__ import annotations

from typing import Any

import yaml

from launcher import doctor
from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster
from launcher.doctor import ProbeFailed
from launcher.doctor.checks_image import apart, created_at, short_id
from launcher.plan.containerplan import SETUP_FAILED, SETUP_MESSAGE
from tests.support.canned_probes import ADDRS, evidence, findings, only, probe

IMAGE = "localhost/train:latest"
MAJOR = "9f8e7d6c5b4a" + "0" * 52
OTHER = "sha256:1a2b3c4d5e6f" + "1" * 52


def cluster(**container: Any) -> Cluster:
    """The three canned nodes, each running the job in IMAGE (`container:` in defaults, `container` more keys)."""
    data = {"defaults": {"python": "/opt/venv/bin/python", "workdir": "~/project", "nproc_per_node": 1,
                         "container": {"image": IMAGE, **container}},
            "hosts": list(ADDRS), "rendezvous": {"master_addr": "node-0", "master_port": 29500},
            "job": {"script": "train.py"}}
    return parse_inventory(yaml.safe_dump(data), "hosts/test.yaml")


def facts(**over: Any) -> dict[str, Any]:
    """A container host's `container` part, as launcher/node/probe/image.py says it of a healthy node."""
    return {"image": IMAGE, "wanted": "podman or docker", "runtime": "/usr/bin/podman", "nvidia_device": False,
            "kind": "podman", "usable": True, "present": True, "id": MAJOR, "created": "2026-11-20T10:00:00Z",
            "probe_s": 0.4, **over}


def answer(host: str, **over: Any) -> dict[str, Any]:
    """The probe's answer from inside the image, with the host's `container` part."""
    return {**probe(host), "container": facts(**over)}


def bare(host: str, **over: Any) -> dict[str, Any]:
    """A container host's answer when nothing ran inside its image: the host's facts alone."""
    tcp = probe(host)["tcp"]
    return {"mode": "probe", "container": facts(**over), "tcp": tcp, "elapsed": 0.1, "time": 1000.5}


def container_evidence(**outcomes: Any) -> Any:
    healthy = {name.replace("-", "_"): answer(name) for name in ADDRS}
    return evidence(cluster(), **{**healthy, **outcomes})


def test_the_same_image_everywhere_is_ok_and_shown_once_by_its_id() -> None:
    ev = container_evidence()
    found = findings(ev, "image")
    assert [(f.host, f.status) for f in found] == [(h, "ok") for h in ADDRS]
    assert found[0].detail == (f"{IMAGE} sha256:9f8e7d6c5b4a, built 2026-11-20 10:00 UTC, the same on every node "
                               "(podman)")
    assert [f.note for f in found] == [True, False, False]  # under the table once
    assert doctor.selected_checks("fast", ev.cluster)[:3] == ("ssh", "image", "python")
    assert {f.check for f in doctor.evaluate(ev) if f.status != "ok"} == set()


def test_a_node_whose_image_differs_is_named_with_both_ids_and_how_far_apart_they_were_built() -> None:
    ev = container_evidence(node_2=answer("node-2", id=OTHER, created="2026-11-17T09:30:00Z"))
    differs = only(ev, "image", "node-2")
    assert differs.status == "fail"
    assert differs.detail == (f"node-2 has {IMAGE} = sha256:1a2b3c4d5e6f, built 3 days before the others' "
                              "sha256:9f8e7d6c5b4a")
    assert "launch --pull" in differs.fix and "podman load` on node-2" in differs.fix
    assert only(ev, "image", "node-0").status == "ok" and only(ev, "image", "node-1").status == "ok"
    later = container_evidence(node_1=answer("node-1", id=OTHER, created="2026-11-20T12:00:00.123456789+00:00"))
    assert only(later, "image", "node-1").detail.endswith("built 2 hours after the others' sha256:9f8e7d6c5b4a")
    unknown = container_evidence(node_1=answer("node-1", id=OTHER, created=None))
    assert only(unknown, "image", "node-1").detail.endswith(", not the others' sha256:9f8e7d6c5b4a")


def test_a_node_without_a_runtime_is_told_to_install_one() -> None:
    ev = container_evidence(node_1=bare("node-1", runtime=None, kind=None))
    found = only(ev, "image", "node-1")
    assert (found.status, found.detail) == ("fail", "node-1: no podman or docker on PATH")
    assert found.fix.startswith("install podman or docker on node-1") and "container.runtime" not in found.fix
    docker = container_evidence(node_1=bare("node-1", runtime=None, wanted="docker"))
    assert only(docker, "image", "node-1").detail == "node-1: no docker on PATH"
    assert only(docker, "image", "node-1").fix.endswith("or set container.runtime: auto")


def test_a_runtime_the_user_cannot_use_is_said_in_its_own_words() -> None:
    daemon = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    ev = container_evidence(node_0=bare("node-0", runtime="/usr/local/bin/docker", kind="docker", usable=False,
                                        unusable=daemon))
    found = only(ev, "image", "node-0")
    assert found.detail == f"docker is not usable by this user on node-0: {daemon}"
    assert "sudo systemctl start docker" in found.fix
    denied = "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock"
    ev = container_evidence(node_0=bare("node-0", kind="docker", usable=False, unusable=denied))
    assert "usermod -aG docker" in only(ev, "image", "node-0").fix
    rootless = 'command required for rootless mode with multiple IDs: exec: "newuidmap": executable file not found'
    ev = container_evidence(node_0=bare("node-0", usable=False, unusable=rootless))
    assert "uidmap" in only(ev, "image", "node-0").fix and "/etc/subuid" in only(ev, "image", "node-0").fix
    # The host's own checks still speak for the node; the image's python had nothing to say.
    assert only(ev, "tcp", "node-0").status == "ok" and only(ev, "port", "node-0").status == "ok"
    assert findings(ev, "python", "node-0") == [] and findings(ev, "torch", "node-0") == []


def test_an_image_that_is_not_there_points_at_pull() -> None:
    missing = "Error: inspecting object: localhost/train:latest: image not known"
    ev = container_evidence(node_1=bare("node-1", present=False, missing=missing, id=None))
    found = only(ev, "image", "node-1")
    assert found.detail == f"{IMAGE} is not on node-1 (podman: {missing})"
    assert "launch --pull" in found.fix and "doctor --pull" in found.fix
    assert f"podman pull {IMAGE}` on node-1" in found.fix


def failed(exit_code: int, stderr: str) -> dict[str, Any]:
    return {"exit_code": exit_code, "stderr": stderr, "stdout": ""}


def test_a_probe_that_could_not_run_inside_says_why() -> None:
    cdi = "Error: setting up CDI devices: unresolvable CDI devices nvidia.com/gpu=all"
    ev = container_evidence(node_1=bare("node-1", nvidia_device=True, cdi=[], probe_failed=failed(126, cdi)))
    found = only(ev, "image", "node-1")
    assert found.detail == f"podman cannot give node-1's GPUs to {IMAGE}: {cdi}"
    assert "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in found.fix
    toolkit = 'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].'
    ev = container_evidence(node_1=bare("node-1", kind="docker", probe_failed=failed(125, toolkit)))
    assert "NVIDIA Container Toolkit" in only(ev, "image", "node-1").fix
    setup = SETUP_MESSAGE.replace("%s", "{}").format(1, 1, 1, "source /opt/env.sh")
    ev = container_evidence(node_1=bare("node-1", probe_failed=failed(SETUP_FAILED, setup)))
    assert only(ev, "image", "node-1").detail == setup and "image's shell" in only(ev, "image", "node-1").fix
    runc = ('runc create failed: unable to start container process: exec: "/opt/venv/bin/python": stat '
            "/opt/venv/bin/python: no such file or directory\nError: container create failed (no logs from conmon)")
    ev = container_evidence(node_1=bare("node-1", probe_failed=failed(126, runc)))
    found = only(ev, "image", "node-1")
    assert found.detail == f"python /opt/venv/bin/python cannot run in {IMAGE} on node-1: {runc.splitlines()[0]}"
    assert f"`podman run --rm {IMAGE} which python3`" in found.fix
    ev = container_evidence(node_1=bare("node-1", probe_failed=failed(-1, "podman run did not end within 10 s")))
    assert "--probe-timeout" in only(ev, "image", "node-1").fix
    ev = container_evidence(node_1=bare("node-1", probe_failed=failed(125, "Error: statfs /data: no such file")))
    assert only(ev, "image", "node-1").detail == (f"the probe could not run in {IMAGE} on node-1 (exit 125): "
                                                  "Error: statfs /data: no such file")
    assert "container.mounts" in only(ev, "image", "node-1").fix


def test_gpus_on_the_host_that_the_image_does_not_see_name_the_runtimes_fix() -> None:
    blind = answer("node-2", nvidia_device=True, cdi=["/etc/cdi/other.yaml"])
    blind["gpus"] = {"smi": False, "count": 0, "total": 0, "busy": None}
    ev = container_evidence(node_2=blind)
    found = only(ev, "image", "node-2")
    assert found.detail == f"node-2 has NVIDIA GPUs (/dev/nvidiactl), but {IMAGE} sees none (no nvidia-smi inside)"
    assert "nvidia-ctk cdi generate" in found.fix and "/etc/cdi/other.yaml" in found.fix
    docker = answer("node-2", nvidia_device=True, kind="docker")
    docker["gpus"] = {"smi": True, "count": 0, "total": 0, "busy": None, "error": "nvidia-smi failed (exit 9)"}
    ev = container_evidence(node_2=docker)
    assert only(ev, "image", "node-2").detail.endswith("sees none (nvidia-smi failed (exit 9))")
    assert "nvidia-ctk runtime configure --runtime=docker" in only(ev, "image", "node-2").fix
    seen = answer("node-2", nvidia_device=True)  # the canned probe sees its one GPU inside
    assert only(container_evidence(node_2=seen), "image", "node-2").status == "ok"


def test_a_host_python_that_cannot_run_names_container_host_python() -> None:
    ev = evidence(cluster(host_python="/opt/py3/bin/python3"), node_1=ProbeFailed(127, "sh: 1: /opt/py3: not found"))
    found = only(ev, "python", "node-1")
    assert found.detail.startswith("python /opt/py3/bin/python3 cannot run on node-1")
    assert found.fix.startswith("set `container.host_python:` for node-1")


def test_bare_hosts_get_no_image_finding_and_images_are_compared_by_reference() -> None:
    assert findings(evidence(), "image") == []
    data = yaml.safe_load(yaml.safe_dump({"hosts": [{"name": "node-0", "container": {"image": "a:1"}},
                                                    {"name": "node-1", "container": {"image": "b:1"}}, "node-2"]}))
    mixed = parse_inventory(yaml.safe_dump(data), "hosts/test.yaml")
    ev = evidence(mixed, node_0={**probe("node-0"), "container": facts(image="a:1")},
                  node_1={**probe("node-1"), "container": facts(image="b:1", id=OTHER)})
    assert [(f.host, f.status) for f in findings(ev, "image")] == [("node-0", "ok"), ("node-1", "ok")]


def test_creation_times_and_ids_are_read_as_both_runtimes_write_them() -> None:
    assert created_at("2001-09-09T01:46:40Z") == created_at("2001-09-09 01:46:40 +0000 UTC")
    assert created_at("2001-09-09T03:46:40.123456789+02:00") == created_at("2001-09-09T01:46:40Z")
    assert created_at("yesterday") is None and created_at(None) is None
    first, later = created_at("2026-11-20T10:00:00Z"), created_at("2026-11-20T10:00:45Z")
    assert first is not None and later is not None
    assert (apart(first, later), apart(later, first), apart(first, first)) == (
        "45 seconds before", "45 seconds after", "at the same second as")
    assert short_id(MAJOR) == "sha256:9f8e7d6c5b4a" == short_id("sha256:" + MAJOR)
