"""Launch's doctor inside the start session: each node's one agent session probes, reports and waits for `go`.

What a user sees: one SSH session per node with the doctor on (counted on the nodes themselves: a `setup:` line
appends to a file in every session a node program runs in), the same `checked ... all passed` line, and a failing
check that starts nothing anywhere and prints the finding with its fix. The agent's side of the words is tested
locally first, as the launcher speaks it, without SSH.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devtools.observe import free_port
from launcher import doctor
from launcher.config.inventory import parse_inventory
from launcher.doctor.collect import doctor_gate
from launcher.plan.launchplan import plan_launch
from launcher.plan.request import start_request
from launcher.run import actions as run_actions
from launcher.run import agentevents
from launcher.run.gate import StartGate
from launcher.settings import Settings
from launcher.transport.program import BOOTSTRAP, program_input
from tests.support.nodeenv import node_python

INVENTORY = """
hosts: [node-0, node-1]
defaults: {python: python3, workdir: /tmp}
rendezvous: {master_addr: 127.0.0.1, master_port: PORT}
job: {script: train.py}
"""


def _start_request(tmp_path: Path, node: int, port: int) -> dict[str, Any]:
    plan = plan_launch(parse_inventory(INVENTORY.replace("PORT", str(port)), "inv.yaml"))
    request = start_request(plan, plan.nodes[node], {}, doctor_gate(Settings(), io.StringIO()))
    return {**request, "workdir": str(tmp_path), "argv": [node_python(), "-c", "pass"]}


class Agent:
    """One agent started as the launcher starts it (bootstrap, source and request on stdin), read event by event."""

    def __init__(self, request: dict[str, Any], env: dict[str, str]):
        self.proc = subprocess.Popen([node_python(), "-c", BOOTSTRAP], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.write(program_input(run_actions.AGENT_SOURCE, request))
        self.proc.stdin.flush()

    def say(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word.encode() + b"\n")
        self.proc.stdin.flush()

    def until(self, kind: str) -> dict[str, Any]:
        """The agent's next `kind` event, put together as the launcher does where it came in parts (`probed`)."""
        assert self.proc.stderr is not None
        parts = SimpleNamespace(parts={})
        for line in self.proc.stderr:
            event: dict[str, Any] | None = json.loads(line)
            if event is not None and event["event"] == "part":
                event = agentevents._part(parts, event)  # type: ignore[arg-type]
            if event is not None and event["event"] == kind:
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
    assert set(request["gate"]) == {"probe", "connect", "listen"}  # the master holds the listener
    assert "listen" not in _start_request(tmp_path, 1, port)["gate"]
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
    assert not (tmp_path / "cache" / "ddp-launcher" / "runs").exists()  # no run directory: nothing was made


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
    # `doctor_gate` is what `launch` sets: the in-session checks, with today's line when they pass.
    import io

    err = io.StringIO()
    gate = doctor_gate(Settings.of(probe_timeout=42.0, connect_timeout=7.0), err)
    assert isinstance(gate, doctor.DoctorGate) and isinstance(gate, StartGate)
    assert (gate.probe_timeout, gate.ssh.connect_timeout) == (42.0, 7.0)
    plan = plan_launch(parse_inventory(INVENTORY.replace("PORT", "29400"), "inv.yaml"))
    section = gate.node_section(plan.cluster, plan.cluster.hosts[0], plan.run_id)
    assert section["listen"]["max_s"] == 42.0 + doctor.LISTENER_MARGIN_S  # every number from the controller
    assert section["connect"]["token"] == section["listen"]["token"] == doctor.session_token(plan.run_id)
    assert section["probe"]["checks"] == "fast"


# --- over SSH, through `inv launch` ----------------------------------------------------------------------------


