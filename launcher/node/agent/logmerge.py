"""A run's one log on a node (stdlib only, Python 3.8+): torchrun's own output and every worker's files merged
into `log`, whole lines, each worker line tagged with its local and global rank."""

import os
import threading
import time

from launcher.node.common.proc import workers
from launcher.node.wire import LOCAL_TAG, RANK_TAG, Event, emit, write_all


def worker_ranks(mark):
    """{(restart count, local rank): global rank} of the run's live workers, read from their environments."""
    return {(restart, local): rank for _, _, rank, local, restart in workers(mark) if restart is not None}


class LogSource:
    """One file the merger tails: its read position is its open descriptor; `rest` holds an unfinished line;
    `inode` tells the file from another made later under the same name."""

    def __init__(self, fd, tag=None, key=None):
        self.fd, self.tag, self.key, self.rest = fd, tag, key, b""
        self.inode = inode(os.fstat(fd))


class LogMerger:
    """torchrun's output (`torchrun.log`) and every worker's files (torchrun --redirects: <ranks>/<rdzv run id>_*/
    attempt_<restart count>/<local rank>/stdout.log and stderr.log) -> the run's `log`, whole lines only, each
    worker line tagged `[default<local rank>@r<global rank>]:` with one bytes.replace per chunk (C, not a loop).

    A thread of the process that keeps the run (the attached agent or the detached supervisor): it only reads files and
    appends to one, so it never waits on the launcher. `log` is what the launcher streams and what `inv logs`
    replays. `close()` (after torchrun and its workers are gone) drains everything, ends unfinished lines, and only
    then does `finish` record the exit code: a follower that sees the exit code has the whole log.
    """

    def __init__(self, run_dir, mark, settings):
        self.run_dir, self.mark = run_dir, mark
        self.ranks = os.path.join(run_dir, settings["ranks"])
        self.poll_s, self.chunk = settings["poll_s"], settings["chunk"]
        self.max_line, self.cut_mark = settings["max_line"], settings["cut_mark"].encode()
        self.out = os.open(os.path.join(run_dir, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.sources = {}  # path -> LogSource; torchrun's own first
        self.own = os.path.join(run_dir, "torchrun.log")
        self.known = {}  # (restart count, local rank) -> global rank, or None when it cannot be told
        self.last_line = {}  # local rank -> when (monotonic) its latest attempt's files last gave a whole line
        self.workers_started = False
        """Whether torchrun started its workers at least once: it makes attempt_N only then, after the rendezvous."""
        self.stopping = threading.Event()
        self.wrote = threading.Event()
        """Set at each append to `log`: an attached agent's streamer waits on it instead of polling the file."""
        self.thread = threading.Thread(target=self.run, daemon=True, name="merge-logs")

    def start(self):
        self.sources[self.own] = LogSource(os.open(self.own, os.O_RDONLY))
        self.thread.start()
        return self

    def close(self):
        self.stopping.set()
        self.thread.join()

    def run(self):
        try:
            while True:
                stopping = self.stopping.is_set()  # read before the last round: nothing is written after it is set
                self.discover()
                # Workers first: what a worker wrote before it failed lands before torchrun's report of the failure.
                moved = [self.pump(source) for source in list(self.sources.values())[1:]]
                moved.append(self.pump(self.sources[self.own]))
                if stopping and not any(moved):
                    break
                if self.chunk not in moved:  # nothing more waiting: a trickle is read in chunks, not spun on
                    self.stopping.wait(self.poll_s)
            for source in self.sources.values():  # the last line of a file that ends without a newline
                if source.rest:
                    self.write(self.tagged(source, source.rest + b"\n"))
        except Exception as exc:  # a bug here must not take the run's supervisor down: the rank files keep it all
            emit(Event.ERROR, message="the log merger stopped: %s: %s" % (type(exc).__name__, exc))
        finally:
            for source in self.sources.values():
                os.close(source.fd)
            os.close(self.out)

    def discover(self):
        """Open each worker file torchrun made since the last look: a c10d restart after a failure makes a new
        attempt_N; one for a change of the group's members (a node left or came) makes the same attempt_N again,
        its folder removed and new files in it, written by new workers whose global ranks may differ."""
        for run in listdir(self.ranks):
            for attempt in listdir(os.path.join(self.ranks, run)):
                if not (attempt.startswith("attempt_") and attempt[8:].isdigit()):
                    continue
                self.workers_started = True
                base = os.path.join(self.ranks, run, attempt)
                for local in listdir(base):
                    if not local.isdigit():
                        continue
                    for name in ("stdout.log", "stderr.log"):
                        path = os.path.join(base, local, name)
                        old = self.sources.get(path)
                        if old is not None and not self.replaced(old, path):
                            continue
                        try:
                            fd = os.open(path, os.O_RDONLY)
                        except OSError:
                            continue  # not made yet
                        if old is not None:
                            self.retire(old)
                        self.sources[path] = LogSource(fd, key=(int(attempt[8:]), int(local)))

    @staticmethod
    def replaced(source, path):
        try:
            return inode(os.stat(path)) != source.inode
        except OSError:
            return False  # removed, not made again yet: the open file still holds what was not read

    def retire(self, source):
        """The last lines of a file whose name now belongs to another; its worker's rank is read anew."""
        while self.pump(source):
            pass
        if source.rest:
            self.write(self.tagged(source, source.rest + b"\n"))
        os.close(source.fd)
        self.known.pop(source.key, None)

    def pump(self, source):
        """Move what `source` holds now to the log, whole lines; how many bytes were read."""
        try:
            data = os.read(source.fd, self.chunk)
        except OSError:
            return 0
        read = len(data)
        if not read:
            return 0
        data = source.rest + data if source.rest else data
        end = data.rfind(b"\n") + 1
        whole, source.rest = data[:end], data[end:]
        # No newline for so long: cut, marked as the launcher does, so that the piece with its tag and the mark
        # stays within max_line (the launcher then never cuts it again).
        room = self.max_line - len(self.tag_of(source)) - len(self.cut_mark)
        while len(source.rest) >= room:
            whole += source.rest[:room] + self.cut_mark + b"\n"
            source.rest = source.rest[room:]
        if whole:
            self.write(self.tagged(source, whole))
            if source.key is not None:
                self.last_line[source.key[1]] = time.monotonic()  # a rank's progress, as the hang watch sees it
        return read

    def tag_of(self, source):
        """The source's tag: b"" for torchrun's own lines; a worker's is found with its first bytes (the worker has
        run by then, so its environment is there to read) and kept."""
        if source.key is None:
            return b""
        if source.tag is None:
            if source.key not in self.known:
                self.known.update(worker_ranks(self.mark))
                self.known.setdefault(source.key, None)
            rank = self.known[source.key]
            local = source.key[1]
            source.tag = (LOCAL_TAG % local if rank is None else RANK_TAG % (local, rank)).encode()
        return source.tag

    def tagged(self, source, lines):
        """`lines` (whole, newline-terminated) with the source's tag in front of each, one bytes.replace."""
        tag = self.tag_of(source)
        return tag + lines[:-1].replace(b"\n", b"\n" + tag) + b"\n" if tag else lines

    def write(self, data):
        write_all(self.out, data)  # False on a full disk: lost to the log; the rank files still hold them
        self.wrote.set()


def inode(stat):
    return stat.st_dev, stat.st_ino


def listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []
