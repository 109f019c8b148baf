"""`inv top`'s live view in a terminal smaller than the run (pure): what is hidden is said, flagged ranks first (those
behind a collective, then stragglers), the key line, a key's answer and the ranks behind always on the screen, the
last line readable, node names whole; rendered as rich renders the live view (and `--once` its table)."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace
from unittest import mock

import pytest
from rich.console import Console

from launcher.report.toptables import view
from launcher.report.topview import TopScreen, show_once
from launcher.run.topfeed import judged_once
from launcher.watch.straggler import Straggler
from launcher.watch.topmodel import NodeView, TopJudge
from tests.unit.test_arrival import beat
from tests.unit.test_top import recorded_views


def _views(nodes: int, per_node: int, **rank_fields: object) -> list[NodeView]:
    views = []
    for n in range(nodes):
        ranks = [{"rank": n * per_node + i, "local_rank": i, "pid": 4000 + n * per_node + i, "state": "S",
                  "cpu_percent": 97.0, "rss_bytes": 300 << 20, "last_output_s": 0.4, "steps_per_s": 11.7,
                  "step": 1200, "last_line": f"epoch 3 step 1200 loss 0.0421 samples/s 371.2 rank {n * per_node + i}",
                  "tail": [f"line {k}" for k in range(30)], **rank_fields}
                 for i in range(per_node)]
        views.append(NodeView(f"node-{n}", {"load1": 1.2, "cpus": 8, "mem_total_bytes": 24 << 30,
                                            "mem_available_bytes": 20 << 30, "gpus": None, "ranks": ranks}))
    return views


def _screen(renderable: object, width: int = 80, height: int = 24) -> list[str]:
    out = io.StringIO()
    Console(file=out, width=width, height=height, color_system=None, legacy_windows=False).print(renderable)
    return out.getvalue().rstrip("\n").splitlines()


def test_sixteen_ranks_in_80x24_say_what_is_hidden_show_the_straggler_and_keep_the_keys() -> None:
    slow = {13: Straggler(13, 0.45, 60.0)}
    lines = _screen(view("run-x", _views(4, 4), slow, footer=["stacks: every rank's stack in logs/x"], height=24,
                         width=80))
    text = "\n".join(lines)
    assert len(lines) <= 24, text
    assert lines[-1].startswith("q quit (the run goes on)") and lines[-2].startswith("stacks: every rank"), text
    assert any(" r13 " in line and "SLOW" in line for line in lines), text  # the flagged rank before quiet ones
    hidden = next(line for line in lines if "ranks not shown" in line)
    shown = [line for line in lines if re.match(r"node-\d+\s+r\d+\s", line)]
    assert hidden.startswith("+") and int(hidden[1:].split()[0]) == 16 - len(shown), text
    header = next(line for line in lines if "last line" in line)
    row = next(line for line in lines if " r0 " in line)
    assert len(row) - header.index("last line") >= 20, text  # the last line keeps its room, it shrank to 9


def test_sixty_four_ranks_still_read_in_80x24_and_a_followed_rank_has_room() -> None:
    views = _views(16, 4)
    lines = _screen(view("run-x", views, {}, follow=5, height=24, width=80))
    text = "\n".join(lines)
    assert len(lines) <= 24, text
    assert lines[-1].startswith("q quit"), text
    assert any(line.startswith("+") and "nodes not shown" in line for line in lines), text
    assert any(line.startswith("+") and "ranks not shown" in line for line in lines), text
    assert "r5 (node-1)" in text and "line 29" in text, text  # the followed rank's latest lines


def test_a_stopped_rank_hidden_by_the_room_is_named_in_the_hidden_line() -> None:
    views = _views(4, 4)
    for snap_rank in views[3].snapshot["ranks"]:  # type: ignore[index]
        snap_rank["state"] = "T"
    lines = _screen(view("run-x", views, {}, height=12, width=80))
    text = "\n".join(lines)
    hidden = next(line for line in lines if "ranks not shown" in line)
    assert "r15 T" in hidden or any(" r15 " in line for line in lines), text
    assert not any(" r0 " in line for line in lines) or "r12" in text  # flagged first: node-3's ranks come first
    assert lines[-1].startswith("q quit"), text


def test_a_wide_terminal_shows_every_rank_and_every_column() -> None:
    lines = _screen(view("run-x", _views(2, 2), {}, height=50, width=200), width=200, height=50)
    text = "\n".join(lines)
    assert all(f" r{r} " in text for r in range(4)) and "not shown" not in text
    assert "pid" in text and "RSS" in text


def _collectives(views: list[NodeView], behind: dict[int, int], newest: int = 101) -> list[NodeView]:
    """The views again (a new snapshot, as the next one a node sends) with every rank's default group at `newest`
    but the ranks of `behind` (rank -> its last collective)."""
    groups = {b["rank"]: b["collectives"] for b in beat({r: (behind.get(r, newest), behind.get(r, newest) - 1)
                                                         for r in range(64)})}
    return [NodeView(v.name, {**v.snapshot, "ranks": [{**r, "collectives": groups[r["rank"]]}  # type: ignore[index]
                                                      for r in v.snapshot["ranks"]]})  # type: ignore[index]
            for v in views]


def test_a_rank_behind_is_said_once_the_others_have_waited_and_never_suspected_of_a_hang_for_the_wait_alone() -> None:
    judge = TopJudge(0.8, 60.0)
    views = _views(2, 2)
    assert judge.look(_collectives(views, {3: 100}), 1000.0, 0.0).behind == []  # just seen: it may be passing
    look = judge.look(_collectives(views, {3: 100}), 1006.0, 6.0)  # no arrival of #101 yet: since first seen
    lines = _screen(view("run-x", views, look.stragglers, height=24, width=80, behind=look.behind))
    assert "r3 behind: never entered all_reduce #101 of default_pg (6 s)" in lines, "\n".join(lines)
    assert any(" r3 " in line and "BEHIND" in line for line in lines), "\n".join(lines)
    look = judge.look(_collectives(views, {3: 100}), 1031.0, 31.0)
    lines = _screen(view("run-x", views, look.stragglers, height=24, width=80, behind=look.behind))
    # long enough to look at its stack (test_top_verdict.py): a rank behind may be at work, evaluating alone
    assert look.behind[0].due and "r3 behind: never entered all_reduce #101 of default_pg (31 s)" in lines, lines
    assert not any("hang" in line for line in lines), "\n".join(lines)
    assert judge.look(_collectives(views, {}, 102), 1032.0, 32.0).behind == []  # caught up: forgotten
    assert judge.first_seen == {}


def test_32_ranks_in_80x24_keep_a_rank_behind_and_a_straggler_on_screen_and_say_how_to_see_all() -> None:
    views = _views(8, 4, steps=1200, record="on", batches_per_s=11.7, forward_share=0.2, data_share=0.01)
    for snap_rank in views[5].snapshot["ranks"]:  # type: ignore[index]
        snap_rank["steps_per_s"] = 3.0 if snap_rank["rank"] == 22 else 11.7
    judge = TopJudge(0.8, 0.0)
    judge.look(_collectives(views, {29: 100}), 1000.0, 0.0)
    look = judge.look(_collectives(views, {29: 100}), 1040.0, 40.0)
    assert list(look.stragglers) == [22] and [b.ranks for b in look.behind] == [(29,)]
    lines = _screen(view("run-x", views, look.stragglers, height=24, width=80, behind=look.behind))
    text = "\n".join(lines)
    assert len(lines) <= 24 and lines[-1].startswith("q quit"), text
    assert lines[-2] == "fwd: share of a step in its forward", text  # the columns it shows, said (data is left out)
    assert any(re.match(r"node-7\s+r29\s.*BEHIND", line) for line in lines), text
    assert any(re.match(r"node-5\s+r22\s.*SLOW 0.26x", line) for line in lines), text
    hidden = next(line for line in lines if "ranks not shown" in line)
    assert hidden.endswith("ranks not shown, none flagged (inv top --once shows every rank)"), text
    assert "r29 behind: never entered all_reduce #101 of default_pg (40 s)" in lines, text


def test_a_rank_behind_hidden_by_the_room_is_named_in_the_hidden_line() -> None:
    views = _views(4, 4)
    judge = TopJudge(0.8, 0.0)
    judge.look(_collectives(views, {r: 100 for r in range(8, 16)}), 1000.0, 0.0)
    look = judge.look(_collectives(views, {r: 100 for r in range(8, 16)}), 1010.0, 10.0)
    lines = _screen(view("run-x", views, look.stragglers, height=12, width=120, behind=look.behind), width=120)
    text = "\n".join(lines)
    hidden = next(line for line in lines if "ranks not shown" in line)
    assert "r15 behind" in hidden and "r8 " in text and "r0 " not in text, text  # those behind before the others
    assert "r8-15 behind: never entered all_reduce #101 of default_pg (10 s)" in lines, text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _once(views: list[NodeView], tty: bool, now: float | None = None) -> list[str]:
    out = _Terminal() if tty else io.StringIO()
    with mock.patch("launcher.run.topfeed.time.time", return_value=now or 0.0):
        show_once("run-x", views, judged_once(views, 0.8), out)
    return re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue()).splitlines()


def test_once_at_80_columns_keeps_long_node_names_whole_and_says_a_rank_behind(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    views, wall = recorded_views("hang", batches=60, batches_per_s=5.0, data_share=0.01,
                                 helpers=[{"pid": 9, "cpu_percent": 3.0, "rss_bytes": 1 << 28}])
    views = [NodeView(f"gpu-a100-{v.name}.cluster.example.org", v.snapshot) for v in views]
    for tty in (True, False):  # a terminal of 80 columns; a pipe that COLUMNS says is 80 wide (#60 item 11)
        lines = _once(views, tty, wall)
        text = "\n".join(lines)
        rows = [line for line in lines if re.match(r"gpu-a100-node-\d\.cluster\.example\.org\s+r\d", line)]
        assert len(rows) == 2 and all(len(line) <= 80 for line in lines), text
        assert "r1 behind: never entered all_reduce #46 of default_pg (9 s)" in lines, text
        assert "BEHIND" in rows[1] and "pid" not in text, text
    # 25 s later (the rank's files as fresh, for the test): long enough to judge its stack (test_top_verdict.py)
    assert "r1 behind: never entered all_reduce #46 of default_pg (34 s)" in _once(views, True, wall + 25)
    monkeypatch.delenv("COLUMNS")
    lines = _once(views, False, wall)  # a pipe without COLUMNS: TOP_PIPE_COLUMNS, every column
    assert "pid" in "\n".join(lines) and max(len(line) for line in lines) > 80, "\n".join(lines)


def test_once_says_no_rank_behind_where_no_arrival_shows_the_others_waited() -> None:
    views, wall = recorded_views("healthy")
    lines = _once(views, True, wall)  # rank 1 is a collective behind rank 0 at this one look, for no known time
    assert not any("behind" in line or "BEHIND" in line for line in lines), "\n".join(lines)


def test_the_live_view_shows_a_slow_rank_first_at_once_with_the_column_that_says_why() -> None:
    """#60 item 11: 2 nodes x 16 ranks in 80x24, rank 21 slow on its input. The view showed r0-r15, all healthy, and
    `+16 ranks not shown`: its straggler was held for straggler_hold (60 s) where `--once` flags it at once, and the
    `data` column that explains it was the fourth to go at 80 columns."""
    views = _views(2, 16, steps=1200, record="on", batches_per_s=11.7, forward_share=0.3, data_share=0.02)
    for snap_rank in views[1].snapshot["ranks"]:  # type: ignore[index]
        if snap_rank["rank"] == 21:
            snap_rank.update(steps_per_s=5.3, batches_per_s=5.3, data_share=0.53)
    screen = TopScreen("run-x", SimpleNamespace(), 0.8, io.StringIO(), list)  # type: ignore[arg-type]
    look = screen._look(views)  # the first look
    assert list(look.stragglers) == [21]
    lines = _screen(view("run-x", views, look.stragglers, height=24, width=80, behind=look.behind))
    text = "\n".join(lines)
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines), text
    header = next(line for line in lines if "last line" in line)
    rows = [line for line in lines if re.match(r"node-\d+\s+r\d+\s", line)]
    assert re.match(r"node-1\s+r21\s.*SLOW 0\.45x", rows[0]), text  # first, and marked
    assert "data" in header and rows[0][header.index("data") - 1:header.index("data") + 4].strip() == "53%", text
    hidden = next(line for line in lines if "ranks not shown" in line)
    assert hidden == f"+{32 - len(rows)} ranks not shown, none flagged (inv top --once shows every rank)", text


def test_flagged_ranks_past_the_room_are_counted_in_the_hidden_line() -> None:
    views = _views(4, 4)
    for view_ in views[2:]:
        for snap_rank in view_.snapshot["ranks"]:  # type: ignore[index]
            snap_rank["state"] = "T"
    lines = _screen(view("run-x", views, {}, height=12, width=80))
    rows = [line for line in lines if re.match(r"node-\d+\s+r\d+\s", line)]
    assert all(re.match(r"node-[23]\s", row) and "  T  " in row for row in rows), "\n".join(lines)  # flagged first
    hidden = next(line for line in lines if "ranks not shown" in line)
    assert hidden.startswith(f"+{16 - len(rows)} ranks not shown, {8 - len(rows)} flagged: r"), "\n".join(lines)
