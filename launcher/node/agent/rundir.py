"""A run's directory on a node (stdlib only, Python 3.8+): ~/.cache/ddp-launcher/runs/<run id>/<node>/ holds the
command, the leader's and supervisor's identities, times, the exit code and the log; and what a run is, read from it."""

import os
import re
import time

from launcher.node.common.proc import is_marked, marked_pids, start_time
from launcher.node.loader import node_path
from launcher.node.wire import RUN_ID_PATTERN, RUNS_ROOT


def write_atomic(path, text, mode=0o644):
    """`path` holds `text` whole or not at all, for any reader. No fsync: these records serve this node's later
    sessions (stop, status, logs), which read them after the rename, while a node that crashes has no run left to
    stop; five of them come before torchrun starts, each a wait on the disk (a network home's server)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_text(path, default=None):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def record(path, text):
    """Bookkeeping that must never stand in the way of a stop or a report (a full disk on the node)."""
    try:
        write_atomic(path, text)
        return True
    except OSError:
        return False


def run_dir_of(request):
    return node_path(request["run_dir"])


def names_problem(request):
    """Why the request's run id or node name cannot be used (they become paths under the runs root), or None."""
    run_id = request.get("run_id")
    if run_id not in (None, "") and not (isinstance(run_id, str) and re.fullmatch(RUN_ID_PATTERN, run_id)):
        return "%r is not a run id: run ids look like 20260131-235959-a1b2c3" % (run_id,)
    node = request.get("node")
    if not isinstance(node, str) or node in ("", ".") or "/" in node or ".." in node or "\0" in node:
        return "%r is not a node name this agent accepts (no '/', no '..', not empty)" % (node,)
    return None


def record_leader(run_dir, pid):
    """Record torchrun's identity, "<pid> <start time>", in `leader`; returns the start time (None: it is gone).

    Its pid is its process group id (it runs under setsid); `stop` signals that group only while this process
    still lives, and never on a pid alone, which another process may have by then.
    """
    start = start_time(pid)
    if start is not None:
        write_atomic(os.path.join(run_dir, "leader"), "%d %d" % (pid, start))
    return start


def leader_of(run_dir, record="leader"):
    """The run's recorded leader (or `supervisor`) as (pid, start time), or None when there is no well-formed record."""
    parts = (read_text(os.path.join(run_dir, record)) or "").split()
    try:
        pid, start = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None
    return (pid, start) if len(parts) == 2 and pid > 1 and start >= 0 else None


def live_leader(run_dir, mark):
    """The run's process group id while its leader is still the run's own process (same start, marked), else None.

    A run with only an old `pgid` file gets no group signal at all: that id may be anyone's group by now.
    """
    leader = leader_of(run_dir)
    if leader is not None and is_marked(leader[0], leader[1], mark):
        return leader[0]
    return None


END_RECORD = "end.json"
"""An attached run's end as its supervisor reported it (code, left, reason, workers): a launcher that was away when the
run ended is told it from here (the `attach` action's replay)."""
STOP_RECORD = "stop_requested"
"""The run directory's note that a stop asked for the run's end (`record_stop`, read by `stop_recorded`)."""
STOPPED_BY_RECORD = "stopped_by"
"""Who asked for that stop, as the launcher or `inv stop` said it (`record_stopped_by`, read by `run_state`)."""


def record_stop(run_dir, why=None):
    """Note that the run was asked to stop (status then says `stopped`, not `exited`), and `why` where no user asked
    (the node's own stop for a non-finite loss); best effort."""
    if not stop_recorded(run_dir):
        record(os.path.join(run_dir, STOP_RECORD), "%r%s" % (time.time(), " " + why if why else ""))


def record_stopped_by(run_dir, by):
    """Who asked the run to stop (`the user (inv stop from ana@laptop)`, `its launcher (a hang)`), for `status`; the
    first stop's words stay; best effort."""
    if by and not os.path.exists(os.path.join(run_dir, STOPPED_BY_RECORD)):
        record(os.path.join(run_dir, STOPPED_BY_RECORD), str(by)[:200])


def stopped_why(run_dir):
    """Why the run's own node stopped it (`record_stop`'s `why`), or None: a user's stop, or none."""
    text = read_text(os.path.join(run_dir, STOP_RECORD))
    return text.split(" ", 1)[1] if text and " " in text else None


def stop_recorded(run_dir):
    """Whether a stop (this node's agent's, or one from another terminal) asked for the run's end."""
    return os.path.exists(os.path.join(run_dir, STOP_RECORD))


def find_run_dir(request):
    """The requested run's directory on this node, or the latest run's when no id is given.

    The caller has checked the run id and node name (`names_problem`): both become path components here.
    """
    node = request["node"]
    root = node_path(RUNS_ROOT)
    run_id = request.get("run_id")
    if not run_id:
        runs = sorted(r for r in list_runs(root) if os.path.isdir(os.path.join(root, r, node)))
        if not runs:
            return None, None
        run_id = runs[-1]
    path = os.path.join(root, run_id, node)
    return (run_id, path) if os.path.isdir(path) else (run_id, None)


def list_runs(root):
    """The run ids under `root` (anything else there is not a run)."""
    try:
        return [r for r in os.listdir(root) if re.fullmatch(RUN_ID_PATTERN, r)]
    except OSError:
        return []


def runs_here(node):
    """The runs directory and the ids of the runs this node took part in, oldest first."""
    root = node_path(RUNS_ROOT)
    return root, sorted(r for r in list_runs(root) if os.path.isdir(os.path.join(root, r, node)))


def run_state(run_id, run_dir, node, left=None):
    """A run's state on this node (none, running, exited, stopped, lost), its exit code, times and processes left.

    `left`: how many of the run's processes live here, when a listing's one pass over /proc counted them already.
    """
    if run_dir is None:
        return {"run_id": run_id, "state": "none"}
    exit_code = read_text(os.path.join(run_dir, "exit_code"))
    if left is None:
        left = len(marked_pids("%s/%s" % (run_id, node)))
    started = read_text(os.path.join(run_dir, "started_at"))
    ended = read_text(os.path.join(run_dir, "ended_at"))
    if exit_code is not None and not left:
        state = "stopped" if stop_recorded(run_dir) else "exited"
    elif left:
        state = "running"
    else:
        state = "lost"  # no exit code and nothing alive: the supervisor itself was killed
    found = {
        "run_id": run_id,
        "state": state,
        "exit_code": None if exit_code is None else int(exit_code),
        "started_at": float(started) if started else None,
        "ended_at": float(ended) if ended else None,
        "processes": left,
    }
    why = stopped_why(run_dir) if state in ("stopped", "running") else None
    if why:
        found["stopped_why"] = why
    by = read_text(os.path.join(run_dir, STOPPED_BY_RECORD)) if state == "stopped" else None
    if by:
        found["stopped_by"] = by
    if state == "running":
        # an attached run's record: who owns it, and whether it is there
        from launcher.node.agent.launcherconsole import read_record

        record = read_record(run_dir)
        if record is not None:
            found["launcher"] = {key: record.get(key) for key in ("owner", "present", "away_since", "stops_at")}
    return found
