"""A node's series of its run (launcher/node/agent/series.py): one line a sample, bounded for a run of days, read back
whole lines only; a rank's numbers from its progress record, the loss's after the first five; the page's account of
a launch (launcher/run/journal.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from launcher.events import HangSuspected, Left, NodeEnd, Started
from launcher.node.agent.series import SERIES_FILE, Series, numbers_of, read_record, read_series
from launcher.node.common import bounds
from launcher.node.worker.hook import PROGRESS_DIR, Recorder, own_start
from launcher.run.journal import Journal, read_journal


def test_samples_are_lines_and_past_the_bound_every_other_goes_and_the_interval_doubles(tmp_path: Path) -> None:
    series = Series(str(tmp_path), "20260101-000000-abcdef/node-0", {"interval_s": 5, "max_samples": 4})
    for _ in range(5):
        series.sample()
    assert series.count == 3 and series.interval == 10  # 5 > 4: the 1st, 3rd and 5th kept
    for _ in range(20):
        series.sample()
    lines = (tmp_path / SERIES_FILE).read_text().splitlines()
    assert len(lines) <= 4 and series.interval >= 40
    sample = json.loads(lines[-1])
    assert sample["ranks"] == {} and sample["mem_total"] > 0 and "load1" in sample  # no rank of that run here
    assert [s["t"] for s in read_series(str(tmp_path), 1 << 20)] == [json.loads(line)["t"] for line in lines]


def test_a_series_read_from_its_end_keeps_whole_lines_only(tmp_path: Path) -> None:
    (tmp_path / SERIES_FILE).write_text("".join(json.dumps({"t": i, "pad": "x" * 50}) + "\n" for i in range(10))
                                        + '{"t": 10, "cut')
    found = read_series(str(tmp_path), 200)
    assert [s["t"] for s in found] == [8, 9]  # the first line read may be cut: dropped, as is the one being written
    assert read_series(str(tmp_path / "none"), 100) == []


def test_a_ranks_numbers_end_with_its_loss_sum_count_and_last_value_json_can_carry(tmp_path: Path) -> None:
    (tmp_path / PROGRESS_DIR).mkdir()
    recorder = Recorder(str(tmp_path / PROGRESS_DIR), bounds.RECORD_BYTES, 0.0, lambda: 50.0)
    recorder.step()
    first = numbers_of(read_record(str(tmp_path), os.getpid(), own_start()), 1000.0)
    assert first == [1, 0, 0.0, 0.0, 1050.0, 0.0, 0, None]
    for step, value in ((2, 2.5), (3, 1.25), (4, float("nan"))):
        recorder.steps = step
        recorder.value(step, value)
    recorder.write(51.0)
    numbers = numbers_of(read_record(str(tmp_path), os.getpid(), own_start()), 1000.0)
    assert numbers[5:] == [3.75, 2, "nan"]  # a stretch's mean is Δsum/Δn, nan is none of it
    assert json.loads(json.dumps(numbers)) == numbers


def test_the_journal_keeps_the_start_by_the_launchers_clock_the_marks_and_the_end(tmp_path: Path) -> None:
    journal = Journal("20260101-000000-abcdef", tmp_path / "run", command_start=100.0)
    journal.phase(["node-0", "node-1"], "connected", 101.0)
    journal.event(Started("node-1", 103.0, 42, node_time=101.5))
    journal.event(HangSuspected("", 150.0, quiet_s=30, why="rank 1 never entered all_reduce #5"))
    journal.event(Left("node-1", 160.0, NodeEnd("node-1", "lost", 160.0), 1))
    journal.end(1, "root cause: node-1 ...")
    journal.write()
    data = read_journal(tmp_path / "run")
    assert data is not None and data["command_start"] == 100.0
    assert data["nodes"]["node-1"] == {"connected": 101.0, "torchrun": 103.0, "offset": 1.5}
    assert [(m["kind"], m["node"]) for m in data["marks"]] == [("hang", None), ("left", "node-1")]
    assert data["marks"][0]["text"] == "hang suspected: rank 1 never entered all_reduce #5"
    assert data["end"]["code"] == 1 and read_journal(tmp_path / "none") is None
