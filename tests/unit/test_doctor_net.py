"""`inv doctor --net`'s verdict (pure) and its lines in the doctor's table."""

from __future__ import annotations

import io
import json

from rich.console import Console

from launcher.config.inventory import parse_inventory
from launcher.doctor.evidence import Report
from launcher.doctor.net import net_plan
from launcher.doctor.netfigures import NOT_MEASURED, nccl_transport, net_verdict
from launcher.doctor.report import render_table, report_json

HOSTS = ("node-0", "node-1", "node-2")
MEASURED = {"backend": "gloo", "world": 3, "nodes": list(HOSTS),
            "group": [{"bytes": 8, "time_s": 0.0004, "busbw_gbps": 0.0002},
                      {"bytes": 16 << 20, "time_s": 0.02, "busbw_gbps": 9.0},
                      {"bytes": 256 << 20, "skipped": True}],
            "pairs": [{"nodes": ["node-0", "node-1"], "busbw_gbps": 15.0, "latency_ms": 0.1},
                      {"nodes": ["node-1", "node-2"], "busbw_gbps": 3.5, "latency_ms": 0.3},
                      {"nodes": ["node-0", "node-2"], "busbw_gbps": 3.6, "latency_ms": 0.2}]}


def test_a_node_whose_best_link_is_far_below_the_median_nodes_is_flagged_with_the_fix() -> None:
    findings, figures, group = net_verdict(HOSTS, MEASURED, None, 0.5)
    assert {h: f["busbw_gbps"] for h, f in figures.items()} == {"node-0": 15.0, "node-1": 15.0, "node-2": 3.6}
    assert figures["node-2"]["links"] == {"node-1": 3.5, "node-0": 3.6} and figures["node-2"]["slow"]
    assert [(f.host, f.status) for f in findings] == [("node-0", "ok"), ("node-1", "ok"), ("node-2", "warn")]
    assert "0.24x the median node (15.00 Gbit/s)" in findings[2].detail and "socket_ifname" in findings[2].fix
    assert group["busbw_gbps"] == 9.0 and group["at_bytes"] == 16 << 20 and group["latency_ms"] == 0.4
    assert "the group of 3 (gloo): 9.00 Gbit/s at 16 MiB" in findings[0].detail


def test_two_nodes_share_one_link_so_neither_is_blamed_and_a_failed_measurement_fails_each_node() -> None:
    two = {**MEASURED, "world": 2, "pairs": [{"nodes": ["node-0", "node-1"], "busbw_gbps": 1.0, "latency_ms": 1.0}]}
    findings, figures, _ = net_verdict(HOSTS[:2], two, None, 0.5)
    assert [f.status for f in findings] == ["ok", "ok"] and not any(f["slow"] for f in figures.values())
    findings, figures, _ = net_verdict(HOSTS, None, "run X FAILED root cause: ...", 0.5)
    assert [f.status for f in findings] == ["fail"] * 3 and "did not finish: run X FAILED" in findings[0].detail
    assert [f.detail for f in net_verdict(HOSTS, None, NOT_MEASURED, 0.5)[0]] == [NOT_MEASURED] * 3


def test_the_table_says_every_nodes_figures_and_the_json_has_a_net_object_per_node() -> None:
    findings, figures, group = net_verdict(HOSTS, MEASURED, None, 0.5)
    report = Report("c.yaml", HOSTS, ("ssh", "net"), tuple(findings), {h: {} for h in HOSTS}, net=figures,
                    net_group=group)
    out = io.StringIO()
    render_table(report, Console(file=out, width=200))
    text = out.getvalue()
    assert "✓ node-0 net: 15.00 Gbit/s to its neighbours, latency 0.10 ms" in text
    assert "! node-2 net: 3.60 Gbit/s to its neighbours" in text and "fix: look at the interface" in text
    data = json.loads(report_json(report))
    assert data["nodes"]["node-2"]["net"]["slow"] and data["net"]["backend"] == "gloo"


def test_a_node_a_third_slower_is_flagged_at_the_straggler_share_and_a_slow_cpu_is_told_from_a_slow_network() -> None:
    """A node at 0.67x the median passed with a check mark under 0.5; at the straggler factor (0.8) it is flagged, and
    the compute every node timed in the same step says whether its CPU or its network is the slow part."""
    third = {**MEASURED, "pairs": [{"nodes": ["node-0", "node-1"], "busbw_gbps": 9.0, "latency_ms": 0.1},
                                   {"nodes": ["node-1", "node-2"], "busbw_gbps": 6.0, "latency_ms": 0.1},
                                   {"nodes": ["node-0", "node-2"], "busbw_gbps": 6.0, "latency_ms": 0.1}]}
    network = {**third, "compute_s": {"node-0": 0.100, "node-1": 0.102, "node-2": 0.101}}
    findings, figures, _ = net_verdict(HOSTS, network, None, 0.8)
    assert [f.status for f in findings] == ["ok", "ok", "warn"], findings
    assert "0.67x the median node (9.00 Gbit/s), its compute as fast as the others'" in findings[2].detail
    assert "socket_ifname" in findings[2].fix and figures["node-2"]["compute_ms"] == 101.0
    assert [f.status for f in net_verdict(HOSTS, network, None, 0.5)[0]] == ["ok"] * 3  # the old share passed it

    cpu = {**third, "compute_s": {"node-0": 0.100, "node-1": 0.102, "node-2": 0.150}}
    findings, figures, _ = net_verdict(HOSTS, cpu, None, 0.8)
    assert findings[2].status == "warn" and figures["node-2"]["slow_compute"], findings
    assert findings[2].detail.startswith("its CPU is slow: the same compute took 150.0 ms here against a median of "
                                         "102.0 ms (0.68x the median node's speed"), findings[2].detail
    assert "its network is not the cause" in findings[2].fix


# --- NCCL's transport, and the measure over all of a node's GPUs ------------------------------------------------------

IB_LINES = [  # NCCL 2.2x with NCCL_DEBUG=INFO, as a node's log shows them (tagged by the launcher's agent)
    "node-0 r0 | gpu01:81234:81234 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)",
    "node-0 r0 | gpu01:81234:81234 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>",
    "node-0 r0 | gpu01:81234:81234 [0] NCCL INFO Using network IB",
]
SOCKET_LINES = [
    "gpu02:9120:9120 [0] NCCL INFO NET/IB : No device found.",
    "gpu02:9120:9120 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>",
    "gpu02:9120:9120 [0] NCCL INFO Using network Socket",
]
H100_LINES = [
    "node-0:1234:1234 [0] NCCL INFO NET/IB : Using [RO]; OOB eth0:192.0.2.2<0>",
    "node-0:1234:1234 [0] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.2<0>",
    "node-0:1234:1234 [0] NCCL INFO Using network Socket",
]
PORT = {"device": "mlx5_0", "port": "1", "state": "4: ACTIVE", "link_layer": "InfiniBand",
        "rate": "400 Gb/sec (4X NDR)"}


def test_nccls_own_lines_say_its_transport() -> None:
    ib: dict[str, str] = {}
    for line in IB_LINES:
        nccl_transport(line, ib)
    assert (ib["network"], ib["net"]) == ("IB", "IB")
    assert ib["using"] == "NET/IB: [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>"
    sockets: dict[str, str] = {}
    for line in SOCKET_LINES:
        nccl_transport(line, sockets)
    assert (sockets["network"], sockets["using"]) == ("Socket", "NET/Socket: [0]eth0:10.0.0.2<0>")
    # NCCL 2.28 on an H100 without InfiniBand (its IB line as seen there): the IB plugin says a `Using` line with no
    # device, then sockets win.
    h100: dict[str, str] = {}
    for line in H100_LINES:
        nccl_transport(line, h100)
    assert (h100["network"], h100["using"]) == ("Socket", "NET/Socket: [0]eth0:192.0.2.2<0>")
    # Without the `Using network` line, the plugin that named a device is the transport.
    quiet: dict[str, str] = {}
    for line in H100_LINES[:2]:
        nccl_transport(line, quiet)
    assert (quiet["net"], quiet["using"]) == ("Socket", "NET/Socket: [0]eth0:192.0.2.2<0>")


def test_a_fall_back_to_sockets_beside_active_infiniband_is_said_and_a_slow_nodes_fix_fits_its_transport() -> None:
    transport = {"node-0": {"network": "IB", "using": "NET/IB: [0]mlx5_0:1/IB"}, "node-1": {"network": "IB"},
                 "node-2": {"network": "Socket", "using": "NET/Socket: [0]eth0:10.0.0.3<0>"}}
    measured = {**MEASURED, "backend": "nccl", "transport": transport,
                "ib": {"node-0": [PORT], "node-1": [PORT], "node-2": [PORT]}}
    findings, figures, _ = net_verdict(HOSTS, measured, None, 0.5)
    assert [(f.host, f.status) for f in findings] == [("node-0", "ok"), ("node-1", "ok"), ("node-2", "warn"),
                                                      ("node-2", "warn")]
    assert findings[0].detail.endswith("; NCCL over IB (NET/IB: [0]mlx5_0:1/IB)")
    slow, fallback = findings[2:]
    assert "socket_ifname" in slow.fix  # its NCCL runs over sockets: the Ethernet fix
    assert fallback.detail == ("NCCL fell back to sockets (NET/Socket: [0]eth0:10.0.0.3<0>) although "
                               "mlx5_0:1 (InfiniBand) are up here")
    assert "NCCL_IB_HCA" in fallback.fix and "ibstat" in fallback.fix
    assert figures["node-2"]["transport"]["network"] == "Socket"
    # A slow node whose NCCL runs over InfiniBand gets the InfiniBand fix.
    over_ib = {**measured, "transport": {h: {"network": "IB"} for h in HOSTS}}
    (slow,) = [f for f in net_verdict(HOSTS, over_ib, None, 0.5)[0] if f.status != "ok"]
    assert slow.host == "node-2" and "NCCL_IB_HCA" in slow.fix and "ibstat" in slow.fix
    # No InfiniBand on the node: sockets are what it has, nothing to say beyond the transport.
    plain = {**measured, "ib": {}}
    assert [f.status for f in net_verdict(HOSTS, plain, None, 0.5)[0] if f.host == "node-2"] == ["warn"]


def test_the_measure_runs_one_rank_a_node_or_one_a_gpu_and_makes_nccl_say_its_transport() -> None:
    cluster = parse_inventory("defaults: {nproc_per_node: 8, env: {NCCL_DEBUG: WARN, A: b}}\nhosts: [n0, n1]\n",
                              "c.yaml")
    one = net_plan(cluster)
    every = net_plan(cluster, all_gpus=True)
    assert [n.host.nproc_per_node for n in one.nodes] == [1, 1]
    assert [n.host.nproc_per_node for n in every.nodes] == [8, 8]
    assert "--nproc-per-node" in every.nodes[0].argv and "8" in every.nodes[0].argv
    env = {v.name: v.value for v in every.nodes[0].env}
    assert env == {"A": "b", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
