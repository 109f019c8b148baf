"""The agent's own trace, in its run directory (`agent.log`): what it was told and what it did for the run, a line
each with its time: the start, the launcher's messages but heartbeats, its consoles that came, went and were taken
over, a stop and why, torchrun's end. The launcher's trace is the controller's side (launcher/trace.py); `report`
sends the end of this one with the run's page (launcher/app/pages.py writes it to logs/<run id>/<node>.agent.log).

Lines said before the run directory exists wait for it (`to`); a trace never stands in the run's way: a line that
cannot be written is dropped, and it stops at TRACE_MAX_BYTES.
"""

import os
import threading
import time

from launcher.node.common import bounds

TRACE_FILE = "agent.log"

_lock = threading.Lock()
_state = {"path": None, "pending": [], "written": 0}


def to(run_dir):
    """Trace into this run directory from now on (what was said before goes first)."""
    with _lock:
        _state["path"] = os.path.join(run_dir, TRACE_FILE)
        pending, _state["pending"] = _state["pending"], []
    for line in pending:
        _write(line)


def note(text, *args):
    """One line of the trace: `text % args`, after the time (and the process, a supervisor forks)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    line = "%s.%03d [%d] %s\n" % (stamp, int(time.time() * 1000) % 1000, os.getpid(), text % args if args else text)
    with _lock:
        if _state["path"] is None:
            if len(_state["pending"]) < bounds.TRACE_PENDING_LINES:
                _state["pending"].append(line)
            return
    _write(line)


def _write(line):
    data = line.encode("utf-8", "replace")
    with _lock:
        if _state["written"] + len(data) > bounds.TRACE_MAX_BYTES:
            return
        _state["written"] += len(data)
        path = _state["path"]
    try:
        with open(path, "ab") as trace:
            trace.write(data)
    except OSError:
        pass  # a full disk, a run directory swept: the run goes on without its trace
