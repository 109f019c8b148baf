"""The user's options: what a task does and how long it waits, as one frozen value (`Options`), with their
defaults, their bounds and their checks for invoke.yaml and the command line; an inventory's own defaults too.

The launcher's internal numbers are `launcher.limits`; how nodes are reached over SSH is
`launcher.transport.sshsettings` (`SshSettings.of(opts)` builds it from these). What a run talks to (output streams,
the start gate, an event sink) is not an option: it travels apart as `launcher.run.run_io.RunIO`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from launcher.errors import LauncherError, UsageError
from launcher.limits import HANG_FACTOR, HANG_FLOOR_S, action_timeout

DEFAULT_CONNECT_TIMEOUT = 10.0
"""Seconds to wait for each node's SSH connection (TCP, handshake and authentication), and nothing more."""
DEFAULT_PROBE_TIMEOUT = 120.0
"""Seconds each node's doctor probe (`inv doctor`, launch's start gate) has to answer, from its request to its answer.

The probe's own work is a second or two plus its bounded DNS and TCP waits; what takes long is starting the node's
Python. From a cold network filesystem (a venv or conda env on NFS/Lustre, an empty page cache) that start takes
tens of seconds on real clusters, and so did 64 probes sharing the sandbox's 2 cores (a 10 s limit failed 48-51 of
them). Two minutes fits such a cold start with room to spare; a node slower than that would keep a launch waiting
as long again when torchrun starts there. A node that answers but slowly is a warning with its time, never a failure
(`launcher.doctor.checks_node.slow_probe_limit`); this limit only decides when one that never answers is given up on.
"""
DEFAULT_GRACE = 10.0
"""Seconds between TERM and KILL when a run is stopped."""
DEFAULT_HEARTBEAT_TIMEOUT = 600.0
"""How long an attached run's nodes keep it going while no launcher is heard from (a laptop asleep, a network that
roams, a closed terminal, a killed launcher); then each stops its part by itself and nothing of the run is left.

What it trades: a launcher that comes back within it (or `attach` from another terminal) finds the run still training,
and a launcher that died leaves the GPUs held this long. Ten minutes outlasts a laptop's lid closed for a meeting's
walk or a VPN's reconnect (measured: a 60 s sleep with the old 30 s bound threw away 300 steps); a stop you ask for
(Ctrl-C, SIGTERM, `stop`) never waits for it."""
DEFAULT_SILENCE_TIMEOUT = 30.0
"""The launcher fails a run when a node has sent nothing (not even its agent's heartbeat) for this long."""
DEFAULT_CONSOLE_BUFFER = 1_000_000
"""Lines the console may lag behind the run before it skips lines (they still land in the log files). Output
arrives in blocks of up to 64 KiB (~2,000 short lines) per node, and the console's thread competes for the GIL
with the nodes' readers: with 10,000 or 100,000 lines, `inv launch > file` of a job printing a million lines in
a few seconds skipped lines (bench `logs`). A million short lines are ~60 MB, held only while a console (a pager
left open, Ctrl-S) really is that far behind."""
DEFAULT_RETRY_WAIT = 3.0
"""Seconds between a failed attempt and the doctor's checks before the next (`--retries`): what a node that is
rebooting, or a port in TIME_WAIT, needs to show what it is."""
DEFAULT_RETRY_COOLDOWN = 300.0
"""A node that caused two failed attempts sits out the attempts that start within this many seconds (Horovod's
blacklist with a cool-down): one more try after it may have been fixed, never a loop on a bad node."""
DEFAULT_HOSTS = "hosts/cluster.yaml"
DEFAULT_EXAMPLE = "hosts/example.yaml"
"""Where `init --example` writes the reference inventory in a project."""
DEFAULT_LOG_DIR = "logs"
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

HANG_TIMEOUT_HELP = (f"seconds in which no rank printed a line and no rank's optimizer steps or DataLoader batches "
                     f"grew (CPU time is never progress: a hung collective keeps a CPU busy) before the run is "
                     f"suspected hung and every rank's stack is taken; unset: learnt from the run ({HANG_FACTOR:g}x "
                     f"its longest quiet gap, at least {HANG_FLOOR_S:g} s); 0: never")
"""What `hang_timeout` means, the one text of it (launcher.watch.hang's rule): the options' help says it, and every
other place that explains it agrees (tests/unit/test_options.py)."""

HEARTBEAT_TIMEOUT_HELP = ("how long an attached run's nodes keep it going while no launcher is heard from (a laptop "
                          "asleep, a network that roams, a closed terminal, a killed launcher; `attach` takes it back "
                          "meanwhile); then they stop their part. A launcher that died holds the GPUs this long "
                          f"(default: {DEFAULT_HEARTBEAT_TIMEOUT:g})")
"""What `heartbeat_timeout` means and trades, the one text of it (the tasks' help draws on it)."""
SILENCE_TIMEOUT_HELP = ("a node that sends nothing (not even a heartbeat) is reconnected to at once; one that cannot "
                        "be reached again within this many seconds fails the run (while no node at all can be "
                        "reached, the launcher waits for them up to the heartbeat timeout)")
"""What `silence_timeout` means, the one text of it."""

STRAGGLER_FACTOR = 0.8
"""A rank is slow below this share of the median rank's step rate..."""
STRAGGLER_HOLD_S = 60.0
"""...for this long (a launch's console and stragglers.txt, which `inv status` shows: a line said cannot be taken
back); `inv top`, live or `--once`, marks what each look finds (a row can)."""


@dataclass(frozen=True)
class Options:
    """How a launch (and stop, status, logs) behaves; the task layer fills it from the command line and invoke.yaml."""

    detach: bool = False
    """Start the run and return; status, logs and stop work on it later."""
    grace: float = DEFAULT_GRACE
    """Seconds between TERM and KILL when a run is stopped."""
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    """How long the nodes keep an attached run going with no launcher heard from; then they stop their part."""
    silence_timeout: float = DEFAULT_SILENCE_TIMEOUT
    """The run fails when a node has sent nothing, and could not be reached again, for this long (`node-1 stopped
    answering`)."""
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    """Seconds to wait for each node's SSH connection."""
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    """Seconds each node's doctor probe (launch's start gate too) has to answer once sent."""
    console_buffer: int = DEFAULT_CONSOLE_BUFFER
    """Lines the console may lag behind."""
    console_buffer_bytes: int = DEFAULT_CONSOLE_BUFFER_BYTES
    """Characters the console may hold behind, whatever the number of lines."""
    log_dir: Path = Path(DEFAULT_LOG_DIR)
    """Where the controller mirrors each node's output: <log_dir>/<run_id>/<node>.log."""
    retries: int | None = None
    """How often a run that lost a node is started again (None: the inventory's `retries`)."""
    retry_wait: float = DEFAULT_RETRY_WAIT
    """Seconds between a failed attempt and the checks before the next."""
    retry_cooldown: float = DEFAULT_RETRY_COOLDOWN
    """Seconds a node that caused two failed attempts sits out."""
    hang_timeout: float | None = None
    """`HANG_TIMEOUT_HELP`: None learnt from the run, 0 never."""
    on_hang: str | None = None
    """What a suspected hang does after every rank's stack is taken (ON_HANG): `stop` the run
    (exit code 124), `keep` it, or `restart` it; None: the inventory's `job.on_hang`, else stop."""
    straggler_factor: float = STRAGGLER_FACTOR
    """A rank whose step rate is below this share of the median rank's..."""
    straggler_hold: float = STRAGGLER_HOLD_S
    """...for this many seconds is told as a straggler (a launch's console, `inv status`); `inv top` marks what each
    look finds."""
    page: bool = True
    """Write the run's page (logs/<run id>/report.html) once it ends: an attached launch's in a process of its own
    after the launch returns, a detached run's at the first status or logs after its end (`report` writes it any
    time)."""

    @property
    def action_timeout(self) -> float:
        """How long a stop/status action may take on a node: the grace period plus a margin, never less."""
        return action_timeout(self.grace)


@dataclass(frozen=True)
class Given:
    """The options one command line gave (None: not given), as Invoke hands them (numbers as text; `from_config`
    checks each): typed, so that a task names only options that exist and a reader can follow each to its use."""

    detach: bool = False
    grace: str | float | None = None
    connect_timeout: str | float | None = None
    probe_timeout: str | float | None = None
    silence_timeout: str | float | None = None
    heartbeat_timeout: str | float | None = None
    retries: str | int | None = None
    hang_timeout: str | float | None = None
    on_hang: str | None = None

    def values(self) -> dict[str, Any]:
        """The options given, by name (a flag left off is not given)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) not in (None, False)}


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
ON_HANG = ("stop", "keep", "restart")
"""What a suspected hang may do (`--on-hang`, the inventory's `job.on_hang`)."""
COMMAND_LINE_ONLY = ("retries",)
"""Options that an inventory sets for its cluster, and the command line for one launch: never invoke.yaml."""
CONFIG_KEYS = ("hosts", "log_dir", *(k for k in _NUMBERS if k not in COMMAND_LINE_ONLY), "page")
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


def whole_number(name: str, value: Any, minimum: int = 0, maximum: int | None = None) -> int:
    """`--name`'s value as a whole number within its bounds; a UsageError (exit code 2) naming the option otherwise.
    For the command line's counts that are no setting (`--nodes`, `--rank`, `--master-port`)."""
    option = f"--{name.replace('_', '-')}"
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{option} must be a whole number, got {value!r}") from None
    if number < minimum:
        raise UsageError(f"{option} must be at least {minimum}, got {value!r}")
    if maximum is not None and number > maximum:
        raise UsageError(f"{option} must be at most {maximum}, got {value!r}")
    return number


def from_config(config: Mapping[str, Any], overrides: Mapping[str, Any], config_name: str = "invoke.yaml", *,
                sources: Mapping[str, str] | None = None, section: str = "launcher.") -> Options:
    """Options from invoke.yaml's `launcher:` section, then command-line overrides (None means not given).

    Every value is checked: a wrong one in invoke.yaml names `invoke.yaml: launcher.KEY`, one on the command line
    names `--key`. `sources` (key -> the file or variable it came from) names that instead of `config_name`, and
    `section` is how the key is written there (`ddpl.yaml: grace`, section "").
    """
    def where(key: str) -> str:
        return f"{(sources or {}).get(key, config_name)}: {section}{key}"

    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise LauncherError(f"{where(unknown[0])}: unknown key; known keys: {', '.join(CONFIG_KEYS)}")
    names = {f.name for f in fields(Options)}
    values: dict[str, Any] = {}
    for key, value in config.items():
        if value is None:  # the collection's default for a setting that has none (hang_timeout: learnt)
            continue
        if key in _NUMBERS:
            values[key] = number(key, value, where(key))
        elif key == "log_dir":
            values[key] = Path(str(value))
        elif key == "page":
            if not isinstance(value, bool):
                raise LauncherError(f"{where(key)} must be true or false, got {str(value)[:40]!r}")
            values[key] = value
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in names:
            raise LauncherError(f"unknown option {key!r}")
        values[key] = number(key, value, f"--{key.replace('_', '-')}") if key in _NUMBERS else value
    if values.get("on_hang") not in (None, *ON_HANG):
        raise LauncherError(f"--on-hang must be one of {', '.join(ON_HANG)}, got {str(values['on_hang'])[:40]!r}")
    return Options(**values)


# --- an inventory's defaults (launcher.config) --------------------------------------------------------------
DEFAULT_MASTER_PORT = 29500
"""torchrun's rendezvous port when the inventory names none (torchrun's own default)."""
DEFAULT_PROGRESS = r"\bstep[ =:#]*(?P<step>\d+)|(?P<tqdm>\d+)/\d+ \["
"""A rank's progress lines when the job names none (`job.progress`): train/ddp.py's `step N`, tqdm's `N/M [`."""
