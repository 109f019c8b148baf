"""The run's page from canned answers (launcher/report/pagedata.py, pageseries.py, page.py): the waterfall's phases
in order and its headline, the timeline's rates, the marks of a hang, a straggler, a restart and a failure with the
failing rank's exception, and a page of 256 nodes that stays readable and under 2 MB; with and without matplotlib."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from launcher.report import page as page_module
from launcher.report.page import INSTALL, render
from launcher.report.pagedata import PHASES, build_page, rank_phases
from launcher.report.pageseries import band

T0 = 1_800_000_000.0
RUN = "20270115-080000-abcdef"


def answers(nodes: int, per_node: int = 2, samples: int = 12, slow: str = "node-1", fail: bool = False,
            restart: bool = False) -> dict[str, dict]:
    """Each node's `report` answer: node clocks 2 s ahead of the launcher's; `slow` waits 20 s in the rendezvous
    less (it arrives last: the others wait for it) and its r{last} steps at half the rate."""
    found = {}
    for n in range(nodes):
        node = f"node-{n}"
        late = 20.0 if node == slow else 0.0
        phases, series = {}, []
        for local in range(per_node):
            rank = n * per_node + local
            base = T0 + 2.0 + 3.0 + 0.1 * local + late
            times = {"hook": base, "torch": base + 5, "pg": 30.0 + T0 + 2.0 + 6, "batch": T0 + 2.0 + 37,
                     "step": T0 + 2.0 + 38 + 0.2 * local}
            phases[str(1000 + rank)] = [f"{k} {v:.3f} {rank} {local} 0" for k, v in times.items()]
            if restart and node == "node-0" and local == 0:
                phases["2000"] = [f"hook {T0 + 2.0 + 70:.3f} {rank} 0 1"]
        for i in range(samples):
            t = T0 + 2.0 + 40 + 5 * i
            ranks = {}
            for local in range(per_node):
                rank = n * per_node + local
                rate = 5.0 if (node == slow and local == per_node - 1) else 10.0
                first = T0 + 2.0 + 38 + 0.2 * local  # its "step" phase: count 1, then one every 1/rate s
                steps = 1 + int(rate * (t - first))
                ranks[str(rank)] = [2.0 * i, 300 << 20, steps, steps, 0.5 * i, 2.0 * i, first + (steps - 1) / rate]
            series.append({"t": t, "load1": 1.0, "mem_total": 8 << 30, "mem_used": (2 << 30) + i, "ranks": ranks})
        failed = fail and node == "node-1"
        tail = ("[default1@r3]:Traceback (most recent call last):\n[default1@r3]:  File \"train.py\", line 9\n"
                "[default1@r3]:RuntimeError: boom on purpose\n") if failed else "[default0@r0]:done\n"
        found[node] = {"state": "exited", "exit_code": 1 if failed else 0, "started_at": T0 + 4.0,
                       "ended_at": T0 + 2.0 + 40 + 5 * samples, "phases": phases, "series": series, "log_tail": tail}
    return found


def journal(nodes: int, marks: list[dict] | None = None, end: dict | None = None) -> dict:
    names = [f"node-{n}" for n in range(nodes)]
    return {"run_id": RUN, "command_start": T0,
            "nodes": {n: {"connected": T0 + 0.5, "ready": T0 + 1.5, "torchrun": T0 + 2.0, "offset": -2.0}
                      for n in names},
            "marks": marks or [], "end": end}


def test_the_waterfall_has_every_nodes_phases_in_order_and_the_headline_names_the_slowest_node() -> None:
    page = build_page(RUN, journal(2), answers(2), "logs/x/")
    order = [p[0] for p in PHASES]
    nodes = [b for b in page.bars if b.rank is None]
    assert [b.node for b in nodes] == ["node-0", "node-1"]
    for bar in nodes:
        names = [n for n, _ in bar.phases]
        assert names == [n for n in order if n in names] and set(names) >= {"connected", "torchrun", "pg", "step"}
        times = [t for _, t in bar.phases]
        assert times == sorted(times)
    assert nodes[0].at("connected") == 0.5 and nodes[0].at("step") == pytest.approx(38.2)  # node clock - 2 s
    assert page.first_step_s == pytest.approx(38.2)
    # node-1's ranks: 20 s later to their imports; its rendezvous the shortest, yet its ranks stepped last? No: every
    # rank steps together; node-1 is the last by a hair only when its r3's step is latest: the headline says so.
    assert re.fullmatch(r"command -> first optimizer step on every rank: 38\.2 s; the slowest node, node-\d: "
                        r"\d+ s in [a-z ]+", page.headline), page.headline
    assert page.summary()["first_step_s"] == pytest.approx(38.2)
    ranks = [b for b in page.bars if b.rank is not None]
    assert not ranks  # a node's ranks start within RANK_SPREAD_S of each other: no rows of their own


def test_the_timeline_has_each_rank_its_rate_and_data_share_and_each_nodes_cpu_and_memory() -> None:
    page = build_page(RUN, journal(2), answers(2), "logs/x/")
    line = page.timeline
    assert [(r.node, r.rank) for r in line.ranks] == [("node-0", 0), ("node-0", 1), ("node-1", 2), ("node-1", 3)]
    assert line.ranks[0].t[:2] == pytest.approx((40.0, 45.0))  # the first stretch drawn from the first sample on
    assert line.ranks[0].step_t[0] == pytest.approx(38.0) and line.ranks[0].rate == pytest.approx(10.0)
    assert set(line.ranks[0].steps_per_s) == {10.0} and set(line.ranks[3].steps_per_s) == {5.0}
    assert set(line.ranks[0].data_share) == {0.1}
    assert line.slowest()[0].rank == 3
    assert set(line.nodes[0].cpu_percent) == {80.0}  # two ranks of 0.4 s a second
    text = render(page)
    assert text.count("<svg") == 2 and "<script" not in text
    for rank in range(4):
        assert f"<td>r{rank}</td>" in text


def test_a_hang_a_straggler_a_restart_and_a_failure_are_each_marked_with_the_failing_ranks_exception() -> None:
    marks = [{"t": T0 + 60, "kind": "straggler", "node": None,
              "text": "straggler: node-1 r3 at 0.50x the median rate for 60 s"},
             {"t": T0 + 80, "kind": "hang", "node": None, "text": "hang suspected: rank 3 never entered all_reduce #9"}]
    end = {"t": T0 + 101, "code": 1, "text": "run x failed: root cause: node-1 r3 exited 1: RuntimeError: boom"}
    page = build_page(RUN, journal(2, marks, end), answers(2, fail=True, restart=True), "logs/x/")
    kinds = {m.kind: m for m in page.marks}
    assert set(kinds) >= {"straggler", "hang", "restart", "end"}
    assert kinds["straggler"].node == "node-1" and kinds["restart"].t == pytest.approx(70.0)
    assert kinds["end"].node == "node-1" and "exit code 1" in kinds["end"].text
    failed = next(e for e in page.exits if e.node == "node-1")
    assert failed.raised == ("r3: RuntimeError: boom on purpose",)
    assert "RuntimeError: boom" in page.root_cause
    text = render(page)
    for said in ("straggler: node-1 r3", "hang suspected", "workers started again (restart 1)",
                 "RuntimeError: boom on purpose", "logs/x/"):
        assert said in text


def test_without_a_journal_the_root_cause_is_the_first_node_that_failed_by_its_exception() -> None:
    page = build_page(RUN, None, answers(2, fail=True), "logs/x/", offsets={"node-0": -2.0, "node-1": -2.0})
    assert page.root_cause == "root cause: node-1 exited (exit code 1); r3: RuntimeError: boom on purpose"
    assert page.bars[0].at("connected") is None and page.bars[0].at("hook") is not None


def test_without_matplotlib_the_same_page_has_its_tables_and_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setattr(page_module, "pyplot", lambda: None)
    text = render(build_page(RUN, journal(2), answers(2), "logs/x/"))
    assert "<svg" not in text and html.escape(INSTALL) in text and "first optimizer step" in text
    assert "<td>r3</td>" in text


def test_a_page_of_256_nodes_draws_bands_names_the_worst_and_stays_under_2_mb() -> None:
    page = build_page(RUN, journal(256), answers(256, per_node=8, samples=120, slow="node-77"), "logs/x/")
    text = render(page)
    assert len(text.encode()) < 2 << 20, len(text.encode())
    assert page.hidden_bars == 256 - 32 and "224 faster nodes are not listed" in text
    # every node steps at once (the rendezvous): the first row is the one that came to it last, as the headline says
    assert page.bars[0].node == "node-77" and "the slowest node, node-77:" in page.headline, page.headline
    assert "r623 (node-77)" in text  # the slowest rank, named on the band
    assert "middle half" in text
    assert "<td>node-0, node-1, node-2, node-3, node-4 and 251 more</td><td class=text>exited</td><td>0</td>" in text
    assert text.count("<td class=text>exited</td>") == 1  # the end: 256 nodes that exited 0 are one row
    failed = build_page(RUN, journal(256), answers(256, per_node=1, samples=3, fail=True), "logs/x/")
    assert len(failed.marks) == 1  # one node failed: one end mark
    ends = render(failed, charts=False)
    assert "<td>node-1</td><td class=text>exited</td><td>1</td>" in ends and "RuntimeError: boom on purpose" in ends
    assert "<td>node-0, node-2, node-3, node-4, node-5 and 250 more</td>" in ends


def test_many_nodes_ends_are_a_few_marks_and_one_that_counts_the_rest() -> None:
    found = answers(40, per_node=1, samples=3)
    for answer in found.values():
        answer.update(state="stopped", exit_code=137)
    hang = {"t": T0 + 60, "code": 124, "text": "run x stopped: hang suspected"}  # the launcher's stop: no user's
    marks = build_page(RUN, journal(40, end=hang), found, "logs/x/").marks
    assert [m.kind for m in marks] == ["end"] * 5 and marks[-1].text.startswith("36 more (end) from ")


def test_a_band_holds_the_extremes_quartiles_and_median_of_its_lines_per_bucket() -> None:
    found = band([(1.0, 2.0), (1.0, 2.0), (1.0,)], [(1.0, 2.0), (3.0, None), (5.0,)], end=4.0, buckets=2)
    assert found is not None and found.t == (1.0, 3.0) and found.median == (3.0, 2.0) and found.low == (1.0, 2.0)
    assert found.high == (5.0, 2.0) and found.q1[0] < 3.0 < found.q3[0]


def test_a_phases_file_reads_each_phase_once_with_its_rank_and_restart() -> None:
    assert rank_phases(["hook 1.5 3 1 2", "step 2.5 3 1 2", "step 9.0 3 1 2", "bad line"]) == (
        3, 2, {"hook": 1.5, "step": 2.5})


def test_a_page_is_due_once_the_run_is_over_on_every_node_that_had_it_and_has_none_yet(tmp_path) -> None:
    from launcher.app.pages import PAGE_FILE, page_due
    from launcher.settings import Settings

    settings = Settings.of(log_dir=tmp_path)
    assert page_due(settings, RUN, ["exited", "stopped", "none"])  # a node that never had the run has no say
    assert not page_due(settings, RUN, ["exited", "running"]) and not page_due(settings, RUN, ["none", "unreachable"])
    assert not page_due(Settings.of(log_dir=tmp_path, page=False), RUN, ["exited"])
    assert not page_due(settings, None, ["lost"])
    (tmp_path / RUN).mkdir()
    (tmp_path / RUN / PAGE_FILE).write_text("<html>")
    assert not page_due(settings, RUN, ["exited"])


def recorded(name: str) -> tuple[dict, dict]:
    """A real run's journal and each node's `report` answer (tests/data/pages/<name>: from the H200 device check of
    2026-11-28, tests/gpu/device_check.sh: two sandbox nodes sharing GPU 0 over NCCL)."""
    folder = Path(__file__).parent.parent / "data" / "pages" / name
    return (json.loads((folder / "journal.json").read_text()), json.loads((folder / "answers.json").read_text()))


def test_a_lightning_hang_on_an_h200_has_its_gpu_lines_the_hang_mark_and_the_waiting_rank_spinning() -> None:
    found_journal, found = recorded("h200-lightning-hang")
    page = build_page(found_journal["run_id"], found_journal, found, "logs/x/")
    assert page.first_step_s == pytest.approx(23.0)
    hang = next(m for m in page.marks if m.kind == "hang")
    assert hang.t == pytest.approx(44.5, abs=0.1) and "rank 1 never entered all_reduce #58" in hang.text
    assert {e.node: (e.state, e.exit_code) for e in page.exits} == {"node-0": ("stopped", 137),
                                                                   "node-1": ("stopped", 137)}
    for node in page.timeline.nodes:
        ((index, _, util, used),) = node.gpus  # GPU 0 of each node (one GPU, shared by the two nodes' ranks)
        assert index == 0 and max(u for u in util if u is not None) == 100
        assert 2.0 < max(u for u in used if u is not None) < 3.0  # GiB
    # rank 1 sleeps in its training_step; rank 0 waits for it in a CUDA sync, and that wait is a spinning CPU
    waiting, stuck = page.timeline.nodes
    assert waiting.cpu_percent[-3] > 150 and stuck.cpu_percent[-3] < 20
    text = render(page)
    assert "GPU use" in text and "node-1 gpu0" in text and "rank 1 never entered all_reduce #58" in text


def test_hf_trainers_slow_rank_on_an_h200_steps_at_the_others_rate_and_is_marked_by_its_arrival() -> None:
    found_journal, found = recorded("h200-hf-slow")
    page = build_page(found_journal["run_id"], found_journal, found, "logs/x/")
    straggler = next(m for m in page.marks if m.kind == "straggler")
    assert straggler.node == "node-1" and "r1 enters the collectives last" in straggler.text
    rates = [r.mean_rate() or 0.0 for r in page.timeline.ranks]
    assert rates[0] == pytest.approx(rates[1], rel=0.05)  # lockstep: the rates cannot tell who is behind
    assert not page.timeline.slowest()
    assert page.root_cause == "" and {e.exit_code for e in page.exits} == {0}


def test_a_long_setup_before_init_process_group_is_the_scripts_own_not_the_rendezvous() -> None:
    found = answers(2)
    for answer in found.values():  # a trainer's imports and model: 15 s between import torch and the rendezvous
        for pid, lines in answer["phases"].items():
            parts = {line.split()[0]: line.split() for line in lines}
            pg = float(parts["pg"][1])
            parts["rdzv"] = ["rdzv", f"{pg - 0.5:.3f}", *parts["pg"][2:]]
            answer["phases"][pid] = [" ".join(w) for w in parts.values()]
    page = build_page(RUN, journal(2), found, "logs/x/")
    assert page.slowest is not None and page.slowest[1] == "the script's own setup", page.headline
    assert all(b.at("torch") < b.at("rdzv") < b.at("pg") for b in page.bars)
    assert "until init_process_group called" in render(page)


def test_two_launchers_of_one_run_keep_each_others_marks_and_the_final_end(tmp_path: Path) -> None:
    """The first launcher's absence and the attach's take-over both stay on the page, whichever launcher writes its
    journal last; the end that says how the run ended wins over `going on` (the displaced launcher's)."""
    from launcher.run.journal import Journal, read_journal

    first = Journal("R", tmp_path, command_start=100.0)
    first.mark("away", "the launcher was away 61 s", None, 110.0)
    first.write()
    second = Journal.resumed("R", tmp_path)
    second.mark("attach", "run taken over by `attach` on node-0", None, 120.0)
    second.end(0, "all 1 node(s) exited 0")
    second.write()
    first.mark("away", "the launcher was away 9 s", None, 125.0)  # it wakes, then lets go
    first.end(129, "run R was taken over", going_on=True)
    first.write()
    kept = read_journal(tmp_path)
    assert kept is not None
    assert [m["text"] for m in kept["marks"]] == ["the launcher was away 61 s", "run taken over by `attach` on node-0",
                                                   "the launcher was away 9 s"]
    assert kept["end"]["code"] == 0 and kept["command_start"] == 100.0


def test_a_hung_runs_headline_and_header_say_the_hang_first() -> None:
    # issue 69 (13): its headline said `not every rank made an optimizer step` and its header nothing of the hang
    found_journal, found = recorded("h200-lightning-hang")
    page = build_page(found_journal["run_id"], found_journal, found, "logs/x/")
    assert page.headline.startswith("stopped on a hang: rank 0 is in trainer.fit (lightning_boring.py:58); rank 1 "
                                    "(node-1, pid 836) is in time.sleep (lightning_boring.py:41, in training_step); "
                                    "command -> first optimizer step"), page.headline
    facts = re.search(r"<p>started .*?</p>", render(page, charts=False))
    assert facts and " &middot; stopped on a hang &middot; " in facts.group(), facts


def test_the_rank_table_has_no_empty_column_the_legend_no_marks_it_lacks_and_a_short_run_its_own_axis() -> None:
    # issue 69 (13): an empty sixth column, `dashed: the marks below` with no mark, a 0.6 s run on a 0-12 s axis
    page = build_page(RUN, journal(2), answers(2), "logs/x/")
    table = render(page, charts=False).split("<th>rank</th>", 1)[1].split("</table>", 1)[0]
    assert "<th></th>" not in table and "<th>slowest</th>" in table  # node-1 r3 is the slow one here
    assert "loss (last)" not in table  # no rank's loss was read
    from dataclasses import replace

    from launcher.report.pageseries import timeline_left

    line = page.timeline  # samples from 40 s to 95 s (the start took 40 s: its own chart says how)
    assert 35.0 < timeline_left(line, (), line.end) < 40.0
    early = replace(line, ranks=tuple(replace(r, t=(5.0, *r.t)) for r in line.ranks))
    assert timeline_left(early, (), line.end) == 0.0  # samples from early on: the axis from the command's start
    if page_module.pyplot() is not None:
        assert "dashed: the marks below" not in render(page)
