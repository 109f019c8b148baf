"""The node side of a run: a stdlib-only program that the launcher sends over SSH (stdin) to each node.

Nothing is installed on a node. The launcher runs `PYTHON -c BOOTSTRAP`; the bootstrap reads this file's source
from the first stdin line and a JSON request from the second. Actions:

- start: with the doctor on, first run the doctor's probe that came in the request and say `probed` with its
  answer (the master also holds master_port open meanwhile, and each node connects to it when the launcher says
  `tcp`, answering `tcp`); check the workdir, python and run directory, say `ready` and wait for `go` (sent once
  every node is ready and the launcher's checks passed: a run starts on all nodes or on none; `abort` or `stop`
  instead ends the agent with nothing made); then make the run directory and start torchrun under `setsid`
  (one process group; every process of the run also carries DDP_LAUNCHER_RUN=<run id>/<node> in its
  environment); record pid, times and exit code.
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
import queue
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

RUN_ID_ENV = "DDP_LAUNCHER_RUN"
RUNS_ROOT = "~/.cache/ddp-launcher/runs"
RUN_ID_PATTERN = r"\d{8}-\d{6}-[0-9a-f]{6}"  # launcher.plan's: a run id that names no other path
SOCKET_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")  # launcher.inventory_fields': what socket_ifname sets


def emit(event, **fields):
    """One JSON event line on stderr, for the launcher; while attached, through a writer thread of its own."""
    fields["event"] = event
    fields.setdefault("time", time.time())
    line = (json.dumps(fields) + "\n").encode()
    if _EVENTS is not None:
        _EVENTS.put(line)
    else:
        with _WRITE_LOCK:  # whole lines, whichever thread says them (a `tcp` answer, an `alive` beat)
            write_all(2, line)  # a failure means the launcher is gone; the run directory still records everything


# While a run is attached, events go through this queue: the supervision never waits on a launcher that reads
# slowly or not at all (a stopped sshd, a full pipe).
_EVENTS = None
_WRITE_LOCK = threading.Lock()


def write_all(fd, data):
    """Write all of `data` to a file descriptor, unbuffered; False when the reader is gone."""
    try:
        while data:
            data = data[os.write(fd, data):]
        return True
    except OSError:
        return False


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
    """Pids of this user's live processes whose environment carries the run's mark (zombies have none)."""
    return list(marked_processes(mark))


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def start_time(pid):
    """When the process started (clock ticks after boot, /proc/<pid>/stat field 22), or None when there is none.

    With the pid it names one process for good: a pid reused by a later process comes with a later start time.
    """
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])  # field 22; fields 1-2 are before the ")"
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid, start):
    """Whether `pid` is still the process that started at `start`, and runs as this agent's user."""
    try:
        if os.stat("/proc/%d" % pid).st_uid != os.geteuid():
            return False
    except OSError:
        return False
    return start is not None and start_time(pid) == start


def is_marked(pid, start, mark):
    """Whether `pid` is still the process that started at `start`, this user's, and carries the run's mark."""
    if not same_process(pid, start):
        return False
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = f.read()
    except OSError:
        return False
    needle = ("\0%s=%s\0" % (RUN_ID_ENV, mark)).encode()
    # The start time again: the environment just read was that process's, not a successor's on a reused pid.
    return needle in b"\0" + env and start_time(pid) == start


def marked_processes(mark):
    """This user's live processes that carry the run's mark, as {pid: start time}."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        start = start_time(int(entry))
        if start is not None and is_marked(int(entry), start, mark):
            found[int(entry)] = start
    return found


def signal_process(pid, start, sig):
    """Send `sig` to `pid` only if it is still the process seen (same start time and user); True when sent.

    With a pidfd (Python 3.9+ on Linux 5.3+) the check and the signal reach the same process for certain; without
    one, the pid would have to die and be reused between two system calls.
    """
    pidfd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:
            pidfd = None  # no pidfds on this kernel (or a sandbox forbids them): the check alone
    try:
        if not same_process(pid, start):
            return False
        if pidfd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(pidfd, sig)
        return True
    except OSError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


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
    """The run's recorded leader (or `keeper`) as (pid, start time), or None when there is no well-formed record."""
    words = (read_text(os.path.join(run_dir, record)) or "").split()
    try:
        pid, start = int(words[0]), int(words[1])
    except (IndexError, ValueError):
        return None
    return (pid, start) if len(words) == 2 and pid > 1 and start >= 0 else None


def live_leader(run_dir, mark):
    """The run's process group id while its leader is still the run's own process (same start, marked), else None.

    A run with only an old `pgid` file gets no group signal at all: that id may be anyone's group by now.
    """
    leader = leader_of(run_dir)
    if leader is not None and is_marked(leader[0], leader[1], mark):
        return leader[0]
    return None


def names_problem(request):
    """Why the request's run id or node name cannot be used (they become paths under the runs root), or None."""
    run_id = request.get("run_id")
    if run_id not in (None, "") and not (isinstance(run_id, str) and re.fullmatch(RUN_ID_PATTERN, run_id)):
        return "%r is not a run id: run ids look like 20260131-235959-a1b2c3" % (run_id,)
    node = request.get("node")
    if not isinstance(node, str) or node in ("", ".") or "/" in node or ".." in node or "\0" in node:
        return "%r is not a node name this agent accepts (no '/', no '..', not empty)" % (node,)
    return None


def refuse(message):
    emit("error", message=message)
    return 2


def stdout_gone():
    """Whether nobody reads stdout anymore (a pipe or socket whose other end closed), found without writing."""
    try:
        poller = select.poll()
        poller.register(1, 0)  # no events asked for: only POLLERR / POLLHUP can come back
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def follow_log(log, run_dir, run_id, mark):
    """Copy the log to stdout as it grows until the run ends, is lost, or the launcher is gone; the exit status."""
    exit_file = os.path.join(run_dir, "exit_code")
    quiet_checks, next_check = 0, time.time()
    while True:
        chunk = log.read(1 << 16)
        if chunk:
            if not write_all(1, chunk):
                return 1  # the launcher is gone: nobody to follow for
            continue
        if os.path.exists(exit_file):
            return 0 if write_all(1, log.read()) else 1
        if time.time() >= next_check:
            next_check = time.time() + 1
            if stdout_gone():
                return 1
            # Twice in a row, a second apart: the keeper writes the exit code a moment after torchrun is gone.
            quiet_checks = 0 if marked_pids(mark) else quiet_checks + 1
            if quiet_checks >= 2:
                write_all(1, log.read())
                emit("error", message="run %s was lost on this node: no exit code recorded and none of its "
                                      "processes alive (its keeper was killed); the log ends here" % run_id)
                return 1
        time.sleep(0.1)


RANK_TAG = "[default%d@r%d]:"
"""How the agent tags a worker's line: torchrun --tee's `[<role><local rank>]:` with the global rank added (the
format torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE gave before); launcher.logs reads it."""
LOCAL_TAG = "[default%d]:"
"""The tag when the worker's global rank cannot be told (it ended before the agent saw its environment)."""


def environ_of(pid):
    """A process's environment as {name: value} (bytes), or {} when it cannot be read."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(w.partition(b"=")[::2] for w in words if w)


def worker_ranks(mark):
    """{(restart count, local rank): global rank} of the run's live workers, read from their environments."""
    found = {}
    for pid in marked_processes(mark):
        env = environ_of(pid)
        try:
            key = (int(env[b"TORCHELASTIC_RESTART_COUNT"]), int(env[b"LOCAL_RANK"]))
            found[key] = int(env[b"RANK"])
        except (KeyError, ValueError):
            continue  # torchrun itself, or a process that is not a worker
    return found


class LogSource:
    """One file the merger tails: its read position is its open descriptor; `rest` holds an unfinished line."""

    def __init__(self, fd, tag=None, key=None):
        self.fd, self.tag, self.key, self.rest = fd, tag, key, b""


class LogMerger:
    """torchrun's output (`torchrun.log`) and every worker's files (torchrun --redirects: <ranks>/<rdzv run id>_*/
    attempt_<restart count>/<local rank>/stdout.log and stderr.log) -> the run's `log`, whole lines only, each
    worker line tagged `[default<local rank>@r<global rank>]:` with one bytes.replace per chunk (C, not a loop).

    A thread of the process that keeps the run (the attached agent or the detached keeper): it only reads files and
    appends to one, so it never waits on the launcher. `log` is what the launcher streams and what `inv logs`
    replays. `close()` (after torchrun and its workers are gone) drains everything, ends unfinished lines, and only
    then does `finish` record the exit code: a follower that sees the exit code has the whole log.
    """

    def __init__(self, run_dir, mark, settings):
        self.run_dir, self.mark = run_dir, mark
        self.ranks = os.path.join(run_dir, settings["ranks"])
        self.poll_s, self.chunk = settings["poll_s"], settings["chunk"]
        self.max_line, self.cut_mark = settings["max_line"], settings["cut_mark"].encode()
        self.out = os.open(os.path.join(run_dir, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.sources = {}  # path -> LogSource; torchrun's own first
        self.own = os.path.join(run_dir, "torchrun.log")
        self.known = {}  # (restart count, local rank) -> global rank, or None when it cannot be told
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True, name="merge-logs")

    def start(self):
        self.sources[self.own] = LogSource(os.open(self.own, os.O_RDONLY))
        self.thread.start()
        return self

    def close(self):
        self.stopping.set()
        self.thread.join()

    def run(self):
        try:
            while True:
                stopping = self.stopping.is_set()  # read before the last round: nothing is written after it is set
                self.discover()
                # Workers first: what a worker wrote before it failed lands before torchrun's report of the failure.
                moved = [self.pump(source) for source in list(self.sources.values())[1:]]
                moved.append(self.pump(self.sources[self.own]))
                if stopping and not any(moved):
                    break
                if self.chunk not in moved:  # nothing more waiting: a trickle is read in chunks, not spun on
                    self.stopping.wait(self.poll_s)
            for source in self.sources.values():  # the last line of a file that ends without a newline
                if source.rest:
                    self.write(self.tagged(source, source.rest + b"\n"))
        except Exception as exc:  # a bug here must not take the run's keeper down: the rank files keep it all
            emit("error", message="the log merger stopped: %s: %s" % (type(exc).__name__, exc))
        finally:
            for source in self.sources.values():
                os.close(source.fd)
            os.close(self.out)

    def discover(self):
        """Open each worker file torchrun made since the last look (a c10d restart makes a new attempt_N)."""
        for run in listdir(self.ranks):
            for attempt in listdir(os.path.join(self.ranks, run)):
                if not (attempt.startswith("attempt_") and attempt[8:].isdigit()):
                    continue
                base = os.path.join(self.ranks, run, attempt)
                for local in listdir(base):
                    if not local.isdigit():
                        continue
                    for name in ("stdout.log", "stderr.log"):
                        path = os.path.join(base, local, name)
                        if path not in self.sources:
                            try:
                                fd = os.open(path, os.O_RDONLY)
                            except OSError:
                                continue  # not made yet
                            self.sources[path] = LogSource(fd, key=(int(attempt[8:]), int(local)))

    def pump(self, source):
        """Move what `source` holds now to the log, whole lines; how many bytes were read."""
        try:
            data = os.read(source.fd, self.chunk)
        except OSError:
            return 0
        read = len(data)
        if not read:
            return 0
        data = source.rest + data if source.rest else data
        end = data.rfind(b"\n") + 1
        whole, source.rest = data[:end], data[end:]
        # No newline for so long: cut, marked as the launcher does, so that the piece with its tag and the mark
        # stays within max_line (the launcher then never cuts it again).
        room = self.max_line - len(self.tag_of(source)) - len(self.cut_mark)
        while len(source.rest) >= room:
            whole += source.rest[:room] + self.cut_mark + b"\n"
            source.rest = source.rest[room:]
        if whole:
            self.write(self.tagged(source, whole))
        return read

    def tag_of(self, source):
        """The source's tag: b"" for torchrun's own lines; a worker's is found with its first bytes (the worker has
        run by then, so its environment is there to read) and kept."""
        if source.key is None:
            return b""
        if source.tag is None:
            if source.key not in self.known:
                self.known.update(worker_ranks(self.mark))
                self.known.setdefault(source.key, None)
            rank = self.known[source.key]
            local = source.key[1]
            source.tag = (LOCAL_TAG % local if rank is None else RANK_TAG % (local, rank)).encode()
        return source.tag

    def tagged(self, source, lines):
        """`lines` (whole, newline-terminated) with the source's tag in front of each, one bytes.replace."""
        tag = self.tag_of(source)
        return tag + lines[:-1].replace(b"\n", b"\n" + tag) + b"\n" if tag else lines

    def write(self, data):
        write_all(self.out, data)  # False on a full disk: lost to the log; the rank files still hold them


def listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def signal_run(run_dir, mark, sig):
    """Send `sig` to the run's process group (while its leader is the run's) and to every process carrying its
    mark, each re-checked right before; returns how many marked processes got it."""
    targets = marked_processes(mark)
    leader = live_leader(run_dir, mark)
    if leader is not None:
        try:
            os.killpg(leader, sig)
        except OSError:
            pass
    return sum(1 for pid, start in targets.items() if signal_process(pid, start, sig))


def stop_run(run_dir, mark, grace, record=True):
    """TERM, wait up to `grace` seconds, KILL what is left; returns (processes found, processes left).

    `record`: note the stop in the run directory (status then says `stopped`) when there was something to stop.
    """
    found = signal_run(run_dir, mark, signal.SIGTERM)
    if found and record:
        record_stop(run_dir)
    leader = leader_of(run_dir)
    leader_pid = {leader[0]} if leader else set()
    deadline = time.monotonic() + grace
    while True:
        left = set(marked_pids(mark))
        if not left or time.monotonic() >= deadline:
            break
        if left <= leader_pid:
            # Only torchrun is left and its workers are gone: its own shutdown (a second or more of Python)
            # has nothing left to save, so do not make the user wait for it.
            signal_run(run_dir, mark, signal.SIGKILL)
        time.sleep(0.05)
    if marked_pids(mark):
        signal_run(run_dir, mark, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while marked_pids(mark) and time.monotonic() < deadline:
            time.sleep(0.05)
    return found, len(marked_pids(mark))


def unset_match(name, patterns):
    """Whether `name` is one of `patterns`: an exact name, or a glob ending in `*` (TORCHELASTIC_*)."""
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)


def socket_env(ifname):
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME for an interface name (nothing for None)."""
    return {} if ifname is None else {name: ifname for name in SOCKET_ENV}


def torchrun_env(request, inherited):
    """torchrun's environment: the login environment less every name `unset_env` matches (a stale RANK or
    MASTER_ADDR from a .bashrc), then the socket interface, then the request's env, which wins."""
    env = {k: v for k, v in inherited.items() if not unset_match(k, request["unset_env"])}
    env.update(socket_env(request["socket_ifname"]))
    env.update(request["env"])
    env.update(request["launcher_env"])  # after the unset: TORCHELASTIC_* names only the launcher may set
    env[RUN_ID_ENV] = request["mark"]
    # Workers write to files (torchrun --redirects): unbuffered, their lines reach the log (and the launcher) as
    # they are printed, not in 8 KiB blocks.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _ipv4_ifaces():
    """(name, address, netmask) of each IPv4 interface, via ioctl (Linux); empty where that does not work."""
    import fcntl

    out = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            packed = struct.pack("256s", name[:15].encode())
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x8915, packed)[20:24])  # SIOCGIFADDR
                mask = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x891B, packed)[20:24])  # SIOCGIFNETMASK
            except OSError:
                continue
            out.append((name, addr, mask))
    finally:
        sock.close()
    return out


def iface_holding(ip, same_subnet):
    """The interface that holds address `ip`; with `same_subnet`, else one whose IPv4 subnet contains it (127.0.0.5
    is on lo, 127.0.0.1/8). None when none does (launcher/probe.py's approach: ioctl, /proc/net/if_inet6)."""
    if ":" in ip:
        try:
            want = socket.inet_pton(socket.AF_INET6, ip).hex()
            with open("/proc/net/if_inet6") as handle:
                for line in handle:
                    words = line.split()
                    if len(words) >= 6 and words[0] == want:
                        return words[5]
        except (OSError, ValueError):
            pass
        return None
    try:
        ifaces = _ipv4_ifaces()
        target = struct.unpack("!I", socket.inet_aton(ip))[0]
    except (OSError, ImportError, AttributeError):
        return None
    for name, addr, _ in ifaces:
        if addr == ip:
            return name
    if same_subnet:
        for name, addr, mask in ifaces:
            bits = struct.unpack("!I", socket.inet_aton(mask))[0]
            if struct.unpack("!I", socket.inet_aton(addr))[0] & bits == target & bits:
                return name
    return None


def route_iface(master_addr, master_port):
    """(interface, None): the one this node reaches master_addr through; (None, why) when there is none.

    On the master's own node the route is via lo while its peers come in elsewhere: when master_addr is an address
    an interface here holds, that interface. Otherwise a UDP connect (it sends nothing) gives the source address.
    """
    try:
        infos = socket.getaddrinfo(master_addr, master_port, 0, socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as exc:
        return None, "it does not resolve here (%s)" % exc
    for info in infos:
        name = iface_holding(info[4][0].split("%")[0], same_subnet=False)
        if name is not None:
            return name, None
    family, _, _, _, sockaddr = infos[0]
    try:
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.connect(sockaddr)
            ip = sock.getsockname()[0].split("%")[0]
        finally:
            sock.close()
    except OSError as exc:
        return None, "no route to it (%s)" % exc
    name = iface_holding(ip, same_subnet=True)
    if name is None:
        return None, "no interface here holds %s, the address this node sends to it from" % ip
    return name, None


def socket_ifname(request):
    """(interface or None, None) for NCCL/GLOO_SOCKET_IFNAME; (None, why) when `auto` finds no interface."""
    if request["socket_ifname"] != "auto":
        return request["socket_ifname"], None
    return route_iface(request["master_addr"], request["master_port"])


def spawn(request, run_dir):
    """Start torchrun in its own session; its output goes to the run's log file."""
    os.makedirs(run_dir, mode=0o700)
    home = node_path
    argv = [home(w) if i in request.get("expand_home", []) else w for i, w in enumerate(request["argv"])]
    public = {k: v for k, v in request["env"].items() if k not in request.get("secret_names", [])}
    write_atomic(os.path.join(run_dir, "command.json"), json.dumps({
        "argv": argv, "workdir": request["workdir"], "env": dict(socket_env(request["socket_ifname"]), **public),
        "unset_env": request["unset_env"], "secret_env": sorted(request.get("secret_names", [])),
        "node_rank": request.get("node_rank"), "nodes": request.get("nodes"),
    }, indent=1))
    write_atomic(os.path.join(run_dir, "started_at"), repr(time.time()))
    env = torchrun_env(request, os.environ)
    # torchrun's own lines go to a file of their own, its workers' to theirs (--redirects); the merger makes `log`.
    merger = LogMerger(run_dir, request["mark"], request["log_tail"])
    own = open(merger.own, "ab")
    try:
        proc = subprocess.Popen(argv, cwd=home(request["workdir"]), env=env, stdin=subprocess.DEVNULL,
                                stdout=own, stderr=subprocess.STDOUT, start_new_session=True)
    except BaseException:
        os.close(merger.out)
        raise
    finally:
        own.close()
    proc.merger = merger.start()  # `finish` drains it before the exit code is recorded
    try:
        write_atomic(os.path.join(run_dir, "pgid"), str(proc.pid))
        record_leader(run_dir, proc.pid)
        # The keeper is this process (the attached agent or the detached daemon): it records the exit code.
        write_atomic(os.path.join(run_dir, "keeper"), "%d %d" % (os.getpid(), start_time(os.getpid())))
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)  # unrecorded, it would be a run nobody can stop: it never started
        proc.wait()
        merger.close()
        raise
    return proc


def finish(proc, run_dir, mark, grace):
    """Wait for torchrun, sweep what it left, record its exit code (128+N for a signal, like a shell).

    Whatever ended torchrun (its workers, a KILL, a stop), every process still carrying the run's mark is stopped
    (TERM, grace, KILL) before the exit is recorded: a killed torchrun leaves no worker holding a GPU.
    """
    code = proc.wait()
    code = 128 - code if code < 0 else code
    _, left = sweep_run(run_dir, mark, grace)
    proc.merger.close()  # every line in `log` before the exit code says the log is complete
    record(os.path.join(run_dir, "exit_code"), str(code))
    record(os.path.join(run_dir, "ended_at"), repr(time.time()))
    return code, left


def record_stop(run_dir):
    """Note that the run was asked to stop (status then says `stopped`, not `exited`); best effort."""
    path = os.path.join(run_dir, "stop_requested")
    if not os.path.exists(path):
        record(path, str(time.time()))


def record(path, text):
    """Bookkeeping that must never stand in the way of a stop or a report (a full disk on the node)."""
    try:
        write_atomic(path, text)
        return True
    except OSError:
        return False


def sweep_run(run_dir, mark, grace):
    """Stop what is left of a run that ended by itself, without marking the run as stopped."""
    return stop_run(run_dir, mark, grace, record=False)


def start(request):
    run_id, _, node = request["mark"].partition("/")
    problem = names_problem({"run_id": run_id or None, "node": node}) or (None if run_id else "the run has no id")
    if problem or request["run_dir"] != "%s/%s/%s" % (RUNS_ROOT, run_id, node):
        return refuse(problem or "the run directory must be %s/<run id>/<node>" % RUNS_ROOT)
    run_dir = run_dir_of(request)
    words = LauncherWords()
    section = request.get("preflight")  # only with the doctor on
    checks = Preflight(section) if section else None
    words.on_tcp = checks.tcp if checks is not None else None
    threading.Thread(target=words.listen, daemon=True, name="listen").start()
    try:
        if checks is not None:
            checks.run()  # the doctor's evidence first: the launcher judges it even when a check below fails
        code = start_checked(request, run_dir, words)
    finally:
        if checks is not None:
            checks.close()  # master_port is let go before torchrun's store binds it
    if code is not None:
        return code
    if request["detach"]:
        return start_detached(request, run_dir)
    try:
        proc = spawn(request, run_dir)
    except OSError as exc:
        emit("error", message="cannot start torchrun: %s" % exc)
        return 2
    emit("started", pid=proc.pid, run_dir=run_dir)
    return attend(request, run_dir, proc, words)


def start_checked(request, run_dir, words):
    """Check what this node can, say `ready` and wait for `go`; None on `go`, else the agent's exit code."""
    node = request["mark"].partition("/")[2]
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
    ifname, problem = socket_ifname(request)
    if problem is not None:
        emit("error", message="%s: socket_ifname auto found no interface toward master_addr %s: %s; name the "
                              "interface in the inventory (socket_ifname: eth0)" % (node, request["master_addr"],
                                                                                   problem))
        return 2
    request["socket_ifname"] = ifname  # auto, found once: spawn (here or in the keeper) sets this
    # Ready, then nothing until every node is: a run starts on all nodes or on none (no run directory, no process).
    emit("ready")
    if not words.wait_for_go(request["heartbeat_timeout"], request["alive_interval"]):
        emit("aborted", reason=words.stop_word)
        return 0
    return None


class Preflight:
    """The doctor's fast probe inside the start session (a launch with the doctor on): no session of its own.

    The probe is the node package's own module (launcher/node/probe.py, sent with the agent); the request's
    `preflight` section holds every request and number it needs, from the launcher
    (launcher.doctor.collect.session_section):
    - probe: what the probe looks at; its answer goes out as the `probed` event;
    - listen (the master only): master_port is bound before the probe (the answer says whether it is free) and
      answers every connection with the token until `go`, `abort` or a stop, and at most max_s;
    - connect: on the launcher's `tcp` word, once every node has probed (so the master's listener is up), this
      node connects to master_addr:master_port and says what it found as the `tcp` event.
    """

    def __init__(self, section):
        from launcher.node import probe  # only a launch with the doctor on compiles it

        self.section = section
        self.probe = probe
        self.listener = None  # (thread, the write end of the pipe that stops it, its read end)

    def run(self):
        listen = self.section.get("listen")
        reply = None
        if listen:
            max_s = self.probe.seconds(listen, "max_s", "listen")
            server, reply = self.probe.open_listener(listen["master_port"])
            if server is not None:
                stop_r, stop_w = os.pipe()
                thread = threading.Thread(target=self.probe.serve, daemon=True, name="listener",
                                          args=(server, listen["token"], time.monotonic() + max_s, reply, stop_r))
                thread.start()
                self.listener = (thread, stop_w, stop_r)
        emit("probed", probe=self.probe.probe(self.section["probe"]), listener=reply)

    def tcp(self):
        connect = self.section["connect"]
        seconds = self.probe.seconds
        window, read_s = seconds(connect, "window", "connect"), seconds(connect, "token_read_s", "connect")
        probe = self.section["probe"]
        emit("tcp", tcp=self.probe.tcp_connect(probe["master_addr"], probe["master_port"], connect["token"],
                                                  window, read_s))

    def close(self):
        if self.listener is not None:
            thread, stop_w, stop_r = self.listener
            self.listener = None
            os.close(stop_w)
            thread.join()
            os.close(stop_r)


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
            finish(proc, run_dir, request["mark"], request["grace"])
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


class LauncherWords:
    """The launcher's words on stdin, read by one thread for the whole start: heartbeats, `go`, `stop`, `kill`.

    EOF means the launcher or its network is gone. `decided` is set by `go` and by anything that stops the run.
    """

    def __init__(self):
        self.last_word = time.monotonic()
        self.stop_word = None
        self.go = False
        self.decided = threading.Event()
        self.on_tcp = None
        """What `tcp` starts (the doctor's TCP check, `Preflight.tcp`), on a thread of its own."""

    def listen(self):
        for line in sys.stdin:
            self.last_word = time.monotonic()
            word = line.strip()
            if word in ("stop", "kill", "abort"):  # abort: the launcher's checks failed somewhere
                self.stop_word = word
            elif word == "go":
                self.go = self.stop_word is None
            elif word == "tcp" and self.on_tcp is not None:
                threading.Thread(target=self.on_tcp, daemon=True, name="tcp").start()
            if word in ("go", "stop", "kill", "abort"):
                self.decided.set()
        if self.stop_word is None:
            self.stop_word = "launcher-gone"
        self.decided.set()

    def wait_for_go(self, heartbeat_timeout, alive_interval):
        """True on `go`; False when the launcher stopped the start, left, or fell silent first.

        The other nodes may take long to get ready (a cold start): `alive` beats say this one is still here.
        """
        beat = time.monotonic()
        while not self.decided.wait(0.1):
            if time.monotonic() - self.last_word > heartbeat_timeout:
                self.stop_word = "heartbeat-timeout"
                return False
            if time.monotonic() - beat >= alive_interval:
                beat = time.monotonic()
                emit("alive")
        return self.go


class Attended:
    """An attached run's node side: threads that talk to the launcher, and a supervisor that never waits on them.

    - words: the launcher's stdin lines (heartbeats, `stop`, `kill`), read since the start (`LauncherWords`).
    - stream: the run's log file -> stdout, as it grows (a `LogMerger` thread, started with torchrun, makes that
      file from torchrun's and its workers' files; it only reads and appends files).
    - events: JSON events -> stderr, and an `alive` event every `alive_interval` s so the launcher can tell a
      silent node from a quiet one.
    The supervisor (the calling thread) only polls torchrun and the clock: a launcher that reads slowly, or not at
    all, can delay what reaches it but never a stop, a sweep or the exit code on the node.
    """

    def __init__(self, request, run_dir, proc, words):
        self.request, self.run_dir, self.proc = request, run_dir, proc
        self.words = words
        self.done = threading.Event()
        self.streamed_at = time.monotonic()

    def stream(self):
        with open(os.path.join(self.run_dir, "log"), "rb") as log:
            while True:
                finished = self.done.is_set()  # read before the last read: nothing is written after it is set
                chunk = log.read(1 << 16)
                if chunk:
                    if not write_all(1, chunk):
                        return
                    self.streamed_at = time.monotonic()
                elif finished:
                    return
                else:
                    self.done.wait(0.05)

    def send_events(self):
        while True:
            line = _EVENTS.get()
            if line is None or not write_all(2, line):
                return

    def tick(self):
        while not self.done.wait(self.request["alive_interval"]):
            if _EVENTS.qsize() < 100:  # a launcher that reads nothing gets no pile of beats
                emit("alive")

    def supervise(self):
        request = self.request
        stopping, stop_at = None, None
        while self.proc.poll() is None:
            if self.words.stop_word is None and time.monotonic() - self.words.last_word > request["heartbeat_timeout"]:
                self.words.stop_word = "heartbeat-timeout"
            if self.words.stop_word is not None and stopping is None:
                stopping, stop_at = self.words.stop_word, time.monotonic()
                threading.Thread(target=stop_run, daemon=True, args=(
                    self.run_dir, request["mark"], 0 if stopping == "kill" else request["grace"])).start()
                emit("stopping", reason=stopping)
            if stopping is not None and self.words.stop_word == "kill":
                signal_run(self.run_dir, request["mark"], signal.SIGKILL)
            time.sleep(0.05)
        # A stop already gave TERM: its workers get what is left of the grace period, not a second one.
        grace = request["grace"] if stop_at is None else max(0.0, stop_at + request["grace"] - time.monotonic())
        killed = self.words.stop_word == "kill"  # a `kill` after a `stop` (a second Ctrl-C) ends the grace too
        code, left = finish(self.proc, self.run_dir, request["mark"], 0 if killed else grace)
        self.done.set()
        return code, left, stopping


def attend(request, run_dir, proc, words):
    """Stream the log, obey stop lines, stop the run when the launcher is gone, sweep, report the exit."""
    global _EVENTS
    _EVENTS = queue.Queue()
    run = Attended(request, run_dir, proc, words)
    signal.signal(signal.SIGHUP, lambda *_: setattr(words, "stop_word", "launcher-gone"))
    signal.signal(signal.SIGTERM, lambda *_: setattr(words, "stop_word", "stop"))
    threads = {name: threading.Thread(target=getattr(run, name), daemon=True, name=name)
               for name in ("stream", "send_events", "tick")}
    for thread in threads.values():
        thread.start()
    code, left, stopping = run.supervise()
    if stopping:
        emit("stopped", left=left, reason=stopping)
    # The log goes out whole while the launcher takes it; a launcher that stopped reading gets no more wait.
    while threads["stream"].is_alive() and time.monotonic() - run.streamed_at < request["heartbeat_timeout"]:
        threads["stream"].join(0.1)
    emit("exited", code=code, left=left, reason=stopping)
    _EVENTS.put(None)
    threads["send_events"].join(5)
    return code


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
    problem = names_problem(request)
    if problem:
        return refuse(problem)
    grace = request.get("grace")
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        return refuse("a stop request needs its grace period (seconds, a number >= 0); got %r" % (grace,))
    run_id, run_dir = find_run_dir(request)
    if run_dir is None:
        return reply({"run_id": run_id, "state": "none", "found": 0, "left": 0})
    mark = "%s/%s" % (run_id, request["node"])
    keeper = leader_of(run_dir, "keeper")
    if request.get("kill_keeper") and keeper is not None and same_process(*keeper):
        # The launcher found this run's agent silent (stopped, stuck): it can neither stop its run nor record it.
        signal_process(keeper[0], keeper[1], signal.SIGKILL)
    found, left = stop_run(run_dir, mark, grace)
    # The run's keeper records the exit code a moment after torchrun is gone; a dead keeper never will.
    deadline = time.time() + 2
    while (found and not os.path.exists(os.path.join(run_dir, "exit_code")) and time.time() < deadline
           and keeper is not None and same_process(*keeper)):
        time.sleep(0.02)
    result = describe(run_id, run_dir, request["node"])
    result.update(found=found, left=left)
    return reply(result)


def action_status(request):
    problem = names_problem(request)
    if problem:
        return refuse(problem)
    run_id, run_dir = find_run_dir(request)
    return reply(describe(run_id, run_dir, request["node"]))


def runs_here(node):
    """The runs directory and the ids of the runs this node took part in, oldest first."""
    root = node_path(RUNS_ROOT)
    return root, sorted(r for r in list_runs(root) if os.path.isdir(os.path.join(root, r, node)))


def action_runs(request):
    problem = names_problem(request)
    if problem:
        return refuse(problem)
    return reply({"runs": runs_here(request["node"])[1]})


def live_marks():
    """The run marks this user's live processes carry, each once: one pass over /proc for every run listed."""
    needle = ("\0%s=" % RUN_ID_ENV).encode()
    marks = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or not same_process(int(entry), start_time(int(entry))):
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as f:
                env = b"\0" + f.read()
        except OSError:
            continue
        at = env.find(needle)
        if at >= 0:
            marks.add(env[at + len(needle):env.find(b"\0", at + 1)].decode("utf-8", "replace"))
    return marks


def action_list(request):
    """Every run on this node with its state and the nodes it was started on: what `inv stop` chooses from."""
    problem = names_problem(request)
    if problem:
        return refuse(problem)
    node = request["node"]
    root, run_ids = runs_here(node)
    marks = live_marks()
    found = []
    for run_id in run_ids:
        run_dir = os.path.join(root, run_id, node)
        try:
            nodes = json.loads(read_text(os.path.join(run_dir, "command.json"), "{}")).get("nodes")
        except (ValueError, AttributeError):
            nodes = None
        if "%s/%s" % (run_id, node) in marks:
            state = "running"
        elif os.path.exists(os.path.join(run_dir, "exit_code")):
            state = "stopped" if os.path.exists(os.path.join(run_dir, "stop_requested")) else "exited"
        else:
            state = "lost"
        found.append({"run_id": run_id, "state": state, "nodes": nodes})
    return reply({"runs": found})


def action_logs(request):
    problem = names_problem(request)
    if problem:
        return refuse(problem)
    run_id, run_dir = find_run_dir(request)
    if run_dir is None:
        emit("error", message="no run %s on this node" % (run_id or "at all"))
        return 3
    emit("run", run_id=run_id)
    with open(os.path.join(run_dir, "log"), "rb") as log:
        if request.get("follow"):
            return follow_log(log, run_dir, run_id, "%s/%s" % (run_id, request["node"]))
        while True:
            chunk = log.read(1 << 16)
            if not chunk:
                return 0
            if not write_all(1, chunk):
                return 1  # the launcher is gone


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
    return 0


ACTIONS = {"start": start, "stop": action_stop, "status": action_status, "logs": action_logs,
           "runs": action_runs, "list": action_list}


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
