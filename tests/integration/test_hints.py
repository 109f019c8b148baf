"""What a message tells the user to run next exists where they are, on real sshd nodes: a project's own tasks.py
that adds the launcher's tasks as a collection (the README's snippet) is told `inv ddp.doctor`, `inv ddp.status`,
never `inv doctor` (`No idea what 'doctor' is!` there); a script no node has, and this project neither, is said to be
nowhere, not to be copied `from your checkout`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.observe import free_port
from tests.helpers import REPO, run_id_of, wait_for

pytestmark = pytest.mark.integration


def project_inv(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`inv ARGS` in a project whose tasks.py is the README's (the launcher's tasks added as `ddp`)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("INVOKE_")}, "PYTHONPATH": str(REPO),
           "INVOKE_LAUNCHER_PAGE": "0"}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_a_projects_collection_is_named_in_every_hint_and_each_hint_runs(make_sandbox, tmp_path: Path) -> None:
    readme = (REPO / "docs" / "usage.md").read_text()  # the README points there
    (block,) = [b.split("```", 1)[0] for b in readme.split("```python\n")[1:] if "add_collection(ddp" in b]
    project = tmp_path / "project"
    project.mkdir()
    (project / "tasks.py").write_text(block)
    (project / "hello.py").write_text("import time\nprint('hello', flush=True)\ntime.sleep(60)\n")
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), workdir=project, script="hello.py")
    hosts = str(box.inventory)

    refused = project_inv(project, "ddp.launch", "--hosts", hosts, "--script", "nope.py")
    assert refused.returncode == 1, refused.stderr
    said = refused.stderr.splitlines()
    assert said[-1] == f"the full report: `inv ddp.doctor --hosts {hosts} --script nope.py`", refused.stderr
    assert (f"    fix: no node has it, nor this machine at {project / 'nope.py'}: check the script's name (--script, "
            "job.script), or fix `workdir` for node-0") in said, refused.stderr
    assert "from your checkout" not in refused.stderr
    doctor = project_inv(project, "ddp.doctor", "--hosts", hosts, "--script", "nope.py", "--fast")  # the hint runs
    assert doctor.returncode == 1 and "nope.py is missing on node-0" in doctor.stdout, doctor.stdout + doctor.stderr

    detached = project_inv(project, "ddp.launch", "--hosts", hosts, "--detach")
    assert detached.returncode == 0, detached.stderr
    run_id = run_id_of(detached.stderr)
    assert (f"`inv ddp.status --hosts {hosts}`, `inv ddp.logs --hosts {hosts} --follow` and `inv ddp.stop --hosts "
            f"{hosts}` work on it") in detached.stderr, detached.stderr
    wait_for(lambda: "hello" in project_inv(project, "ddp.logs", "--hosts", hosts).stdout, 60, "the run's output")
    assert project_inv(project, "ddp.status", "--hosts", hosts).returncode == 0
    stopped = project_inv(project, "ddp.stop", "--hosts", hosts, "--run", run_id)
    assert stopped.returncode == 0, stopped.stderr
