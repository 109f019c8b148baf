"""From a hang back to training, unattended (`--on-hang restart`), on 3 real sshd nodes: a job that checkpoints, and
whose rank on one node sleeps for ever at a step. Judged by what a user leaves overnight and reads in the morning:
the exit code, the attempts' lines, the evidence kept, the run resumed where it was, nothing left on any node."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from devtools.observe import free_port
from tests.helpers import PAGE_ON, inv, run_ids, run_processes, wait_for

SCRIPT = "bench/workloads/hang_at_step.py"
AT, EVERY, TOTAL = 12, 5, 48
"""The rank hangs when it reaches step 12, with a checkpoint every 5 steps (the last at 10); a run is 48 steps:
long enough after its resume for a heartbeat (every 1.5 s at --silence-timeout 6) to carry its first step."""


def box_of(make_sandbox, tmp_path: Path, who: str):
    return make_sandbox(3, torchrun="stand-in", master_port=free_port(), script=SCRIPT,
                        script_args=[str(tmp_path / "ckpt.pt"), str(TOTAL), str(AT), who, str(EVERY)])


def restart(box, tmp_path: Path, retries: int):
    return inv("launch", "--hosts", str(box.inventory), "--retries", str(retries), "--on-hang", "restart",
               "--hang-timeout", "5", "--silence-timeout", "6", log_dir=tmp_path / "logs", timeout=300,
               env={"INVOKE_LAUNCHER_RETRY_WAIT": "0.5", "INVOKE_LAUNCHER_GRACE": "1", **PAGE_ON})


def test_a_hang_restarts_without_the_node_that_held_it_and_the_run_resumes_to_its_end(make_sandbox,
                                                                                       tmp_path: Path) -> None:
    box = box_of(make_sandbox, tmp_path, "node-1")
    result = restart(box, tmp_path, retries=1)
    said = result.stderr
    assert result.returncode == 0, said
    first, second = run_ids(said)[:2]
    assert "stopping this attempt (--on-hang restart: what follows is said below)" in said, said
    assert (f"attempt 1 of 2 failed: it hung after {AT - 1} optimizer steps: node-1 held the run up (rank 1); "
            "checking the nodes again") in said, said
    assert f"node-1 sits out: its rank 1 held the run up after {AT - 1} optimizer steps" in said, said
    # The script takes no argument beyond its own: the attempt reaches it in its environment, not as `--resume`.
    assert ("attempt 2: 2 node(s) (node-0, node-2), the same arguments (DDP_LAUNCHER_ATTEMPT=2; job.resume_args adds "
            "some)") in said, said
    assert "resumed from step 10" in result.stdout and "done rank 1 at step 48" in result.stdout, result.stdout
    lines = said[said.rindex("attempts:"):]
    assert re.search(rf"attempt 1 \(run {first}\) on node-0, node-1, node-2; master node-0: it hung after "
                     rf"{AT - 1} optimizer steps: node-1 held the run up \(rank 1\) after \d+ s", lines), lines
    assert re.search(rf"attempt 2 \(run {second}\) on node-0, node-2; master node-0; node-1 sat out \(its rank 1 "
                     rf"held the run up after {AT - 1} optimizer steps\); resumed at step 1[01]: exit 0 after \d+ s; "
                     r"training again \d+ s after the hang began", lines), lines
    # the evidence, in the first attempt's own folder: every rank's stack, the verdict as data
    [kept] = (tmp_path / "logs" / first).glob("stacks-*")
    assert {p.name for p in kept.glob("*.txt")} >= {"node-0-r0.txt", "node-1-r1.txt", "node-2-r2.txt", "answer.txt"}
    verdict = json.loads((kept / "verdict.json").read_text())
    assert verdict["suspects"] == [{"node": "node-1", "rank": 1}] and verdict["counted"] == AT - 1, verdict
    # its lines named step 12 (`rank 1 hangs before step 12`), a step no rank made: the counted steps say it
    assert verdict["step"] == AT
    collectives = verdict["collectives"]  # each rank's, as the second look read them
    assert set(collectives) == {"node-0-r0", "node-1-r1", "node-2-r2"} and collectives["node-0-r0"], collectives
    assert run_processes(first) == [] and run_processes(second) == []
    status = inv("status", "--hosts", str(box.inventory), "--run", second, log_dir=tmp_path / "logs")
    assert f"run {second} is one of 2 attempts of a launch" in status.stdout, status.stdout
    assert "node-1 sat out (its rank 1 held the run up" in status.stdout, status.stdout
    # one page for the launch: each attempt's says them all, and the time of the whole
    page = tmp_path / "logs" / second / "report.html"
    wait_for(page.exists, 90, f"{page} (written by the page's own process)", interval=0.5)
    text = page.read_text()
    assert re.search(r"this attempt took [\d.]+ s[^&]*, the launch [\d.]+ s over 2 attempts", text), text
    assert "This run is one of the 2 attempts of its launch" in text, text
    assert html.escape(f"node-1 sat out (its rank 1 held the run up after {AT - 1} optimizer steps)") in text, text
    assert "No hang, straggler, restart, lost node or stop during this attempt (the others: section 4)" in text


def test_the_same_hang_on_another_node_is_the_programs_and_no_attempt_follows(make_sandbox, tmp_path: Path) -> None:
    """Global rank 1 hangs, whichever node holds it: node-1 sits out, and the next attempt hangs at the same step on
    node-2. The launch stops there (exit code 124) and says it is the program, not a node."""
    box = box_of(make_sandbox, tmp_path, "rank:1")
    result = restart(box, tmp_path, retries=2)
    said = result.stderr
    assert result.returncode == 124, said
    assert len(run_ids(said)) == 2, said
    assert ("the run hung at the same step twice, on node-1 then node-2: the program, not a node (no retry: it "
            "would hang there again)") in said, said
    assert all(run_processes(run_id) == [] for run_id in run_ids(said))


def test_a_static_restart_takes_a_named_spare_and_keeps_its_world_size(make_sandbox, tmp_path: Path) -> None:
    """issue 69 (11b): node-2 is the inventory's spare. node-1's rank hangs; on the restart node-1 sits out and
    node-2 takes its place: 2 nodes, world size 2, as the run began (it shrank to 1 node before)."""
    import yaml

    from tests.helpers import edit_inventory

    box = box_of(make_sandbox, tmp_path, "node-1")
    hosts = yaml.safe_load(box.inventory.read_text())["hosts"]
    edit_inventory(box.inventory, hosts=hosts[:2], spares=hosts[2:])
    dry = inv("launch", "--hosts", str(box.inventory), "--dry-run")
    assert dry.returncode == 0 and "node 2:" not in dry.stdout, dry.stdout
    assert "spares: node-2 (no run starts there; a retry takes one that passes the checks" in dry.stdout, dry.stdout
    result = restart(box, tmp_path, retries=1)
    said = result.stderr
    assert result.returncode == 0, said
    assert "node-1 sits out: its rank 1 held the run up" in said, said
    assert "  node-2 (a spare) takes a place: the run keeps its 2 node(s)" in said, said
    assert "attempt 2: 2 node(s) (node-0, node-2)" in said, said
    # world size 2 again: rank 1 lives on node-2 now, and finishes the run
    assert re.search(r"node-2 r1 +\| done rank 1 at step 48", result.stdout), result.stdout
    assert all(run_processes(run_id) == [] for run_id in run_ids(said))
