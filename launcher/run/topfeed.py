"""`inv top`: every node and rank of a running run at once, from each node's agent (launcher/node/agent/sampler.py).

Over SSH each node's agent keeps one session open and sends a snapshot every TOP_INTERVAL_S (`SshFeed`); under
SLURM (`--job`) and for `--once` each look is one agent action of its own (`PollFeed`, `look_once`). A node that
cannot be reached keeps its row, saying why; the others go on.
"""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from launcher.config.model import Cluster, Host
from launcher.errors import LauncherError, NodeFailure
from launcher.limits import (
    HANG_LOOKS_APART_S,
    NVIDIA_SMI_TIMEOUT_S,
    TOP_INTERVAL_S,
    TOP_ONCE_LEAST_S,
    TOP_ONCE_S,
    TOP_STILL_S,
)
from launcher.paths import hint
from launcher.plan.request import progress_settings
from launcher.run.actions import agent_action, agent_input, check_run_id, reached
from launcher.run.control import _agent_error, chosen_run
from launcher.run.run_io import RunIO
from launcher.run.takestacks import Answers, collect_stacks, two_looks
from launcher.settings import Settings
from launcher.transport.connections import classify
from launcher.transport.program import host_command
from launcher.watch.topmodel import Look, NodeView, TopJudge, TwoStacks, as_json


def top_settings(
    cluster: Cluster, *, count: int | None, interval_s: float, follow: int | None = None
) -> dict[str, Any]:
    """Every number and the progress expression a node's agent needs for `top`."""
    return {**progress_settings(cluster.job), "count": count, "interval_s": interval_s, "follow": follow, "gpus": True}


def _answer(name: str, result: Any) -> NodeView:
    """One node's answer to a `top` action: its snapshot, or why there is none."""
    if isinstance(result, NodeFailure):
        return NodeView(name, problem=str(result))
    try:
        reply = json.loads(result.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return NodeView(name, problem=_agent_error(result))
    return view_of(name, reply)


def not_running(run_id: Any, state: str | None = None) -> str:
    """How a node's row says the run is not running there: one sentence in every view, whether the run had ended
    before the view began (`state`, the agent's word) or while it watched."""
    if state == "none":
        return f"run {run_id} did not run here"
    return f"run {run_id} has ended here" + (f" ({state})" if state and state != "running" else "")


def view_of(name: str, reply: Mapping[str, Any]) -> NodeView:
    """A node's `top` reply: a snapshot, or the agent's word that the run is not running there."""
    if "ranks" not in reply:
        return NodeView(name, problem=not_running(reply.get("run_id"), reply.get("state", "unknown")))
    if not reply.get("running", True):  # its last snapshot: the run ended while the view watched
        return NodeView(name, reply, problem=not_running(reply.get("run_id")))
    return NodeView(name, snapshot=reply)


def look_once(
    cluster: Cluster,
    nodes: Mapping[str, Any],
    run_id: str,
    settings: Settings,
    interval_s: float = TOP_ONCE_S,
    follow: int | None = None,
    settle: bool = False,
) -> list[NodeView]:
    """One snapshot of every node (each watched for `interval_s`; with `settle`, a node whose ranks have all been
    still for TOP_STILL_S answers after TOP_ONCE_LEAST_S), in inventory order."""
    top = top_settings(cluster, count=1, interval_s=interval_s, follow=follow)
    if settle:
        top["settle"] = {"least_s": TOP_ONCE_LEAST_S, "still_s": TOP_STILL_S}
    request = {"action": "top", "run_id": run_id, "top": top}
    results = agent_action(
        dict(nodes), cluster, request, interval_s + NVIDIA_SMI_TIMEOUT_S + settings.run.action_timeout
    )
    return [
        _answer(h.name, results[h.name]) if h.name in results else NodeView(h.name, problem="not reached")
        for h in cluster.hosts
    ]


def stragglers_now(cluster: Cluster, run_id: str, settings: Settings) -> list[str]:
    """The stragglers of a running run as `inv top --once` flags them, one look (a few seconds): what `inv status`
    says of a run no attached launcher watches (detached), which keeps no account of them."""
    from launcher.report.stragglerline import straggler_line
    from launcher.watch.topmodel import TopJudge

    with reached(cluster, settings.ssh) as (usable, _):
        views = look_once(cluster, usable, run_id, settings, settle=True) if usable else []
    look = TopJudge(settings.run.straggler_factor, 0.0).look(views, time.time(), time.monotonic())
    node = {r["rank"]: v.name for v in views if v.snapshot is not None for r in v.snapshot.get("ranks", [])}
    told = f" (now, one look as `{hint('top --once')}`)"
    return [
        straggler_line(found, node.get(key, "?"), one_look=True) + told
        for key, found in sorted(look.stragglers.items(), key=lambda kv: str(kv[0]))
    ]


def check_running(run_id: str, views: list[NodeView], source: str) -> None:
    """A LauncherError when no node runs the run: it does not exist, or it ended."""
    if any(v.snapshot is not None for v in views):
        return
    said = "; ".join(f"{v.name}: {v.problem}" for v in views)
    raise LauncherError(f"run {run_id} is not running on {source}'s nodes ({said}): nothing to watch")


def choose(cluster: Cluster, nodes: Mapping[str, Any], run_id: str | None, settings: Settings, err: IO[str]) -> str:
    check_run_id(run_id)
    run_id = run_id or chosen_run(cluster, dict(nodes), settings, err)
    if run_id is None:
        raise LauncherError(f"{cluster.source}: no run on its nodes to watch")
    return run_id


class SshFeed:
    """One agent session per node, each sending a snapshot every interval; the latest of each node kept."""

    def __init__(self, cluster: Cluster, nodes: Mapping[str, Any], run_id: str, failed: Mapping[str, str]):
        self.cluster, self.nodes, self.run_id = cluster, nodes, run_id
        self.lock = threading.Lock()
        self.latest = {h.name: NodeView(h.name, problem=failed.get(h.name)) for h in cluster.hosts}
        self.channels: dict[str, Any] = {}
        self.closing = False

    def start(self) -> SshFeed:
        settings = top_settings(self.cluster, count=None, interval_s=TOP_INTERVAL_S)
        for host in self.cluster.hosts:
            if host.name in self.nodes:
                threading.Thread(target=self._one, args=(host, settings), daemon=True, name=f"top-{host.name}").start()
        return self

    def _one(self, host: Host, settings: dict[str, Any]) -> None:
        try:
            channel = self.nodes[host.name].open_channel(host_command(host))
            self.channels[host.name] = channel
            channel.send(agent_input({"action": "top", "node": host.name, "run_id": self.run_id, "top": settings}))
            pending, err = b"", b""
            while not self.closing:
                out, more = channel.read()
                err += more
                if out:
                    pending += out
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        self._take(host.name, line)
                elif channel.finished or channel.drained:
                    break
                else:
                    channel.wait_readable(0.5)
            latest = self.latest[host.name]
            if not self.closing and latest.problem is None:  # a node that said why it ended keeps its word
                why = err.decode("utf-8", "replace").strip().splitlines()
                self._set(
                    NodeView(
                        host.name,
                        latest.snapshot,
                        problem=f"its agent ended ({why[-1][:200] if why else 'no reason given'})",
                    )
                )
        except Exception as exc:  # this node's row says what went wrong; the view goes on
            self._set(NodeView(host.name, problem=str(classify(self.nodes[host.name].target, exc))))

    def _take(self, name: str, line: bytes) -> None:
        try:
            reply = json.loads(line)
        except ValueError:
            return
        self._set(view_of(name, reply))

    def _set(self, view: NodeView) -> None:
        with self.lock:
            self.latest[view.name] = view

    def views(self) -> list[NodeView]:
        with self.lock:
            return [self.latest[h.name] for h in self.cluster.hosts]

    def follow(self, rank: int | None) -> None:
        word = f"follow {'-' if rank is None else rank}\n".encode()
        for channel in list(self.channels.values()):
            channel.send(word, block=False)

    def close(self) -> None:
        self.closing = True
        for channel in list(self.channels.values()):
            channel.close()


class PollFeed:
    """A look of its own every interval (a SLURM job's nodes: each look is one `srun --overlap` step a node)."""

    def __init__(self, cluster: Cluster, nodes: Mapping[str, Any], run_id: str, settings: Settings):
        self.cluster, self.nodes, self.run_id, self.settings = cluster, nodes, run_id, settings
        self.latest = [NodeView(h.name) for h in cluster.hosts]
        self.following: int | None = None
        self.closing = threading.Event()

    def start(self) -> PollFeed:
        threading.Thread(target=self._run, daemon=True, name="top-poll").start()
        return self

    def _run(self) -> None:
        while not self.closing.is_set():
            self.latest = look_once(
                self.cluster, self.nodes, self.run_id, self.settings, TOP_INTERVAL_S, self.following
            )
            self.closing.wait(0.1)

    def views(self) -> list[NodeView]:
        return list(self.latest)

    def follow(self, rank: int | None) -> None:
        self.following = rank

    def close(self) -> None:
        self.closing.set()


def wait_first(feed: SshFeed | PollFeed, timeout: float) -> list[NodeView]:
    """The views once every node has answered or failed (or `timeout` passed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = feed.views()
        if all(v.snapshot is not None or v.problem is not None for v in views):
            return views
        time.sleep(0.1)
    return feed.views()


def _views_once(
    cluster: Cluster, usable: Mapping[str, Any], failed: Mapping[str, str], run_id: str, settings: Settings
) -> list[NodeView]:
    views = look_once(cluster, usable, run_id, settings, settle=True)
    views = [NodeView(v.name, problem=failed[v.name]) if v.name in failed else v for v in views]
    check_running(run_id, views, cluster.source)
    return views


def judged_once(views: Sequence[NodeView], factor: float, two_stacks: TwoStacks | None = None) -> Look:
    """`inv top --once`'s judgment of one look: stragglers and ranks behind (its snapshot carries each group's recent
    arrivals: a rank behind is said where they show how long the others have waited), and ranks behind for long
    judged on two looks at the stacks (`two_stacks`, asked for only then), as the hang watch judges them."""
    judge = TopJudge(factor)
    look = judge.look(views, time.time(), time.monotonic())
    if two_stacks is not None and judge.asking(look, time.time()):
        first, second = two_stacks()
        judge.judge(first, second, HANG_LOOKS_APART_S, time.time())
        look = judge.look(views, time.time(), time.monotonic())
    return look


def snapshot(
    cluster: Cluster, run_id: str | None, settings: Settings, err: IO[str], nodes: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One look at every node and rank, judged, as a value: what `inv top --once --json` prints."""
    with reached(cluster, settings.ssh, nodes) as (usable, failures):
        failed = {f.host: str(f) for f in failures}
        run_id = choose(cluster, usable, run_id, settings, err)
        views = _views_once(cluster, usable, failed, run_id, settings)
        look = judged_once(views, settings.run.straggler_factor, lambda: two_looks(cluster, usable, run_id, settings))
        return as_json(run_id, views, look.stragglers, look.behind, look.sources)


def top(
    cluster: Cluster,
    run_id: str | None,
    settings: Settings,
    run_io: RunIO,
    *,
    once: bool = False,
    nodes: Mapping[str, Any] | None = None,
) -> int:
    """`inv top`: over SSH, or over the `nodes` given (a SLURM job's, `launcher.slurm.slurmlaunch.SlurmNode`)."""
    from launcher.report import topview  # rich's Live and the terminal: only this task needs them

    ssh = nodes is None  # SSH connections stream; a SLURM job's steps are polled
    with reached(cluster, settings.ssh, nodes) as (usable, failures):
        failed = {f.host: str(f) for f in failures}
        run_id = choose(cluster, usable, run_id, settings, run_io.err)

        def two_stacks() -> tuple[
            Answers, Answers
        ]:  # the stacks a rank behind for long is judged by, as the hang watch
            return two_looks(cluster, usable, run_id, settings)

        if once:
            views = _views_once(cluster, usable, failed, run_id, settings)
            return topview.show_once(
                run_id, views, judged_once(views, settings.run.straggler_factor, two_stacks), run_io.out
            )
        feed = SshFeed(cluster, usable, run_id, failed) if ssh else PollFeed(cluster, usable, run_id, settings)
        feed.start()
        try:
            check_running(run_id, wait_first(feed, settings.ssh.connect_timeout + TOP_INTERVAL_S * 5), cluster.source)

            def take_stacks() -> list[str]:  # over the view's own connections (or the job's steps): none to open
                return collect_stacks(cluster, run_id, settings, io.StringIO(), usable).lines()

            with topview.keys_of(sys.stdin) as keys:
                return topview.TopScreen(
                    run_id, feed, settings.run.straggler_factor, run_io.out, take_stacks, two_stacks
                ).run(keys)
        except KeyboardInterrupt:
            return 0
        finally:
            feed.close()
