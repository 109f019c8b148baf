"""The doctor's probe script itself: run here without SSH (Python 3.8, torch unimported, the master's listener), and
the canned probe data held to what the real probe prints."""

from __future__ import annotations

import ast
import copy
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from devtools.observe import free_port
from launcher import doctor
from launcher.transport.program import BOOTSTRAP
from tests.support.canned_probes import make_cluster, probe
from tests.support.nodeenv import node_python
from tests.support.proberun import run_probe


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
