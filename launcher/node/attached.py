"""An attached run's node side (stdlib only, Python 3.8+): the launcher's words on stdin, the doctor's checks in
the start session, and the supervision that streams the log and obeys `stop` without ever waiting on the launcher."""

import os
import signal
import sys
import threading
import time

from launcher.node import limits
from launcher.node.proc import rank_processes
from launcher.node.protocol import (
    DUMPS,
    ENDING_WORDS,
    EVENT_OUT,
    GO,
    HEARTBEAT_TIMEOUT,
    KILL,
    LAUNCHER_GONE,
    STACKS,
    STOP,
    STOPPED_ELSEWHERE,
    TCP,
    Event,
    emit,
    emit_parts,
    end_events,
    next_event,
    queue_events,
    queued_events,
    seconds,
    timing,
    write_all,
)
from launcher.node.recorder import ask_dumps, nccl_dumps
from launcher.node.rundir import stop_recorded
from launcher.node.runner import finish, signal_run, stop_run
from launcher.node.stacks import collect, proc_state


class LauncherWords:
    """The launcher's words on stdin, read by one thread for the whole start: heartbeats, `go`, `stop`, `kill`.

    EOF means the launcher or its network is gone. `decided` is set by `go` and by anything that stops the run.
    """

    def __init__(self):
        self.last_word = time.monotonic()
        self.stop_word = None
        self.go = False
        self.decided = threading.Event()
        self.on_tcp = None
        """What `tcp` starts (the doctor's TCP check, `GateChecks.tcp`), on a thread of its own."""
        self.on_stacks = None
        """What `stacks` starts (every worker's stack, as the `stacks` event), on a thread of its own."""
        self.on_dumps = None
        """What `dumps` starts (NCCL's flight recorder asked to dump, as the `nccl` event), on a thread of its own."""
        self.changed = threading.Event()
        """Set by a stop word, the launcher's end and torchrun's: what the supervisor waits on (not a poll)."""

    def stop(self, word):
        self.stop_word = word
        self.changed.set()

    def listen(self):
        for line in sys.stdin:
            self.last_word = time.monotonic()
            word = line.strip()
            if word in ENDING_WORDS:  # abort: the launcher's checks failed somewhere
                self.stop(word)
            elif word == GO:
                self.go = self.stop_word is None
            elif word == TCP and self.on_tcp is not None:
                threading.Thread(target=self.on_tcp, daemon=True, name="tcp").start()
            elif word == STACKS and self.on_stacks is not None:
                threading.Thread(target=self.on_stacks, daemon=True, name="stacks").start()
            elif word == DUMPS and self.on_dumps is not None:
                threading.Thread(target=self.on_dumps, daemon=True, name="dumps").start()
            if word == GO or word in ENDING_WORDS:
                self.decided.set()
        if self.stop_word is None:
            self.stop(LAUNCHER_GONE)
        self.decided.set()

    def wait_for_go(self, heartbeat_timeout, alive_interval):
        """True on `go`; False when the launcher stopped the start, left, or fell silent first.

        The other nodes may take long to get ready (a cold start): `alive` beats say this one is still here.
        """
        beat = time.monotonic()
        while not self.decided.wait(timing("wait_s")):
            if time.monotonic() - self.last_word > heartbeat_timeout:
                self.stop_word = HEARTBEAT_TIMEOUT
                return False
            if time.monotonic() - beat >= alive_interval:
                beat = time.monotonic()
                emit(Event.ALIVE)
        return self.go


class GateChecks:
    """The doctor's fast probe inside the start session (a launch with the doctor on): no session of its own.

    The probe is the node package's own module (launcher/node/probe.py, sent with the agent); the request's
    `gate` section holds every request and number it needs, from the launcher
    (launcher.doctor.collect.session_section):
    - probe: what the probe looks at; its answer goes out as the `probed` event;
    - listen (the master only): master_port is bound before the probe (the answer says whether it is free) and
      answers every connection with the token until `go`, `abort` or a stop, and at most max_s;
    - connect: on the launcher's `tcp` word, once every node has probed (so the master's listener is up), this
      node connects to master_addr:master_port and says what it found as the `tcp` event.
    """

    def __init__(self, section):
        self.section = section
        self.listener = None  # (thread, the write end of the pipe that stops it, its read end)

    def run(self):
        from launcher.node import listener, probe  # only a launch with the doctor on compiles them

        listen = self.section.get("listen")
        reply = None
        if listen:
            max_s = seconds(listen, "max_s", "listen")
            server, reply = listener.open_listener(listen["master_port"])
            if server is not None:
                stop_r, stop_w = os.pipe()
                thread = threading.Thread(target=listener.serve, daemon=True, name="listener",
                                          args=(server, listen["token"], time.monotonic() + max_s, reply, stop_r))
                thread.start()
                self.listener = (thread, stop_w, stop_r)
        emit(Event.PROBED, probe=probe.probe(self.section["probe"]), listener=reply)

    def tcp(self):
        from launcher.node.listener import tcp_connect

        connect = self.section["connect"]
        window, read_s = seconds(connect, "window", "connect"), seconds(connect, "token_read_s", "connect")
        probe = self.section["probe"]
        emit(Event.TCP, tcp=tcp_connect(probe["master_addr"], probe["master_port"], connect["token"], window, read_s))

    def close(self):
        if self.listener is not None:
            thread, stop_w, stop_r = self.listener
            self.listener = None
            os.close(stop_w)
            thread.join()
            os.close(stop_r)


class Attended:
    """An attached run's node side: threads that talk to the launcher, and a supervisor that never waits on them.

    - words: the launcher's stdin lines (heartbeats, `stop`, `kill`), read since the start (`LauncherWords`).
    - stream: the run's log file -> stdout, as it grows (a `LogMerger` thread, started with torchrun, makes that
      file from torchrun's and its workers' files; it only reads and appends files).
    - events: JSON events -> stderr, and an `alive` event every `alive_interval` s so the launcher can tell a
      silent node from a quiet one.
    The supervisor (the calling thread) only polls torchrun and the clock: a launcher that reads slowly, or not at
    all, can delay what reaches it but never a stop, a sweep or the exit code on the node.
    """

    def __init__(self, request, run_dir, proc, words):
        self.request, self.run_dir, self.proc = request, run_dir, proc
        self.words = words
        self.done = threading.Event()
        self.wrote = getattr(getattr(proc, "merger", None), "wrote", None)
        """The merger's append signal (launcher/node/logmerge.py), which the streamer waits on; None without one."""
        self.streamed_at = time.monotonic()
        self.steps = None  # each rank's progress, from its record and its lines (a Sampler, with the watch)
        self.nccl_sent = {}
        """The flight recorder dumps already sent, as they were (with stacks, or asked for): the run's end sends only
        the others, and a rank's dump written again goes again."""

    def stream(self):
        """The run's log to stdout as it grows. Woken by the merger's appends and the run's end, not by polling the
        file 20 times a second: such a poll costs ~3 ms of CPU a second of a run (launcher.limits.LOG_POLL_S)."""
        wrote = self.wrote
        with open(os.path.join(self.run_dir, "log"), "rb") as log:
            while True:
                finished = self.done.is_set()  # read before the last read: nothing is written after it is set
                if wrote is not None:
                    wrote.clear()  # before the read: an append after it ends the wait below at once
                chunk = log.read(int(timing("read_chunk")))
                if chunk:
                    if not write_all(1, chunk):
                        return
                    self.streamed_at = time.monotonic()
                elif finished:
                    return
                elif wrote is not None:
                    wrote.wait(timing("check_s"))
                else:
                    self.done.wait(timing("poll_s"))

    def end(self):
        """The run is over: every thread's wait ends (the streamer's too, which waits on the merger's appends)."""
        self.done.set()
        if self.wrote is not None:
            self.wrote.set()

    def send_events(self):
        while True:
            line = next_event()
            if line is None or not write_all(EVENT_OUT, line):
                return

    def tick(self):
        while not self.done.wait(self.request["alive_interval"]):
            if queued_events() < limits.QUEUED_BEATS_MAX:
                if self.request["watch"]:
                    emit(Event.ALIVE, progress=self.progress())
                else:
                    emit(Event.ALIVE)

    def progress(self):
        """Each rank as the hang watch sees it: seconds since its last output line, its own process's CPU seconds,
        and its progress (`top.Sampler.fields`: steps and batches from the hook's record, their rates, forward and
        data shares, the record's state; steps per second from its lines where the record counts none)."""
        now = time.monotonic()
        last_line = getattr(self.proc, "merger", None)
        last_line = dict(last_line.last_line) if last_line is not None else {}
        if self.steps is None:
            from launcher.node.top import Sampler

            self.steps = Sampler(self.run_dir, self.request["mark"], self.request["top"])
        found = rank_processes(self.request["mark"])
        self.steps.find(found)
        self.steps.read()
        ranks = []
        for pid, start, rank, local_rank, _ in found[0]:
            state, _, cpu = proc_state(pid)
            seen = last_line.get(local_rank)
            ranks.append(dict({"rank": rank, "local_rank": local_rank, "pid": pid, "state": state, "cpu_s": cpu,
                               "quiet_s": None if seen is None else round(now - seen, 3)},
                              **self.steps.fields(pid, start, now)))
        return ranks

    def stacks(self):
        """Every worker's stack on this node, as the `stacks` event (the launcher's `stacks` word)."""
        emit_parts(Event.STACKS, int(self.request["event_chunk"]),
                   workers=collect(self.run_dir, self.request["mark"], self.request["stacks_wait_s"]),
                   nccl=self.new_dumps())

    def new_dumps(self):
        return nccl_dumps(self.run_dir, self.request["nccl_max_bytes"], self.nccl_sent)

    def dumps(self):
        """NCCL's flight recorder asked to dump through torch's pipes (the launcher's `dumps` word: a hang it found
        before NCCL's watchdog did), as the `nccl` event, sent even when nothing came: the launcher waits for it."""
        asked = ask_dumps(self.run_dir, self.request["nccl_dump_wait_s"])
        emit_parts(Event.NCCL, int(self.request["event_chunk"]), nccl=self.new_dumps(), asked=asked)

    def send_nccl(self):
        """NCCL's flight recorder dumps written while the run ended (its watchdog's timeout ends a run by itself)."""
        dumps = self.new_dumps()
        if dumps:
            emit_parts(Event.NCCL, int(self.request["event_chunk"]), nccl=dumps)

    def supervise(self):
        """Until torchrun ends: obey stop words and the heartbeat bound. It waits on `words.changed` (a word, or
        torchrun's end through a waiting thread) rather than polling, so its end is seen at once."""
        request, words = self.request, self.words
        stopping, stop_at = None, None

        def wait_torchrun():
            self.proc.wait()
            words.changed.set()

        threading.Thread(target=wait_torchrun, daemon=True, name="wait").start()
        while True:
            words.changed.clear()  # before looking: a change after the look ends the wait below
            if self.proc.poll() is not None:
                break
            if words.stop_word is None and time.monotonic() - words.last_word > request["heartbeat_timeout"]:
                words.stop_word = HEARTBEAT_TIMEOUT
            if words.stop_word is not None and stopping is None:
                stopping, stop_at = words.stop_word, time.monotonic()
                threading.Thread(target=stop_run, daemon=True, args=(
                    self.run_dir, request["mark"], 0 if stopping == KILL else request["grace"])).start()
                emit(Event.STOPPING, reason=stopping)
            if stopping is not None and words.stop_word == KILL:
                signal_run(self.run_dir, request["mark"], signal.SIGKILL)
            # The heartbeat bound is a clock, not an event: woken at its deadline (at least each check_s, as beats move
            # it); KILL is sent again each poll_s.
            silent_for = request["heartbeat_timeout"] - (time.monotonic() - words.last_word)
            words.changed.wait(timing("poll_s") if stopping is not None else
                               max(0.0, min(silent_for, timing("check_s"))))
        # A stop already gave TERM: its workers get what is left of the grace period, not a second one.
        grace = request["grace"] if stop_at is None else max(0.0, stop_at + request["grace"] - time.monotonic())
        killed = self.words.stop_word == KILL  # a `kill` after a `stop` (a second Ctrl-C) ends the grace too
        code, left = finish(self.proc, self.run_dir, request["mark"], 0 if killed else grace)
        self.end()
        return code, left, stopping


def supervise_run(request, run_dir, proc, words):
    """Stream the log, obey stop lines, stop the run when the launcher is gone, sweep, report the exit."""
    queue_events()
    run = Attended(request, run_dir, proc, words)
    words.on_stacks, words.on_dumps = run.stacks, run.dumps
    signal.signal(signal.SIGHUP, lambda *_: words.stop(LAUNCHER_GONE))
    signal.signal(signal.SIGTERM, lambda *_: words.stop(STOP))
    threads = {name: threading.Thread(target=getattr(run, name), daemon=True, name=name)
               for name in ("stream", "send_events", "tick")}
    for thread in threads.values():
        thread.start()
    code, left, stopping = run.supervise()
    if stopping is None and stop_recorded(run_dir):
        stopping = STOPPED_ELSEWHERE  # no word of this launcher's: a stop from another terminal ended it
    if stopping:
        emit(Event.STOPPED, left=left, reason=stopping)
    # The log goes out whole while the launcher takes it; a launcher that stopped reading gets no more wait.
    while threads["stream"].is_alive() and time.monotonic() - run.streamed_at < request["heartbeat_timeout"]:
        threads["stream"].join(timing("wait_s"))
    run.send_nccl()
    merger = getattr(proc, "merger", None)
    emit(Event.EXITED, code=code, left=left, reason=stopping,
         workers=None if merger is None else merger.workers_started)
    end_events()
    threads["send_events"].join(limits.EVENTS_DRAIN_S)
    return code
