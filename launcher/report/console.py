"""Where a run's output goes on the controller, without ever holding up the run: the console and the log mirror.

The console is written by a thread of its own through a bounded buffer: a reader slower than the job (`| less`,
Ctrl-S) makes the console skip lines, and say so, but never delays a heartbeat, a failure or a stop. The mirror
keeps every byte in `<log_dir>/<run_id>/<node>.log`; a disk that fills up costs one warning, not the run.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections import Counter
from pathlib import Path
from typing import IO

from launcher.limits import MIRROR_CLOSE_S, MIRROR_QUEUE_CHUNKS
from launcher.paths import hint
from launcher.settings import DEFAULT_CONSOLE_BUFFER_BYTES


class ConsoleWriter:
    """Node lines (bounded, skippable) and the launcher's own messages (never skipped), in order, on one thread."""

    def __init__(
        self, out: IO[str], err: IO[str], capacity: int, where: str, capacity_chars: int = DEFAULT_CONSOLE_BUFFER_BYTES
    ):
        self.out, self.err = out, err
        self.capacity = capacity
        self.capacity_chars = capacity_chars
        """The most characters held: long lines (cut at 64 KiB) fill it long before the line count does."""
        self.where = where
        """Where skipped lines can be read (the log folder), for the notice."""
        self._items: queue.Queue[tuple[IO[str], str, int, int] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._queued = 0
        self._queued_chars = 0
        self.most_chars = 0
        """The most characters ever held at once (for tests and the bench)."""
        self._skipped: Counter[str] = Counter()
        self.skipped_total = 0
        self._thread = threading.Thread(target=self._write, daemon=True, name="console")
        self._thread.start()

    def lines(self, node: str, text: str, count: int) -> None:
        """A node's prefixed lines; skipped (and counted) when the console is `capacity` lines or `capacity_chars`
        characters behind."""
        if not text:
            return
        with self._lock:
            if self._queued + count > self.capacity or self._queued_chars + len(text) > self.capacity_chars:
                self._skipped[node] += count
                self.skipped_total += count
                return
            self._queued += count
            self._queued_chars += len(text)
            self.most_chars = max(self.most_chars, self._queued_chars)
        self._items.put((self.out, text, count, len(text)))

    def message(self, text: str) -> None:
        """One of the launcher's own lines (progress, warnings): never skipped."""
        self._items.put((self.err, text if text.endswith("\n") else text + "\n", 0, 0))

    def _write(self) -> None:
        while True:
            item = self._items.get()
            if item is None:
                return
            stream, text, count, chars = item
            try:
                stream.write(text)
                stream.flush()
            except (OSError, ValueError):
                pass  # a console that went away (closed pipe) must not stop the run; the log files have it all
            with self._lock:
                self._queued -= count
                self._queued_chars -= chars
                caught_up = (
                    self._queued <= self.capacity // 2
                    and self._queued_chars <= self.capacity_chars // 2
                    and self._skipped
                )
            if caught_up:
                self._notice()

    def _notice(self) -> None:
        with self._lock:
            skipped, self._skipped = self._skipped, Counter()
        text = ", ".join(f"{n} lines of {node}" for node, n in sorted(skipped.items()))
        try:
            self.err.write(
                f"console: skipped {text} (the console was slower than the run); every line is in {self.where}\n"
            )
            self.err.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        """Write everything queued (waiting on a slow reader, never on a dead one), then say what was skipped."""
        self._items.put(None)
        while self._thread.is_alive():
            self._thread.join(0.2)
        if self._skipped:
            self._notice()


class Mirror:
    """Every node's raw output in `<folder>/<node>.log` (0600 in a 0700 folder: output can hold tokens).

    Each block is written where it stands in the node's log (its offset), not appended: two launchers that hold the
    run in turn (`attach --force` from another terminal while the first still reads) write the same bytes at the same
    place, and no line is there twice. A block of unknown offset (an attach from the node's last lines, where this
    machine had no copy) is appended.

    Written by a thread of its own through a bounded queue: a disk that stalls (a hung NFS mount) never holds up the
    reader of a node's channel. A write that fails (a full disk, a read-only folder), or a disk too slow to keep up,
    disables the mirror with one warning; the run goes on and each node's own log stays complete.
    """

    def __init__(self, folder: Path, warn: ConsoleWriter | None, capacity: int = MIRROR_QUEUE_CHUNKS):
        self.folder = folder
        self.warn = warn
        self._files: dict[str, IO[bytes]] = {}
        self._mine: dict[str, int] = {}
        """Each node's log as far as this launcher queued it."""
        self._elsewhere: dict[str, int] = {}
        """Lines of each node another launcher on this machine wrote (and printed) first (`elsewhere`)."""
        self._items: queue.Queue[tuple[str, bytes, int | None] | None] = queue.Queue(maxsize=capacity)
        self._lock = threading.Lock()
        self._closed = False
        self.failed: str | None = None
        self._thread = threading.Thread(target=self._write, daemon=True, name="mirror")
        self._thread.start()

    def elsewhere(self, node: str, data: bytes, at: int | None) -> bool:
        """Whether another launcher on this machine already wrote this block where it goes (one that took the run over
        while this one was frozen: its socket still held what the other then printed), by the file's size past all
        this one queued."""
        if at is None or not data or at < self._mine.get(node, 0):
            return False
        try:
            there = os.stat(self.folder / f"{node}.log").st_size >= at + len(data)
        except OSError:
            return False
        if there:
            self._elsewhere[node] = self._elsewhere.get(node, 0) + data.count(b"\n")
        return there

    def elsewhere_line(self, node: str) -> str | None:
        """What `elsewhere` left off the console for `node`, in a line (None: nothing)."""
        count = self._elsewhere.pop(node, 0)
        if not count:
            return None
        return (
            f"{node}: {count} line(s) another launcher on this machine printed already (it took the run over) are "
            f"in {self.folder / node}.log"
        )

    def take(self, node: str, data: bytes, at: int | None) -> bool:
        """Write a node's block, unless another launcher here wrote it first (`elsewhere`): whether to print it."""
        if self.elsewhere(node, data, at):
            return False
        self.write(node, data, at)
        return True

    def write(self, node: str, data: bytes, at: int | None = None) -> None:
        """Queue a node's output (from byte `at` of its log) for the disk; never waits."""
        if at is not None:
            self._mine[node] = max(self._mine.get(node, 0), at + len(data))
        if self.failed is not None or self._closed:
            return
        try:
            self._items.put_nowait((node, data, at))
        except queue.Full:
            self._fail("the disk is too slow to keep up; the copy stops here")

    def _write(self) -> None:
        while True:
            item = self._items.get()
            if item is None:
                return
            if self.failed is not None:
                continue
            node, data, at = item
            try:
                handle = self._files.get(node) or self._open(node)
                if at is None:
                    os.lseek(handle.fileno(), 0, os.SEEK_END)
                    handle.write(data)
                else:
                    os.pwrite(handle.fileno(), data, at)
            except OSError as exc:
                self._fail(exc.strerror or str(exc))

    def _open(self, node: str) -> IO[bytes]:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.folder / f"{node}.log", os.O_WRONLY | os.O_CREAT, 0o600)
        self._files[node] = os.fdopen(fd, "ab", buffering=0)
        return self._files[node]

    def _fail(self, why: str) -> None:
        with self._lock:
            if self.failed is not None:
                return
            self.failed = why
        if self.warn is not None:
            self.warn.message(
                f"warning: cannot write the log copy in {self.folder}/ ({why}); the run goes "
                f"on, and each node keeps its complete log (`{hint(f'logs --run {self.folder.name}')}`)"
            )

    def close(self, timeout: float = MIRROR_CLOSE_S) -> None:
        """Write what is queued (at most `timeout` seconds: a stalled disk does not hold the launcher), then close."""
        self._closed = True
        try:
            self._items.put(None, timeout=timeout)
        except queue.Full:
            return  # the writer is stuck on the disk; it is a daemon thread and goes with the process
        self._thread.join(timeout)
        if self._thread.is_alive():
            return
        for handle in self._files.values():
            with contextlib.suppress(OSError):
                handle.close()
        self._files.clear()
