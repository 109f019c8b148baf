"""What the run learns, on sandbox nodes with real torchrun and train/ddp.py (#68): a NaN loss injected on one rank is
named by rank and step at once and stops the run (`--on-nonfinite stop`, the default) with it as the root cause; a
rank fed shuffled targets (a bad shard) is flagged and the others are not; the losses `top`, the page and
`report --json` give are the ones the script printed."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from devtools.observe import free_port
from launcher.watch.loss import NONFINITE_EXIT
from tests.helpers import PAGE_ON, inv, inv_background, run_id_of, run_processes, wait_for

pytestmark = pytest.mark.integration


def printed(output: str) -> dict[int, dict[int, float]]:
    """rank -> step -> the loss the script printed (`--loss-lines`)."""
    found: dict[int, dict[int, float]] = {}
    for rank, step, value in re.findall(r"loss rank (\d+) step (\d+) value (\S+)", output):
        found.setdefault(int(rank), {})[int(step)] = float(value)
    return found


def test_a_nan_on_one_rank_is_named_by_rank_and_step_and_stops_the_run_as_its_root_cause(make_sandbox,
                                                                                       tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script_args=[
        "--epochs", "50", "--loss-lines", "--nan-at", "40", "--nan-rank", "1", "--sleep-per-step", "0.02"])
    launched = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", log_dir=tmp_path / "logs", timeout=240)
    said = launched.stdout + launched.stderr
    assert launched.returncode == NONFINITE_EXIT, said[-3000:]
    losses = printed(said)
    before = f"{losses[1][39]:.4g}"
    line = next(line for line in said.splitlines() if line.startswith("loss: "))
    # by the time both nodes' beats came, the all-reduce had carried it to rank 0 at the next step, or not yet
    first = f"loss: rank 1 (node-1): loss is nan at step 40 (its last finite: {before} at step 39); "
    assert line.startswith(first), line
    assert line.endswith(("; the other ranks' losses are finite; stopping the run (--on-nonfinite stop)",
                          "; the others followed (rank 0 at step 41): the all-reduce carries it; stopping the run "
                          "(--on-nonfinite stop)")), line
    # stopped within a few steps of it (a beat a second, the record flushed at most every 0.1 s): not at the end
    assert max(losses[0]) < 40 + 150, max(losses[0])
    cause = "stopped: (--on-nonfinite stop): rank 1 (node-1): loss is nan at step 40"
    assert any(cause in x for x in said.strip().splitlines()), said[-2000:]
    wait_for(lambda: run_processes(run_id_of(said)) == [], 30, "every process of the run gone")


def test_a_bad_shard_is_flagged_alone_and_every_ranks_loss_is_the_one_it_printed(make_sandbox, tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script_args=[
        "--epochs", "50", "--max-steps", "500", "--loss-lines", "--bad-data-rank", "1", "--sleep-per-step", "0.02"])
    logs, out = tmp_path / "logs", tmp_path / "launch.out"
    launch = inv_background("launch", "--hosts", str(box.inventory), "--skip-doctor", log_dir=logs, out=out,
                            env=PAGE_ON)
    try:
        seen: list[dict] = []

        def flagged() -> bool:
            result = inv("top", "--hosts", str(box.inventory), "--once", "--json", log_dir=logs)
            if result.returncode != 0:
                return False
            seen[:] = json.loads(result.stdout)["ranks"]
            return any(r.get("loss_outlier") for r in seen)

        wait_for(flagged, 120, "a rank flagged by its loss in top")
        assert [r["rank"] for r in seen if r.get("loss_outlier")] == [1], seen
        assert all(isinstance(r["loss"], float) and r["nonfinite"] is None for r in seen), seen
        assert launch.wait(timeout=180) == 0, out.read_text()[-3000:]
    finally:
        if launch.poll() is None:
            launch.send_signal(signal.SIGINT)
            launch.wait(timeout=60)
    said = out.read_text()
    lines = [line for line in said.splitlines() if line.startswith("loss: ")]
    assert len(lines) == 1 and lines[0].startswith("loss: rank 1 (node-1): its loss has been "), lines
    assert re.search(r"been \d+\.\dx the median of the other ranks for \d+ steps: its data\?$", lines[0]), lines
    losses, run_id = printed(said), run_id_of(said)
    report = inv("report", "--hosts", str(box.inventory), "--run", run_id, "--json", log_dir=logs)
    assert report.returncode == 0, report.stderr
    page = json.loads(report.stdout)
    for rank in page["ranks"]:
        last = losses[rank["rank"]][max(losses[rank["rank"]])]
        assert rank["loss"] == pytest.approx(last, rel=1e-4), (rank, last)
        assert rank["loss_min"] is not None and rank["loss_nonfinite_by_step"] is None
    assert page["loss"]["line"] == lines[0], page["loss"]
    assert [e["text"] for e in page["loss"]["events"]] == [lines[0][len("loss: "):]], page["loss"]
    assert "loss per rank" in (logs / run_id / "report.html").read_text()


def test_a_detached_runs_nodes_stop_their_part_on_a_nan_and_status_and_the_page_say_why(make_sandbox,
                                                                                       tmp_path: Path) -> None:
    box = make_sandbox(2, torchrun="stand-in", master_port=free_port(), script_args=[
        "--epochs", "50", "--loss-lines", "--nan-at", "40", "--nan-rank", "1", "--sleep-per-step", "0.02"])
    logs = tmp_path / "logs"
    started = inv("launch", "--hosts", str(box.inventory), "--detach", "--skip-doctor", log_dir=logs)
    assert started.returncode == 0, started.stdout + started.stderr
    run_id = run_id_of(started.stdout + started.stderr)
    said: list[str] = []

    def ended() -> bool:
        status = inv("status", "--hosts", str(box.inventory), "--run", run_id, log_dir=logs)
        said[:] = [status.stdout + status.stderr]
        return "running" not in said[0]

    wait_for(ended, 120, "the run's end on every node", interval=1)
    logged = inv("logs", "--hosts", str(box.inventory), "--run", run_id, log_dir=logs)
    losses = printed(logged.stdout)
    assert max(losses[1]) < 40 + 150, max(losses[1])  # the nodes stopped it, not the end of its 50 epochs
    why = (f"node-1: stopped its part itself (--on-nonfinite stop): rank 1's loss was nan at step 40 (its last "
           f"finite: {losses[1][39]:.4g} at step 39)")
    assert why in said[0], said[0]
    report = inv("report", "--hosts", str(box.inventory), "--run", run_id, "--json", log_dir=logs)
    page = json.loads(report.stdout)
    assert page["root_cause"].startswith("stopped by its nodes (--on-nonfinite stop): node-"), page["root_cause"]
    assert page["loss"]["line"].startswith("loss: rank "), page["loss"]
    wait_for(lambda: run_processes(run_id) == [], 30, "every process of the run gone")
