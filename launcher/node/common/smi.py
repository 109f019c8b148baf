"""nvidia-smi, asked within a bound (stdlib only, Python 3.8+): how the doctor's probe and `inv top` read GPUs.

A GPU that fell off the bus, or a driver stuck on one, leaves nvidia-smi in the kernel (D state), where SIGKILL does
not end it, and a child it started may hold its output open long after it. So nothing here waits on it past its
bound: its output goes to an unlinked temporary file (never a pipe, whose end of file a child could hold back), it
runs in a session of its own (a kill reaches its children too), and one that outlives its kill is left to a daemon
thread to reap, never waited for. Several queries start at once and share the bound, and none outlives a failure
of another (no process is left behind).

Its answers are read in nvidia-smi's csv form (`--format=csv,noheader,nounits`): one line per GPU (or per compute
process), `[N/A]` or `[Not Supported]` where a board does not report a field, `[Unknown Error]`, `[GPU is lost]` or
`[GPU requires reset]` where a GPU cannot be read; `-L` lists the GPUs and their MIG devices.
"""

import os
import re
import signal
import threading
import time

from launcher.node.common import bounds
from launcher.node.common.child import which
from launcher.node.wire import error_text

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "mig.mode.current",
    "memory.used",
    "memory.total",
    "utilization.gpu",
)
APP_FIELDS = ("pid", "gpu_uuid", "used_memory")
CSV = "--format=csv,noheader,nounits"
GPU_QUERY = ("--query-gpu=" + ",".join(GPU_FIELDS), CSV)
APP_QUERY = ("--query-compute-apps=" + ",".join(APP_FIELDS), CSV)
LIST_QUERY = ("-L",)
NOT_REPORTED = ("[N/A]", "[Not Supported]", "[Insufficient Permissions]")
"""Cells a healthy board may answer: a field it does not report (utilisation under MIG, a consumer card's fans)."""
_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s+(MIG-[^)\s]+)\)")
_GPU_LINE = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s+(GPU-[^)\s]+)\)")

_stuck = []  # processes killed past their bound that have not ended (a D state): no new call while one is left


def path():
    return which("nvidia-smi", os.environ.get("PATH"))


def timed_out(timeout):
    return "nvidia-smi did not answer in %g s: a GPU stuck in the driver?" % timeout


def still_stuck():
    """Why no new call starts (one killed before has not ended: it is stuck in the driver), or None."""
    _stuck[:] = [(proc, since) for proc, since in _stuck if proc.poll() is None]
    if not _stuck:
        return None
    return "nvidia-smi stuck in the driver for %.0f s (killed, it has not ended): a GPU off the bus?" % (
        time.monotonic() - _stuck[0][1]
    )


class Asked:
    """nvidia-smi queries started together, each its own process, collected within one bound (`collect`)."""

    def __init__(self, exe, queries, timeout):
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.procs = []
        self.late = False  # it ran out of its bound (the probe took that long because of it)
        self.error = still_stuck()
        if self.error is not None:
            return
        # Imported here: a node without nvidia-smi (never asked) spares their 15 ms of CPU at every probe.
        import subprocess
        import tempfile

        try:
            for query in queries:
                out = tempfile.TemporaryFile()
                self.procs.append(
                    (
                        subprocess.Popen(
                            [exe, *query],
                            stdin=subprocess.DEVNULL,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        ),
                        out,
                    )
                )
        except OSError as exc:
            self.error = "nvidia-smi cannot run: %s" % error_text(exc)
            self.stop()

    def collect(self):
        """(answers, None): per query (exit code, its output); or (None, why) when one did not end in time."""
        if self.error is not None:
            return None, self.error
        import subprocess

        for proc, _ in self.procs:
            try:
                proc.wait(max(0.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stop()
                self.late = True
                return None, timed_out(self.timeout)
        answers = []
        for proc, out in self.procs:
            try:
                out.seek(0)
                answers.append((proc.returncode, out.read(bounds.SMI_MAX_BYTES).decode("utf-8", "replace")))
            except ValueError:  # `stop` closed it from another thread (a GpuWatch closed while it asked)
                return None, "stopped"
            out.close()
        return answers, None

    def stop(self):
        """Kill every query still running (its whole session) and forget it: reaped now, or by a daemon thread."""
        import subprocess

        for proc, out in self.procs:
            out.close()
            if proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                proc.wait(bounds.SMI_REAP_S)
            except subprocess.TimeoutExpired:  # in the kernel: it ends when the driver lets it, and is reaped then
                _stuck.append((proc, time.monotonic()))
                threading.Thread(target=proc.wait, daemon=True, name="smi-reaper").start()
        self.procs = []


def ask(queries, timeout):
    """Run the queries within `timeout`: (answers, None) or (None, why); (None, None) where there is no nvidia-smi."""
    exe = path()
    if exe is None:
        return None, None
    return Asked(exe, queries, timeout).collect()


def csv_rows(text, fields):
    """An answer's lines as {field: cell}, and its other lines (an error said among the rows), apart."""
    rows, other = [], []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(fields):
            rows.append({field: cells[i] for i, field in enumerate(fields)})
        elif line.strip():
            other.append(line.strip())
    return rows, other


def number(cell):
    """A cell as a number; None where the board does not report it (or cannot be read)."""
    try:
        return float(cell)
    except (TypeError, ValueError):
        return None


def unreadable(cell):
    """Whether a cell says its GPU cannot be read (`[Unknown Error]`, `[GPU requires reset]`, `[GPU is lost]`)."""
    return cell.startswith("[") and cell not in NOT_REPORTED


def mig_devices(text):
    """`nvidia-smi -L`'s MIG devices: {GPU index: [{"uuid", "name", "device"}]} (none: {})."""
    found, gpu = {}, None
    for line in text.splitlines():
        head = _GPU_LINE.match(line)
        if head is not None:
            gpu = int(head.group(1))
            continue
        mig = _MIG_LINE.match(line)
        if mig is not None and gpu is not None:
            found.setdefault(gpu, []).append({"uuid": mig.group(3), "name": mig.group(1), "device": int(mig.group(2))})
    return found
