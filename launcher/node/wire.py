"""What the launcher and a node's programs say to each other (stdlib only, Python 3.8+): names and messages.

The controller imports this module too (launcher.plan.launchplan, launcher.run), and no other of launcher/node/: both
sides spell every message alike, and agree here on the exit codes, the events' descriptor and the names (NCCL's
dumps, a sync's temporary and lock files, a sync's path checks) that each side reads of the other's.
- stdin carries the launcher's messages to the agent, one per line: any line is a heartbeat (`hb` says nothing else);
  `go` starts a run every node is ready for, `abort` drops it, `stop` (grace) and `kill` (now) end it, `tcp`
  starts the doctor's TCP check on a node.
- stderr carries the agent's events, one JSON object per line (`emit`), each named by an `Event` name; stdout the
  run's log bytes, or an action's one JSON reply (`reply`).
"""

import json
import os
import sys
import threading
import time

EVENTS_FD = 3
"""Where events go: the launcher's command line opens fd 3 onto the session's stderr (`3>&2`), so a `python:`
wrapper that sends the program's own stderr elsewhere (`exec python "$@" 2>/dev/null`, common in module and conda
wrappers) cannot swallow them, and the launch does not wait out its probe timeout for words it will never get.
Started without it (by hand, an older command line), events go to stderr."""

RUN_ID_ENV = "DDP_LAUNCHER_RUN"
"""Every process of a run carries RUN_ID_ENV=<run id>/<node> (its mark): how a stop finds them, never by name."""
ATTEMPT_ENV = "DDP_LAUNCHER_ATTEMPT"
"""Every process of a launch's second attempt carries ATTEMPT_ENV=2 (3, ... after it; none in the first): which
attempt of the launch it is (`--retries`, `--on-hang restart`). A script that resumes on a retry reads it (or its
checkpoint's presence) as it reads torchrun's TORCHELASTIC_RESTART_COUNT: an argument added on a retry would break a
script that does not take it."""
RUNS_ROOT = "~/.cache/ddp-launcher/runs"
RUN_ID_PATTERN = r"\d{8}-\d{6}-[0-9a-f]{6}"
"""A run id names no other path: it becomes a folder under RUNS_ROOT on every node."""
SOCKET_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
"""What the inventory's socket_ifname sets (`socket_values`)."""
DEVICE_ORDER = ("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
"""What a run gets unless its node or inventory orders the GPUs otherwise: CUDA numbers them as nvidia-smi does (its
default, FASTEST_FIRST, may not), so an index (`--include host:0,2`, the doctor's GPU n) means one GPU to both."""


def socket_values(ifname):
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME for one interface: `=eth0` to NCCL, whose bare name is a prefix
    (eth0 would match eth0.100 too), the bare name to gloo, which takes one interface's name."""
    return {SOCKET_ENV[0]: "=" + ifname, SOCKET_ENV[1]: ifname}


GO, ABORT, STOP, KILL, TCP, HEARTBEAT, STACKS, DUMPS = "go", "abort", "stop", "kill", "tcp", "hb", "stacks", "dumps"
"""The launcher's messages to an agent, one a line on its stdin (`word_line` makes the line); `stacks` asks an attached
run's agent for every worker's stack (the `stacks` event), `dumps` for NCCL's flight recorder dumps of a hung run
through torch's debug-info pipes (the `nccl` event)."""
POSITION = "position"
"""Asks an attached run's supervisor how long its log is now (the `position` event): a launcher that was away (frozen,
asleep) knows from it when it has caught up with what its nodes printed meanwhile."""
STOPPED_BY = "stopped-by"
"""`stopped-by WORDS`, before a stop: who stopped the run (`the user (Ctrl-C in its launcher)`, `its launcher (a
hang)`), which the node keeps for `status`."""


def stopped_by(why):
    """Who a launcher's stop is, from its why (`interrupted (Ctrl-C)`, `a hang: ...`), as `stopped-by` says it."""
    return (
        "the user (Ctrl-C in its launcher)"
        if why.startswith("interrupted")
        else "its launcher (%s)" % why.split(":")[0]
    )


ENDING_MESSAGES = (STOP, KILL, ABORT)
"""Messages after which no run starts or goes on."""
STOPPED_ELSEWHERE = "stopped-elsewhere"
"""Why an attached run ended that its own launcher did not stop: a stop from another terminal (`inv stop`, the API's
`Run.stop`) asked for it, as the run directory's stop record says: the user's will, not a failure."""
HEARTBEAT_TIMEOUT, LAUNCHER_GONE = "heartbeat-timeout", "launcher-gone"
"""Why an attached agent stops its run without being asked (an event's `reason`, beside the messages `stop`/`kill`):
no message from any launcher for heartbeat_timeout (the bound a launcher may be away: asleep, unreachable, killed), or,
under SLURM only, the step's stdin closed (srun is the run's owner there: without it the step ends anyway)."""


class Event:
    """The name of every event a node program says (`emit`: the `event` field), and nothing else: the controller's
    dispatch (launcher.run.sessions) and the typed events (launcher.events) take the names from here."""

    READY = "ready"
    """An attached agent checked what it could and waits for `go`."""
    ABORTED = "aborted"
    """... and dropped the start instead (`abort`, a stop message, the launcher gone): no run directory, no process."""
    PROBED = "probed"
    """The doctor's probe in the start session (fields: probe, listener)."""
    TCP = "tcp"
    """Its connection to the master's listener (the doctor's TCP check; field: tcp)."""
    STARTED = "started"
    """torchrun started (fields: pid, run_dir; detached: the agent's work ends here)."""
    ALIVE = "alive"
    """The attached agent's beat (field: progress, each rank as the hang watch sees it, when watched)."""
    STOPPING = "stopping"
    """It began to stop the run (field: reason: a message, or why it stopped by itself)."""
    STOPPED = "stopped"
    """The stop is over (fields: left, reason); `exited` follows with the same."""
    EXITED = "exited"
    """torchrun's end (fields: code, left, reason, workers: whether it ever started its workers, which it does only
    after the rendezvous): the attached agent's last event."""
    ERROR = "error"
    """Something went wrong (field: message); any node program may say it."""
    RUN = "run"
    """The logs action found the run it replays (field: run_id)."""
    STACKS = "stacks"
    """Every worker's stack (fields: workers, nccl), the answer to the message `stacks`; sent as parts."""
    NCCL = "nccl"
    """NCCL's flight recorder dumps written as the run ended, or asked for by `dumps` (fields: nccl, and asked: the
    ranks whose pipe was written to); sent as parts."""
    PART = "part"
    """A piece of a large event (fields: of, seq, count, data): `emit_parts`."""
    ATTACHED = "attached"
    """An attach session became the run's console (fields: log_bytes, the log's size now; away_s, how long no launcher
    had sent a message; replay: the run had ended and this session replays its end; owner_was, when another launcher's
    run was taken over)."""
    TAKEN = "taken"
    """This console's launcher no longer owns the run: another launcher attached (`ddpl attach`) (fields: by, at)."""
    POSITION = "position"
    """The answer to the message `position` (field: log_bytes)."""


EVENTS = tuple(value for name, value in vars(Event).items() if name.isupper())
"""Every event name, once."""


def host_arg(name):
    """A host name as getaddrinfo takes it: an ASCII one as bytes (a str goes through the idna codec first, whose
    imports cost 2 ms of CPU on every node), any other as it is."""
    return name.encode("ascii") if name.isascii() else name


def error_text(exc):
    """An exception as one short line (`[Errno 111] Connection refused`, `gai error -2: Name or ...`)."""
    socket = sys.modules.get("socket")  # not imported by this program: not one of its errors (a stop imports none)
    if socket is not None and isinstance(exc, socket.gaierror):
        return "gai error %s: %s" % (exc.errno, exc.strerror)
    if isinstance(exc, OSError) and exc.strerror:
        return "[Errno %s] %s" % (exc.errno, exc.strerror)
    return "%s: %s" % (type(exc).__name__, exc)


def message_line(message):
    """A message as it goes on the wire."""
    return (message + "\n").encode()


RANK_TAG = "[default%d@r%d]:"
"""How the agent tags a worker's line: torchrun --tee's `[<role><local rank>]:` with the global rank added (the
format torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE gave before); launcher.report.lines reads it."""

LOCAL_TAG = "[default%d]:"
"""The tag when the worker's global rank cannot be told (it ended before the agent saw its environment)."""


def _events_fd():
    """EVENTS_FD when the command line opened it onto a pipe or socket (a session's stderr), else stderr: never a
    file some other code happened to open as fd 3."""
    import stat

    try:
        mode = os.fstat(EVENTS_FD).st_mode
    except OSError:
        return 2
    return EVENTS_FD if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode) else 2


def close_events_fd():
    """For a process that outlives its session (a detached run's supervisor): the session's stderr is not its to
    hold."""
    try:
        os.close(EVENTS_FD)
    except OSError:
        pass


def emit(event, **fields):
    """One JSON event line for the launcher (`EVENTS_FD`); while attached, through a writer thread of its own."""
    fields["event"] = event
    fields.setdefault("time", time.time())
    line = event_line(fields)
    if _EVENTS is not None:
        _EVENTS.put((event, time.monotonic(), line))
    else:
        with _WRITE_LOCK:  # whole lines, whichever thread says them (a `tcp` answer, an `alive` beat)
            write_all(EVENT_OUT, line)  # a failure: the launcher is gone; the run directory still records everything


def event_line(fields):
    """An event as it goes on the wire: one JSON line."""
    return (json.dumps(fields) + "\n").encode()


# While a run is attached, events go through this queue: the supervision never waits on a launcher that reads
# slowly or not at all (a stopped sshd, a full pipe).
_EVENTS = None
EVENT_OUT = _events_fd()
_WRITE_LOCK = threading.Lock()


def emit_parts(event, chunk, **fields):
    """A large event (every worker's stack) as `part` events of at most `chunk` characters of data each: srun cuts
    long output lines, so no event line may be long. The launcher puts the parts back together."""
    import base64
    import zlib

    data = base64.b64encode(zlib.compress(json.dumps(fields).encode())).decode("ascii")
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] or [""]
    for seq, piece in enumerate(pieces):
        emit(Event.PART, of=event, seq=seq, count=len(pieces), data=piece)


def queue_events():
    """From now on `emit` only queues its lines; the caller's writer thread sends them (`next_event`)."""
    import queue

    global _EVENTS
    _EVENTS = queue.Queue()


def next_event():
    """The next queued event as (name, when it was made (monotonic), its line); waits for one; None once `end_events`
    was called."""
    return _EVENTS.get()


def queued_events():
    """How many event lines wait to be sent."""
    return _EVENTS.qsize()


def end_events():
    _EVENTS.put(None)


def write_all(fd, data):
    """Write all of `data` to a file descriptor, unbuffered; False when the reader is gone."""
    try:
        while data:
            data = data[os.write(fd, data) :]
        return True
    except OSError:
        return False


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
    return 0


class BadRequest(Exception):
    """A request the probe cannot work from (a number it needs is missing or not one); the message says which."""


def seconds(section, key, where):
    """`section[key]` as a number of seconds >= 0; BadRequest when the controller did not send one."""
    value = section.get(key) if isinstance(section, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise BadRequest(f"the {where} request needs {key} (seconds, a number >= 0); got {value!r}")
    return float(value)


AGENT_TIMING = (
    "poll_s",
    "wait_s",
    "check_s",
    "supervisor_poll_s",
    "supervisor_wait_s",
    "kill_wait_s",
    "read_chunk",
    "store_wait_s",
    "store_poll_s",
)
"""The waits and read sizes every agent request carries in `timing` (launcher.options.NODE_TIMING)."""
SYNC_TIMING = ("wait_s", "read_chunk", "relay_connect_s", "relay_wait_s", "relay_chunk")
"""Those of a sync request (launcher.options.SYNC_TIMING)."""
_TIMING = {}


def use_timing(request, keys):
    """Take every wait and read size of the run's supervision from the request's `timing` (the node programs' own
    local bounds are in launcher/node/common/bounds.py); BadRequest naming the first missing or wrong one."""
    section = request.get("timing")
    for key in keys:
        value = section.get(key) if isinstance(section, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise BadRequest("the request's timing needs %s (a number > 0); got %r" % (key, value))
        _TIMING[key] = value


def timing(key):
    """A wait (seconds) or read size (bytes) the controller sent (`use_timing`)."""
    return _TIMING[key]


# --- an attach session's exit codes (agent/attach.py; launcher.run.sessions) ------------------------------------------
ATTACH_REFUSED = 3
"""An `attach` session's exit code when the node has no such run, or one that takes no console (a detached run)."""
SUPERVISOR_GONE = 5
"""An `attach` session's exit code when nothing keeps the run and it has not ended: its supervisor (the agent) died."""
SUPERVISOR_SILENT = 6
"""... when the supervisor is there but did not take the session in time (stopped, stuck): the launcher's silence
rules."""

# --- NCCL's flight recorder dumps (agent/recorder.py; launcher.watch.flightrec, launcher.report.hangs) ----------------
NCCL_PREFIX = "nccl_trace_rank_"
"""torch writes <prefix><rank> (TORCH_FR_DUMP_TEMP_FILE) on NCCL's timeout and when its pipe asks."""

# --- a sync's names (sync/; launcher.sync.tree checks the local tree by the same rules) -------------------------------
LOCK_NAME = ".ddp-launcher-sync.lock"
TEMP_PREFIX = ".ddp-sync."
"""Temporary names are `.ddp-sync.<token>.<n>` (and `.old` for a kept old file): short whatever the entry's name."""


class Refused(Exception):
    """One sentence for the controller: why this node's sync cannot go on."""


def check_name(path):
    """The relative path's parts, or Refused when it is absolute, has `..`, `.` or empty parts, or a NUL."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\0" in path:
        raise Refused(f"refusing path {path!r}: only relative paths inside the destination are allowed")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise Refused(f"refusing path {path!r}: it would leave the destination (`..`, `.` or empty parts)")
    return parts


def check_link_target(path, target):
    """A symlink's target must be relative and resolve (lexically) inside dest."""
    if not target or target.startswith("/") or "\0" in target:
        raise Refused(f"refusing symlink {path} -> {target}: it points outside the destination")
    depth = len(path.split("/")) - 1
    for part in target.split("/"):
        if part == "..":
            depth -= 1
        elif part not in ("", "."):
            depth += 1
        if depth < 0:
            raise Refused(f"refusing symlink {path} -> {target}: it points outside the destination")


def link_chain(path, target, is_link):
    """The first path (relative to dest) that `path`'s target passes through and that `is_link` says is a symlink,
    else None: targets are checked lexically, so a symlink on the way could lead anywhere."""
    parts = path.split("/")[:-1]
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            parts = parts[:-1]
            continue
        parts.append(part)
        if is_link("/".join(parts)):
            return "/".join(parts)
    return None


def probe_answer(stdout):
    """A probe's answer in its output: the last line that is a JSON object. A `python:` that is a wrapper may print
    before its interpreter starts or after it ends (`wrapper-done`), and exit as it likes: the launch's start gate
    reads the agent's events whatever the wrapper adds, and so do the doctor, the image's probe and `--pull`."""
    for line in reversed(stdout.splitlines()):
        if line.lstrip().startswith("{"):
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if isinstance(answer, dict):
                return answer
    return None
