"""torchrun in the run's container on a node (stdlib only, Python 3.8+): started by the agent through the node's
runtime (launcher/node/common/containers.py: the flags), held before `go` as a bare torchrun's python is, and
removed at the run's end, whatever ended it.

What runs inside: `sh -c SCRIPT` (the host's setup lines, in the image's shell) when there are setup lines, then the
image's python with START: the prestart program (launcher/node/agent/prestart.py) behind a prelude that reads the
run's environment from the first stdin line (secrets are never on a command line: not in `ps`, not in the runtime's
`inspect`), makes its process a group leader and, on `go`, records itself as the run's leader (its pid is the
node's, `--pid host`), so a stop signals torchrun's group as it does on a bare node. The run's mark comes with the
runtime's `--env`: every process in the container carries it from its start, so the sweeps find them by it.

The runtime's client is the supervisor's child, in a session of its own: never marked (a stop's signals reach the
container's processes, not the client, which ends when its container ends), never killed while it may be creating
the container (podman 4.3 then leaves its conmon behind), recorded in the run's folder (`container.json`) with the
container's name, so a stop from anywhere removes the container and ends a client still pulling the image.
"""

import json
import os
import signal
import time

from launcher.node.agent.prestart import SOURCE, early_output
from launcher.node.agent.rundir import read_text, write_atomic
from launcher.node.common import bounds, child
from launcher.node.common.containers import container_name, listed_words, remove_words, run_words, runtime_path
from launcher.node.common.proc import become_reaper, own_zombies, same_process, signal_process, start_time
from launcher.node.loader import node_path
from launcher.node.wire import RUNS_ROOT, timing

RECORD = "container.json"
"""The run's container on this node: the runtime's program, the container's name, the client's pid and start."""
STARTED = "container_started"
"""When the python in the container began (wall clock, written from inside): the page's container phase ends there."""

BOOT = "import sys;exec(sys.argv[1])"
"""What `python -c` runs in the container: START, from its first argument (so that it can start itself again)."""
STARTED_ENV = "DDP_LAUNCHER_CONTAINER_STARTED"
"""Set for START's second start: its first read the run's environment already (and when it began)."""
PRELUDE = """\
import os, sys, json, time
_start = sys.argv.pop(1)
if STARTED_ENV not in os.environ:
    data = b""
    while not data.endswith(b"\\n"):
        chunk = os.read(0, 1)
        if not chunk:
            os._exit(0)
        data += chunk
    env, given = dict(os.environ), json.loads(data.decode())["env"]
    for name in ("PYTHONPATH",):
        if env.get(name) and given.get(name):
            given[name] = given[name] + os.pathsep + env[name]
    env.update(given)
    env[STARTED_ENV] = repr(time.time())
    # Started again with the run's environment, as a bare torchrun starts with it: what Python reads only at its
    # start (PYTHONPATH, PYTHONUNBUFFERED, ...) applies, and /proc shows it.
    os.execve(sys.executable, [sys.executable, "-c", BOOT, _start] + sys.argv[1:], env)
_began = os.environ.pop(STARTED_ENV)
try:
    os.setsid()
except OSError:
    pass
def _write(path, text):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)
def _on_go(log_path):
    run_dir = os.path.dirname(log_path)
    with open("/proc/self/stat") as handle:
        start = handle.read().rsplit(")", 1)[1].split()[19]
    _write(os.path.join(run_dir, "leader"), "%d %s" % (os.getpid(), start))
    _write(os.path.join(run_dir, "container_started"), _began)
""".replace("STARTED_ENV", repr(STARTED_ENV)).replace("BOOT", repr(BOOT))
START = PRELUDE + SOURCE
"""The program the image's python runs: the run's environment first, then held until `go` as prestart's is."""


def runtime_or_error(request):
    """The node's runtime program for this run; OSError (said as the start's error) when the node has none."""
    spec = request["container"]
    program = runtime_path(spec)
    if program is None:
        wanted = "podman or docker" if spec.get("runtime", "auto") == "auto" else spec["runtime"]
        raise OSError("no container runtime on this node (%s not on PATH)" % wanted)
    return program


def container_argv(request, runs_root, program, planned):
    """The runtime's whole command line for this run's container, its command the image's python with START. The
    node's folder of runs is mounted, not the run's own: a container held before `go` starts before the run's folder
    is made (a run that never starts leaves none), and sees it appear."""
    spec = request["container"]
    workdir = request["workdir"]
    inner = [planned[0], "-c", BOOT, START, workdir, *list(planned[1:])]
    if spec.get("script"):
        inner = ["/bin/sh", "-c", spec["script"], "ddpl-setup", *inner]
    name = container_name(request["mark"])
    return [*run_words(program, spec, workdir, [workdir, runs_root], name, request["mark"]), *inner]


class Stdin:
    """The container's stdin, written by a thread of its own: the run's environment at once, the `go` line later,
    then its end. A container that is still being pulled or created reads nothing yet; the agent never waits on it
    (an environment past a pipe's 64 KiB would)."""

    def __init__(self, fd):
        import threading

        self.fd, self.pending, self.ready = fd, [], threading.Condition()
        threading.Thread(target=self._write, name="container-stdin", daemon=True).start()

    def send(self, data):
        """Queue `data`; None ends the stream (the fd is closed once what came before is written)."""
        with self.ready:
            self.pending.append(data)
            self.ready.notify()

    def _write(self):
        broken = False
        while True:
            with self.ready:
                while not self.pending:
                    self.ready.wait()
                data = self.pending.pop(0)
            if data is None:
                os.close(self.fd)
                return
            try:
                if not broken:
                    os.write(self.fd, data)
            except OSError:
                broken = True  # it ended meanwhile: its exit code and words are the start's


class Held:
    """The run's container, started with its python importing torch, held until `go` (`release`) or ended
    (`drop`): prestart's Prestarted, for a container."""

    def __init__(self, proc, planned, env, stdin, early, program, name):
        self.proc, self.planned, self.env, self.stdin = proc, planned, env, stdin
        self.early, self.program, self.name = early, program, name

    def release(self, argv, env, log_path):
        """The container's python as torchrun with these words, its output to `log_path`; the client itself when it
        ended before `go` (its own words copied into the log: an image it could not find); None (and it is gone)
        when the words or the environment are not those it started with."""
        if argv != self.planned or env != self.env:
            self.drop()
            return None
        self.stdin.send((log_path + "\n").encode())
        self.stdin.send(None)
        self.stdin = None
        if self.proc.poll() is not None:
            _copy_early(self.early, log_path)
        if self.early is not None:
            os.close(self.early)
            self.early = None
        return self.proc

    def drop(self):
        """End it before `go` (an abort, a failed check): its stdin closed (the python inside exits), the client
        asked to end, the container removed; nothing once it was let go."""
        if self.stdin is None:
            return
        self.stdin.send(None)
        self.stdin = None
        if self.early is not None:
            os.close(self.early)
            self.early = None
        end_client(self.proc.pid, start_time(self.proc.pid), self.proc)
        remove_named(self.program, [self.name])


def hold(request, planned, env, out_fd=None):
    """Start the run's container with `env` on its stdin, its python held before torchrun; None where the node has
    no runtime (the start then says so). `out_fd`: where the client and the container write (the run's log for a
    start at once); None: a file without a name, copied into the log on `go`."""
    try:
        program = runtime_or_error(request)
    except OSError:
        return None
    runs_root = node_path(RUNS_ROOT)
    try:
        os.makedirs(runs_root, mode=0o700, exist_ok=True)
    except OSError:
        return None
    argv = container_argv(request, runs_root, program, planned)
    read_fd, write_fd = os.pipe()
    early = early_output(env) if out_fd is None else None
    out = out_fd if out_fd is not None else early
    actions = [
        (os.POSIX_SPAWN_DUP2, read_fd, 0),
        (os.POSIX_SPAWN_DUP2, out, 1) if out is not None else (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    try:
        reap_monitors()
        proc = child.spawn_in_session(program, argv, dict(os.environ), actions)
    except (OSError, NotImplementedError):
        os.close(write_fd)
        if early is not None:
            os.close(early)
        return None
    finally:
        os.close(read_fd)
    stdin = Stdin(write_fd)
    stdin.send((json.dumps({"env": env}) + "\n").encode())
    _waited.add(proc.pid)
    return Held(proc, list(planned), dict(env), stdin, early, program, container_name(request["mark"]))


_reaping = []


def reap_monitors():
    """Be the reaper of the runtime's monitor (podman's conmon double-forks away from its client) and reap it when
    it ends. A client waits, after its container ended, until its conmon is gone: left to an init that reaps now and
    then (this machine's waited 20 s) or to a subreaper that does not reap (a bare run's supervisor), it stays a
    zombie and the run's end waits with it. Once a process: a thread reaps every zombie child but those it waits on
    itself (the client, the runtime commands: `child.Child` and subprocess find theirs gone and say 0, which they
    never read here)."""
    if _reaping:
        return
    _reaping.append(become_reaper())
    import threading

    threading.Thread(target=_reap, name="reap-monitors", daemon=True).start()


def _reap():
    me = os.getpid()
    while True:
        for pid in own_zombies(me):
            if pid not in _waited:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except OSError:
                    pass
        time.sleep(timing("poll_s"))


_waited = set()
"""The children this process waits for itself (the runtime's clients): never reaped by `_reap`."""


def start(request, run_dir, planned, env, log_path, held):
    """The run's container as torchrun: the one held since `ready`, else one started now; the client (a `Child`).
    Raises OSError where the node has no runtime."""
    program = runtime_or_error(request)
    proc = held.release(planned, env, log_path) if held is not None else None
    if proc is None:
        out = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            held = hold(request, planned, env, out)
        finally:
            os.close(out)
        if held is None:
            raise OSError("cannot start %s" % program)
        proc = held.release(planned, env, log_path)
    record = {"runtime": program, "name": container_name(request["mark"]), "client": [proc.pid, start_time(proc.pid)]}
    write_atomic(os.path.join(run_dir, RECORD), json.dumps(record))
    return proc


def _copy_early(early, log_path):
    """What the client printed before `go` (a pull's failure, an unknown image) into the run's log."""
    if early is None:
        return
    try:
        os.lseek(early, 0, 0)
        with open(log_path, "ab") as log:
            chunk = os.read(early, bounds.EARLY_COPY_BYTES)
            while chunk:
                log.write(chunk)
                chunk = os.read(early, bounds.EARLY_COPY_BYTES)
    except OSError:
        pass


def read_record(run_dir):
    try:
        found = json.loads(read_text(os.path.join(run_dir, RECORD)) or "null")
    except ValueError:
        return None
    return found if isinstance(found, dict) and found.get("runtime") and found.get("name") else None


def end_client(pid, start, proc=None, patience=0.0):
    """A client that must go (a stop while it pulls, a start dropped before `go`): `patience` seconds to end by
    itself (its container just ended: it removes it), then TERM, then KILL past a bound. Whether it was alive."""

    def gone():
        return proc.poll() is not None if proc is not None else not same_process(pid, start)

    if start is None or gone():
        return False
    for sig, wait in ((None, patience), (signal.SIGTERM, bounds.CONTAINER_CLIENT_S), (signal.SIGKILL, None)):
        if sig is not None:
            signal_process(pid, start, sig)
        deadline = time.monotonic() + (wait or 0.0)
        while not gone() and time.monotonic() < deadline:
            time.sleep(timing("poll_s"))
        if gone():
            break
    if proc is not None:
        proc.wait()
    return True


def remove_named(program, names):
    """Remove the containers (their processes are stopped already); the runtime's own words when it fails."""
    return _runtime(remove_words(program, names))


def remove_run_containers(run_dir, mark, patience=0.0):
    """After the run's processes are gone: its client ended if it still lives (`patience`: the seconds it has to end
    by itself first), and every container of the run on this node removed, by name and by label. Whether the
    client still lived with nothing of the run running (it was pulling the image, or creating the container)."""
    record = read_record(run_dir)
    if record is None:
        return False
    pid, start = (record.get("client") or [0, None])[:2]
    lived = bool(pid) and end_client(pid, start, patience=patience)
    program = record["runtime"]
    code, out = _runtime(listed_words(program, mark))
    listed = out.split() if code == 0 else []
    _runtime(remove_words(program, [record["name"], *listed]))
    return lived and not patience


def _runtime(argv):
    """(exit code, stdout) of a runtime command, bounded; (-1, why) when it could not run or took too long."""
    import subprocess

    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=bounds.CONTAINER_COMMAND_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return done.returncode, done.stdout.decode("utf-8", "replace")
