"""`inv doctor --net`'s verdict (pure): the job's measurement (launcher/doctor/netjob.py) -> each node's figures and
a `net` finding per node, a node far below the others flagged with what to look at."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from launcher.doctor.evidence import Finding

SLOW_FIX = ("look at the interface this node reaches its peers through (the doctor's iface column; `ip -s link` for "
            "errors and drops), set socket_ifname in the inventory to the fast one (GLOO_SOCKET_IFNAME, "
            "NCCL_SOCKET_IFNAME), and check the MTU on the path (`ip link`: jumbo frames need every hop) and the "
            "link's speed (`ethtool IFACE`)")
CPU_FIX = ("look at what else runs on this node and how fast its cores are (`top`, `uptime`; a CPU quota or "
           "throttling: `cat /sys/fs/cgroup/cpu.max`, `dmesg | grep -i thrott`); its network is not the cause")
NOT_MEASURED = "not measured: a node that fails the checks above cannot join (fix them first)"
FAILED_FIX = ("run `inv doctor` without --net first: a node that fails its checks (dns, port, tcp) cannot join; the "
              "node's own log of the measurement is in the launcher's log folder")


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes} B"


def group_figures(measured: Mapping[str, Any]) -> dict[str, Any]:
    """The whole group's all_reduce: bus bandwidth at the largest size measured, latency at the smallest."""
    done = [g for g in measured.get("group", []) if not g.get("skipped")]
    if not done:
        return {"backend": measured.get("backend"), "world": measured.get("world")}
    small, large = min(done, key=lambda g: g["bytes"]), max(done, key=lambda g: g["bytes"])
    return {"backend": measured.get("backend"), "world": measured.get("world"),
            "busbw_gbps": round(large["busbw_gbps"], 3), "at_bytes": large["bytes"],
            "latency_ms": round(small["time_s"] * 1000, 3), "sizes": list(measured.get("group", []))}


def net_verdict(hosts: Sequence[str], measured: Mapping[str, Any] | None, error: str | None, slow_share: float
                ) -> tuple[list[Finding], dict[str, dict[str, Any]], dict[str, Any]]:
    """(a `net` finding per host, each host's figures, the group's figures) from the measurement, or its failure.

    A node is slow below `slow_share` (the straggler factor) of the median: a slow node slows every all_reduce. Its
    compute, timed on every node in the same step, tells a slow CPU (or GPU) from a slow network: the finding names
    the one that is."""
    if measured is None and error == NOT_MEASURED:
        return [Finding(h, "net", "fail", NOT_MEASURED) for h in hosts], {}, {}
    if measured is None:
        why = f"the network measurement did not finish: {error}"
        return [Finding(h, "net", "fail", why, FAILED_FIX) for h in hosts], {}, {}
    group = group_figures(measured)
    figures: dict[str, dict[str, Any]] = {}
    for host in hosts:
        pairs = [p for p in measured.get("pairs", []) if host in p["nodes"]]
        if not pairs:
            figures[host] = {"busbw_gbps": group.get("busbw_gbps"), "latency_ms": group.get("latency_ms"),
                             "links": {}}
            continue
        figures[host] = {"busbw_gbps": round(max(p["busbw_gbps"] for p in pairs), 3),
                         "latency_ms": round(min(p["latency_ms"] for p in pairs), 3),
                         "links": {next(n for n in p["nodes"] if n != host): round(p["busbw_gbps"], 3)
                                   for p in pairs}}
    known = [f["busbw_gbps"] for f in figures.values() if f.get("busbw_gbps") is not None]
    median = statistics.median(known) if known else None
    computes = {h: float(s) for h, s in (measured.get("compute_s") or {}).items() if h in figures}
    machines = [m for h, m in (measured.get("machines") or {}).items() if h in computes and m]
    # Nodes that share one machine share its cores: their compute says nothing of a node (the sandbox's nodes).
    apart = len(set(machines)) == len(machines)
    compute_median = statistics.median(computes.values()) if len(computes) > 2 and apart else None
    findings = []
    for host in hosts:
        mine = figures[host]
        best = mine.get("busbw_gbps")
        mine["slow"] = bool(median and best is not None and len(known) > 2 and best < slow_share * median)
        took = computes.get(host)
        if took is not None:
            mine["compute_ms"] = round(took * 1000, 2)
        mine["slow_compute"] = bool(compute_median and took is not None and took * slow_share > compute_median)
        said = (f"{best:.2f} Gbit/s to its neighbours, latency {mine['latency_ms']:.2f} ms"
                if best is not None else "no figure")
        if mine["slow_compute"]:
            assert took is not None and compute_median is not None
            findings.append(Finding(host, "net", "warn", f"its CPU is slow: the same compute took {took * 1000:.1f} "
                                    f"ms here against a median of {compute_median * 1000:.1f} ms "
                                    f"({compute_median / took:.2f}x the median node's speed; {said}); every "
                                    "all_reduce of the run waits for it", CPU_FIX))
        elif mine["slow"]:
            same = ", its compute as fast as the others'" if took is not None and compute_median else ""
            findings.append(Finding(host, "net", "warn", f"{said}: {best / median:.2f}x the median node "
                                    f"({median:.2f} Gbit/s){same}; every all_reduce of the run waits for it",
                                    SLOW_FIX))
        else:
            where = (f"; the group of {group.get('world')} ({group.get('backend')}): {group['busbw_gbps']:.2f} Gbit/s "
                     f"at {_size(group['at_bytes'])}" if "busbw_gbps" in group else "")
            findings.append(Finding(host, "net", "ok", said + where))
    return findings, figures, group
