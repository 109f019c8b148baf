"""`inv top`'s two faces on the screen: one snapshot (`--once`, a table or JSON) and the live view (rich's Live, about
once a second, keys read from the terminal: q quits and the run goes on, s takes every rank's stack, l follows a
rank). What feeds them (the nodes' agents) is `launcher.run.topfeed`."""

from __future__ import annotations

import json
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Protocol

from rich.console import Console
from rich.live import Live

from launcher.options import Options
from launcher.report.toptables import node_table, rank_table, view
from launcher.watch.straggler import StragglerWatch
from launcher.watch.top import NodeView, as_json, forward_shares, ranks_of, rates

REFRESH_S = 0.5
"""How often the screen is drawn again (a key is answered at once); the nodes' figures change every interval."""


class Feed(Protocol):
    """What the live view reads: every node's latest view, and which rank's lines to send (`launcher.run.topfeed`)."""

    def views(self) -> list[NodeView]: ...
    def follow(self, rank: int | None) -> None: ...


def show_once(run_id: str, views: list[NodeView], opts: Options, out: IO[str], as_json_too: bool) -> int:
    """`inv top --once`: the snapshot as a table, or as JSON for scripts; stragglers judged on this one look."""
    found = StragglerWatch(opts.straggler_factor, 0.0).look(time.monotonic(), rates(views), forward_shares(views))
    if as_json_too:
        out.write(json.dumps(as_json(run_id, views, found)) + "\n")
        return 0
    console = Console(file=out, width=200 if not out.isatty() else None)
    console.print(f"run {run_id}")
    console.print(node_table(views))
    console.print(rank_table(views, found))
    return 0


@contextmanager
def keys_of(stream: IO[str]) -> Iterator[Callable[[float], str | None]]:
    """Single key presses from a terminal (cbreak: no Enter needed, Ctrl-C still interrupts); none otherwise."""
    if not stream.isatty():
        yield lambda timeout: time.sleep(timeout)  # type: ignore[func-returns-value]
        return
    import termios
    import tty

    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def read(timeout: float) -> str | None:
        ready, _, _ = select.select([fd], [], [], timeout)
        return os.read(fd, 1).decode("utf-8", "replace") if ready else None

    try:
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


class TopScreen:
    """The live view: draws the feed's latest views, flags stragglers held for `straggler_hold`, answers keys."""

    def __init__(self, run_id: str, feed: Feed, opts: Options, out: IO[str], take_stacks: Callable[[], list[str]]):
        self.run_id, self.feed, self.opts, self.out = run_id, feed, opts, out
        self.take_stacks = take_stacks
        self.watch = StragglerWatch(opts.straggler_factor, opts.straggler_hold)
        self.follow: int | None = None
        self.footer: list[str] = []

    def run(self, keys: Callable[[float], str | None]) -> int:
        console = Console(file=self.out)
        with Live(console=console, screen=console.is_terminal, auto_refresh=False) as live:
            while True:
                views = self.feed.views()
                found = self.watch.look(time.monotonic(), rates(views), forward_shares(views))
                live.update(view(self.run_id, views, found, self.follow, self.footer, console.size.height,
                                 console.size.width),
                            refresh=True)
                key = keys(REFRESH_S)
                if key in ("q", "Q"):
                    return 0
                if key == "s":
                    self._stacks()
                elif key == "l":
                    self._next_rank(views)

    def _stacks(self) -> None:
        self.footer = ["stacks: taking every rank's stack..."]

        def take() -> None:
            try:
                self.footer = ["stacks: " + line for line in self.take_stacks()]
            except Exception as exc:  # the view goes on: it says what went wrong
                self.footer = [f"stacks: {exc}"]

        threading.Thread(target=take, daemon=True, name="stacks").start()

    def _next_rank(self, views: list[NodeView]) -> None:
        later = [r["rank"] for r in ranks_of(views) if self.follow is None or r["rank"] > self.follow]
        self.follow = later[0] if later else None
        self.feed.follow(self.follow)
