"""Stacks without ptrace, as a plain user would take them (Ubuntu's ptrace_scope=1 forbids py-spy on a process
that is not the caller's descendant; the faulthandler hook needs no ptrace at all), and a node's own
sitecustomize still runs under the hook."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO

USER = "ddp-stacks-test"
SYSTEM_PYTHON = "/usr/bin/python3"
PYSPY = REPO / ".cache" / "py-spy" / "bin" / "py-spy"
"""Where scripts/setup installs py-spy: in a folder of its own, on no test's PATH."""
SCRIPT = "import time\n\ndef wait():\n    time.sleep(60)\n\nwait()\n"


def plain_user() -> str:
    """A user made for the test (no home, no login): what a cluster user is to this machine."""
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
    return USER


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder the plain user may write (pytest's own tmp folders are root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="ddp-stacks-"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_as(user: str | None, *args: str, python: str = SYSTEM_PYTHON) -> dict:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    prefix = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in env.items())] if user else []
    done = subprocess.run([*prefix, python, "-m", "tests.support.stackrun", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=None if user else {**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists() or shutil.which("runuser") is None,
                    reason="needs the system python and runuser")
def test_a_plain_user_without_py_spy_gets_the_stack_of_its_worker(shared: Path) -> None:
    user = plain_user()
    (shared / "run").mkdir(mode=0o777)
    (shared / "run").chmod(0o777)
    (shared / "train.py").write_text(SCRIPT)
    answer = run_as(user, str(shared / "run"), str(shared / "train.py"))
    assert answer["uid"] == pwd.getpwnam(user).pw_uid != 0
    [worker] = answer["workers"]
    assert worker["rank"] == 5 and worker["stack"] and "pyspy" not in worker
    assert f'File "{shared / "train.py"}", line 4 in wait' in worker["stack"]
    assert worker["lines"][f"{shared / 'train.py'}:4"] == "time.sleep(60)"


def test_a_nodes_own_sitecustomize_still_runs_under_the_hook(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "own-sitecustomize-ran"
    (site / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('yes')\n")
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "run").mkdir()
    answer = run_as(None, str(tmp_path / "run"), str(tmp_path / "train.py"), str(site))
    assert marker.read_text() == "yes"  # the node's own ran, in the worker
    [worker] = answer["workers"]
    assert "line 4 in wait" in worker["stack"]


@pytest.mark.skipif(not PYSPY.exists(), reason="scripts/setup installs py-spy into .cache/py-spy")
def test_py_spy_in_the_nodes_venv_adds_native_frames_beside_the_hooks_stack(tmp_path: Path) -> None:
    # py-spy installed in the node's venv, whose bin is on no PATH (the node's shell did not activate it).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    shutil.copy(PYSPY, venv / "bin" / "py-spy")
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "run").mkdir()
    answer = run_as(None, str(tmp_path / "run"), str(tmp_path / "train.py"), python=str(venv / "bin" / "python"))
    [worker] = answer["workers"]
    assert "line 4 in wait" in worker["stack"]  # the hook's answer is still there: py-spy only adds to it
    assert re.search(r"wait \(.*train\.py:4\)", worker["pyspy"]), worker["pyspy"]
    assert "Thread" in worker["pyspy"]
