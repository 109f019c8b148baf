"""What `inv status` and `inv stop` print: a table of every node's state of a run, and the lines under it."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol

from rich.console import Console
from rich.table import Table
from rich.text import Text

from launcher.limits import STATE_ROWS_MAX
from launcher.ranges import names_text


class NodeStateRow(Protocol):
    """One node's answer (`launcher.run.control.NodeState`): read only."""

    @property
    def host(self) -> str: ...
    @property
    def run_id(self) -> str | None: ...
    @property
    def state(self) -> str: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def started_at(self) -> float | None: ...
    @property
    def ended_at(self) -> float | None: ...
    @property
    def found(self) -> int: ...
    @property
    def left(self) -> int: ...
    @property
    def detail(self) -> str | None: ...
    @property
    def launcher(self) -> Mapping[str, Any] | None: ...


_COLOURS = {
    "running": "green",
    "exited": "cyan",
    "stopped": "yellow",
    "none": "dim",
    "unreachable": "red",
    "error": "red",
    "lost": "red",
}


def console(out: IO[str]) -> Console:
    """A console on the task's output; wide enough for a table when it is a file or a pipe, not a terminal."""
    return Console(file=out, width=None if out.isatty() else 160)


def say(con: Console, line: str) -> None:
    """A line as it is: node names, run ids and messages come from users and nodes, never read as Rich markup."""
    con.print(line, markup=False, highlight=False)


def _when(ts: float | None) -> str:
    return _dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S") if ts else ""


def state_table(title: str, states: Sequence[NodeStateRow], stop: bool) -> Table:
    """One row per node; past STATE_ROWS_MAX nodes, one row per group of nodes in the same state (their names as a
    hostlist, `node-[0-253]`, and the span of their times): 256 nodes' answer stays a screen. Title and cells are
    `Text`: node names, run ids and states come from users and nodes, and a `[/]` in them must print as it is,
    never be read as Rich markup."""
    table = Table(title=Text(title), title_justify="left")
    stopped = ("processes stopped", "processes left") if stop else ()  # counts of the run's processes on the node
    for column in ("node", "run", "state", "exit", "started", "ended", *stopped):
        table.add_column(column)
    for group in _grouped(states):
        s = group[0]
        cells = [
            names_text([g.host for g in group]) if len(group) > 1 else s.host,
            s.run_id or "",
            s.state,
            "" if s.exit_code is None else s.exit_code,
            _span([g.started_at for g in group]),
            _span([g.ended_at for g in group]),
            *((sum(g.found for g in group), sum(g.left for g in group)) if stop else ()),
        ]
        row = [Text(str(cell)) for cell in cells]
        row[2].stylize(_COLOURS.get(str(s.state), "white"))
        table.add_row(*row)
    return table


def _grouped(states: Sequence[NodeStateRow]) -> list[list[NodeStateRow]]:
    """Each node alone up to STATE_ROWS_MAX nodes; above, nodes of the same run, state and exit code together (a
    node with processes left stays apart)."""
    if len(states) <= STATE_ROWS_MAX:
        return [[s] for s in states]
    groups: dict[tuple[object, ...], list[NodeStateRow]] = {}
    for s in states:
        groups.setdefault((s.run_id, s.state, s.exit_code, s.left > 0), []).append(s)
    return list(groups.values())


def _span(times: Sequence[float | None]) -> str:
    """`21:19:37`, or `21:19:37-21:19:41` for a group's first and last."""
    shown = sorted({_when(t) for t in times if t})
    return shown[0] if len(shown) == 1 else (f"{shown[0]}-{shown[-1]}" if shown else "")


def problems(con: Console, states: Sequence[NodeStateRow]) -> None:
    """Each node's problem; the nodes that have the same one said once (`node-[3-9]: unreachable: ...`)."""
    said: dict[str, list[str]] = {}
    for s in states:
        if s.detail:
            said.setdefault(s.detail, []).append(s.host)
    for detail, hosts in said.items():
        say(con, f"{names_text(hosts)}: {detail}")


def launcher_lines(states: Sequence[NodeStateRow], attach: str, now: float) -> list[str]:
    """An attached run whose launcher is away, as its running nodes know it: since when, and when they stop it."""
    away = [s for s in states if s.launcher and not s.launcher.get("present") and s.launcher.get("away_since")]
    if not away:
        return []
    since = min(float(s.launcher["away_since"]) for s in away if s.launcher)
    stops = [float(s.launcher["stops_at"]) for s in away if s.launcher and s.launcher.get("stops_at")]
    owner = next((s.launcher.get("owner") for s in away if s.launcher and s.launcher.get("owner")), None)
    who = f" ({owner})" if owner else ""
    line = f"its launcher{who} has not been heard from since {_when(since)} ({now - since:.0f} s)"
    if stops:
        line += (
            f": {names_text([s.host for s in away])} stop the run by themselves at {_when(min(stops))} unless a "
            "launcher comes back"
        )
    else:
        line += ": its nodes keep the run going without it (no --heartbeat-timeout)"
    return [f"{line}; `{attach}` takes it over now"]


def ended_line(run_id: str, states: Sequence[NodeStateRow]) -> str:
    """How a run ended, in one line (`inv logs --follow`'s last): `run R ended: 2 node(s) exited 0`, or each way its
    nodes ended (`node-1 stopped (exit code 143): stopped by the user (...); node-0 exited 0`)."""
    if states and all(s.state == "exited" and s.exit_code == 0 for s in states):
        return f"run {run_id} ended: {len(states)} node(s) exited 0"
    ways: dict[tuple[str, int | None, str], list[str]] = {}
    for s in states:
        ways.setdefault((str(s.state), s.exit_code, s.detail or ""), []).append(s.host)
    said = []
    for (state, code, detail), hosts in ways.items():
        head = detail if detail and detail.startswith(state + " ") else state  # `stopped by the user (...)`
        text = f"{names_text(hosts)} {head}" + ("" if code in (None, 0) else f" (exit code {code})")
        said.append(text + (f": {detail}" if detail and head == state else ""))
    return f"run {run_id} ended: {'; '.join(said)}"
