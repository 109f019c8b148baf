"""Canned doctor evidence: a healthy probe answer per node, a cluster of those nodes, the evidence the checks judge,
and the findings of one check."""

from __future__ import annotations

from typing import Any

import yaml

from launcher import doctor
from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster
from launcher.doctor import Evidence, Finding

ADDRS = {"node-0": "10.0.0.1", "node-1": "10.0.0.2", "node-2": "10.0.0.3"}


SHA = "ab" * 32


def device(cuda: int, index: int | None = None, **fields: Any) -> dict[str, Any]:
    """One GPU as the probe lists it among those the run sees (launcher/node/common/gpus.py), idle unless told."""
    index = cuda if index is None else index
    return {"cuda": cuda, "index": index, "uuid": f"GPU-{index:04d}", "name": "H100", "pids": [], "runs": [],
            "unreadable": None, "memory_used_mib": 0.0, "utilization": 0.0, "busy": False, **fields}


def gpus(count: int, driver: str = "570.124.06", **fields: Any) -> dict[str, Any]:
    """The probe's `gpus` for `count` idle H100s (the canned torch is built for CUDA 12.8: driver 570 runs it)."""
    devices = [device(i) for i in range(count)]
    return {"smi": True, "count": count, "total": count, "names": ["H100"], "driver": driver, "devices": devices,
            "spec": None, "mig": False, "busy": [], "unreadable": [], **fields}


def probe(host: str, names: list[str] | None = None) -> dict[str, Any]:
    """A healthy probe answer from `host`, as launcher/node/probe/probe.py prints it."""
    names = names or list(ADDRS)
    return {
        "mode": "probe",
        "hostname": host,
        "python": {"version": "3.11.7", "executable": "/opt/venv/bin/python", "implementation": "CPython"},
        "torch": {"version": "2.13.0", "cuda": "12.8", "cuda_known": True, "nccl": "2.27.3"},
        "resolve": {n: {"addrs": [ADDRS[n]]} for n in names},
        "self": {"hostname": host, "hosts_lines": [f"{ADDRS[host]} {host}"], "addrs": [ADDRS[host]]},
        "workdir": {"path": "/home/u/project", "exists": True},
        "script": {"path": "/home/u/project/train.py", "sha256": SHA, "size": 100},
        "route": {"ip": ADDRS[host], "iface": "eth0"},
        "disk_free": 50 << 30,
        "gpus": gpus(1),
        "ib": [],
        "packages": {"sha256": "p" * 64, "count": 2, "list": ["numpy==2.1.0", "torch==2.13.0"]},
        "tcp": {"ok": True, "peer": ADDRS["node-0"], "attempts": 1, "elapsed": 0.01},
        "elapsed": 0.05,
        "time": 1000.5,
    }


def findings(ev: Evidence, check: str, host: str | None = None) -> list[Finding]:
    out = [f for f in doctor.evaluate(ev) if f.check == check]
    return [f for f in out if f.host == host] if host else out


def problems(ev: Evidence, checks: str = "all") -> list[Finding]:
    return [f for f in doctor.evaluate(ev, checks) if f.status != "ok"]


def make_cluster(nproc: int | str = 1, master_addr: str = "node-0", job: bool = True) -> Cluster:
    """The three canned nodes (ADDRS) in an inventory, the job `train.py` unless `job` is False."""
    data: dict[str, Any] = {
        "defaults": {"python": "/opt/venv/bin/python", "workdir": "~/project", "nproc_per_node": nproc},
        "hosts": list(ADDRS),
        "rendezvous": {"master_addr": master_addr, "master_port": 29500},
    }
    if job:
        data["job"] = {"script": "train.py"}
    return parse_inventory(yaml.safe_dump(data), "hosts/test.yaml")


def evidence(cluster: Cluster | None = None, listener: dict[str, Any] | None = None,
             times: dict[str, float] | None = None, probe_timeout: float = 10.0, **outcomes: Any) -> Evidence:
    """What the checks judge: each node's healthy probe, `outcomes` (node_1=...: node-1's) in place of some, a free
    master port that accepted every peer, each probe 0.4 s unless `times` says."""
    cluster = cluster or make_cluster()
    found: dict[str, Any] = {h.name: probe(h.name) for h in cluster.hosts}
    found.update({k.replace("_", "-"): v for k, v in outcomes.items()})
    return Evidence(cluster, found, listener if listener is not None else {"free": True, "accepted": 3},
                    clock=(1000.0, 1001.0), probe_timeout=probe_timeout,
                    probe_times=times if times is not None else {h.name: 0.4 for h in cluster.hosts})


def only(ev: Evidence, check: str, host: str) -> Finding:
    """The one finding of `check` on `host`."""
    (found,) = findings(ev, check, host)
    return found


def canned_report(ev: Evidence, checks: str = "all") -> doctor.Report:
    """The report `inv doctor` shows of `ev`, judged by `checks`."""
    return doctor.Report(source="hosts/test.yaml", hosts=tuple(ADDRS), checks=doctor.selected_checks(checks),
                         findings=tuple(doctor.evaluate(ev, checks)),
                         probes={h: o if isinstance(o, dict) else None for h, o in ev.outcomes.items()},
                         errors={}, listener=ev.listener, probe_times=ev.probe_times, timings={"total_s": 0.5})
