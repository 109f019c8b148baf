"""The run's page says what happened (#60 items 1-4, 12): each rank's steps/s is the rate its program says of itself
(from its first optimizer step to its last, by the steps' own times; lockstep ranks alike), a stop the user asked
for is no failure and has its mark, a launch that never started says so and why, an attempt the launcher started
again has the console's words, marks close in time share one label, a mark of a kind the page does not know is
drawn and listed, and a node out of reach keeps the figures it gave before."""

from __future__ import annotations

import dataclasses
import json

import pytest

from launcher.node.agent.series import numbers_of
from launcher.report.page import mark_labels, render
from launcher.report.pagedata import Mark, build_page
from launcher.report.pageend import Retried, stop_sentence
from launcher.report.pagekeep import kept_answers

T0 = 1_800_000_000.0
RUN = "20270115-080000-abcdef"


def journal(nodes: int = 1, end: dict | None = None, marks: list[dict] | None = None, started: bool = True) -> dict:
    launched = {"connected": T0 + 0.5, "ready": T0 + 1.0, **({"torchrun": T0 + 1.2} if started else {})}
    return {"run_id": RUN, "command_start": T0, "nodes": {f"node-{n}": dict(launched, offset=0.0)
                                                           for n in range(nodes)}, "marks": marks or [], "end": end}


def sample(t: float, ranks: dict[int, list]) -> dict:
    return {"t": T0 + t, "load1": 0.5, "mem_total": 8 << 30, "mem_used": 2 << 30,
            "ranks": {str(rank): numbers for rank, numbers in ranks.items()}}


def trained(first: float, steps: int, rate: float, samples: list[float], rank: int = 0, lag: float = 0.0,
            end: float | None = None) -> dict:
    """A node's answer: one rank whose first optimizer step is at `first` s, then one every 1/rate s until `steps`;
    a sample every time in `samples` and its last after its end (its process gone: the record's last word). `lag`:
    how much older than the sample its record's count is (a record is rewritten at most every 0.1 s)."""
    last = first + (steps - 1) / rate
    found = []
    for t in [*samples, end if end is not None else last + 0.5]:
        seen = min(t - lag, last)
        done = 0 if seen < first else 1 + int((seen - first) * rate + 1e-9)
        t_step = None if done == 0 else T0 + first + (done - 1) / rate
        cpu = None if t > last else round(0.9 * t, 2)
        found.append(sample(t, {rank: [cpu, None if t > last else 300 << 20, done, done, 0.01 * done, 0.02 * done,
                                       t_step]}))
    phases = {str(1000 + rank): [f"hook {T0 + 2:.3f} {rank} {rank} 0", f"step {T0 + first:.3f} {rank} {rank} 0"]}
    return {"state": "exited", "exit_code": 0, "started_at": T0 + 1.5, "ended_at": T0 + (end or last + 0.6),
            "phases": phases, "series": found, "log_tail": ""}


def test_a_short_runs_steps_per_s_is_its_programs_rate_not_a_mean_over_samples_with_the_wait_before_it() -> None:
    # the demo: 64 steps at ~81 a second, 0.78 s of training from 10.6 s, in a run sampled at 2 s (start) and its end
    answer = trained(first=10.6, steps=64, rate=81.0, samples=[2.0, 7.0])
    page = build_page(RUN, journal(), {"node-0": answer}, "logs/x/")
    (rank,) = page.timeline.ranks
    assert rank.mean_rate() == pytest.approx(81.0, rel=0.01) and rank.steps == 64
    assert rank.step_t[0] == pytest.approx(10.6)  # the line begins at its first step, not at a sample before it
    assert page.summary()["ranks"] == [{"node": "node-0", "rank": 0, "steps": 64, "steps_per_s": rank.mean_rate(),
                                        "data_share": rank.data_mean, "loss": None, "loss_min": None,
                                        "loss_nonfinite_by_step": None}]
    assert f"<td>{rank.mean_rate():.3g}</td>" in render(page, charts=False)


def test_a_long_runs_steps_per_s_is_its_programs_rate_and_lockstep_ranks_agree() -> None:
    # 200 steps at 40 a second from 15.0 s (the issue's own run: 20.1 s its end), 5 s samples from 2 s; rank 1's
    # record lags 0.1 s behind rank 0's at every sample
    samples = [2.0 + 5 * i for i in range(4)]
    node0 = trained(first=15.0, steps=200, rate=40.0, samples=samples, rank=0)
    node1 = trained(first=15.0, steps=200, rate=40.0, samples=samples, rank=1, lag=0.1)
    page = build_page(RUN, journal(2), {"node-0": node0, "node-1": node1}, "logs/x/")
    rates = [r.mean_rate() for r in page.timeline.ranks]
    assert rates == pytest.approx([40.0, 40.0], rel=0.01), rates
    assert all(v == pytest.approx(40.0, rel=0.01) for r in page.timeline.ranks for v in r.steps_per_s)


def test_a_rank_that_stops_stepping_reads_zero_from_then_and_its_mean_counts_its_steps_only() -> None:
    # 100 steps at 20 a second from 5 s, then a hang until 40 s
    answer = trained(first=5.0, steps=100, rate=20.0, samples=[2.0 + 5 * i for i in range(8)], end=40.0)
    (rank,) = build_page(RUN, journal(), {"node-0": answer}, "logs/x/").timeline.ranks
    assert rank.mean_rate() == pytest.approx(20.0, rel=0.01)
    assert rank.steps_per_s[-1] == 0.0 and rank.step_t[-1] == pytest.approx(40.0)


def test_a_nodes_sample_has_its_ranks_last_step_by_the_wall_clock_and_none_before_its_first() -> None:
    record = {"steps": 3, "batches": 4, "data_s": 0.51234, "forward_s": 0.2, "t_step": 100.0, "loss_step": 3,
              "loss": 0.25, "loss_sum": 1.75, "loss_n": 3}
    assert numbers_of(record, 1_000.0) == [3, 4, 0.512, 0.2, 1_100.0, 1.75, 3, 0.25]  # the loss after the first 5
    assert numbers_of(dict(record, steps=0), 1_000.0)[4] is None and numbers_of(None, 0.0) == [None] * 8
    assert numbers_of(dict(record, loss=float("nan")), 0.0)[-1] == "nan"  # JSON has no nan
    assert numbers_of(dict(record, loss_step=0, loss_sum=0.0, loss_n=0), 0.0)[-3:] == [0.0, 0, None]


def test_a_ranks_loss_after_its_first_numbers_changes_none_of_them_and_a_nonfinite_one_is_said() -> None:
    answer = trained(first=5.0, steps=100, rate=20.0, samples=[2.0 + 5 * i for i in range(4)])
    with_loss = dict(answer, series=[dict(s, ranks={r: [*n, 12.5 * (i + 1), 10 * (i + 1), "nan" if i == 3 else 1.0]
                                                   for r, n in s["ranks"].items()})
                                     for i, s in enumerate(answer["series"])])
    page = build_page(RUN, journal(), {"node-0": with_loss}, "logs/x/")
    plain = build_page(RUN, journal(), {"node-0": answer}, "logs/x/").timeline
    assert [dataclasses.replace(r, loss=None) for r in page.timeline.ranks] == list(plain.ranks)
    [loss] = [r.loss for r in page.timeline.ranks]
    assert loss is not None and set(loss.mean) == {1.25} and loss.last == "nan" and loss.low == 1.25
    assert loss.nonfinite_t == 17.0 and loss.nonfinite_steps == 100
    assert page.learning == "loss: rank 0 (node-0) was nan by step 100"
    said = page.summary()
    assert said["ranks"][0]["loss"] == "nan" and said["loss"]["line"] == page.learning


def stopped(node: str, at: float, **stop: object) -> dict:
    answer = trained(first=3.0, steps=100, rate=20.0, samples=[2.0, 7.0], end=at + 0.6)
    return dict(answer, state="stopped", exit_code=137, stop={"at": T0 + at, "grace": 5, **stop})


def test_a_stop_the_user_asked_for_is_no_failure_and_has_a_stop_mark_and_how_each_node_ended() -> None:
    answers = {n: stopped(n, 7.0, term_s=term, alone=True, killed=0) for n, term in (("node-0", 0.4), ("node-1", 0.6))}
    page = build_page(RUN, journal(2), answers, "logs/x/")  # a detached run: no end of the launch's own
    assert page.root_cause == "" and page.stopped.startswith("stopped by the user at 7.0 s, not a failure: "), page
    assert ("on every node, its ranks ended on TERM within 0.6 s; torchrun, left without them, was then killed "
            "(exit code 137)") in page.stopped, page.stopped  # the longest of the nodes' times
    assert [(m.kind, m.t) for m in page.marks] == [("stop", 7.0)]
    said = page.summary()
    assert said["root_cause"] is None and said["stopped"] == page.stopped and said["marks"][0]["kind"] == "stop"
    text = render(page, charts=False)
    assert "root cause" not in text and "Stopped by the user at 7.0 s" in text and "stopped by the user" in text
    assert "Every node ended without a failure" not in text
    ctrl_c = build_page(RUN, journal(2, end={"t": T0 + 8, "code": 130, "text": "interrupted (Ctrl-C)"}), answers,
                        "logs/x/")
    assert ctrl_c.root_cause == "" and "stopped by the user at 7.0 s (Ctrl-C)" in ctrl_c.stopped


def test_a_stop_whose_torchrun_ended_by_itself_on_one_node_and_was_killed_alone_on_the_other_is_one_sentence() -> None:
    # Seen under load: the ranks ended on TERM everywhere; node-1's torchrun ended within TORCHRUN_ALONE_S, node-0's
    # was killed after it (the page said only "each node's end below").
    answers = {"node-0": stopped("node-0", 7.0, term_s=0.4, alone=True, killed=0),
               "node-1": dict(stopped("node-1", 7.0, term_s=0.9, alone=False, killed=0), exit_code=143)}
    page = build_page(RUN, journal(2), answers, "logs/x/")
    assert page.stopped == ("stopped by the user at 7.0 s, not a failure: on every node, ended on TERM within 0.9 s; "
                            "torchrun, left without its ranks, was then killed on 1 of the 2 nodes: a stop does not "
                            "wait for torchrun's own shutdown"), page.stopped


def test_how_a_stop_ended_a_nodes_processes_is_said_as_it_happened() -> None:
    assert stop_sentence({"grace": 5, "killed": 2, "term_s": None}, 137) == (
        "2 process(es) had not ended 5 s after TERM: killed (exit code 137)")
    assert stop_sentence({"grace": 5, "killed": 0, "term_s": 1.23, "alone": False}, 1) == (
        "ended on TERM within 1.2 s (exit code 1)")
    assert stop_sentence({"grace": 5, "killed": 0, "term_s": 0.01, "alone": True}, 137) == (
        "its ranks ended on TERM at once; torchrun, left without them, was then killed (exit code 137): a stop does "
        "not wait for torchrun's own shutdown")


def test_the_launchers_own_stop_after_a_failure_is_not_the_users() -> None:
    answers = {"node-0": stopped("node-0", 7.0, term_s=0.4, alone=True, killed=0),
               "node-1": dict(trained(first=3.0, steps=10, rate=20.0, samples=[2.0]), exit_code=1)}
    end = {"t": T0 + 8, "code": 1, "text": "run x FAILED\nroot cause: node-1 r1 exited 1"}
    page = build_page(RUN, journal(2, end=end), answers, "logs/x/")
    assert page.stopped == "" and page.root_cause == end["text"]
    assert {m.kind for m in page.marks} == {"end"}


def test_a_launch_that_never_started_says_so_and_why_and_nothing_else() -> None:
    why = ("the doctor found 2 problem(s); nothing was started:\n  node-0 script: nope.py is missing on node-0\n"
           "  node-1 script: nope.py is missing on node-1")
    answers = {n: {"state": "none", "run_id": RUN} for n in ("node-0", "node-1")}
    page = build_page(RUN, journal(2, end={"t": T0 + 2, "code": 1, "text": why}, started=False), answers, "logs/x/")
    assert page.headline == "never started: the doctor found 2 problem(s); nothing was started:"
    assert page.summary()["never_started"] and page.root_cause == why and page.duration_s is None
    text = render(page, charts=False)
    for wrong in ("still running or unknown", "Every node ended without a failure", "started ?"):
        assert wrong not in text, wrong
    assert "never started: nothing ran" in text and "nope.py is missing on node-1" in text
    assert text.count("nothing was started here") == 2  # each node's row


def test_an_attempt_the_launcher_started_again_has_the_consoles_words_as_its_root_cause() -> None:
    answer = dict(trained(first=3.0, steps=10, rate=20.0, samples=[2.0]), exit_code=137)
    end = {"t": T0 + 9, "code": 137, "text": "run x FAILED\nroot cause: node-0, exit code 137\nOMP_NUM_THREADS ..."}
    retried = Retried(1, 2, "node-0: torchrun was killed by signal 9", "20270115-080100-fedcba")
    page = build_page(RUN, journal(end=end), {"node-0": answer}, "logs/x/", retried=retried)
    assert page.root_cause == ("attempt 1 of 2 failed: node-0: torchrun was killed by signal 9; the launcher started "
                               "the run again as run 20270115-080100-fedcba")


def test_marks_closer_than_their_labels_share_one_label_and_others_keep_their_own() -> None:
    marks = [Mark(10.0, "straggler", "a"), Mark(10.1, "hang", "b"), Mark(30.0, "end", "c"), Mark(30.05, "end", "d"),
             Mark(30.1, "end", "e"), Mark(50.0, "stop", "f")]
    assert mark_labels(marks, 60.0) == [(10.0, "1, 2", "straggler"), (30.0, "3-5", "end"), (50.0, "6", "stop")]


def test_a_mark_of_a_kind_the_page_does_not_know_is_drawn_and_listed_with_its_text() -> None:
    marks = [{"t": T0 + 12.0, "kind": "away", "node": None, "text": "the launcher was away 40 s"},
             {"t": T0 + 13.0, "kind": "reconnect", "node": "node-0", "text": "node-0's connection came back"}]
    answer = trained(first=3.0, steps=300, rate=20.0, samples=[2.0, 7.0, 12.0])
    page = build_page(RUN, journal(marks=marks), {"node-0": answer}, "logs/x/")
    assert [(m.kind, m.t, m.text) for m in page.marks] == [("away", 12.0, "the launcher was away 40 s"),
                                                            ("reconnect", 13.0, "node-0's connection came back")]
    text = render(page)
    for said in ("<td class=text>away</td>", "the launcher was away 40 s", "<td class=text>reconnect</td>",
                 "node-0&#x27;s connection came back"):
        assert said in text, said
    assert text.count("stroke-dasharray") >= 2 * 4  # each mark's dashed line across the four figures
    many = [{"t": T0 + 12.0 + 0.01 * n, "kind": "reconnect", "node": f"node-{n}", "text": f"node-{n} came back"}
            for n in range(40)]
    grouped = build_page(RUN, journal(marks=many), {"node-0": answer}, "logs/x/").marks
    assert len(grouped) == 5 and grouped[-1].text.startswith("36 more (reconnect) from 12 to 12 s: node-4, ")


def test_a_node_out_of_reach_keeps_the_figures_it_gave_before_and_is_named() -> None:
    before = {"at": T0 + 60, "answer": {"state": "exited", "exit_code": 0, "series": [sample(2.0, {})]}}
    fresh = {"node-0": {"state": "unreachable", "detail": "refused: connection refused"},
             "node-1": {"state": "unreachable", "detail": "timeout: no answer"},
             "node-2": {"state": "none", "run_id": RUN}}
    kept = kept_answers(fresh, {"node-0": before, "node-2": before}, T0 + 120)
    assert kept.answers == {"node-0": before["answer"], "node-1": fresh["node-1"], "node-2": before["answer"]}
    assert kept.unreached == ["node-0", "node-1"] and kept.saved == {"node-0": before, "node-2": before}
    assert kept.notes[0].startswith("node-0 could not be reached now (refused: connection refused): its figures "
                                    "are what it said at ")
    assert "node-1 could not be reached now (timeout: no answer): the page has nothing of it" in kept.notes[1]
    assert kept.notes[2].startswith("node-2 no longer has the run (none): its figures are what it said at ")
    again = kept_answers({"node-0": {"state": "exited", "exit_code": 0}}, {"node-0": before}, T0 + 130)
    assert again.saved == {"node-0": {"at": T0 + 130, "answer": {"state": "exited", "exit_code": 0}}}
    assert not again.notes and not again.unreached
    json.dumps(kept.saved)  # what is kept beside the page is JSON


def test_a_detached_run_its_nodes_stopped_for_a_nan_has_that_as_its_root_cause_and_mark() -> None:
    why = "rank 1's loss was nan at step 40 (its last finite: 0.03155 at step 39)"
    answers = {"node-0": stopped("node-0", 7.4, term_s=0.4, alone=True, killed=0,
                                 why="rank 0's loss was nan at step 41 (its last finite: 0.04 at step 40)"),
               "node-1": stopped("node-1", 7.0, term_s=0.4, alone=True, killed=0, why=why)}
    page = build_page(RUN, journal(2), answers, "logs/x/")
    assert page.root_cause == f"stopped by its nodes (--on-nonfinite stop): node-1: {why}", page.root_cause
    assert page.stopped == "" and [(m.kind, m.t, m.node) for m in page.marks] == [("loss", 7.0, "node-1")]
