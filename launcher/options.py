"""How a launch behaves, and the one home of every default: invoke.yaml, the tasks and the node agent read them here.

Every number of a node program that the controller decides arrives in its request (NODE_TIMING, SYNC_TIMING, the
doctor's sections; see `runs.start_request`); their own local bounds (nvidia-smi's limit, the DNS budget, read sizes)
live in launcher/node/limits.py, each with its reason.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from launcher.errors import LauncherError

if TYPE_CHECKING:
    from launcher.run.gate import StartGate

DEFAULT_CONNECT_TIMEOUT = 10.0
"""Seconds to wait for each node's SSH connection (TCP, handshake and authentication), and nothing more."""
DEFAULT_FANOUT = 64
"""At most this many SSH handshakes (and short node commands: stop, status, logs) under way at once; more nodes go
in waves. Measured on the 64-node sandbox (bench/results, `fanout`): connecting to all 64 nodes took 1.7-1.9 s and
0.5-0.6 CPU s of the launcher whatever the limit from 16 to 64 (2.0 s at 8, 2.3-2.5 s at 4), so a lower limit
buys nothing on the controller. A lower one is for what sits in between: a ProxyJump host whose sshd refuses
handshakes beyond its `MaxStartups` (10 by default)."""
FDS_PER_NODE = 6
"""Open files a node costs the launcher for a whole run: its socket, Paramiko's channel pipe and event, a selector,
and room for a ProxyJump hop (measured ~4 without one)."""
FD_RESERVE = 64
"""Open files the launcher needs besides its nodes (Python, logs, the console, pipes)."""
DEFAULT_PROBE_TIMEOUT = 120.0
"""Seconds each node's doctor probe (`inv doctor`, launch's preflight) has to answer, from its request to its answer.

The probe's own work is a second or two plus its bounded DNS and TCP waits; what takes long is starting the node's
Python. From a cold network filesystem (a venv or conda env on NFS/Lustre, an empty page cache) that start takes
tens of seconds on real clusters, and so did 64 probes sharing the sandbox's 2 cores (a 10 s limit failed 48-51 of
them). Two minutes fits such a cold start with room to spare; a node slower than that would keep a launch waiting
as long again when torchrun starts there. A node that answers but slowly is a warning with its time, never a failure
(`launcher.doctor.checks.slow_probe_limit`); this limit only decides when one that never answers is given up on.
"""
DEFAULT_GRACE = 10.0
"""Seconds between TERM and KILL when a run is stopped."""
DEFAULT_HEARTBEAT_TIMEOUT = 30.0
"""A node stops its part of an attached run by itself after this long without a word from the launcher."""
DEFAULT_SILENCE_TIMEOUT = 30.0
"""The launcher fails a run when a node has sent nothing (not even its agent's heartbeat) for this long."""
DEFAULT_CONSOLE_BUFFER = 1_000_000
"""Lines the console may lag behind the run before it skips lines (they still land in the log files). Output
arrives in blocks of up to 64 KiB (~2,000 short lines) per node, and the console's thread competes for the GIL
with the nodes' readers: with 10,000 or 100,000 lines, `inv launch > file` of a job printing a million lines in
a few seconds skipped lines (bench `logs`). A million short lines are ~60 MB, held only while a console (a pager
left open, Ctrl-S) really is that far behind."""
HEARTBEAT_DIVISOR = 4
"""Heartbeats go this many times per timeout, so that one late beat never stops a healthy run."""
MAX_LINE_BYTES = 64 * 1024
"""A line longer than this (output without newlines) is cut into pieces of this size, each marked."""
LOG_POLL_S = 0.05
"""Seconds a node's agent waits before it looks again at quiet worker log files: the most a line lags there."""
LOG_CHUNK = 64 * 1024
"""Bytes a node's agent reads from one worker's log file at a time (a full read means more waits: no pause)."""
DEFAULT_RETRY_WAIT = 3.0
"""Seconds between a failed attempt and the doctor's checks before the next (`--retries`): what a node that is
rebooting, or a port in TIME_WAIT, needs to show what it is."""
DEFAULT_RETRY_COOLDOWN = 300.0
"""A node that caused two failed attempts sits out the attempts that start within this many seconds (Horovod's
blacklist with a cool-down): one more try after it may have been fixed, never a loop on a bad node."""
DEFAULT_HOSTS = "hosts/cluster.yaml"
DEFAULT_LOG_DIR = "logs"
SLURM_STOP_WAIT = 120.0
"""Seconds `inv stop --job` waits for SLURM to end every process of a job (its KillWait is 30 s by default)."""
ACTION_MARGIN = 20.0
"""Seconds an agent action (stop, status) may take beyond its grace period before it counts as lost."""
MAX_SECONDS = 86400.0
"""The most any time option may be (a day): what select(), thread waits and timers take without overflow."""
MIN_HEARTBEAT_S = 1.0
"""The least heartbeat_timeout and silence_timeout may be: a beat every quarter of it, never a busy loop."""
MIN_WAIT_S = 0.1
"""The least connect_timeout and probe_timeout may be."""
MAX_NPROC_PER_NODE = 1024
"""The most worker processes on one node (nproc_per_node, a hostfile's slots=): more would fork until a limit."""
MAX_RETRIES = 1000
"""The most relaunches (`retries`) of one run."""
MAX_CONSOLE_BUFFER = 100_000_000
"""The most lines the console may lag behind (`console_buffer`)."""
DEFAULT_CONSOLE_BUFFER_BYTES = 64 << 20
"""Characters (about bytes) of output the console may hold behind a slow terminal, whatever the lines' count: lines
are cut at 64 KiB, so a million of them could have held 64 GB (1,500 long lines took 94 MiB)."""
MIN_CONSOLE_BUFFER_BYTES = 1 << 20
MAX_CONSOLE_BUFFER_BYTES = 16 << 30

STRAGGLER_FACTOR = 0.8
"""A rank is slow below this share of the median rank's step rate..."""
STRAGGLER_HOLD_S = 60.0
"""...for this long (in the view and a launch's console; `inv top --once` judges the rates of its one look)."""


def heartbeat_interval(timeout: float) -> float:
    """Seconds between two heartbeats for a given timeout (at most 5 s)."""
    return min(5.0, timeout / HEARTBEAT_DIVISOR)


@dataclass
class Options:
    """How a launch (and stop, status, logs) behaves; the task layer fills it from the command line and invoke.yaml."""

    detach: bool = False
    """Start the run and return; status, logs and stop work on it later."""
    grace: float = DEFAULT_GRACE
    """Seconds between TERM and KILL when a run is stopped."""
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    """A node stops its part by itself when the launcher has been silent this long."""
    silence_timeout: float = DEFAULT_SILENCE_TIMEOUT
    """The run fails when a node has sent nothing for this long (`node-1 stopped answering`)."""
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    """Seconds to wait for each node's SSH connection."""
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    """Seconds each node's doctor probe (launch's preflight too) has to answer once sent."""
    console_buffer: int = DEFAULT_CONSOLE_BUFFER
    """Lines the console may lag behind."""
    console_buffer_bytes: int = DEFAULT_CONSOLE_BUFFER_BYTES
    """Characters the console may hold behind, whatever the number of lines."""
    """Lines the console may lag behind before lines are skipped on it (never in the log files)."""
    log_dir: Path = Path(DEFAULT_LOG_DIR)
    """Where the controller mirrors each node's output: <log_dir>/<run_id>/<node>.log."""
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    """Where node output goes (prefixed lines)."""
    err: IO[str] = field(default_factory=lambda: sys.stderr)
    """Where the launcher's own progress and reports go."""
    preflight: StartGate | None = None
    """What runs before anything starts: the doctor's fast checks in every agent's start session
    (`launcher.doctor.collect.SessionPreflight`), and work on the open connections first (`launch --sync`)."""
    retries: int | None = None
    """How often a run that lost a node is started again (None: the inventory's `retries`)."""
    retry_wait: float = DEFAULT_RETRY_WAIT
    """Seconds between a failed attempt and the checks before the next."""
    retry_cooldown: float = DEFAULT_RETRY_COOLDOWN
    """Seconds a node that caused two failed attempts sits out."""
    hang_timeout: float | None = None
    """Seconds without progress (no rank printed a line, no rank's CPU time grew) after which a run is suspected
    hung; None: learnt from the run (`launcher.plan.hang`); 0: never."""
    on_hang: str = "stop"
    """What a suspected hang does after every rank's stack is taken: `stop` the run (exit code 124) or `keep` it."""
    straggler_factor: float = STRAGGLER_FACTOR
    """A rank whose step rate is below this share of the median rank's..."""
    straggler_hold: float = STRAGGLER_HOLD_S
    """...for this many seconds is a straggler (`inv top`, a launch's console, `inv status`)."""
    on_event: Callable[[Any], None] | None = None
    """Called with every typed node event of an attached run (`launcher.run.handle`), from the launcher's threads:
    it must not block. For tools such as the bench."""

    @property
    def action_timeout(self) -> float:
        """How long a stop/status action may take on a node: the grace period plus a margin, never less."""
        return self.grace + ACTION_MARGIN


# name -> (kind, minimum, maximum), both allowed; checked for invoke.yaml and the command line alike.
_NUMBERS: dict[str, tuple[type, float, float]] = {
    "grace": (float, 0.0, MAX_SECONDS),
    "heartbeat_timeout": (float, MIN_HEARTBEAT_S, MAX_SECONDS),
    "silence_timeout": (float, MIN_HEARTBEAT_S, MAX_SECONDS),
    "connect_timeout": (float, MIN_WAIT_S, MAX_SECONDS),
    "probe_timeout": (float, MIN_WAIT_S, MAX_SECONDS),
    "console_buffer": (int, 1, MAX_CONSOLE_BUFFER),
    "console_buffer_bytes": (int, MIN_CONSOLE_BUFFER_BYTES, MAX_CONSOLE_BUFFER_BYTES),
    "retry_wait": (float, 0.0, MAX_SECONDS),
    "retry_cooldown": (float, 0.0, MAX_SECONDS),
    "retries": (int, 0, MAX_RETRIES),
    "hang_timeout": (float, 0.0, MAX_SECONDS),
    "straggler_factor": (float, 0.01, 1.0),
    "straggler_hold": (float, 0.0, MAX_SECONDS),
}
_SHARES = ("straggler_factor",)
"""Float options that are a share, not seconds (the messages say so)."""
ON_HANG = ("stop", "keep")
COMMAND_LINE_ONLY = ("retries",)
"""Options that an inventory sets for its cluster, and the command line for one launch: never invoke.yaml."""
CONFIG_KEYS = ("hosts", "log_dir", *(k for k in _NUMBERS if k not in COMMAND_LINE_ONLY))
"""The keys `launcher:` in invoke.yaml may hold."""


def config_defaults() -> dict[str, Any]:
    """The `launcher:` settings' defaults, for Invoke's collection (tasks.py): invoke.yaml then holds only what a
    user changes, and Invoke casts INVOKE_LAUNCHER_GRACE=2.5 to these values' types (10.0: a float)."""
    defaults = {f.name: f.default for f in fields(Options)}
    values = {key: defaults[key] for key in CONFIG_KEYS if key not in ("hosts", "log_dir")}
    return {"hosts": DEFAULT_HOSTS, "log_dir": str(defaults["log_dir"]), **values}


def number(name: str, value: Any, source: str) -> float | int:
    """`value` as the number option `name` needs; a LauncherError naming `source` (e.g. `--grace`) otherwise."""
    kind, minimum, maximum = _NUMBERS[name]
    shown = str(value)[:40]
    unit = "" if kind is int or name in _SHARES else " seconds"
    what = "a whole number" if kind is int else f"a number{' of seconds' if unit else ''}"
    if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()):
        raise LauncherError(f"{source} must be {what}, got {shown!r}")
    try:
        result = kind(value)
    except (TypeError, ValueError):
        raise LauncherError(f"{source} must be {what}, got {shown!r}") from None
    if kind is float and not math.isfinite(result):
        raise LauncherError(f"{source} must be a finite {what[2:]}, got {shown!r}")
    if not minimum <= result <= maximum:
        low, high = (f"{minimum:g}", f"{maximum:g}{unit}") if kind is float else (f"{minimum}", f"{maximum}")
        raise LauncherError(f"{source} must be from {low} to {high}, got {shown!r}")
    return result


def from_config(config: Mapping[str, Any], overrides: Mapping[str, Any], config_name: str = "invoke.yaml") -> Options:
    """Options from invoke.yaml's `launcher:` section, then command-line overrides (None means not given).

    Every value is checked: a wrong one in invoke.yaml names `invoke.yaml: launcher.KEY`, one on the command line
    names `--key`.
    """
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise LauncherError(f"{config_name}: launcher.{unknown[0]}: unknown key; known keys: {', '.join(CONFIG_KEYS)}")
    names = {f.name for f in fields(Options)}
    values: dict[str, Any] = {}
    for key, value in config.items():
        if value is None:  # the collection's default for a setting that has none (hang_timeout: learnt)
            continue
        if key in _NUMBERS:
            values[key] = number(key, value, f"{config_name}: launcher.{key}")
        elif key == "log_dir":
            values[key] = Path(str(value))
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in names:
            raise LauncherError(f"unknown option {key!r}")
        values[key] = number(key, value, f"--{key.replace('_', '-')}") if key in _NUMBERS else value
    if values.get("on_hang", "stop") not in ON_HANG:
        raise LauncherError(f"--on-hang must be one of {', '.join(ON_HANG)}, got {str(values['on_hang'])[:40]!r}")
    return Options(**values)


# --- an attached run's decisions (launcher.run) -----------------------------------------------------------------
STALL = 2.0
"""A gap this long between two of the waiter's steps means the launcher itself was frozen, not its nodes."""
STOP_MARGIN = 5.0
"""Seconds beyond the grace period that a node gets to confirm a stop before the launcher gives up on it."""
SWEEP_MARGIN = 3.0
"""Seconds beyond the grace period the launcher waits for a sweep over a new channel (a node whose sshd answers
needs about one: a session, the agent's start, a look at /proc); one whose sshd does not is reported instead."""


# --- the doctor's judgement (launcher.doctor) ---------------------------------------------------------------------
MIN_DISK_BYTES = 1 << 30
"""Less free space than this where a node's workdir is fails the doctor's disk check."""
MAX_CLOCK_SKEW_S = 5.0
"""A node's clock further than this from the controller's fails the doctor's clock check."""
SLOW_PROBE_MARGIN_S = 2.0
"""A slow probe answered at least this much later than the typical node's (above SSH and interpreter-start noise)."""
SLOW_PROBE_FACTOR = 2.0
"""... and took at least this many times as long (a load every node shares is nobody's fault)."""
SLOW_PROBE_SHARE = 0.5
"""A probe that used more than this share of probe_timeout is slow whatever its peers took: the next may not fit."""


# --- the doctor's probes (launcher.doctor.collect) --------------------------------------------------------------------
LISTEN_WINDOW_S = 3.0
"""How long a node keeps retrying a refused connection to the master's listener (which may still be starting)."""
TOKEN_READ_S = 2.0
"""How long a node waits for the listener's token once connected (no answer: something else listens there)."""
LISTENER_MARGIN_S = 5.0
"""The master's listener lives this much longer than the probes may take (it stops earlier when they have answered)."""
RESOLVE_WORKERS = 16
"""Threads each node's probe resolves names on: every host's name, on every node, is N lookups a node (N x N in the
cluster); 16 at a time keep a 256-node doctor within the probe's DNS budget without N threads per node."""


# --- SLURM (launcher.slurm) -------------------------------------------------------------------------------------------
STEP_END_WAIT = 5.0
"""Seconds the step gets to end by itself once its stdin closed (every agent then stops its part) before SIGTERM."""
SUBMIT_TIMEOUT = 120.0
"""Seconds sbatch may take (it retries an unreadable slurm.conf for 60 s before it gives up)."""
QUERY_TIMEOUT = 30.0
"""Seconds squeue, scontrol, sacct or scancel may take."""
SACCT_TIMEOUT = 10.0
"""Seconds sacct may take: it is only asked about jobs the controller has forgotten, and a record may answer."""
SLURM_POLL = 1.0
"""Seconds between two looks at a job that is followed or being cancelled."""
SLURM_TAIL_CHUNK = 1 << 20
"""Bytes of a job's output read and printed at a time: memory stays this, whatever the file's size."""


# --- the console and the log mirror (launcher.report) -----------------------------------------------------------------
MIRROR_QUEUE_CHUNKS = 1024
"""Chunks (up to 64 KiB each) the log copy may lag behind the run before it gives up with a warning."""
MIRROR_CLOSE_S = 30.0
"""How long the launcher waits at the end for the log copy to reach the disk."""
TAIL_LINES = 40
"""Lines of each node's output kept for the root-cause report."""
TAIL_WIDTH = 1000
"""Characters of each of those lines kept (a progress bar without newlines is one long line)."""


# --- retries (launcher.plan.retry) ------------------------------------------------------------------------------------
FAILURES_TO_BLACKLIST = 2
"""A node that caused this many failed attempts sits out for the cool-down (one failure may be bad luck)."""


# --- code sync (launcher.sync) ----------------------------------------------------------------------------------------
SYNC_REPLY_TIMEOUT = 60.0
"""Seconds a node may take to answer (start Python and stat the tree; rename everything into place)."""
SYNC_SEND_CHUNK = 1 << 20
"""Bytes per send: small files are packed together into chunks of this size."""
SYNC_LOCK_WAIT = 60.0
"""Seconds a node's sync waits for another sync into the same destination (a shared workdir) to end."""


# --- SSH channels (launcher.transport) --------------------------------------------------------------------------------
SEND_LOCK_WAIT = 0.1
"""Seconds a non-blocking send waits for another send on the same channel (a few bytes take microseconds)."""


# --- reading an inventory (launcher.config) ---------------------------------------------------------------------------
MAX_MERGED_PAIRS = 100_000
"""At most this many key/value pairs in all mappings together once merge keys (`<<`) are expanded: a few hundred
hosts of a few dozen keys stay far below it; a merge-key bomb (each level merging the one before twice) does not."""
DEFAULT_MASTER_PORT = 29500
"""torchrun's rendezvous port when the inventory names none (torchrun's own default)."""


# --- the sandbox (launcher.sandbox) -----------------------------------------------------------------------------------
SANDBOX_STOP_GRACE_S = 3.0
"""Seconds between TERM and KILL when a sandbox node is stopped."""
SANDBOX_STOP_LIMIT_S = 60.0
"""How long a stop may take in all before it gives up and names what it could not stop."""
SANDBOX_MAX_NODES = 200
"""The most sshd nodes one sandbox starts (each takes a loopback address and a few processes)."""
SANDBOX_CPUS_PER_NODE = 2
"""CPUs each sandbox node declares to its slurmd."""


NODE_CODE_CACHE: dict[str, object] = {"root": "~/.cache/ddp-launcher/code", "keep_s": 30 * 24 * 3600.0}
"""Where each node keeps the node modules compiled (launcher/node/loader.py: ~9 ms of CPU a session saved), and how
long an entry not written again is kept (entries are removed when a new one is stored)."""


# --- the node programs' waits and read sizes (sent in every request; their own local bounds: node/limits.py) -------
NODE_TIMING: dict[str, float] = {
    "poll_s": 0.05,  # a stop's wait steps; an attached agent's KILL again while its run is killed
    "wait_s": 0.1,  # `go`'s wait and a followed log's idle step
    "check_s": 1.0,  # a followed log's look at the run and the launcher; an attached agent's at the heartbeat clock
    "keeper_poll_s": 0.02,  # a stop's look at whether the run's keeper has recorded the exit code
    "keeper_wait_s": 2.0,  # how long a stop waits for that record
    "kill_wait_s": 5.0,  # how long a stop waits for KILLed processes to be gone
    "read_chunk": 1 << 16,  # bytes of the log read at a time
}
"""Every wait and read size of the node agent (launcher/node/protocol.py `AGENT_TIMING`): each agent request's
`timing`."""
SYNC_TIMING: dict[str, float] = {"wait_s": 0.1, "read_chunk": 1 << 20}
"""syncd's: between two tries at another sync's lock; bytes of the stream read at a time."""


# --- stacks and hangs (launcher.run.stacks, launcher.plan.hang) -----------------------------------------------------
STACKS_WAIT_S = 5.0
"""Seconds each worker has to write its stack once asked (faulthandler answers in milliseconds; a node under load
may not)."""
FLIGHT_RECORDER_ENV = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
"""NCCL's flight recorder for a run on GPU nodes (the last 2000 collectives per rank, dumped on a timeout into the
run directory), unless the user set any of its variables."""
NCCL_MAX_BYTES = 64 << 20
"""The most of a node's flight recorder dumps brought back with its stacks."""
EVENT_CHUNK = 800
"""Characters of data in one `part` event line: a large answer (every worker's stack) travels in parts, as srun
cuts long output lines."""
STACKS_MARGIN_S = 3.0
"""Seconds beyond STACKS_WAIT_S the launcher waits for a node's stacks (the node's answer has to travel too)."""
HANG_FLOOR_S = 300.0
"""The learnt hang timeout is never shorter: a healthy run may be quiet this long (a checkpoint, an evaluation)."""
HANG_FACTOR = 4.0
"""The learnt hang timeout is this many times the longest quiet gap the run has shown between progress lines."""
HANG_CPU_SHARE = 0.1
"""A rank whose CPU time grows faster than this share of the wall time is making progress, printed or not."""
HANG_EXIT = 124
"""The launcher's exit code when it stopped a run it found hung (`timeout`'s code)."""

# `inv top` (launcher/run/top.py; the node side is launcher/node/top.py).
TOP_INTERVAL_S = 1.0
"""Seconds between two views (each node's agent sends a snapshot that often)."""
TOP_ONCE_S = 3.0
"""How long `inv top --once` watches before its snapshot: CPU % and step rates need two looks."""
TOP_READ_S = 0.1
"""How often a node's agent reads its ranks' new output between snapshots: a step's time is known to this much."""
TOP_TAIL_BYTES = 64 << 10
"""How much of a rank's files written before the view began is read for its last line and step."""
TOP_KEEP_LINES = 20
"""Lines of the followed rank (`l` in the view) each snapshot carries."""
TOP_RATE_WINDOW_S = 30.0
"""A rank's step rate is over its steps of the last this many seconds."""
TOP_GPU_TIMEOUT_S = 5.0
"""The most one `nvidia-smi --query-gpu` may take on a node."""
DEFAULT_PROGRESS = r"\bstep[ =:#]*(?P<step>\d+)|(?P<tqdm>\d+)/\d+ \["
"""A rank's progress lines when the job names none (`job.progress`): train/ddp.py's `step N`, tqdm's `N/M [`."""

# `inv doctor --net` (launcher/doctor/net.py; the job is launcher/doctor/netjob.py).
JOB_DOCTOR_PORT_SHIFT = 1
"""`inv doctor --job ID`: the job's own run holds master_port, so the checks and `--net` use this port beside it."""
NET_SIZES = (8, 1 << 20, 16 << 20, 256 << 20)
"""The all_reduce sizes of the whole group, in bytes: the smallest gives the latency, the largest the bandwidth."""
NET_BUDGET_S = 1.0
"""Seconds one size may take (as many runs as fit, at least one); a size over it skips the larger ones."""
NET_PAIR_BYTES = 16 << 20
"""The all_reduce of each pair of neighbours in the ring."""
NET_MAX_ITERS = 20
"""The most runs of one size."""
NET_SLOW_SHARE = 0.5
"""A node whose best link carries under this share of the median node's is flagged."""
NET_TIMEOUT_S = 300.0
"""The most the whole measurement may take, from the start of its torchrun to its answer."""
