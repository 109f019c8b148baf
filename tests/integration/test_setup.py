"""Setup lines (`setup:`) run in the node's shell before every node program, in the shell that then starts it.

Unit tests run the node command under a local `sh`, as a node's login shell would; the integration tests use real
sshd nodes: an activated venv makes a bare `python` the venv's for the doctor's probe, the agent and torchrun alike,
and a failing line stops the launch with that node's words before anything starts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from devtools.observe import free_port
from tests.helpers import inv, run_id_of, run_processes, runs_on, wait_for
from tests.support.nodeenv import build_declared_env, node_python

# --- on real sshd nodes ----------------------------------------------------------------------------------------

PRINT_EXE = ("import os, shutil, sys\n"
             "print(f\"exe={sys.executable} which={shutil.which('python')} rank={os.environ['RANK']}\", flush=True)\n")


def _with_hosts(box, **edits: object) -> Path:
    """The sandbox's inventory with `defaults` updated and hosts (by index) turned into mappings with fields."""
    data = yaml.safe_load(box.inventory.read_text())
    data["defaults"].update(edits.pop("defaults", {}))
    for index, fields in edits.pop("hosts", {}).items():
        entry = data["hosts"][index]
        data["hosts"][index] = {**({"name": entry} if isinstance(entry, str) else entry), **fields}
    data.update(edits)
    box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    return box.inventory


@pytest.mark.integration
def test_an_activated_venv_gives_a_bare_python_to_the_probe_the_agent_and_torchrun(make_sandbox,
                                                                                    tmp_path: Path) -> None:
    venv = tmp_path / "venv"  # torch and the declared dependencies, as a user's node venv holds them
    venv_python = str(build_declared_env(venv).python)
    script = tmp_path / "print_exe.py"
    script.write_text(PRINT_EXE)
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script=str(script))
    hosts = str(_with_hosts(box, defaults={"python": "python", "setup": [f". {venv}/bin/activate"]}))

    doctor = inv("doctor", "--hosts", hosts, "--json", timeout=120)
    report = json.loads(doctor.stdout)
    for node in ("node-0", "node-1"):
        assert report["nodes"][node]["probe"]["python"]["executable"] == venv_python, doctor.stdout
    python_findings = [f for f in report["findings"] if f["check"] == "python"]
    assert [f["status"] for f in python_findings] == ["ok", "ok"], python_findings
    assert all(venv_python in f["detail"] for f in python_findings)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr

    launched = inv("launch", "--hosts", hosts, log_dir=tmp_path / "logs")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    printed = {line.split("|")[0].split()[0]: line.split("|", 1)[1].strip()
               for line in launched.stdout.splitlines() if "exe=" in line}
    assert printed == {node: f"exe={venv_python} which={venv_python} rank={rank}"
                       for rank, node in enumerate(("node-0", "node-1"))}, launched.stdout

    run_id = run_id_of(launched.stderr)  # the agent's other actions run the setup lines too
    status = inv("status", "--hosts", hosts, "--run", run_id)
    assert status.returncode == 0 and status.stdout.count("exited") == 2, status.stdout + status.stderr


@pytest.mark.integration
def test_a_failing_setup_line_names_the_node_shows_its_words_and_starts_nothing(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/sleeper.py", script_args=["0.2"])
    hosts = str(_with_hosts(box, hosts={1: {"setup": ["module load nope"]}}))

    # The doctor's preflight runs the probe behind the same setup lines: it fails there, before any agent starts.
    checked = inv("launch", "--hosts", hosts, log_dir=tmp_path / "logs")
    assert checked.returncode != 0
    assert "nothing was started" in checked.stderr, checked.stderr
    assert ("node-1 python: setup line 1 of 1 failed with exit code 127, so nothing "
            "was started on this node: module load nope") in checked.stderr, checked.stderr
    assert "node-0 python" not in checked.stderr
    assert runs_on(box) == []
    assert "Traceback" not in checked.stdout + checked.stderr

    # Without the doctor, node-1's agent never starts: the start failure shows that node's own words, and node-0's
    # agent, ready and waiting for `go`, is told to stop instead: nothing starts anywhere.
    skipped = inv("launch", "--hosts", hosts, "--skip-doctor", log_dir=tmp_path / "logs")
    assert skipped.returncode != 0
    run_id = run_id_of(skipped.stderr)
    assert f"run {run_id} could not start: node-1: " in skipped.stderr, skipped.stderr
    assert "module: command not found" in skipped.stderr  # the shell's own words
    assert "setup line 1 of 1 failed with exit code 127, so nothing was started on this node: module load nope" in (
        skipped.stderr)
    assert "nothing was started" in skipped.stderr, skipped.stderr
    wait_for(lambda: run_processes(run_id) == [], timeout=30, what="every process of the run gone")
    assert runs_on(box) == []  # no node made a run directory


@pytest.mark.integration
def test_a_false_setup_line_fails_the_doctor_on_that_node(make_sandbox) -> None:
    box = make_sandbox(2, master_port=free_port())
    hosts = str(_with_hosts(box, hosts={0: {"setup": ["true", "false"]}}))
    result = inv("doctor", "--hosts", hosts, "--fast", "--json", timeout=120)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    failed = [(f["host"], f["check"], f["detail"]) for f in report["findings"] if f["status"] == "fail"]
    assert ("node-0", "python", "setup line 2 of 2 failed with exit code 1, so nothing "
            "was started on this node: false") in failed, failed
    fixes = [f["fix"] for f in report["findings"] if f["host"] == "node-0" and f["check"] == "python"]
    assert fixes == ["fix `setup:` for node-0 in the inventory (its lines run in the node's shell first)"]
    assert report["nodes"]["node-1"]["probe"]["python"]["executable"]  # the other node answered


@pytest.mark.integration
def test_names_torchrun_sets_never_leak_from_the_login_environment(make_sandbox, tmp_path: Path) -> None:
    """A login environment (here: a setup line) that exports NODE_RANK and TORCHELASTIC_*: torchrun never sees them.

    torchrun overwrites RANK, MASTER_ADDR and the like for its workers, but not NODE_RANK, which a stale export
    would hand to every worker as the wrong node.
    """
    script = tmp_path / "print_env.py"
    script.write_text("import os\nprint('seen', os.environ.get('NODE_RANK'), os.environ.get('TORCHELASTIC_X'), "
                      "os.environ.get('KEPT'), flush=True)\n")
    box = make_sandbox(2, master_port=free_port(), script=str(script))
    hosts = str(_with_hosts(box, defaults={"setup": ["export NODE_RANK=5 TORCHELASTIC_X=1 KEPT=yes"]}))
    launched = inv("launch", "--hosts", hosts, log_dir=tmp_path / "logs")
    assert launched.returncode == 0, launched.stdout + launched.stderr
    seen = [line.split("|", 1)[1].strip() for line in launched.stdout.splitlines() if "| seen" in line]
    assert seen == ["seen None None yes", "seen None None yes"], launched.stdout


@pytest.mark.integration
def test_a_python_wrapper_that_sends_stderr_elsewhere_launches_as_fast_as_without(make_sandbox, tmp_path: Path
                                                                                   ) -> None:
    """`exec python "$@" 2>/dev/null` (module and conda wrappers do this): the agent's events do not travel on the
    program's stderr, so the launch neither waits out --probe-timeout nor blames a slow start."""
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec {node_python()} "$@" 2>/dev/null\n')
    wrapper.chmod(0o755)
    script = tmp_path / "print_exe.py"
    script.write_text(PRINT_EXE)
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script=str(script))
    hosts = str(_with_hosts(box, defaults={"python": str(wrapper)}))
    t0 = time.monotonic()
    launched = inv("launch", "--hosts", hosts, "--probe-timeout", "60", log_dir=tmp_path / "logs", timeout=120)
    took = time.monotonic() - t0
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert launched.stdout.count("exe=") == 2, launched.stdout
    assert took < 30, f"{took:.1f} s"  # the probe's answer came at once: no 60 s wait for it
    assert "slow" not in launched.stderr
