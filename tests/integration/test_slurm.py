"""The same job under SLURM, on a real slurmctld with one slurmd per sandbox node (`sandbox.up(slurm=True)`):
`inv launch --slurm` inside an allocation, and batch jobs through `inv slurm.submit` with status, logs and stop."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devtools.sandbox import Sandbox, slurm_env
from tests.conftest import free_port
from tests.helpers import PAGE_ON, REPO, node_runs, run_id_of, run_processes, runs_on, wait_for

pytestmark = pytest.mark.integration

CHECKSUM = re.compile(r"^node-(\d) r(\d)\s+\| CHECKSUM rank=(\d) sha256=([0-9a-f]{64})$", re.M)
STEPS_MARK = "steps left:"




def _env(box: Sandbox, tmp_path: Path, **more: str) -> dict[str, str]:
    return {**os.environ, **slurm_env(box.state_dir), "INVOKE_LAUNCHER_LOG_DIR": str(tmp_path / "logs"), **more}


def salloc_launch(box: Sandbox, tmp_path: Path, *args: str, nodes: int = 2, timeout: float = 180,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`salloc -N 2 inv launch --slurm ...` as a user types it; then, still inside the allocation, the steps that
    are left (none may be: a launch ends its step whatever happened)."""
    launch = " ".join([sys.executable, "-m", "invoke", "launch", "--slurm", "--hosts", str(box.inventory), *args])
    # slurmctld hears of a step's end from the nodes' slurmd a moment after srun exits (seconds on a loaded machine):
    # a step still listed 10 s after the launch ended is one it left behind.
    steps = "squeue --steps --noheader -j $SLURM_JOB_ID"
    script = (f'{launch}; code=$?; for i in $(seq 50); do [ -z "$({steps})" ] && break; sleep 0.2; done; '
              f'echo "{STEPS_MARK} $({steps})"; exit $code')
    return subprocess.run(["salloc", "-N", str(nodes), "sh", "-c", script], cwd=REPO,
                          env=_env(box, tmp_path, **(env or {})), capture_output=True, text=True, timeout=timeout)


def _steps_left(result: subprocess.CompletedProcess[str]) -> str:
    line = next(line for line in result.stdout.splitlines() if line.startswith(STEPS_MARK))
    return line[len(STEPS_MARK):].strip()


@pytest.fixture
def slurm_box(make_sandbox) -> Sandbox:
    return make_sandbox(2, nproc_per_node=2, master_port=free_port(), slurm=True)


@pytest.fixture
def sleeper_slurm_box(make_sandbox) -> Sandbox:
    """For the stops: a job that ticks until stopped, under the stand-in torchrun (what is stopped is the launcher's
    and SLURM's doing; torchrun's own way of ending under a signal is test_torchrun_standin's)."""
    return make_sandbox(2, torchrun="stand-in", nproc_per_node=2, master_port=free_port(), slurm=True,
                        script="tests/scripts/sleeper.py", script_args=["0.1"])


def test_ddp_on_two_allocated_nodes_ends_with_equal_checksums(slurm_box: Sandbox, tmp_path: Path) -> None:
    result = salloc_launch(slurm_box, tmp_path, "--args", "'--epochs 1'", env=PAGE_ON)
    assert result.returncode == 0, result.stdout + result.stderr
    sums = CHECKSUM.findall(result.stdout)
    assert sorted((int(node), int(rank)) for node, rank, _, _ in sums) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert len({digest for *_, digest in sums}) == 1
    assert "checked 9 things on 2 node(s)" in result.stderr  # the doctor's fast checks, in the start session
    assert "all 2 node(s) exited 0" in result.stderr
    assert [len(list(node_runs(slurm_box, i).iterdir())) for i in (0, 1)] == [1, 1]  # each node's own run dir
    assert _steps_left(result) == ""
    run_id = run_id_of(result.stderr)
    assert run_processes(run_id) == []
    # the run's page, written before the launch returned (a batch job ends with it): every node's start, by steps
    page = (tmp_path / "logs" / run_id / "report.html").read_text()
    assert "command -&gt; first optimizer step on every rank: " in page, page[:2000]
    assert page.count("<td>node-0</td>") >= 2 and page.count("<td>node-1</td>") >= 2  # its start and its end


def test_a_node_that_cannot_resolve_the_master_starts_nothing(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, master_port=free_port(), slurm=True, unresolvable={1: [0]})
    result = salloc_launch(box, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "node-1 cannot resolve node-0" in result.stderr and "nothing was started" in result.stderr
    assert "node-0 cannot resolve" not in result.stderr
    assert "inv doctor" not in result.stderr  # it works over SSH: no hint to it under SLURM
    assert runs_on(box) == []  # no run directory on any node
    assert _steps_left(result) == ""


def test_a_raising_rank_is_the_root_cause_and_the_step_ends_with_nothing_left(slurm_box: Sandbox,
                                                                                tmp_path: Path) -> None:
    result = salloc_launch(slurm_box, tmp_path, "--args", "'--epochs 1 --fail-at 5 --fail-rank 3'")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "root cause: node-1, rank 3 (local rank 1), exit code 1" in result.stderr
    assert "RuntimeError: injected failure at step 5 on rank 3" in result.stderr
    # node-0 is stopped by the launcher, or (under load) ended first by srun's --kill-on-bad-exit: either way it is
    # accounted for, and the root cause above is rank 3's.
    assert "node-0: " in result.stderr, result.stderr
    assert _steps_left(result) == ""
    assert run_processes(run_id_of(result.stderr)) == []
    # The job in an image: this cluster's srun has no pyxis, and the launch says so before anything starts.
    data = yaml.safe_load(slurm_box.inventory.read_text())
    data.setdefault("defaults", {})["container"] = {"image": "localhost/train:1"}
    slurm_box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    refused = salloc_launch(slurm_box, tmp_path)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert ("container.image localhost/train:1: this cluster's srun has no --container-image (the pyxis plugin), so "
            "--slurm cannot run the job in the image") in refused.stderr, refused.stderr
    assert "started" not in refused.stderr and _steps_left(refused) == ""


def test_ctrl_c_stops_the_step_on_every_node(sleeper_slurm_box: Sandbox, tmp_path: Path) -> None:
    out = tmp_path / "launch.out"
    launch = [sys.executable, "-m", "invoke", "launch", "--slurm", "--hosts", str(sleeper_slurm_box.inventory)]
    with open(out, "wb") as sink:
        proc = subprocess.Popen(["salloc", "-N", "2", *launch], cwd=REPO, env=_env(sleeper_slurm_box, tmp_path),
                                stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "tick 10 " in out.read_text(), 120, "the job under way")
        run_id = run_id_of(out.read_text())
        assert len(run_processes(run_id)) >= 6  # 2 agents, 2 torchruns, 4 workers (and their shells)
        inv_pid = next(p for p in _children_named(proc.pid, "invoke"))
        os.kill(inv_pid, 2)  # the terminal's Ctrl-C reaches the launcher, not srun (its own session)
        assert proc.wait(timeout=60) == 130, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    assert "interrupted: stopping the run on every node" in text and "stopped on 2 node(s)" in text
    assert run_processes(run_id) == []


def _children_named(pid: int, word: str) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid), "-f", word], capture_output=True, text=True)
    return [int(p) for p in found.stdout.split()]


def _inv(box: Sandbox, tmp_path: Path, *args: str, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, env=_env(box, tmp_path, **(env or {})),
                          capture_output=True, text=True, timeout=timeout)


def _submitted(result: subprocess.CompletedProcess[str]) -> str:
    match = re.search(r"submitted batch job (\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    return match.group(1)


def test_a_submitted_job_runs_to_its_end_and_inv_logs_shows_its_prefixed_output(slurm_box: Sandbox,
                                                                                 tmp_path: Path) -> None:
    submitted = _inv(slurm_box, tmp_path, "slurm.submit", "--hosts", str(slurm_box.inventory), "--nodes", "2",
                     "--time", "10", "--args", "--epochs 1", env=PAGE_ON)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = _submitted(submitted)
    wait_for(lambda: "state: PENDING" not in _inv(slurm_box, tmp_path, "status", "--job", job).stdout
             and "state: RUNNING" not in _inv(slurm_box, tmp_path, "status", "--job", job).stdout, 150,
             f"job {job} ended")
    status = _inv(slurm_box, tmp_path, "status", "--job", job)
    assert "state: COMPLETED" in status.stdout, status.stdout + _inv(slurm_box, tmp_path, "logs", "--job", job).stdout
    assert "exit code: 0" in status.stdout and "nodes: node-[0-1]" in status.stdout
    logs = _inv(slurm_box, tmp_path, "logs", "--job", job)
    assert logs.returncode == 0, logs.stderr
    sums = CHECKSUM.findall(logs.stdout)
    assert sorted((int(node), int(rank)) for node, rank, _, _ in sums) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert len({digest for *_, digest in sums}) == 1
    assert "checked 9 things on 2 node(s)" in logs.stdout  # the doctor ran inside the job, before torchrun
    assert "all 2 node(s) exited 0" in logs.stdout
    page = tmp_path / "logs" / run_id_of(logs.stdout) / "report.html"  # written inside the job, before its end
    assert "command -&gt; first optimizer step on every rank: " in page.read_text()


def test_inv_stop_on_a_submitted_job_leaves_no_process_of_it(sleeper_slurm_box: Sandbox, tmp_path: Path) -> None:
    box = sleeper_slurm_box
    submitted = _inv(box, tmp_path, "slurm.submit", "--hosts", str(box.inventory), "--nodes", "2")
    job = _submitted(submitted)
    output = tmp_path / "logs" / "slurm" / f"slurm-{job}.out"
    wait_for(lambda: output.exists() and "tick 10 " in output.read_text(), 150, "the job under way")
    run_id = run_id_of(output.read_text())
    assert len(run_processes(run_id)) >= 6
    stopped = _inv(box, tmp_path, "stop", "--job", job)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"stopped job {job}" in stopped.stdout
    assert run_processes(run_id) == []
    assert subprocess.run(["squeue", "--noheader", "--jobs", job], env=_env(box, tmp_path),
                          capture_output=True, text=True).stdout.strip() == ""
    assert "state: CANCELLED" in _inv(box, tmp_path, "status", "--job", job).stdout


def test_a_hung_rank_is_named_under_slurm_too(make_sandbox, tmp_path: Path) -> None:
    # The same watch and stacks over the srun step: the `stacks` word travels on the step's stdin.
    box = make_sandbox(2, torchrun="stand-in",
                       nproc_per_node=2, master_port=free_port(), slurm=True, script="tests/scripts/hang_rank.py",
                       script_args=["1", "600"])
    result = salloc_launch(box, tmp_path, "--hang-timeout", "10", "--skip-doctor")
    assert result.returncode == 124, result.stdout + result.stderr
    assert re.search(r"ranks 0,2,3 wait in all_reduce \(hang_rank\.py:20\); rank 1 \(node-0, pid \d+\) is in "
                     r"time\.sleep \(hang_rank\.py:19\)", result.stderr), result.stderr
    assert _steps_left(result) == ""
    assert run_processes(run_id_of(result.stderr)) == []


def test_inv_stacks_on_a_submitted_job_names_the_odd_rank_and_the_job_goes_on(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in",
                       nproc_per_node=2, master_port=free_port(), slurm=True, script="tests/scripts/hang_rank.py",
                       script_args=["1", "600"])
    job = _submitted(_inv(box, tmp_path, "slurm.submit", "--hosts", str(box.inventory), "--nodes", "2",
                          "--skip-doctor"))
    output = tmp_path / "logs" / "slurm" / f"slurm-{job}.out"
    try:
        wait_for(lambda: output.exists() and output.read_text().count("step 1") == 4, 150, "every rank's second step")
        stacks = _inv(box, tmp_path, "stacks", "--hosts", str(box.inventory), "--job", job)
        assert stacks.returncode == 0, stacks.stdout + stacks.stderr
        assert re.search(r"ranks 0,2,3 wait in all_reduce \(hang_rank\.py:20\); rank 1 \(node-0, pid \d+\) is in "
                         r"time\.sleep \(hang_rank\.py:19\)", stacks.stdout), stacks.stdout + stacks.stderr
        run_id = run_id_of(output.read_text())
        assert len(list((tmp_path / "logs" / run_id).glob("stacks-*/node-*-r*.txt"))) == 4
        assert "state: RUNNING" in _inv(box, tmp_path, "status", "--job", job).stdout  # it goes on
        report = _inv(box, tmp_path, "report", "--hosts", str(box.inventory), "--job", job, "--json")
        assert report.returncode == 0, report.stdout + report.stderr
        summary = json.loads(report.stdout)
        assert summary["run"] == run_id and summary["page"] == str(tmp_path / "logs" / run_id / "report.html")
        assert {n: s["state"] for n, s in summary["nodes"].items()} == {"node-0": "running", "node-1": "running"}
        assert len(run_processes(run_id)) >= 6
    finally:
        _inv(box, tmp_path, "stop", "--job", job)
    ended = _inv(box, tmp_path, "stacks", "--hosts", str(box.inventory), "--job", job)
    assert ended.returncode == 1 and f"job {job} is CANCELLED: it runs nothing to look at" in ended.stderr


def _screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (scripts/setup installs it)")
def test_top_and_doctor_net_on_a_submitted_job_and_doctor_in_an_allocation(make_sandbox, tmp_path: Path) -> None:
    # One job for all (each SLURM sandbox and job start costs seconds): `top --once --json`, the live view in a real
    # terminal, `doctor --job --net` beside the job's own step; then, the job stopped, `doctor --slurm` in salloc.
    box = make_sandbox(2, torchrun="stand-in",
                       nproc_per_node=2, master_port=free_port(), slurm=True, script="tests/scripts/steps.py",
                       script_args=["0.1", "3", "3"])
    job = _submitted(_inv(box, tmp_path, "slurm.submit", "--hosts", str(box.inventory), "--nodes", "2",
                          "--skip-doctor"))
    output = tmp_path / "logs" / "slurm" / f"slurm-{job}.out"
    session, code = f"top-slurm-{os.getpid()}", tmp_path / "code"
    try:
        wait_for(lambda: output.exists() and all(f"rank {r} step 3" in output.read_text() for r in range(4)), 150,
                 "every rank stepping")
        top = _inv(box, tmp_path, "top", "--hosts", str(box.inventory), "--job", job, "--once", "--json")
        assert top.returncode == 0, top.stdout + top.stderr
        snap = json.loads(top.stdout)
        assert snap["run"] == run_id_of(output.read_text())
        assert [(r["node"], r["rank"]) for r in snap["ranks"]] == [("node-0", 0), ("node-0", 1), ("node-1", 2),
                                                                  ("node-1", 3)]
        assert [r["straggler"] for r in snap["ranks"]] == [False, False, False, True]

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in {**slurm_env(box.state_dir),
                                                            "INVOKE_LAUNCHER_LOG_DIR": str(tmp_path / "logs")}.items())
        command = (f"cd {REPO} && {env} {sys.executable} -m invoke top --hosts {box.inventory} --job {job}; "
                   f"echo $? > {code}; sleep 60")
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "40", command], check=True)
        wait_for(lambda: all(f"rank {r} step" in _screen(session) for r in range(4)), 60, "every rank on the screen")
        first = _screen(session)
        wait_for(lambda: _screen(session).split("rank 0 step")[1][:6] != first.split("rank 0 step")[1][:6], 15,
                 "the view refreshed")
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        wait_for(code.exists, 15, "inv top quit")
        assert code.read_text().strip() == "0"

        doctor = _inv(box, tmp_path, "doctor", "--hosts", str(box.inventory), "--job", job, "--net", "--json",
                      timeout=180)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        report = json.loads(doctor.stdout)
        assert sorted(report["nodes"]) == ["node-0", "node-1"]
        assert [f for f in report["findings"] if f["status"] == "fail"] == []
        assert report["net"]["world"] == 2 and report["net"]["busbw_gbps"] > 0
        for node, values in report["nodes"].items():
            assert values["net"]["busbw_gbps"] > 0 and sorted(values["net"]["links"]) == [f"node-{1 - int(node[-1])}"]
        assert "state: RUNNING" in _inv(box, tmp_path, "status", "--job", job).stdout  # the job went on
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
        _inv(box, tmp_path, "stop", "--job", job)
    doctor = subprocess.run(["salloc", "-N", "2", sys.executable, "-m", "invoke", "doctor", "--slurm", "--hosts",
                             str(box.inventory)], cwd=REPO, env=_env(box, tmp_path), capture_output=True, text=True,
                            timeout=120)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "node-0" in doctor.stdout and "node-1" in doctor.stdout and "FAIL" not in doctor.stdout.upper()
