"""Progress from inside the workers, on real sandbox nodes with torch (#32): a plain DDP loop that prints no step
line is seen stepping by `inv top` through the hook's records, each rank's DataLoader workers are its helpers (not
ranks), the rank that computes longer in lockstep is named by its forward share, a hook that fails is off and the
job runs on, and pickles and forked DataLoader workers behave as without the hook."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from devtools.observe import free_port
from launcher.node.agent.records import parse_record
from launcher.node.worker.hook import PROGRESS_DIR
from tests.helpers import REPO, inv, node_runs, run_id_of, run_processes
from tests.support.nodeenv import node_python

pytestmark = pytest.mark.integration

SLOW_RANK, EXTRA_S = 3, 0.06


def _cpu_s(pid: int) -> float:
    import os

    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _look(box, logs: Path) -> dict:
    result = inv("top", "--hosts", str(box.inventory), "--once", "--json", log_dir=logs)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_top_sees_a_quiet_torch_loop_step_through_its_records_with_helpers_and_the_straggler_by_arrival(
        make_sandbox, tmp_path: Path) -> None:
    # 2 nodes x 2 ranks in lockstep; local rank 0 of each node draws through 2 DataLoader workers; rank 3's forward
    # takes 80 ms, the others' 20 ms.
    box = make_sandbox(2, torchrun="stand-in",
                       nproc_per_node=2, master_port=free_port(), script="tests/scripts/quiet_loop.py",
                       script_args=["100000", str(SLOW_RANK), str(EXTRA_S), "2"])
    logs = tmp_path / "logs"
    started = inv("launch", "--hosts", str(box.inventory), "--detach", "--skip-doctor", log_dir=logs)
    assert started.returncode == 0, started.stderr
    run_id = run_id_of(started.stdout + started.stderr)
    try:
        deadline, snap = time.monotonic() + 120, {}
        while time.monotonic() < deadline:  # torch takes its seconds to import on 2 busy CPUs
            snap = _look(box, logs)
            if len(snap["ranks"]) == 4 and all(r["steps_per_s"] for r in snap["ranks"]) and any(
                    r["straggler"] for r in snap["ranks"]):  # the arrival rule needs a second of every rank's
                break
        ranks = snap["ranks"]
        assert [(r["node"], r["rank"]) for r in ranks] == [("node-0", 0), ("node-0", 1), ("node-1", 2),
                                                           ("node-1", 3)], ranks
        for r in ranks:
            assert r["record"] == "on" and r["step"] is None, r  # no progress line: the record alone
            assert r["steps"] > 0 and r["steps_per_s"] > 0 and r["batches_per_s"] > 0, r
            assert r["forward_share"] is not None and r["data_share"] is not None, r
            assert abs(r["batches_per_s"] - r["steps_per_s"]) <= 0.1 * r["steps_per_s"], r  # a batch a step
        rates = [r["steps_per_s"] for r in ranks]
        assert max(rates) / min(rates) < 1.25, rates  # lockstep: the rate rule sees no one
        # Helpers: the two DataLoader workers of each local rank 0, beside its row, not ranks of their own.
        live = set(run_processes(run_id))
        for r in ranks:
            helpers = r["helpers"]
            assert len(helpers) == (2 if r["local_rank"] == 0 else 0), r
            assert all(h["parent"] == r["pid"] and h["pid"] in live and h["pid"] != r["pid"] for h in helpers), r
            # The rank's CPU is its own process's: what /proc says of that pid now, a little later.
            assert r["cpu_s"] <= _cpu_s(r["pid"]) < r["cpu_s"] + 10, r
        # The straggler by its arrival at the collectives (every rank's from torch's recorder), and what the others
        # lose a step waiting for it: 60 ms. Its forward share is the highest too (on CPU the forward is compute).
        assert [r["straggler"] for r in ranks] == [False, False, False, True], ranks
        assert {r["collectives_source"] for r in ranks} == {"flight recorder"}, ranks
        assert ranks[SLOW_RANK]["straggler_by"] == "arrival", ranks
        assert 0.03 <= ranks[SLOW_RANK]["lost_s_per_step"] <= 0.12, ranks
        others = [r["forward_share"] for r in ranks if r["rank"] != SLOW_RANK]
        assert ranks[SLOW_RANK]["forward_share"] > max(others) + 0.1, ranks
        # every column: --once into a pipe is COLUMNS wide, and xdist's workers set COLUMNS=80
        table = inv("top", "--hosts", str(box.inventory), "--once", log_dir=logs, env={"COLUMNS": "200"})
        assert re.search(r"node-1\s+r3 .* SLOW \+0\.\d+ s/step", table.stdout), table.stdout  # in its steps/s
        assert re.search(r"node-0\s+r0 .* 2: \d+% ", table.stdout), table.stdout  # its helpers beside it
        # Stacks: each rank's own first, its helpers after it in the rank's file, marked.
        stacks = inv("stacks", "--hosts", str(box.inventory), log_dir=logs)
        assert stacks.returncode == 0, stacks.stderr
        [folder] = (logs / run_id).glob("stacks-*")
        assert sorted(p.name for p in folder.glob("node-*-r*.txt")) == [
            "node-0-r0.txt", "node-0-r1.txt", "node-1-r2.txt", "node-1-r3.txt"]
        text = (folder / "node-0-r0.txt").read_text()
        assert text.startswith("node node-0, rank 0") and text.count("--- helper of rank 0: pid") == 2, text
        assert "ranks 0-3" in stacks.stdout or "rank" in stacks.stdout
    finally:
        inv("stop", "--hosts", str(box.inventory), log_dir=logs)
    assert run_processes(run_id) == []


@pytest.mark.parametrize(("recorder", "said_like"), [
    ("on", r"straggler: node-1 r1 enters the collectives last \(\d+% of them\): the others wait 0\.0[4-9] s a step "
           r"for it \([5-9]\d% of their time\)"),
    # (the shares move with the machine's load: 47% against 31% once, with the heaviest files all running at once)
    ("0", r"straggler: node-1 r1: \d+% of each step computing \(forward\) against a median of \d+%; the others "
          r"wait for it"),
])
def test_an_attached_launch_names_the_lockstep_straggler_by_its_arrival_or_its_forward_share(
        make_sandbox, tmp_path: Path, recorder: str, said_like: str) -> None:
    # 2 nodes x 1 rank, 200 steps: rank 1's forward takes 80 ms, rank 0's 20 ms; beats every 2 s, held 3 s. With
    # torch's flight recorder (gloo's collectives, on by default) rank 1 arrives last at every all-reduce, 60 ms
    # late; with TORCH_FR_BUFFER_SIZE=0 no collective is recorded, and the forward share says it.
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/quiet_loop.py",
                       script_args=["200", "1", str(EXTRA_S), "0"])
    if recorder != "on":
        data = yaml.safe_load(box.inventory.read_text())
        data["defaults"]["env"] = {"TORCH_FR_BUFFER_SIZE": recorder}
        box.inventory.write_text(yaml.safe_dump(data))
    logs = tmp_path / "logs"
    env = {"INVOKE_LAUNCHER_STRAGGLER_HOLD": "3", "INVOKE_LAUNCHER_SILENCE_TIMEOUT": "8"}
    result = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", log_dir=logs, env=env)
    assert result.returncode == 0, result.stderr
    said = [line for line in (result.stdout + result.stderr).splitlines() if "straggler:" in line]
    assert len(said) == 1, said
    assert re.search(said_like, said[0]), said
    status = inv("status", "--hosts", str(box.inventory), "--run", run_id_of(result.stdout + result.stderr),
                 log_dir=logs)
    assert "straggler: node-1 r1" in status.stdout, status.stdout


def _records(box) -> list[dict]:
    """Every progress record the run left on every node."""
    found = []
    for index in range(len(box.nodes)):
        for path in node_runs(box, index).glob(f"*/*/{PROGRESS_DIR}/*"):  # runs/<run id>/<node>/
            record = parse_record(path.read_bytes())
            assert record is not None, path
            found.append(record)
    return found


def test_a_hook_whose_patching_fails_is_off_says_why_and_the_job_runs_to_its_end(make_sandbox, tmp_path: Path
                                                                                 ) -> None:
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/quiet_loop.py",
                       script_args=["20", "-1", "0", "0", "break-hook"])
    result = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", log_dir=tmp_path / "logs")
    assert result.returncode == 0, result.stderr
    assert "rank 0 finished 20 steps" in result.stdout and "rank 1 finished 20 steps" in result.stdout
    records = _records(box)
    assert len(records) == 2  # one a rank (no helpers here), each off, saying why
    assert all(not r["on"] and r["why"] == "RuntimeError: patching failed on purpose" for r in records), records


def test_pickles_and_forked_dataloader_workers_give_what_they_give_without_the_hook(make_sandbox, tmp_path: Path
                                                                                    ) -> None:
    script = "tests/scripts/pickles.py"
    plain = subprocess.run([node_python(), script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    expected = json.loads(plain.stdout.split("result ", 1)[1])
    assert expected["methods"] == [True, True] and expected["model"] and expected["checkpoint"]
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script=script)
    result = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", log_dir=tmp_path / "logs")
    assert result.returncode == 0, result.stderr
    answers = [json.loads(line.split("result ", 1)[1]) for line in result.stdout.splitlines() if "result {" in line]
    assert answers == [expected, expected], result.stdout
    # The ranks recorded their 8 steps (4 batches through forked workers, 4 through a spawned one); the forked
    # workers wrote no record of the parent's, nor any of their own (they drew no batch).
    steps = sorted(r["steps"] for r in _records(box) if r["on"])
    assert steps[-2:] == [8, 8] and all(s == 0 for s in steps[:-2]), steps
