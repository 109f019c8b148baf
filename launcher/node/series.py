"""A run's time series on one node (stdlib only, Python 3.8+): what `inv top` reads, kept by the run's keeper (the
attached agent, or a detached run's daemon) for the run's page: every `interval_s` one JSON line appended to
`<run dir>/series`, bounded for a run of days (past `max_samples`, every other line goes and the interval doubles).

A line: {"t": wall seconds, "load1", "mem_total", "mem_used" (bytes), "ranks": {global rank: [CPU seconds of its own
process, its resident bytes, steps, batches, data_s, forward_s]}, "gpus": [[index, util %, used bytes, total
bytes], ...] or absent}. Counts and seconds are totals as the rank's progress record has them (null without one):
the page takes rates from two samples. A rank's process that started again (a restart) starts its totals again.

It only reads (/proc, the ranks' records), as `inv top` does; nothing here runs in a worker.
"""

import json
import os
import threading
import time

from launcher.node import limits
from launcher.node.proc import rank_processes
from launcher.node.records import parse_record, record_path

SERIES_FILE = "series"


def read_record(run_dir, pid, start):
    """A rank's progress record (records.parse_record's dict) when it is this process's, else None."""
    try:
        with open(record_path(run_dir, pid), "rb") as handle:
            record = parse_record(handle.read(limits.RECORD_BYTES))
    except OSError:
        return None
    if record is None or record["start"] not in (start, -1) or not record["on"]:
        return None
    return record


class Series:
    """The node's samples, taken on a thread of their own until `close`."""

    def __init__(self, run_dir, mark, settings, gpus=None):
        self.run_dir, self.mark = run_dir, mark
        self.path = os.path.join(run_dir, SERIES_FILE)
        self.interval = float(settings["interval_s"])
        self.max_samples = int(settings["max_samples"])
        self.count = 0
        self.gpus = gpus  # a launcher.node.gpus.GpuWatch on a GPU node, else None
        self.stopped = threading.Event()
        self.lock = threading.Lock()  # a sample and `close`'s last one never interleave
        self.thread = None

    def start(self):
        self.thread = threading.Thread(target=self._loop, daemon=True, name="series")
        self.thread.start()
        return self

    def _loop(self):
        while not self.stopped.wait(self.interval):
            self.sample()

    def close(self):
        """The last sample (the ranks as they ended), and no more."""
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(limits.SERIES_JOIN_S)
        self.sample()
        if self.gpus is not None:
            self.gpus.close()

    def sample(self):
        """One line appended; best effort: a full disk costs the page its picture, never the run."""
        with self.lock:
            try:
                line = json.dumps(self.taken(), separators=(",", ":"))
                with open(self.path, "a") as handle:
                    handle.write(line + "\n")
                self.count += 1
                if self.count > self.max_samples:
                    self.thin()
            except Exception:
                pass

    def taken(self):
        from launcher.node.stacks import proc_state
        from launcher.node.top import memory, rss_bytes

        found, _ = rank_processes(self.mark)
        ranks = {}
        for pid, start, rank, _, _ in found:
            cpu = proc_state(pid)[2]
            record = read_record(self.run_dir, pid, start)
            numbers = [None] * 4 if record is None else [record["steps"], record["batches"],
                                                         round(record["data_s"], 3), round(record["forward_s"], 3)]
            ranks[str(rank)] = [None if cpu is None else round(cpu, 2), rss_bytes(pid), *numbers]
        total, available = memory()
        sample = {"t": round(time.time(), 2), "load1": round(os.getloadavg()[0], 2), "mem_total": total,
                  "mem_used": None if total is None or available is None else total - available, "ranks": ranks}
        if self.gpus is not None:
            view = self.gpus.view({pid: rank for pid, _, rank, _, _ in found}, None)
            sample["gpus"] = [[g["index"], g["util_percent"], g["mem_used_bytes"], g["mem_total_bytes"]]
                              for g in view.get("gpus") or []]
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
    from launcher.node.recorder import has_gpu

    if has_gpu() and top.get("gpu_timeout_s"):
        from launcher.node.gpus import GpuWatch

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
