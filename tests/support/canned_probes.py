"""Canned doctor evidence: a healthy probe answer per node, and the findings of one check."""

from __future__ import annotations

from typing import Any

from launcher import doctor
from launcher.doctor import Evidence, Finding

ADDRS = {"node-0": "10.0.0.1", "node-1": "10.0.0.2", "node-2": "10.0.0.3"}


SHA = "ab" * 32


def device(cuda: int, index: int | None = None, **fields: Any) -> dict[str, Any]:
    """One GPU as the probe lists it among those the run sees (launcher/node/gpus.py), idle unless told."""
    index = cuda if index is None else index
    return {"cuda": cuda, "index": index, "uuid": f"GPU-{index:04d}", "name": "H100", "pids": [], "runs": [],
            "unreadable": None, "memory_used_mib": 0.0, "utilization": 0.0, "busy": False, **fields}


def gpus(count: int, driver: str = "570.124.06", **fields: Any) -> dict[str, Any]:
    """The probe's `gpus` for `count` idle H100s (the canned torch is built for CUDA 12.8: driver 570 runs it)."""
    devices = [device(i) for i in range(count)]
    return {"smi": True, "count": count, "total": count, "names": ["H100"], "driver": driver, "devices": devices,
            "spec": None, "mig": False, "busy": [], "unreadable": [], **fields}


def probe(host: str, names: list[str] | None = None) -> dict[str, Any]:
    """A healthy probe answer from `host`, as launcher/node/probe.py prints it."""
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
