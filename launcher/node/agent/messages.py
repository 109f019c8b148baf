"""The launcher's messages as an agent hears them (stdlib only, Python 3.8+): heartbeats, `go`, `stop`, `kill` and
the asks (`tcp`, `stacks`, `dumps`, `position`), from the start session's stdin or the console that has the run now."""

import sys
import threading
import time

from launcher.node.agent import trace
from launcher.node.wire import (
    DUMPS,
    ENDING_MESSAGES,
    GO,
    HEARTBEAT,
    HEARTBEAT_TIMEOUT,
    LAUNCHER_GONE,
    POSITION,
    STACKS,
    STOPPED_BY,
    TCP,
    Event,
    emit,
    timing,
)


class LauncherMessages:
    """The launcher's messages: heartbeats, `go`, `stop`, `kill`, ... The start session's stdin is read by one thread
    for the whole run (`listen`); a console that attaches later has a reader of its own
    (launcher/node/agent/consoles.py).

    Before `go`, the end of stdin means the launcher or its network is gone: nothing starts. After it, an SSH run
    (`reattach`) only loses that console and goes on within the heartbeat bound; under SLURM it stops, as srun's
    step is ending. `decided` is set by `go` and by anything that stops the start.
    """

    def __init__(self, reattach=False):
        self.reattach = reattach
        self.last_message = time.monotonic()
        self.last_message_wall = time.time()
        self.stop_message = None
        self.stopped_by = None
        """Who asked for the stop, as the launcher said it (`stopped-by WORDS`)."""
        self.go = False
        self.input_ended = False
        """The start session's stdin ended after `go` (before the run's consoles were made)."""
        self.consoles = None
        """The run's consoles once it started (`Consoles`): the messages of the current one count."""
        self.decided = threading.Event()
        self.on_tcp = None
        """What `tcp` starts (the doctor's TCP check, `GateChecks.tcp`), on a thread of its own."""
        self.on_stacks = None
        """What `stacks` starts (every worker's stack, as the `stacks` event), on a thread of its own."""
        self.on_dumps = None
        """What `dumps` starts (NCCL's flight recorder asked to dump, as the `nccl` event), on a thread of its own."""
        self.on_position = None
        """What `position` answers (the log's size, as the `position` event)."""
        self.changed = threading.Event()
        """Set by a stop message, the launcher's end and torchrun's: what the supervisor waits on (not a poll)."""

    def stop(self, message):
        self.stop_message = message
        self.changed.set()

    def heard(self):
        """A message, or a console that came: the launcher is there now."""
        self.last_message, self.last_message_wall = time.monotonic(), time.time()
        if self.consoles is not None:
            self.consoles.heard()

    def take(self, message):
        """One message of the current console's."""
        self.heard()
        if message != HEARTBEAT:
            trace.note("message: %s", message)
        if message.startswith(STOPPED_BY + " "):
            self.stopped_by = message[len(STOPPED_BY) + 1 :][:200]
        elif message in ENDING_MESSAGES:  # abort: the launcher's checks failed somewhere
            self.stop(message)
        elif message == GO:
            self.go = self.stop_message is None
        else:
            started = {TCP: self.on_tcp, STACKS: self.on_stacks, DUMPS: self.on_dumps, POSITION: self.on_position}.get(
                message
            )
            if started is not None:
                threading.Thread(target=started, daemon=True, name=message).start()
        if message == GO or message in ENDING_MESSAGES:
            self.decided.set()

    def listen(self):
        for line in sys.stdin:
            consoles = self.consoles
            if consoles is None or consoles.current is consoles.first:
                self.take(line.strip())
        self.input_ended = True  # before the look: consoles made from now on start without this one
        trace.note("the start session's input ended (its connection closed)")
        consoles = self.consoles
        if consoles is not None:
            consoles.lost(consoles.first, "its connection closed")
        elif not (self.go and self.reattach) and self.stop_message is None:
            self.stop(LAUNCHER_GONE)
        self.decided.set()

    def wait_for_go(self, heartbeat_timeout, alive_interval):
        """True on `go`; False when the launcher stopped the start, left, or fell silent first.

        The other nodes may take long to get ready (a cold start): `alive` beats say this one is still here.
        """
        beat = time.monotonic()
        while not self.decided.wait(timing("wait_s")):
            if time.monotonic() - self.last_message > heartbeat_timeout:
                self.stop_message = HEARTBEAT_TIMEOUT
                trace.note("no launcher heard for %g s before go: nothing starts", heartbeat_timeout)
                return False
            if time.monotonic() - beat >= alive_interval:
                beat = time.monotonic()
                emit(Event.ALIVE)
        return self.go
