"""`inv top`'s two faces on the screen: one snapshot (`--once`, a table or JSON) and the live view (rich's Live, about
once a second, keys read from the terminal: q quits and the run goes on, s takes every rank's stack, l follows a
rank). What feeds them (the nodes' agents) is `launcher.run.topfeed`."""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any, Protocol

from rich.console import Console
from rich.live import Live

from launcher.limits import HANG_LOOKS_APART_S, TOP_PIPE_COLUMNS
from launcher.report.toptables import behind_lines, node_table, rank_table, view
from launcher.watch.topmodel import Look, NodeView, TopJudge, TwoStacks, ranks_of

REFRESH_S = 0.5
"""How often the screen is drawn again (a key is answered at once); the nodes' figures change every interval."""


class Feed(Protocol):
    """What the live view reads: every node's latest view, and which rank's lines to send (`launcher.run.topfeed`)."""

    def views(self) -> list[NodeView]: ...
    def follow(self, rank: int | None) -> None: ...


def show_once(run_id: str, views: list[NodeView], look: Look, out: IO[str]) -> int:
    """`inv top --once`: the snapshot as a table (as wide as the terminal; into a file or pipe, COLUMNS wide, else
    TOP_PIPE_COLUMNS), with what one look judged (`launcher.run.topfeed.judged_once`). Its JSON for scripts is
    `launcher.run.topfeed.snapshot`'s value, the API's too."""
    told = out.isatty() or os.environ.get("COLUMNS", "").isdigit()  # rich reads COLUMNS itself
    console = Console(file=out, width=None if told else TOP_PIPE_COLUMNS)
    console.print(f"run {run_id}")
    console.print(node_table(views))
    console.print(rank_table(views, look.stragglers, width=console.width, behind=look.behind))
    for line in behind_lines(look.behind, cut=False):
        console.print(line)
    return 0


@contextmanager
def keys_of(stream: IO[str]) -> Iterator[Callable[[float], str | None]]:
    """Single key presses from a terminal (cbreak: no Enter needed, Ctrl-C still interrupts); none otherwise."""
    if not stream.isatty():
        yield lambda timeout: time.sleep(timeout)
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
    """The live view: draws the feed's latest views, flags stragglers as each look finds them (as `--once` does) and
    says the ranks behind a collective (its judge remembers since when; `two_stacks` takes the stacks it judges them by
    once the others have waited long, on a thread of its own), answers keys."""

    def __init__(
        self,
        run_id: str,
        feed: Feed,
        straggler_factor: float,
        out: IO[str],
        take_stacks: Callable[[], list[str]],
        two_stacks: TwoStacks | None = None,
    ):
        self.run_id, self.feed, self.out = run_id, feed, out
        self.take_stacks, self.two_stacks = take_stacks, two_stacks
        self.judge = TopJudge(straggler_factor)
        self.follow: int | None = None
        self.footer: list[str] = []
        self.looked: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None
        """Two looks taken, for the judge (the screen's own thread judges: the judge is not shared)."""

    def run(self, keys: Callable[[float], str | None]) -> int:
        console = Console(file=self.out)
        with Live(console=console, screen=console.is_terminal, auto_refresh=False) as live:
            while True:
                views = self.feed.views()
                look = self._look(views)
                live.update(
                    view(
                        self.run_id,
                        views,
                        look.stragglers,
                        self.follow,
                        self.footer,
                        console.size.height,
                        console.size.width,
                        look.behind,
                    ),
                    refresh=True,
                )
                key = keys(REFRESH_S)
                if key in ("q", "Q"):
                    return 0
                if key == "s":
                    self._stacks()
                elif key == "l":
                    self._next_rank(views)

    def _look(self, views: list[NodeView]) -> Look:
        """This look's judgement; the stacks' looks that came since judged first, and new ones asked for when due."""
        taken, self.looked = self.looked, None
        if taken is not None:
            self.judge.judge(*taken, HANG_LOOKS_APART_S, time.time())
        look = self.judge.look(views, time.time(), time.monotonic())
        if self.two_stacks is not None and self.judge.asking(look, time.time()):
            two_stacks = self.two_stacks

            def take() -> None:
                try:
                    self.looked = two_stacks()
                except Exception as exc:  # the view goes on: it says what went wrong, and asks again later
                    self.footer = [f"stacks of the ranks behind: {exc}"]

            threading.Thread(target=take, daemon=True, name="looks").start()
            look = self.judge.look(views, time.time(), time.monotonic())  # its lines say they are being looked at
        return look

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
