"""`inv top`'s two faces: one snapshot (`--once`, a table or JSON) and the live view (rich's Live, about once a
second, keys read from the terminal: q quits and the run goes on, s takes every rank's stack, l follows a rank)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import select
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO, Any

from rich.console import Console
from rich.live import Live

from launcher.config.model import Cluster
from launcher.options import TOP_INTERVAL_S, Options
from launcher.plan.straggler import StragglerWatch
from launcher.report.top import NodeView, as_json, node_table, rank_table, ranks_of, rates, view
from launcher.run.stacks import collect_stacks
from launcher.run.start import reached
from launcher.run.top import PollFeed, SshFeed, check_running, choose, look_once, wait_first

REFRESH_S = 0.5
"""How often the screen is drawn again (a key is answered at once); the nodes' figures change every interval."""


def show_once(cluster: Cluster, run_id: str, views: list[NodeView], opts: Options, as_json_too: bool) -> int:
    """`inv top --once`: the snapshot as a table, or as JSON for scripts; stragglers judged on this one look."""
    check_running(run_id, views, cluster.source)
    found = StragglerWatch(opts.straggler_factor, 0.0).look(time.monotonic(), rates(views))
    if as_json_too:
        opts.out.write(json.dumps(as_json(run_id, views, found)) + "\n")
        return 0
    console = Console(file=opts.out, width=200 if not opts.out.isatty() else None)
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

    def __init__(self, cluster: Cluster, run_id: str, feed: SshFeed | PollFeed, opts: Options,
                 take_stacks: Callable[[], list[str]]):
        self.cluster, self.run_id, self.feed, self.opts = cluster, run_id, feed, opts
        self.take_stacks = take_stacks
        self.watch = StragglerWatch(opts.straggler_factor, opts.straggler_hold)
        self.follow: int | None = None
        self.footer: list[str] = []

    def run(self, keys: Callable[[float], str | None]) -> int:
        console = Console(file=self.opts.out)
        with Live(console=console, screen=console.is_terminal, auto_refresh=False) as live:
            while True:
                views = self.feed.views()
                found = self.watch.look(time.monotonic(), rates(views))
                live.update(view(self.run_id, views, found, self.follow, self.footer, console.size.height),
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


def top(cluster: Cluster, run_id: str | None, opts: Options, *, once: bool = False, as_json_too: bool = False,
        nodes: Mapping[str, Any] | None = None) -> int:
    """`inv top`: over SSH, or over the `nodes` given (a SLURM job's, `launcher.slurm.launch.SlurmNode`)."""
    ssh = nodes is None  # SSH connections stream; a SLURM job's steps are polled
    with reached(cluster, opts, nodes) as (usable, failures):
        failed = {f.host: str(f) for f in failures}
        run_id = choose(cluster, usable, run_id, opts)
        if once:
            views = look_once(cluster, usable, run_id, opts)
            views = [NodeView(v.name, problem=failed[v.name]) if v.name in failed else v for v in views]
            return show_once(cluster, run_id, views, opts, as_json_too)
        feed = SshFeed(cluster, usable, run_id, failed) if ssh else PollFeed(cluster, usable, run_id, opts)
        feed.start()
        try:
            check_running(run_id, wait_first(feed, opts.connect_timeout + TOP_INTERVAL_S * 5), cluster.source)

            def take_stacks() -> list[str]:  # over the view's own connections (or the job's steps): none to open
                quiet = dataclasses.replace(opts, out=io.StringIO(), err=io.StringIO())
                return collect_stacks(cluster, run_id, quiet, usable).lines()

            with keys_of(sys.stdin) as keys:
                return TopScreen(cluster, run_id, feed, opts, take_stacks).run(keys)
        except KeyboardInterrupt:
            return 0
        finally:
            feed.close()
