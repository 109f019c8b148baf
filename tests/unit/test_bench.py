"""The bench's own pieces that need no sandbox: the least-squares fit, the process-tree sampler, the table rows of
the scale figures, and the picture (drawn with matplotlib, skipped in one line without it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import baselines, common, scale_table, usage
from bench import run as bench_run
from bench import table as bench_table


def test_fit_line_recovers_a_per_node_cost() -> None:
    line = common.fit_line([1, 2, 4, 8], [0.5 + 0.25 * n for n in (1, 2, 4, 8)])
    assert line == {"fixed": 0.5, "per_node": 0.25, "r2": 1.0, "points": 4}
    assert common.fit_line([4], [1.0]) is None and common.fit_line([4, 4], [1.0, 2.0]) is None


def test_pdsh_goes_through_ssh_with_the_sandbox_config(tmp_path: Path) -> None:
    assert baselines.pdsh_argv(64, "true") == ["pdsh", "-R", "ssh", "-f", "64", "-w", "node-[0-63]", "true"]
    assert baselines.pdsh_argv(1, "true", fanout=32)[-3:] == ["-w", "node-0", "true"]
    env = baselines.pdsh_env(tmp_path / "ssh config")
    assert env["PDSH_RCMD_TYPE"] == "ssh" and env["PDSH_SSH_ARGS"].startswith(f"-F '{tmp_path}/ssh config' ")


def test_the_sampler_counts_a_process_tree() -> None:
    child = subprocess.Popen(["sleep", "5"])
    try:
        peak = usage.sample_tree(usage.os.getpid())
        assert peak.processes >= 2 and peak.threads >= 2 and peak.fds >= 3 and peak.rss_kb > 1000
    finally:
        child.kill()
        child.wait()


def _stat(median: float) -> dict[str, Any]:
    return {"median": median, "min": median * 0.9, "max": median * 1.1, "runs": [median]}


def _variant(seconds: float, n: int, own_rss: bool) -> dict[str, Any]:
    v = {**_stat(seconds), "cpu_s": _stat(0.3 + 0.01 * n), "peak_processes": _stat(1 + n),
         "peak_threads": _stat(3 + 2 * n), "peak_fds": _stat(10 + 5 * n), "tree_rss_mb": _stat(40 + n)}
    if own_rss:
        v["peak_rss_mb"] = _stat(40 + 0.4 * n)
    return v


def _results() -> dict[str, Any]:
    from bench import fanout, stop_scale

    rows = []
    for n in (1, 16, 64):
        row = {"nodes": n, "launcher": _variant(0.5 + 0.2 * n, n, True), "ssh_loop": _variant(0.2 * n, n, False),
               "pdsh": _variant(0.2 * n, n, False), "launcher_over_a": 1.1, "launcher_over_p": 1.0,
               "launcher_ok": False}
        rows.append(row)
    stop_rows = []
    for n in (1, 64):
        way = {**_stat(0.1 * n), "left_total": 0, "timeouts": 0, "cpu_s": _stat(0.1),
               "peak_threads": _stat(n), "peak_fds": _stat(n), "peak_processes": _stat(n), "tree_rss_mb": _stat(n)}
        stop_rows.append({"nodes": n, **{w: dict(way) for w in stop_scale.WAYS}})
    return {"fanout": {"rows": rows, "fits": fanout.fits(rows), "light_command": "PYTHON -c pass"},
            "stop_scale": {"rows": stop_rows, "ways": list(stop_scale.WAYS), "job": "sleep 600",
                           "fits": {w: common.fit_line([1, 64], [0.1, 6.4]) for w in stop_scale.WAYS}}}


def test_scale_rows_carry_pdsh_the_per_node_fit_and_the_cost() -> None:
    results = _results()
    table = bench_table.rows(results)
    assert all(len(row) == len(bench_table.HEADER) for row in table)
    fit = next(row for row in table if row[0].startswith("fan-out: cost per node"))
    assert fit[2] == "200 ms/node + 0.50 s (r² 1.00)" and fit[4] == "200 ms/node + 0.00 s (r² 1.00)"
    cost = [row for row in table if row[0].startswith("cost:")]
    assert [row[1] for row in cost] == ["16", "64"]
    assert "131 threads" in cost[1][2] and "330 fds" in cost[1][2] and "ms/node" in cost[1][2]
    stop = [row for row in table if row[0].startswith("stop at scale: inv stop")]
    assert [row[1] for row in stop] == ["1", "64"] and all(row[-1] == "met" for row in stop)


def test_the_picture_is_drawn_next_to_the_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(bench_run, "RESULTS", tmp_path)
    monkeypatch.setattr(bench_run, "REPO", tmp_path)
    bench_run.draw_chart(_results(), "latest", "test")
    assert (tmp_path / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_picture_is_skipped_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    monkeypatch.setattr(bench_run, "RESULTS", tmp_path)
    bench_run.draw_chart(_results(), "latest", "test")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "chart skipped: matplotlib is not installed" in err[0]
    assert not list(tmp_path.iterdir())


def test_scale_table_fit_text() -> None:
    assert scale_table.fit_text(None) == ""
    assert scale_table.fit_text({"fixed": 1.0, "per_node": 0.012, "r2": 0.987}) == "12 ms/node + 1.00 s (r² 0.99)"
