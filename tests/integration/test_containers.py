"""The job in a container on every node (`container:`), on real sshd nodes with a real runtime (Debian's podman, as
root here; each node its own storage): one world, the same weights, and nothing of the run left, container or
process, however it ended: Ctrl-C, `inv stop`, a failing rank, a launcher killed past its heartbeat bound, a
killed agent. Secrets stay off every command line and out of the runtime's `inspect`; stacks and the hang verdict
see into the container."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devtools import podman as pm
from devtools.observe import free_port, parent
from launcher import api
from tests._train_helpers import assert_replicas_in_sync
from tests.helpers import inv, inv_background, run_id_of, run_processes, wait_for
from tests.support import containers as ct

pytestmark = pytest.mark.integration

WHY_NOT = pm.unavailable()
if WHY_NOT is not None:
    pytest.skip(WHY_NOT, allow_module_level=True)

TRAIN = "--epochs 1 --dataset-size 128 --batch-size 16 --log-every 2"
SECRET = "hunter2-in-the-container"


@pytest.fixture
def trainers(make_sandbox, tmp_path: Path) -> Iterator[ct.ContainerNodes]:
    made = None
    try:
        made = ct.container_nodes(make_sandbox, ct.short_folder(), nproc_per_node=2, master_port=free_port())
        yield made
    finally:
        ct.discard(made)


@pytest.fixture
def sleepers(make_sandbox, tmp_path: Path) -> Iterator[ct.ContainerNodes]:
    """2 nodes, torchrun's stand-in and a job that prints `tick N` every 0.2 s, a secret in its environment."""
    made = None
    try:
        made = ct.container_nodes(make_sandbox, ct.short_folder(), torchrun="stand-in", master_port=free_port(),
                                  script="tests/scripts/sleeper.py", script_args=["0.2"])
        data = yaml.safe_load(made.sandbox.inventory.read_text())
        data["defaults"].setdefault("env", {})["TOKEN"] = {"value": SECRET, "secret": True}
        made.sandbox.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
        yield made
    finally:
        ct.discard(made)


def started(out: Path, workers: int = 2, timeout: float = 60) -> str:
    """The run id of the launch writing to `out`, once `workers` ranks print."""
    wait_for(lambda: out.read_text(errors="replace").count("tick 0") >= workers, timeout, "the ranks' first lines")
    return run_id_of(out.read_text())


def nothing_left(nodes: ct.ContainerNodes, run_id: str, within: float = 10) -> None:
    """No process carries the run's mark and no node lists a container of it (or of any run), within `within` s."""
    wait_for(lambda: not run_processes(run_id) and not nodes.left(), within,
             f"the run's processes {run_processes(run_id)} and containers {nodes.left()}")


def test_ddp_in_the_image_on_two_nodes_is_one_world_and_leaves_no_container(trainers, tmp_path: Path) -> None:
    whole = inv("launch", "--hosts", str(trainers.sandbox.inventory), "--script", "train/ddp.py", "--args", TRAIN,
                log_dir=tmp_path / "logs")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert_replicas_in_sync(whole.stdout, world_size=4)
    run_id = run_id_of(whole.stderr)
    nothing_left(trainers, run_id, within=0)
    report = inv("report", "--hosts", str(trainers.sandbox.inventory), "--run", run_id, "--json",
                 log_dir=tmp_path / "logs")
    assert report.returncode == 0, report.stdout + report.stderr
    bars = [b for b in json.loads(report.stdout)["start"] if b["rank"] is None]
    for bar in bars:  # the container's start is a phase of its own, between torchrun's start and the workers'
        assert bar["phases"]["torchrun"] <= bar["phases"]["container"] <= bar["phases"]["hook"], bar
    for i in range(2):  # torchrun ran in the container: it recorded itself from inside, as the run's leader
        run_dir = next(trainers.sandbox.state_dir.glob(f"node-{i}/cache/ddp-launcher/runs/{run_id}/node-{i}"))
        assert json.loads((run_dir / "container.json").read_text())["name"] == f"ddpl-{run_id}-node-{i}"
        assert (run_dir / "container_started").exists() and (run_dir / "leader").exists()


def test_ctrl_c_stops_every_container_and_the_secret_was_never_on_a_command_line(sleepers, tmp_path: Path) -> None:
    out = tmp_path / "launch.out"
    proc = inv_background("launch", "--hosts", str(sleepers.sandbox.inventory), log_dir=tmp_path / "logs", out=out)
    run_id = started(out)
    running = sleepers.containers(run_id)
    assert running == {f"node-{i}": [f"ddpl-{run_id}-node-{i}"] for i in range(2)}, running
    marked = run_processes(run_id)
    workers = [pid for pid in marked if b"RANK=" in Path(f"/proc/{pid}/environ").read_bytes()]
    assert workers and all(f"TOKEN={SECRET}".encode() in Path(f"/proc/{p}/environ").read_bytes() for p in workers)
    command_lines = b"\n".join(_cmdline(p) for p in os.listdir("/proc") if p.isdigit())
    assert SECRET.encode() not in command_lines
    for i, env in enumerate(sleepers.envs):
        inspected = pm.podman(env, "inspect", f"ddpl-{run_id}-node-{i}").stdout
        assert SECRET not in inspected and f"DDP_LAUNCHER_RUN={run_id}/node-{i}" in inspected
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=30) == 130, out.read_text()
    assert time.monotonic() - t0 < 15
    nothing_left(sleepers, run_id)
    assert "stopping the run on every node" in out.read_text()


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_detached_run_in_containers_has_status_logs_stacks_and_stop(sleepers, tmp_path: Path) -> None:
    hosts = str(sleepers.sandbox.inventory)
    result = inv("launch", "--hosts", hosts, "--detach", log_dir=tmp_path / "logs", timeout=60)
    assert result.returncode == 0, result.stderr
    run_id = run_id_of(result.stderr)
    try:
        wait_for(lambda: len(run_processes(run_id)) >= 4, 60, "torchrun and a worker on each node")
        status = inv("status", "--hosts", hosts, "--run", run_id)
        assert status.stdout.count("running") == 2, status.stdout + status.stderr
        stacks = inv("stacks", "--hosts", hosts, "--run", run_id, timeout=60)
        assert stacks.returncode == 0, stacks.stdout + stacks.stderr
        assert f"run {run_id}: ranks 0,1 are in time.sleep (sleeper.py:10)" in stacks.stdout, stacks.stdout
        top = inv("top", "--hosts", hosts, "--run", run_id, "--once", "--json", timeout=60)
        assert top.returncode == 0, top.stdout + top.stderr
        ranks = json.loads(top.stdout)["ranks"]  # the container's processes, as the node's /proc shows them
        assert sorted(r["rank"] for r in ranks) == [0, 1] and all(r["pid"] in run_processes(run_id) for r in ranks)
        logs = inv("logs", "--hosts", hosts, "--run", run_id, "--node", "node-1")
        assert "node-1 r1" in logs.stdout and "tick" in logs.stdout, logs.stdout
        stopped = inv("stop", "--hosts", hosts, "--run", run_id, timeout=60)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        nothing_left(sleepers, run_id)
        after = inv("status", "--hosts", hosts, "--run", run_id)
        assert after.stdout.count("│ stopped") == 2, after.stdout  # each node's state
        assert "stopped by the user (" in after.stdout, after.stdout
    finally:
        if run_processes(run_id):
            inv("stop", "--hosts", hosts, "--run", run_id, timeout=60)


def test_a_failing_rank_fails_the_run_fast_and_every_container_goes(sleepers, tmp_path: Path) -> None:
    result = inv("launch", "--hosts", str(sleepers.sandbox.inventory), "--script", "tests/scripts/exit_on_node.py",
                 "--args", "1 3", log_dir=tmp_path / "logs", timeout=120)
    assert result.returncode == 3, result.stderr
    assert "root cause: node-1, rank 1 (local rank 0), exit code 3" in result.stderr, result.stderr
    nothing_left(sleepers, run_id_of(result.stderr))
    # The Python API, the image named in the call (`--image`) over a bare inventory: the same run, the same end.
    data = yaml.safe_load(sleepers.sandbox.inventory.read_text())
    box = data["defaults"].pop("container")
    bare = tmp_path / "bare.yaml"
    bare.write_text(yaml.safe_dump(dict(data, defaults=dict(data["defaults"], container={
        k: v for k, v in box.items() if k != "image"} | {"image": "localhost/nothing:0"})), sort_keys=False))
    lines: list[str] = []
    ended = api.launch(bare, "tests/scripts/exit_on_node.py", args=["1", "3"], image=ct.TAG, log_dir=tmp_path / "api",
                       on_output=lines.append, on_message=lines.append)
    assert (ended.exit_code, ended.failed_node, ended.failed_rank) == (3, "node-1", 1), ended
    nothing_left(sleepers, ended.run_id)


@pytest.mark.parametrize("victim", ["launcher", "agent"])
def test_a_killed_launcher_or_agent_leaves_no_container(sleepers, tmp_path: Path, victim: str) -> None:
    """kill -9 of the launcher (the nodes stop their part after the heartbeat bound) or of node-1's agent (the
    launcher sweeps the node over a new session): the containers go with the processes."""
    out = tmp_path / "launch.out"
    proc = inv_background("launch", "--hosts", str(sleepers.sandbox.inventory), "--heartbeat-timeout", "4",
                          "--grace", "1", log_dir=tmp_path / "logs", out=out)
    run_id = started(out)
    if victim == "launcher":
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGKILL)
        nothing_left(sleepers, run_id, within=30)
        assert time.monotonic() - t0 < 4 + 1 + 10
    else:
        run_dir = next(sleepers.sandbox.state_dir.glob(f"node-1/cache/ddp-launcher/runs/{run_id}/node-1"))
        agent = int((run_dir / "supervisor").read_text().split()[0])
        os.kill(agent, signal.SIGKILL)
        assert proc.wait(timeout=60) == 1, out.read_text()
        nothing_left(sleepers, run_id)
        assert "root cause: node-1: the launcher's agent on the node died" in out.read_text()
    assert parent  # (imported for the tests' shared helpers)


def test_a_hang_inside_the_containers_is_named_by_rank_and_frame_and_stopped(make_sandbox, tmp_path: Path) -> None:
    """gloo, 2 nodes x 1 rank: rank 1 sleeps before an all_reduce rank 0 already entered. The hang watch takes the
    stacks through the hook inside the image, names the odd rank and its line, stops the run: nothing left."""
    made = None
    try:
        made = ct.container_nodes(make_sandbox, ct.short_folder(), torchrun="stand-in", master_port=free_port(),
                                  script="tests/scripts/hang_rank.py", script_args=["1", "600"])
        out = tmp_path / "launch.out"
        proc = inv_background("launch", "--hosts", str(made.sandbox.inventory), "--hang-timeout", "8",
                              "--skip-doctor", log_dir=tmp_path / "logs", out=out)
        assert proc.wait(timeout=120) == 124, out.read_text()
        text = out.read_text()
        assert re.search(r"hang suspected \(no progress for \d+ s\): rank 0 waits in all_reduce \(hang_rank\.py:20\); "
                         r"rank 1 \(node-1, pid \d+\) is in time\.sleep \(hang_rank\.py:19\)", text), text
        nothing_left(made, run_id_of(text))
    finally:
        ct.discard(made)
