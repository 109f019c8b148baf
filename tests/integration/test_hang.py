"""A run alive but stuck, on real sandbox nodes (2 nodes x 2 ranks, gloo): the launcher finds it, takes every
rank's stack from outside the script, names the odd rank and where it is, and stops the run (or keeps it); a hang
whose threads keep every CPU busy is found too, NCCL's flight recorder (a stand-in) asked for its dumps first; a
healthy run silent and busy for longer than the timeout goes on."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from devtools.observe import free_port
from devtools.sandbox import Sandbox
from tests.helpers import REPO, inv, inv_background, run_id_of, run_processes, wait_for

SCRIPT = "tests/scripts/hang_rank.py"
ANSWER = re.compile(r"hang suspected \(no progress for (\d+) s\): ranks 0,2,3 wait in all_reduce \(hang_rank\.py:20\); "
                    r"rank 1 \(node-0, pid (\d+)\) is in time\.sleep \(hang_rank\.py:19\)")


@pytest.fixture
def hang_box(make_sandbox):
    # Rank 1 (node-0's second) sleeps for 10 minutes before an all_reduce that ranks 0, 2 and 3 already entered.
    return make_sandbox(2, torchrun="stand-in",
                        nproc_per_node=2, master_port=free_port(), script=SCRIPT, script_args=["1", "600"])


def _worker_of(run_id: str, rank: int) -> int:
    """The pid of the run's worker of global rank `rank` (its environment says RANK)."""
    for pid in run_processes(run_id):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and any(e.startswith(b"LOCAL_RANK=") for e in env):
            return pid
    raise AssertionError(f"no worker of rank {rank} in run {run_id}")


def _launch(box: Sandbox, tmp_path: Path, hang_timeout: str, *options: str
            ) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """`inv launch --skip-doctor` of the box's job in the background, its hang timeout given: (the process, the file
    its output goes to, its log dir)."""
    out, logs = tmp_path / "launch.out", tmp_path / "logs"
    proc = inv_background("launch", "--hosts", str(box.inventory), "--hang-timeout", hang_timeout, *options,
                          "--skip-doctor", log_dir=logs, out=out)
    return proc, out, logs


def test_a_hung_rank_is_named_with_its_line_the_stacks_are_kept_and_the_run_is_stopped(hang_box, tmp_path: Path
                                                                                       ) -> None:
    proc, out, logs = _launch(hang_box, tmp_path, "10", "--on-hang", "restart")  # and no retries: a stop, said
    wait_for(lambda: out.read_text(errors="replace").count("step 1") == 4, 120, "every rank's second step")
    hang_began = time.monotonic()  # rank 1 sleeps from here; the others wait in all_reduce
    run_id = run_id_of(out.read_text())
    assert proc.wait(timeout=120) == 124
    took = time.monotonic() - hang_began
    text = out.read_text(errors="replace")
    found = ANSWER.search(text)
    assert found, text
    assert took < 10 + 15, f"{took:.1f} s from the hang to the end"  # the timeout, then stacks and the stop
    folder = next((logs / run_id).glob("stacks-*"))
    assert sorted(p.name for p in folder.glob("*-r*.txt")) == ["node-0-r0.txt", "node-0-r1.txt", "node-1-r2.txt",
                                                               "node-1-r3.txt"]
    assert "in <module>" in (folder / "node-0-r1.txt").read_text()
    assert "stopping the run" in text and f"stacks of every rank: {folder}" in text
    assert ("note: on_hang: restart starts the run again as one of its retries, and it has none (--retries N, or the "
            "inventory's retries): a hang stops the run") in text, text
    assert run_processes(run_id) == []
    status = inv("status", "--hosts", str(hang_box.inventory), "--run", run_id, log_dir=logs)
    assert "last hang suspected" in status.stdout and "rank 1 (node-0" in status.stdout


def test_kept_on_a_hang_then_stacks_from_another_terminal_then_stop(make_sandbox, tmp_path: Path) -> None:
    script = tmp_path / "hang_rank.py"  # its own copy: the test edits it while the run hangs
    script.write_text((REPO / SCRIPT).read_text())
    box = make_sandbox(2, torchrun="stand-in", nproc_per_node=2, master_port=free_port(), script=str(script),
                       script_args=["1", "600"])
    proc, out, logs = _launch(box, tmp_path, "8", "--on-hang", "keep")
    try:
        wait_for(lambda: "the run goes on (--on-hang keep)" in out.read_text(errors="replace"), 120, "a kept hang")
        run_id = run_id_of(out.read_text())
        assert proc.poll() is None and len(run_processes(run_id)) >= 6  # torchrun and 2 workers a node: still there
        # issue 69 (12): the user edits the script while its run hangs (every line shifts by two); the stacks are
        # read as the ranks run it, not as it is now
        script.write_text("# an edit while it trains\nimport os\n" + script.read_text())
        t0 = time.monotonic()
        stacks = inv("stacks", "--hosts", str(box.inventory), log_dir=logs)
        assert time.monotonic() - t0 < 10
        assert stacks.returncode == 0, stacks.stderr
        assert re.search(r"ranks 0,2,3 wait in all_reduce \(hang_rank\.py:20\); rank 1 \(node-0, pid \d+\) is in "
                         r"time\.sleep \(hang_rank\.py:19\)", stacks.stdout), stacks.stdout
        # every rank's collectives, read by its worker's thread: the rank that never entered the all_reduce
        assert re.search(r"collectives: rank 1 never entered all_reduce #\d+ of default_pg \(its last: #\d+\), which "
                         r"ranks 0,2,3 entered \d+ s ago", stacks.stdout), stacks.stdout
        assert proc.poll() is None  # taking stacks stopped nothing
        stop = inv("stop", "--hosts", str(box.inventory), log_dir=logs)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        proc.wait(timeout=60)
        assert run_processes(run_id) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_stopped_rank_is_reported_as_stopped_by_rank_and_node(make_sandbox, tmp_path: Path) -> None:
    # Every rank steps on; rank 3 is SIGSTOPped mid-run, so the others block in their next all_reduce.
    box = make_sandbox(2, torchrun="stand-in",
                       nproc_per_node=2, master_port=free_port(), script=SCRIPT, script_args=["9", "0", "100000"])
    proc, out, _ = _launch(box, tmp_path, "10")
    wait_for(lambda: "step 20" in out.read_text(errors="replace"), 120, "the run stepping")
    run_id = run_id_of(out.read_text())
    stopped = _worker_of(run_id, 3)
    os.kill(stopped, signal.SIGSTOP)
    assert proc.wait(timeout=120) == 124
    text = out.read_text(errors="replace")
    assert re.search(r"ranks 0-2 wait in all_reduce \(hang_rank\.py:\d+\); rank 3 \(node-1, pid "
                     + str(stopped) + r"\) is stopped \(state T\)", text), text
    assert run_processes(run_id) == []
    assert REPO.exists()


def test_an_nccl_timeout_that_ends_the_run_brings_the_flight_recorder_dumps_back(make_sandbox, tmp_path: Path
                                                                                 ) -> None:
    # No GPU here: the job writes the dumps where NCCL's watchdog would, then fails as the watchdog makes it fail.
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/nccl_timeout.py")
    logs = tmp_path / "logs"
    result = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", log_dir=logs, timeout=120)
    assert result.returncode == 1, result.stderr
    run_id = run_id_of(result.stdout + result.stderr)
    folder = logs / run_id / "nccl"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {
        f"nccl_trace_rank_{r}": f"flight recorder of rank {r}".encode() for r in (0, 1)}
    said = result.stdout + result.stderr
    assert f"read them with `torchfrtrace {folder} -p nccl_trace_rank_`" in said, said
    assert "NCCL flight recorder: 2 dump(s)" in said, said


SPIN = re.compile(r"hang suspected \(no progress for (\d+) s\): rank 0 waits in all_reduce \(spin_hang\.py:\d+\); "
                  r"rank 1 \(node-1, pid \d+\) is in time\.sleep \(spin_hang\.py:\d+\)")


def test_a_hang_whose_threads_spin_is_found_and_the_flight_recorder_is_asked_first(make_sandbox, tmp_path: Path
                                                                                     ) -> None:
    # Every rank's CPU stays busy (a polling thread, as NCCL's proxy thread): only the stacks tell the hang.
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/spin_hang.py")
    proc, out, logs = _launch(box, tmp_path, "10")
    wait_for(lambda: out.read_text(errors="replace").count("step 4") == 2, 120, "every rank's fifth step")
    hang_began = time.monotonic()  # rank 1 sleeps from here; rank 0 waits in all_reduce
    run_id = run_id_of(out.read_text())
    assert proc.wait(timeout=120) == 124
    took = time.monotonic() - hang_began
    text = out.read_text(errors="replace")
    assert SPIN.search(text), text
    assert took < 60, f"{took:.1f} s from the hang to the end"
    nccl = next((logs / run_id).glob("stacks-*")) / "nccl"
    assert {p.name: p.read_bytes().split(b",")[0] for p in nccl.iterdir()} == {
        f"nccl_trace_rank_{r}": f"flight recorder of rank {r}".encode() for r in (0, 1)}
    assert f"NCCL flight recorder: 2 dump(s) in {nccl}; read them with `torchfrtrace {nccl} -p nccl_trace_rank_`" \
        in text, text
    assert "stopping the run" in text and run_processes(run_id) == []


GPU_SYNC = re.compile(r"hang suspected \(no progress for \d+ s\): rank 0 is in loss\.item \(gpu_sync_hang\.py:\d+\); "
                      r"rank 1 \(node-1, pid \d+\) is in time\.sleep \(gpu_sync_hang\.py:\d+\)")


def test_a_gpu_ranks_wait_in_loss_item_is_a_hang_when_the_flight_recorder_shows_its_collective_in_flight(
        make_sandbox, tmp_path: Path) -> None:
    # As on an H100: rank 0's host waits in loss.item() behind an all-reduce that rank 1 never entered; its stack
    # shows no collective, its flight recorder (a stand-in writing torch's format) does. The watch says so and keeps
    # the run (--on-hang keep); `inv stacks` from another terminal asks the recorder too, and says the same.
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/gpu_sync_hang.py")
    proc, out, logs = _launch(box, tmp_path, "8", "--on-hang", "keep")
    try:
        wait_for(lambda: "the run goes on (--on-hang keep)" in out.read_text(errors="replace"), 150, "a kept hang")
        text = out.read_text(errors="replace")
        assert GPU_SYNC.search(text), text
        assert ("why a hang: rank 0 waits in a collective, and rank 1 is stuck; no stack moved in 3 s; NCCL's flight "
                "recorder: all_reduce #6 of default_pg has not completed on rank 0; rank 1 never entered it (its "
                "last: #5)") in text, text
        assert "but not a hang" not in text, text
        run_id = run_id_of(text)
        assert sorted(p.name for p in next((logs / run_id).glob("stacks-*")).glob("nccl/*")) == [
            "nccl_trace_rank_0", "nccl_trace_rank_1"]
        stacks = inv("stacks", "--hosts", str(box.inventory), log_dir=logs)
        assert stacks.returncode == 0, stacks.stderr
        said = stacks.stdout + stacks.stderr
        assert re.search(r"rank 0 is in loss\.item \(gpu_sync_hang\.py:\d+\); rank 1 \(node-1, pid \d+\) is in "
                         r"time\.sleep", said), said
        assert ("NCCL's flight recorder: all_reduce #6 of default_pg has not completed on rank 0; rank 1 never "
                "entered it (its last: #5)") in said, said
    finally:
        stop = inv("stop", "--hosts", str(box.inventory), log_dir=logs)
        proc.wait(timeout=60)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert run_processes(run_id) == []


def test_every_rank_idle_outside_any_collective_is_a_stall_that_on_hang_acts_on(make_sandbox, tmp_path: Path) -> None:
    """Every rank asleep (a dead mount, a stuck data source): no rank waits for another, so no look finds a hang, and
    the run would go on `not a hang` for ever; each look says how long every rank has been idle and when that is a
    stall (4 hang timeouts), and then `--on-hang` acts on it as on a hang: stopped, exit code 124, in its own words."""
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/all_idle.py", script_args=["3", "600"])
    result = inv("launch", "--hosts", str(box.inventory), "--hang-timeout", "2", "--skip-doctor",
                 log_dir=tmp_path / "logs", timeout=90)
    said = result.stdout + result.stderr
    assert result.returncode == 124, said
    assert re.search(r"no progress for \d+ s, but not a hang \(no rank waits for the others in a collective; every "
                     r"rank idle \d+ s \(a stall at 8 s\)\): ranks 0,1 are in time\.sleep \(all_idle\.py:12\); the "
                     r"run goes on", said), said
    assert re.search(r"stalled \(no progress for \d+ s\): ranks 0,1 are in time\.sleep \(all_idle\.py:12\)", said), said
    assert re.search(r"why a stall: every rank has been idle for \d+ s \(8 s: 4x the hang timeout\), none waiting for "
                     r"another", said), said
    assert "hang suspected" not in said and run_processes(run_id_of(said)) == []


def test_a_run_silent_and_busy_for_longer_than_the_timeout_goes_on_and_says_what_was_seen(make_sandbox,
                                                                                         tmp_path: Path) -> None:
    # Rank 0 writes a checkpoint for 44 s, silent; rank 1 sleeps 22 s on a slow write, then waits in the barrier.
    # The watch looks at ~10-13 s (rank 1 asleep) and again at ~23-26 s (rank 1 in the barrier); the save ends after
    # (at 30 s, a loaded machine's second look came as the run ended: no stack from either rank; with rank 1 asleep
    # for 18 s, a first look slowed to 17 s on 4 workers found it in the barrier already).
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/busy_save.py", script_args=["44", "22"])
    logs = tmp_path / "logs"
    result = inv("launch", "--hosts", str(box.inventory), "--hang-timeout", "10", "--skip-doctor", log_dir=logs,
                 timeout=240)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said
    assert result.stdout.count("step 5") == 2 and "hang suspected" not in said
    seen = [line for line in said.splitlines() if "but not a hang" in line]
    assert seen, said
    assert re.search(r"no progress for \d+ s, but not a hang \((rank 0 is busy, not waiting|the stack of rank 0 moved "
                     r"between two looks 3 s apart)\): rank 0 is in save_checkpoint \(busy_save\.py:\d+\); rank 1 "
                     r"\(node-1, pid \d+\) is in time\.sleep \(busy_save\.py:\d+\); the run goes on", seen[0]), seen
    # (under load a third look may come as the run ends, both ranks in destroy_process_group: not asserted)
    # the look while rank 1 waits in the barrier: rank 0 is behind, and at work (the collectives name the suspect)
    assert any(re.search(r"rank 0 never entered barrier #\d+ of default_pg \(its last: #\d+\), which rank 1 "
                         r"entered; but rank 0 \(node-0, pid \d+\) is at work", line) for line in seen), seen
