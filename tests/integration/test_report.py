"""The run's page of real runs on sandbox nodes (#49): an attached launch's page is there seconds after it returns,
with every node's start phases in order, a timeline of each rank, a straggler's mark and the failing rank's exception;
a detached run's is written at the first `status` after its end; a headless browser opens one where one is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.observe import free_port
from launcher.report.pagedata import PHASES
from tests.conftest import SandboxFactory
from tests.helpers import PAGE_ON, inv, run_id_of, wait_for

ORDER = [p[0] for p in PHASES]
CHROMIUM_OWN = ("google.com", "googleapis.com", "gvt1.com")
"""Where Debian's chromium asks by itself (updates, its clock, accounts), whatever page it shows."""
WORKER_PHASES = ["hook", "torch", "rdzv", "pg", "batch", "step"]


def _page(logs: Path, run_id: str) -> Path:
    page = logs / run_id / "report.html"
    wait_for(page.exists, 90, f"{page} (written by the page's own process)", interval=0.5)
    return page


def test_an_attached_runs_page_has_each_nodes_start_in_order_each_ranks_timeline_a_straggler_and_the_exception(
        make_sandbox, tmp_path: Path) -> None:
    # 2 nodes x 2 ranks in lockstep, ~15 s of steps (the series samples every 5 s); rank 3's forward 60 ms longer
    # (a straggler, said after 3 s), and rank 3 raises once its steps are done.
    box = make_sandbox(2, torchrun="stand-in",
                       nproc_per_node=2, master_port=free_port(), script="tests/scripts/quiet_loop.py",
                       script_args=["200", "3", "0.06", "0", "fail"])
    logs = tmp_path / "logs"
    env = {"INVOKE_LAUNCHER_STRAGGLER_HOLD": "3", **PAGE_ON}
    result = inv("launch", "--hosts", str(box.inventory), "--skip-doctor", log_dir=logs, env=env)
    assert result.returncode != 0 and "fails on purpose" in result.stdout + result.stderr, result.stderr
    run_id = run_id_of(result.stdout + result.stderr)
    # where the page is: the launch's last line, after the root cause (#60 item 13)
    assert result.stderr.splitlines()[-1] == f"the run's page: {logs / run_id / 'report.html'} (written in a few " \
                                             "seconds)", result.stderr[-1000:]
    text = _page(logs, run_id).read_text()
    assert "<svg" in text and "<script" not in text
    assert re.findall(r'(?:src|href)="(?!#|data:)[^"]*"', text) == []  # nothing to fetch: no link leaves the file
    said = inv("report", "--hosts", str(box.inventory), "--run", run_id, "--json", log_dir=logs)
    assert said.returncode == 0, said.stderr
    page = json.loads(said.stdout)
    assert page["headline"].startswith("command -> first optimizer step on every rank: "), page["headline"]
    assert 0 < page["first_step_s"] < page["duration_s"]
    nodes = {row["node"]: row["phases"] for row in page["start"] if row["rank"] is None}
    assert sorted(nodes) == ["node-0", "node-1"]
    for node, phases in nodes.items():
        names = list(phases)
        assert names == [n for n in ORDER if n in names], (node, names)
        assert {"connected", "ready", "torchrun", *WORKER_PHASES} <= set(names), (node, names)
        assert list(phases.values()) == sorted(phases.values()), (node, phases)
    assert [(r["node"], r["rank"]) for r in page["ranks"]] == [("node-0", 0), ("node-0", 1), ("node-1", 2),
                                                               ("node-1", 3)]
    assert all(r["steps_per_s"] and r["steps_per_s"] > 0 for r in page["ranks"]), page["ranks"]
    kinds = {m["kind"] for m in page["marks"]}
    assert {"straggler", "end"} <= kinds, page["marks"]
    assert any("straggler: node-1 r3" in m["text"] for m in page["marks"]), page["marks"]
    assert "r3: RuntimeError: rank 3 fails on purpose after 200 steps" in page["nodes"]["node-1"]["raised"]
    assert "RuntimeError: rank 3 fails on purpose" in page["root_cause"]
    for rank in range(4):
        assert f"<td>r{rank}</td>" in text
    assert "RuntimeError: rank 3 fails on purpose" in text and str(logs / run_id) in text
    # what a bug report sends (docs/troubleshooting.md): the launcher's trace, and each node's, fetched with the page
    trace = (logs / run_id / "launcher.log").read_text()
    assert "node-1 ended (exited, exit code 1, stop reason None): StopRun(node='node-1')" in trace, trace
    assert "running -> stopping (node-1 failed: the others are stopped (fail fast))" in trace, trace
    assert "the run ended: failed (root cause: node-1, rank 3" in trace, trace
    agent = (logs / run_id / "node-1.agent.log").read_text()
    assert "start: run " in agent and "torchrun started: pid" in agent and "torchrun ended: exit code 1" in agent
    assert "message: go" in agent and "message: hb" not in agent, agent  # heartbeats are not traced


def test_a_hung_runs_page_marks_the_hang_and_ends_with_it(make_sandbox, tmp_path: Path) -> None:
    # 2 nodes x 1 rank: rank 1 sleeps 10 minutes before an all_reduce rank 0 entered; the watch's timeout is 10 s.
    box = make_sandbox(2, torchrun="stand-in",
                       master_port=free_port(), script="tests/scripts/hang_rank.py", script_args=["1", "600"])
    logs = tmp_path / "logs"
    result = inv("launch", "--hosts", str(box.inventory), "--hang-timeout", "10", "--skip-doctor", log_dir=logs,
                 env=PAGE_ON)
    assert result.returncode == 124, result.stderr
    text = _page(logs, run_id_of(result.stdout + result.stderr)).read_text()
    assert text.count("hang suspected") >= 2  # its mark, and the end's words
    assert re.search(r"<td class=text>hang</td><td class=text>[^<]*</td><td class=text>hang suspected[^<]*"
                     r"all_reduce", text), text[text.find("<h2>2."):][:3000]


@pytest.fixture(scope="module")
def detached_page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A detached run's page, written at the first `status` after its end; the browser test opens the same page."""
    root = tmp_path_factory.mktemp("detached")
    factory = SandboxFactory(root)
    try:
        box = factory(2, torchrun="stand-in", master_port=free_port(), script="tests/scripts/quiet_loop.py",
                      script_args=["30", "-1", "0", "0"])
        logs = root / "logs"
        started = inv("launch", "--hosts", str(box.inventory), "--detach", "--skip-doctor", log_dir=logs, env=PAGE_ON)
        assert started.returncode == 0, started.stderr
        run_id = run_id_of(started.stdout + started.stderr)
        assert (logs / run_id / "journal.json").exists() and not (logs / run_id / "report.html").exists()

        said: list[str] = []

        def ended() -> bool:
            status = inv("status", "--hosts", str(box.inventory), "--run", run_id, log_dir=logs, env=PAGE_ON)
            said.append(status.stdout)
            return status.stdout.count("exited") >= 2

        wait_for(ended, 120, "the detached run's end", interval=2)
        # the status that starts the page says where, and when (issue 69, 13: it appeared without a word)
        assert f"the run's page: {logs / run_id / 'report.html'} (written in a few seconds)" in said[-1], said[-1]
        yield _page(logs, run_id)
    finally:
        factory.close()


def test_a_detached_runs_page_is_written_at_the_first_status_after_its_end(detached_page: Path) -> None:
    text = detached_page.read_text()
    assert "first optimizer step on every rank: " in text and "node-1" in text


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no headless browser here (Debian's chromium)")
def test_a_headless_browser_opens_the_page_with_no_error_and_no_request(detached_page: Path, tmp_path: Path) -> None:
    page = detached_page
    shot, net = tmp_path / "page.png", tmp_path / "net.json"
    # --no-sandbox: root. The net log holds every request; chromium's own (its updates, its clock) go to Google's
    # hosts whatever the page, so the page's would be any other.
    browsed = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                              "--v=0", "--proxy-server=127.0.0.1:9", f"--log-net-log={net}", f"--screenshot={shot}",
                              "--window-size=1200,2400", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert browsed.returncode == 0, browsed.stderr
    assert shot.exists() and shot.stat().st_size > 10_000
    assert "Uncaught" not in browsed.stderr and ":CONSOLE:" not in browsed.stderr, browsed.stderr
    asked = set(re.findall(r'"url":"([a-z]+://[^/"]*)', net.read_text(errors="replace")))
    assert {url for url in asked if not url.endswith(CHROMIUM_OWN)} == set(), asked
