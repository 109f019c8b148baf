"""The consoles of one attached run, as its supervisor holds them (stdlib only, Python 3.8+): the current one (None
while no launcher is there), who owns the run, and the socket through which a launcher comes back
(launcher/node/agent/launcherconsole.py).

- A launcher that reconnects (the same owner) gets the run back at once; its old session is let go.
- `ddpl attach` from anywhere takes the run over (a new owner): the old owner's session hears `taken`, and a later
  reconnect of the old owner is refused with who took it (so a launcher that wakes up never fights a newer one).
- No console, or one that says nothing: the run goes on; `console.json` says since when no launcher was heard and when
  the run stops by itself (the heartbeat bound), which `inv status` shows.
"""

import os
import socket
import threading
import time

from launcher.node.agent import trace
from launcher.node.agent.launcherconsole import (
    Console,
    console_address,
    peer_uid,
    read_messages,
    start_offset,
    take_handover,
    write_record,
)
from launcher.node.common import bounds
from launcher.node.wire import LAUNCHER_GONE, Event, emit, event_line


class Consoles:
    """The supervisor's consoles; `messages` is the run's `LauncherWords` (the last message's time, the stop)."""

    def __init__(self, run_dir, request, messages, first):
        self.run_dir, self.messages = run_dir, messages
        self.log = os.path.join(run_dir, "log")
        self.bound, self.away_after = request["heartbeat_timeout"], request["away_after_s"]
        self.tail_bytes = request["attach_tail_bytes"]
        self.reattach = bool(request["reattach"])
        self.first = first
        self.current = first
        self.owner, self.who, self.owner_since = first.owner, first.who, time.time()
        self.changed = threading.Condition()
        """Notified when the current console changes: the log's and the events' senders turn to it."""
        self.wake = None
        """Called too when it changes: the log's sender may be waiting on the merger's appends, not on `changed`."""
        self.away_since = None
        """The wall clock's time of the last message before an absence (no console, or one silent for away_after)."""
        self.server = None
        self.closed = False
        self.record()
        messages.consoles = self
        if messages.input_ended:  # the start session's stdin ended before this (its reader saw no consoles yet)
            self.lost(first, "its connection closed")

    # --- the socket later consoles come through -------------------------------------------------------------

    def serve(self):
        """Listen for attach sessions (an SSH run only: under SLURM srun owns the run, and its stdin's end stops it)."""
        if not self.reattach:
            return
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(console_address(self.run_dir))
            server.listen(bounds.CONSOLE_BACKLOG)
        except OSError as exc:
            server.close()
            emit(
                Event.ERROR,
                message="no launcher can reconnect to this node's part of the run (its console "
                "socket: %s); it stops when this connection ends" % exc,
            )
            self.reattach = False
            return
        self.server = server
        threading.Thread(target=self._accept, daemon=True, name="consoles").start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return  # closed: the run is over
            try:
                self._take(conn)
            except OSError:
                conn.close()

    def _take(self, conn):
        if peer_uid(conn) != os.getuid():
            conn.close()
            return
        request, fds = take_handover(conn)
        if request is None:
            conn.close()
            return
        with self.changed:
            if self.closed or (request.get("owner") != self.owner and not request.get("take_over")):
                conn.sendall(
                    event_line(
                        {"taken": True, "by": self.who, "at": self.owner_since}
                        if not self.closed
                        else {"silent": "the run is ending on this node"}
                    )
                )
                for fd in fds:
                    os.close(fd)
                conn.close()
                return
            console = Console(
                fds,
                request.get("owner"),
                start_offset(self.log, request.get("offset"), self.tail_bytes),
                conn,
                request.get("who"),
            )
            conn.sendall(event_line({"accepted": True}))
            old, away_s = self.current, time.monotonic() - self.messages.last_message
            taken = console.owner != self.owner
            was = (self.who, self.owner_since)
            if taken:
                self.owner, self.who, self.owner_since = console.owner, console.who, time.time()
            self.current = console
            self.messages.heard()
            self.changed.notify_all()
        self._woken()
        if old is not None:
            old.release(Event.TAKEN if taken else "replaced", by=console.who, at=self.owner_since)
        threading.Thread(
            target=read_messages, args=(console, self.message, self.lost), daemon=True, name="console-messages"
        ).start()
        trace.note(
            "a console came (%s, after %.0f s without): %s",
            console.who,
            away_s,
            "the run taken over from %s" % (was[0],) if taken else "its own launcher",
        )
        emit(
            Event.ATTACHED,
            log_bytes=self.log_bytes(),
            away_s=round(away_s, 3),
            replay=False,
            owner_was=list(was) if taken else None,
        )
        self.record()

    # --- messages, losses and absences ----------------------------------------------------------------------------

    def message(self, console, message):
        """A line from a console: a message only while it is the current one."""
        if console is self.current:
            self.messages.take(message)

    def lost(self, console, why):
        """A console's session ended (its input closed, a write failed): the run goes on without it, within the
        bound. Without reattaching (SLURM), the run stops as before: its step is ending."""
        with self.changed:
            if console is not self.current and self.current is not None:
                return
            self.current = None
            self.changed.notify_all()
        self._woken()
        trace.note("its console was lost (%s)%s", why, "" if self.reattach else ": the run stops (its step ends)")
        console.release("lost")
        if not self.reattach:
            self.messages.stop(LAUNCHER_GONE)
        self.note_silence(time.monotonic(), force=True)

    def note_silence(self, now, force=False):
        """The supervisor's look at the clock: no console, or none heard for away_after, makes the launcher away."""
        quiet_for = now - self.messages.last_message
        if self.away_since is None and (force or self.current is None or quiet_for > self.away_after):
            trace.note(
                "no launcher heard for %.0f s: away (the run goes on %s)",
                quiet_for,
                "without it" if self.bound is None else "within %g s of it" % self.bound,
            )
            self.away_since = self.messages.last_message_wall
            self.record()

    def heard(self):
        """A message came from the current console: a launcher that was away is back."""
        if self.away_since is not None and self.current is not None:
            trace.note("its launcher is back")
            self.away_since = None
            self.record()

    def _woken(self):
        if self.wake is not None:
            self.wake()

    def wait_change(self, seconds):
        with self.changed:
            self.changed.wait(seconds)

    def log_bytes(self):
        try:
            return os.path.getsize(self.log)
        except OSError:
            return 0

    def record(self):
        away = self.away_since
        write_record(
            self.run_dir,
            {
                "owner": self.who,
                "owner_id": self.owner,
                "owner_since": self.owner_since,
                "present": away is None,
                "away_since": away,
                "stops_at": None if away is None or self.bound is None else away + self.bound,
                "bound": self.bound,
                "reattach": self.reattach,
            },
        )

    def close(self):
        """The run is over: no console comes any more, and the current one is let go (an attach session ends)."""
        with self.changed:
            self.closed = True
            console, self.current = self.current, None
            self.changed.notify_all()
        self._woken()
        if self.server is not None:
            try:
                self.server.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.server.close()
        if console is not None:
            console.release("ended")
