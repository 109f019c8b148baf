"""The console and the log mirror never hold up a run: bounded buffers, cut lines, one warning for a full disk."""

from __future__ import annotations

import io
import os
import threading
import time
import tracemalloc
from pathlib import Path

from launcher.limits import MAX_LINE_BYTES
from launcher.report.console import ConsoleWriter, Mirror
from launcher.report.lines import CUT_MARK, LineSplitter, NodeLog


class BlockedStream(io.StringIO):
    """A console whose reader is away until `release` is set (a pipe nobody reads, Ctrl-S)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, text: str) -> int:
        self.release.wait()
        return super().write(text)


def test_a_blocked_console_skips_lines_and_says_where_they_are() -> None:
    out, err = BlockedStream(), io.StringIO()
    console = ConsoleWriter(out, err, capacity=10, where="logs/run/")
    t0 = time.monotonic()
    for i in range(100):
        console.lines("node-1", f"node-1 | {i}\n", 1)  # never waits on the blocked console
    assert time.monotonic() - t0 < 0.5
    out.release.set()
    console.close()
    printed = out.getvalue().splitlines()
    assert 10 <= len(printed) <= 11 and printed[0] == "node-1 | 0"
    assert console.skipped_total == 100 - len(printed)
    assert f"console: skipped {console.skipped_total} lines of node-1" in err.getvalue()
    assert "every line is in logs/run/" in err.getvalue()


def test_a_blocked_console_holds_at_most_its_bytes_of_long_lines() -> None:
    # 1,500 lines of 64 KiB behind a paused terminal once took 94 MiB: the line bound alone (a million) let them in.
    out, err = BlockedStream(), io.StringIO()
    bound = 4 << 20
    console = ConsoleWriter(out, err, capacity=1_000_000, where="logs/run/", capacity_chars=bound)
    tracemalloc.start()
    for i in range(1500):
        console.lines("node-1", f"node-1 | {i:05d} " + "x" * (MAX_LINE_BYTES - 16) + "\n", 1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert console.most_chars <= bound
    assert peak < bound + (8 << 20), f"peak {peak / 2**20:.0f} MiB behind a paused console"
    out.release.set()
    console.close()
    assert console.skipped_total == 1500 - len(out.getvalue().splitlines()) > 1400
    assert f"console: skipped {console.skipped_total} lines of node-1" in err.getvalue()


def test_messages_are_never_skipped_and_keep_their_order() -> None:
    out = io.StringIO()
    console = ConsoleWriter(out, out, capacity=1, where="logs/")
    console.message("started")
    console.lines("node-0", "node-0 | a\n", 1)
    console.message("done")
    console.close()
    assert out.getvalue() == "started\nnode-0 | a\ndone\n"


def test_a_line_without_newline_is_cut_with_bounded_memory_and_time() -> None:
    log = NodeLog("node-0", 0, 6, 0, colour=False)
    chunk = b"x" * 65536
    lines = xs = 0
    tracemalloc.start()
    t0 = time.process_time()
    for _ in range(256):  # 16 MiB, no newline
        text, count = log.format(chunk)
        lines += count
        xs += text.count("x")
        assert text.endswith(CUT_MARK.decode() + "\n")
    cpu = time.process_time() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * MAX_LINE_BYTES and cpu < 1.0  # a few pieces at a time, never the whole line
    assert lines == 256 and xs == 16 * 1024 * 1024


def test_the_splitter_keeps_whole_lines_across_chunks() -> None:
    splitter = LineSplitter(max_line=8)
    assert splitter.feed(b"ab\ncd") == [b"ab"]
    assert splitter.feed(b"ef\n") == [b"cdef"]
    assert splitter.feed(b"0123456789") == [b"01234567" + CUT_MARK]
    assert splitter.flush() == [b"89"]


def test_the_mirror_is_private_and_a_failing_disk_warns_once(tmp_path: Path) -> None:
    out = io.StringIO()
    console = ConsoleWriter(out, out, capacity=10, where="x")
    mirror = Mirror(tmp_path / "logs" / "20261122-000000-abcdef", console)
    mirror.write("node-0", b"token=abc\n")
    mirror.close()  # written by the mirror's own thread: closing waits for it
    folder = tmp_path / "logs" / "20261122-000000-abcdef"
    assert (folder / "node-0.log").read_bytes() == b"token=abc\n"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert oct((folder / "node-0.log").stat().st_mode & 0o777) == "0o600"
    full = Mirror(Path("/dev/full/cannot"), console)  # a folder that cannot be made: every write fails
    for _ in range(3):
        full.write("node-0", b"line\n")
    full.close()
    console.close()
    assert out.getvalue().count("warning: cannot write the log copy") == 1
    assert full.failed is not None
    assert not os.path.exists("/dev/full/cannot")


def test_two_launchers_writing_one_copy_never_write_a_line_twice(tmp_path: Path) -> None:
    """`attach --force` while the first launcher still reads: both write the node's lines into this machine's copy,
    each block at its place in the node's log, so the copy is the node's log once, whatever the order."""
    log = b"".join(b"line %d\n" % i for i in range(100))
    first, second = Mirror(tmp_path, None), Mirror(tmp_path, None)
    first.write("node-0", log[:700], 0)
    first.close()
    second.write("node-0", log[500:], 500)  # the attach began at 500 bytes: what this machine's copy had then
    first = Mirror(tmp_path, None)
    first.write("node-0", log[700:800], 700)  # the first launcher wakes and writes what it had read meanwhile
    first.close()
    second.close()
    assert (tmp_path / "node-0.log").read_bytes() == log
    unknown = Mirror(tmp_path, None)  # an attach from the node's last lines, where this machine had no copy: appended
    unknown.write("node-1", b"last\n")
    unknown.write("node-1", b"more\n")
    unknown.close()
    assert (tmp_path / "node-1.log").read_bytes() == b"last\nmore\n"


def test_a_stalled_disk_never_holds_the_reader_nor_the_end(tmp_path: Path) -> None:
    """The log file is a FIFO nobody reads: opening it blocks, as a hung network mount would."""
    folder = tmp_path / "20261122-000000-abcdef"
    folder.mkdir()
    os.mkfifo(folder / "node-0.log")
    out = io.StringIO()
    console = ConsoleWriter(out, out, capacity=10, where="x")
    mirror = Mirror(folder, console, capacity=4)
    t0 = time.monotonic()
    for _ in range(100):
        mirror.write("node-0", b"x" * 1000)  # the reader of the node's channel: it must never wait
    assert time.monotonic() - t0 < 0.5
    mirror.close(timeout=0.5)
    assert time.monotonic() - t0 < 2.0
    console.close()
    assert out.getvalue().count("warning: cannot write the log copy") == 1
    assert "too slow to keep up" in out.getvalue()
    os.close(os.open(folder / "node-0.log", os.O_RDONLY | os.O_NONBLOCK))  # let the stuck writer thread go


def test_a_block_another_launcher_here_wrote_first_is_not_printed_again(tmp_path: Path) -> None:
    # issue 69 (6): a launcher frozen across another's take-over still had in its socket what the other then printed
    first, second = Mirror(tmp_path, None), Mirror(tmp_path, None)
    log = b"".join(b"line %d\n" % i for i in range(6))
    assert first.take("node-0", log[:14], 0)  # lines 0-1, before it froze
    first.close()
    assert second.take("node-0", log[14:], 14)  # the take-over's: from where this machine's copy stopped
    second.close()
    again = Mirror(tmp_path, None)
    again.write("node-0", log[:14], 0)  # the frozen one, awake: what it had written before
    assert not again.take("node-0", log[14:28], 14)  # its socket's backlog: printed by the other already
    assert again.take("node-0", b"line 6\n", len(log))  # new: its own
    assert again.elsewhere_line("node-0") == (f"node-0: 2 line(s) another launcher on this machine printed already "
                                              f"(it took the run over) are in {tmp_path / 'node-0'}.log")
    again.close()
    assert (tmp_path / "node-0.log").read_bytes() == log + b"line 6\n"
