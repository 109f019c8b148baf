"""A rank's progress records as its node's agent reads them (launcher/node/agent/records.py, top.py's Sampler): rates
from the counts' own times, forward and data shares over the window, the loss (its last value, the window's mean, the
first value that was not finite), the record's state, and lines as the fallback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from launcher.node.agent.records import NO_RECORD, RankRecord, parse_record
from launcher.node.agent.sampler import Sampler
from launcher.node.worker.hook import PROGRESS_DIR, Recorder
from launcher.options import DEFAULT_PROGRESS

NAN = float("nan")
NO_LOSS = {"loss_step": 0, "loss": NAN, "loss_sum": 0.0, "loss_n": 0, "bad_step": 0, "bad": NAN, "good_step": 0,
           "good": NAN, "skipped": 0, "loss_state": "none"}
NO_LOSS_FIELDS = {"loss": None, "loss_step": None, "loss_mean": None, "nonfinite": None, "loss_skipped": 0,
                  "loss_state": "none", "loss_why": None}


def record(t: float, steps: int, forward_s: float, data_s: float, start: int = 7, on: bool = True,
           why: str = "", **loss: object) -> dict:
    return {"start": start, "on": on, "why": why, "t": t, "steps": steps, "t_step": t, "batches": steps * 2,
            "t_batch": t - 0.01, "forward_s": forward_s, "data_s": data_s, **NO_LOSS, **loss}


def test_rates_come_from_the_steps_own_times_and_shares_from_the_window() -> None:
    rank = RankRecord(7, 30.0)
    assert rank.fields(0.0) == NO_RECORD  # nothing read: the program never imported torch.optim nor a DataLoader
    rank.add(dict(record(95.0, 0, 0.0, 0.5), t_step=0.0, batches=0, t_batch=0.0), 95.0)  # torch imported, no step
    assert rank.fields(95.0) == dict(NO_RECORD, steps=0, batches=0, record="on", **NO_LOSS_FIELDS)
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


def test_the_loss_is_its_last_value_the_windows_mean_and_the_first_value_that_was_not_finite() -> None:
    rank = RankRecord(7, 30.0)
    rank.add(record(100.0, 10, 1.0, 1.0, loss_step=10, loss=2.0, loss_sum=25.0, loss_n=10, loss_state="on"), 100.0)
    one = rank.fields(100.0)  # one record: the mean of all its values
    assert (one["loss"], one["loss_step"], one["loss_mean"], one["loss_state"]) == (2.0, 10, 2.5, "on")
    # The loss goes down (a number that may, unlike the counts): the record is kept; the window's mean is the
    # difference of its first and last records: 10 values summing to 15.
    rank.add(record(101.0, 20, 2.0, 1.0, loss_step=20, loss=1.0, loss_sum=40.0, loss_n=20, loss_state="on"), 101.0)
    two = rank.fields(101.0)
    assert (two["loss"], two["loss_step"], two["loss_mean"], two["nonfinite"]) == (1.0, 20, 1.5, None)
    # nan from step 25 (the last finite value 0.5 at 24), then inf: the first bad one is kept, the mean of the finite
    rank.add(record(102.0, 30, 3.0, 1.0, loss_step=30, loss=float("inf"), loss_sum=42.0, loss_n=24, bad_step=25,
                    bad=NAN, good_step=24, good=0.5, skipped=2, loss_state="on"), 102.0)
    three = rank.fields(102.0)
    assert three["steps"] == 30 and three["loss"] == "inf" and three["loss_step"] == 30
    assert three["loss_mean"] == pytest.approx(17.0 / 14)
    assert three["nonfinite"] == {"step": 25, "value": "nan", "last_finite": 0.5, "last_finite_step": 24}
    assert three["loss_skipped"] == 2
    rank.add(record(103.0, 31, 3.0, 1.0, loss_step=31, loss=float("-inf"), loss_sum=42.0, loss_n=24, bad_step=1,
                    bad=float("-inf"), skipped=2, loss_state="grad", why="backward with a gradient"), 103.0)
    four = rank.fields(103.0)
    assert four["loss"] == "-inf" and four["loss_state"] == "grad" and four["loss_why"] == "backward with a gradient"
    assert four["nonfinite"] == {"step": 1, "value": "-inf", "last_finite": None, "last_finite_step": None}
    rank.add(record(110.0, 32, 3.0, 1.0, loss_step=30, loss=1.0), 110.0)  # a count went down: an older read
    assert rank.fields(110.0)["steps"] == 31
    assert set(NO_RECORD) >= set(NO_LOSS_FIELDS) and all(NO_RECORD[k] is None for k in NO_LOSS_FIELDS)


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
    recorder = Recorder(str(tmp_path / PROGRESS_DIR), 256, 0.0, clock)
    recorder.step()
    recorder.start = start
    recorder.write(50.0)  # the process's start time as /proc says it (this test's own is another)
    fields = sampler.fields(pid, start, 50.5)
    assert fields["record"] == "on" and fields["steps"] == 1 and fields["steps_per_s"] is None
    recorder.step()
    assert parse_record((tmp_path / PROGRESS_DIR / str(pid)).read_bytes())["steps"] == 2
    assert sampler.fields(pid, start, 51.5)["steps_per_s"] == pytest.approx(1.0)  # the record's, not the lines'

