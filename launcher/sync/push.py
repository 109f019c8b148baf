"""Code sync: make every node's workdir hold the controller's project tree; only changed files travel.

The local side lists the tree (in a git work tree `git ls-files --cached --others --exclude-standard`, otherwise a
walk that honours every `.gitignore`), less the inventory's `sync.exclude` patterns (gitignore syntax). Each node
runs `launcher/node/sync/syncd.py` over its one SSH connection, all nodes at once: it answers what it has of those paths
(size, mtime, mode, link target), the controller sends only the entries that differ (rsync's quick check: size and
mtime), in one stream on the same session, and the node renames them into place once all have arrived.
Nothing on a node is ever deleted; names that would leave the destination are refused on both sides. The
inventory's env files and any file named `.env` never travel (they hold secrets; their values reach the nodes with
the launch), nor does anything reached through a symlinked folder of the tree (it lies outside it).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from launcher.config.model import Cluster, Host, SyncSpec
from launcher.errors import LauncherError, NodeFailure, SyncFailed
from launcher.limits import SYNC_LOCK_WAIT as LOCK_WAIT
from launcher.limits import SYNC_REPLY_TIMEOUT as REPLY_TIMEOUT
from launcher.limits import SYNC_TIMING
from launcher.parallel import parallel
from launcher.settings import DEFAULT_FANOUT, DEFAULT_SILENCE_TIMEOUT, SshSettings
from launcher.sync.outcomes import NodeSync, outcome_lines, summary
from launcher.sync.relay import asks_relay, relay_places, relayed_from, with_ports
from launcher.sync.stream import Contents, Gone, SyncStream
from launcher.sync.tree import Entry, Tree, changed, describe_tree, project_tree, size_text
from launcher.transport.connections import Node, close_all, connect_all
from launcher.transport.failures import classify
from launcher.transport.program import host_command, node_program, program_input

SYNCD_SOURCE = node_program("sync.syncd")
"""The node side: a stdlib-only program, sent to each node on its stdin."""


# --- one node -------------------------------------------------------------------------------------------------


class SyncFailure(NodeFailure):
    """A node's sync that failed, with the bytes that had crossed the wire to it (discarded there)."""

    def __init__(self, failure: NodeFailure, crossed: int):
        detail = failure.detail
        if crossed:
            detail += f" ({size_text(crossed)} had crossed the wire to it and was discarded there)"
        super().__init__(failure.host, failure.kind, detail, failure.fix)
        self.crossed = crossed


@dataclass
class _Begun:
    """A node whose syncd answered with its manifest: what it needs, on its open session."""

    session: SyncStream
    node: Node
    answer: dict[str, Any]
    todo: list[Entry]
    t0: float
    failed: NodeFailure | None = None
    """Its end, already known (a relayed node that could not listen)."""
    waiting: bool = False
    """It waits for another sync into its destination (a shared workdir): no manifest yet, and no relay for it."""


def sync_node(
    node: Node,
    host: Host,
    dest: str,
    tree: Tree,
    *,
    home_ok: bool = False,
    stall_timeout: float = DEFAULT_SILENCE_TIMEOUT,
    contents: Contents | None = None,
) -> NodeSync | NodeFailure:
    """Bring one node's `dest` up to date with `tree` over one session of its connection, straight from here.

    `contents`: the tree's small files as read for the other nodes of this sync (a node alone reads its own).

    `home_ok`: the user named the destination (sync.dest), so a home directory itself is allowed. A node that takes
    no data for `stall_timeout` seconds (its disk hung) fails its sync; one that fails part way says how much had
    crossed the wire (`SyncFailure`).
    """
    begun = _begin(node, host, dest, tree, home_ok, stall_timeout, relay=False)
    if isinstance(begun, NodeFailure):
        return begun
    return _finish(begun, tree, contents or Contents(tree.root), None, None)


def _begin(
    node: Node, host: Host, dest: str, tree: Tree, home_ok: bool, stall_timeout: float, relay: bool
) -> _Begun | NodeFailure:
    """Start syncd and read its manifest (with `relay`, it then takes its place in the relay: launcher.sync.relay).
    `stall_timeout` bounds every wait on data in flight, the relay's between nodes too."""
    try:
        session = SyncStream(node.open_channel(host_command(host)), stall_timeout)
    except Exception as exc:
        return classify(node.target, exc)
    t0 = time.monotonic()

    def begin() -> _Begun | NodeFailure:
        request = {
            "dest": dest,
            "paths": [e.path for e in tree.entries],
            "token": secrets.token_hex(4),
            "home_ok": home_ok,
            "lock_wait": LOCK_WAIT,
            "timing": SYNC_TIMING,
        }
        if relay:
            request.update(relay=True, relay_stall_s=stall_timeout)
        if not session.channel.send(program_input(SYNCD_SOURCE, request)):
            return NodeFailure(node.name, "sync", "the connection closed before the sync could start")
        begun = _Begun(session, node, {}, [], t0)
        first = session.answer(REPLY_TIMEOUT + LOCK_WAIT)
        if first is not None and "waiting" in first:
            begun.waiting = True  # its manifest comes once the other sync into its destination has ended
            return begun
        return _manifest(begun, tree, first)

    outcome = _guarded(node, begin)
    if isinstance(outcome, NodeFailure):
        session.channel.close()
    return outcome


def _manifest(begun: _Begun, tree: Tree, first: dict[str, Any] | None) -> _Begun | NodeFailure:
    """The node's manifest answer: what it needs (`begun` filled in), or why it cannot be synced."""
    node, session = begun.node, begun.session
    if first is None:
        return NodeFailure(
            node.name,
            "sync",
            f"the sync program did not start: {session.why()}",
            f"check `python` for {node.name} in the inventory",
        )
    if "error" in first:
        return NodeFailure(node.name, "sync", str(first["error"]))
    todo = changed(tree.entries, first["manifest"])
    need, free = sum(e.size for e in todo), first.get("free")
    if free is not None and need > free:
        return NodeFailure(
            node.name,
            "sync",
            f"no space: {size_text(need)} to write to {first['dest']}, {size_text(free)} free there",
            "free some space on the node",
        )
    begun.answer, begun.todo, begun.waiting = first, todo, False
    return begun


def _finish(
    begun: _Begun, tree: Tree, contents: Contents, place: dict[str, Any] | None, relay_done: threading.Event | None
) -> NodeSync | NodeFailure:
    """Send the node its changes (or its place in the relay, where another node sends them) and read its end."""
    session, node = begun.session, begun.node
    stall_timeout = session.stall_timeout

    def finish() -> NodeSync | NodeFailure:
        if begun.failed is not None:
            return begun.failed
        if begun.waiting:
            manifest = _manifest(begun, tree, session.answer(REPLY_TIMEOUT + LOCK_WAIT))
            if isinstance(manifest, NodeFailure):
                return manifest
        todo, dest = begun.todo, begun.answer["dest"]
        sent = 0
        if relayed_from(place) is None:
            try:
                if place is not None:
                    session.send(_line(place))
                for entry in todo:
                    sent += session.send_entry(contents, entry)
                session.send(b'{"end": true}\n', flush=True)
            except Gone:
                if session.stalled():
                    return NodeFailure(
                        node.name,
                        "sync",
                        f"the node took no data for {stall_timeout:g} s (a hung "
                        "disk?); what was sent is removed there when the sync program ends, so nothing "
                        "was changed",
                        f"check {node.name}'s disk under {dest}",
                    )
                # else the node stopped reading: its answer says why
            session.channel.close_stdin()
            last = session.answer(REPLY_TIMEOUT)
        else:
            last = _relayed_answer(session, relay_done, stall_timeout)
        if last is None or not last.get("ok"):
            why = str(last["error"]) if last and "error" in last else f"the sync ended early: {session.why()}"
            return NodeFailure(node.name, "sync", f"{why}; nothing was changed there" if last else why)
        return NodeSync(
            node.name,
            dest,
            len(todo),
            int(last.get("bytes", sent)),
            len(tree.entries) - len(todo),
            time.monotonic() - begun.t0,
            via=relayed_from(place),
            unreached=tuple((str(u.get("node")), str(u.get("why"))) for u in last.get("unreached") or ()),
            done_at=time.time(),
        )

    try:
        outcome = _guarded(node, finish)
    finally:
        session.channel.close()
    return SyncFailure(outcome, session.crossed) if isinstance(outcome, NodeFailure) else outcome


def _relayed_answer(
    session: SyncStream, relay_done: threading.Event | None, stall_timeout: float
) -> dict[str, Any] | None:
    """A relayed node's end: it comes once the stream has come through the relay, which takes as long as the
    controller's own sending and then some; bounded from the moment the controller has sent its last byte."""
    if relay_done is not None:
        while not relay_done.is_set():
            try:
                return session.answer(1.0)
            except TimeoutError:
                continue
    return session.answer(REPLY_TIMEOUT + stall_timeout)


def _guarded(node: Node, work: Callable[[], Any]) -> Any:
    """`work()`, each way it can fail said as the node's sync failure."""
    try:
        return work()
    except TimeoutError as exc:  # before OSError, of which it is one
        return NodeFailure(node.name, "sync", str(exc), "is the node overloaded, or its disk hung?")
    except LauncherError as exc:
        return NodeFailure(node.name, "sync", str(exc))
    except OSError as exc:
        return NodeFailure(node.name, "sync", f"cannot read {exc.filename or 'a file'} here: {exc.strerror or exc}")
    except Exception as exc:
        return classify(node.target, exc)


def sync_nodes(
    cluster: Cluster,
    nodes: Mapping[str, Node],
    tree: Tree,
    spec: SyncSpec,
    stall_timeout: float = DEFAULT_SILENCE_TIMEOUT,
) -> dict[str, NodeSync | NodeFailure]:
    """Sync every open node at once; one outcome per node, in inventory order.

    Nodes that need the same files get them through each other (`launcher.sync.relay`) where `sync.relay` says so:
    the controller sends one copy a group. A node the relay failed is sent its files straight from here after.
    """
    hosts = [h for h in cluster.hosts if h.name in nodes]
    if not hosts:
        return {}
    by_name = {h.name: h for h in hosts}
    relay = asks_relay(spec.relay, len(hosts))
    # Each node's sync is bounded (its answers, its sends); daemon threads: a Ctrl-C is not held by them.
    started = parallel(
        lambda h: _begin(nodes[h.name], h, spec.dest or h.workdir, tree, spec.dest is not None, stall_timeout, relay),
        hosts,
        DEFAULT_FANOUT,
    )
    outcomes: dict[str, NodeSync | NodeFailure] = {}
    begun: dict[str, _Begun] = {}
    for host, result in zip(hosts, started, strict=True):
        if isinstance(result, _Begun):
            begun[host.name] = result
        else:
            outcomes[host.name] = _failure(host, result)
    ready = {n: b for n, b in begun.items() if not b.waiting}
    places = (
        relay_places(
            {n: [(e.path, e.size) for e in b.todo] for n, b in ready.items()},
            {n: by_name[n].addr for n in ready},
            spec.relay,
        )
        if relay
        else {}
    )
    places.update({n: {"relay_to": []} for n, b in begun.items() if b.waiting and relay})
    if any(relayed_from(p) is not None for p in places.values()):
        ports = _listening({n: b for n, b in begun.items() if relayed_from(places[n]) is not None}, places)
        places = {n: place if relayed_from(place) else with_ports(place, ports) for n, place in places.items()}
    contents = Contents(tree.root)
    # Those that send first, then the relayed (they wait for the senders), then any waiting for another sync into
    # its destination (which may be one of these): no thread waits on one that has none yet.
    order = sorted(begun, key=lambda n: (begun[n].waiting, relayed_from(places.get(n)) is not None))
    senders = {n for n, place in places.items() if place.get("relay_to")}
    done, lock = threading.Event(), threading.Lock()  # done: every relay's stream has left here (or failed)

    def finish(name: str) -> NodeSync | NodeFailure:
        try:
            return _finish(begun[name], tree, contents, places.get(name), done)
        finally:
            with lock:
                senders.discard(name)
                if not senders:
                    done.set()

    if not senders:
        done.set()
    finished = parallel(finish, order, DEFAULT_FANOUT)
    retry = []
    for name, result in zip(order, finished, strict=True):
        outcomes[name] = _failure(by_name[name], result)
        if isinstance(outcomes[name], NodeFailure) and relayed_from(places.get(name)) is not None:
            retry.append(name)
    if retry:  # straight from here, as without a relay; the failure through the relay is kept to be said
        again = parallel(
            lambda n: sync_node(
                nodes[n],
                by_name[n],
                spec.dest or by_name[n].workdir,
                tree,
                home_ok=spec.dest is not None,
                stall_timeout=stall_timeout,
                contents=contents,
            ),
            retry,
            DEFAULT_FANOUT,
        )
        _retried(outcomes, dict(zip(retry, again, strict=True)), by_name, places)
    return {h.name: outcomes[h.name] for h in hosts}


def _retried(
    outcomes: dict[str, NodeSync | NodeFailure],
    again: Mapping[str, object],
    by_name: Mapping[str, Host],
    places: Mapping[str, dict[str, Any]],
) -> None:
    """The outcomes of the nodes the relay failed and that were sent their files straight from here after: one
    that succeeded says why the relay did not (the relaying node's word first, else its own failure's)."""
    unreached = {
        peer: f"{o.node} could not pass it on ({why}); can the nodes reach each other? sync.relay: "
        "false keeps it to SSH"
        for o in outcomes.values()
        if isinstance(o, NodeSync)
        for peer, why in o.unreached
    }
    for name, result in again.items():
        first = outcomes[name]
        outcome = _failure(by_name[name], result)
        if isinstance(outcome, NodeSync) and isinstance(first, NodeFailure):
            why = unreached.get(name, first.detail)
            outcome = dataclasses.replace(outcome, relay_failed=f"{relayed_from(places[name])}: {why}")
        outcomes[name] = outcome


def _listening(relayed: Mapping[str, _Begun], places: Mapping[str, dict[str, Any]]) -> dict[str, int | None]:
    """Tell each relayed node where its stream comes from; the port each then listens on (None: it said none, and
    its sync fails, to be sent straight from here)."""
    for name, begun in relayed.items():
        begun.session.channel.send(_line(places[name]))
    ports: dict[str, int | None] = {}
    for name, begun in relayed.items():  # they listen all at once: the waits overlap
        try:
            answer = begun.session.answer(REPLY_TIMEOUT)
        except TimeoutError:
            answer = None
        ports[name] = int(answer["relay_port"]) if answer and answer.get("relay_port") else None
        if ports[name] is None:
            why = str(answer["error"]) if answer and "error" in answer else "it did not say where it listens"
            begun.failed = NodeFailure(name, "sync", f"cannot listen for the relay: {why}")
    return ports


def _line(place: Mapping[str, Any]) -> bytes:
    """A relay place as the line syncd reads after its manifest."""
    return (json.dumps(place) + "\n").encode()


def _failure(host: Host, result: object) -> NodeSync | NodeFailure:
    """A node's outcome as it came, or its exception said as a sync failure."""
    return result if isinstance(result, NodeSync | NodeFailure) else NodeFailure(host.name, "sync", f"{result}")


# --- tasks ----------------------------------------------------------------------------------------------------


def sync_hosts(
    cluster: Cluster,
    *,
    ssh: SshSettings,
    out: IO[str],
    stall_timeout: float = DEFAULT_SILENCE_TIMEOUT,
    outputs: Sequence[Path] = (),
) -> int:
    """`inv sync`: every reachable node is synced (less `outputs`, the launcher's own log_dir); 1 when any node
    could not be (each says why in one line)."""
    spec, tree = project_tree(cluster, outputs)
    out.writelines(f"{line}\n" for line in describe_tree(cluster, tree, spec))
    t0 = time.monotonic()
    nodes, failures = connect_all(cluster, ssh=ssh)
    try:
        outcomes = sync_nodes(cluster, nodes, tree, spec, stall_timeout)
    finally:
        close_all(nodes.values())
    unreachable = {f.host: f for f in failures}
    ordered = {h.name: outcomes.get(h.name) or unreachable[h.name] for h in cluster.hosts}
    for line in outcome_lines(ordered):
        out.write(line + "\n")
    out.write(summary(ordered, time.monotonic() - t0) + "\n")
    return 1 if any(isinstance(o, NodeFailure) for o in ordered.values()) else 0


def before_launch(
    cluster: Cluster, err: IO[str], stall_timeout: float = DEFAULT_SILENCE_TIMEOUT, outputs: Sequence[Path] = ()
) -> Callable[[Cluster, dict[str, Node]], dict[str, float]]:
    """What a launch does first on its open connections with --sync (a start gate's `before`): sync the tree, less
    `outputs` (the launcher's own log_dir). It is listed now, before any node is contacted; a node that cannot be
    synced stops the launch. The step returns when each node's sync was done (wall clock: the run's page)."""
    spec, tree = project_tree(cluster, outputs)

    def step(cluster: Cluster, nodes: dict[str, Node]) -> dict[str, float]:
        for line in describe_tree(cluster, tree, spec):
            err.write(line + "\n")
        t0 = time.monotonic()
        outcomes = sync_nodes(cluster, nodes, tree, spec, stall_timeout)
        for line in outcome_lines({k: v for k, v in outcomes.items() if isinstance(v, NodeSync)}):
            err.write(line + "\n")
        err.write(summary(outcomes, time.monotonic() - t0) + "\n")
        failures = [o for o in outcomes.values() if isinstance(o, NodeFailure)]
        if failures:
            raise SyncFailed(failures, "; nothing was started")
        return {name: o.done_at for name, o in outcomes.items() if isinstance(o, NodeSync) and o.done_at}

    return step
