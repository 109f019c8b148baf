"""`inv sync`'s relay on a node (stdlib only, Python 3.8+): the tree's stream goes from the controller to one node
of a group, and from there node to node over the cluster's own network, so the controller's link carries it once.

Once every node asked to take part has answered its manifest, the controller tells each its place
(launcher/sync/relay.py), the line after the manifest:
- `{"relay_from": {"node": NAME, "token": T}}`: the stream comes from NAME. This node listens on a port the kernel
  chooses (`Listener`) and says which (`{"relay_port": P}`); NAME connects and first sends
  `{"token": T, "relay_to": [peer, ...]}`; a connection without the token is dropped;
- `{"relay_to": [peer, ...]}` (sent once the relayed nodes listen): the stream follows on stdin; this node passes
  it on to each peer.
A peer is `{"node", "addr", "port", "token", "relay_to"}`. What a node reads of the stream it passes on as it is
(`Tee`), before it writes it to its own disk. A peer that cannot be reached, or stops taking data for the stall
bound, is dropped: its sync fails, and the controller sends to it straight (its own session says why).
"""

import hmac
import json
import socket
import time

from launcher.node.common.bounds import RELAY_FIRST_LINE_MAX
from launcher.node.wire import Refused, timing


class Listener:
    """A listening socket on every address of the node, on a port the kernel chose."""

    def __init__(self):
        try:
            self.server = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        except (OSError, ValueError):  # no IPv6 here (a kernel or container without it)
            self.server = socket.create_server(("", 0))
        self.port = self.server.getsockname()[1]

    def accept(self, parent, token, stall_s):
        """The stream from `parent`, once it connects with `token`: (reader, socket, its peers)."""
        wait = timing("relay_wait_s")
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Refused(
                    "the stream relayed through %s did not come in %g s (can the nodes reach each other? "
                    "sync.relay: false keeps it to SSH)" % (parent, wait)
                )
            self.server.settimeout(left)
            try:
                conn, _ = self.server.accept()
            except socket.timeout:  # noqa: UP041  (not TimeoutError before Python 3.10, and nodes run 3.8)
                continue
            conn.settimeout(max(left, timing("relay_connect_s")))  # its first line: a stranger holds us no longer
            reader = conn.makefile("rb")
            try:
                first = json.loads(reader.readline(RELAY_FIRST_LINE_MAX).decode("utf-8"))
                if not (isinstance(first, dict) and hmac.compare_digest(str(first.get("token", "")), token)):
                    raise ValueError("not our relay")
            except (OSError, ValueError):
                reader.close()
                conn.close()
                continue
            conn.settimeout(stall_s)
            self.close()
            return reader, conn, first.get("relay_to") or []

    def close(self):
        self.server.close()


def connect(peers, stall_s):
    """A connection to each peer that answers, its first line sent; [(name, socket)], and [(name, why)] for the
    others. All at once: a peer whose address swallows the connection costs its wait once, not once a peer."""
    import threading

    found = [None] * len(peers)

    def one(index, peer):
        try:
            sock = socket.create_connection((peer["addr"], int(peer["port"])), timeout=timing("relay_connect_s"))
            sock.settimeout(stall_s)
            sock.sendall((json.dumps({"token": peer["token"], "relay_to": peer.get("relay_to") or []}) + "\n").encode())
        except (OSError, TypeError, ValueError) as exc:  # a port of None: the peer said none
            found[index] = (peer["node"], None, str(exc) or type(exc).__name__)
            return
        found[index] = (peer["node"], sock, None)

    threads = [threading.Thread(target=one, args=(i, p), daemon=True) for i, p in enumerate(peers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    connected = [(name, sock) for name, sock, _ in found if sock is not None]
    failed = [(name, why) for name, sock, why in found if sock is None]
    return connected, failed


class Tee:
    """The stream's reader, passing on to the peers every byte read (in chunks of `relay_chunk`)."""

    def __init__(self, source, peers):
        self.source, self.peers = source, list(peers)
        self.pending = bytearray()
        self.chunk = int(timing("relay_chunk"))
        self.dropped = []  # (name, why)

    def readline(self):
        return self.keep(self.source.readline())

    def read(self, size):
        return self.keep(self.source.read(size))

    def keep(self, data):
        if self.peers and data:
            if len(data) >= self.chunk and not self.pending:
                self.send(data)
            else:
                self.pending += data
                if len(self.pending) >= self.chunk:
                    self.flush()
        return data

    def flush(self):
        if self.pending:
            self.send(self.pending)
            self.pending = bytearray()

    def send(self, data):
        for peer in list(self.peers):
            try:
                peer[1].sendall(data)
            except OSError as exc:  # unreachable, or no data taken for the stall bound: it fails, the rest go on
                self.drop(peer, str(exc) or type(exc).__name__)

    def drop(self, peer, why):
        self.peers.remove(peer)
        self.dropped.append((peer[0], why))
        peer[1].close()

    def close(self, whole):
        """The end: what is pending goes out when the stream was read whole; each peer sees the end of its stream
        (cut short where this node failed, so that the peer fails too)."""
        if whole:
            self.flush()
        for peer in list(self.peers):
            try:
                peer[1].shutdown(socket.SHUT_WR)
            except OSError:
                pass
            peer[1].close()
        self.peers = []
