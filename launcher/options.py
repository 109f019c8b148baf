"""How a user sets the launcher's settings: the command line (`Given`), invoke.yaml or ddpl's settings files and
variables (`from_config`), the API's keywords; each value checked against its bounds, and noted with where it came
from. The settings themselves (each field, its default and meaning) are declared once, in `launcher.settings`; what a
run uses of the inventory's is resolved by `launcher.plan.settings.for_run`. An inventory's own defaults are here too.

The launcher's internal numbers are `launcher.limits`. What a run talks to (output streams, the start gate, an event
sink) is not a setting: it travels apart as `launcher.run.run_io.RunIO`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from launcher.errors import LauncherError, UsageError
from launcher.settings import GROUP_OF, ON_HANG, ON_NONFINITE, Settings

DEFAULT_HOSTS = "hosts/cluster.yaml"
DEFAULT_EXAMPLE = "hosts/example.yaml"
"""Where `init --example` writes the reference inventory in a project."""
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
MIN_CONSOLE_BUFFER_BYTES = 1 << 20
MAX_CONSOLE_BUFFER_BYTES = 16 << 30


@dataclass(frozen=True)
class Given:
    """The options one command line gave (None: not given), as Invoke hands them (numbers as text; `from_config`
    checks each): typed, so that a task names only options that exist and a reader can follow each to its use."""

    detach: bool = False
    grace: str | float | None = None
    connect_timeout: str | float | None = None
    probe_timeout: str | float | None = None
    pull_timeout: str | float | None = None
    silence_timeout: str | float | None = None
    heartbeat_timeout: str | float | None = None
    retries: str | int | None = None
    hang_timeout: str | float | None = None
    on_hang: str | None = None
    on_nonfinite: str | None = None

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
    "pull_timeout": (float, MIN_WAIT_S, MAX_SECONDS),
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
_ZERO_IS_NONE = ("heartbeat_timeout",)
"""Bounds that 0 turns off (below their minimum otherwise): invoke.yaml cannot say None."""
"""Float options that are a share, not seconds (the messages say so)."""
COMMAND_LINE_ONLY = ("retries",)
"""Options that an inventory sets for its cluster, and the command line for one launch: never invoke.yaml."""
CONFIG_KEYS = ("hosts", "log_dir", *(k for k in _NUMBERS if k not in COMMAND_LINE_ONLY), "page", "on_nonfinite")
"""The keys `launcher:` in invoke.yaml may hold."""


def config_defaults() -> dict[str, Any]:
    """The `launcher:` settings' defaults, for Invoke's collection (tasks.py): invoke.yaml then holds only what a
    user changes, and Invoke casts INVOKE_LAUNCHER_GRACE=2.5 to these values' types (10.0: a float)."""
    defaults = Settings()
    values = {key: defaults.value(key) for key in CONFIG_KEYS if key not in ("hosts", "log_dir")}
    return {"hosts": DEFAULT_HOSTS, "log_dir": str(defaults.output.log_dir), **values}


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
    if result == 0 and name in _ZERO_IS_NONE:
        return result
    if not minimum <= result <= maximum:
        low, high = (f"{minimum:g}", f"{maximum:g}{unit}") if kind is float else (f"{minimum}", f"{maximum}")
        if name in _ZERO_IS_NONE:
            raise LauncherError(f"{source} must be 0 (no bound) or from {low} to {high}, got {shown!r}")
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


def _choice(value: Any, choices: Sequence[str], source: str) -> str:
    """`value` when it is one of `choices`; a LauncherError naming `source` otherwise."""
    if value not in choices:
        raise LauncherError(f"{source} must be one of {', '.join(choices)}, got {str(value)[:40]!r}")
    return str(value)


def from_config(
    config: Mapping[str, Any],
    overrides: Mapping[str, Any],
    config_name: str = "invoke.yaml",
    *,
    sources: Mapping[str, str] | None = None,
    section: str = "launcher.",
    origins: Mapping[str, str] | None = None,
    given_by: str | None = None,
) -> Settings:
    """The settings of invoke.yaml's `launcher:` section, then the command line's overrides (None means not given),
    each noted with where it came from (`Settings.sources`).

    Every value is checked: a wrong one in invoke.yaml names `invoke.yaml: launcher.KEY`, one on the command line
    names `--key`. `sources` (key -> the file or variable it came from) names that instead of `config_name`, and
    `section` is how the key is written there (`ddpl.yaml: grace`, section ""). `origins` (default: `sources`) says
    where each of `config`'s values came from (Invoke's levels: `default` for one nobody set); without either, a
    value of `config` that differs from its default came from `config_name`. An override came from its option
    (`--grace`), or from `given_by` (the API's keywords: `the caller`).
    """

    def where(key: str) -> str:
        return f"{(sources or {}).get(key, config_name)}: {section}{key}"

    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise LauncherError(f"{where(unknown[0])}: unknown key; known keys: {', '.join(CONFIG_KEYS)}")
    values: dict[str, Any] = {}
    for key, value in config.items():
        if value is None or key == "hosts":  # the collection's default for a setting that has none (hang_timeout)
            continue
        if key in _NUMBERS:
            values[key] = number(key, value, where(key))
        elif key == "log_dir":
            values[key] = Path(str(value))
        elif key == "on_nonfinite":
            values[key] = _choice(value, ON_NONFINITE, where(key))
        elif key == "page":
            if not isinstance(value, bool):
                raise LauncherError(f"{where(key)} must be true or false, got {str(value)[:40]!r}")
            values[key] = value
    known = origins if origins is not None else sources
    defaults = Settings()
    came = {key: known.get(key, config_name) if known is not None else config_name for key in values}
    came = {
        key: origin
        for key, origin in came.items()
        if origin != "default" and (known is not None or values[key] != defaults.value(key))
    }
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in GROUP_OF:
            raise LauncherError(f"unknown option {key!r}")
        values[key] = number(key, value, f"--{key.replace('_', '-')}") if key in _NUMBERS else value
        came[key] = given_by or f"--{key.replace('_', '-')}"
    for key, choices in (("on_hang", ON_HANG), ("on_nonfinite", ON_NONFINITE)):
        if values.get(key) is not None:
            _choice(values[key], choices, f"--{key.replace('_', '-')}")
    return replace(defaults.updated(values, ""), sources=came)  # a value at its default from the defaults is not set


# --- an inventory's defaults (launcher.config) --------------------------------------------------------------
DEFAULT_MASTER_PORT = 29500
"""torchrun's rendezvous port when the inventory names none (torchrun's own default)."""
DEFAULT_PROGRESS = r"\bstep[ =:#]*(?P<step>\d+)|(?P<tqdm>\d+)/\d+ \["
"""A rank's progress lines when the job names none (`job.progress`): train/ddp.py's `step N`, tqdm's `N/M [`."""
