"""GPU nodes as they are (#33), on real sandbox nodes without a GPU: each node shows what a GPU node would through a
stand-in nvidia-smi on its own PATH (tests/support/smi_standin.py, nvidia-smi's own formats) and, where asked, a
torch whose files say it was built for CUDA 12.4. Each node's login (its own ~/.bashrc) sources a file of this test
(`login.sh`: PATH, PYTHONPATH, CUDA_VISIBLE_DEVICES), as a site profile or a shared node's allocation would.

What a user would check: the doctor's exit code and findings, a launch that stops at its checks with the lines it
prints, a hung nvidia-smi answered within its bound with nothing left behind, `--include` mapped through the node's
own CUDA_VISIBLE_DEVICES in the environment the workers really get, and `inv top`'s GPU column of a running run."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import sandbox
from devtools.observe import free_port, processes_mentioning, reserve_base_addr
from devtools.sandbox import Sandbox
from tests.helpers import inv, run_id_of, runs_on, wait_for
from tests.support.gpus import fake_torch, gpu, install_smi, node_gpus
from tests.support.nodeenv import node_python

MIG = "MIG-11111111-2222-3333-4444-555555555555"


@pytest.fixture(scope="module")
def gpu_box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sandbox, Path]]:
    """3 sandbox nodes whose logins source ROOT/<their hostname>/login.sh (each test writes what it needs)."""
    root = tmp_path_factory.mktemp("gpu-nodes")
    base, lock = reserve_base_addr()
    rc = f'[ -f {root}/"$(hostname)"/login.sh ] && . {root}/"$(hostname)"/login.sh\n'
    try:
        box = sandbox.up(3, state_dir=root / "state", inventory=root / "sandbox.yaml", python=node_python(),
                         base_addr=base, master_port=free_port(), login_rc=rc)
        try:
            yield box, root
        finally:
            sandbox.down(root / "state")
    finally:
        lock.close()


def node(root: Path, name: str, gpus: list[dict[str, Any]] | None = None, *, cuda: str | None = None,
         visible: str | None = None, **smi: Any) -> Path:
    """Make node `name` show `gpus` (None: no nvidia-smi), a torch built for `cuda` (None: the sandbox's own, a CPU
    build) and, from its login, CUDA_VISIBLE_DEVICES=`visible`. Its stand-in's folder."""
    folder = root / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    lines = []
    if gpus is not None:
        install_smi(folder / "bin", gpus, **smi)
        lines.append(f"export PATH={folder / 'bin'}:$PATH")
    if cuda is not None:
        lines.append(f"export PYTHONPATH={fake_torch(folder / 'torch', cuda=cuda)}")
    if visible is not None:
        lines.append(f"export CUDA_VISIBLE_DEVICES={visible}")
    (folder / "login.sh").write_text("\n".join(lines) + "\n")
    return folder / "bin"


def inventory(box: Sandbox, path: Path, nproc: int | str, nodes: int = 3, **job: Any) -> Path:
    """The sandbox's inventory with `nproc` ranks a node, its first `nodes` hosts, and `job` if given."""
    data = yaml.safe_load(box.inventory.read_text())
    data.setdefault("defaults", {})["nproc_per_node"] = nproc
    data["hosts"] = data["hosts"][:nodes]
    if job:
        data["job"] = job
    path.write_text(yaml.safe_dump(data))
    return path


def gpu_lines(data: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f["host"], f["status"], f["detail"]) for f in data["findings"] if f["check"] == "gpus"]


def test_the_doctor_sees_each_gpu_node_as_it_is(gpu_box, tmp_path: Path) -> None:
    box, root = gpu_box
    node(root, "node-0", node_gpus(8), cuda="12.4")
    node(root, "node-1", node_gpus(8), cuda="12.4", apps=[{"pid": 4242, "gpu": 3, "used": 30000}])
    node(root, "node-2", node_gpus(7))  # lost a GPU, and its torch is the CPU build
    result = inv("doctor", "--hosts", str(inventory(box, tmp_path / "inv.yaml", "auto")), "--fast", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert "gpus" in data["checks"]  # one of the checks a launch runs
    found = gpu_lines(data)
    assert ("node-0", "ok", "8 GPU(s) NVIDIA H100 80GB HBM3, driver 550.54.15, nproc_per_node auto") in found
    assert ("node-1", "fail", "GPU 3 (cuda:3 for this run) is in use: pid 4242; 30000 MiB, 0% used") in found
    cpu = [d for h, s, d in found if h == "node-2" and "CPU build" in d]
    assert cpu and cpu[0].startswith("7 GPU(s) here, but torch ") and "nproc_per_node auto would start one" in cpu[0]
    assert ("node-2", "fail", "7 GPU(s) here, 8 on node-0, node-1: with nproc_per_node auto it starts that many "
            "workers, so the world size and the global batch change without a word") in found
    fixes = " ".join(f["fix"] for f in data["findings"] if f["host"] == "node-2" and f["check"] == "gpus")
    assert "--index-url https://download.pytorch.org/whl/cu124" in fixes


def test_a_launch_stops_at_its_checks_on_a_busy_gpu_and_too_few_gpus(gpu_box, tmp_path: Path) -> None:
    box, root = gpu_box
    node(root, "node-0", node_gpus(2), cuda="12.4")
    node(root, "node-1", node_gpus(2), cuda="12.4", apps=[{"pid": 4343, "gpu": 0, "used": 20000}])
    node(root, "node-2", node_gpus(1), cuda="12.4")
    hosts = inventory(box, tmp_path / "inv.yaml", 2, script="train/ddp.py")
    before = set(runs_on(box))
    started = time.monotonic()
    result = inv("launch", "--hosts", str(hosts), log_dir=tmp_path / "logs")
    assert time.monotonic() - started < 30
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the doctor found 2 problem(s); nothing was started:" in result.stderr
    assert ("  node-1 gpus: GPU 0 (cuda:0 for this run) is in use: pid 4343; 20000 MiB, 0% used"
            in result.stderr.splitlines())
    assert "  node-2 gpus: nproc_per_node is 2 but 1 GPU(s) visible" in result.stderr.splitlines()
    assert set(runs_on(box)) == before  # no run directory anywhere: nothing started


def test_a_hung_nvidia_smi_is_answered_within_its_bound_and_mig_is_said(gpu_box, tmp_path: Path) -> None:
    box, root = gpu_box
    node(root, "node-0", node_gpus(1), cuda="12.4")
    node(root, "node-1", [gpu(0, mig="Enabled", util="[N/A]")], cuda="12.4", visible=MIG,
         mig={"0": [{"name": "3g.40gb", "uuid": MIG}]})
    hung = node(root, "node-2", node_gpus(8), cuda="12.4", mode="hang")
    hosts = inventory(box, tmp_path / "inv.yaml", 1)
    started = time.monotonic()
    # nvidia-smi's bound is 10 s, or half a shorter probe timeout (3 s here): the probe answers, saying why.
    result = inv("doctor", "--hosts", str(hosts), "--fast", "--json", "--probe-timeout", "6")
    assert time.monotonic() - started < 6 + 3
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads(result.stdout)
    found = gpu_lines(data)
    assert ("node-2", "fail", "nvidia-smi did not answer in 3 s: a GPU stuck in the driver?") in found
    assert not [f for f in data["findings"] if f["status"] != "ok" and f["check"] != "gpus"], data["findings"]
    # A MIG UUID in CUDA_VISIBLE_DEVICES is a device, not "no GPUs": the line says what the run sees.
    (mig,) = [d for h, s, d in found if h == "node-1"]
    assert mig.endswith(f"; MIG: each process sees one MIG device, GPU 0 (MIG 3g.40gb {MIG})")
    wait_for(lambda: not processes_mentioning(str(hung)), 3, "the hung stand-in and its child gone")


def test_include_maps_through_the_nodes_own_visible_devices_and_top_shows_the_runs_gpus(gpu_box,
                                                                                       tmp_path: Path) -> None:
    box, root = gpu_box
    # node-0's login gives this user GPUs 4-7 of 8 (a shared node); `--include node-0:1,3` means its 2nd and 4th.
    table = node_gpus(8)
    table[7]["error"] = "[GPU requires reset]"
    node(root, "node-0", table, visible="4,5,6,7", apps="ranks")
    script = tmp_path / "envdump.py"
    # Written whole, then renamed into place: the test reads a file the moment it exists.
    script.write_text("import json, os, sys, time\n"
                      f"path = '{tmp_path}/env-' + os.environ['RANK']\n"
                      "json.dump(dict(os.environ), open(path + '.part', 'w'))\n"
                      "os.replace(path + '.part', path)\n"
                      "print('ready', flush=True)\ntime.sleep(120)\n")
    hosts = inventory(box, tmp_path / "inv.yaml", 4, nodes=1, script=str(script))
    logs = tmp_path / "logs"
    result = inv("launch", "--hosts", str(hosts), "--include", "node-0:1,3", "--detach", "--skip-doctor",
                 log_dir=logs)
    assert result.returncode == 0, result.stderr
    run_id = run_id_of(result.stdout + result.stderr)
    try:
        wait_for(lambda: all((tmp_path / f"env-{r}").exists() for r in (0, 1)), 30, "both ranks started")
        seen = [json.loads((tmp_path / f"env-{r}").read_text()) for r in (0, 1)]
        assert {(e["CUDA_VISIBLE_DEVICES"], e["CUDA_DEVICE_ORDER"]) for e in seen} == {("5,7", "PCI_BUS_ID")}
        top = inv("top", "--hosts", str(hosts), "--once", "--json", log_dir=logs)
        assert top.returncode == 0, top.stderr
        (shown,) = json.loads(top.stdout)["nodes"]
        gpus = [(g["index"], g["ranks"], g["error"]) for g in shown["gpus"]]
        # The run's GPUs only (5 and 7, not the node's other six), each with its rank; GPU 7 cannot be read and
        # keeps its place, with why, beside GPU 5's figures.
        assert gpus == [(5, [0], None), (7, [1], "[GPU requires reset]")], shown
        assert shown["gpus_error"] is None and shown["gpus_age_s"] < 5
    finally:
        stopped = inv("stop", "--hosts", str(hosts), "--run", run_id, log_dir=logs)
        assert stopped.returncode == 0, stopped.stderr


def test_doctor_net_over_all_of_each_nodes_gpus(gpu_box, tmp_path: Path) -> None:
    # Here gloo on CPU with 2 ranks a node (what `nproc_per_node` gives; one a GPU on a GPU node): the whole group
    # is 4 ranks, each pair every rank of its two nodes.
    box, root = gpu_box
    for name in ("node-0", "node-1", "node-2"):
        node(root, name)
    hosts = inventory(box, tmp_path / "inv.yaml", 2, nodes=2)
    result = inv("doctor", "--hosts", str(hosts), "--net", "--net-all-gpus", "--json", log_dir=tmp_path / "logs")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["net"]["backend"] == "gloo" and report["net"]["world"] == 4
    for name in ("node-0", "node-1"):
        net = report["nodes"][name]["net"]
        assert net["busbw_gbps"] > 0 and list(net["links"]) == [{"node-0": "node-1", "node-1": "node-0"}[name]]
