"""`inv doctor --net`'s verdict (pure): the job's measurement (launcher/doctor/netjob.py) -> each node's figures and
a `net` finding per node, a node far below the others flagged with what to look at."""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from launcher.doctor.evidence import Finding
from launcher.paths import hint

SLOW_FIX = (
    "look at the interface this node reaches its peers through (the doctor's iface column; `ip -s link` for "
    "errors and drops), set socket_ifname in the inventory to the fast one (GLOO_SOCKET_IFNAME, "
    "NCCL_SOCKET_IFNAME), and check the MTU on the path (`ip link`: jumbo frames need every hop) and the "
    "link's speed (`ethtool IFACE`)"
)
IB_SLOW_FIX = (
    "look at the HCAs this node's NCCL uses: `ibstat` (every port Active, at the rate its peers have), "
    "`ibv_devinfo`, the fabric's error counters (`perfquery`, `ibqueryerrors`); name the fast ones in "
    "NCCL_IB_HCA (NCCL_IB_HCA=mlx5_0,mlx5_1) and check each GPU's nearest NIC (`nvidia-smi topo -m`)"
)
FALLBACK_FIX = (
    "NCCL's NET/IB was not used: check that NCCL_IB_DISABLE is not 1, that NCCL_IB_HCA (if set) names "
    "these HCAs, that `ibstat` shows their ports Active, and that the verbs library (rdma-core, "
    "libibverbs) is installed where the run's NCCL looks; NCCL_DEBUG=INFO says why it chose sockets"
)
_NET_USING = re.compile(r"NCCL INFO NET/(\w+)\s*:\s*Using\s+(.*\S)")
_NETWORK = re.compile(r"NCCL INFO Using network (.*\S)")
_DEVICE = re.compile(r"\[\d+\]")
CPU_FIX = (
    "look at what else runs on this node and how fast its cores are (`top`, `uptime`; a CPU quota or "
    "throttling: `cat /sys/fs/cgroup/cpu.max`, `dmesg | grep -i thrott`); its network is not the cause"
)
NOT_MEASURED = "not measured: a node that fails the checks above cannot join (fix them first)"
FAILED_FIX = (
    "run the doctor without --net first (`{doctor}`): a node that fails its checks (dns, port, tcp) cannot "
    "join; the node's own log of the measurement is in the launcher's log folder"
)
"""A failed measurement's fix, `{doctor}` the doctor's command (`launcher.paths.hint`)."""


def nccl_transport(line: str, seen: dict[str, str]) -> None:
    """Note in `seen` what an NCCL_DEBUG=INFO line says of its transport: `network` (`Using network IB`, or
    `Socket`: the fallback), `using` (the devices of the network it chose: `NET/IB : Using [0]mlx5_0:1/IB ...`), `net`
    (the first plugin that named a device, where no `Using network` line came)."""
    network = _NETWORK.search(line)
    if network is not None:
        seen.setdefault("network", network.group(1))
    using = _NET_USING.search(line)
    # Each plugin that loads says its line, the chosen one or not; NCCL 2.28's IB plugin says `Using [RO]; OOB eth0`
    # with no device at all (seen on an H100 without InfiniBand, before `Using network Socket`).
    if using is not None and _DEVICE.search(using.group(2)):
        seen.setdefault(f"NET/{using.group(1)}", using.group(2))
        seen.setdefault("net", using.group(1))
    chosen = seen.get("network") or seen.get("net")
    if chosen is not None and f"NET/{chosen}" in seen:
        seen.setdefault("using", f"NET/{chosen}: {seen[f'NET/{chosen}']}")


def _active_ib(ports: list[dict[str, Any]]) -> list[str]:
    return [
        f"{p['device']}:{p['port']} ({p.get('link_layer') or '?'})"
        for p in ports
        if (p.get("state") or "").endswith("ACTIVE")
    ]


def transport_said(host: str, measured: Mapping[str, Any]) -> tuple[str, Finding | None, str]:
    """What the measurement's NCCL used on `host` (a note for its line), a warning where it fell back to sockets
    although the node has active InfiniBand/RoCE ports, and the fix that fits a slow link of that transport."""
    if measured.get("backend") != "nccl":
        return "", None, SLOW_FIX
    seen = (measured.get("transport") or {}).get(host) or {}
    network = seen.get("network") or seen.get("net")
    if network is None:
        return "; NCCL's transport not seen (no NCCL_DEBUG=INFO line)", None, SLOW_FIX
    note = f"; NCCL over {network}" + (f" ({seen['using']})" if seen.get("using") else "")
    active = _active_ib((measured.get("ib") or {}).get(host) or [])
    if network.lower().startswith("socket") and active:
        return (
            note,
            Finding(
                host,
                "net",
                "warn",
                f"NCCL fell back to sockets ({seen.get('using') or network}) although {', '.join(active)} are up here",
                FALLBACK_FIX,
            ),
            SLOW_FIX,
        )
    return note, None, IB_SLOW_FIX if network.upper().startswith("IB") else SLOW_FIX


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes} B"


def group_figures(measured: Mapping[str, Any]) -> dict[str, Any]:
    """The whole group's all_reduce: bus bandwidth at the largest size measured, latency at the smallest."""
    done = [g for g in measured.get("group", []) if not g.get("skipped")]
    if not done:
        return {"backend": measured.get("backend"), "world": measured.get("world")}
    small, large = min(done, key=lambda g: g["bytes"]), max(done, key=lambda g: g["bytes"])
    return {
        "backend": measured.get("backend"),
        "world": measured.get("world"),
        "busbw_gbps": round(large["busbw_gbps"], 3),
        "at_bytes": large["bytes"],
        "latency_ms": round(small["time_s"] * 1000, 3),
        "sizes": list(measured.get("group", [])),
    }


def net_verdict(
    hosts: Sequence[str], measured: Mapping[str, Any] | None, error: str | None, slow_share: float
) -> tuple[list[Finding], dict[str, dict[str, Any]], dict[str, Any]]:
    """(a `net` finding per host, each host's figures, the group's figures) from the measurement, or its failure.

    A node is slow below `slow_share` (the straggler factor) of the median: a slow node slows every all_reduce. Its
    compute, timed on every node in the same step, tells a slow CPU (or GPU) from a slow network: the finding names
    the one that is. Under NCCL each line says its transport (`measured["transport"]`, from NCCL's own lines), a
    fall back to sockets beside active InfiniBand ports (`measured["ib"]`, the probes') is a warning, and a slow
    node's fix fits its transport (InfiniBand or Ethernet)."""
    if measured is None and error == NOT_MEASURED:
        return [Finding(h, "net", "fail", NOT_MEASURED) for h in hosts], {}, {}
    if measured is None:
        why = f"the network measurement did not finish: {error}"
        fix = FAILED_FIX.format(doctor=hint("doctor", "api.doctor(HOSTS)"))
        return [Finding(h, "net", "fail", why, fix) for h in hosts], {}, {}
    group = group_figures(measured)
    figures = _figures(hosts, measured, group)
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
        note, fallback, fix = transport_said(host, measured)
        mine["transport"] = (measured.get("transport") or {}).get(host)
        findings.append(_host_finding(host, mine, took, compute_median, median, group, fix, note))
        findings += [fallback] if fallback is not None else []
    return findings, figures, group


def _figures(hosts: Sequence[str], measured: Mapping[str, Any], group: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each host's best link and latency among the pairs it is in, and each link's figure."""
    figures: dict[str, dict[str, Any]] = {}
    for host in hosts:
        pairs = [p for p in measured.get("pairs", []) if host in p["nodes"]]
        if not pairs:
            figures[host] = {"busbw_gbps": group.get("busbw_gbps"), "latency_ms": group.get("latency_ms"), "links": {}}
            continue
        figures[host] = {
            "busbw_gbps": round(max(p["busbw_gbps"] for p in pairs), 3),
            "latency_ms": round(min(p["latency_ms"] for p in pairs), 3),
            "links": {next(n for n in p["nodes"] if n != host): round(p["busbw_gbps"], 3) for p in pairs},
        }
    return figures


def _host_finding(
    host: str,
    mine: Mapping[str, Any],
    took: float | None,
    compute_median: float | None,
    median: float | None,
    group: Mapping[str, Any],
    fix: str,
    note: str,
) -> Finding:
    """One host's `net` finding: its CPU slow, its network slow (with the fix of its transport), or its figures."""
    best = mine.get("busbw_gbps")
    said = (
        f"{best:.2f} Gbit/s to its neighbours, latency {mine['latency_ms']:.2f} ms" if best is not None else "no figure"
    )
    if mine["slow_compute"]:
        assert took is not None and compute_median is not None
        return Finding(
            host,
            "net",
            "warn",
            f"its CPU is slow: the same compute took {took * 1000:.1f} "
            f"ms here against a median of {compute_median * 1000:.1f} ms "
            f"({compute_median / took:.2f}x the median node's speed; {said}); every "
            "all_reduce of the run waits for it",
            CPU_FIX,
        )
    if mine["slow"]:
        assert best is not None and median is not None
        same = ", its compute as fast as the others'" if took is not None and compute_median else ""
        return Finding(
            host,
            "net",
            "warn",
            f"{said}: {best / median:.2f}x the median node ({median:.2f} Gbit/s)"
            f"{same}; every all_reduce of the run waits for it{note}",
            fix,
        )
    where = (
        f"; the group of {group.get('world')} ({group.get('backend')}): {group['busbw_gbps']:.2f} Gbit/s "
        f"at {_size(group['at_bytes'])}"
        if "busbw_gbps" in group
        else ""
    )
    return Finding(host, "net", "ok", said + where + note)
