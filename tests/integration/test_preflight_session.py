"""Launch's doctor inside the start session: each node's one agent session probes, reports and waits for `go`.

What a user sees: one SSH session per node with the doctor on (counted on the nodes themselves: a `setup:` line
appends to a file in every session a node program runs in), the same `checked ... all passed` line, and a failing
check that starts nothing anywhere and prints the finding with its fix. The agent's side of the words is tested
locally first, as the launcher speaks it, without SSH.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.observe import free_port
from launcher import doctor
from tests.helpers import inv, runs_on
from tests.support.nodeenv import node_python

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
    box = make_sandbox(3, torchrun="stand-in", master_port=free_port(), script=str(script))
    counts = _counted(box, tmp_path)
    result = inv("launch", "--hosts", str(box.inventory), log_dir=tmp_path / "logs", timeout=120)
    assert result.returncode == 0, result.stderr
    bare = [c for c in doctor.FAST_CHECKS if c != "image"]  # the checks of nodes without a container
    names = ", ".join(bare)
    assert f"checked {len(bare)} things on 3 node(s) in " in result.stderr
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
    box = make_sandbox(3, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/sleeper.py", unresolvable={1: [0]})
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
    box = make_sandbox(2, torchrun="stand-in", master_port=port, script="tests/scripts/sleeper.py")
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
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script=str(script), python_override={1: str(wrapper)})
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
