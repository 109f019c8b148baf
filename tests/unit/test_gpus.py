"""GPU nodes as they are, on a machine without a GPU: the probe and `inv top` against a stand-in nvidia-smi that
answers in its real formats (several GPUs, MIG, `[N/A]`, a failing driver, a GPU off the bus, one that hangs with a
child holding its output), CUDA_VISIBLE_DEVICES as CUDA reads it, and the doctor's `gpus` check on canned answers."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.observe import processes_mentioning
from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster
from launcher.doctor import Evidence, Finding
from launcher.doctor.checks_gpu import check_gpus, newest_cuda
from launcher.node.common import gpus as node_gpus
from launcher.node.common.devices import chosen, entries
from launcher.report.toptables import node_table
from launcher.watch.topmodel import NodeView
from tests.support.canned_probes import ADDRS, device, gpus, probe
from tests.support.gpus import calls, gpu, install_smi
from tests.support.gpus import node_gpus as standin_gpus
from tests.support.proberun import run_probe

MIG_A = "MIG-11111111-2222-3333-4444-555555555555"
MIG_B = "MIG-66666666-7777-8888-9999-000000000000"


def probe_gpus(folder: Path, tmp_path: Path, timeout: float = 10.0, **request: Any) -> dict[str, Any]:
    """The probe's `gpus`, run here with `folder`'s nvidia-smi first on PATH (no CUDA_VISIBLE_DEVICES of ours)."""
    env = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    full = {"mode": "probe", "checks": "fast", "names": [], "workdir": str(tmp_path), "script": None,
            "gpu_timeout_s": timeout, **request}
    return run_probe(full, env)["gpus"]


# --- the probe, against the stand-in -----------------------------------------------------------------------------


def test_the_probe_reads_several_gpus_their_driver_and_who_uses_them(tmp_path: Path) -> None:
    smi = install_smi(tmp_path / "bin", standin_gpus(4), apps=[{"pid": 4242, "gpu": 1, "used": 30000}])
    found = probe_gpus(smi, tmp_path)
    assert (found["count"], found["total"], found["driver"], found["names"]) == (4, 4, "550.54.15", [
        "NVIDIA H100 80GB HBM3"])
    assert [(d["cuda"], d["index"], d["pids"], d["busy"]) for d in found["devices"]] == [
        (0, 0, [], False), (1, 1, [4242], True), (2, 2, [], False), (3, 3, [], False)]
    assert [d["index"] for d in found["busy"]] == [1] and found["mig"] is False and "error" not in found
    # The queries, as nvidia-smi takes them: csv without header or units, each started at once.
    assert sorted(calls(smi)) == sorted([
        "--query-gpu=index,uuid,name,pci.bus_id,driver_version,mig.mode.current,memory.used,memory.total,"
        "utilization.gpu --format=csv,noheader,nounits",
        "--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits", "-L"])
    # CUDA_VISIBLE_DEVICES (the inventory's): in its order; an invalid entry ends the list, as CUDA reads it.
    ordered = probe_gpus(smi, tmp_path, cuda_visible_devices="2,1,-1,0")
    assert [(d["cuda"], d["index"]) for d in ordered["devices"]] == [(0, 2), (1, 1)] and ordered["count"] == 2
    # --include node:1 on a node whose own value is "2,1": its second entry, GPU 1.
    assert [d["index"] for d in probe_gpus(smi, tmp_path, cuda_visible_devices="2,1", gpus=[1])["devices"]] == [1]
    assert probe_gpus(smi, tmp_path, cuda_visible_devices="2,1", gpus=[2])["spec_error"] == (
        "GPU 2 chosen (--include/--exclude), but this node's own CUDA_VISIBLE_DEVICES=2,1 shows 2 GPU(s)")


def test_not_reported_fields_are_unknown_and_a_gpu_that_needs_a_reset_is_unreadable(tmp_path: Path) -> None:
    smi = install_smi(tmp_path / "bin", [gpu(0, util="[N/A]", used="[N/A]"), gpu(1, error="[GPU requires reset]")])
    found = probe_gpus(smi, tmp_path)
    first, second = found["devices"]
    assert (first["utilization"], first["memory_used_mib"], first["busy"], first["unreadable"]) == (
        None, None, False, None)
    assert (second["unreadable"], second["busy"]) == ("[GPU requires reset]", False)
    assert [d["index"] for d in found["unreadable"]] == [1]


def test_mig_devices_are_what_the_run_sees(tmp_path: Path) -> None:
    migs = {"0": [{"name": "3g.40gb", "uuid": MIG_A}, {"name": "3g.40gb", "uuid": MIG_B}]}
    smi = install_smi(tmp_path / "bin", [gpu(0, mig="Enabled", util="[N/A]"), gpu(1)], mig=migs)
    named = probe_gpus(smi, tmp_path, cuda_visible_devices=MIG_B)
    assert named["mig"] is True and named["count"] == 1  # a MIG UUID matches no GPU UUID: no longer "no GPUs"
    (only,) = named["devices"]
    assert (only["index"], only["mig"], only["mig_name"], only["busy"]) == (0, MIG_B, "3g.40gb", None)
    every = probe_gpus(smi, tmp_path)
    assert [(d["index"], d.get("mig")) for d in every["devices"]] == [(0, MIG_A), (0, MIG_B), (1, None)]
    assert every["count"] == 2  # GPU 1, and one MIG device a process (CUDA's rule)


def test_a_failing_driver_and_a_gpu_off_the_bus(tmp_path: Path) -> None:
    smi = install_smi(tmp_path / "bin", standin_gpus(2), mode="driver")
    assert probe_gpus(smi, tmp_path)["error"] == (
        "nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.")
    install_smi(smi, standin_gpus(3), mode="lost")
    lost = probe_gpus(smi, tmp_path)
    assert lost["count"] == 3 and lost["warning"] == (
        "nvidia-smi exit 15: Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error")


def test_a_hung_nvidia_smi_is_bounded_and_leaves_nothing_behind(tmp_path: Path) -> None:
    # It never answers, and a child it started holds its stdout open after it is killed (a wait for end of file
    # would block for the child's 60 s): the probe answers within its bound, and kills both.
    smi = install_smi(tmp_path / "bin", standin_gpus(8), mode="hang")
    started = time.monotonic()
    found = probe_gpus(smi, tmp_path, timeout=1.0)
    assert time.monotonic() - started < 1.0 + 2.0
    assert found["error"] == "nvidia-smi did not answer in 1 s: a GPU stuck in the driver?" and found["late"]
    deadline = time.monotonic() + 2
    while processes_mentioning(str(smi)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_mentioning(str(smi)) == []


@pytest.mark.parametrize(("spec", "indices", "answer"), [
    (None, None, (None, None)), ("4,5,6,7", None, ("4,5,6,7", None)), (None, [0, 2], ("0,2", None)),
    ("4,5,6,7", [0, 2], ("4,6", None)), (f"{MIG_A},{MIG_B}", [1], (MIG_B, None)),
    ("4,5", [2], (None, "GPU 2 chosen (--include/--exclude), but this node's own CUDA_VISIBLE_DEVICES=4,5 shows "
                        "2 GPU(s)")),
    ("", [0], (None, "GPU 0 chosen (--include/--exclude), but this node's own CUDA_VISIBLE_DEVICES= shows 0 GPU(s)")),
])
def test_chosen_gpus_are_places_in_the_nodes_own_value(spec, indices, answer) -> None:
    assert chosen(spec, indices) == answer


def test_cuda_reads_visible_devices_up_to_the_first_invalid_entry() -> None:
    assert entries("0,2,-1,1") == ["0", "2"]
    assert entries(" GPU-abc , 3") == ["GPU-abc", "3"]
    assert entries("0,,1") == ["0"] and entries("") == []


# --- the doctor's gpus check, on canned probe answers --------------------------------------------------------------


def cluster(nproc: int | str = 1) -> Cluster:
    data = {"defaults": {"python": "/opt/venv/bin/python", "nproc_per_node": nproc}, "hosts": list(ADDRS),
            "rendezvous": {"master_addr": "node-0"}}
    return parse_inventory(yaml.safe_dump(data), "hosts/test.yaml")


def gpu_findings(nproc: int | str = 1, in_use: bool = False, **nodes: dict[str, Any]) -> list[Finding]:
    """The gpus check on three nodes whose probes are healthy but for `nodes` (node_1=...: fields of its probe)."""
    outcomes = {h: probe(h) for h in ADDRS}
    for name, fields in nodes.items():
        outcomes[name.replace("_", "-")] = {**outcomes[name.replace("_", "-")], **fields}
    return check_gpus(Evidence(cluster(nproc), outcomes, gpus_in_use=in_use))


def problems(found: list[Finding]) -> list[tuple[str, str, str]]:
    return [(f.host, f.status, f.detail) for f in found if f.status != "ok"]


def test_a_cpu_build_of_torch_on_a_gpu_node_fails_with_the_cuda_build_to_install() -> None:
    cpu_torch = {"version": "2.13.0+cpu", "cuda": None, "cuda_known": True, "nccl": None}
    found = gpu_findings(node_1={"torch": cpu_torch, "gpus": gpus(1, driver="550.54.15")})
    (bad,) = [f for f in found if f.status == "fail"]
    assert (bad.host, bad.status) == ("node-1", "fail")
    assert bad.detail.startswith("1 GPU(s) here, but torch 2.13.0+cpu is a CPU build (torch.version.cuda is None): "
                                 "nproc_per_node auto would start one worker per CPU core")
    assert ("`/opt/venv/bin/python -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu124`"
            in bad.fix)  # driver 550 supports CUDA 12.4 in full
    unknown = {"version": "2.13.0", "cuda": None, "cuda_known": False, "nccl": None}
    assert problems(gpu_findings(node_1={"torch": unknown})) == []  # metadata without the files: CUDA unknown


def test_the_driver_against_torchs_cuda() -> None:
    assert newest_cuda("550.54.15") == "12.4" and newest_cuda("580.82.07") == "13.0" and newest_cuda("418.0") is None
    old = gpu_findings(node_2={"gpus": gpus(1, driver="470.82.01")})  # torch built for CUDA 12.8 (canned)
    assert ("node-2", "fail", "torch 2.13.0 is built for CUDA 12.8, which needs driver 525.60.13 or newer; node-2 has "
            "470.82.01: CUDA will not start") in problems(old)
    minor = [p for p in problems(gpu_findings(node_2={"gpus": gpus(1, driver="535.104.05")})) if p[0] == "node-2"]
    assert minor[0][1] == "warn" and minor[0][2].startswith(
        "driver 535.104.05 is older than CUDA 12.8's (570.26): torch runs by CUDA's minor version compatibility")
    assert ("node-2", "warn", "driver 535.104.05 here, 570.124.06 on node-0, node-1") in minor


def test_busy_and_unreadable_gpus_the_run_uses_fail_and_others_are_said() -> None:
    busy = gpus(2)
    busy["devices"][1].update(pids=[4242], runs=["20260101-000000-abcdef/node-1"], memory_used_mib=30000.0,
                              utilization=99.0, busy=True)
    (bad,) = problems(gpu_findings(nproc=2, node_1={"gpus": busy}, node_0={"gpus": gpus(2)},
                                   node_2={"gpus": gpus(2)}))
    assert bad == ("node-1", "fail", "GPU 1 (cuda:1 for this run) is in use: pid 4242; launcher run "
                   "20260101-000000-abcdef/node-1; 30000 MiB, 99% used")
    # nproc_per_node 1 uses GPU 0 only: GPU 1's work is someone else's business, said beside the ok.
    (fine,) = [f for f in gpu_findings(node_1={"gpus": busy}, node_0={"gpus": gpus(2)}, node_2={"gpus": gpus(2)})
               if f.host == "node-1"]
    assert fine.status == "ok" and fine.detail.endswith("; GPU 1 busy, not this run's")
    # `doctor --job` on a running job: its own run is on its GPUs.
    assert problems(gpu_findings(nproc=2, in_use=True, node_1={"gpus": busy}, node_0={"gpus": gpus(2)},
                                 node_2={"gpus": gpus(2)})) == []
    broken = gpus(1, devices=[device(0, unreadable="[GPU requires reset]")])
    (lost,) = problems(gpu_findings(node_0={"gpus": broken}))
    assert lost == ("node-0", "fail", "GPU 0 cannot be read: [GPU requires reset] (fallen off the bus?)")


def test_nvidia_smi_that_fails_or_hangs_fails_the_node_with_what_it_is() -> None:
    hung = {"smi": True, "count": 0, "total": 0, "busy": None, "late": True,
            "error": "nvidia-smi did not answer in 10 s: a GPU stuck in the driver?"}
    (bad,) = [f for f in gpu_findings(node_2={"gpus": hung}) if f.status != "ok"]
    assert (bad.host, bad.status, bad.detail) == ("node-2", "fail", hung["error"])
    assert "dmesg | grep -i xid" in bad.fix and "python" not in bad.fix  # not "python hangs at start"
    # Its probe took nvidia-smi's 10 s: that is said by the gpus check, not blamed on a slow python.
    outcomes = {h: probe(h) for h in ADDRS}
    outcomes["node-2"] = {**outcomes["node-2"], "gpus": hung}
    ev = Evidence(cluster(), outcomes, probe_timeout=120.0, probe_times={"node-0": 0.4, "node-1": 0.4,
                                                                        "node-2": 10.3})
    from launcher.doctor import evaluate

    assert [(f.host, f.check) for f in evaluate(ev, "fast") if f.status != "ok"] == [("node-2", "gpus")]


def test_more_ranks_than_gpus_and_mig() -> None:
    assert ("node-0", "fail", "nproc_per_node is 2 but 1 GPU(s) visible") in problems(gpu_findings(nproc=2))
    mig = gpus(1, mig=True, devices=[device(0, mig=MIG_A, mig_name="3g.40gb", busy=None)])
    (bad,) = [p for p in problems(gpu_findings(nproc=2, **{f"node_{i}": {"gpus": mig} for i in range(3)}))
              if p[0] == "node-1"]
    assert bad == ("node-1", "fail", f"nproc_per_node is 2, but CUDA shows each process one MIG device (GPU 0 (MIG "
                   f"3g.40gb {MIG_A})): 2 ranks would share it, and NCCL refuses two ranks on one device")
    (ok,) = gpu_findings(node_1={"gpus": mig}, node_0={"gpus": mig}, node_2={"gpus": mig})[1:2]
    assert ok.detail.endswith(f"; MIG: each process sees one MIG device, GPU 0 (MIG 3g.40gb {MIG_A})")
    none = gpus(0, total=2, spec="GPU-ffff")
    assert ("node-0", "fail", "nvidia-smi lists 2 GPU(s), but CUDA_VISIBLE_DEVICES=GPU-ffff names none: this node's "
            "run would see no GPU (gloo here, NCCL elsewhere)") in problems(gpu_findings(node_0={"gpus": none}))


def test_nodes_with_another_gpu_count_or_model_than_the_majority() -> None:
    eight, seven = gpus(8), gpus(7)
    auto = problems(gpu_findings(nproc="auto", node_0={"gpus": eight}, node_1={"gpus": eight},
                                 node_2={"gpus": seven}))
    # auto: the world size and the global batch would change without a word: a failure.
    assert auto == [("node-2", "fail", "7 GPU(s) here, 8 on node-0, node-1: with nproc_per_node auto it starts that "
                     "many workers, so the world size and the global batch change without a word")]
    fixed = problems(gpu_findings(nproc=4, node_0={"gpus": eight}, node_1={"gpus": eight}, node_2={"gpus": seven}))
    assert fixed == [("node-2", "warn", "7 GPU(s) here, 8 on node-0, node-1: one lost (off the bus) or taken?")]
    a100 = gpus(1, names=["NVIDIA A100-SXM4-80GB"])
    assert problems(gpu_findings(node_2={"gpus": a100})) == [
        ("node-2", "warn", "GPU model NVIDIA A100-SXM4-80GB here, H100 on node-0, node-1")]
    cpu = {"smi": False, "count": 0, "total": 0, "busy": None}
    assert ("node-2", "fail", "0 GPU(s) here, 1 on node-0, node-1; its ranks and the others' would pick different "
            "backends (NCCL, gloo)") in problems(gpu_findings(node_2={"gpus": cpu}))


# --- inv top: the run's GPUs, off the snapshot path ----------------------------------------------------------------


def rows(*items: dict[str, Any]) -> list[dict[str, Any]]:
    fields = ("index", "uuid", "name", "bus", "driver", "mig", "used", "total", "util")
    text = "\n".join(", ".join(str(g[f] if f in ("index", "uuid") else g["error"] or g[f]) for f in fields)
                     for g in items)
    return node_gpus.parse_rows(text)[0]


def test_top_shows_the_runs_gpus_with_their_ranks_and_keeps_an_unreadable_one() -> None:
    table = rows(gpu(0), gpu(1, used=20000, util=87), gpu(2, error="[Unknown Error]"), gpu(3))
    apps = {table[1]["uuid"]: [(100, 2048.0), (101, 512.0)], table[3]["uuid"]: [(999, 1.0)]}
    ranks = {100: 4, 101: 4, 200: 5}  # rank 4 and its helper on GPU 1; rank 5 not on a GPU yet
    found = node_gpus.run_gpus(table, apps, "1,2", ranks)
    assert [(g["index"], g["ranks"], g["error"]) for g in found] == [(1, [4], None), (2, [], "[Unknown Error]")]
    assert (found[0]["util_percent"], found[0]["mem_used_bytes"]) == (87, 20000 << 20)
    # GPU 3 holds someone else's process, GPU 0 is not the run's: neither is shown.


def test_the_gpu_watch_answers_at_once_and_says_how_old_or_why(tmp_path: Path, monkeypatch) -> None:
    smi = install_smi(tmp_path / "bin", [gpu(0, used=1000, util=50), gpu(1, error="[GPU requires reset]")])
    monkeypatch.setenv("PATH", f"{smi}:{os.environ['PATH']}")
    watch = node_gpus.GpuWatch(2.0, 0.2)
    try:
        deadline = time.monotonic() + 5
        while watch.view({}, None)["gpus"] is None and time.monotonic() < deadline:
            time.sleep(0.05)
        view = watch.view({300: 0, 301: 1}, None)  # two ranks, no CUDA_VISIBLE_DEVICES: GPUs 0 and 1
        assert [(g["index"], g["util_percent"], g["error"]) for g in view["gpus"]] == [
            (0, 50, None), (1, None, "[GPU requires reset]")]
        assert view["gpus_age_s"] < 2 and view["gpus_error"] is None
    finally:
        watch.close()
    install_smi(smi, standin_gpus(2), mode="hang")
    watch = node_gpus.GpuWatch(0.5, 0.2)
    try:
        started = time.monotonic()
        first = watch.view({}, None)
        assert time.monotonic() - started < 0.1  # a snapshot never waits on nvidia-smi
        assert first["gpus"] is None and first["gpus_error"].startswith("no answer from nvidia-smi yet")
        time.sleep(1.0)
        assert watch.view({}, None)["gpus_error"] == "nvidia-smi did not answer in 0.5 s: a GPU stuck in the driver?"
    finally:
        watch.close()
    deadline = time.monotonic() + 3
    while processes_mentioning(str(smi)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_mentioning(str(smi)) == []


def test_the_gpu_column_shows_ranks_errors_and_age() -> None:
    from rich.console import Console

    snap = {"load1": 1.0, "cpus": 8, "mem_total_bytes": 1 << 30, "mem_available_bytes": 1 << 29, "ranks": [],
            "gpus": [{"index": 1, "ranks": [4], "error": None, "util_percent": 87, "mem_used_bytes": 10 << 30,
                      "mem_total_bytes": 80 << 30},
                     {"index": 2, "ranks": [], "error": "[Unknown Error]", "util_percent": None,
                      "mem_used_bytes": None, "mem_total_bytes": None}],
            "gpus_age_s": 6.0, "gpus_error": None}
    hung = {**snap, "gpus": None, "gpus_age_s": None,
            "gpus_error": "nvidia-smi did not answer in 10 s: a GPU stuck in the driver?"}
    console = Console(record=True, width=200, color_system=None)
    console.print(node_table([NodeView("node-0", snap), NodeView("node-1", hung)]))
    text = console.export_text()
    assert "1 r4: 87% 10.0 GiB/80.0 GiB  2: [Unknown Error] (6 s old)" in text
    assert "nvidia-smi did not answer in 10 s: a GPU stuck in the driver?" in text


def test_nvidia_smi_gets_its_bound_or_half_a_short_probe_timeout() -> None:
    from launcher.doctor.request import probe_request, session_section

    c = cluster()
    assert probe_request(c, c.hosts[0], "fast", None)["gpu_timeout_s"] == 10.0  # 8 GPUs without persistence mode
    assert probe_request(c, c.hosts[0], "fast", None, 6.0)["gpu_timeout_s"] == 3.0
    assert session_section(c, c.hosts[0], "20260101-000000-abcdef", 4.0)["probe"]["gpu_timeout_s"] == 2.0


def test_a_gpu_watch_closed_while_it_asks_ends_its_thread_quietly(tmp_path: Path, monkeypatch) -> None:
    """`close` kills a call under way and closes its output; the watch's thread, reading that output, ends without an
    exception (it raised `seek of closed file` once in the suite)."""
    import threading

    smi = install_smi(tmp_path / "bin", [gpu(0, used=1000, util=50)])
    monkeypatch.setenv("PATH", f"{smi}:{os.environ['PATH']}")
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    for delay in [i * 0.002 for i in range(40)]:
        watch = node_gpus.GpuWatch(2.0, 0.0)
        time.sleep(delay)
        watch.close()
    time.sleep(0.5)
    assert raised == []
