"""Helpers for integration tests: run `inv` as a user would, find a run's processes, read its output."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from devtools.observe import run_processes as run_processes  # re-exported: tests import it from here
from devtools.sandbox import node_cache

REPO = Path(__file__).resolve().parent.parent
RUN_ID = re.compile(r"run (\d{8}-\d{6}-[0-9a-f]{6})")
PAGE_OFF = {"INVOKE_LAUNCHER_PAGE": "0"}
"""The run's page written by no process of its own after a launch (Invoke reads "0" as false): tests/conftest.py
puts it in the test process's environment, so every launch a test starts, whichever way, inherits it."""
PAGE_ON = {"INVOKE_LAUNCHER_PAGE": "1"}
"""For the tests of the page itself (test_report.py, test_slurm.py): given to the launch that should write one."""


def inv(*args: str, log_dir: Path | None = None, timeout: float = 180, env: dict[str, str] | None = None,
        **popen: object) -> subprocess.CompletedProcess[str]:
    """Run `inv ARGS` from the repo root, as a user would, and capture its output. The run's page is off (PAGE_OFF)
    unless `env` turns it on (tests/integration/test_report.py)."""
    full_env = {**os.environ, **(env or {})}
    if log_dir is not None:
        full_env["INVOKE_LAUNCHER_LOG_DIR"] = str(log_dir)
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout, check=False, **popen)  # type: ignore[call-overload]


def inv_background(*args: str, log_dir: Path, out: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `inv ARGS` in its own process group (so a test can signal it like a terminal would)."""
    env = {**os.environ, **(env or {}), "INVOKE_LAUNCHER_LOG_DIR": str(log_dir)}
    with open(out, "wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, env=env, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(predicate, timeout: float, what: str = "condition", interval: float = 0.1) -> float:
    """Seconds until predicate() held; fails the test after `timeout`, saying what was awaited."""
    import pytest

    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"{what}: not met within {timeout}s")
        time.sleep(interval)
    return time.monotonic() - t0


def run_id_of(output: str) -> str:
    match = RUN_ID.search(output)
    assert match, f"no run id in output:\n{output}"
    return match.group(1)


def run_ids(output: str) -> list[str]:
    """Every run id the output names, in order, each once (a launch with retries names each attempt's)."""
    return list(dict.fromkeys(RUN_ID.findall(output)))


def node_runs(box, index: int) -> Path:
    """Sandbox node `index`'s own run directories (each node has its own cache home, as on separate machines)."""
    return node_cache(box.state_dir, index) / "ddp-launcher" / "runs"


def runs_on(box) -> list[Path]:
    """Every run directory on every node of a sandbox."""
    return [d for i in range(len(box.nodes)) if node_runs(box, i).exists() for d in node_runs(box, i).iterdir()]


def edit_inventory(path: Path, **changes: object) -> Path:
    """Rewrite an inventory with top-level changes (e.g. job=..., rendezvous=...); returns the path."""
    data = yaml.safe_load(path.read_text())
    data.update(changes)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
