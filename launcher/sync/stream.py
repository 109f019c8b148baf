"""One node's sync stream on the controller: the tree's small files read once for every node (`Contents`), and the
controller's end of a node's syncd session (`SyncStream`: JSON lines in, headers and contents out), each file opened
without following a link (launcher/sync/push.py drives them, all nodes at once).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any

from launcher.errors import LauncherError
from launcher.limits import SYNC_SEND_CHUNK as SEND_CHUNK
from launcher.limits import SYNC_SHARED_BYTES as SHARED_BYTES
from launcher.sync.tree import Entry
from launcher.transport.channel import Channel

# --- the local tree's contents, read once for every node ------------------------------------------------------


class Contents:
    """The tree's files under SEND_CHUNK, each read once for all the nodes of a sync.

    One open, fstat, read and close a file instead of one a node: each of those system calls, in every node's
    sending thread, hands the GIL over and waits to get it back. And every node gets the same bytes of a file being
    edited during the sync. Larger files stream from disk node by node (a few calls a megabyte). What is kept is
    bounded (SHARED_BYTES, the least recently used dropped): a node that lags that far behind reads again.
    """

    def __init__(self, root: Path, budget: int = SHARED_BYTES):
        self.root = root
        self.budget = budget
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, tuple[int, int, bytes]] = OrderedDict()
        """path -> (mtime_ns, mode, content), the most recently used last."""
        self._kept_bytes = 0
        self._reading: dict[str, threading.Lock] = {}
        """A lock a path while one thread reads it: the others wait for its bytes instead of reading too."""

    def small(self, entry: Entry) -> tuple[int, int, bytes]:
        """(mtime_ns, mode, content) of a file listed under SEND_CHUNK."""
        with self._lock:
            gate = self._reading.setdefault(entry.path, threading.Lock())
        with gate:
            with self._lock:
                if entry.path in self._kept:
                    self._kept.move_to_end(entry.path)
                    return self._kept[entry.path]
            f, st = open_inside(self.root, entry)
            with f:
                content = f.read(st.st_size)
            if len(content) < st.st_size:
                raise LauncherError(f"{entry.path} shrank while it was being sent; run the sync again")
            found = (st.st_mtime_ns, st.st_mode & 0o777, content)
            with self._lock:
                self._kept[entry.path] = found
                self._kept_bytes += len(content)
                while self._kept_bytes > self.budget and len(self._kept) > 1:
                    self._kept_bytes -= len(self._kept.popitem(last=False)[1][2])
        return found


# --- a node's session ---------------------------------------------------------------------------------------


class Gone(Exception):
    """The node's side ended (or said why) while the controller was sending."""


class SyncStream:
    """The controller's end of one node's syncd session: JSON lines in, a header + content stream out."""

    def __init__(self, channel: Channel, stall_timeout: float):
        self.channel = channel
        self.stall_timeout = stall_timeout
        self.buffer = bytearray()
        self.errors = bytearray()
        self.pending = bytearray()
        self.crossed = 0
        """Bytes the node's channel took (headers and content): what a failure part way discards there."""

    def answer(self, timeout: float) -> dict[str, Any] | None:
        """The node's next JSON line; None when it ended without one (stderr says why)."""
        if not self.channel.read_line(self.buffer, self.errors, time.monotonic() + timeout):
            if self.channel.finished or self.channel.closed:
                return None
            raise TimeoutError(f"no answer from the node's sync program in {timeout:.0f}s")
        line, _, rest = bytes(self.buffer).partition(b"\n")
        self.buffer = bytearray(rest)
        try:
            answer = json.loads(line)
        except ValueError:
            return None
        return answer if isinstance(answer, dict) else None

    def send(self, data: bytes, flush: bool = False) -> None:
        """Queue `data`; what is queued goes out once it reaches SEND_CHUNK (a chunk that size goes as it is)."""
        if len(data) >= SEND_CHUNK and not self.pending:
            self._out(data)
            return
        self.pending += data
        if len(self.pending) >= SEND_CHUNK or flush:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self._out(bytes(self.pending))
            self.pending.clear()

    def _out(self, data: bytes) -> None:
        if not self.channel.send(data, timeout=self.stall_timeout):
            raise Gone
        self.crossed += len(data)

    def stalled(self) -> bool:
        """The send gave up while the node's session was still open: it stopped taking data."""
        return not (self.channel.finished or self.channel.closed)

    def send_entry(self, contents: Contents, entry: Entry) -> int:
        """Send one entry's header and content; returns its content bytes."""
        if entry.kind == "link":
            self.send(header(entry.path, "link", target=entry.target))
            return 0
        if entry.size < SEND_CHUNK:
            mtime_ns, mode, content = contents.small(entry)
            self.send(header(entry.path, "file", size=len(content), mtime_ns=mtime_ns, mode=mode))
            self.send(content)
            return len(content)
        f, st = open_inside(contents.root, entry)
        with f:
            self.send(header(entry.path, "file", size=st.st_size, mtime_ns=st.st_mtime_ns, mode=st.st_mode & 0o777))
            left = st.st_size
            if left >= SEND_CHUNK:  # a large file's chunks go out as they are read, not copied into the queue
                self.flush()
            while left:
                chunk = f.read(min(SEND_CHUNK, left))
                if not chunk:
                    raise LauncherError(f"{entry.path} shrank while it was being sent; run the sync again")
                self.send(chunk)
                left -= len(chunk)
        return st.st_size

    def why(self) -> str:
        """The node's own words when it ended without an answer (a missing interpreter, a traceback)."""
        text = bytes(self.errors).decode(errors="replace").strip().splitlines()
        if text:
            return text[-1]
        return "the connection closed" if self.channel.closed else "the sync program ended without a word"


def open_inside(root: Path, entry: Entry) -> tuple[IO[bytes], os.stat_result]:
    """Open a file of the tree for reading without following a link: not the file itself (O_NOFOLLOW), nor a folder
    on its way (one replaced by a symlink since the tree was listed). The file the listing found (its device, inode
    and ctime) is that file; another one (saved anew since) must have its real path where the name says. Returns
    the open file and its fstat."""
    path = entry.path
    full = root / path
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
    f = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fd)
        if entry.identity == (st.st_dev, st.st_ino, st.st_ctime_ns):
            return f, st
        real_parent = os.path.realpath(full.parent)
        if real_parent != os.path.join(os.path.realpath(root), *path.split("/")[:-1]).rstrip("/"):
            raise LauncherError(
                f"{path} now lies behind a symlink ({full.parent} -> {real_parent}); run the sync again"
            )
    except BaseException:
        f.close()
        raise
    return f, st


def header(path: str, kind: str, **fields: Any) -> bytes:
    return (json.dumps({"path": path, "kind": kind, **fields}) + "\n").encode()
