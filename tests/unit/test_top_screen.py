"""`inv top`'s live view in a terminal smaller than the run (pure): what is hidden is said, flagged ranks first, the
key line and a key's answer always on the screen, the last line readable; rendered as rich renders the live view."""

from __future__ import annotations

import io
import re

from rich.console import Console

from launcher.report.toptables import view
from launcher.watch.straggler import Straggler
from launcher.watch.top import NodeView


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
