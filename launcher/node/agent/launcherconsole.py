"""An attached run's consoles (stdlib only, Python 3.8+): the launcher sessions that watch and steer a run whose life
is on the node. A console may go (a laptop asleep, a dropped connection, a killed launcher) and come back, and
another launcher may take the run over (`ddpl attach`); the run goes on through all of it and stops by itself only
when no launcher has sent a message for the run's bound (launcher/node/agent/attached.py).

The start session's own stdin, stdout and events are the first console. A later one is an `attach` session, which
hands its three descriptors to the run's supervisor over a Unix socket of the run's (abstract, peers of this uid only)
and waits until the supervisor lets it go: its session must live as long, since sshd stops writing to a command's stdin
once the command has exited. The supervisor then writes to that session's pipes itself: no copy, no relay. Only the
current console's messages count, and each console's log stream starts at the offset its launcher already has.
"""

import array
import hashlib
import json
import os
import select
import socket
import struct
import threading
import time

from launcher.node.common import bounds
from launcher.node.wire import Event, event_line, write_all

CONSOLE_RECORD = "console.json"
"""The run directory's record of its consoles: who owns the run, whether a launcher is there, since when it is not,
and when the run stops by itself if none comes back (`inv status` says it)."""


def console_address(run_dir):
    """The supervisor's socket for `run_dir`: abstract (no path length limit, nothing left on disk), named by the run
    directory's digest; only this uid's sessions are taken (SO_PEERCRED)."""
    digest = hashlib.sha256(os.path.realpath(run_dir).encode()).hexdigest()[:32]
    return "\0ddp-launcher-console-" + digest


def _ready(fd, writing, seconds):
    """Whether `fd` can be read (or written) within `seconds`; a hung-up or failed one counts (the I/O then says)."""
    readable, writable, failed = select.select([] if writing else [fd], [fd] if writing else [], [fd], seconds)
    return bool(readable or writable or failed)


class Console:
    """One launcher session's three descriptors, as the supervisor uses them; `link` is the attach session's socket
    (None for the start session's own descriptors, which are the supervisor's fds 0, 1 and the events')."""

    def __init__(self, fds, owner, offset=None, link=None, who=None):
        self.fds = fds
        self.owner, self.offset, self.link, self.who = owner, offset, link, who
        self.came = time.monotonic()  # beats made before it came are stale to it (attached.py `send_events`)
        self.gone = threading.Event()
        self._lock = threading.Lock()
        self._users = 0
        try:  # the log's pipe takes what it has room for, in one call (a run's million lines); its only writer is here
            os.set_blocking(fds[1], False)
        except OSError:
            pass

    def enter(self):
        """A thread starts using the descriptors; False when the console is already let go."""
        with self._lock:
            if self.gone.is_set():
                return False
            self._users += 1
            return True

    def leave(self):
        """A thread is done with the descriptors: the last one after the release closes an attach session's."""
        with self._lock:
            self._users -= 1
            last = self._users == 0 and self.gone.is_set()
        if last:
            self._close()

    def write(self, which, data):
        """All of `data` to stdout (1, non-blocking: as much as the pipe has room for at a time) or the events (2, a
        page at a time once select says the pipe takes it: select, not poll, as a supervisor holds few descriptors);
        False when the console was let go or its reader is gone. Never blocked past CONSOLE_LOOK_S on a launcher that
        stopped reading (asleep), so a console that takes this one's place is turned to at once."""
        fd, view = self.fds[which], memoryview(data)
        try:
            while view:
                if self.gone.is_set():
                    return False
                if which == 1:
                    try:
                        view = view[os.write(fd, view) :]
                    except BlockingIOError:
                        _ready(fd, True, bounds.CONSOLE_LOOK_S)
                elif _ready(fd, True, bounds.CONSOLE_LOOK_S):
                    view = view[os.write(fd, view[: bounds.CONSOLE_PIECE]) :]
        except OSError:
            return False
        return True

    def release(self, why, **fields):
        """Let the console go: its session hears why (an attach session through its link; the start session, a
        `taken` event if its pipe takes one now), and its descriptors become /dev/null, so that a thread still on
        them reads the end and writes nowhere; they are closed once the last thread leaves."""
        with self._lock:
            if self.gone.is_set():
                return False
            self.gone.set()
            idle = self._users == 0
        if self.link is not None:
            try:
                self.link.sendall(event_line(dict(fields, released=why)))
            except OSError:
                pass
        elif why == Event.TAKEN and _ready(self.fds[2], True, bounds.TAKEN_WRITE_S):
            write_all(self.fds[2], event_line(dict(fields, event=Event.TAKEN, time=time.time())))
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in self.fds:
            try:
                os.dup2(devnull, fd)
            except OSError:
                pass
        os.close(devnull)
        if idle:
            self._close()
        return True

    def _close(self):
        if self.link is None:
            return  # the supervisor's own 0, 1 and events: /dev/null from now on, never another file under them
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.link.close()


def read_messages(console, on_message, on_end):
    """An attach console's messages, line by line, until it is let go or its input ends (`on_end(console, why)`)."""
    rest = b""
    console.enter()
    try:
        while not console.gone.is_set():
            if not _ready(console.fds[0], False, bounds.CONSOLE_LOOK_S):
                continue
            data = os.read(console.fds[0], bounds.CONSOLE_PIECE)
            if not data:
                break
            *lines, rest = (rest + data).split(b"\n")
            rest = rest[-bounds.CONSOLE_PIECE :]  # messages are short: a line without end is nobody's message
            for line in lines:
                on_message(console, line.decode("utf-8", "replace").strip())
    except OSError:
        pass
    finally:
        if not console.gone.is_set():
            on_end(console, "its connection closed")
        console.leave()


# --- an attach session's side ------------------------------------------------------------------------------------


def hand_over(run_dir, request, fds):
    """Give this session's descriptors to the run's supervisor; (its socket, its answer), or (None, None) when no
    supervisor
    listens there (the run ended, or its supervisor died), or (None, {"silent": ...}) when it does not answer in
    time."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(bounds.HANDOVER_WAIT_S)
        sock.connect(console_address(run_dir))
    except OSError:
        sock.close()
        return None, None
    try:
        sock.sendmsg([event_line(request)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        answer = _line(sock)
    except OSError as exc:
        sock.close()
        return None, {"silent": "the run's supervisor did not answer (%s)" % exc}
    if answer is None:
        sock.close()
        return None, {"silent": "the run's supervisor did not answer"}
    sock.settimeout(None)
    return sock, answer


def _line(sock, first=b""):
    """One JSON line from `sock` (None at its end or when it is not one)."""
    data = first
    while b"\n" not in data:
        chunk = sock.recv(bounds.CONSOLE_PIECE)
        if not chunk:
            return None
        data += chunk
    try:
        return json.loads(data.split(b"\n", 1)[0])
    except ValueError:
        return None


def wait_released(sock):
    """Until the supervisor lets this session go: why (`taken`, `ended`, `lost`) and its fields; {} at a plain end."""
    try:
        return _line(sock) or {}
    except OSError:
        return {}
    finally:
        sock.close()


# --- the supervisor's side --------------------------------------------------------------------------------------------


def peer_uid(conn):
    pid_uid_gid = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", pid_uid_gid)[1]


def take_handover(conn):
    """An attach session's request and its three descriptors (non-inheritable here), or (None, ()) when it sends
    something else."""
    conn.settimeout(bounds.HANDOVER_WAIT_S)
    fd_size = array.array("i").itemsize
    data, ancillary, _, _ = conn.recvmsg(bounds.CONSOLE_PIECE, socket.CMSG_SPACE(3 * fd_size))
    fds = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[: len(payload) - len(payload) % fd_size])
            fds.extend(received)
    for fd in fds:
        os.set_inheritable(fd, False)
    try:
        request = json.loads(data.split(b"\n", 1)[0]) if data else None
    except ValueError:
        request = None
    if len(fds) != 3 or not isinstance(request, dict):
        for fd in fds:
            os.close(fd)
        return None, ()
    conn.settimeout(None)
    return request, tuple(fds)


def write_record(run_dir, fields):
    """`console.json`, whole or not at all; a disk that refuses costs `inv status` a line, never the run."""
    path = os.path.join(run_dir, CONSOLE_RECORD)
    try:
        with open(path + ".tmp", "w") as f:
            f.write(json.dumps(fields))
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def read_record(run_dir):
    try:
        with open(os.path.join(run_dir, CONSOLE_RECORD)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def start_offset(log_path, offset, tail_bytes):
    """Where a console's stream begins in the log: the offset its launcher already has (its local copy's size), or
    without one the start of the line that holds the last `tail_bytes` (a launcher from another machine)."""
    try:
        size = os.path.getsize(log_path)
    except OSError:
        return 0
    if isinstance(offset, int) and not isinstance(offset, bool) and offset >= 0:
        return min(offset, size)
    begin = max(0, size - int(tail_bytes))
    if begin == 0:
        return 0
    try:
        with open(log_path, "rb") as log:
            log.seek(begin - 1)  # from the byte before: a line that begins right at `begin` is found whole
            data = log.read(int(tail_bytes))
    except OSError:
        return begin
    newline = data.find(b"\n")
    return size if newline < 0 else begin + newline
