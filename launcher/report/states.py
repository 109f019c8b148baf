"""What `inv status` and `inv stop` print: a table of every node's state of a run, and the lines under it."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from typing import IO, Protocol

from rich.console import Console
from rich.table import Table
from rich.text import Text


class NodeStateRow(Protocol):
    """One node's answer (`launcher.run.control.NodeState`)."""

    host: str
    run_id: str | None
    state: str
    exit_code: int | None
    started_at: float | None
    ended_at: float | None
    found: int
    left: int
    detail: str | None


_COLOURS = {"running": "green", "exited": "cyan", "stopped": "yellow", "none": "dim",
            "unreachable": "red", "error": "red", "lost": "red"}


def console(out: IO[str]) -> Console:
    """A console on the task's output; wide enough for a table when it is a file or a pipe, not a terminal."""
    return Console(file=out, width=None if out.isatty() else 160)


def say(con: Console, line: str) -> None:
    """A line as it is: node names, run ids and messages come from users and nodes, never read as Rich markup."""
    con.print(line, markup=False, highlight=False)


def _when(ts: float | None) -> str:
    return _dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else ""


def state_table(title: str, states: Sequence[NodeStateRow], stop: bool) -> Table:
    """One row per node. Title and cells are `Text`: node names, run ids and states come from users and nodes,
    and a `[/]` in them must print as it is, never be read as Rich markup."""
    table = Table(title=Text(title), title_justify="left")
    for column in ("node", "run", "state", "exit", "started", "ended", *(("stopped", "left") if stop else ())):
        table.add_column(column)
    for s in states:
        cells = [s.host, s.run_id or "", s.state, "" if s.exit_code is None else s.exit_code, _when(s.started_at),
                 _when(s.ended_at), *((s.found, s.left) if stop else ())]
        row = [Text(str(cell)) for cell in cells]
        row[2].stylize(_COLOURS.get(str(s.state), "white"))
        table.add_row(*row)
    return table


def problems(con: Console, states: Sequence[NodeStateRow]) -> None:
    for s in states:
        if s.detail:
            say(con, f"{s.host}: {s.detail}")
