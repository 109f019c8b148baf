"""The node side of a run: a stdlib-only program that the launcher sends over SSH (stdin) to each node.

Nothing is installed on a node. The launcher runs `PYTHON -c BOOTSTRAP`; the bootstrap reads this file's source
from the first stdin line and a JSON request from the second. Actions:

- start: make the run directory, start torchrun under `setsid` (one process group; every process of the run
  also carries DDP_LAUNCHER_RUN=<run id>/<node> in its environment), record pid, times and exit code.
  Attached: stream the log to stdout, obey `stop` lines on stdin, and stop the run by itself when stdin closes
  or heartbeats stop (the launcher died or the network dropped). Detached: a daemon keeps the run; returns at once.
- stop: TERM the run's process group and every process carrying its mark, a grace period, then KILL; report.
- status: running / exited / stopped / lost, with times.
- logs: print the log, optionally following it until the run ends.
- runs: list this node's run ids.

Protocol: stdout carries the run's log bytes (or an action's JSON reply); stderr carries one JSON event per line.
Kept compatible with Python 3.8: it runs under whatever interpreter the node has.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

RUN_ID_ENV = "DDP_LAUNCHER_RUN"
RUNS_ROOT = "~/.cache/ddp-launcher/runs"


def emit(event, **fields):
    """One JSON event line on stderr, for the launcher."""
    fields["event"] = event
    fields.setdefault("time", time.time())
    try:
        sys.stderr.write(json.dumps(fields) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # the launcher is gone; the run directory still records everything


def write_atomic(path, text, mode=0o644):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_text(path, default=None):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return default


def node_path(path):
    """A path as this node means it: `~` is its home, and ~/.cache its XDG cache home when one is set."""
    cache = os.environ.get("XDG_CACHE_HOME")
    if cache and (path == "~/.cache" or path.startswith("~/.cache/")):
        return cache + path[len("~/.cache"):]
    return os.path.expanduser(path)


def run_dir_of(request):
    return node_path(request["run_dir"])


def marked_pids(mark):
    """Pids of live processes whose environment carries this run's mark (zombies have no environment)."""
    needle = ("%s=%s\0" % (RUN_ID_ENV, mark)).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                env = f.read()
        except OSError:
            continue
        if (b"\0" + needle) in (b"\0" + env):
            found.append(int(entry))
    return found


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def signal_run(run_dir, mark, sig):
    """Send `sig` to the run's process group and to every process carrying its mark; returns how many."""
    targets = set(marked_pids(mark))
    pgid = read_text(os.path.join(run_dir, "pgid"))
    if pgid:
        try:
            os.killpg(int(pgid), sig)
        except OSError:
            pass
    for pid in targets:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    return len(targets)


def stop_run(run_dir, mark, grace):
    """TERM, wait up to `grace` seconds, KILL what is left; returns (processes found, processes left)."""
    found = signal_run(run_dir, mark, signal.SIGTERM)
    if found and not os.path.exists(os.path.join(run_dir, "stop_requested")):
        write_atomic(os.path.join(run_dir, "stop_requested"), str(time.time()))
    pgid = read_text(os.path.join(run_dir, "pgid"))
    leader = {int(pgid)} if pgid else set()
    deadline = time.time() + grace
    while True:
        left = set(marked_pids(mark))
        if not left or time.time() >= deadline:
            break
        if left <= leader:
            # Only torchrun is left and its workers are gone: its own shutdown (a second or more of Python)
            # has nothing left to save, so do not make the user wait for it.
            signal_run(run_dir, mark, signal.SIGKILL)
        time.sleep(0.05)
    if marked_pids(mark):
        signal_run(run_dir, mark, signal.SIGKILL)
        deadline = time.time() + 5
        while marked_pids(mark) and time.time() < deadline:
            time.sleep(0.05)
    return found, len(marked_pids(mark))


def spawn(request, run_dir):
    """Start torchrun in its own session; its output goes to the run's log file."""
    os.makedirs(run_dir, mode=0o700)
    home = node_path
    argv = [home(w) if i in request.get("expand_home", []) else w for i, w in enumerate(request["argv"])]
    public = {k: v for k, v in request["env"].items() if k not in request.get("secret_names", [])}
    write_atomic(os.path.join(run_dir, "command.json"), json.dumps({
        "argv": argv, "workdir": request["workdir"], "env": public,
        "secret_env": sorted(request.get("secret_names", [])), "node_rank": request.get("node_rank"),
    }, indent=1))
    write_atomic(os.path.join(run_dir, "started_at"), repr(time.time()))
    env = dict(os.environ)
    env.update(request["env"])
    env[RUN_ID_ENV] = request["mark"]
    # torchrun's --tee copies worker lines to its own stdout, a file here: unbuffered, they reach the log
    # (and the launcher) as they are printed, not in 8 KiB blocks.
    env.setdefault("PYTHONUNBUFFERED", "1")
    log = open(os.path.join(run_dir, "log"), "ab")
    try:
        proc = subprocess.Popen(argv, cwd=home(request["workdir"]), env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()
    write_atomic(os.path.join(run_dir, "pgid"), str(proc.pid))
    return proc


def finish(proc, run_dir):
    """Wait for torchrun and record its exit code (128+N for a signal, like a shell)."""
    code = proc.wait()
    code = 128 - code if code < 0 else code
    write_atomic(os.path.join(run_dir, "exit_code"), str(code))
    write_atomic(os.path.join(run_dir, "ended_at"), repr(time.time()))
    return code


def start(request):
    run_dir = run_dir_of(request)
    workdir = os.path.expanduser(request["workdir"])
    if not os.path.isdir(workdir):
        emit("error", message="workdir %s does not exist on this node" % request["workdir"])
        return 2
    if request["argv"][0] != os.path.expanduser(request["argv"][0]) or os.sep in request["argv"][0]:
        python = os.path.expanduser(request["argv"][0])
        if not os.access(python, os.X_OK):
            emit("error", message="python %s is not an executable file on this node" % request["argv"][0])
            return 2
    if os.path.exists(run_dir):
        emit("error", message="run directory %s already exists" % request["run_dir"])
        return 2
    if request.get("detach"):
        return start_detached(request, run_dir)
    try:
        proc = spawn(request, run_dir)
    except OSError as exc:
        emit("error", message="cannot start torchrun: %s" % exc)
        return 2
    emit("started", pid=proc.pid, run_dir=run_dir)
    return attend(request, run_dir, proc)


def start_detached(request, run_dir):
    """Double fork: a daemon in its own session keeps the run and records its end; we return at once."""
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:
        os.close(read_fd)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            proc = spawn(request, run_dir)
            os.write(write_fd, ("%d\n" % proc.pid).encode())
            os.close(write_fd)
            finish(proc, run_dir)
        except BaseException as exc:
            try:
                os.write(write_fd, ("error %s\n" % exc).encode())
            except OSError:
                pass
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        answer = pipe.readline().strip()
    if not answer or answer.startswith("error"):
        emit("error", message="cannot start torchrun: %s" % (answer[6:] or "the keeper died"))
        return 2
    emit("started", pid=int(answer), run_dir=run_dir, detached=True)
    return 0


def attend(request, run_dir, proc):
    """Stream the log, obey stop lines, and stop the run when the launcher is gone."""
    heartbeat_timeout = request.get("heartbeat_timeout", 30)
    grace = request.get("grace", 10)
    state = {"last": time.time(), "stop": None}

    def listen():
        # A line per heartbeat or command; EOF means the launcher (or its network) is gone.
        for line in sys.stdin:
            state["last"] = time.time()
            word = line.strip()
            if word in ("stop", "kill"):
                state["stop"] = word
        if state["stop"] is None:
            state["stop"] = "launcher-gone"

    signal.signal(signal.SIGHUP, lambda *_: state.update(stop="launcher-gone"))
    signal.signal(signal.SIGTERM, lambda *_: state.update(stop="stop"))
    threading.Thread(target=listen, daemon=True).start()
    log = open(os.path.join(run_dir, "log"), "rb")
    out = sys.stdout.buffer
    stopping = False
    while True:
        chunk = log.read(1 << 16)
        if chunk:
            try:
                out.write(chunk)
                out.flush()
            except (OSError, ValueError):
                pass  # the launcher is gone; keep draining so the stop below still happens
            continue
        if proc.poll() is not None:
            break
        if state["stop"] is None and time.time() - state["last"] > heartbeat_timeout:
            state["stop"] = "launcher-gone"
        if state["stop"] is not None and not stopping:
            stopping = True
            reason = state["stop"]
            emit("stopping", reason=reason)
            threading.Thread(target=stop_run, daemon=True, args=(
                run_dir, request["mark"], 0 if reason == "kill" else grace)).start()
        if stopping and state["stop"] == "kill":
            signal_run(run_dir, request["mark"], signal.SIGKILL)
        time.sleep(0.05)
    code = finish(proc, run_dir)
    rest = log.read()
    try:
        out.write(rest)
        out.flush()
    except (OSError, ValueError):
        pass
    if stopping:
        # torchrun is gone; make sure its workers (their own sessions) are too before we say so.
        _, left = stop_run(run_dir, request["mark"], 0)
        emit("stopped", left=left)
    emit("exited", code=code)
    return code


def find_run_dir(request):
    """The requested run's directory on this node, or the latest run's when no id is given."""
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
    try:
        return [r for r in os.listdir(root) if not r.startswith(".")]
    except OSError:
        return []


def describe(run_id, run_dir, node):
    if run_dir is None:
        return {"run_id": run_id, "state": "none"}
    mark = "%s/%s" % (run_id, node)
    exit_code = read_text(os.path.join(run_dir, "exit_code"))
    left = marked_pids(mark)
    started = read_text(os.path.join(run_dir, "started_at"))
    ended = read_text(os.path.join(run_dir, "ended_at"))
    if exit_code is not None and not left:
        stopped = os.path.exists(os.path.join(run_dir, "stop_requested"))
        state = "stopped" if stopped else "exited"
    elif left:
        state = "running"
    else:
        state = "lost"  # no exit code and nothing alive: the keeper itself was killed
    return {"run_id": run_id, "state": state, "exit_code": None if exit_code is None else int(exit_code),
            "started_at": float(started) if started else None, "ended_at": float(ended) if ended else None,
            "processes": len(left)}


def action_stop(request):
    run_id, run_dir = find_run_dir(request)
    if run_dir is None:
        return reply({"run_id": run_id, "state": "none", "found": 0, "left": 0})
    mark = "%s/%s" % (run_id, request["node"])
    found, left = stop_run(run_dir, mark, request.get("grace", 10))
    deadline = time.time() + 2  # the run's keeper records the exit code a moment after torchrun is gone
    while found and not os.path.exists(os.path.join(run_dir, "exit_code")) and time.time() < deadline:
        time.sleep(0.02)
    result = describe(run_id, run_dir, request["node"])
    result.update(found=found, left=left)
    return reply(result)


def action_status(request):
    run_id, run_dir = find_run_dir(request)
    return reply(describe(run_id, run_dir, request["node"]))


def action_runs(request):
    root = node_path(RUNS_ROOT)
    node = request["node"]
    return reply({"runs": sorted(r for r in list_runs(root) if os.path.isdir(os.path.join(root, r, node)))})


def action_logs(request):
    run_id, run_dir = find_run_dir(request)
    if run_dir is None:
        emit("error", message="no run %s on this node" % (run_id or "at all"))
        return 3
    emit("run", run_id=run_id)
    out = sys.stdout.buffer
    with open(os.path.join(run_dir, "log"), "rb") as log:
        while True:
            chunk = log.read(1 << 16)
            if chunk:
                out.write(chunk)
                out.flush()
                continue
            if not request.get("follow") or os.path.exists(os.path.join(run_dir, "exit_code")):
                rest = log.read()
                out.write(rest)
                out.flush()
                return 0
            time.sleep(0.1)


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
    return 0


ACTIONS = {"start": start, "stop": action_stop, "status": action_status, "logs": action_logs,
           "runs": action_runs}


def main():
    request = json.loads(sys.stdin.readline())
    try:
        code = ACTIONS[request["action"]](request)
    except Exception as exc:
        emit("error", message="%s: %s" % (type(exc).__name__, exc))
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main()
