"""Each rank's progress record as the agent reads it (stdlib only, Python 3.8+): the line the worker's own hook
(launcher/node/worker/hook.py) rewrites in `<run dir>/progress/<pid>`, read once a look, and what the recent ones say:
steps and batches per second, the share of each step spent in the forward and waiting for data, and the training
loss (the last value, the window's mean, the first value that was not finite).

The record's times are the node's monotonic clock, the agent's too: a rate counts from the steps' own times, not
from when the agent happened to look.
"""

import json
import math
import os

from launcher.node.common import bounds
from launcher.node.worker.hook import COLLECTIVES_DIR, PHASES_DIR, PROGRESS_DIR, VERSION

NUMBERS = (
    "t",
    "steps",
    "t_step",
    "batches",
    "t_batch",
    "forward_s",
    "data_s",
    "loss_step",
    "loss",
    "loss_sum",
    "loss_n",
    "bad_step",
    "bad",
    "good_step",
    "good",
    "skipped",
)
COUNTS = ("steps", "batches", "loss_step", "loss_n", "bad_step", "good_step", "skipped")
GROWING = ("t", "steps", "t_step", "batches", "t_batch", "forward_s", "data_s", "loss_step", "loss_n", "skipped")
"""The numbers that never go down in one process's records (a loss may, and may be nan)."""
NO_RECORD = {
    "steps": None,
    "batches": None,
    "steps_per_s": None,
    "batches_per_s": None,
    "forward_share": None,
    "data_share": None,
    "record": None,
    "loss": None,
    "loss_step": None,
    "loss_mean": None,
    "nonfinite": None,
    "loss_skipped": None,
    "loss_state": None,
    "loss_why": None,
}
"""A rank's fields when it has no record (the program never imported torch.optim nor a DataLoader)."""


def parse_record(data):
    """A record as a dict (start, on, why, loss_state and NUMBERS), or None when it is not one whole record."""
    if not data.endswith(b"\n"):
        return None
    count = len(NUMBERS) + 4  # the version, START, on|off, the numbers, LOSS_STATE
    parts = data.split(None, count)
    if len(parts) < count or parts[0] != VERSION or parts[2] not in (b"on", b"off"):
        return None
    try:
        found = {name: (int if name in COUNTS else float)(parts[3 + i]) for i, name in enumerate(NUMBERS)}
        found["start"] = int(parts[1])
    except ValueError:
        return None
    found["on"] = parts[2] == b"on"
    found["loss_state"] = parts[count - 1].decode("ascii", "replace")
    found["why"] = parts[count].decode("utf-8", "replace").strip() if len(parts) > count else ""
    return found


def json_float(value):
    """A float as JSON has it: itself when finite, else "nan", "inf" or "-inf"."""
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def loss_fields(first, last):
    """A rank's loss fields from its window's first and last records (launcher/node/worker/hook.py's values)."""
    on = last["loss_step"] > 0
    if first is last:
        moved, summed = last["loss_n"], last["loss_sum"]
    else:
        moved, summed = last["loss_n"] - first["loss_n"], last["loss_sum"] - first["loss_sum"]
    nonfinite = None
    if last["bad_step"]:
        nonfinite = {
            "step": last["bad_step"],
            "value": json_float(last["bad"]),
            "last_finite": last["good"] if last["good_step"] else None,
            "last_finite_step": last["good_step"] or None,
        }
    return {
        "loss": json_float(last["loss"]) if on else None,
        "loss_step": last["loss_step"] if on else None,
        "loss_mean": summed / moved if moved > 0 else None,
        "nonfinite": nonfinite,
        "loss_skipped": last["skipped"],
        "loss_state": last["loss_state"],
        "loss_why": (last["why"] or None) if last["on"] else None,
    }


def window_rate(moves, now, since=None, slack=0.0):
    """Counts per second over a window of (time, count) moves: between the first and the last move, or until now once
    the count has been still (since `since`, by default the last move) for longer than two of its steps and `slack`
    (a rank that stopped goes to 0). None: under two moves."""
    if len(moves) < 2:
        return None
    (t0, s0), (t1, s1) = moves[0], moves[-1]
    if t1 <= t0 or s1 <= s0:
        return None
    steps = s1 - s0
    if now - (t1 if since is None else since) > 2 * (t1 - t0) / steps + slack:
        return steps / (now - t0)
    return steps / (t1 - t0)


def went_nonfinite(run_dir, told, pids=None):
    """The records that newly say their loss went non-finite, as [(pid, record)] (each pid added to `told`): one read
    of each rank's record, some microseconds a rank. `pids`: the records to read (`record_pids`, where the caller
    listed them already)."""
    found = []
    for pid in record_pids(run_dir) if pids is None else pids:
        if pid in told:
            continue
        try:
            with open(record_path(run_dir, pid), "rb") as handle:
                record = parse_record(handle.read(bounds.RECORD_BYTES))
        except OSError:
            continue
        if record is not None and record["bad_step"]:
            told.add(pid)
            found.append((pid, record))
    return found


def record_pids(run_dir):
    """The pids of the workers that wrote a progress record (a listing of the run's records folder)."""
    try:
        return {int(name) for name in os.listdir(os.path.join(run_dir, PROGRESS_DIR)) if name.isdigit()}
    except OSError:
        return set()


def record_path(run_dir, pid):
    return os.path.join(run_dir, PROGRESS_DIR, str(pid))


class RankRecord:
    """One rank's records as read so far, those of the last `window_s` kept (always the last one)."""

    def __init__(self, start, window_s):
        self.start, self.window_s = start, window_s
        self.samples = []

    def read(self, path, now):
        try:
            with open(path, "rb") as handle:
                data = handle.read(bounds.RECORD_BYTES)
        except OSError:
            return
        self.add(parse_record(data), now)

    def add(self, record, now):
        """A record read at `now`: kept when it is this process's (its start time) and goes on from the last one
        (a read that met a write half done can only look older, and is dropped)."""
        if record is None or record["start"] not in (self.start, -1):
            return
        last = self.samples[-1] if self.samples else None
        if last is not None and (record["t"] <= last["t"] or any(record[n] < last[n] for n in GROWING)):
            return
        self.samples.append(record)
        self.samples = [s for s in self.samples if now - s["t"] <= self.window_s] or [record]

    def fields(self, now):
        """steps, batches, their rates, forward_share, data_share, record ("on", "off: why"; None: no record), and the
        loss: loss (the last value: a float, or "nan", "inf", "-inf"), loss_step, loss_mean (of the finite values of
        the window's steps; with one record, of all), nonfinite (the first value that was not finite: step, value,
        last_finite, last_finite_step), loss_skipped (GradScaler's skipped steps), loss_state (on, none, grad,
        device, off) and loss_why."""
        if not self.samples:
            return dict(NO_RECORD)
        last = self.samples[-1]
        if not last["on"]:
            return dict(NO_RECORD, record="off: %s" % (last["why"] or "no reason given"))
        first, span = self.samples[0], last["t"] - self.samples[0]["t"]
        found = {
            "steps": last["steps"],
            "batches": last["batches"],
            "record": "on",
            "forward_share": None if span <= 0 else _share(last["forward_s"] - first["forward_s"], span),
            "data_share": None if span <= 0 else _share(last["data_s"] - first["data_s"], span),
            **loss_fields(first, last),
        }
        for count, when, rate in (("steps", "t_step", "steps_per_s"), ("batches", "t_batch", "batches_per_s")):
            moves = []
            for sample in self.samples:  # a count of 0 has no time yet
                if sample[count] > (moves[-1][1] if moves else 0):
                    moves.append((sample[when], sample[count]))
            # Still only once no record came for two steps and a flush interval: a record is written at most that
            # often, so its last count may be that old while the rank goes on.
            value = window_rate(moves, now, last["t"], bounds.RECORD_FLUSH_S)
            found[rate] = None if value is None else round(value, 3)
        return found


def first_step_at(run_dir, pid):
    """When a rank's first optimizer step ended (the hook's `step` phase line, wall clock); None before it has."""
    try:
        with open(os.path.join(run_dir, PHASES_DIR, str(pid)), "rb") as handle:
            for line in handle:
                if line.startswith(b"step "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def read_collectives(run_dir, pid, start):
    """A rank's collectives file (launcher/node/worker/collectives.py) as a dict; None when there is none yet, or it is
    another process's (a pid used again), or not one whole JSON object."""
    try:
        with open(os.path.join(run_dir, COLLECTIVES_DIR, str(pid)), "rb") as handle:
            data = json.loads(handle.read(bounds.COLLECTIVES_MAX_BYTES).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("start") not in (start, -1):
        return None
    return data


class RankCollectives:
    """One rank's collectives as one reader (a beat's, a live view's) passes them on: each arrival once."""

    def __init__(self):
        self.sent = {}  # process group -> the newest collective whose arrival was passed on

    def fields(self, data, wall):
        """`collectives`: source (torch's recorder the figures come from; None: none), age_s (since the rank's
        thread last read them), groups ({group: desc, size, enqueued, started, completed, in_flight}), the
        arrivals not passed on before ({group: [[seq, name, wall seconds], ...]}), why (reading stopped); None
        without a file."""
        if data is None:
            return None
        arrivals = {}
        for group, rows in (data.get("arrivals") or {}).items():
            sent = self.sent.get(group)
            new = [row for row in rows if isinstance(row, list) and len(row) == 3 and (sent is None or row[0] > sent)]
            if new:
                arrivals[group] = new
                self.sent[group] = new[-1][0]
        written = data.get("wall")
        return {
            "source": data.get("source") or None,
            "groups": data.get("groups") or {},
            "arrivals": arrivals,
            "age_s": round(max(0.0, wall - written), 1) if isinstance(written, (int, float)) else None,
            "why": data.get("why") or None,
        }


def _share(seconds, span):
    return round(min(1.0, max(0.0, seconds / span)), 3)
