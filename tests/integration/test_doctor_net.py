"""`inv doctor --net` on 3 real sandbox nodes: every node's figures from a real torchrun job (gloo), and a node made
slow for real (its python stopped 30 ms of every 100, as cpulimit does: it measured 0.67x the median and passed with
a check mark) flagged at the straggler share, its CPU named as the cause, not the network."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from bench.observe import free_port
from tests.helpers import inv
from tests.support.nodeenv import node_python

THROTTLED = """#!/bin/bash
# A slow node's python: the process is stopped 30 ms in every 100 (SIGSTOP, SIGCONT), as cpulimit would make it.
{python} "$@" <&0 &
child=$!
(while kill -0 "$child" 2>/dev/null; do sleep 0.07; kill -STOP "$child" 2>/dev/null; sleep 0.03
 kill -CONT "$child" 2>/dev/null; done) &
wait "$child"
"""


def test_doctor_net_measures_every_node_and_flags_the_slow_one(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(3, master_port=free_port())
    logs = tmp_path / "logs"
    healthy = inv("doctor", "--hosts", str(box.inventory), "--net", "--json", log_dir=logs)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    report = json.loads(healthy.stdout)
    assert "net" in report["checks"] and report["net"]["backend"] == "gloo" and report["net"]["world"] == 3
    assert report["net"]["busbw_gbps"] > 0 and report["net"]["latency_ms"] > 0
    figures = {node: values["net"] for node, values in report["nodes"].items()}
    assert sorted(figures) == ["node-0", "node-1", "node-2"]
    for node, net in figures.items():
        assert net["busbw_gbps"] > 0 and net["latency_ms"] > 0 and not net["slow"], (node, net)
        assert net["compute_ms"] > 0 and not net["slow_compute"], (node, net)
        assert sorted(net["links"]) == sorted({"node-0", "node-1", "node-2"} - {node})

    slow = tmp_path / "slow-python"
    slow.write_text(THROTTLED.format(python=node_python()))
    slow.chmod(0o755)
    inventory = yaml.safe_load(box.inventory.read_text())
    inventory["hosts"] = ["node-0", "node-1", {"name": "node-2", "python": str(slow)}]
    throttled = tmp_path / "throttled.yaml"
    throttled.write_text(yaml.safe_dump(inventory))
    result = inv("doctor", "--hosts", str(throttled), "--net", "--json", log_dir=logs)
    assert result.returncode == 0, result.stdout + result.stderr  # slow is a warning: the run would work, slowly
    report = json.loads(result.stdout)
    assert [node for node, values in report["nodes"].items() if values["net"]["slow"]] == ["node-2"]
    [finding] = [f for f in report["findings"] if f["check"] == "net" and f["status"] != "ok"]
    assert finding["host"] == "node-2" and finding["status"] == "warn"
    assert finding["detail"].startswith("its CPU is slow: the same compute took"), finding  # its CPU, not its link
    assert "the median node's speed" in finding["detail"] and "every all_reduce of the run waits for it" in (
        finding["detail"])
    assert "its network is not the cause" in finding["fix"] and "socket_ifname" not in finding["fix"], finding
    assert report["nodes"]["node-2"]["net"]["slow_compute"]
