"""A run after its start, from any terminal: `inv stop`, `inv status` and `inv logs` ask every node's agent (a
short session each, all nodes at once) about the run the inventory chooses (`launcher.plan.runchoice`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from launcher.config.model import Cluster, Host
from launcher.errors import LauncherError, NodeFailure
from launcher.limits import ACTION_MARGIN
from launcher.node.wire import Event
from launcher.paths import hint
from launcher.plan import runchoice
from launcher.plan.launchplan import rank_offsets
from launcher.plan.request import inventory_id
from launcher.report.lines import NodeLog, supports_colour
from launcher.run.actions import agent_action, agent_input, check_run_id, connect_or_fail
from launcher.run.run_io import RunIO
from launcher.settings import Settings
from launcher.transport.channel import Result
from launcher.transport.connections import Node, classify, close_all, connect_all
from launcher.transport.program import host_command


@dataclass
class NodeState:
    """One node's answer to status or stop."""

    host: str
    state: str
    """running, exited, stopped, lost, none (no such run), unreachable or error."""
    run_id: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    found: int = 0
    left: int = 0
    detail: str = ""
    launcher: dict[str, Any] | None = None
    """An attached run's launcher as the node knows it: owner, present, away_since, stops_at (None: detached, or a
    run that is not running)."""


def chosen_run(cluster: Cluster, nodes: dict[str, Node], settings: Settings, err: IO[str]) -> str | None:
    """The run to act on when no --run is given: chosen from every reachable node's list of runs, for this
    inventory as a whole (`launcher.plan.runchoice`); says which on the console, or raises when it is ambiguous."""
    return _listed_runs(cluster, nodes, settings, err)[0]


def _listed_runs(
    cluster: Cluster, nodes: dict[str, Node], settings: Settings, err: IO[str]
) -> tuple[str | None, dict[str, Result | NodeFailure], dict[str, list[dict[str, Any]]]]:
    """`chosen_run`'s choice, with every node's `list` answer and the runs read from it (`status` answers from them)."""
    results = agent_action(nodes, cluster, {"action": "list"}, settings.run.action_timeout)
    listings = _listings(results)
    return _choice(cluster, listings, err), results, listings


def run_and_nodes(
    cluster: Cluster, nodes: dict[str, Node], run_id: str | None, settings: Settings, err: IO[str]
) -> tuple[str, list[str]]:
    """The run `attach` takes (`run_id`, or as `status` chooses) and the nodes it was started on, as they list it."""
    if run_id is None:
        run_id, _, listings = _listed_runs(cluster, nodes, settings, err)
    else:
        listings = _listings(agent_action(nodes, cluster, {"action": "list"}, settings.run.action_timeout))
    if run_id is None:
        raise LauncherError(f"no run on the nodes of {cluster.source} to attach to")
    listed = [run for runs in listings.values() for run in runs if run["run_id"] == run_id]
    if not listed:
        raise LauncherError(f"no run {run_id} on the nodes of {cluster.source} (`{hint('status')}` lists them)")
    recorded = next((run["nodes"] for run in listed if run.get("nodes")), None)
    names = recorded or [name for name, runs in listings.items() if any(r["run_id"] == run_id for r in runs)]
    missing = sorted(set(names) - {h.name for h in cluster.hosts})
    if missing:
        raise LauncherError(f"run {run_id} runs on {', '.join(missing)} too, which {cluster.source} does not list")
    return run_id, [h.name for h in cluster.hosts if h.name in names]


def _listings(results: dict[str, Result | NodeFailure]) -> dict[str, list[dict[str, Any]]]:
    """Each node's runs from its `list` answer (a node that failed or answered nothing readable has none)."""
    listings = {}
    for name, result in results.items():
        if isinstance(result, NodeFailure):
            continue
        try:
            runs = json.loads(result.stdout.decode().strip().splitlines()[-1])["runs"]
            if all(isinstance(r, dict) and isinstance(r["run_id"], str) and isinstance(r["state"], str) for r in runs):
                listings[name] = runs
        except (ValueError, IndexError, KeyError, TypeError):
            continue  # an unreadable answer: this node's own action will say what is wrong with it
    return listings


def _choice(cluster: Cluster, listings: dict[str, list[dict[str, Any]]], err: IO[str]) -> str | None:
    listed = {
        name: [
            runchoice.ListedRun(
                r["run_id"], r["state"], tuple(r["nodes"]) if r.get("nodes") else None, r.get("inventory")
            )
            for r in runs
        ]
        for name, runs in listings.items()
    }
    choice = runchoice.choose_run(cluster.source, [h.name for h in cluster.hosts], listed, inventory_id(cluster))
    if choice is None:
        return None  # no run at all on these nodes: each says so
    err.write(choice.why + "\n")
    return choice.run_id


def _listed_state(
    host: str, result: Result | NodeFailure, runs: list[dict[str, Any]] | None, run_id: str | None
) -> NodeState:
    """`status` of `run_id` as a node's listing says it (its runs carry their states, exit codes and times)."""
    if isinstance(result, NodeFailure):
        return NodeState(host, "unreachable", detail=str(result))
    if runs is None:
        return NodeState(host, "error", detail=_agent_error(result))
    run = next((r for r in runs if r["run_id"] == run_id), None)
    if run is None:
        return NodeState(host, "none", run_id)
    return NodeState(
        host,
        run["state"],
        run_id,
        run.get("exit_code"),
        run.get("started_at"),
        run.get("ended_at"),
        launcher=_launcher(run),
    )


def _launcher(answer: dict[str, Any]) -> dict[str, Any] | None:
    launcher = answer.get("launcher")
    return launcher if isinstance(launcher, dict) else None


def _states(cluster: Cluster, request: dict[str, Any], settings: Settings, err: IO[str]) -> list[NodeState]:
    check_run_id(request["run_id"])
    nodes, failures = connect_all(cluster, cluster.hosts, settings.ssh)
    listed: dict[str, NodeState] = {}
    try:
        if request["run_id"] is None and nodes and request["action"] == "stop":
            # One session a node: each lists its runs, hears the run chosen from all of them, and stops it.
            results = _ask_then_tell(
                nodes,
                cluster,
                {**request, "choose": True},
                lambda firsts: _choice(cluster, _listings(firsts), err),
                settings.run.action_timeout,
            )
        elif request["run_id"] is None and nodes:
            # `status`: the listings say all it would, no second session a node
            run_id, answers, listings = _listed_runs(cluster, nodes, settings, err)
            listed = {name: _listed_state(name, result, listings.get(name), run_id) for name, result in answers.items()}
            results = {}
        else:
            # The action's own limit follows the grace period, so a long grace never reads as a lost node.
            results = agent_action(nodes, cluster, request, settings.run.action_timeout)
    finally:
        close_all(nodes.values())
    states = []
    for host in cluster.hosts:
        failure = next((f for f in failures if f.host == host.name), None)
        if failure is not None:
            states.append(NodeState(host.name, "unreachable", detail=str(failure)))
            continue
        if host.name in listed:
            states.append(listed[host.name])
            continue
        result = results[host.name]
        if isinstance(result, NodeFailure):
            states.append(NodeState(host.name, "unreachable", detail=str(result)))
            continue
        try:
            answer = json.loads(result.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            states.append(NodeState(host.name, "error", detail=_agent_error(result)))
            continue
        states.append(
            NodeState(
                host.name,
                answer.get("state", "error"),
                answer.get("run_id"),
                answer.get("exit_code"),
                answer.get("started_at"),
                answer.get("ended_at"),
                answer.get("found", 0),
                answer.get("left", 0),
                launcher=_launcher(answer),
            )
        )
    return states


def _join(threads: list[threading.Thread], deadline: float) -> None:
    for t in threads:
        while t.is_alive() and time.monotonic() < deadline:
            t.join(0.2)  # in short steps: Ctrl-C is heard at once


def _ask_then_tell(
    nodes: dict[str, Node],
    cluster: Cluster,
    request: dict[str, Any],
    decide: Callable[[dict[str, Result | NodeFailure]], str | None],
    timeout: float,
) -> dict[str, Result | NodeFailure]:
    """An action in one session a node that needs every node's first answer to go on: each node's agent answers a
    line, `decide` reads all the answers (a node that could not answer is a NodeFailure) and gives the run id each
    node is then told (`{"run_id": ...}` on its stdin); each node's result holds its whole output. All sessions are
    open at once, as a launch's start gate's: the choice waits for the last node."""
    hosts = [h for h in cluster.hosts if h.name in nodes]
    firsts: dict[str, Result | NodeFailure] = {}
    results: dict[str, Result | NodeFailure] = {}
    answered, told = threading.Condition(), threading.Event()
    message = [_message(None)]  # what each node hears when the choice fails: nothing to act on

    def one(host: Host) -> None:
        node, channel = nodes[host.name], None
        out, err = bytearray(), bytearray()
        try:
            channel = node.open_channel(host_command(host))
            channel.send(agent_input({**request, "node": host.name}))
            channel.read_line(out, err, time.monotonic() + timeout)
            first: Result | NodeFailure = Result(channel.exit_code() if channel.finished else 0, bytes(out), bytes(err))
        except Exception as exc:
            first = classify(node.target, exc)
        with answered:
            firsts[host.name] = first
            answered.notify_all()
        if isinstance(first, NodeFailure) or channel is None or channel.finished:
            results[host.name] = first  # it ended on its own (a refused request): nothing more to tell it
            if channel is not None:
                channel.close()
            return
        try:
            told.wait()
            channel.send(message[0])
            channel.close_stdin()
            rest = channel.collect(timeout)
            results[host.name] = Result(
                rest.exit_code, bytes(out) + rest.stdout, bytes(err) + rest.stderr, rest.timed_out
            )
        except Exception as exc:
            results[host.name] = classify(node.target, exc)
        finally:
            channel.close()

    threads = [threading.Thread(target=one, args=(h,), daemon=True, name=f"ask-{h.name}") for h in hosts]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + timeout + max(n.timeout for n in nodes.values())
        with answered:
            while len(firsts) < len(hosts) and time.monotonic() < deadline:
                answered.wait(0.2)
        missing = {h.name: _no_answer(h.name, timeout) for h in hosts if h.name not in firsts}
        message[0] = _message(decide({**missing, **firsts}))
    finally:
        told.set()  # a failed choice too: every node hears `none` and its session ends (Ctrl-C: no waiting here)
    _join(threads, time.monotonic() + timeout + 5)
    return {h.name: results.get(h.name) or firsts.get(h.name) or _no_answer(h.name, timeout) for h in hosts}


def _no_answer(name: str, timeout: float) -> NodeFailure:
    return NodeFailure(name, "timeout", f"no answer within {timeout:g} s", "is the node overloaded, or its sshd stuck?")


def _message(run_id: str | None) -> bytes:
    return (json.dumps({"run_id": run_id}) + "\n").encode()


def _agent_error(result: Result) -> str:
    if result.timed_out is not None:
        return (
            f"no answer within {result.timed_out:g} s (the grace period plus {ACTION_MARGIN:g} s): the node is "
            "slow or hung, and what became of the run there is not known"
        )
    messages = []
    for line in result.stderr.decode("utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if isinstance(event, dict):
            if event.get("event", Event.ERROR) == Event.ERROR:  # other events (the logs action's `run`) are no error
                messages.append(str(event.get("message", line)))
        elif line.strip():
            messages.append(line.strip())
    return "; ".join(messages) or f"the agent exited with code {result.exit_code}"


def stop(
    cluster: Cluster,
    run_id: str | None = None,
    settings: Settings | None = None,
    sweep: bool = False,
    run_io: RunIO | None = None,
) -> list[NodeState]:
    """Stop a run (by default the one of this inventory that runs: `chosen_run`): TERM its processes, wait
    `grace`, KILL the rest. `sweep`: the run's own agent is no longer trusted (silent, stuck): kill it too."""
    settings = settings or Settings()
    return _states(
        cluster,
        {"action": "stop", "run_id": run_id, "grace": settings.run.grace, "kill_supervisor": sweep},
        settings,
        (run_io or RunIO()).err,
    )


def status(
    cluster: Cluster, run_id: str | None = None, settings: Settings | None = None, run_io: RunIO | None = None
) -> list[NodeState]:
    """Each node's view of a run (by default the one of this inventory that runs, else its newest)."""
    return _states(cluster, {"action": "status", "run_id": run_id}, settings or Settings(), (run_io or RunIO()).err)


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
    lock = threading.Lock()
    failures: list[str] = []

    def one(index: int, host: Host) -> None:
        log = NodeLog(host.name, index, width, offsets[host.name], colour)
        sink = _RankFilter(run_io.out, rank, lock)
        channel = None
        try:
            channel = nodes[host.name].open_channel(host_command(host))
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
            failures.append(f"{host.name}: {classify(nodes[host.name].target, exc)}")
            return
        finally:
            log.close(sink)
            if channel is not None:  # its select() pipe too, now rather than when it is collected
                channel.close()
        if channel.exit_code() != 0:
            failures.append(f"{host.name}: {_agent_error(Result(channel.exit_code(), b'', bytes(err)))}")

    try:
        threads = [threading.Thread(target=one, args=(i, h), daemon=True) for i, h in enumerate(hosts)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    finally:
        close_all(nodes.values())
    for line in failures:
        run_io.err.write(line + "\n")
    return 1 if failures else 0


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
