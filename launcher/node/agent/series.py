"""A run's time series on one node (stdlib only, Python 3.8+): what `inv top` reads, kept by the run's supervisor (the
attached agent, or a detached run's daemon) for the run's page: every `interval_s` one JSON line appended to
`<run dir>/series`, bounded for a run of days (past `max_samples`, every other line goes and the interval doubles).

A line: {"t": wall seconds, "load1", "mem_total", "mem_used" (bytes), "ranks": {global rank: [CPU seconds of its own
process, its resident bytes, steps, batches, data_s, forward_s, t_step, loss_sum, loss_n, loss]}, "gpus": [[index, util
%, used bytes, total bytes], ...] or absent}. Counts and seconds are totals as the rank's progress record has them (null
without one); t_step is its last step's wall time (null before its first): the page takes a rank's steps/s from its
steps' own times, not from when a sample happened to look. loss_sum and loss_n are the sum and count of its finite
per-step losses (a stretch's mean loss is Δloss_sum/Δloss_n), loss its last step's value (a number, "nan", "inf" or
"-inf"; null before its first); an older node's lines end at t_step. A rank's process that started again (a restart)
starts its totals again. The first sample is taken as soon as the ranks are up (a look every `look_s` until then), the
last once torchrun ended: a rank whose process ended keeps its record's last numbers and the CPU time it had at the last
glance (one every `look_s` between samples; its memory null), so a run shorter than one interval still has its steps and
CPU from start to end.

It only reads (/proc, the ranks' records), as `inv top` does; nothing here runs in a worker.
"""

import json
import os
import threading
import time

from launcher.node.agent.records import json_float, parse_record, record_path
from launcher.node.common import bounds
from launcher.node.common.proc import rank_processes

SERIES_FILE = "series"


def read_record(run_dir, pid, start):
    """A rank's progress record (records.parse_record's dict) when it is this process's, else None."""
    try:
        with open(record_path(run_dir, pid), "rb") as handle:
            record = parse_record(handle.read(bounds.RECORD_BYTES))
    except OSError:
        return None
    if record is None or record["start"] not in (start, -1) or not record["on"]:
        return None
    return record


def numbers_of(record, to_wall):
    """A sample's numbers of a rank from its record: steps, batches, data_s, forward_s, its last step's wall time,
    loss_sum, loss_n and its last loss."""
    if record is None:
        return [None] * 8
    last = round(record["t_step"] + to_wall, 3) if record["steps"] else None
    loss = json_float(record["loss"]) if record["loss_step"] else None
    return [
        record["steps"],
        record["batches"],
        round(record["data_s"], 3),
        round(record["forward_s"], 3),
        last,
        record["loss_sum"],
        record["loss_n"],
        loss,
    ]


class Series:
    """The node's samples, taken on a thread of their own until `close`."""

    def __init__(self, run_dir, mark, settings, gpus=None):
        self.run_dir, self.mark = run_dir, mark
        self.path = os.path.join(run_dir, SERIES_FILE)
        self.interval = float(settings["interval_s"])
        self.look = min(self.interval, float(settings.get("look_s") or self.interval))  # an older launcher: none
        self.seen = {}  # rank -> (pid, start time) of its newest process: one that ended is read from its record
        self.cpu = {}  # rank -> its process's CPU seconds at the last look: what it had used when it ended
        self.max_samples = int(settings["max_samples"])
        self.count = 0
        self.gpus = gpus  # a launcher.node.common.gpus.GpuWatch on a GPU node, else None
        self.stopped = threading.Event()
        self.lock = threading.Lock()  # a sample and `close`'s last one never interleave
        self.thread = None

    def start(self):
        self.thread = threading.Thread(target=self._loop, daemon=True, name="series")
        self.thread.start()
        return self

    def _loop(self):
        # Until the ranks are up, a look every `look` seconds, sampling the moment they are: the workers' start.
        while not self.seen and not self.stopped.wait(self.look):
            self.sample(ranks_only=True)
        # Then a sample every interval, and between two a glance at each rank's CPU time (one read of its stat): the
        # last sample, taken once torchrun ended, has the CPU its ranks had used by their end.
        due = time.monotonic() + self.interval
        while not self.stopped.wait(max(0.0, min(self.look, due - time.monotonic()))):
            if time.monotonic() < due:
                self.glance()
                continue
            self.sample()
            due = time.monotonic() + self.interval

    def glance(self):
        from launcher.node.agent.stackdump import proc_state
        from launcher.node.common.proc import start_time

        with self.lock:
            try:
                for rank, (pid, start) in list(self.seen.items()):
                    cpu = proc_state(pid)[2]
                    if cpu is not None and start_time(pid) == start:  # still that process, not a pid used again
                        self.cpu[rank] = cpu
            except Exception:
                pass

    def close(self):
        """The last sample (the ranks as they ended), and no more."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(bounds.SERIES_JOIN_S)
        self.sample()
        if self.gpus is not None:
            self.gpus.close()

    def sample(self, ranks_only=False):
        """One line appended (`ranks_only`: only once a rank is up); best effort: a full disk costs the page its
        picture, never the run."""
        with self.lock:
            try:
                taken = self.taken()
                if ranks_only and not taken["ranks"]:
                    return
                line = json.dumps(taken, separators=(",", ":"))
                with open(self.path, "a") as handle:
                    handle.write(line + "\n")
                self.count += 1
                if self.count > self.max_samples:
                    self.thin()
            except Exception:
                pass

    def taken(self):
        from launcher.node.agent.sampler import memory, rss_bytes
        from launcher.node.agent.stackdump import proc_state

        found, _ = rank_processes(self.mark)
        to_wall = time.time() - time.monotonic()  # the records' times are the node's monotonic clock
        ranks = {}
        for pid, start, rank, _, _ in found:
            if self.seen.get(rank) != (pid, start):
                self.seen[rank] = (pid, start)
                self.cpu.pop(rank, None)  # a process that started again: its CPU time starts again
            cpu = proc_state(pid)[2]
            if cpu is not None:
                self.cpu[rank] = cpu
            ranks[str(rank)] = [
                None if cpu is None else round(cpu, 2),
                rss_bytes(pid),
                *numbers_of(read_record(self.run_dir, pid, start), to_wall),
            ]
        for rank, (pid, start) in self.seen.items():  # ended (or between restarts): its last look and record
            if str(rank) not in ranks:
                cpu = self.cpu.get(rank)
                ranks[str(rank)] = [
                    None if cpu is None else round(cpu, 2),
                    None,
                    *numbers_of(read_record(self.run_dir, pid, start), to_wall),
                ]
        total, available = memory()
        sample = {
            "t": round(time.time(), 2),
            "load1": round(os.getloadavg()[0], 2),
            "mem_total": total,
            "mem_used": None if total is None or available is None else total - available,
            "ranks": ranks,
        }
        if self.gpus is not None:
            view = self.gpus.view({pid: rank for pid, _, rank, _, _ in found}, None)
            sample["gpus"] = [
                [g["index"], g["util_percent"], g["mem_used_bytes"], g["mem_total_bytes"]]
                for g in view.get("gpus") or []
            ]
        return sample

    def thin(self):
        """Every other sample kept, the interval doubled: the file's size stays bounded whatever the run's length."""
        with open(self.path) as handle:
            lines = handle.readlines()
        kept = lines[::2] if lines[-1] in lines[::2] else lines[::2] + lines[-1:]
        tmp = self.path + ".tmp"
        with open(tmp, "w") as handle:
            handle.writelines(kept)
        os.replace(tmp, self.path)
        self.count = len(kept)
        self.interval *= 2


def start_series(request, run_dir):
    """The run's series on this node, sampling (None when the request asks for none: an older launcher's)."""
    settings = request.get("series")
    if not settings:
        return None
    gpus = None
    top = request.get("top") or {}
    from launcher.node.agent.recorder import has_gpu

    if has_gpu() and top.get("gpu_timeout_s"):
        from launcher.node.common.gpus import GpuWatch

        gpus = GpuWatch(top["gpu_timeout_s"], max(float(settings["interval_s"]), float(top["gpu_refresh_s"])))
    return Series(run_dir, request["mark"], settings, gpus).start()


def read_series(run_dir, max_bytes):
    """The node's samples as a list of dicts (the last `max_bytes` of the file: whole lines only)."""
    path = os.path.join(run_dir, SERIES_FILE)
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return []
    lines = data.splitlines()
    if size > max_bytes:
        lines = lines[1:]  # the first may be cut
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return found
