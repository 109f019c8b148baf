"""A run that loses a node goes on, for real: sshd nodes, torchrun, train/ddp.py, a node killed mid-epoch.

Static rendezvous + `--retries`: the launcher starts the run again on the nodes that pass the doctor, as its
DDP_LAUNCHER_ATTEMPT=2, which train/ddp.py resumes on (a new master when the old one is gone). c10d + `nodes:
MIN:MAX` + `max_restarts`: torchrun re-forms the group itself and the launcher lets it. A script that raises on
every rank is not retried.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from devtools import sandbox
from devtools.observe import children, free_port, pids_with_env, process_name, sshd_family
from tests._train_helpers import assert_replicas_in_sync
from tests.helpers import edit_inventory, inv, inv_background, run_id_of, run_ids, run_processes, wait_for

pytestmark = pytest.mark.integration

# 3 nodes x 1 rank: 12 steps per epoch at a global batch of 48; checkpoints every 4 steps; slow enough to kill.
TRAIN = ("--epochs 2 --dataset-size 576 --batch-size 16 --log-every 4 --checkpoint-every 4 "
         "--sleep-per-step 0.25")
SAVED = re.compile(r"checkpoint saved \S+ step (\d+)")


def launch_background(inventory: Path, args: str, logs: Path, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    return inv_background("launch", "--hosts", str(inventory), "--script", "train/ddp.py", "--args", args, *extra,
                          log_dir=logs, out=out, env={"INVOKE_LAUNCHER_RETRY_WAIT": "0.5"})


def kill_node(box, index: int, run_id: str) -> None:
    """Node `index` dies: its run's processes and its agent by SIGKILL, then its sshd (no more connections)."""
    name = box.nodes[index].name
    family = sshd_family(box.nodes[index].pid)
    agents, below = [], [c for pid in family for c in children(pid) if c not in family]
    while below:  # the agent may be a login shell's child: every python below the sessions, never a shell (a
        # login's `pyenv rehash` killed in its lock leaves the lock behind, and every later login waits on it)
        agents += [c for c in below if (process_name(c) or "").startswith("python")]
        below = [c for pid in below for c in children(pid)]
    for pid in [*agents, *pids_with_env(f"DDP_LAUNCHER_RUN={run_id}/{name}".encode())]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    sandbox.stop_node(box.state_dir, index)


def wait_for_checkpoint(out: Path, timeout: float = 90) -> int:
    wait_for(lambda: SAVED.search(out.read_text(errors="replace")), timeout, "a checkpoint")
    return int(SAVED.findall(out.read_text(errors="replace"))[0])


def final_checksums(text: str, world: int) -> str:
    """The checksum every rank printed after the last resume (they must agree): the final weights."""
    assert "resumed from" in text, text
    return assert_replicas_in_sync(text[text.rfind("resumed from"):], world_size=world)


@pytest.mark.parametrize("victim", [2, 0], ids=["a-worker-node", "the-master"])
def test_static_run_retries_on_the_nodes_left(make_sandbox, tmp_path: Path, victim: int) -> None:
    box = make_sandbox(3, master_port=free_port())
    ckpt = tmp_path / "ckpt"
    out = tmp_path / "out"
    proc = launch_background(box.inventory, f"{TRAIN} --checkpoint-dir {ckpt}", tmp_path / "logs", out,
                             "--retries", "1")
    try:
        step = wait_for_checkpoint(out)
        first = run_ids(out.read_text())[0]
        kill_node(box, victim, first)
        shutil.copytree(ckpt, tmp_path / "at-kill")  # what the retry resumes from (the survivors save no more)
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text(errors="replace")
    assert code == 0, text
    survivors = [n.name for i, n in enumerate(box.nodes) if i != victim]
    ids = run_ids(text)
    assert len(ids) == 2, text
    assert re.search(rf"attempt 1 \(run {ids[0]}\) on node-0, node-1, node-2; master node-0: "
                     rf"node-{victim} was lost", text), text
    assert re.search(rf"attempt 2 \(run {ids[1]}\) on {', '.join(survivors)}; master {survivors[0]}; node-{victim} sat "
                     rf"out \([^)]*\)(; resumed at step {step})?: exit 0", text), text  # the step: once a beat said it
    assert f"node-{victim} sits out: " in text
    assert "no node of the run can be reached" not in text  # the others were: they ended, failing without it
    assert ("new master: node-1" in text) == (victim == 0)
    assert f"resumed from {ckpt / 'checkpoint.pt'} at step {step}" in text, text
    for run_id in ids:
        assert run_processes(run_id) == []
    assert all(f"{name} " in line for line in text.splitlines() if "resumed from" in line for name in survivors[:1])
    checksum = final_checksums(text, 2)
    status = inv("status", "--hosts", str(box.inventory), "--run", ids[1], log_dir=tmp_path / "logs")
    assert f"run {ids[1]} is one of 2 attempts of a launch (--retries):" in status.stdout, status.stdout
    assert f"attempt 1 (run {ids[0]}) on node-0, node-1, node-2" in status.stdout
    if victim == 2:  # the same two nodes, resumed by hand from the same checkpoint: the same weights
        reference = inv("launch", "--hosts", str(box.inventory), "--exclude", "node-2", "--skip-doctor",
                        "--script", "train/ddp.py", "--args", f"{TRAIN} --checkpoint-dir {tmp_path / 'at-kill'} "
                        "--resume", log_dir=tmp_path / "logs")
        assert reference.returncode == 0, reference.stdout + reference.stderr
        assert assert_replicas_in_sync(reference.stdout, world_size=2) == checksum


def test_c10d_group_goes_on_without_a_lost_node(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(3, master_port=free_port())
    edit_inventory(box.inventory, rendezvous={
        "master_addr": "node-0", "master_port": box_port(box), "backend": "c10d", "nodes": "2:3", "max_restarts": 1,
        "conf": {"last_call_timeout": 1, "keep_alive_interval": 1, "keep_alive_max_attempt": 3}})
    ckpt = tmp_path / "ckpt"
    out = tmp_path / "out"
    proc = launch_background(box.inventory, f"{TRAIN} --checkpoint-dir {ckpt}", tmp_path / "logs", out)
    try:
        wait_for_checkpoint(out)
        run_id = run_ids(out.read_text())[0]
        torchrun = [pid for pid in pids_with_env(f"DDP_LAUNCHER_RUN={run_id}/node-2".encode())
                    if b"torch.distributed.run" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(torchrun) == 1
        t0 = time.monotonic()
        os.kill(torchrun[0], signal.SIGKILL)
        code = proc.wait(timeout=180)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text(errors="replace")
    assert code == 0, text
    assert "node-2 left the run (exit code 137); 2 node(s) go on (the c10d group needs 2)" in text, text
    assert len(run_ids(text)) == 1 and "attempt 2" not in text  # torchrun re-formed the group: no relaunch
    assert re.search(r"run \S+: 2 node\(s\) exited 0 \(node-0, node-1\); node-2 left \(exit code 137\)", text), text
    assert "resumed from" in text  # the restarted workers went on from the checkpoint
    final_checksums(text, 2)
    assert run_processes(run_id) == []
    print(f"node lost -> the group finished on 2 nodes in {took:.1f}s")
    # The run's page marks the node that left and the workers torchrun started again on the others (#49).
    said = inv("report", "--hosts", str(box.inventory), "--run", run_id, "--json", log_dir=tmp_path / "logs")
    assert said.returncode == 0, said.stderr
    marks = json.loads(said.stdout)["marks"]
    assert any(m["kind"] == "left" and m["node"] == "node-2" for m in marks), marks
    restarted = {m["node"] for m in marks if m["kind"] == "restart"}
    assert restarted == {"node-0", "node-1"}, marks
    assert (tmp_path / "logs" / run_id / "report.html").exists()


def box_port(box) -> int:
    import yaml

    return int(yaml.safe_load(box.inventory.read_text())["rendezvous"]["master_port"])


def test_a_script_error_on_every_rank_is_not_retried(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, master_port=free_port())
    result = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", "--retries", "2", "--script",
                 "train/ddp.py", "--args", "--epochs 1 --dataset-size 64 --batch-size 8 --fail-at 2 --fail-rank -1",
                 log_dir=tmp_path / "logs")
    assert result.returncode == 1, result.stdout + result.stderr
    err = result.stderr
    assert re.search(r"root cause: node-\d, rank \d \(local rank 0\), exit code 1", err), err
    assert "not retried: the script itself failed" in err
    assert "attempt 1 (run " in err and "attempt 2" not in err
    assert run_processes(run_id_of(err)) == []


def test_a_c10d_run_with_a_spare_host_finds_its_hang_and_the_spare_ends_quietly(make_sandbox, tmp_path: Path) -> None:
    # issue 69 (11a): 3 hosts, `nodes: 2`: torchrun keeps the third as a spare, with no worker. Its beats held the
    # hang watch's clock (a rank asleep 147 s at --hang-timeout 15 was never found); at the end it printed torch's
    # RendezvousConnectionError traceback, and the page named it the root cause of a run that ended as its job did.
    box = make_sandbox(3, master_port=free_port(), script="tests/scripts/hang_rank.py", script_args=["1", "600"])
    edit_inventory(box.inventory, rendezvous={
        "master_addr": "node-0", "master_port": box_port(box), "backend": "c10d", "nodes": 2,
        "conf": {"last_call_timeout": 1}})
    out, logs = tmp_path / "out", tmp_path / "logs"
    proc = inv_background("launch", "--hosts", str(box.inventory), "--hang-timeout", "10", "--skip-doctor",
                          log_dir=logs, out=out)
    try:
        wait_for(lambda: out.read_text(errors="replace").count("step 1") == 2, 120, "both ranks' second step")
        hang_began = time.monotonic()
        code = proc.wait(timeout=120)
        took = time.monotonic() - hang_began
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = out.read_text(errors="replace")
    assert code == 124, text
    assert took < 2 * 10 + 10, f"{took:.1f} s from the hang to the end\n{text}"
    assert re.search(r"hang suspected \(no progress for \d+ s\): .*rank 1 \(node-\d, pid \d+\) is in time\.sleep",
                     text), text
    run_id = run_id_of(text)
    assert run_processes(run_id) == []
    spare = re.search(r"(node-\d) stands by as a spare: the c10d group takes 2 of the 3 hosts", text)
    assert spare, text
    # A run that ends as its job did: the spare's end is one line, and no failure.
    done = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", "--silence-timeout", "6", "--args", "1 10 3",
               log_dir=logs)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    spare = re.search(r"(node-\d) stands by as a spare", said)
    assert spare, said
    node = spare.group(1)
    assert "RendezvousConnectionError" not in said and "Traceback" not in said, said  # 98 lines before
    assert re.search(rf"{node} +\| stood by as a spare; torchrun's \d+ line\(s\) \(its wait, its end\) are in ",
                     said), said
    assert re.search(rf"run \S+: 2 node\(s\) exited 0 \(node-\d, node-\d\); {node} stood by as a spare "
                     r"\(no worker ran there\)\.", said), said
    second = run_id_of(said)
    report = inv("report", "--hosts", str(box.inventory), "--run", second, "--json", log_dir=logs)
    assert report.returncode == 0, report.stderr
    summary = json.loads(report.stdout)
    assert summary["root_cause"] is None, summary  # it said `root cause: node-1 exited (exit code 1)`
    assert any(m["kind"] == "spare" and m["node"] == node for m in summary["marks"]), summary["marks"]
