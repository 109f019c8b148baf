"""The trainers people use, on sandbox nodes: Lightning and Hugging Face's `Trainer`, CPU and gloo, tiny models built
from a config (nothing downloaded); Lightning's steps on 2 nodes x 2 ranks (two local ranks a node), the others on 2
nodes x 1 (each trainer rank costs seconds of CPU to import, and their verdicts need no second local rank). Software
nobody here wrote: what the launcher sees of their runs (progress, stragglers, hangs) must hold for them as it does
for train/ddp.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import yaml

from devtools.observe import free_port
from tests.helpers import inv, inv_background, run_id_of, run_processes, wait_for
from tests.support.nodeenv import trainers_env

pytestmark = pytest.mark.integration

LIGHTNING = "tests/scripts/lightning_boring.py"
HF = "tests/scripts/hf_trainer.py"


def _box(make_sandbox, script: str, nproc_per_node: int, **env: str):
    """2 nodes x `nproc_per_node` ranks under the declared env with the trainers extra; `env` for the job's knobs."""
    box = make_sandbox(2, nproc_per_node=nproc_per_node, master_port=free_port(), script=script,
                       python=str(trainers_env().python))
    if env:
        data = yaml.safe_load(box.inventory.read_text())
        data["defaults"]["env"] = {**data["defaults"].get("env", {}), **env}
        box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    return box


def _detached(box, logs: Path) -> str:
    started = inv("launch", "--hosts", str(box.inventory), "--detach", "--skip-doctor", log_dir=logs)
    assert started.returncode == 0, started.stdout + started.stderr
    return run_id_of(started.stdout + started.stderr)


def _ranks_stepping(box, logs: Path, world: int, flagged: bool = False) -> list[dict]:
    """`inv top --once --json`'s ranks once every rank has a step rate (the trainers print no step lines), and with
    `flagged` once a rank is flagged too (the arrival rule needs a second of arrivals from every rank)."""
    seen: list[dict] = []

    def every_rank_steps() -> bool:
        result = inv("top", "--hosts", str(box.inventory), "--once", "--json", log_dir=logs)
        if result.returncode != 0:
            return False
        seen[:] = json.loads(result.stdout)["ranks"]
        stepping = len(seen) == world and all((r.get("steps_per_s") or 0) > 0 for r in seen)
        return stepping and (not flagged or any(r["straggler"] for r in seen))

    wait_for(every_rank_steps, 120, "a step rate on every rank" + (" and a straggler" if flagged else ""), interval=1)
    return seen


def _arrival_names_the_slow_rank(ranks: list[dict], slow: int) -> None:
    rates = [r["steps_per_s"] for r in ranks]
    assert max(rates) / min(rates) < 1.5, ranks  # lockstep: every rank at the slow one's pace
    assert all(r["record"] == "on" for r in ranks), ranks
    assert [r["rank"] for r in ranks if r["straggler"]] == [slow], [
        (r["rank"], r["straggler_by"], r["lost_s_per_step"], r["steps_per_s"], r["forward_share"]) for r in ranks]
    # judged by arrival (every rank's collectives from torch's recorder), never by the waiting ranks' forward share
    assert {r["collectives_source"] for r in ranks} == {"flight recorder"}, [
        (r["rank"], r["collectives_source"], r["straggler_by"], r["record"]) for r in ranks]
    assert [r["straggler_by"] for r in ranks if r["straggler"]] == ["arrival"], ranks


def test_a_lightning_run_steps_in_top_names_its_slow_rank_and_runs_to_its_end_on_every_rank(make_sandbox,
                                                                                             tmp_path: Path) -> None:
    # Attached; once `inv top` has named the slow rank the ranks are told to stop (a file they look for together),
    # and Lightning's fit returns on every rank: one run of Lightning's imports on 4 ranks for both questions.
    stop_file, logs, said = tmp_path / "stop", tmp_path / "logs", tmp_path / "launch.out"
    box = _box(make_sandbox, LIGHTNING, 2, BORING_STEPS="100000", BORING_SLOW_RANK="3", BORING_SLOW_S="0.1",
               BORING_STOP_FILE=str(stop_file), LOSS_LINES="1")
    launch = inv_background("launch", "--hosts", str(box.inventory), "--skip-doctor", log_dir=logs, out=said)
    try:
        _arrival_names_the_slow_rank(_ranks_stepping(box, logs, 4, flagged=True), 3)
        stop_file.touch()
        assert launch.wait(timeout=120) == 0, said.read_text()[-3000:]
    finally:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGINT)
            launch.wait(timeout=60)
    output = said.read_text()
    done = sorted(line.split("| ", 1)[1].split()[2] for line in output.splitlines() if "| done rank" in line)
    assert done == ["0", "1", "2", "3"], output[-3000:]
    run_id = run_id_of(output)
    wait_for(lambda: run_processes(run_id) == [], 30, "every process of the run gone")
    # each rank's loss as the page has it: the last one Lightning's step printed (the hook read its backward's)
    printed: dict[int, float] = {}
    for rank, value in re.findall(r"loss rank (\d+) step \d+ value (\S+)", output):
        printed[int(rank)] = float(value)
    report = inv("report", "--hosts", str(box.inventory), "--run", run_id, "--json", log_dir=logs)
    assert report.returncode == 0, report.stderr
    ranks = json.loads(report.stdout)["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3] == sorted(printed), (ranks, printed)
    for row in ranks:
        assert row["loss"] == pytest.approx(printed[row["rank"]], rel=1e-4, abs=1e-6), (row, printed)


def test_every_hf_trainer_rank_steps_in_top_and_the_slow_one_is_the_straggler(make_sandbox, tmp_path: Path) -> None:
    # 0.5 s: with 0.1 and 0.2 s, CI (4 suites' workers on 2 cores) twice named rank 0, most likely rightly: its own
    # work each step (the progress bar, the callbacks; rank 1 has none) starved for longer than rank 1 slept.
    box, logs = _box(make_sandbox, HF, 1, HF_STEPS="100000", HF_SLOW_RANK="1", HF_SLOW_S="0.5"), tmp_path / "logs"
    run_id = _detached(box, logs)
    try:
        _arrival_names_the_slow_rank(_ranks_stepping(box, logs, 2, flagged=True), 1)
    finally:
        inv("stop", "--hosts", str(box.inventory), "--run", run_id, log_dir=logs)
    wait_for(lambda: run_processes(run_id) == [], 30, "every process of the run gone")


def test_a_rank_stuck_in_its_training_step_is_named_where_it_waits(make_sandbox, tmp_path: Path) -> None:
    box = _box(make_sandbox, LIGHTNING, 1, BORING_STEPS="100000", BORING_STUCK_RANK="1", BORING_STUCK_STEP="20")
    launched = inv("launch", "--hosts", str(box.inventory), "--hang-timeout", "15", "--skip-doctor",
                   log_dir=tmp_path / "logs", timeout=300)
    assert launched.returncode == 124, launched.stdout[-3000:] + launched.stderr[-3000:]
    said = launched.stdout + launched.stderr
    answer = next(line for line in said.splitlines() if "hang suspected" in line)
    assert "rank 0 waits in backward" in answer and "rank 1 (node-1" in answer, answer
    assert "time.sleep" in answer and "training_step" in answer, answer
    wait_for(lambda: run_processes(run_id_of(launched.stderr)) == [], 30, "every process of the run gone")


def test_a_hang_with_dataloader_workers_is_found(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/loader_hang.py",
                       script_args=["1", "100000"])
    t0 = time.monotonic()
    launched = inv("launch", "--hosts", str(box.inventory), "--hang-timeout", "15", "--skip-doctor",
                   log_dir=tmp_path / "logs", timeout=300)
    assert launched.returncode == 124, launched.stdout[-3000:] + launched.stderr[-3000:]
    answer = next(line for line in (launched.stdout + launched.stderr).splitlines() if "hang suspected" in line)
    assert "rank 1 (node-1" in answer and "time.sleep" in answer, answer
    assert time.monotonic() - t0 < 120
    wait_for(lambda: run_processes(run_id_of(launched.stderr)) == [], 30, "every process of the run gone")


def test_a_dataloader_worker_stuck_in_its_dataset_is_found_and_named(make_sandbox, tmp_path: Path) -> None:
    # A worker of rank 1 sleeps in __getitem__; rank 1 waits for it in DataLoader.__next__, rank 0 in the all-reduce.
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/loader_hang.py",
                       script_args=["1", "100000", "worker"])
    t0 = time.monotonic()
    launched = inv("launch", "--hosts", str(box.inventory), "--hang-timeout", "15", "--skip-doctor",
                   log_dir=tmp_path / "logs", timeout=300)
    said = launched.stdout + launched.stderr
    assert launched.returncode == 124, said[-3000:]
    answer = next(line for line in said.splitlines() if line.startswith("why a hang:"))
    assert re.search(r"rank 1 never entered \w+ #\d+ of default_pg \(its last: #\d+\), which rank 0 entered; rank 1 "
                     r"\(node-1, pid \d+\) waits for its DataLoader worker pid \d+, stuck: it is in time\.sleep "
                     r"\(loader_hang\.py:\d+, in __getitem__\)", answer), answer
    assert time.monotonic() - t0 < 120
    wait_for(lambda: run_processes(run_id_of(launched.stderr)) == [], 30, "every process of the run gone")
