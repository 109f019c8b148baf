"""One node's sync: its syncd started over a session of its connection, its manifest read, its changes sent (or its
place in the relay, where another node sends them), its end read; every way it fails said as the node's failure."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.config.model import Host
from launcher.errors import LauncherError, NodeFailure
from launcher.limits import SYNC_LOCK_WAIT as LOCK_WAIT
from launcher.limits import SYNC_REPLY_TIMEOUT as REPLY_TIMEOUT
from launcher.limits import SYNC_TIMING
from launcher.settings import DEFAULT_SILENCE_TIMEOUT
from launcher.sync.outcomes import NodeSync
from launcher.sync.relay import relayed_from
from launcher.sync.stream import Contents, Gone, SyncStream
from launcher.sync.tree import Entry, Tree, changed, size_text
from launcher.transport.connections import Node
from launcher.transport.failures import classify
from launcher.transport.program import host_command, node_program, program_input

SYNCD_SOURCE = node_program("sync.syncd")
"""The node side: a stdlib-only program, sent to each node on its stdin."""


class SyncFailure(NodeFailure):
    """A node's sync that failed, with the bytes that had crossed the wire to it (discarded there)."""

    def __init__(self, failure: NodeFailure, crossed: int):
        detail = failure.detail
        if crossed:
            detail += f" ({size_text(crossed)} had crossed the wire to it and was discarded there)"
        super().__init__(failure.host, failure.kind, detail, failure.fix)
        self.crossed = crossed


@dataclass
class Begun:
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
    begun = begin_sync(node, host, dest, tree, home_ok, stall_timeout, relay=False)
    if isinstance(begun, NodeFailure):
        return begun
    return finish_sync(begun, tree, contents or Contents(tree.root), None, None)


def begin_sync(
    node: Node, host: Host, dest: str, tree: Tree, home_ok: bool, stall_timeout: float, relay: bool
) -> Begun | NodeFailure:
    """Start syncd and read its manifest (with `relay`, it then takes its place in the relay: launcher.sync.relay).
    `stall_timeout` bounds every wait on data in flight, the relay's between nodes too."""
    try:
        session = SyncStream(node.open_channel(host_command(host)), stall_timeout)
    except Exception as exc:
        return classify(node.target, exc)
    t0 = time.monotonic()

    def begin() -> Begun | NodeFailure:
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
        begun = Begun(session, node, {}, [], t0)
        first = session.answer(REPLY_TIMEOUT + LOCK_WAIT)
        if first is not None and "waiting" in first:
            begun.waiting = True  # its manifest comes once the other sync into its destination has ended
            return begun
        return _manifest(begun, tree, first)

    outcome = _guarded(node, begin)
    if isinstance(outcome, NodeFailure):
        session.channel.close()
    return outcome


def _manifest(begun: Begun, tree: Tree, first: dict[str, Any] | None) -> Begun | NodeFailure:
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


def finish_sync(
    begun: Begun, tree: Tree, contents: Contents, place: dict[str, Any] | None, relay_done: threading.Event | None
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
                    session.send(place_line(place))
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


def place_line(place: Mapping[str, Any]) -> bytes:
    """A relay place as the line syncd reads after its manifest."""
    return (json.dumps(place) + "\n").encode()
