"""The doctor and the launch's start gate give one verdict: for every check they share (`doctor.FAST_CHECKS`), on
real sshd nodes, `inv doctor --fast` and `inv launch` fail the same nodes on the same checks with the same words
and fixes, and pass the same nodes: a `python:` that is a wrapper printing after python ends among them.

The doctor opens probe sessions of its own (its answer is the probe's stdout); a launch asks each node's agent
session (its answer is an event): two readings of one probe, which must not disagree.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import sandbox
from devtools.observe import free_port
from launcher import doctor
from tests.helpers import inv, runs_on
from tests.support.gpus import fake_torch, install_smi, node_gpus
from tests.support.nodeenv import node_python

pytestmark = pytest.mark.integration

Verdict = tuple[str, str, str, str]
"""(host, check, detail, fix) of a failed check."""


def doctor_says(hosts: Path) -> tuple[int, list[Verdict]]:
    """`inv doctor --fast --json`'s exit code and failures."""
    result = inv("doctor", "--hosts", str(hosts), "--fast", "--json", timeout=120)
    data = json.loads(result.stdout)
    return result.returncode, [(f["host"], f["check"], f["detail"], f["fix"]) for f in data["findings"]
                               if f["status"] == "fail"]


def launch_says(hosts: Path, logs: Path) -> tuple[int, list[Verdict], str]:
    """`inv launch`'s exit code and the failures it printed: the gate's (`NODE CHECK: DETAIL` and its `fix:` line),
    or the nodes it could not reach (`NODE: KIND: DETAIL (fix: FIX)`, the doctor's ssh check)."""
    result = inv("launch", "--hosts", str(hosts), log_dir=logs, timeout=120)
    found: list[Verdict] = []
    for line in result.stderr.splitlines():
        unreachable = re.fullmatch(r"  ([\w-]+): (\S+: .*) \(fix: (.*)\)", line)
        failed = re.fullmatch(r"  ([\w-]+) (\w+): (.*)", line)
        if unreachable:
            found.append((unreachable.group(1), "ssh", unreachable.group(2), unreachable.group(3)))
        elif failed:
            found.append((failed.group(1), failed.group(2), failed.group(3), ""))
        elif line.startswith("    fix: ") and found:
            found[-1] = (*found[-1][:3], line[len("    fix: "):])
    return result.returncode, found, result.stderr


def hosts_with(box: sandbox.Sandbox, path: Path, **edits: dict[str, Any]) -> Path:
    """The sandbox's inventory with host fields changed (`node_1={"python": ...}`), at `path`."""
    data = yaml.safe_load(box.inventory.read_text())
    for i, entry in enumerate(data["hosts"]):
        name = entry if isinstance(entry, str) else entry["name"]
        data["hosts"][i] = {"name": name, **edits.get(name.replace("-", "_"), {})}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@contextlib.contextmanager
def squatting(box: sandbox.Sandbox, hosts: Path) -> Iterator[None]:
    """A port held by someone else, named as the rendezvous port in `hosts`. The OS chooses it while we hold it: a
    port found free earlier may be taken by then (by a torchrun of a test beside this one)."""
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        data = yaml.safe_load(box.inventory.read_text())
        data["rendezvous"]["master_port"] = squatter.getsockname()[1]
        hosts.write_text(yaml.safe_dump(data, sort_keys=False))
        yield


def faults(box: sandbox.Sandbox, tmp: Path) -> dict[str, tuple[Path, Callable[[], Any]]]:
    """Each fault of the healthy sandbox: its inventory and what holds while both commands run."""
    wrapper = tmp / "wrapper-python"
    wrapper.write_text(f'#!/bin/bash\n{node_python()} "$@"\necho wrapper-done\n')  # prints after python ends
    torch = tmp / "other-torch" / "python"
    site = fake_torch(tmp / "other-torch" / "site", version="2.12.0", cuda=None)
    torch.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {node_python()} "$@"\n')
    for path in (wrapper, torch):
        path.chmod(0o755)
    (tmp / "empty").mkdir()
    smi = install_smi(tmp / "smi", node_gpus(1), apps=[{"pid": 4242, "gpu": 0, "used": 20000}])
    at = {name: tmp / f"{name}.yaml" for name in ("wrapper", "python", "torch", "script", "gpus", "port", "image")}
    # node-1 runs the job in an image through docker: this machine's client has no daemon (elsewhere: no docker, or
    # no such image), so the image check fails it, in the doctor's words and the gate's alike.
    image = {"image": "localhost/ddpl-absent:1", "runtime": "docker", "host_python": node_python()}
    return {
        "wrapper": (hosts_with(box, at["wrapper"], node_1={"python": str(wrapper)}), contextlib.nullcontext),
        "python": (hosts_with(box, at["python"], node_1={"python": "/nonexistent/bin/python3"}),
                   contextlib.nullcontext),
        "torch": (hosts_with(box, at["torch"], node_1={"python": str(torch)}), contextlib.nullcontext),
        "script": (hosts_with(box, at["script"], node_1={"workdir": str(tmp / "empty")}), contextlib.nullcontext),
        "gpus": (hosts_with(box, at["gpus"], node_1={"setup": [f"export PATH={smi}:$PATH"]}),
                 contextlib.nullcontext),
        "port": (at["port"], lambda: squatting(box, at["port"])),
        "image": (hosts_with(box, at["image"], node_1={"container": image}), contextlib.nullcontext),
    }


def test_the_doctor_and_the_launchs_gate_agree_on_every_check_they_share(make_sandbox, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "hello.py").write_text("print('hello')\n")
    job = {"workdir": tmp_path / "work", "script": "hello.py"}
    healthy = make_sandbox(2, torchrun="stand-in", master_port=free_port(), **job)
    cases = faults(healthy, tmp_path)
    # node-1 resolves node-0 nowhere (dns, tcp); node-2's own name is 127.0.1.1 there (hostname)
    broken = make_sandbox(3, torchrun="stand-in",
                          master_port=free_port(), unresolvable={1: [0]}, self_loopback_trap=[2], **job)
    cases["dns, tcp, hostname"] = (broken.inventory, contextlib.nullcontext)
    failed: set[str] = set()
    for name, (hosts, holding) in [*cases.items(), ("ssh", (healthy.inventory, lambda: down(healthy, 1)))]:
        with holding():
            before = set(runs_on(healthy)) | set(runs_on(broken))
            doctor_code, by_doctor = doctor_says(hosts)
            launch_code, by_launch, said = launch_says(hosts, tmp_path / "logs")
        assert by_launch == by_doctor, f"{name}:\n{said}"
        if name == "wrapper":  # a good python: both pass it, and the run runs
            assert (doctor_code, launch_code, by_doctor) == (0, 0, []), said
            continue
        assert (doctor_code, launch_code) == (1, 1), f"{name}:\n{said}"
        assert set(runs_on(healthy)) | set(runs_on(broken)) == before, name  # nothing started anywhere
        failed |= {check for _, check, _, _ in by_doctor}
    assert failed >= set(doctor.FAST_CHECKS), sorted(set(doctor.FAST_CHECKS) - failed)


@contextlib.contextmanager
def down(box: sandbox.Sandbox, index: int) -> Iterator[None]:
    """Node `index`'s sshd stopped (for good: the last case)."""
    sandbox.stop_node(box.state_dir, index)
    yield
