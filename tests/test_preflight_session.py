"""Launch's doctor inside the start session: each node's one agent session probes, reports and waits for `go`.

What a user sees: one SSH session per node with the doctor on (counted on the nodes themselves: a `setup:` line
appends to a file in every session a node program runs in), the same `checked ... all passed` line, and a failing
check that starts nothing anywhere and prints the finding with its fix. The agent's side of the words is tested
locally first, as the launcher speaks it, without SSH.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import free_port
from helpers import inv, runs_on

from launcher import app as cli
from launcher import doctor
from launcher.config.inventory import parse_inventory
from launcher.options import Options
from launcher.plan.commands import plan_launch
from launcher.run import start as run_start
from launcher.run.gate import StartGate
from launcher.transport import program as remote
from tests.support.nodeenv import node_python

INVENTORY = """
hosts: [node-0, node-1]
defaults: {python: python3, workdir: /tmp}
rendezvous: {master_addr: 127.0.0.1, master_port: PORT}
job: {script: train.py}
"""


def _start_request(tmp_path: Path, node: int, port: int) -> dict[str, Any]:
    plan = plan_launch(parse_inventory(INVENTORY.replace("PORT", str(port)), "inv.yaml"))
    opts = Options(preflight=cli.preflight(Options()))
    request = run_start.start_request(plan, plan.nodes[node], {}, opts)
    return {**request, "workdir": str(tmp_path), "argv": [node_python(), "-c", "pass"]}


class Agent:
    """One agent started as the launcher starts it (bootstrap, source and request on stdin), read event by event."""

    def __init__(self, request: dict[str, Any], env: dict[str, str]):
        self.proc = subprocess.Popen([node_python(), "-c", remote.BOOTSTRAP], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.write(remote.program_input(run_start.AGENT_SOURCE, request))
        self.proc.stdin.flush()

    def say(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word.encode() + b"\n")
        self.proc.stdin.flush()

    def until(self, kind: str) -> dict[str, Any]:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            event = json.loads(line)
            if event["event"] == kind:
                return event
        raise AssertionError(f"the agent ended before saying {kind!r} (exit {self.proc.wait()})")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _bound(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


def test_the_master_agent_probes_holds_the_port_answers_tcp_and_makes_nothing_on_abort(tmp_path: Path) -> None:
    port = free_port()
    request = _start_request(tmp_path, 0, port)
    assert set(request["preflight"]) == {"probe", "connect", "listen"}  # the master holds the listener
    assert "listen" not in _start_request(tmp_path, 1, port)["preflight"]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    agent = Agent(request, env)
    try:
        probed = agent.until("probed")
        assert probed["listener"]["free"] and probed["probe"]["mode"] == "probe"
        assert probed["probe"]["script"]["path"] == "/tmp/train.py"  # the inventory's workdir: the script check
        assert _bound(port)  # held while the others check they can reach it
        agent.until("ready")
        agent.say("tcp")
        tcp = agent.until("tcp")["tcp"]
        assert tcp["ok"] and tcp["peer"] == "127.0.0.1", tcp
        agent.say("abort")
        assert agent.until("aborted")["reason"] == "abort"
        assert agent.proc.wait(timeout=10) == 0
    finally:
        agent.close()
    assert not _bound(port)  # let go
    assert not (tmp_path / "cache").exists()  # no run directory: nothing was made


def test_the_master_agent_lets_go_of_the_port_before_torchrun_starts(tmp_path: Path) -> None:
    port = free_port()
    request = _start_request(tmp_path, 0, port)
    # "torchrun" here: a program that binds master_port as torchrun's store does, and says whether it could.
    binds = ("import socket,sys;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);"
             f"s.bind(('0.0.0.0',{port}));s.listen();print('bound')")
    request["argv"] = [node_python(), "-c", binds]
    agent = Agent(request, {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    try:
        agent.until("ready")
        agent.say("go")
        agent.until("started")
        assert agent.until("exited")["code"] == 0
    finally:
        agent.close()
    (log,) = (tmp_path / "cache").rglob("log")
    assert log.read_text() == "bound\n"


def test_the_preflight_line_and_warnings_are_the_doctors(monkeypatch: pytest.MonkeyPatch) -> None:
    # `cli.preflight` is what `launch` sets: the in-session checks, with today's line when they pass.
    import io

    err = io.StringIO()
    gate = cli.preflight(Options(err=err, probe_timeout=42.0, connect_timeout=7.0))
    assert isinstance(gate, doctor.SessionPreflight) and isinstance(gate, StartGate)
    assert (gate.probe_timeout, gate.connect_timeout) == (42.0, 7.0)
    plan = plan_launch(parse_inventory(INVENTORY.replace("PORT", "29400"), "inv.yaml"))
    section = gate.node_section(plan.cluster, plan.cluster.hosts[0], plan.run_id)
    assert section["listen"]["max_s"] == 42.0 + doctor.LISTENER_MARGIN_S  # every number from the controller
    assert section["connect"]["token"] == section["listen"]["token"] == doctor.session_token(plan.run_id)
    assert section["probe"]["checks"] == "fast"


# --- over SSH, through `inv launch` ----------------------------------------------------------------------------


def _counted(box, tmp_path: Path, **hosts: dict[str, Any]) -> Path:
    """The inventory, with a setup line on every node that counts the sessions a node program runs in."""
    data = yaml.safe_load(box.inventory.read_text())
    counts = tmp_path / "sessions"
    counts.mkdir(exist_ok=True)
    for i, entry in enumerate(data["hosts"]):
        name = entry if isinstance(entry, str) else entry["name"]
        fields = hosts.get(name.replace("-", "_"), {})
        data["hosts"][i] = {"name": name, "setup": [f"echo session >> {counts}/{name}"], **fields}
    box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    return counts


def _sessions(counts: Path) -> dict[str, int]:
    return {f.name: len(f.read_text().splitlines()) for f in sorted(counts.iterdir())}


@pytest.mark.integration
def test_a_launch_with_the_doctor_opens_one_session_per_node(make_sandbox, tmp_path: Path) -> None:
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello from rank', os.environ['RANK'])\n")
    box = make_sandbox(3, master_port=free_port(), script=str(script))
    counts = _counted(box, tmp_path)
    result = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs", timeout=120)
    assert result.returncode == 0, result.stderr
    names = ", ".join(doctor.FAST_CHECKS)
    assert f"checked {len(doctor.FAST_CHECKS)} things on 3 node(s) in " in result.stderr
    assert f"s: {names} all passed (--skip-doctor skips)" in result.stderr  # port and tcp among them
    assert "all 3 node(s) exited 0" in result.stderr  # torchrun's store bound master_port after the check
    assert _sessions(counts) == {"node-0": 1, "node-1": 1, "node-2": 1}
    # The same count for the standalone doctor: its probe sessions, and the master's listener.
    for f in counts.iterdir():
        f.unlink()
    assert inv("doctor", "--hosts", str(box.inventory), "--fast", timeout=120).returncode == 0
    assert _sessions(counts) == {"node-0": 2, "node-1": 1, "node-2": 1}


@pytest.mark.integration
def test_a_node_that_cannot_resolve_the_master_starts_nothing_anywhere(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(3, master_port=free_port(), script="tests/scripts/sleeper.py", unresolvable={1: [0]})
    counts = _counted(box, tmp_path)
    result = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs", timeout=120)
    assert result.returncode == 1, result.stderr
    assert "the doctor found 2 problem(s); nothing was started:" in result.stderr, result.stderr
    assert "  node-1 dns: node-1 cannot resolve node-0 (gai error -2" in result.stderr
    assert f'    fix: add "{box.nodes[0].addr} node-0" to /etc/hosts on node-1' in result.stderr
    assert "  node-1 tcp: node-1 cannot open a TCP connection to node-0:" in result.stderr
    assert "Traceback" not in result.stderr and "all passed" not in result.stderr
    assert runs_on(box) == []  # no run directory anywhere, so no torchrun either
    assert _sessions(counts) == {"node-0": 1, "node-1": 1, "node-2": 1}


@pytest.mark.integration
def test_a_taken_master_port_starts_nothing_and_names_its_holder(make_sandbox, tmp_path: Path) -> None:
    port = free_port()
    box = make_sandbox(2, master_port=port, script="tests/scripts/sleeper.py")
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", port))
        squatter.listen()
        result = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs", timeout=120)
    assert result.returncode == 1, result.stderr
    assert "the doctor found 1 problem(s); nothing was started:" in result.stderr, result.stderr
    assert f"  node-0 port: master_port {port} is taken on node-0 ([Errno 98] Address already in use)" in (
        result.stderr)
    assert f"    fix: stop pid {os.getpid()} on node-0, or set rendezvous.master_port to a free port" in result.stderr
    assert runs_on(box) == []


@pytest.mark.integration
def test_a_slow_node_is_a_warning_and_one_past_the_probe_limit_starts_nothing(make_sandbox, tmp_path: Path) -> None:
    wrapper = tmp_path / "cold-python"
    wrapper.write_text(f"#!/bin/sh\nsleep 3\nexec {node_python()} \"$@\"\n")
    wrapper.chmod(0o755)
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    box = make_sandbox(2, master_port=free_port(), script=str(script), python_override={1: str(wrapper)})
    started = time.monotonic()
    late = inv("launch", "--hosts", str(box.inventory), "--probe-timeout", "1", log_dir=tmp_path / "logs")
    assert late.returncode == 1, late.stderr
    assert time.monotonic() - started < 30
    assert "  node-1 python: the probe did not answer within 1 s (probe_timeout)" in late.stderr, late.stderr
    assert "raise --probe-timeout" in late.stderr
    assert runs_on(box) == []

    slow = inv("launch", "--hosts", str(box.inventory), "--probe-timeout", "60", log_dir=tmp_path / "logs")
    assert slow.returncode == 0, slow.stderr
    assert "all passed (--skip-doctor skips)\n  warning: node-1 python: node-1's probe took 3." in slow.stderr
