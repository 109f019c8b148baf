"""Which node passes the tree's stream to which (`sync.relay`): the pure plan, from the nodes' answers.

Nodes that need the same entries (most often all of them: the first sync, or one file edited) form a group. The
controller sends the stream to the group's first node only; it passes it on to up to SYNC_RELAY_FANOUT nodes, each of
those to as many more, over the cluster's own network (plain TCP, a random token a connection: the nodes already
reach each other for torchrun). The controller's link carries one copy a group, and a node hears from at most
log4(N) hops away. The node side is launcher/node/sync/syncrelay.py.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from launcher.limits import SYNC_RELAY_FANOUT, SYNC_RELAY_MIN_NODES, SYNC_RELAY_MIN_SAVED

RelayChoice = bool | None
"""`sync.relay`: True always (two nodes or more), False never, None (`auto`): from SYNC_RELAY_MIN_NODES nodes and
SYNC_RELAY_MIN_SAVED bytes."""


def least_group(choice: RelayChoice) -> int | None:
    """The fewest nodes with the same changes that a relay serves; None: no relay."""
    if choice is False:
        return None
    return 2 if choice is True else SYNC_RELAY_MIN_NODES


def asks_relay(choice: RelayChoice, nodes: int) -> bool:
    """Whether the nodes are asked to listen for a relay at all (there are enough of them for a group)."""
    least = least_group(choice)
    return least is not None and nodes >= least


def relay_places(
    todos: Mapping[str, Sequence[tuple[str, int]]],
    addrs: Mapping[str, str],
    choice: RelayChoice,
    fanout: int = SYNC_RELAY_FANOUT,
) -> dict[str, dict[str, Any]]:
    """Each node's first line after its manifest: `{"relay_to": [peer, ...]}` for a node the controller sends to
    (its peers, each with theirs; their ports still None: `with_ports`), `{"relay_from": {"node", "token"}}` for one
    that gets the stream from another (it then listens, and says where).

    `todos`: each node's changed entries (path, bytes), in the order the controller would send them (nodes in
    inventory order); `addrs`: how the other nodes reach it (`Host.addr`). `auto` relays a group of at least
    SYNC_RELAY_MIN_NODES that saves the controller SYNC_RELAY_MIN_SAVED bytes or more; `true` any group of two.
    """
    least = least_group(choice)
    groups: dict[tuple[tuple[str, int], ...], list[str]] = {}
    for node, todo in todos.items():
        groups.setdefault(tuple(todo), []).append(node)
    places: dict[str, dict[str, Any]] = {}
    for todo, members in groups.items():
        saved = (len(members) - 1) * sum(size for _, size in todo)
        if least is None or not todo or len(members) < least or (choice is None and saved < SYNC_RELAY_MIN_SAVED):
            places.update({n: {"relay_to": []} for n in members})
            continue
        tokens = {n: secrets.token_hex(16) for n in members[1:]}
        places[members[0]] = {"relay_to": _peers(0, members, addrs, tokens, fanout, places)}
    return places


def _peers(
    index: int,
    order: Sequence[str],
    addrs: Mapping[str, str],
    tokens: Mapping[str, str],
    fanout: int,
    places: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """The peers of the node at `index` of `order` (a tree `fanout` wide, in order), each with its own; each
    peer's place (where its stream comes from) set in `places`."""
    found = []
    for child in range(index * fanout + 1, min(index * fanout + fanout + 1, len(order))):
        name = order[child]
        places[name] = {"relay_from": {"node": order[index], "token": tokens[name]}}
        found.append(
            {
                "node": name,
                "addr": addrs[name],
                "port": None,
                "token": tokens[name],
                "relay_to": _peers(child, order, addrs, tokens, fanout, places),
            }
        )
    return found


def with_ports(place: Mapping[str, Any], ports: Mapping[str, int | None]) -> dict[str, Any]:
    """A sender's place with the port each of its peers (and theirs) listens on (None: it said none)."""
    return {
        "relay_to": [
            {**peer, "port": ports.get(peer["node"]), **with_ports(peer, ports)} for peer in place.get("relay_to", [])
        ]
    }


def relayed_from(place: Mapping[str, Any] | None) -> str | None:
    """The node a place's stream comes from; None: the controller."""
    return None if not place or "relay_from" not in place else str(place["relay_from"]["node"])
