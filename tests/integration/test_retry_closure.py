"""Retries that start clean and end recorded (#20.6, #20.7), on real sshd nodes with a light job.

- A node whose previous attempt could not be swept (its sshd stopped for a while) and that passes the checks
  again is swept before the next attempt starts: no process of attempt 1 lives when attempt 2's start.
- An attempt whose start fails (the node's python gone between the checks and the start) is recorded as ended, in
  attempts.json, the report and `inv status`, never as running.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.observe import free_port, signal_each, sshd_family
from tests.helpers import REPO, inv, node_runs, run_processes, wait_for
from tests.support.nodeenv import node_python

pytestmark = pytest.mark.integration


def launch(inventory: Path, logs: Path, out: Path, **config: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(logs), "INVOKE_LAUNCHER_RETRY_WAIT": "0.5",
           "INVOKE_LAUNCHER_GRACE": "1", **{f"INVOKE_LAUNCHER_{k.upper()}": str(v) for k, v in config.items()}}
    with open(out, "wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "invoke", "launch", "--hosts", str(inventory), "--retries",
                                 "1"], cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)


def runs_of(box, index: int) -> list[str]:
    folder = node_runs(box, index)
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_node_kept_for_the_next_attempt_is_swept_of_the_last_one_first(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/sleeper.py", script_args=["0.2"])
    out = tmp_path / "out"
    proc = launch(box.inventory, tmp_path / "logs", out, silence_timeout=3, heartbeat_timeout=60)
    stopped: list[int] = []
    started: list[str] = []
    try:
        wait_for(lambda: len(runs_of(box, 1)) == 1 and len(run_processes(runs_of(box, 1)[0])) >= 4, 60,
                 "attempt 1 running on both nodes")
        first = runs_of(box, 1)[0]
        # node-1's listener and the session of attempt 1's connection stop: attempt 1 fails, and its sweep cannot
        # reach node-1 ...
        stopped = signal_each(sshd_family(box.nodes[1].pid), signal.SIGSTOP)
        wait_for(lambda: "attempt 1 of 2 failed" in out.read_text(errors="replace"), 60, "attempt 1's end")
        signal_each(stopped, signal.SIGCONT)  # ... which answers again before the checks: it takes part in attempt 2
        stopped = []

        def second_started() -> bool:
            later = [r for r in runs_of(box, 0) if r != first]
            if later and run_processes(later[0]):
                started.append(later[0])
                return True
            return False

        wait_for(second_started, 60, "attempt 2 started", interval=0.01)
        assert [p for p in run_processes(first)] == [], "attempt 1's processes lived on into attempt 2"
        text = out.read_text(errors="replace")
        assert "attempt 2: 2 node(s) (node-0, node-1)" in text, text
        # attempt 1's trace says what ended it and what the decision was, typed, with its reason
        trace = (tmp_path / "logs" / first / "launcher.log").read_text()
        assert "attempt 1 ended: lost (node-1 was lost: " in trace, trace
        assert "Retry(why='node-1 was lost: " in trace and "next attempt: ['node-0', 'node-1']" in trace, trace
    finally:
        signal_each(stopped, signal.SIGCONT)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=30)
    assert all(run_processes(r) == [] for r in [*started, first])


def test_an_attempt_that_cannot_start_is_recorded_as_ended(make_sandbox, tmp_path: Path) -> None:
    counter = tmp_path / "count"
    wrapper = tmp_path / "python"
    # node-1's python runs attempt 1's agent, torchrun, the checks and the sweep, and is gone when attempt 2's agent
    # starts: told by its request (the line after the node program: `"action": "start"`), not by a count of calls,
    # whose number between the attempts varies with timing. The two lines it reads go on to python, then the rest.
    wrapper.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = -S ] || exec {node_python()} "$@"\n'
        "IFS= read -r program; IFS= read -r request\n"
        "case $request in *'\"action\": \"start\"'*)\n"
        f"  n=$(($(cat {counter} 2>/dev/null || echo 0) + 1)); echo $n > {counter}\n"
        "  if [ $n -ge 2 ]; then echo 'python: gone (test)' >&2; exit 127; fi;;\n"
        "esac\n"
        f'{{ printf "%s\\n%s\\n" "$program" "$request"; exec cat; }} | {node_python()} "$@"\n')
    wrapper.chmod(0o755)
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/sleeper.py", script_args=["0.2"],
                       python_override={1: str(wrapper)})
    out, logs = tmp_path / "out", tmp_path / "logs"
    proc = launch(box.inventory, logs, out)
    try:
        wait_for(lambda: len(runs_of(box, 1)) == 1 and (node_runs(box, 1) / runs_of(box, 1)[0] / "node-1"
                                                         / "leader").exists(), 60, "attempt 1 running")
        first = runs_of(box, 1)[0]
        leader = int((node_runs(box, 1) / first / "node-1" / "leader").read_text().split()[0])
        os.kill(leader, signal.SIGKILL)  # a process of the run killed by a signal: a retry may help
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(out.read_text(errors="replace") + (tmp_path / "count").read_text())
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text(errors="replace")
    assert code == 1, text
    assert "attempt 2:" in text, text
    recorded = json.loads((logs / first / "attempts.json").read_text())
    assert [a["outcome"] for a in recorded] == ["failed", "failed-final"], recorded
    assert recorded[1]["why"].startswith("could not start: "), recorded
    assert recorded[1]["ended_at"] is not None
    assert "attempts:" in text and f"attempt 1 (run {first})" in text, text
    status = inv("status", "--hosts", str(box.inventory), "--run", first, log_dir=logs)
    assert "is one of 2 attempts" in status.stdout and "running" not in status.stdout.split("attempts of")[1], \
        status.stdout
    assert all(run_processes(a["run_id"]) == [] for a in recorded)
