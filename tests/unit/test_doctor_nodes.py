"""The doctor's checks of what each node has, on canned probe data: Python and torch versions, CUDA and NCCL, the
script, GPUs, packages, disk and clock."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.config.inventory import parse_inventory
from launcher.doctor import Evidence, Finding
from tests.support.canned_probes import ADDRS, evidence, findings, gpus, make_cluster, only, probe


def test_python_minor_version_differs_fails_and_patch_warns() -> None:
    odd = probe("node-2")
    odd["python"] = {"version": "3.10.12", "executable": "/usr/bin/python3"}
    patch = probe("node-1")
    patch["python"] = {"version": "3.11.4", "executable": "/opt/venv/bin/python"}
    ev = evidence(node_2=odd)
    found = only(ev, "python", "node-2")
    assert (found.status, found.detail) == ("fail", "Python 3.10.12 here, 3.11 on node-0, node-1")
    assert "Python 3.11 interpreter (like /opt/venv/bin/python on node-0)" in found.fix
    warned = only(evidence(node_1=patch), "python", "node-1")
    assert (warned.status, warned.detail) == ("warn", "Python 3.11.4 here, 3.11.7 on node-0, node-2")


def test_a_python_that_is_a_wrapper_is_said_and_fine() -> None:
    """`python:` a script that runs another interpreter: ok, and a line under the table says which, and whether
    it stays as python's parent (no exec)."""
    wrapped = probe("node-1")
    wrapped["python"] = {**wrapped["python"], "wrapper": {"path": "/opt/wrap", "runs": "/usr/bin/python3.11",
                                                          "execs": False}}
    found = only(evidence(node_1=wrapped), "python", "node-1")
    assert (found.status, found.note) == ("ok", True)
    assert found.detail == ("Python 3.11.7 (/usr/bin/python3.11 through /opt/wrap, a wrapper that does not exec "
                            "(it stays as python's parent): fine)")
    plain = only(evidence(), "python", "node-1")
    assert not plain.note and "wrapper" not in plain.detail


def test_the_probe_tells_a_wrapper_from_the_interpreter(tmp_path: Path) -> None:
    """launcher.node.probe.facts.python_wrapper, run for real: the interpreter itself (or a link to it) is no wrapper; a
    script that runs it is, and one that stays as its parent does not exec."""
    link = tmp_path / "python"
    link.symlink_to(sys.executable)
    stays, execs = tmp_path / "stays", tmp_path / "execs"
    ask = ("from launcher.node.probe.facts import python_wrapper as w; import json, sys; "
           "print(json.dumps(w(sys.argv[1])))")
    stays.write_text(f'#!/bin/bash\n{sys.executable} "$@"\n')
    execs.write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    for path in (stays, execs):
        path.chmod(0o755)
    answers = {}
    for name in (str(link), str(stays), str(execs)):
        out = subprocess.run([name, "-c", ask, name], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).parents[2])
        answers[name] = json.loads(out.stdout)
    real = str(Path(sys.executable).resolve())
    assert answers[str(link)] is None
    assert answers[str(stays)] == {"path": str(stays), "runs": real, "execs": False}
    assert answers[str(execs)] == {"path": str(execs), "runs": real, "execs": True}


def test_torch_version_differs_names_the_odd_node_and_the_majority() -> None:
    odd = probe("node-2")
    odd["torch"] = {**odd["torch"], "version": "2.12.0"}
    found = only(evidence(node_2=odd), "torch", "node-2")
    assert found.status == "fail"
    assert found.detail == "torch 2.12.0 here, 2.13.0 on node-0, node-1"
    assert "torch==2.13.0" in found.fix
    assert only(evidence(node_2=odd), "torch", "node-0").status == "ok"


def test_torch_tie_goes_to_the_master() -> None:
    odd = probe("node-1")
    odd["torch"] = {**odd["torch"], "version": "2.12.0"}
    cluster = parse_inventory(yaml.safe_dump({"hosts": ["node-0", "node-1"]}))
    ev = Evidence(cluster, {"node-0": probe("node-0"), "node-1": odd}, {"free": True})
    assert only(ev, "torch", "node-1").detail == "torch 2.12.0 here, 2.13.0 on node-0"


def test_torch_missing_cuda_and_nccl_differences() -> None:
    missing = probe("node-0")
    missing["torch"] = {"version": None}
    cuda = probe("node-1")
    cuda["torch"] = {**cuda["torch"], "cuda": "12.1"}
    nccl = probe("node-2")
    nccl["torch"] = {**nccl["torch"], "nccl": "2.21.5"}
    cluster = parse_inventory(yaml.safe_dump({"hosts": ["node-0", "node-1", "node-2", "node-3"]}))
    extra = probe("node-2")
    ev = Evidence(cluster, {"node-0": missing, "node-1": cuda, "node-2": nccl, "node-3": extra}, {"free": True})
    gone = only(ev, "torch", "node-0")
    assert (gone.status, gone.detail) == ("fail", "torch is not installed for /opt/venv/bin/python")
    assert "`/opt/venv/bin/python -m pip install torch==2.13.0`" in gone.fix
    # The distribution's own python: its pip refuses (PEP 668), so the fix is a venv, never a system pip install.
    missing["python"] = {**missing["python"], "executable": "/usr/bin/python3"}
    missing["torch"] = {"version": None, "managed": True}
    system = only(Evidence(cluster, {"node-0": missing, "node-1": cuda, "node-2": nccl, "node-3": extra},
                           {"free": True}), "torch", "node-0")
    assert system.fix.startswith("make a venv with it there (`/usr/bin/python3 -m venv ~/venvs/train && "
                                 "~/venvs/train/bin/pip install torch==2.13.0`"), system.fix
    assert "python: ~/venvs/train/bin/python" in system.fix and "-m pip install" not in system.fix
    assert only(ev, "torch", "node-1").detail == "torch built for CUDA 12.1 here, 12.8 on node-2, node-3"
    warned = only(ev, "torch", "node-2")
    assert (warned.status, warned.detail) == ("warn", "NCCL 2.21.5 here, 2.27.3 on node-1, node-3")
    assert only(ev, "torch", "node-3").detail == "torch 2.13.0, CUDA 12.8, NCCL 2.27.3"


def test_script_missing_or_different() -> None:
    gone = probe("node-1")
    gone["script"] = {"path": "/home/u/project/train.py", "error": "[Errno 2] No such file or directory"}
    changed = probe("node-2")
    changed["script"] = {"path": "/home/u/project/train.py", "sha256": "cd" * 32, "size": 90}
    ev = evidence(node_1=gone, node_2=changed)
    missing = only(ev, "script", "node-1")
    assert missing.detail == "train.py is missing on node-1: /home/u/project/train.py"
    assert "rsync -a node-0:/home/u/project/ node-1:/home/u/project/" in missing.fix
    differs = only(ev, "script", "node-2")
    assert differs.detail == f"train.py differs on node-2 (sha256 {'cd' * 6}), node-0 have {'ab' * 6}"
    assert findings(evidence(make_cluster(job=False)), "script") == []


def test_a_script_no_node_has_says_whether_this_machine_has_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """`--script nope.py`: on no node, and not in this project either, the fix is its name, not a copy of the code
    `from your checkout`; one this project has is what `launch --sync` sends."""
    from launcher.doctor.collect import local_script

    gone = {name: {**probe(name), "script": {"path": "/home/u/project/train.py", "error": "[Errno 2]"}}
            for name in ADDRS}
    monkeypatch.chdir(tmp_path)
    cluster = make_cluster()
    assert local_script(cluster) == (str(tmp_path / "train.py"), False)
    ev = dataclasses.replace(evidence(**{k.replace("-", "_"): v for k, v in gone.items()}),
                             local_script=local_script(cluster))
    assert only(ev, "script", "node-1").fix == (f"no node has it, nor this machine at {tmp_path / 'train.py'}: check "
                                                "the script's name (--script, job.script), or fix `workdir` for node-1")
    (tmp_path / "train.py").write_text("print()\n")
    ev = dataclasses.replace(ev, local_script=local_script(cluster))
    assert only(ev, "script", "node-1").fix == ("copy the code to node-1 (`inv launch --sync` sends this project's "
                                                "tree), or fix `workdir` for node-1")


def test_gpu_count_busy_gpus_and_cpu_only_nodes() -> None:
    few = probe("node-0")
    few["gpus"] = gpus(4)
    few["gpus"]["devices"][2].update(pids=[777], memory_used_mib=30000.0, utilization=97.0, busy=True)
    few["gpus"]["busy"] = [few["gpus"]["devices"][2]]
    alike = {f"node_{i}": {**probe(f"node-{i}"), "gpus": gpus(4)} for i in (1, 2)}
    ev = evidence(make_cluster(nproc=8), node_0=few, **alike)
    short, busy = findings(ev, "gpus", "node-0")
    assert (short.status, short.detail) == ("fail", "nproc_per_node is 8 but 4 GPU(s) visible")
    assert "set nproc_per_node: 4" in short.fix
    # A GPU the run uses with someone's work on it fails (it was a warning): the run would share it, or run out.
    assert (busy.status, busy.detail) == ("fail", "GPU 2 (cuda:2 for this run) is in use: pid 777; 30000 MiB, 97% used")
    cpus = {f"node_{i}": {**probe(f"node-{i}"), "gpus": {"count": 0, "total": 0, "busy": None, "smi": False}}
            for i in range(3)}
    assert only(evidence(make_cluster(), **cpus), "gpus", "node-1") == Finding("node-1", "gpus", "ok",
                                                                                "no GPUs: gloo on CPU")
    assert only(evidence(make_cluster(nproc="auto"), **cpus), "gpus", "node-1").detail == (
        "no GPUs: gloo on CPU; nproc_per_node auto starts one worker per CPU core")


def test_package_differences_are_listed() -> None:
    odd = probe("node-2")
    odd["packages"] = {"sha256": "q" * 64, "count": 3, "list": ["numpy==2.1.0", "torch==2.12.0", "wandb==0.19.0"]}
    found = only(evidence(node_2=odd), "packages", "node-2")
    assert found.status == "warn"
    assert found.detail == "2 difference(s) from node-0: torch 2.12.0 (not 2.13.0), +wandb 0.19.0"


def test_low_disk_and_clock_skew_warn() -> None:
    low = probe("node-1")
    low["disk_free"] = 300 << 20
    late = probe("node-2")
    late["time"] = 990.0  # 10 s before the controller sent the probes
    ev = evidence(node_1=low, node_2=late)
    assert only(ev, "disk", "node-1").detail == "only 300.0 MiB free for /home/u/project"
    clock = only(ev, "clock", "node-2")
    assert (clock.status, clock.detail) == ("warn", "clock 10.0 s behind the controller's")
    assert only(ev, "clock", "node-0").status == "ok"
