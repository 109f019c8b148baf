"""The doctor's checks of names and ports, on canned probe data: names a node cannot resolve or that nodes resolve
differently, the 127.0.1.1 trap, the master port taken or out of a worker's reach."""

from __future__ import annotations

import yaml

from launcher import doctor
from launcher.config.inventory import parse_inventory
from launcher.doctor import Evidence
from tests.support.canned_probes import ADDRS, evidence, findings, make_cluster, only, probe, problems


def test_unresolvable_name_gives_the_exact_hosts_line() -> None:
    blind = probe("node-1")
    blind["resolve"]["node-0"] = {"error": "gai error -2: Name or service not known"}
    found = only(evidence(node_1=blind), "dns", "node-1")
    assert found.status == "fail"
    assert found.detail == "node-1 cannot resolve node-0 (gai error -2: Name or service not known)"
    assert found.fix == 'add "10.0.0.1 node-0" to /etc/hosts on node-1'
    assert only(evidence(node_1=blind), "dns", "node-0").status == "ok"


def test_nodes_disagreeing_on_an_address() -> None:
    odd = probe("node-2")
    odd["resolve"]["node-1"] = {"addrs": ["10.9.9.9"]}
    found = only(evidence(node_2=odd), "dns", "node-2")
    assert found.detail == "node-2 resolves node-1 to 10.9.9.9, node-0, node-1 to 10.0.0.2"
    assert found.fix == 'make node-1 resolve to 10.0.0.2 on node-2: "10.0.0.2 node-1" in its /etc/hosts, or fix DNS'


def test_a_master_alias_nobody_resolves() -> None:
    cluster = make_cluster(master_addr="master.internal")
    outcomes = {}
    for host in ADDRS:
        p = probe(host)
        p["resolve"]["master.internal"] = {"error": "gai error -2: Name or service not known"}
        outcomes[host] = p
    ev = Evidence(cluster, outcomes, {"free": True})
    for host in ADDRS:
        found = only(ev, "dns", host)
        assert found.status == "fail"
        assert found.fix.startswith("no node can resolve master.internal: fix the name in hosts/test.yaml")


def test_the_127_0_1_1_trap() -> None:
    trapped = probe("node-1")
    trapped["self"] = {"hostname": "node-1", "hosts_lines": ["127.0.1.1 node-1"], "addrs": ["127.0.1.1"]}
    trapped["resolve"]["node-1"] = {"addrs": ["127.0.1.1"]}  # its own view of its name: not a dns finding
    ev = evidence(node_1=trapped)
    found = only(ev, "hostname", "node-1")
    assert found.status == "fail"
    assert found.detail.startswith("node-1 resolves to 127.0.1.1 on node-1, but its peers reach it at 10.0.0.2")
    assert found.fix == 'on node-1, replace "127.0.1.1 node-1" in /etc/hosts with "10.0.0.2 node-1"'
    assert {(f.host, f.check) for f in problems(ev)} == {("node-1", "hostname")}


def test_peers_given_by_address_are_not_resolved_and_the_trap_is_still_found() -> None:
    cluster = parse_inventory(yaml.safe_dump({
        "defaults": {"python": "/opt/venv/bin/python", "workdir": "~/project"}, "job": {"script": "train.py"},
        "hosts": [{"name": n, "addr": a} for n, a in ADDRS.items()],
        "rendezvous": {"master_addr": ADDRS["node-0"], "master_port": 29500}}), "hosts/ips.yaml")
    assert doctor.requested_names(cluster) == []  # an address is what it resolves to: no node is asked
    outcomes = {h.name: {**probe(h.name), "resolve": {}} for h in cluster.hosts}
    outcomes["node-1"]["self"] = {"hostname": "node-1", "hosts_lines": ["127.0.1.1 node-1"], "addrs": ["127.0.1.1"]}
    ev = Evidence(cluster, outcomes, {"free": True})
    assert only(ev, "dns", "node-0").detail == "every peer and the master are given by address: nothing to resolve"
    trap = only(ev, "hostname", "node-1")
    assert trap.status == "fail" and trap.fix == 'on node-1, replace "127.0.1.1 node-1" in /etc/hosts with ' \
                                                  '"10.0.0.2 node-1"'
    assert only(ev, "hostname", "node-2").status == "ok"


def test_hostname_on_another_routable_address_only_warns_and_unresolvable_fails() -> None:
    other = probe("node-1")
    other["self"] = {"hostname": "gpu1", "hosts_lines": [], "addrs": ["192.168.5.2"]}
    found = only(evidence(node_1=other), "hostname", "node-1")
    assert found.status == "warn"
    assert found.fix == 'make gpu1 resolve to 10.0.0.2 on node-1 ("10.0.0.2 gpu1" in /etc/hosts)'
    lost = probe("node-2")
    lost["self"] = {"hostname": "gpu2", "hosts_lines": [], "error": "gai error -2: Name or service not known"}
    found = only(evidence(node_2=lost), "hostname", "node-2")
    assert found.status == "fail"
    assert found.fix == 'add "10.0.0.3 gpu2" to /etc/hosts on node-2'


def test_master_port_taken_names_the_holder_and_skips_the_tcp_check() -> None:
    listener = {"free": False, "error": "[Errno 98] Address already in use", "states": ["listening"],
                "holders": [{"pid": 4242, "command": "python -m torch.distributed.run", "state": "listening"}]}
    ev = evidence(listener=listener)
    found = only(ev, "port", "node-0")
    assert found.status == "fail"
    assert found.detail == ("master_port 29500 is taken on node-0 ([Errno 98] Address already in use): "
                            "pid 4242 (python -m torch.distributed.run) listening")
    assert found.fix == "stop pid 4242 on node-0, or set rendezvous.master_port to a free port"
    assert findings(ev, "tcp") == []
    assert findings(ev, "port", "node-1") == []
    # torchrun's store of a run of the launcher's (seen on an H100: a doctor beside a running run)
    ours = {**listener, "holders": [{"pid": 1035, "command": "/opt/torch/.venv/bin/python3 -m torch.distributed.run "
                                     "--nnodes 2", "state": "listening", "run": "20261126-120846-665ea5/node-0"}]}
    found = only(evidence(listener=ours), "port", "node-0")
    assert found.detail.endswith(": pid 1035 (launcher run 20261126-120846-665ea5: /opt/torch/.venv/bin/python3 -m "
                                 "torch.di) listening"), found.detail
    assert found.fix.startswith("stop run 20261126-120846-665ea5 (`inv stop --hosts ") and found.fix.endswith(
        " --run 20261126-120846-665ea5`), or set rendezvous.master_port to a free port"), found.fix
    # whose it is: the node says its user and the inventory it was started from (another one here)
    theirs = {**ours, "holders": [{**ours["holders"][0], "user": "ana", "inventory": "/home/ana/hosts/big.yaml"}]}
    assert only(evidence(listener=theirs), "port", "node-0").fix == (
        "stop run 20261126-120846-665ea5 (ana's, started from /home/ana/hosts/big.yaml: `inv stop --hosts "
        "/home/ana/hosts/big.yaml --run 20261126-120846-665ea5`), or set rendezvous.master_port to a free port")
    failed = only(evidence(listener={"failed": "node-0: refused: gone"}), "port", "node-0")
    assert failed.status == "fail" and "could not check port 29500" in failed.detail


def test_worker_that_cannot_reach_the_master_port() -> None:
    refused = probe("node-1")
    refused["tcp"] = {"ok": False, "error": "[Errno 111] Connection refused", "attempts": 40}
    other = probe("node-2")
    other["tcp"] = {"ok": False, "error": "something else answers on node-0:29500 (not the doctor's listener)"}
    ev = evidence(node_1=refused, node_2=other)
    found = only(ev, "tcp", "node-1")
    assert found.detail == "node-1 cannot open a TCP connection to node-0:29500: [Errno 111] Connection refused"
    assert "let node-1 reach TCP port 29500 on node-0" in found.fix
    assert "leads to another machine from node-2" in only(ev, "tcp", "node-2").fix
    assert only(ev, "tcp", "node-0").status == "ok"
