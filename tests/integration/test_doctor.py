"""The doctor: pure checks on canned probe data, the probe script run locally, then real sshd sandboxes."""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from devtools import sandbox
from devtools.observe import free_port
from devtools.sandbox import Sandbox
from launcher import api, doctor
from launcher.config.inventory import load_inventory
from launcher.config.model import Cluster
from launcher.doctor import Finding
from launcher.errors import DoctorFailed
from launcher.node.common import bounds as node_limits
from launcher.settings import SshSettings
from launcher.transport import connections as transport
from tests.helpers import inv
from tests.support.nodeenv import node_python
from tests.support.proberun import run_probe

# ---------------------------------------------------------------------------------------------------------
# Pure checks.


# ---------------------------------------------------------------------------------------------------------
# Output, the launch path, the command line.


# ---------------------------------------------------------------------------------------------------------
# The probe script itself, run here without SSH.


def test_the_probe_resolves_many_names_on_a_few_threads_within_its_budget(tmp_path: Path) -> None:
    names = [f"gpu{i:03d}.invalid" for i in range(200)] + ["localhost"]
    request = {"mode": "probe", "checks": "fast", "names": names, "resolve_workers": 16, "master_addr": "nope.invalid",
               "master_port": 29500, "workdir": str(tmp_path), "gpu_timeout_s": 10.0}
    python = node_python()
    started = time.monotonic()
    answer = run_probe(request, python=python)
    assert time.monotonic() - started < node_limits.RESOLVE_BUDGET_S + 3
    assert set(answer["resolve"]) == set(names)
    assert answer["resolve"]["localhost"]["addrs"]
    assert all("error" in answer["resolve"][n] for n in names[:-1])


# ---------------------------------------------------------------------------------------------------------
# On real sshd nodes.

BASE_SUBNET = 50  # this module's shared sandbox: 127.0.50.2...; conftest's factory skips a locked subnet


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """One healthy 3-node sandbox for the tests that only change the inventory or the ports."""
    lock = open(Path(tempfile.gettempdir()) / f"launcher-sandbox-127.0.{BASE_SUBNET}.lock", "a")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        pytest.skip(f"127.0.{BASE_SUBNET}.x is in use by another test process")
    folder = tmp_path_factory.mktemp("doctor-sandbox")
    try:
        box = sandbox.up(3, state_dir=folder / "state", inventory=folder / "sandbox.yaml", python=node_python(),
                         base_addr=f"127.0.{BASE_SUBNET}.2", master_port=free_port())
        yield box
    finally:
        sandbox.down(folder / "state")
        lock.close()


def _edited(box: Sandbox, path: Path, edits: dict[int, dict[str, Any]]) -> Cluster:
    """The sandbox's inventory with each host of `edits` turned into a mapping with those fields, at `path`."""
    data = yaml.safe_load(box.inventory.read_text())
    for host, fields in edits.items():
        entry = data["hosts"][host]
        data["hosts"][host] = {**({"name": entry} if isinstance(entry, str) else entry), **fields}
    path.write_text(yaml.safe_dump(data))
    return load_inventory(path)


def _bad(report: doctor.Report) -> list[tuple[str, str]]:
    return [(f.host, f.check) for f in report.problems]


@pytest.mark.integration
def test_healthy_sandbox_is_all_green(healthy: Sandbox) -> None:
    cluster = load_inventory(healthy.inventory)
    report = doctor.run_doctor(cluster)
    assert report.ok, doctor.report_json(report)
    assert [f for f in report.findings if f.status == "fail"] == []
    assert [f for f in report.problems if f.check not in ("disk", "clock")] == []
    for host in report.hosts:
        assert {f.check for f in report.findings if f.host == host} >= {"ssh", "python", "torch", "dns", "tcp"}
    assert report.listener and report.listener["free"] and report.listener["accepted"] == 3
    assert report.probes["node-1"]["hostname"] == "node-1"
    assert report.timings["total_s"] < 15


@pytest.mark.integration
def test_json_output_parses_and_holds_the_same_findings(healthy: Sandbox) -> None:
    report = doctor.run_doctor(load_inventory(healthy.inventory), checks="fast")
    data = json.loads(doctor.report_json(report))
    assert data["checks"] == [c for c in doctor.FAST_CHECKS if c != "image"]  # no container host: no image column
    assert [Finding(**f) for f in data["findings"]] == list(report.findings)
    assert data["nodes"]["node-2"]["probe"]["self"]["hostname"] == "node-2"


@pytest.mark.integration
def test_script_missing_on_one_node_and_different_on_another(healthy: Sandbox, tmp_path: Path) -> None:
    empty, other = tmp_path / "empty", tmp_path / "other"
    (other / "train").mkdir(parents=True)
    empty.mkdir()
    (other / "train" / "ddp.py").write_text("print('not the same script')\n")
    cluster = _edited(healthy, tmp_path / "inv.yaml", {1: {"workdir": str(empty)}, 2: {"workdir": str(other)}})
    report = doctor.run_doctor(cluster, checks="fast")
    assert _bad(report) == [("node-1", "script"), ("node-2", "script")]
    missing, differs = report.problems
    assert missing.detail == f"train/ddp.py is missing on node-1: {empty}/train/ddp.py"
    assert differs.detail.startswith("train/ddp.py differs on node-2") and "node-0 have" in differs.detail
    assert "rsync" in differs.fix


@pytest.mark.integration
def test_missing_python_on_one_node(healthy: Sandbox, tmp_path: Path) -> None:
    cluster = _edited(healthy, tmp_path / "inv.yaml", {2: {"python": "/nonexistent/bin/python3"}})
    report = doctor.run_doctor(cluster, checks="fast")
    assert _bad(report) == [("node-2", "python")]
    assert "/nonexistent/bin/python3 cannot run on node-2" in report.problems[0].detail


@pytest.mark.integration
def test_master_port_taken(healthy: Sandbox) -> None:
    cluster = load_inventory(healthy.inventory)
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", cluster.rendezvous.master_port))
        squatter.listen()
        report = doctor.run_doctor(cluster, checks="fast")
    assert _bad(report) == [("node-0", "port")]
    (found,) = report.problems
    assert found.detail.startswith(f"master_port {cluster.rendezvous.master_port} is taken on node-0 ")
    assert f"pid {os.getpid()}" in found.detail  # this test process holds it
    assert found.fix.startswith(f"stop pid {os.getpid()} on node-0")


@pytest.mark.integration
def test_preflight_uses_open_connections_and_raises_when_a_check_fails(healthy: Sandbox, tmp_path: Path) -> None:
    cluster = load_inventory(healthy.inventory)
    nodes, failures = transport.connect_all(cluster)
    assert failures == []
    try:
        doctor.default_gate(cluster, nodes)
        broken = _edited(healthy, tmp_path / "inv.yaml", {1: {"python": "/nonexistent/python"}})
        with pytest.raises(DoctorFailed, match="nothing was started") as caught:
            doctor.default_gate(broken, nodes)
        assert "  node-1 python: python /nonexistent/python cannot run on node-1" in str(caught.value)
        assert "fix: set `python:` for node-1" in str(caught.value)
        assert nodes["node-1"].run("true").exit_code == 0  # still open: preflight closes only what it opens
    finally:
        transport.close_all(nodes.values())


@pytest.mark.integration
def test_node_cannot_resolve_the_master(make_sandbox) -> None:
    box = make_sandbox(3, master_port=free_port(), unresolvable={1: [0]})
    report = doctor.run_doctor(load_inventory(box.inventory), checks="fast")
    assert _bad(report) == [("node-1", "dns"), ("node-1", "tcp")]
    dns, tcp = report.problems
    assert dns.detail.startswith("node-1 cannot resolve node-0 (gai error -2")
    assert dns.fix == f'add "{box.nodes[0].addr} node-0" to /etc/hosts on node-1'
    assert "cannot resolve node-0" in tcp.detail


@pytest.mark.integration
def test_another_torch_on_one_node(make_sandbox, tmp_path: Path) -> None:
    site = tmp_path / "fake-env" / "site"
    (site / "torch-2.12.0.dist-info").mkdir(parents=True)
    (site / "torch-2.12.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.12.0\n")
    wrapper = tmp_path / "fake-env" / "python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {node_python()} \"$@\"\n")
    wrapper.chmod(0o755)
    box = make_sandbox(3, master_port=free_port(), python_override={2: str(wrapper)})
    report = doctor.run_doctor(load_inventory(box.inventory))
    fails = [f for f in report.findings if f.status == "fail"]
    assert [(f.host, f.check) for f in fails] == [("node-2", "torch")]
    real = report.probes["node-0"]["torch"]["version"]
    assert fails[0].detail == f"torch 2.12.0 here, {real} on node-0, node-1"
    pkgs = [f for f in report.problems if f.check == "packages"]
    assert [f.host for f in pkgs] == ["node-2"] and f"torch 2.12.0 (not {real})" in pkgs[0].detail


@pytest.mark.integration
def test_a_node_whose_sshd_is_down(make_sandbox) -> None:
    box = make_sandbox(3, master_port=free_port())
    sandbox.stop_node(box.state_dir, 2)
    started = time.monotonic()
    report = doctor.run_doctor(load_inventory(box.inventory), ssh=SshSettings(5.0))
    assert time.monotonic() - started < 5.0
    assert [(f.host, f.check, f.status) for f in report.problems] == [("node-2", "ssh", "fail")]
    found = report.problems[0]
    assert found.detail.startswith("refused: connection refused by")
    assert "sshd" in found.fix
    console = Console(record=True, width=200, color_system=None)
    doctor.render_table(report, console)
    assert "✗ node-2 ssh: refused" in console.export_text()


def _running(marker: str) -> list[int]:
    """Pids whose command line holds `marker` (to wait for what a test started; never to kill by name)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                pids.append(int(entry))
        except OSError:
            continue
    return pids


@pytest.mark.integration
def test_a_hung_node_does_not_hold_the_report(healthy: Sandbox, tmp_path: Path) -> None:
    # A node that hangs until its session goes away (then its next write fails: SIGPIPE).
    slow = tmp_path / "hung-python"
    slow.write_text("#!/bin/sh\nwhile :; do echo still starting || exit 1; sleep 0.2; done\n")
    slow.chmod(0o755)
    cluster = _edited(healthy, tmp_path / "inv.yaml", {2: {"python": str(slow)}})
    started = time.monotonic()
    report = doctor.run_doctor(cluster, ssh=SshSettings(30.0), probe_timeout=3.0, checks="fast")
    assert time.monotonic() - started < 3.0 + 2.5  # the probe's limit bounds it, not the (longer) connect timeout
    # failures only: on a loaded machine a good node's probe may pass half of this short limit (a slow warning)
    failed = [f for f in report.problems if f.status == "fail"]
    assert [(f.host, f.check) for f in failed] == [("node-2", "python")], report.problems
    assert failed[0].detail == "the probe did not answer within 3 s (probe_timeout)"
    assert report.probe_times["node-2"] == pytest.approx(3.0, abs=1.0)
    deadline = time.monotonic() + 5
    while _running(str(slow)) and time.monotonic() < deadline:  # the node's side ends by itself
        time.sleep(0.1)
    assert _running(str(slow)) == []


@pytest.mark.integration
def test_the_127_0_1_1_trap_on_a_node(make_sandbox) -> None:
    box = make_sandbox(3, master_port=free_port(), self_loopback_trap=[1])
    report = doctor.run_doctor(load_inventory(box.inventory), checks="fast")
    assert _bad(report) == [("node-1", "hostname")]
    (found,) = report.problems
    assert found.detail.startswith(f"node-1 resolves to 127.0.1.1 on node-1, but its peers reach it at "
                                   f"{box.nodes[1].addr}")
    assert found.fix == f'on node-1, replace "127.0.1.1 node-1" in /etc/hosts with "{box.nodes[1].addr} node-1"'


@pytest.mark.integration
def test_a_node_slow_to_start_its_python_is_a_warning_with_its_time(make_sandbox, tmp_path: Path) -> None:
    # Node 2's python takes SLOW_START_S more to start (as from a cold network filesystem), for real, over SSH.
    slow_start_s = 4
    wrapper = tmp_path / "cold-python"
    wrapper.write_text(f"#!/bin/sh\nsleep {slow_start_s}\nexec {node_python()} \"$@\"\n")
    wrapper.chmod(0o755)
    box = make_sandbox(3, master_port=free_port(), python_override={2: str(wrapper)})
    hosts = ["--hosts", str(box.inventory), "--fast", "--json"]

    result = inv("doctor", *hosts, "--probe-timeout", "20", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr  # a warning never fails the doctor
    data = json.loads(result.stdout)
    took = data["nodes"]["node-2"]["probe_s"]
    assert slow_start_s <= took < 20
    assert all(0 < data["nodes"][h]["probe_s"] < took for h in ("node-0", "node-1"))
    problems = [(f["host"], f["check"], f["status"]) for f in data["findings"] if f["status"] != "ok"]
    assert problems == [("node-2", "python", "warn")], data["findings"]
    (slow,) = [f for f in data["findings"] if f["status"] == "warn"]
    assert slow["detail"].startswith(f"node-2's probe took {took:.1f} s (the others ")
    assert slow["detail"].endswith("launch will wait for it")

    result = inv("doctor", *hosts, "--probe-timeout", "1", timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads(result.stdout)
    (gone,) = [f for f in data["findings"] if f["host"] == "node-2" and f["status"] == "fail"]
    assert (gone["check"], gone["detail"]) == ("python", "the probe did not answer within 1 s (probe_timeout)")
    assert "raise --probe-timeout" in gone["fix"]




@pytest.mark.integration
def test_the_port_held_by_a_running_run_names_that_run_and_how_to_stop_it(make_sandbox, tmp_path: Path) -> None:
    # A second launch of an inventory whose run still goes on (seen on an H100): torchrun's store holds the port.
    from tests.helpers import run_id_of, run_processes, wait_for

    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/sleeper.py", script_args=["0.5"])
    hosts = str(box.inventory)
    started = inv("launch", "--hosts", hosts, "--detach", log_dir=tmp_path / "logs", timeout=60)
    assert started.returncode == 0, started.stderr
    run_id = run_id_of(started.stderr)
    try:
        port = load_inventory(box.inventory).rendezvous.master_port

        def listening() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex((box.nodes[0].addr, port)) == 0  # node-0, the master: its store is up

        wait_for(listening, 60, "the run's store on master_port")
        checked = inv("doctor", "--hosts", hosts, "--fast", timeout=60)
        said = " ".join((checked.stdout + checked.stderr).split())  # the table's lines wrap long findings
        assert checked.returncode == 1, said
        assert f"(launcher run {run_id}: " in said and f"--run {run_id}`), or set rendezvous.master_port" in said, said
        # Whose run it is, from another inventory of the same nodes: its user, the inventory that started it.
        other = tmp_path / "other.yaml"
        other.write_text(box.inventory.read_text())
        checked = inv("doctor", "--hosts", str(other), "--fast", "--json", timeout=60)
        (port_fix,) = [f["fix"] for f in json.loads(checked.stdout)["findings"] if f["check"] == "port"]
        theirs = box.inventory.resolve()
        assert port_fix == (f"stop run {run_id} ({getpass.getuser()}'s, started from {theirs}: `inv stop --hosts "
                            f"{theirs} --run {run_id}`), or set rendezvous.master_port to a free port"), port_fix
    finally:
        inv("stop", "--hosts", hosts, "--run", run_id, timeout=60)
    assert run_processes(run_id) == []


@pytest.mark.integration
def test_a_launch_racing_a_run_that_is_starting_is_refused_at_the_check(make_sandbox, tmp_path: Path) -> None:
    """A second launch seconds after a detached one: the first run's torchrun has not bound master_port yet (real
    torchrun's first seconds after `go`; here the stand-in sleeps), so the port is free, and the second launch
    started and died with EADDRINUSE. The master knows a run of this launcher is starting there: the check refuses,
    naming it, and nothing of the second launch starts."""
    from tests.helpers import run_id_of, run_ids, run_processes

    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/sleeper.py", script_args=["0.5"])
    inventory = yaml.safe_load(box.inventory.read_text())
    inventory["defaults"].setdefault("env", {})["STANDIN_BIND_DELAY_S"] = "8"
    hosts = tmp_path / "slow-start.yaml"
    hosts.write_text(yaml.safe_dump(inventory))
    started = inv("launch", "--hosts", str(hosts), "--detach", log_dir=tmp_path / "logs", timeout=60)
    assert started.returncode == 0, started.stderr
    run_id = run_id_of(started.stderr)
    try:
        port = inventory["rendezvous"]["master_port"]
        again = inv("launch", "--hosts", str(hosts), "--detach", log_dir=tmp_path / "logs", timeout=60)
        said = " ".join((again.stdout + again.stderr).split())
        assert again.returncode != 0, said
        assert (f"master_port {port} is taken on node-0 (a run of this launcher is starting on it): launcher run "
                f"{run_id} is starting there") in said, said
        assert f"stop run {run_id} (" in said and f"--run {run_id}`), or set rendezvous.master_port" in said, said
        assert run_ids(said) in ([], [run_id]), said  # no second run
    finally:
        inv("stop", "--hosts", str(hosts), "--run", run_id, log_dir=tmp_path / "logs", timeout=60)
    assert run_processes(run_id) == []


@pytest.mark.integration
def test_the_job_named_on_the_command_line_is_the_one_checked(healthy: Sandbox, tmp_path: Path) -> None:
    """`--script nope.py` (or api.launch's script=) once passed the start gate on the inventory's script, and torchrun
    started on a missing file: a traceback a rank. The gate and the doctor check the job that will run."""
    hosts, logs = str(healthy.inventory), tmp_path / "logs"
    missing = inv("launch", "--hosts", hosts, "--script", "nope.py", log_dir=logs, timeout=120)
    assert missing.returncode == 1, missing.stdout + missing.stderr
    said = " ".join(missing.stderr.split())
    assert "node-0 script: nope.py is missing on node-0" in said and "nothing was started" in said, said
    assert "Traceback" not in missing.stdout + missing.stderr
    # the full report it points to checks the same job: the command names it
    assert said.endswith(f"the full report: `inv doctor --hosts {hosts} --script nope.py`"), said
    module = inv("launch", "--hosts", hosts, "--module", "nopkg.train", log_dir=logs, timeout=120)
    assert module.returncode == 1, module.stdout + module.stderr
    assert "module nopkg.train cannot be imported by" in " ".join(module.stderr.split()), module.stderr
    with pytest.raises(DoctorFailed, match=r"nope\.py is missing on node-1"):
        api.launch(healthy.inventory, script="nope.py", log_dir=logs, on_output=lambda line: None,
                   on_message=lambda line: None)
    checked = inv("doctor", "--hosts", hosts, "--module", "json.tool", "--fast", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    found = [f for f in json.loads(checked.stdout)["findings"] if f["check"] == "script"]
    assert [(f["host"], f["status"]) for f in found] == [("node-0", "ok"), ("node-1", "ok"), ("node-2", "ok")]
    assert found[0]["detail"].startswith("module json.tool: ") and found[0]["detail"].endswith("json/tool.py")
    assert not api.doctor(healthy.inventory, command="no-such-program", checks="fast").ok
