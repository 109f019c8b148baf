"""Code sync: make every node's workdir hold the controller's project tree; only changed files travel.

The local side lists the tree (in a git work tree `git ls-files --cached --others --exclude-standard`, otherwise a
walk that honours every `.gitignore`), less the inventory's `sync.exclude` patterns (gitignore syntax). Each node
runs `launcher/node/sync/syncd.py` over its one SSH connection, all nodes at once: it answers what it has of those paths
(size, mtime, mode, link target), the controller sends only the entries that differ (rsync's quick check: size and
mtime), in one stream on the same session, and the node renames them into place once all have arrived.
Nothing on a node is ever deleted; names that would leave the destination are refused on both sides. The
inventory's env files and any file named `.env` never travel (they hold secrets; their values reach the nodes with
the launch), nor does anything reached through a symlinked folder of the tree (it lies outside it). One node's
sync: launcher.sync.nodepush.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from launcher.config.model import Cluster, Host, SyncSpec
from launcher.errors import NodeFailure, SyncFailed
from launcher.limits import SYNC_REPLY_TIMEOUT as REPLY_TIMEOUT
from launcher.parallel import parallel
from launcher.settings import DEFAULT_FANOUT, DEFAULT_SILENCE_TIMEOUT, SshSettings
from launcher.sync.nodepush import Begun, begin_sync, finish_sync, place_line, sync_node
from launcher.sync.outcomes import NodeSync, outcome_lines, summary
from launcher.sync.relay import asks_relay, relay_places, relayed_from, with_ports
from launcher.sync.stream import Contents
from launcher.sync.tree import Tree, describe_tree, project_tree
from launcher.transport.connections import Node, close_all, connect_all

# --- every node -----------------------------------------------------------------------------------------------


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
        lambda h: begin_sync(
            nodes[h.name], h, spec.dest or h.workdir, tree, spec.dest is not None, stall_timeout, relay
        ),
        hosts,
        DEFAULT_FANOUT,
    )
    outcomes: dict[str, NodeSync | NodeFailure] = {}
    begun: dict[str, Begun] = {}
    for host, result in zip(hosts, started, strict=True):
        if isinstance(result, Begun):
            begun[host.name] = result
        else:
            outcomes[host.name] = _failure(host, result)
    places = _places(begun, by_name, spec, relay)
    contents = Contents(tree.root)
    retry = []
    for name, ended in _finish_all(begun, tree, contents, places).items():
        outcomes[name] = _failure(by_name[name], ended)
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


def _places(
    begun: Mapping[str, Begun], by_name: Mapping[str, Host], spec: SyncSpec, relay: bool
) -> dict[str, dict[str, Any]]:
    """Each begun node's place in the relay (none without one): whom it passes the stream on to, and for a relayed
    node where its stream comes from and the port it listens on; one that waits for another sync into its
    destination passes nothing on."""
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
    return places


def _finish_all(
    begun: Mapping[str, Begun], tree: Tree, contents: Contents, places: Mapping[str, dict[str, Any]]
) -> dict[str, NodeSync | NodeFailure | BaseException | None]:
    """Every begun node's end (a NodeSync, a NodeFailure, or what its thread raised), in the order they were started."""
    # Those that send first, then the relayed (they wait for the senders), then any waiting for another sync into
    # its destination (which may be one of these): no thread waits on one that has none yet.
    order = sorted(begun, key=lambda n: (begun[n].waiting, relayed_from(places.get(n)) is not None))
    senders = {n for n, place in places.items() if place.get("relay_to")}
    done, lock = threading.Event(), threading.Lock()  # done: every relay's stream has left here (or failed)

    def finish(name: str) -> NodeSync | NodeFailure:
        try:
            return finish_sync(begun[name], tree, contents, places.get(name), done)
        finally:
            with lock:
                senders.discard(name)
                if not senders:
                    done.set()

    if not senders:
        done.set()
    return dict(zip(order, parallel(finish, order, DEFAULT_FANOUT), strict=True))


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


def _listening(relayed: Mapping[str, Begun], places: Mapping[str, dict[str, Any]]) -> dict[str, int | None]:
    """Tell each relayed node where its stream comes from; the port each then listens on (None: it said none, and
    its sync fails, to be sent straight from here)."""
    for name, begun in relayed.items():
        begun.session.channel.send(place_line(places[name]))
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
