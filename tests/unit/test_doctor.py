"""The doctor's pure checks on canned probe data: the registry and its fast checks, the launch's gate, a probe that
could not run (SSH, Python, time) and a slow one. The checks of each node's software and hardware are in
test_doctor_nodes.py, of names and ports in test_doctor_addresses.py, the output in test_doctor_report.py, the
probe script itself in test_doctor_probe.py."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from launcher import doctor
from launcher.doctor import Finding, ProbeFailed
from launcher.doctor import checklist as checks_module
from launcher.doctor.collect import doctor_gate
from launcher.errors import DoctorFailed, NodeFailure
from launcher.events import NodeFacts
from launcher.settings import DEFAULT_PROBE_TIMEOUT, Settings
from tests.support.canned_probes import ADDRS, canned_report, evidence, findings, make_cluster, only, probe, problems


def test_healthy_cluster_is_all_ok_with_one_finding_per_node_and_check() -> None:
    ev = evidence()
    found = doctor.evaluate(ev)
    assert [f for f in found if f.status != "ok"] == []
    for host in ADDRS:
        checks = [f.check for f in found if f.host == host]
        expected = [c for c in doctor.CHECKS if (c != "port" or host == "node-0") and c != "image"]  # no container
        assert checks == expected, host
    assert only(ev, "port", "node-0").detail == "port 29500 is free on node-0"
    assert only(ev, "gpus", "node-1").detail == "1 GPU(s) H100, driver 570.124.06, nproc_per_node 1"


def test_fast_mode_runs_only_the_checks_that_matter_for_starting() -> None:
    ev = evidence(node_1={**probe("node-1"), "disk_free": 1, "packages": {"sha256": "x", "count": 0, "list": []}})
    assert {f.check for f in doctor.evaluate(ev, "fast")} == set(doctor.FAST_CHECKS) - {"image"}  # bare nodes
    assert problems(ev, "fast") == []
    assert {f.check for f in problems(ev, "all")} == {"disk", "packages"}
    with pytest.raises(ValueError, match="'all' or 'fast'"):
        doctor.evaluate(ev, "quick")


def test_each_check_is_registered_once_in_column_order_and_fast_ones_are_marked() -> None:
    assert doctor.CHECKS == ("ssh", "image", "python", "torch", "dns", "hostname", "port", "tcp", "script",
                             "gpus", "packages", "disk", "clock", "iface")
    assert doctor.FAST_CHECKS == ("ssh", "image", "python", "torch", "dns", "hostname", "port", "tcp", "script",
                                  "gpus")
    assert doctor.selected_checks("all") == doctor.CHECKS and doctor.selected_checks("fast") == doctor.FAST_CHECKS
    # A cluster without a container host has no column for the container hosts' own check.
    assert doctor.selected_checks("fast", make_cluster()) == tuple(c for c in doctor.FAST_CHECKS if c != "image")
    with pytest.raises(ValueError, match="'dns' is registered twice"):
        doctor.check("dns")(lambda ev: [])
    assert doctor.CHECKS == checks_module.CHECKS  # the refused registration left the registry as it was
    ev = evidence(node_1=ProbeFailed(127, "no python"), node_2=NodeFailure("node-2", "refused", "refused", "fix"))
    for name in doctor.CHECKS:  # each function's findings carry the name it was registered under
        expected = set() if name == "image" else {name}  # the canned nodes run bare
        assert {f.check for f in checks_module.check_function(name)(evidence())} == expected
        assert {f.check for f in checks_module.check_function(name)(ev)} <= {name}


def test_task_help_and_preflight_line_name_the_registered_fast_checks() -> None:
    import tasks

    names = ", ".join(doctor.FAST_CHECKS)
    assert f"({names})" in tasks.doctor.help["fast"] and f"({names})" in tasks.launch.help["skip-doctor"]
    err = io.StringIO()
    gate = doctor_gate(Settings(), err)  # launch's: the checks run in the agents' sessions, then this
    gate.judge(make_cluster(), {h: _facts(h) for h in ADDRS}, (1000.0, 1001.0), 0.43)
    bare = [c for c in doctor.FAST_CHECKS if c != "image"]  # the checks that apply to nodes without a container
    assert err.getvalue() == (f"checked {len(bare)} things on 3 node(s) in 0.4s: {', '.join(bare)} all passed "
                              "(--skip-doctor skips)\n")


def _facts(host: str, **fields: Any) -> NodeFacts:
    """What a node's agent session says when its probe answers (the master's listener was free; tcp reached)."""
    answer = probe(host)
    tcp = answer.pop("tcp", None)
    listener = {"free": True, "accepted": 0, "peers": []} if host == "node-0" else None
    return NodeFacts(**{"probe": answer, "listener": listener, "tcp": tcp, "took": 0.4, **fields})


def test_doctor_gate_passes_a_slow_node_and_shows_its_warning() -> None:
    err = io.StringIO()
    gate = doctor_gate(Settings.of(probe_timeout=120.0, connect_timeout=7.0), err)
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
    gate = doctor_gate(Settings.of(probe_timeout=5.0), err)
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
    assert silent == ProbeFailed(0, "", "wrapper-done\n") and silent.last_line == "wrapper-done"
    refused = _outcome(Result(2, b'{"mode": "probe", "error": "no checks"}\n', b"probe: no checks\n"))
    assert isinstance(refused, ProbeFailed) and refused.last_line == "probe: no checks"


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
    assert canned_report(ev, "fast").ok


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
    from launcher.node.common import bounds

    assert DEFAULT_PROBE_TIMEOUT >= 60
    connect = doctor.connect_section("t", DEFAULT_PROBE_TIMEOUT)
    assert bounds.RESOLVE_BUDGET_S + connect["window"] + connect["token_read_s"] < DEFAULT_PROBE_TIMEOUT
    assert doctor.listen_request(make_cluster(), "t", DEFAULT_PROBE_TIMEOUT)["max_s"] > DEFAULT_PROBE_TIMEOUT
