"""A rank's progress records as its node's agent reads them (launcher/node/agent/records.py, top.py's Sampler): rates
from the counts' own times, forward and data shares over the window, the record's state, and lines as the fallback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.node.agent.records import NO_RECORD, RankRecord, parse_record
from launcher.node.agent.sampler import Sampler
from launcher.node.worker.hook import PROGRESS_DIR, Recorder
from launcher.options import DEFAULT_PROGRESS


def record(t: float, steps: int, forward_s: float, data_s: float, start: int = 7, on: bool = True,
           why: str = "") -> dict:
    return {"start": start, "on": on, "why": why, "t": t, "steps": steps, "t_step": t, "batches": steps * 2,
            "t_batch": t - 0.01, "forward_s": forward_s, "data_s": data_s}


def test_rates_come_from_the_steps_own_times_and_shares_from_the_window() -> None:
    rank = RankRecord(7, 30.0)
    assert rank.fields(0.0) == NO_RECORD  # nothing read: the program never imported torch.optim nor a DataLoader
    rank.add(dict(record(95.0, 0, 0.0, 0.5), t_step=0.0, batches=0, t_batch=0.0), 95.0)  # torch imported, no step
    assert rank.fields(95.0) == dict(NO_RECORD, steps=0, batches=0, record="on")
    rank.add(record(100.0, 10, 2.0, 1.0), 100.5)
    first = rank.fields(100.5)
    assert first["steps"] == 10 and first["record"] == "on" and first["steps_per_s"] is None  # one step time: no rate
    for i in range(1, 11):  # 5 steps a second; 0.08 s of each 0.2 s step computing, 0.02 s waiting for data
        rank.add(record(100.0 + i, 10 + 5 * i, 2.0 + 0.4 * i, 1.0 + 0.1 * i), 100.0 + i + 0.1)
    found = rank.fields(110.1)
    assert found["steps"] == 60 and found["batches"] == 120
    assert found["steps_per_s"] == pytest.approx(5.0) and found["batches_per_s"] == pytest.approx(10.0)
    assert found["forward_share"] == pytest.approx(0.4) and found["data_share"] == pytest.approx(0.1)
    # A record comes at most every flush interval: its last step may be older than two steps while the rank goes on.
    assert rank.fields(110.0 + 2 * 0.2 + 0.05)["steps_per_s"] == pytest.approx(5.0)
    assert rank.fields(200.0)["steps_per_s"] < 1.0  # still for long: the rate falls toward 0


def test_a_record_of_another_process_or_an_older_read_is_dropped_and_off_says_why() -> None:
    rank = RankRecord(7, 30.0)
    rank.add(record(100.0, 10, 1.0, 1.0, start=8), 100.0)  # the pid's earlier process
    assert rank.fields(100.0) == NO_RECORD
    rank.add(record(100.0, 10, 1.0, 1.0), 100.0)
    rank.add(record(99.0, 12, 1.0, 1.0), 100.0)  # a read that met a write half done looks older
    rank.add(record(101.0, 9, 1.0, 1.0), 101.0)
    assert rank.fields(101.0)["steps"] == 10
    rank.add(record(102.0, 10, 1.0, 1.0, on=False, why="AttributeError: no _BaseDataLoaderIter"), 102.0)
    off = rank.fields(102.0)
    assert off["record"] == "off: AttributeError: no _BaseDataLoaderIter"
    assert off["steps"] is None and off["steps_per_s"] is None  # an off record says nothing about progress


def test_the_sampler_reads_a_ranks_record_and_falls_back_on_its_lines(tmp_path: Path) -> None:
    settings = {"ranks": "ranks", "progress": DEFAULT_PROGRESS, "rate_window_s": 30.0, "tail_bytes": 1 << 16,
                "keep_lines": 5}
    sampler = Sampler(str(tmp_path), "mark", settings)
    pid, start = os.getpid(), 12345
    sampler.find(([(pid, start, 0, 0, 0)], []))
    assert sampler.fields(pid, start, 1.0) == {**NO_RECORD, "collectives": None, "step": None, "first_step": None,
                                               "first_step_at": None}  # no record, no lines, no file
    sampler.progress[(pid, start)].feed("step 1\n", "out", 5, 1.0)
    sampler.progress[(pid, start)].feed("step 2\n", "out", 5, 2.0)
    sampler.progress[(pid, start)].feed("step 3\n", "out", 5, 3.0)
    lines = sampler.fields(pid, start, 3.0)
    assert lines["steps_per_s"] == pytest.approx(1.0)  # from the lines, as before records
    assert (lines["first_step"], lines["step"]) == (1, 3)  # where the attempt began (a resumed run's), and is
    (tmp_path / PROGRESS_DIR).mkdir()
    clock = iter([50.0, 51.0, 60.0, 61.0]).__next__
    recorder = Recorder(str(tmp_path / PROGRESS_DIR), 128, 0.0, clock)
    recorder.step()
    recorder.start = start
    recorder.write(50.0)  # the process's start time as /proc says it (this test's own is another)
    fields = sampler.fields(pid, start, 50.5)
    assert fields["record"] == "on" and fields["steps"] == 1 and fields["steps_per_s"] is None
    recorder.step()
    assert parse_record((tmp_path / PROGRESS_DIR / str(pid)).read_bytes())["steps"] == 2
    assert sampler.fields(pid, start, 51.5)["steps_per_s"] == pytest.approx(1.0)  # the record's, not the lines'

