"""What `inv top` sees of a run on one node (stdlib only, Python 3.8+): /proc for each rank's state, CPU and memory,
and its helpers' (DataLoader and compile workers, `proc.rank_processes`); its own files (torchrun --redirects:
<ranks>/*/attempt_<restart>/<local rank>/stdout.log and stderr.log) for its last line, when it last wrote, and its
progress lines; its progress record (launcher/node/agent/records.py, kept by the workers' hook); the node's load, memory
and, where nvidia-smi is, the run's GPUs, each with the ranks on it (launcher/node/common/gpus.py `GpuWatch`: nvidia-smi
asked in the background, never on a snapshot's path; a snapshot says how old its answer is). The agent only reads:
watching cannot slow the run.

Steps per second come from the record where it counts optimizer steps; else from the rank's own lines: the job's
regular expression (`job.progress`), whose group `step` (else its first group that matched) is the step number. A
step lower than the last one is a new count (a new epoch that counts from 0 or 1): the rank's progress goes on from
there, so its rate stays steps per second across epochs.

A look of its own (`inv top --once`, `settle`) ends early where watching could add nothing but CPU time: no rank has
written output for twice the look, nor a progress record within the rate window (a hung run), so no rate could come.
"""

import glob
import os
import re
import time

from launcher.node.agent.records import (
    NO_RECORD,
    RankCollectives,
    RankRecord,
    first_step_at,
    read_collectives,
    record_path,
    window_rate,
)
from launcher.node.agent.stackdump import STATES, proc_state
from launcher.node.common.gpus import VISIBLE, GpuWatch
from launcher.node.common.proc import environ_of, marked_processes, rank_processes

PAGE = os.sysconf("SC_PAGE_SIZE")


class RankProgress:
    """One rank's output as read so far: the last line, the step count, and when the count last moved."""

    def __init__(self, pattern, window_s):
        self.pattern, self.window_s = pattern, window_s
        self.offsets = {}  # path -> bytes read
        self.rest = {}  # path -> an unfinished line
        self.last_line, self.last_step, self.total = None, None, 0
        self.first_step = None  # the first step its lines named: where a resumed run started again
        self.moves = []  # (monotonic time, total) each time the count moved, within window_s
        self.lines = []  # the last lines, for `follow`

    def read(self, paths, tail_bytes, keep_lines, now):
        for path in paths:
            try:
                size = os.path.getsize(path)
                with open(path, "rb") as handle:
                    start = self.offsets.get(path)
                    history = start is None  # what was written before we looked: its steps have no times
                    start = max(0, size - tail_bytes) if history else start
                    if size <= start:
                        continue
                    handle.seek(start)
                    data = handle.read(size - start)
            except OSError:
                continue
            self.offsets[path] = start + len(data)
            self.feed(data.decode("utf-8", "replace"), path, keep_lines, now, history)

    def feed(self, text, path, keep_lines, now, history=False):
        lines = re.split(r"[\r\n]", self.rest.pop(path, "") + text)
        self.rest[path] = lines.pop()  # what follows the last end of line: a line still being written
        lines = [line.rstrip() for line in lines if line.strip()]
        if lines:
            self.last_line = lines[-1]
            self.lines = (self.lines + lines)[-keep_lines:]
        before = self.total
        for line in lines:
            found = self.pattern.search(line)
            if found is None:
                continue
            groups = found.groupdict()
            value = groups.get("step") or next((g for g in found.groups() if g is not None), None)
            if value is None or not value.isdigit():
                continue
            step = int(value)
            if self.first_step is None:
                self.first_step = step
            if self.last_step is None or history:
                self.last_step = step  # a step seen before we looked: where the count starts, no move yet
                continue
            if step != self.last_step:
                # Lower than the last: a new count (an epoch from 0 or 1); its first step is one step on.
                self.total += step - self.last_step if step > self.last_step else max(step, 1)
                self.last_step = step
        if self.total != before:  # one move a read: the lines read together were all there by `now`
            self.moves.append((now, self.total))
        self.moves = [m for m in self.moves if now - m[0] <= self.window_s]

    def rate(self, now):
        """Steps per second over the window (`records.window_rate`). None: under two moves."""
        return window_rate(self.moves, now)


def rank_files(ranks_dir, local_rank, restart):
    """The worker's stdout.log and stderr.log of its attempt (the latest attempt when its restart is unknown)."""
    attempt = "attempt_%d" % restart if restart is not None else "attempt_*"
    found = sorted(glob.glob(os.path.join(ranks_dir, "*", attempt, str(local_rank), "std*.log")))
    if restart is None and found:
        latest = max(os.path.dirname(p) for p in found)
        found = [p for p in found if os.path.dirname(p) == latest]
    return found


def memory():
    """(total, available) bytes from /proc/meminfo."""
    values = {}
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                name, _, rest = line.partition(":")
                if name in ("MemTotal", "MemAvailable"):
                    values[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return values.get("MemTotal"), values.get("MemAvailable")


def rss_bytes(pid):
    try:
        with open("/proc/%d/statm" % pid) as handle:
            return int(handle.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None


class Sampler:
    """Every worker of the run on this node, sampled again and again by one agent: `read` often (new output),
    `snapshot` once an interval (workers found again, CPU since the last snapshot, the node's figures)."""

    def __init__(self, run_dir, mark, settings):
        self.run_dir, self.mark, self.settings = run_dir, mark, settings
        self.ranks_dir = os.path.join(run_dir, settings["ranks"])
        self.pattern = re.compile(settings["progress"])
        self.progress = {}  # (pid, start) -> RankProgress
        self.records = {}  # (pid, start) -> RankRecord
        self.collectives = {}  # (pid, start) -> RankCollectives
        self.files = {}  # (pid, start) -> its files
        self.first_steps = {}  # (pid, start) -> when its first optimizer step ended, once it has
        self.cpu = {}  # pid -> (monotonic time, CPU seconds) at the last snapshot
        self.found = []  # the ranks' own processes as last found
        self.helpers = []  # their helpers (proc.rank_processes)
        self.follow = None  # the global rank whose last lines each snapshot carries
        self.gpus = None  # a GpuWatch while the view wants GPUs (`watch`)

    def find(self, found=None):
        """The run's ranks now (or as the caller just found them: `rank_processes`' pair), each with its progress
        and files."""
        self.found, self.helpers = rank_processes(self.mark) if found is None else found
        live = {(pid, start) for pid, start, _, _, _ in self.found}
        for key in [k for k in self.progress if k not in live]:  # a worker that ended (a restart): forget it
            del self.progress[key]
            self.records.pop(key, None)
            self.first_steps.pop(key, None)
            self.collectives.pop(key, None)
            self.files.pop(key, None)
        for pid, start, _, local_rank, restart in self.found:
            key = (pid, start)
            if key not in self.progress:
                self.progress[key] = RankProgress(self.pattern, self.settings["rate_window_s"])
                self.records[key] = RankRecord(start, self.settings["rate_window_s"])
                self.collectives[key] = RankCollectives()
            if not self.files.get(key):
                self.files[key] = rank_files(self.ranks_dir, local_rank, restart)

    def resend(self):
        """Each rank's kept arrivals passed on again by the next snapshot (the one before was not sent)."""
        self.collectives = {key: RankCollectives() for key in self.collectives}

    def fields(self, pid, start, now):
        """A rank's progress: steps, batches, their rates, forward and data shares from its record (the hook's);
        steps per second from its lines where the record has no step; the last step its lines named (`step`); its
        collectives (`RankCollectives.fields`)."""
        record = self.records.get((pid, start))
        if record is None:
            found = dict(NO_RECORD)
        else:
            record.read(record_path(self.run_dir, pid), now)
            found = record.fields(now)
        lines = self.progress.get((pid, start))
        if not found["steps"]:
            rate = None if lines is None else lines.rate(now)
            found["steps_per_s"] = None if rate is None else round(rate, 3)
        found["step"] = None if lines is None else lines.last_step  # the program's own (a resumed run's goes on)
        found["first_step"] = None if lines is None else lines.first_step
        if (pid, start) not in self.first_steps:  # read until it is there: one small file, a few times
            at = first_step_at(self.run_dir, pid)
            if at is not None:
                self.first_steps[(pid, start)] = at
        found["first_step_at"] = self.first_steps.get((pid, start))
        reader = self.collectives.get((pid, start))
        found["collectives"] = (
            None if reader is None else reader.fields(read_collectives(self.run_dir, pid, start), time.time())
        )
        return found

    def read(self):
        now = time.monotonic()
        for key, paths in self.files.items():
            self.progress[key].read(paths, int(self.settings["tail_bytes"]), int(self.settings["keep_lines"]), now)

    def still(self, still_s):
        """Whether no rank can show a rate for watching longer (`settle`): each rank's output files are older than
        `still_s`, and its progress record, where it has one, older than the rate window. Lines written before the
        look have no times, so a rank still for twice the look could bring one timed line at most, and a rate needs
        two; a record's counts carry their own times, so one more step would give a rate until the last one leaves
        the window. A rank that writes neither has nothing to time. No rank found yet: they may be starting."""
        if not self.found:
            return False
        wall, now = time.time(), time.monotonic()
        for pid, start, _, _, _ in self.found:
            for path in self.files.get((pid, start), []):
                try:
                    if wall - os.path.getmtime(path) < still_s:
                        return False
                except OSError:
                    pass
            record = self.records.get((pid, start))
            if record is None:
                continue
            record.read(record_path(self.run_dir, pid), now)  # kept: the snapshot's rate has it too
            if record.samples and now - record.samples[-1]["t"] < self.settings["rate_window_s"]:
                return False
        return True

    def cpu_now(self, pid, now):
        """(state, CPU seconds, CPU % since the last snapshot) of a process."""
        state, _, cpu = proc_state(pid)
        before = self.cpu.get(pid)
        self.cpu[pid] = (now, cpu)
        percent = None
        if before is not None and cpu is not None and before[1] is not None and now > before[0]:
            percent = round(100.0 * (cpu - before[1]) / (now - before[0]), 1)
        return state, cpu, percent

    def helper_rows(self, owner, now):
        rows = []
        for pid, start, _, parent, of in self.helpers:
            if of == owner:
                state, cpu, percent = self.cpu_now(pid, now)
                rows.append(
                    {
                        "pid": pid,
                        "start": start,
                        "parent": parent,
                        "state": state,
                        "cpu_s": cpu,
                        "cpu_percent": percent,
                        "rss_bytes": rss_bytes(pid),
                    }
                )
        return rows

    def snapshot(self, found=None):
        self.find(found)
        self.read()
        now, wall = time.monotonic(), time.time()
        ranks = []
        for pid, start, rank, local_rank, _ in self.found:
            progress = self.progress[(pid, start)]
            state, cpu, cpu_percent = self.cpu_now(pid, now)
            written = [os.path.getmtime(p) for p in self.files.get((pid, start), []) if os.path.exists(p)]
            ranks.append(
                dict(
                    {
                        "rank": rank,
                        "local_rank": local_rank,
                        "pid": pid,
                        "state": state,
                        "state_name": STATES.get(state, state),
                        "cpu_percent": cpu_percent,
                        "cpu_s": cpu,
                        "rss_bytes": rss_bytes(pid),
                        "last_output_s": round(max(0.0, wall - max(written)), 1) if written else None,
                        "last_line": progress.last_line,
                        "step": progress.last_step,
                        "helpers": self.helper_rows(pid, now),
                        "tail": progress.lines if rank == self.follow else None,
                    },
                    **self.fields(pid, start, now),
                )
            )
        seen = {w[0] for w in self.found} | {h[0] for h in self.helpers}
        self.cpu = {pid: value for pid, value in self.cpu.items() if pid in seen}
        total, available = memory()
        return dict(
            {
                "load1": round(os.getloadavg()[0], 2),
                "cpus": os.cpu_count(),
                "mem_total_bytes": total,
                "mem_available_bytes": available,
                "ranks": ranks,
            },
            **self.gpu_view(),
        )

    def gpu_view(self):
        """The run's GPUs as the background watch last read them, each with its ranks (their processes' pids)."""
        if self.gpus is None:
            return {"gpus": None}
        ranks = {pid: rank for pid, _, rank, _, _ in self.found}
        ranks.update((pid, rank) for pid, _, rank, _, _ in self.helpers)
        spec = environ_of(self.found[0][0]).get(VISIBLE.encode()) if self.found else None
        return self.gpus.view(ranks, None if spec is None else spec.decode("utf-8", "replace"))


def follow_requests(sampler, ended, live):
    """The launcher's words on stdin: `follow R` (a global rank, or `-` for none); EOF: a live view is gone (a
    look of its own, `count` snapshots, closes stdin as soon as its request is sent)."""
    import sys

    for line in sys.stdin:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "follow":
            sampler.follow = int(parts[1]) if parts[1].isdigit() else None
    if live:
        ended.set()


def settled(sampler, still_s):
    """Whether watching longer can add nothing but CPU time (`settle`, `inv top --once`): no rank can show a rate
    for it (`Sampler.still`: a hung run) and the GPUs, where there are any, have had their first answer."""
    return sampler.still(still_s) and (sampler.gpus is None or sampler.gpus.answered())


def watch(run_dir, mark, settings, emit_line):
    """Snapshots every `interval_s` (output read every `read_s` between them) until `count` were sent, the
    launcher closed stdin, or the run ended (its last snapshot then says so). The number sent."""
    sampler = Sampler(run_dir, mark, settings)
    sampler.follow = settings.get("follow")
    if settings.get("gpus"):
        sampler.gpus = GpuWatch(settings["gpu_timeout_s"], settings["gpu_refresh_s"])
    try:
        return _watch(sampler, settings, emit_line)
    finally:
        if sampler.gpus is not None:
            sampler.gpus.close()


def _watch(sampler, settings, emit_line):
    import threading

    mark = sampler.mark
    ended = threading.Event()
    count = settings.get("count")
    settle = settings.get("settle")
    threading.Thread(target=follow_requests, args=(sampler, ended, count is None), daemon=True, name="follow").start()
    sampler.snapshot()  # the workers, the CPU baseline and the output written before we looked
    sampler.resend()  # ... but the first snapshot sent carries every rank's kept arrivals (`--once` has one)
    sent = 0
    while count is None or sent < count:
        began = time.monotonic()
        due = began + settings["interval_s"]
        while time.monotonic() < due:
            if ended.wait(settings["read_s"]):
                return sent
            sampler.read()
            if settle and time.monotonic() - began >= settle["least_s"] and settled(sampler, settle["still_s"]):
                break
        marked = marked_processes(mark)  # one pass over /proc: whether the run goes on, and its workers
        snapshot = sampler.snapshot(rank_processes(mark, marked))
        snapshot["running"] = bool(marked)
        if not emit_line(snapshot):
            return sent
        sent += 1
        if not marked:
            break
    return sent
