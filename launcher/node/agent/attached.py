"""An attached run's node side (stdlib only, Python 3.8+): the supervision that streams the log to the run's console
and obeys `stop` without ever waiting on a launcher (the launcher's messages: launcher/node/agent/messages.py). The
run lives here: a launcher may go and come back (launcher/node/agent/consoles.py); only when none has sent a message
for the heartbeat bound does the node stop its part by itself."""

import json
import os
import signal
import threading
import time

from launcher.node.agent import trace
from launcher.node.agent.consoles import Consoles
from launcher.node.agent.launcherconsole import Console
from launcher.node.agent.recorder import ask_dumps, nccl_dumps
from launcher.node.agent.records import went_nonfinite
from launcher.node.agent.rundir import END_RECORD, record, record_stopped_by, stop_recorded
from launcher.node.agent.runner import finish, signal_run, stop_run
from launcher.node.agent.stackdump import collect, proc_state
from launcher.node.common import bounds
from launcher.node.common.proc import rank_processes
from launcher.node.wire import (
    EVENT_OUT,
    HEARTBEAT_TIMEOUT,
    KILL,
    LAUNCHER_GONE,
    STOP,
    STOPPED_ELSEWHERE,
    Event,
    emit,
    emit_parts,
    end_events,
    next_event,
    queue_events,
    queued_events,
    timing,
)


class Attended:
    """An attached run's node side: threads that talk to the launcher, and a supervisor that never waits on them.

    - messages: the current console's lines (heartbeats, `stop`, `kill`), read since the start (`LauncherMessages`).
    - stream: the run's log file -> the current console's stdout, as it grows (a `LogMerger` thread, started with
      torchrun, makes that file from torchrun's and its workers' files; it only reads and appends files).
    - events: JSON events -> the current console, and an `alive` event every `alive_interval` s so the launcher can
      tell a silent node from a quiet one.
    - consoles: the launcher sessions that come and go (`Consoles`); with none there, the run goes on.
    The supervisor (the calling thread) only polls torchrun and the clock: a launcher that reads slowly, or not at
    all, can delay what reaches it but never a stop, a sweep or the exit code on the node.
    """

    def __init__(self, request, run_dir, proc, messages):
        self.request, self.run_dir, self.proc = request, run_dir, proc
        self.messages = messages
        self.done = threading.Event()
        self.wrote = getattr(getattr(proc, "merger", None), "wrote", None)
        """The merger's append signal (launcher/node/agent/logmerge.py), which the streamer waits on; None without
        one."""
        self.streamed_at = time.monotonic()
        self.consoles = None  # the run's `Consoles`, made by supervise_run
        self.steps = None  # each rank's progress, from its record and its lines (a Sampler, with the watch)
        self.nccl_sent = {}
        """The flight recorder dumps already sent, as they were (with stacks, or asked for): the run's end sends only
        the others, and a rank's dump written again goes again."""

    def stream(self):
        """The run's log to the current console as it grows, from where that console's launcher is (its offset). Woken
        by the merger's appends, a console's change and the run's end, not by polling the file 20 times a second (~3 ms
        of CPU a second of a run: launcher.limits.LOG_POLL_S). With no console it waits for one: the log keeps all."""
        wrote, consoles, console = self.wrote, self.consoles, None
        with open(os.path.join(self.run_dir, "log"), "rb") as log:
            try:
                while True:
                    finished = self.done.is_set()  # read before the last read: nothing is written after it is set
                    if wrote is not None:
                        wrote.clear()  # before the read: an append after it ends the wait below at once
                    if consoles.current is not console:
                        console = self._turn(console)
                        if console is not None:
                            log.seek(console.offset)
                    if console is None:
                        if finished:
                            return
                        consoles.wait_change(timing("check_s"))
                        continue
                    chunk = log.read(int(timing("read_chunk")))
                    if chunk:
                        if console.write(1, chunk):
                            self.streamed_at = time.monotonic()
                        else:
                            consoles.lost(console, "its output closed")
                    elif finished:
                        return
                    elif wrote is not None:
                        wrote.wait(timing("check_s"))
                    else:
                        self.done.wait(timing("poll_s"))
            finally:
                if console is not None:
                    console.leave()

    def _turn(self, console):
        """Leave `console` for the current one (None when there is none, or it was let go meanwhile)."""
        if console is not None:
            console.leave()
        current = self.consoles.current
        return current if current is not None and current.enter() else None

    def wake(self):
        """A console came or went: the streamer's wait on the merger's appends ends now."""
        if self.wrote is not None:
            self.wrote.set()

    def end(self):
        """The run is over: every thread's wait ends (the streamer's too, which waits on the merger's appends)."""
        self.done.set()
        self.wake()

    def send_events(self):
        """The events to the current console; with none there they go nowhere (the run's end is kept in the run
        directory for the next one), and beats made before a console came are not sent to it (they are stale)."""
        console, since = None, time.monotonic()
        try:
            while True:
                item = next_event()
                if item is None:
                    return
                name, made, line = item
                if self.consoles.current is not console:
                    # Beats made before the console came are stale to it; not those made before this thread saw it
                    # come (the start's console: the run's first beat, an early one for a NaN, was dropped so).
                    console = self._turn(console)
                    since = console.came if console is not None else time.monotonic()
                if console is None or (name == Event.ALIVE and made < since):
                    continue
                if not console.write(2, line):
                    self.consoles.lost(console, "its events' pipe closed")
        finally:
            if console is not None:
                console.leave()

    def position(self):
        """The log's size now (the message `position`): a launcher back from away knows when it has caught up."""
        emit(Event.POSITION, log_bytes=self.consoles.log_bytes())

    def tick(self):
        """An `alive` beat every alive_interval, and one at once when a rank's loss went non-finite (its record says
        so: a read of each rank's record every NONFINITE_LOOK_S, with the watch on), so that the launcher can say it,
        and stop the run, within a look of the step rather than a beat."""
        interval, bad = self.request["alive_interval"], set()
        due = time.monotonic() + interval
        while not self.done.wait(min(interval, bounds.NONFINITE_LOOK_S)):
            now = time.monotonic()
            if now < due:
                if not (self.request["watch"] and went_nonfinite(self.run_dir, bad)):
                    continue
                trace.note("a rank's loss went non-finite: a beat now, not in %.1f s", due - now)
            due = now + interval
            if queued_events() < bounds.QUEUED_BEATS_MAX:
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
            from launcher.node.agent.sampler import Sampler

            self.steps = Sampler(self.run_dir, self.request["mark"], self.request["top"])
        found = rank_processes(self.request["mark"])
        self.steps.find(found)
        self.steps.read()
        ranks = []
        for pid, start, rank, local_rank, _ in found[0]:
            state, _, cpu = proc_state(pid)
            seen = last_line.get(local_rank)
            ranks.append(
                dict(
                    {
                        "rank": rank,
                        "local_rank": local_rank,
                        "pid": pid,
                        "state": state,
                        "cpu_s": cpu,
                        "quiet_s": None if seen is None else round(now - seen, 3),
                    },
                    **self.steps.fields(pid, start, now),
                )
            )
        return ranks

    def stacks(self):
        """Every worker's stack on this node, as the `stacks` event (the launcher's `stacks` message)."""
        emit_parts(
            Event.STACKS,
            int(self.request["event_chunk"]),
            workers=collect(self.run_dir, self.request["mark"], self.request["stacks_wait_s"]),
            nccl=self.new_dumps(),
        )

    def new_dumps(self):
        return nccl_dumps(self.run_dir, self.request["nccl_max_bytes"], self.nccl_sent)

    def dumps(self):
        """NCCL's flight recorder asked to dump through torch's pipes (the launcher's `dumps` message: a hang it found
        before NCCL's watchdog did), as the `nccl` event, sent even when nothing came: the launcher waits for it."""
        asked = ask_dumps(self.run_dir, self.request["nccl_dump_wait_s"])
        emit_parts(Event.NCCL, int(self.request["event_chunk"]), nccl=self.new_dumps(), asked=asked)

    def send_nccl(self):
        """NCCL's flight recorder dumps written while the run ended (its watchdog's timeout ends a run by itself)."""
        dumps = self.new_dumps()
        if dumps:
            emit_parts(Event.NCCL, int(self.request["event_chunk"]), nccl=dumps)

    def supervise(self):
        """Until torchrun ends: obey stop messages and the heartbeat bound. It waits on `messages.changed` (a message,
        torchrun's end through a waiting thread) rather than polling, so its end is seen at once."""
        request, messages = self.request, self.messages
        stopping, stop_at = None, None

        def wait_torchrun():
            self.proc.wait()
            messages.changed.set()

        threading.Thread(target=wait_torchrun, daemon=True, name="wait").start()
        while True:
            messages.changed.clear()  # before looking: a change after the look ends the wait below
            if self.proc.poll() is not None:
                break
            self.consoles.note_silence(time.monotonic())
            bound = request["heartbeat_timeout"]  # None: no bound, the run goes on without a launcher
            quiet_for = time.monotonic() - messages.last_message
            if messages.stop_message is None and bound is not None and quiet_for > bound:
                messages.stop_message = HEARTBEAT_TIMEOUT
            if messages.stop_message is not None and stopping is None:
                stopping, stop_at = messages.stop_message, time.monotonic()
                record_stopped_by(self.run_dir, messages.stopped_by)
                trace.note(
                    "stopping (%s): TERM to the run's processes, KILL after %g s",
                    stopping,
                    0 if stopping == KILL else request["grace"],
                )
                threading.Thread(
                    target=stop_run,
                    daemon=True,
                    args=(self.run_dir, request["mark"], 0 if stopping == KILL else request["grace"]),
                ).start()
                emit(Event.STOPPING, reason=stopping)
            if stopping is not None and messages.stop_message == KILL:
                signal_run(self.run_dir, request["mark"], signal.SIGKILL)
            # The heartbeat bound is a clock, not an event: woken at its deadline (at least each check_s, as beats move
            # it); KILL is sent again each poll_s.
            silent_for = timing("check_s") if bound is None else bound - (time.monotonic() - messages.last_message)
            messages.changed.wait(
                timing("poll_s") if stopping is not None else max(0.0, min(silent_for, timing("check_s")))
            )
        # A stop already gave TERM: its workers get what is left of the grace period, not a second one.
        grace = request["grace"] if stop_at is None else max(0.0, stop_at + request["grace"] - time.monotonic())
        killed = self.messages.stop_message == KILL  # a `kill` after a `stop` (a second Ctrl-C) ends the grace too
        code, left = finish(self.proc, self.run_dir, request["mark"], 0 if killed else grace)
        trace.note("torchrun ended: exit code %s, %d process(es) left, stop %s", code, left, stopping)
        self.end()
        return code, left, stopping


def supervise_run(request, run_dir, proc, messages):
    """Stream the log to the run's consoles, obey their messages, stop the run when no launcher has sent a message for
    the heartbeat bound, sweep, keep the end in the run directory, report the exit."""
    queue_events()
    trace.to(run_dir)
    trace.note(
        "torchrun started: pid %d; the run's supervisor is this process (%s)",
        proc.pid,
        "it outlives its console" if messages.reattach else "it ends with its srun step",
    )
    run = Attended(request, run_dir, proc, messages)
    run.consoles = Consoles(
        run_dir, request, messages, Console((0, 1, EVENT_OUT), request.get("owner"), 0, who=request.get("who"))
    )
    run.consoles.wake = run.wake
    messages.on_stacks, messages.on_dumps, messages.on_position = run.stacks, run.dumps, run.position
    # A closed terminal's SIGHUP reaches no SSH session's command; under SLURM it means the step is going.
    signal.signal(signal.SIGHUP, signal.SIG_IGN if messages.reattach else lambda *_: messages.stop(LAUNCHER_GONE))
    signal.signal(signal.SIGTERM, lambda *_: messages.stop(STOP))
    threads = {
        name: threading.Thread(target=getattr(run, name), daemon=True, name=name)
        for name in ("stream", "send_events", "tick")
    }
    for thread in threads.values():
        thread.start()
    run.consoles.serve()
    code, left, stopping = run.supervise()
    if stopping is None and stop_recorded(run_dir):
        stopping = STOPPED_ELSEWHERE  # no message of this launcher's: a stop from another terminal ended it
    merger = getattr(proc, "merger", None)
    ended = {
        "code": code,
        "left": left,
        "reason": stopping,
        "workers": None if merger is None else merger.workers_started,
    }
    record(os.path.join(run_dir, END_RECORD), json.dumps(ended))  # what a launcher that comes later is told
    if stopping:
        emit(Event.STOPPED, left=left, reason=stopping)
    # The log goes out whole while a launcher takes it; one that stopped reading gets no more wait, and with none
    # there the next one replays the end from the run directory (launcher/node/agent/attach.py).
    while (
        threads["stream"].is_alive()
        and run.consoles.current is not None
        and time.monotonic() - run.streamed_at < (request["heartbeat_timeout"] or bounds.UNREAD_END_S)
    ):
        threads["stream"].join(timing("wait_s"))
    run.send_nccl()
    emit(Event.EXITED, **ended)
    end_events()
    threads["send_events"].join(bounds.EVENTS_DRAIN_S)
    run.consoles.close()
    return code
