"""`inv logs`: a run's output again, from its nodes, prefixed like a live launch (one node, one global rank, or all);
with `--follow`, followed until the run ends."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import IO

from launcher.config.model import Cluster, Host
from launcher.errors import LauncherError
from launcher.plan.launchplan import rank_offsets
from launcher.report.lines import NodeLog, supports_colour
from launcher.run.actions import agent_input, check_run_id, connect_or_fail
from launcher.run.control import _agent_error, chosen_run
from launcher.run.run_io import RunIO
from launcher.settings import Settings
from launcher.transport.channel import Result
from launcher.transport.connections import Node, classify, close_all
from launcher.transport.program import host_command


def logs(
    cluster: Cluster,
    run_id: str | None = None,
    *,
    node: str | None = None,
    rank: int | None = None,
    follow: bool = False,
    settings: Settings | None = None,
    run_io: RunIO | None = None,
) -> int:
    """Replay (and with `follow`, follow) the log of a run from the nodes, prefixed like a live launch."""
    settings, run_io = settings or Settings(), run_io or RunIO()
    check_run_id(run_id)
    hosts = [h for h in cluster.hosts if node is None or h.name == node]
    if not hosts:
        raise LauncherError(
            f"{cluster.source}: no host named {node!r} (hosts: {', '.join(h.name for h in cluster.hosts)})"
        )
    nodes = connect_or_fail(cluster, hosts, settings, run_io.err)
    try:
        run_id = run_id or chosen_run(cluster, nodes, settings, run_io.err)
    except BaseException:
        close_all(nodes.values())
        raise
    offsets, colour, width = rank_offsets(cluster), supports_colour(run_io.out), max(len(h.name) for h in hosts)
    sink, failures = _RankFilter(run_io.out, rank, threading.Lock()), list[str]()
    try:
        threads = [
            threading.Thread(
                target=_one,
                args=(
                    nodes[h.name],
                    h,
                    NodeLog(h.name, i, width, offsets[h.name], colour),
                    sink,
                    run_id,
                    follow,
                    failures,
                ),
                daemon=True,
            )
            for i, h in enumerate(hosts)
        ]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    finally:
        close_all(nodes.values())
    for line in failures:
        run_io.err.write(line + "\n")
    if follow and not failures and run_id is not None:  # the end followed to: how the run ended, in one line
        from launcher.report.states import ended_line
        from launcher.run.control import status

        states = status(replace(cluster, hosts=tuple(hosts)), run_id, settings, run_io)
        if not any(s.state == "running" for s in states):
            run_io.err.write(ended_line(run_id, states) + "\n")
    return 1 if failures else 0


def _one(
    node: Node, host: Host, log: NodeLog, sink: _RankFilter, run_id: str | None, follow: bool, failures: list[str]
) -> None:
    """One node's log through its agent's `logs` action, into `sink`; what failed, into `failures`."""
    channel = None
    try:
        channel = node.open_channel(host_command(host))
        channel.send(agent_input({"action": "logs", "node": host.name, "run_id": run_id, "follow": follow}))
        channel.close_stdin()
        err = bytearray()
        while not channel.finished:
            out, e = channel.read()
            err += e
            if out:
                log.feed(out, sink)
            elif channel.drained:
                break
            else:
                channel.wait_readable(0.5)
    except Exception as exc:  # a channel that fails is this node's failure, never a silent exit 0
        failures.append(f"{host.name}: {classify(node.target, exc)}")
        return
    finally:
        log.close(sink)
        if channel is not None:  # its select() pipe too, now rather than when it is collected
            channel.close()
    if channel.exit_code() != 0:
        failures.append(f"{host.name}: {_agent_error(Result(channel.exit_code(), b'', bytes(err)))}")


class _RankFilter:
    """A text sink that keeps only one global rank's lines (when a rank is asked for), whole lines at a time."""

    def __init__(self, out: IO[str], rank: int | None, lock: threading.Lock):
        self.out, self.rank, self.lock = out, rank, lock

    def write(self, text: str) -> None:
        if self.rank is not None:
            tag = f" r{self.rank} "
            text = "".join(line + "\n" for line in text.splitlines() if tag in line.split("|", 1)[0] + " ")
        if text:
            with self.lock:
                self.out.write(text)
                self.out.flush()
