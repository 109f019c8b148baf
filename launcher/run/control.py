"""A run after its start, from any terminal: `inv stop`, `inv status` and `inv logs` ask every node's agent (a
short session each, all nodes at once) about the run the inventory chooses (`launcher.plan.runchoice`)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from launcher.config.model import Cluster, Host
from launcher.errors import LauncherError, NodeFailure
from launcher.limits import ACTION_MARGIN
from launcher.node.wire import Event
from launcher.paths import hint
from launcher.plan import runchoice
from launcher.plan.request import inventory_id
from launcher.run.actions import agent_action, agent_input, check_run_id
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
    cluster: Cluster, nodes: dict[str, Node], run_id: str | None, settings: Settings, err: IO[str], force: bool = False
) -> tuple[str, list[str]]:
    """The run `attach` takes (`run_id`, or as `status` chooses) and the nodes it was started on, as they list it.
    A run whose launcher its nodes hear now (another terminal, machine or process) is taken only with `force`."""
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
    live = {(run.get("launcher") or {}).get("owner") or "a launcher" for run in listed if _followed_now(run)}
    if live:
        owner = ", ".join(sorted(live))
        if not force:
            command = hint(f"attach --hosts {cluster.source} --run {run_id} --force")
            raise LauncherError(
                f"run {run_id} is followed now by another launcher ({owner}), which its nodes hear: `{command}` "
                "takes it over, and that launcher lets go (exit code 129)"
            )
        err.write(f"taking run {run_id} over from the launcher that follows it now ({owner}): it lets go\n")
    return run_id, [h.name for h in cluster.hosts if h.name in names]


def _followed_now(run: dict[str, Any]) -> bool:
    """A running attached run whose launcher its node hears now (its console there, heard within the away mark)."""
    return run.get("state") == "running" and bool((run.get("launcher") or {}).get("present"))


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
        detail=_stopped_why(run),
    )


def _stopped_why(answer: dict[str, Any]) -> str:
    """Why a node stopped its part itself (a detached run's non-finite loss, `--on-nonfinite stop`), or who stopped
    it (`stopped by the user (inv stop from ana@laptop)`); "" otherwise."""
    why, by = answer.get("stopped_why"), answer.get("stopped_by")
    if isinstance(why, str) and why:
        return f"stopped its part itself (--on-nonfinite stop): {why}"
    return f"stopped by {by}" if isinstance(by, str) and by else ""


def _by(sweep: bool) -> str:
    """Who a stop from here is, as the nodes keep it for `status`: `the user (ana@laptop (pid 812), from another
    terminal)`."""
    from launcher.run.reattach import new_owner

    return "its launcher (between attempts)" if sweep else f"the user ({new_owner().who}, from another terminal)"


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
                detail=_stopped_why(answer),
            )
        )
    return states


def _join(threads: list[threading.Thread], deadline: float) -> None:
    for t in threads:
        while t.is_alive() and time.monotonic() < deadline:
            t.join(0.2)  # in short steps: Ctrl-C is heard at once


@dataclass
class _Exchange:
    """One question to every node at once, and what each is then told (`_ask_then_tell`)."""

    firsts: dict[str, Result | NodeFailure] = field(default_factory=dict)
    results: dict[str, Result | NodeFailure] = field(default_factory=dict)
    answered: threading.Condition = field(default_factory=threading.Condition)
    told: threading.Event = field(default_factory=threading.Event)
    message: bytes = b""
    """What each node hears once every node answered (before that: nothing to act on)."""


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
    exchange = _Exchange(message=_message(None))  # what each node hears when the choice fails: nothing to act on
    threads = [
        threading.Thread(
            target=_ask_one, args=(nodes[h.name], h, request, timeout, exchange), daemon=True, name=f"ask-{h.name}"
        )
        for h in hosts
    ]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + timeout + max(n.timeout for n in nodes.values())
        with exchange.answered:
            while len(exchange.firsts) < len(hosts) and time.monotonic() < deadline:
                exchange.answered.wait(0.2)
        missing = {h.name: _no_answer(h.name, timeout) for h in hosts if h.name not in exchange.firsts}
        exchange.message = _message(decide({**missing, **exchange.firsts}))
    finally:
        exchange.told.set()  # a failed choice too: every node hears `none` and its session ends (Ctrl-C: no waiting)
    _join(threads, time.monotonic() + timeout + 5)
    found = exchange.results, exchange.firsts
    return {h.name: found[0].get(h.name) or found[1].get(h.name) or _no_answer(h.name, timeout) for h in hosts}


def _ask_one(node: Node, host: Host, request: dict[str, Any], timeout: float, exchange: _Exchange) -> None:
    """One node's part of `_ask_then_tell`: its first answer, then, once told, the rest of its output."""
    channel = None
    out, err = bytearray(), bytearray()
    try:
        channel = node.open_channel(host_command(host))
        channel.send(agent_input({**request, "node": host.name}))
        channel.read_line(out, err, time.monotonic() + timeout)
        first: Result | NodeFailure = Result(channel.exit_code() if channel.finished else 0, bytes(out), bytes(err))
    except Exception as exc:
        first = classify(node.target, exc)
    with exchange.answered:
        exchange.firsts[host.name] = first
        exchange.answered.notify_all()
    if isinstance(first, NodeFailure) or channel is None or channel.finished:
        exchange.results[host.name] = first  # it ended on its own (a refused request): nothing more to tell it
        if channel is not None:
            channel.close()
        return
    try:
        exchange.told.wait()
        channel.send(exchange.message)
        channel.close_stdin()
        rest = channel.collect(timeout)
        exchange.results[host.name] = Result(
            rest.exit_code, bytes(out) + rest.stdout, bytes(err) + rest.stderr, rest.timed_out
        )
    except Exception as exc:
        exchange.results[host.name] = classify(node.target, exc)
    finally:
        channel.close()


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
        {"action": "stop", "run_id": run_id, "grace": settings.run.grace, "kill_supervisor": sweep, "by": _by(sweep)},
        settings,
        (run_io or RunIO()).err,
    )


def status(
    cluster: Cluster, run_id: str | None = None, settings: Settings | None = None, run_io: RunIO | None = None
) -> list[NodeState]:
    """Each node's view of a run (by default the one of this inventory that runs, else its newest)."""
    return _states(cluster, {"action": "status", "run_id": run_id}, settings or Settings(), (run_io or RunIO()).err)
