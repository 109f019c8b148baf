"""The settings a command uses, each declared once: its field, type, default and meaning (`Settings`, frozen, grouped
by the room that reads it: `run`, `output`, `ssh`), and where each value came from.

How a user sets them (the command line, settings files, variables, the API's keywords, their bounds and checks) is
`launcher.options`; the inventory's layer (`retries`, `job.hang_timeout`, `job.on_hang`) and whether a restart can
apply where the run is followed are resolved by `launcher.plan.settings.for_run`, once, in the application layer.
Everything below app/ reads the resolved value and decides nothing of it again. The launcher's internal numbers are
`launcher.limits`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

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
(`launcher.doctor.checks_python.slow_probe_limit`); this limit only decides when one that never answers is given up on.
"""
DEFAULT_PULL_TIMEOUT = 1800.0
"""Seconds `--pull` gives each node to pull the container image (every node at once), from its request to its end.

A CUDA image of PyTorch is 10-20 GB: at 1 Gbit/s from a nearby registry that is 2-3 minutes, from a busy public
registry or through a slow mirror (every node of a large cluster pulling at once shares its bandwidth) ten times that.
Half an hour lets such a pull finish; one that takes longer is stuck (a registry that stopped answering), and is
ended with its node's line saying so."""
DEFAULT_GRACE = 10.0
"""Seconds between TERM and KILL when a run is stopped."""
DEFAULT_HEARTBEAT_TIMEOUT: float | None = None
"""How long an attached run's nodes keep it going while no launcher is heard from (a laptop asleep, a network that
roams, a closed terminal, a killed launcher) before each stops its part by itself; None (the default) or 0: no bound,
the run goes on as a detached one would until it ends, `attach` takes it back or `stop` ends it.

What it trades: a laptop closed for lunch or a night, or a VPN that reconnects after an hour, finds its run still
training (with the old 600 s bound a 10-minute lunch ended an attached run, exit code 129); a launcher that died and
never comes back leaves the run to finish on its own, and a run that hangs meanwhile holds its GPUs until someone
looks (`inv status`, `inv top` show it; `inv stop` ends it). A bound (`--heartbeat-timeout S`, the
`heartbeat_timeout` setting) gives the GPUs back S seconds after the launcher was last heard from; a stop you ask for
(Ctrl-C, SIGTERM, `stop`) never waits for either."""
DEFAULT_SILENCE_TIMEOUT = 30.0
"""The launcher fails a run when a node has sent nothing (not even its agent's heartbeat) for this long."""
DEFAULT_CONSOLE_BUFFER = 1_000_000
"""Lines the console may lag behind the run before it skips lines (they still land in the log files). Output
arrives in blocks of up to 64 KiB (~2,000 short lines) per node, and the console's thread competes for the GIL
with the nodes' readers: with 10,000 or 100,000 lines, `inv launch > file` of a job printing a million lines in
a few seconds skipped lines (bench `logs`). A million short lines are ~60 MB, held only while a console (a pager
left open, Ctrl-S) really is that far behind."""
DEFAULT_CONSOLE_BUFFER_BYTES = 64 << 20
"""Characters (about bytes) of output the console may hold behind a slow terminal, whatever the lines' count: lines
are cut at 64 KiB, so a million of them could have held 64 GB (1,500 long lines took 94 MiB)."""
DEFAULT_RETRY_WAIT = 3.0
"""Seconds between a failed attempt and the doctor's checks before the next (`--retries`): what a node that is
rebooting, or a port in TIME_WAIT, needs to show what it is."""
DEFAULT_RETRY_COOLDOWN = 300.0
"""A node that caused two failed attempts sits out the attempts that start within this many seconds (Horovod's
blacklist with a cool-down): one more try after it may have been fixed, never a loop on a bad node."""
DEFAULT_LOG_DIR = "logs"
STRAGGLER_FACTOR = 0.8
"""A rank is slow below this share of the median rank's step rate..."""
STRAGGLER_HOLD_S = 60.0
"""...for this long (a launch's console and stragglers.txt, which `inv status` shows: a line said cannot be taken
back); `inv top`, live or `--once`, marks what each look finds (a row can)."""
DEFAULT_FANOUT = 64
"""At most this many SSH handshakes (and short node commands: stop, status, logs) under way at once; more nodes go
in waves. Measured on the 64-node sandbox (bench/results, `fanout`): connecting to all 64 nodes took 1.7-1.9 s and
0.5-0.6 CPU s of the launcher whatever the limit from 16 to 64 (2.0 s at 8, 2.3-2.5 s at 4), so a lower limit
buys nothing on the controller. A lower one is for what sits in between: a ProxyJump host whose sshd refuses
handshakes beyond its `MaxStartups` (10 by default)."""
ON_HANG = ("stop", "keep", "restart")
"""What a suspected hang may do (`--on-hang`, the inventory's `job.on_hang`)."""
ON_NONFINITE = ("stop", "keep")
"""What a rank's NaN or infinite loss does to an attached run (`--on-nonfinite`, the `on_nonfinite` setting)."""
ON_NONFINITE_HELP = (
    "what a rank's NaN or infinite loss does (a step torch's GradScaler skipped is none): stop the run at once "
    "(exit code 65; the default: the optimizer stepped on it, the all-reduce carries it into every rank's "
    "weights, and the hours after it would be spent on NaN and write NaN checkpoints), or keep it going (the "
    "line is said either way)"
)
"""What `on_nonfinite` means and why it stops by default, the one text of it."""

HANG_TIMEOUT_HELP = (
    f"seconds in which no rank printed a line and no rank's optimizer steps or DataLoader batches "
    f"grew (CPU time is never progress: a hung collective keeps a CPU busy) before the run is "
    f"suspected hung and every rank's stack is taken; unset: learnt from the run ({HANG_FACTOR:g}x "
    f"its longest quiet gap, at least {HANG_FLOOR_S:g} s); 0: never"
)
"""What `hang_timeout` means, the one text of it (launcher.watch.hang's rule): the options' help says it, and every
other place that explains it agrees (tests/unit/test_options.py)."""
HEARTBEAT_TIMEOUT_HELP = (
    "seconds an attached run's nodes keep it going while no launcher is heard from (a laptop asleep, a "
    "network that roams, a closed terminal, a killed launcher; `attach` takes it back meanwhile), then they "
    "stop their part (default, or 0: no bound: the run goes on until it ends or `stop`, and a run that hangs "
    "with no launcher holds its GPUs until then)"
)
"""What `heartbeat_timeout` means and trades, the one text of it (the tasks' help draws on it)."""
SILENCE_TIMEOUT_HELP = (
    "a node that sends nothing (not even a heartbeat) is reconnected to at once; one that cannot "
    "be reached again within this many seconds fails the run (while no node at all can be "
    "reached, the launcher waits for them up to the heartbeat timeout)"
)
"""What `silence_timeout` means, the one text of it."""


@dataclass(frozen=True)
class RunSettings:
    """How a run is started, followed and stopped."""

    detach: bool = False
    """Start the run and return; status, logs and stop work on it later."""
    grace: float = DEFAULT_GRACE
    """Seconds between TERM and KILL when a run is stopped."""
    heartbeat_timeout: float | None = DEFAULT_HEARTBEAT_TIMEOUT
    """How long the nodes keep an attached run going with no launcher heard from, then they stop their part; None or
    0: no bound (`heartbeat_bound`)."""
    silence_timeout: float = DEFAULT_SILENCE_TIMEOUT
    """The run fails when a node has sent nothing, and could not be reached again, for this long (`node-1 stopped
    answering`)."""
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT
    """Seconds each node's doctor probe (launch's start gate too) has to answer once sent."""
    pull_timeout: float = DEFAULT_PULL_TIMEOUT
    """Seconds each node has to pull the container image with `--pull` (launch, doctor), every node at once."""
    hang_timeout: float | None = None
    """`HANG_TIMEOUT_HELP`: None learnt from the run, 0 never."""
    on_hang: str = "stop"
    """What a suspected hang does after every rank's stack is taken (ON_HANG): `stop` the run (exit code 124), `keep`
    it, or `restart` it (one of its retries)."""
    on_nonfinite: str = "stop"
    """What a rank's non-finite loss does to an attached run (ON_NONFINITE): `stop` it (exit code 1, the loss the
    root cause), or `keep` it (the console says it either way)."""
    retries: int = 0
    """How often a run that lost a node is started again on the nodes left (0 wherever no launcher can)."""
    retry_wait: float = DEFAULT_RETRY_WAIT
    """Seconds between a failed attempt and the checks before the next."""
    retry_cooldown: float = DEFAULT_RETRY_COOLDOWN
    """Seconds a node that caused two failed attempts sits out."""
    straggler_factor: float = STRAGGLER_FACTOR
    """A rank whose step rate is below this share of the median rank's..."""
    straggler_hold: float = STRAGGLER_HOLD_S
    """...for this many seconds is told as a straggler (a launch's console, `inv status`); `inv top` marks what each
    look finds."""
    notes: tuple[str, ...] = ()
    """What the user is told before anything starts, of a setting that does not apply where the run is followed."""

    @property
    def action_timeout(self) -> float:
        """How long a stop/status action may take on a node: the grace period plus a margin, never less."""
        return action_timeout(self.grace)

    @property
    def heartbeat_bound(self) -> float | None:
        """Seconds the nodes keep an attached run with no launcher heard from; None: no bound (0 says so too)."""
        return self.heartbeat_timeout or None


@dataclass(frozen=True)
class OutputSettings:
    """Where a command's output goes on this machine, and how far the console may lag."""

    log_dir: Path = Path(DEFAULT_LOG_DIR)
    """Where the controller mirrors each node's output: <log_dir>/<run_id>/<node>.log."""
    console_buffer: int = DEFAULT_CONSOLE_BUFFER
    """Lines the console may lag behind."""
    console_buffer_bytes: int = DEFAULT_CONSOLE_BUFFER_BYTES
    """Characters the console may hold behind, whatever the number of lines."""
    page: bool = True
    """Write the run's page (logs/<run id>/report.html) once it ends: an attached launch's in a process of its own
    after the launch returns, a detached run's at the first status or logs after its end (`report` writes it any
    time)."""


@dataclass(frozen=True)
class SshSettings:
    """How every connection of one command is made."""

    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    """Seconds for each node's TCP connect, SSH handshake and authentication (fractions kept)."""
    keepalive: float | None = None
    """Seconds between SSH keepalives; None takes the ssh config's `ServerAliveInterval`, 0 sends none (an attached
    run's connections send them: `launcher.run.actions.run_ssh`)."""
    fanout: int = DEFAULT_FANOUT
    """At most this many handshakes (and short node commands) under way at once."""


DEFAULT_SSH = SshSettings()
"""The settings a caller that names none gets (immutable: one value serves them all)."""

GROUPS = {"run": RunSettings, "output": OutputSettings, "ssh": SshSettings}
"""Each group of `Settings`, by its field's name."""
INTERNAL = ("notes", "keepalive", "fanout")
"""Fields no user sets: what the resolution says, what a room derives."""
GROUP_OF = {f.name: group for group, kind in GROUPS.items() for f in fields(kind) if f.name not in INTERNAL}
"""Every setting a user may set, by its name (`grace`), and the group that holds it (`run`)."""


@dataclass(frozen=True)
class Settings:
    """Every setting one command uses, and where each came from: what the command line, the settings files and the
    API give (`launcher.options`), then the inventory's (`launcher.plan.settings.for_run`), over the defaults."""

    run: RunSettings = RunSettings()
    output: OutputSettings = OutputSettings()
    ssh: SshSettings = SshSettings()
    sources: Mapping[str, str] = field(default_factory=dict)
    """Where each setting that was set came from, by its name: `--grace`, a settings file or variable, `the caller`
    (an API keyword), the inventory (`hosts/cluster.yaml (retries)`); one at its default is not here."""

    @classmethod
    def of(cls, values: Mapping[str, Any] | None = None, source: str = "the caller", **more: Any) -> Settings:
        """The defaults with these values set (by their names: `grace=5`), each noted as coming from `source`. The
        values are taken as they are: `launcher.options` checks a user's."""
        return cls().updated({**(values or {}), **more}, source)

    def updated(self, values: Mapping[str, Any], source: str | Mapping[str, str]) -> Settings:
        """These values set over the present ones, each noted as coming from `source` (one for all, or by name)."""
        unknown = sorted(set(values) - set(GROUP_OF))
        if unknown:
            raise TypeError(f"no setting is named {unknown[0]!r}")
        groups = {}
        for group in GROUPS:
            mine = {name: value for name, value in values.items() if GROUP_OF[name] == group}
            groups[group] = replace(getattr(self, group), **mine) if mine else getattr(self, group)
        where = {name: source if isinstance(source, str) else source[name] for name in values}
        return replace(self, **groups, sources={**self.sources, **where})

    def value(self, name: str) -> Any:
        """A setting's value by its name (`grace`)."""
        return getattr(getattr(self, GROUP_OF[name]), name)

    def given(self, name: str) -> bool:
        """Whether the setting was set anywhere (else it is at its default)."""
        return name in self.sources
