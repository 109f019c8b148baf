"""The doctor: pure checks on canned probe data, the probe script run locally, then real sshd sandboxes."""

from __future__ import annotations

import ast
import copy
import dataclasses
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from devtools.observe import free_port
from launcher import doctor
from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster
from launcher.doctor import Evidence, Finding, ProbeFailed
from launcher.doctor import checklist as checks_module
from launcher.doctor.collect import doctor_gate
from launcher.errors import DoctorFailed, LauncherError, NodeFailure
from launcher.events import NodeFacts
from launcher.options import DEFAULT_PROBE_TIMEOUT, Options
from launcher.transport.program import BOOTSTRAP
from tests.support.canned_probes import ADDRS, findings, gpus, probe, problems
from tests.support.nodeenv import node_python
from tests.support.proberun import run_probe


def make_cluster(nproc: int | str = 1, master_addr: str = "node-0", job: bool = True) -> Cluster:
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
    cluster = cluster or make_cluster()
    found: dict[str, Any] = {h.name: probe(h.name) for h in cluster.hosts}
    found.update({k.replace("_", "-"): v for k, v in outcomes.items()})
    return Evidence(cluster, found, listener if listener is not None else {"free": True, "accepted": 3},
                    clock=(1000.0, 1001.0), probe_timeout=probe_timeout,
                    probe_times=times if times is not None else {h.name: 0.4 for h in cluster.hosts})


def only(ev: Evidence, check: str, host: str) -> Finding:
    (found,) = findings(ev, check, host)
    return found


# ---------------------------------------------------------------------------------------------------------
# Pure checks.


def test_healthy_cluster_is_all_ok_with_one_finding_per_node_and_check() -> None:
    ev = evidence()
    found = doctor.evaluate(ev)
    assert [f for f in found if f.status != "ok"] == []
    for host in ADDRS:
        checks = [f.check for f in found if f.host == host]
        expected = [c for c in doctor.CHECKS if c != "port" or host == "node-0"]
        assert checks == expected, host
    assert only(ev, "port", "node-0").detail == "port 29500 is free on node-0"
    assert only(ev, "gpus", "node-1").detail == "1 GPU(s) H100, driver 570.124.06, nproc_per_node 1"


def test_fast_mode_runs_only_the_checks_that_matter_for_starting() -> None:
    ev = evidence(node_1={**probe("node-1"), "disk_free": 1, "packages": {"sha256": "x", "count": 0, "list": []}})
    assert {f.check for f in doctor.evaluate(ev, "fast")} == set(doctor.FAST_CHECKS)
    assert problems(ev, "fast") == []
    assert {f.check for f in problems(ev, "all")} == {"disk", "packages"}
    with pytest.raises(ValueError, match="'all' or 'fast'"):
        doctor.evaluate(ev, "quick")


def test_each_check_is_registered_once_in_column_order_and_fast_ones_are_marked() -> None:
    assert doctor.CHECKS == ("ssh", "python", "torch", "dns", "hostname", "port", "tcp", "script",
                             "gpus", "packages", "disk", "clock", "iface")
    assert doctor.FAST_CHECKS == ("ssh", "python", "torch", "dns", "hostname", "port", "tcp", "script", "gpus")
    assert doctor.selected_checks("all") == doctor.CHECKS and doctor.selected_checks("fast") == doctor.FAST_CHECKS
    with pytest.raises(ValueError, match="'dns' is registered twice"):
        doctor.check("dns")(lambda ev: [])
    assert doctor.CHECKS == checks_module.CHECKS  # the refused registration left the registry as it was
    ev = evidence(node_1=ProbeFailed(127, "no python"), node_2=NodeFailure("node-2", "refused", "refused", "fix"))
    for name in doctor.CHECKS:  # each function's findings carry the name it was registered under
        assert {f.check for f in checks_module.check_function(name)(evidence())} == {name}
        assert {f.check for f in checks_module.check_function(name)(ev)} <= {name}


def test_task_help_and_preflight_line_name_the_registered_fast_checks() -> None:
    import tasks

    names = ", ".join(doctor.FAST_CHECKS)
    assert f"({names})" in tasks.doctor.help["fast"] and f"({names})" in tasks.launch.help["skip-doctor"]
    err = io.StringIO()
    gate = doctor_gate(Options(), err)  # launch's: the checks run in the agents' sessions, then this
    gate.judge(make_cluster(), {h: _facts(h) for h in ADDRS}, (1000.0, 1001.0), 0.43)
    assert err.getvalue() == (f"checked {len(doctor.FAST_CHECKS)} things on 3 node(s) in 0.4s: {names} all passed "
                              "(--skip-doctor skips)\n")


def _facts(host: str, **fields: Any) -> NodeFacts:
    """What a node's agent session says when its probe answers (the master's listener was free; tcp reached)."""
    answer = probe(host)
    tcp = answer.pop("tcp", None)
    listener = {"free": True, "accepted": 0, "peers": []} if host == "node-0" else None
    return NodeFacts(**{"probe": answer, "listener": listener, "tcp": tcp, "took": 0.4, **fields})


def test_doctor_gate_passes_a_slow_node_and_shows_its_warning() -> None:
    err = io.StringIO()
    gate = doctor_gate(Options(probe_timeout=120.0, connect_timeout=7.0), err)
    assert (gate.probe_timeout, gate.ssh.connect_timeout) == (120.0, 7.0)  # two limits, each passed as itself
    facts = {"node-0": _facts("node-0", took=0.4), "node-1": _facts("node-1", took=0.5),
             "node-2": _facts("node-2", took=38.2)}
    gate.judge(make_cluster(), facts, (1000.0, 1001.0), 38.5)
    first, second = err.getvalue().splitlines()
    assert first.endswith("all passed (--skip-doctor skips)")
    assert second == ("  warning: node-2 python: node-2's probe took 38.2 s (the others 0.4-0.5 s): a cold start of "
                      "its python (a network filesystem?) or a loaded node; launch will wait for it")


def test_doctor_gate_judges_what_the_sessions_said_and_raises_with_the_fix() -> None:
    err = io.StringIO()
    gate = doctor_gate(Options(probe_timeout=5.0), err)
    facts = {"node-0": _facts("node-0"), "node-1": NodeFacts(timed_out=True, took=5.0),
             "node-2": NodeFacts(exit_code=127, messages=("sh: 1: /opt/venv/bin/python: not found",))}
    with pytest.raises(DoctorFailed, match="nothing was started") as caught:
        gate.judge(make_cluster(), facts, (1000.0, 1001.0), 5.1)
    text = str(caught.value)
    assert "  node-1 python: the probe did not answer within 5 s (probe_timeout)" in text
    assert "  node-2 python: python /opt/venv/bin/python cannot run on node-2: sh: 1: /opt/venv/bin/python: " in text
    assert err.getvalue() == ""  # no `all passed` line
    taken = {"free": False, "error": "[Errno 98] Address already in use", "holders": [], "states": ["listening"]}
    with pytest.raises(DoctorFailed, match="master_port 29500 is taken on node-0"):
        gate.judge(make_cluster(), {**{h: _facts(h) for h in ADDRS}, "node-0": _facts("node-0", listener=taken)},
                   (1000.0, 1001.0), 0.5)


@pytest.mark.parametrize(("kind", "detail", "fix"), [
    ("refused", "connection refused by 10.0.0.3:22", "is sshd running on the node, and is the port right?"),
    ("auth", "root@10.0.0.3:22 refused every key offered", "check `user` and `identity_file`"),
    ("host-key-changed", "the host key of 10.0.0.3:22 differs", "ssh-keygen -R 10.0.0.3"),
])
def test_ssh_failures_keep_their_kind_and_fix(kind: str, detail: str, fix: str) -> None:
    ev = evidence(node_2=NodeFailure("node-2", kind, detail, fix))
    assert only(ev, "ssh", "node-2") == Finding("node-2", "ssh", "fail", f"{kind}: {detail}", fix)
    assert [f.check for f in doctor.evaluate(ev) if f.host == "node-2"] == ["ssh"]  # nothing else guessed
    assert [f for f in problems(ev) if f.host != "node-2"] == []


def test_missing_python_is_named_with_the_inventory_fix() -> None:
    ev = evidence(node_1=ProbeFailed(127, "bash: line 1: /opt/venv/bin/python: No such file or directory\n"))
    found = only(ev, "python", "node-1")
    assert found.status == "fail"
    assert "/opt/venv/bin/python cannot run on node-1" in found.detail
    assert "No such file or directory" in found.detail
    assert "set `python:` for node-1" in found.fix


def test_probe_that_runs_out_of_time_or_crashes() -> None:
    ev = evidence(node_1=ProbeFailed(-1), node_2=ProbeFailed(1, "SyntaxError: invalid syntax"),
                  times={"node-0": 0.4, "node-1": 10.0, "node-2": 0.3})
    silent = only(ev, "python", "node-1")
    assert (silent.status, silent.detail) == ("fail", "the probe did not answer within 10 s (probe_timeout)")
    assert silent.fix.startswith("is node-1 overloaded, or does its python hang at start? "
                                 "try `ssh node-1 /opt/venv/bin/python -c pass`")
    assert silent.fix.endswith("raise --probe-timeout (launcher.probe_timeout in invoke.yaml)")
    crashed = only(ev, "python", "node-2")
    assert crashed.detail == "the probe gave no answer (exit 1): SyntaxError: invalid syntax"
    assert "3.8 or newer" in crashed.fix


def test_a_wrapper_that_prints_after_python_ends_is_no_failure() -> None:
    """`python:` a script that prints a line once python has answered (`wrapper-done`), or before it starts: the
    answer is the probe's JSON line, whatever the wrapper adds or exits with, as the launch's gate reads it."""
    from launcher.doctor.collect import _outcome
    from launcher.transport.channel import Result

    answer = json.dumps(probe("node-1"))
    for out, code in ((f"{answer}\nwrapper-done\n", 0), (f"activating\n{answer}\n", 0), (f"{answer}\nbye\n", 1)):
        assert _outcome(Result(code, out.encode(), b"")) == probe("node-1"), out
    silent = _outcome(Result(0, b"wrapper-done\n", b""))
    assert silent == ProbeFailed(0, "", "wrapper-done\n") and silent.said == "wrapper-done"
    refused = _outcome(Result(2, b'{"mode": "probe", "error": "no checks"}\n', b"probe: no checks\n"))
    assert isinstance(refused, ProbeFailed) and refused.said == "probe: no checks"


def test_slow_probe_limit_is_an_outlier_among_peers_or_past_half_the_limit() -> None:
    # Typical (the median) 0.5 s: 2 s more is the bar; twice as long would be noise at that size.
    assert doctor.slow_probe_limit([0.4, 0.5, 38.2], 120.0) == pytest.approx(0.5 + doctor.SLOW_PROBE_MARGIN_S)
    assert doctor.slow_probe_limit([0.4, 3.9], 20.0) == pytest.approx(2.4)  # one of two: the faster sets the norm
    # A shared slow start (64 nodes on 2 cores): twice the typical node's time.
    assert doctor.slow_probe_limit([20.0, 25.0, 30.0, 35.0], 120.0) == pytest.approx(50.0)
    # ... and never more than half the limit, whatever the others took.
    assert doctor.slow_probe_limit([40.0, 45.0, 50.0], 120.0) == 120.0 * doctor.SLOW_PROBE_SHARE
    assert doctor.slow_probe_limit([70.0], 120.0) == 60.0
    assert doctor.slow_probe_limit([70.0], None) == 140.0
    assert doctor.slow_probe_limit([], 120.0) == float("inf")


def test_a_slow_probe_is_a_warning_with_its_time_not_a_failure() -> None:
    ev = evidence(times={"node-0": 3.1, "node-1": 38.2, "node-2": 5.0}, probe_timeout=120.0)
    slow = problems(ev)
    assert [(f.host, f.check, f.status) for f in slow] == [("node-1", "python", "warn")]
    assert slow[0].detail == ("node-1's probe took 38.2 s (the others 3.1-5.0 s): a cold start of its python "
                              "(a network filesystem?) or a loaded node; launch will wait for it")
    assert "`ssh node-1 uptime`" in slow[0].fix and "wait up to --probe-timeout (120 s now)" in slow[0].fix
    assert [f.status for f in findings(ev, "python", "node-1")] == ["ok", "warn"]  # its version finding stays
    assert problems(ev, "fast") == slow  # launch's preflight sees it too, and a warning never stops a launch
    assert _report(ev, "fast").ok


def test_probes_all_slow_together_are_not_warned_about_until_past_half_the_limit() -> None:
    shared = evidence(times={"node-0": 30.0, "node-1": 41.0, "node-2": 35.0}, probe_timeout=120.0)
    assert problems(shared) == []
    late = evidence(times={"node-0": 70.0, "node-1": 71.0, "node-2": 72.5}, probe_timeout=120.0)
    assert [f.host for f in problems(late)] == ["node-0", "node-1", "node-2"]
    assert [f.status for f in findings(late, "python", "node-0")] == ["ok", "warn"]
    warned = next(f for f in problems(late) if f.host == "node-2")
    assert warned.detail.startswith("node-2's probe took 72.5 s (of the 120 s allowed): ")


def test_the_default_probe_timeout_fits_a_cold_start_and_the_listener_outlives_it() -> None:
    # A cold Python start on a network filesystem takes tens of seconds: the default leaves room for it, the
    # probe's own worst case (DNS budget, refused-connection window, token wait) fits easily, and the master's
    # listener is asked to live longer than any probe may take.
    from launcher.node import bounds

    assert DEFAULT_PROBE_TIMEOUT >= 60
    connect = doctor.connect_section("t", DEFAULT_PROBE_TIMEOUT)
    assert bounds.RESOLVE_BUDGET_S + connect["window"] + connect["token_read_s"] < DEFAULT_PROBE_TIMEOUT
    assert doctor.listen_request(make_cluster(), "t", DEFAULT_PROBE_TIMEOUT)["max_s"] > DEFAULT_PROBE_TIMEOUT


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
    """launcher.node.facts.python_wrapper, run for real: the interpreter itself (or a link to it) is no wrapper; a
    script that runs it is, and one that stays as its parent does not exec."""
    link = tmp_path / "python"
    link.symlink_to(sys.executable)
    stays, execs = tmp_path / "stays", tmp_path / "execs"
    ask = "from launcher.node.facts import python_wrapper as w; import json, sys; print(json.dumps(w(sys.argv[1])))"
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
    assert "torch==2.13.0" in gone.fix
    assert only(ev, "torch", "node-1").detail == "torch built for CUDA 12.1 here, 12.8 on node-2, node-3"
    warned = only(ev, "torch", "node-2")
    assert (warned.status, warned.detail) == ("warn", "NCCL 2.21.5 here, 2.27.3 on node-1, node-3")
    assert only(ev, "torch", "node-3").detail == "torch 2.13.0, CUDA 12.8, NCCL 2.27.3"


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


# ---------------------------------------------------------------------------------------------------------
# Output, the launch path, the command line.


def _report(ev: Evidence, checks: str = "all") -> doctor.Report:
    return doctor.Report(source="hosts/test.yaml", hosts=tuple(ADDRS), checks=doctor.selected_checks(checks),
                         findings=tuple(doctor.evaluate(ev, checks)),
                         probes={h: o if isinstance(o, dict) else None for h, o in ev.outcomes.items()},
                         errors={}, listener=ev.listener, probe_times=ev.probe_times, timings={"total_s": 0.5})


def test_render_table_marks_each_check_and_lists_each_fix() -> None:
    blind = probe("node-1")
    blind["resolve"]["node-0"] = {"error": "gai error -2: Name or service not known"}
    low = probe("node-2")
    low["disk_free"] = 1 << 20
    console = Console(record=True, width=200, color_system=None)
    doctor.render_table(_report(evidence(node_1=blind, node_2=low)), console)
    text = console.export_text()
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ node-")}
    assert rows["node-1"].count("✗") == 1 and rows["node-2"].count("!") == 1
    assert rows["node-0"].count("✓") == len(doctor.CHECKS)
    assert '✗ node-1 dns: node-1 cannot resolve node-0' in text
    assert 'fix: add "10.0.0.1 node-0" to /etc/hosts on node-1' in text
    assert "1 failure(s), 1 warning(s)" in text


def test_render_table_prints_names_details_and_fixes_as_plain_text_not_markup() -> None:
    odd = "x[/]y"
    report = doctor.Report(
        source="hosts/[bold]odd[/].yaml", hosts=("node-0", odd), checks=("ssh", "dns"),
        findings=(Finding("node-0", "ssh", "ok", "connected"),
                  Finding(odd, "ssh", "fail", "refused: [/] and [red]x[/red]", "fix [/] it [link=x]"),
                  Finding(odd, "dns", "warn", "[/]")),
        probes={"node-0": None, odd: None}, timings={"total_s": 0.5})
    console = Console(record=True, width=200, color_system=None)
    doctor.render_table(report, console)
    text = console.export_text()
    assert "".join(text.split()).startswith("doctor:2node(s)fromhosts/[bold]odd[/].yaml")  # wrapped to the table
    rows = [line.split()[1::2] for line in text.splitlines() if line.startswith("│ ")]
    assert rows == [["node-0", "·", "✓", "·"], [odd, "·", "✗", "!"]]  # no probe time: neither node answered
    assert "✗ x[/]y ssh: refused: [/] and [red]x[/red]\n    fix: fix [/] it [link=x]\n" in text
    assert "! x[/]y dns: [/]\n" in text
    assert "1 failure(s), 1 warning(s) in 0.5 s" in text


def test_report_json_holds_the_same_findings() -> None:
    report = _report(evidence(node_2=NodeFailure("node-2", "refused", "connection refused", "start sshd"),
                              times={"node-0": 0.412, "node-1": 0.5}))
    data = json.loads(doctor.report_json(report))
    assert data["ok"] is False
    assert [Finding(**f) for f in data["findings"]] == list(report.findings)
    assert data["nodes"]["node-0"]["probe"]["hostname"] == "node-0"
    assert data["nodes"]["node-2"]["probe"] is None
    assert [data["nodes"][h]["probe_s"] for h in ADDRS] == [0.412, 0.5, None]  # no connection, no probe


def test_render_table_shows_each_probes_time_and_the_slow_one_with_its_fix() -> None:
    ev = evidence(times={"node-0": 0.41, "node-1": 0.52, "node-2": 6.04}, probe_timeout=20.0)
    console = Console(record=True, width=200, color_system=None)
    doctor.render_table(_report(ev), console)
    text = console.export_text()
    header = next(line for line in text.splitlines() if "node" in line and "probe" in line)
    assert header.split()[1:4] == ["node", "┃", "probe"]
    rows = {line.split()[1]: line.split() for line in text.splitlines() if line.startswith("│ node-")}
    assert [rows[h][3:5] for h in ADDRS] == [["0.4", "s"], ["0.5", "s"], ["6.0", "s"]]
    assert rows["node-2"].count("!") == 1
    assert "! node-2 python: node-2's probe took 6.0 s (the others 0.4-0.5 s): " in text
    assert "0 failure(s), 1 warning(s)" in text


def test_doctor_failed_lists_failures_and_fixes() -> None:
    blind = probe("node-1")
    blind["resolve"]["node-0"] = {"error": "gai error -2: Name or service not known"}
    error = DoctorFailed(_report(evidence(node_1=blind), "fast"))
    assert isinstance(error, LauncherError) and error.exit_code == 1
    assert doctor.DoctorFailed is DoctorFailed  # it lives in launcher.errors, still importable from the doctor
    text = str(error)
    assert text.startswith("the doctor found 1 problem(s); nothing was started:")
    assert '    fix: add "10.0.0.1 node-0" to /etc/hosts on node-1' in text


def test_probe_command_quotes_the_interpreter() -> None:
    assert doctor.probe_command("~/my env/bin/python").startswith("exec \"$HOME\"/'my env/bin/python' -S -c ")
    assert doctor.probe_command("/opt/venv/bin/python").startswith("exec /opt/venv/bin/python -S -c 'import sys,zlib,")
    request = doctor.probe_request(make_cluster(), make_cluster().hosts[1], "fast", {"token": "t", "window": 1})
    assert request["names"] == ["node-0", "node-1", "node-2"] and request["is_master"] is False
    assert request["script"] == "train.py" and request["workdir"] == "~/project"


# ---------------------------------------------------------------------------------------------------------
# The probe script itself, run here without SSH.


def test_probe_source_is_python_3_8() -> None:
    ast.parse(doctor.PROBE_SOURCE, feature_version=(3, 8))


def test_probe_runs_here_and_reads_versions_without_importing_torch(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    request = {"mode": "probe", "checks": "all", "names": ["localhost", "no-such-host.invalid"],
               "master_addr": "127.0.0.1", "master_port": 29500, "workdir": str(tmp_path), "script": "train.py",
               "gpu_timeout_s": 10.0}
    python = node_python()  # built before the clock starts (a second or two, once per test process)
    started = time.monotonic()
    answer = run_probe(request, python=python)
    assert time.monotonic() - started < 5
    assert answer["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert answer["resolve"]["localhost"]["addrs"]
    assert "error" in answer["resolve"]["no-such-host.invalid"]
    assert answer["script"]["size"] == 12 and len(answer["script"]["sha256"]) == 64
    assert answer["route"]["ip"] == "127.0.0.1" and answer["route"]["iface"] == "lo"
    assert any(p.startswith("torch==") for p in answer["packages"]["list"])  # the nodes' env: declared deps only
    assert answer["elapsed"] < 2


def _python_3_8() -> str | None:
    """A working Python 3.8 here (on PATH, or a sibling pyenv version), if there is one."""
    candidates = [shutil.which("python3.8"), *map(str, Path(sys.base_prefix).parent.glob("3.8*/bin/python3.8"))]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "-V"], capture_output=True).returncode == 0:
            return candidate
    return None


def test_probe_runs_under_python_3_8(tmp_path: Path) -> None:
    python = _python_3_8()
    if python is None:
        pytest.skip("no Python 3.8 on this machine")
    request = {"mode": "probe", "checks": "all", "names": ["localhost"], "master_addr": "127.0.0.1",
               "master_port": 29500, "workdir": str(tmp_path), "script": "missing.py", "gpu_timeout_s": 10.0}
    answer = run_probe(request, python=python)
    assert answer["python"]["version"].startswith("3.8.")
    assert "error" in answer["script"] and answer["packages"]["count"] >= 1


def test_the_master_listener_and_a_probe_speak_with_the_controllers_numbers_only() -> None:
    # The two node sessions of a doctor run, here without SSH, with exactly the requests collect.py builds.
    port = free_port()
    listen = {**doctor.listen_request(make_cluster(), "t0ken", 4.0), "master_port": port}
    listener = subprocess.Popen([node_python(), "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert listener.stdin is not None
        listener.stdin.write(doctor.probe_input(listen))
        listener.stdin.flush()
        request = {"mode": "probe", "checks": "fast", "names": [], "master_addr": "127.0.0.1", "master_port": port,
                   "connect": doctor.connect_section("t0ken", 4.0), "gpu_timeout_s": 10.0}
        tcp = run_probe(request)["tcp"]
        assert tcp["ok"] and tcp["peer"] == "127.0.0.1", tcp
        out, err = listener.communicate(b"", timeout=10)  # stdin closed: every probe has answered
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.communicate()
    assert listener.returncode == 0, err.decode()
    answer = json.loads(out)
    assert answer["free"] and answer["accepted"] == 1 and answer["peers"] == ["127.0.0.1"]


@pytest.mark.parametrize(("request_", "sentence"), [
    ({"mode": "listen", "master_port": 1, "token": "t"},
     "the listen request needs max_s (seconds, a number >= 0); got None"),
    ({"mode": "listen", "master_port": 1, "token": "t", "max_s": "30"},
     "the listen request needs max_s (seconds, a number >= 0); got '30'"),
    ({"mode": "probe", "names": [], "connect": {"token": "t", "token_read_s": 2.0}},
     "the connect request needs window (seconds, a number >= 0); got None"),
    ({"mode": "probe", "names": [], "connect": {"token": "t", "window": 3.0, "token_read_s": True}},
     "the connect request needs token_read_s (seconds, a number >= 0); got True"),
    ({"mode": "probe", "names": [], "connect": {"token": "t", "window": -1, "token_read_s": 2.0}},
     "the connect request needs window (seconds, a number >= 0); got -1"),
])
def test_the_probe_refuses_a_request_without_its_numbers(request_: dict[str, Any], sentence: str) -> None:
    # No made-up default: the reply says what is missing, before any work (the listener binds nothing).
    started = time.monotonic()
    result = subprocess.run([node_python(), "-c", BOOTSTRAP], input=doctor.probe_input(request_),
                            capture_output=True, timeout=30)
    assert time.monotonic() - started < 2
    assert result.returncode == 2
    assert json.loads(result.stdout) == {"mode": request_["mode"], "error": sentence}
    assert result.stderr.decode() == f"probe: {sentence}\n"


# ---------------------------------------------------------------------------------------------------------
# On real sshd nodes.


def test_canned_probe_is_what_the_real_probe_prints(tmp_path: Path) -> None:
    """Keep the canned data honest: it has the real probe's keys (gpus/packages only in "all" mode)."""
    request = {"mode": "probe", "checks": "all", "names": ["localhost"], "master_addr": "127.0.0.1",
               "master_port": 29500, "workdir": str(tmp_path), "script": "x.py", "connect": None, "gpu_timeout_s": 10.0}
    real = run_probe(request)
    canned = copy.deepcopy(probe("node-0"))
    canned.pop("tcp")
    assert set(real) == set(canned)
    for key in ("python", "self", "workdir", "route"):
        assert set(canned[key]) <= set(real[key]) | {"error"}, key
