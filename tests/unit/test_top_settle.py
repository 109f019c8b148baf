"""`inv top --once` on one node (launcher/node/agent/sampler.py `watch` with `settle`): a node whose ranks have all been
still (no output for twice the look, no progress record within the rate window) answers after the least look; one with a
rank that steps, or whose record moved lately, watches the whole look for its rate. Real rank processes (light
Pythons carrying the run's mark, as torchrun's workers do), their own output files and records."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.node.agent.sampler import watch
from launcher.node.wire import RUN_ID_ENV
from launcher.node.worker.hook import PROGRESS_DIR
from launcher.options import DEFAULT_PROGRESS

LOOK_S = 1.5
STILL_S = 2 * LOOK_S
LEAST_S = 0.3
STEPPER = """
import sys, time
with open(sys.argv[1], "a", buffering=1) as out:
    for step in range(10_000):
        print(f"step {step}", file=out)
        time.sleep(0.1)
"""


@pytest.fixture
def run(tmp_path: Path) -> Iterator[tuple[Path, str, list[subprocess.Popen]]]:
    mark = f"settle-{os.getpid()}-{time.monotonic_ns()}"
    started: list[subprocess.Popen] = []
    yield tmp_path, mark, started
    for process in started:
        process.kill()
        process.wait()


def rank(run_dir: Path, mark: str, number: int, stepping: bool) -> subprocess.Popen:
    folder = run_dir / "ranks" / "job" / "attempt_0" / str(number)
    folder.mkdir(parents=True)
    out = folder / "stdout.log"
    out.write_text("step 0\nstep 1\n")  # what a hung rank printed before it stopped
    os.utime(out, (time.time() - 60, time.time() - 60))
    env = {**os.environ, RUN_ID_ENV: mark, "RANK": str(number), "LOCAL_RANK": str(number),
           "TORCHELASTIC_RESTART_COUNT": "0"}
    code = STEPPER if stepping else "import time; time.sleep(600)"
    return subprocess.Popen([sys.executable, "-c", code, str(out)], env=env)


def look(run_dir: Path, mark: str, monkeypatch: pytest.MonkeyPatch) -> tuple[float, dict]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # the launcher's words: none (a look of its own)
    settings = {"ranks": "ranks", "progress": DEFAULT_PROGRESS, "read_s": 0.05, "tail_bytes": 1 << 16,
                "keep_lines": 5, "rate_window_s": 30.0, "count": 1, "interval_s": LOOK_S,
                "settle": {"least_s": LEAST_S, "still_s": STILL_S}}
    sent: list[dict] = []
    t0 = time.monotonic()
    assert watch(str(run_dir), mark, settings, lambda snapshot: sent.append(snapshot) or True) == 1
    return time.monotonic() - t0, sent[0]


def found(mark: str, ranks: int) -> None:
    from launcher.node.common.proc import rank_processes

    deadline = time.monotonic() + 10
    while len(rank_processes(mark)[0]) < ranks and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_node_whose_ranks_are_all_still_answers_after_the_least_look(run, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, mark, started = run
    started += [rank(run_dir, mark, 0, False), rank(run_dir, mark, 1, False)]
    found(mark, 2)
    took, snapshot = look(run_dir, mark, monkeypatch)
    assert LEAST_S <= took < LOOK_S - 0.5
    assert [r["rank"] for r in snapshot["ranks"]] == [0, 1]
    assert all(r["step"] == 1 and r["steps_per_s"] is None and r["cpu_percent"] is not None
               and r["last_output_s"] >= 59 for r in snapshot["ranks"])


def test_a_rank_that_steps_keeps_its_node_watching_the_whole_look_for_its_rate(run,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, mark, started = run
    started += [rank(run_dir, mark, 0, False), rank(run_dir, mark, 1, True)]
    found(mark, 2)
    took, snapshot = look(run_dir, mark, monkeypatch)
    assert took >= LOOK_S
    still, stepping = snapshot["ranks"]
    assert still["steps_per_s"] is None and stepping["steps_per_s"] == pytest.approx(10.0, rel=0.5)


def test_a_rank_whose_progress_record_moved_within_the_rate_window_keeps_the_whole_look(
        run, monkeypatch: pytest.MonkeyPatch) -> None:
    # A record's counts carry their own times: one more step of a slow rank (one every 10 s) would give its rate.
    run_dir, mark, started = run
    started += [rank(run_dir, mark, 0, False), rank(run_dir, mark, 1, False)]
    found(mark, 2)
    (run_dir / PROGRESS_DIR).mkdir()
    t = time.monotonic() - 10
    line = f"p2 -1 on {t:.3f} 5 {t:.3f} 5 {t:.3f} 0.1000 0.0100 0 nan 0.0 0 0 nan 0 nan 0 none".ljust(255) + "\n"
    (run_dir / PROGRESS_DIR / str(started[1].pid)).write_text(line)
    took, snapshot = look(run_dir, mark, monkeypatch)
    assert took >= LOOK_S
    assert snapshot["ranks"][1]["steps"] == 5 and snapshot["ranks"][1]["record"] == "on"


def test_a_node_whose_ranks_are_not_up_yet_watches_the_whole_look(run, monkeypatch: pytest.MonkeyPatch) -> None:
    # torchrun is up (a detached launch has returned) and its workers still import torch: they may appear any moment.
    run_dir, mark, _ = run
    took, snapshot = look(run_dir, mark, monkeypatch)
    assert took >= LOOK_S and snapshot["ranks"] == []
