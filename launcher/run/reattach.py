"""Reaching a node's run again over a new session (the node side is launcher/node/agent/attach.py): after its connection
dropped, fell silent (a roaming network, a NAT that forgot the flow) or its console was let go, and for `attach` from
another terminal. The run lives on the node the whole time; a new session becomes its console and gets the log from
the offset this launcher has read, so no line is lost and none comes twice.

A node whose connection is gone gets a new one (the same ssh config, host keys and bounds); the replaced connections
are closed with the run's.
"""

from __future__ import annotations

import getpass
import os
import secrets
import socket
import threading
from typing import Any

from launcher.config.model import Cluster, Host
from launcher.errors import NodeFailure
from launcher.limits import ATTACH_TAIL_BYTES, NODE_TIMING
from launcher.plan.request import Owner
from launcher.settings import SshSettings
from launcher.transport.channel import Channel
from launcher.transport.connections import Node, classify, connect
from launcher.transport.program import host_command, program_input


def new_owner() -> Owner:
    """This launcher, as the run's nodes and `status` know it: a fresh token, and user@host (pid)."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container's)
        user = str(os.getuid())
    return Owner(secrets.token_hex(8), f"{user}@{socket.gethostname()} (pid {os.getpid()})")


def attach_request(run_id: str, node: str, owner: Owner, offset: int | None, take_over: bool) -> dict[str, Any]:
    """What a node's agent is asked to attach this launcher to its part of a run (launcher/node/agent/attach.py)."""
    return {
        "action": "attach",
        "run_id": run_id,
        "node": node,
        "owner": owner.token,
        "who": owner.who,
        "take_over": take_over,
        "offset": offset,
        "tail_bytes": ATTACH_TAIL_BYTES,
        "timing": NODE_TIMING,
    }


class Reconnector:
    """New sessions to the nodes of one run; `nodes` is the run's own map of open connections (updated in place)."""

    def __init__(
        self, cluster: Cluster, nodes: dict[str, Node], ssh: SshSettings, agent_source: str, run_id: str, owner: Owner
    ):
        self.cluster, self.nodes, self.ssh = cluster, nodes, ssh
        self.agent_source, self.run_id, self.owner = agent_source, run_id, owner
        self.replaced: list[Node] = []
        self._lock = threading.Lock()

    def reach(self, host: Host, fresh: bool = False) -> Node | str:
        """The node's connection: the open one, or (`fresh`, or it is gone) a new one in its place; why not."""
        node = self.nodes.get(host.name)
        if node is not None and node.alive and not fresh:
            return node
        found = connect(host, self.cluster, self.ssh)
        if isinstance(found, NodeFailure):
            return found.detail
        with self._lock:
            old = self.nodes.get(host.name)
            self.nodes[host.name] = found
            if old is not None:
                self.replaced.append(old)
        return found

    def open(self, host: Host, fresh: bool, offset: int | None, take_over: bool = False) -> Channel | str:
        """An attach session on the node, its request sent (the log from `offset`); why not, in a few words."""
        node = self.reach(host, fresh)
        if isinstance(node, str):
            return node
        try:
            channel = node.open_channel(host_command(host))
        except Exception as exc:  # a connection that broke again, an sshd that does not start the command
            return classify(node.target, exc).detail
        request = attach_request(self.run_id, host.name, self.owner, offset, take_over)
        if not channel.send(program_input(self.agent_source, request), timeout=self.ssh.connect_timeout):
            channel.close()
            return "the new session took no input"
        return channel

    def close(self) -> None:
        """Close the connections that were replaced (each on a thread of its own: a half-dead one may linger)."""
        with self._lock:
            replaced, self.replaced = self.replaced, []
        for node in replaced:
            threading.Thread(target=node.close, daemon=True, name=f"close-{node.name}").start()
