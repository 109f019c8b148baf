"""The inventory's fields for nodes that share nothing (setup lines, forwarded variables, an env file, the socket
interface, code sync): their types and their checks, as functions of the inventory's Reader (pure: no files read)."""

from __future__ import annotations

import os.path
import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

from launcher.config.model import ENV_FILE_KEYS, FORWARD_ENV_KEYS, SYNC_KEYS, EnvFile, EnvVar, ForwardEnv, SyncSpec
from launcher.config.reader import Reader
from launcher.config.text import shorten
from launcher.node.wire import SOCKET_ENV  # what `socket_ifname` sets on the node

RESERVED_ENV: tuple[str, ...] = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_*",
)
"""Variables that would confuse torchrun (globs allowed): `env:` may not set them, `forward_env:` may not copy them,
and each node's agent removes them from the login environment before it starts torchrun."""


_PATTERN = re.compile(r"[A-Za-z_?*][A-Za-z0-9_?*]*\Z")


_IFNAME = re.compile(r"[A-Za-z0-9_.:-]{1,15}\Z")


_TORCHELASTIC_NAMES = (
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_USE_AGENT_STORE",
)
"""Names torchrun sets under its TORCHELASTIC_* glob: what a forward_env glob is tried against."""


_DANGLING = "&;|"


def reserved_reason(name: str, field: str = "env") -> str | None:
    """Why `name` may not appear in `field` (it is one of RESERVED_ENV), or None when it may."""
    if not any(fnmatchcase(name, reserved) for reserved in RESERVED_ENV):
        return None
    if name in ("MASTER_ADDR", "MASTER_PORT"):
        return f"torchrun sets {name} from rendezvous.{name.lower()}; set that instead of {field}"
    if name == "NODE_RANK":
        return f"the node rank comes from the order of hosts (torchrun's --node-rank); remove it from {field}"
    return f"torchrun sets {name} for every worker; remove it from {field}"


def _reserved_match(pattern: str) -> str | None:
    """A reserved name that the glob `pattern` would copy, or None."""
    for reserved in RESERVED_ENV:
        if fnmatchcase(pattern, reserved):  # TORCHELASTIC_X, TORCHELASTIC_* itself
            return reserved
        if fnmatchcase(reserved, pattern):  # M*_ADDR, *RANK
            return reserved
    return next((name for name in _TORCHELASTIC_NAMES if fnmatchcase(name, pattern)), None)


def shell_line_problem(line: str) -> str | None:
    """What would break when this setup line is joined to the next with ` && `: a comment, a dangling operator."""
    quote: str | None = None
    escaped = False
    previous = " "
    last = ""  # the last character outside quotes and escapes, spaces aside
    for i, ch in enumerate(line):
        if escaped:
            escaped, previous, last = False, "x", "x"
            continue
        if quote is not None:
            if ch == quote:
                quote = None
            elif ch == "\\" and quote == '"':
                escaped = True
            previous = last = "x"
            continue
        if ch == "\\":
            escaped = True
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and previous in " \t;&|()":
            return (
                f"has a shell comment ({shorten(line[i:], 40)!r}), which would hide the rest of the node's command "
                "line; put it on a YAML comment line instead"
            )
        if not ch.isspace():
            last = ch
        previous = ch
    if escaped:
        return "ends with a backslash; each setup line must be a whole command (lines are joined with &&)"
    if quote is None and last and last in _DANGLING:
        return (
            f"ends with {last!r}; each setup line must be a whole command (lines are joined with &&; "
            "write `{ cmd & }` to start something in the background)"
        )
    return None


def parse_node_fields(
    r: Reader, entry: str, fields: Mapping[str, Any], defaults: Mapping[str, Any], env: Mapping[str, EnvVar]
) -> dict[str, Any]:
    """Host keyword arguments for setup, forward_env, env_file and socket_ifname: the host's value replaces the
    defaults' (null too), but forward_env lists are concatenated, defaults' first."""

    def pick(key: str) -> tuple[Any, str]:
        return (fields[key], f"{entry}.{key}") if key in fields else (defaults.get(key), f"defaults.{key}")

    forward = [
        *parse_forward_env(r, defaults.get("forward_env"), "defaults.forward_env"),
        *parse_forward_env(r, fields.get("forward_env"), f"{entry}.forward_env"),
    ]
    merged: dict[str, ForwardEnv] = {}
    for item in forward:  # the same pattern twice: one entry, secret if either says so
        seen = merged.get(item.pattern)
        merged[item.pattern] = ForwardEnv(item.pattern, item.secret or (seen is not None and seen.secret))
    raw_ifname, where = pick("socket_ifname")
    ifname = parse_socket_ifname(r, raw_ifname, where)
    if ifname is not None:
        for name in SOCKET_ENV:
            if name in env:
                origin = f"{entry}.env.{name}" if name in (fields.get("env") or {}) else f"defaults.env.{name}"
                raise r.fail(where, f"sets {' and '.join(SOCKET_ENV)}, but {origin} sets {name} too; keep one of them")
    return {
        "setup": parse_setup(r, *pick("setup")),
        "forward_env": tuple(merged.values()),
        "env_file": parse_env_file(r, *pick("env_file")),
        "socket_ifname": ifname,
    }


def parse_setup(r: Reader, raw: Any, entry: str) -> tuple[str, ...]:
    """Shell lines: a string or a list of them, each kept as written."""
    if raw is None:
        return ()
    if isinstance(raw, list):
        return tuple(parse_setup_line(r, line, f"{entry}[{i}]") for i, line in enumerate(raw))
    if isinstance(raw, dict):
        raise r.fail(entry, f"must be a shell line or a list of them, got {r.show(raw, False)}")
    return (parse_setup_line(r, raw, entry),)


def parse_setup_line(r: Reader, value: Any, entry: str) -> str:
    written = r.written.get(entry)
    if value is not None and written is not None:  # `true`, `010`: as typed, not as YAML 1.1 reads them
        value = written
    if not isinstance(value, str) or not value.strip():
        raise r.fail(entry, f"must be a non-empty shell line, got {r.show(value, False)}")
    if "\n" in value or "\0" in value:
        raise r.fail(entry, "must be one line without NUL characters; give each command its own list item")
    problem = shell_line_problem(value)
    if problem is not None:
        raise r.fail(entry, problem)
    return value


def parse_forward_env(r: Reader, raw: Any, entry: str) -> tuple[ForwardEnv, ...]:
    """A list of patterns, each a string or `{pattern: ..., secret: true}`."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise r.fail(
            entry, f"must be a list of variable names or globs (e.g. [WANDB_*, HF_*]), got {r.show(raw, False)}"
        )
    out = []
    for i, item in enumerate(raw):
        where = f"{entry}[{i}]"
        if not isinstance(item, dict):
            out.append(ForwardEnv(parse_pattern(r, item, where, secret=False)))
            continue
        spec = r.mapping(item, where, FORWARD_ENV_KEYS)
        secret = r.secret_flag(spec.get("secret", False), f"{where}.secret")
        if spec.get("pattern") is None:
            raise r.fail(where, "has no `pattern:` (a variable name, or a glob such as WANDB_*)")
        out.append(ForwardEnv(parse_pattern(r, spec["pattern"], f"{where}.pattern", secret), secret))
    return tuple(out)


def parse_pattern(r: Reader, value: Any, entry: str, secret: bool) -> str:
    if not isinstance(value, str) or not _PATTERN.match(value):
        raise r.fail(
            entry,
            f"must be a variable name or a glob of names (letters, digits, _, and * or ?), got {r.show(value, secret)}",
        )
    if not re.search(r"[A-Za-z0-9_]", value):
        raise r.fail(
            entry,
            f"is {value!r}, which would copy unrelated variables of your shell (PATH, HOME, "
            "...); name a prefix, such as WANDB_*",
        )
    if "*" not in value and "?" not in value:
        reason = reserved_reason(value, "forward_env")
        if reason is not None:
            raise r.fail(entry, reason)
    else:
        reserved = _reserved_match(value)
        if reserved is not None:
            raise r.fail(
                entry, f"would copy {reserved}, which torchrun sets for every worker; use a pattern that leaves it out"
            )
    return value


def parse_env_file(r: Reader, raw: Any, entry: str) -> EnvFile | None:
    """`.env` or `{path: .env, secret: true}`; a relative path is joined to the inventory's folder."""
    if raw is None:
        return None
    secret = False
    if isinstance(raw, dict):
        spec = r.mapping(raw, entry, ENV_FILE_KEYS)
        secret = r.secret_flag(spec.get("secret", False), f"{entry}.secret")
        if spec.get("path") is None:
            raise r.fail(entry, "has no `path:` (a dotenv file on this machine)")
        raw, entry = spec["path"], f"{entry}.path"
    if not isinstance(raw, str):
        raise r.fail(entry, f"must be a file path, got {r.show(raw, False)}")
    path = r.text(raw, entry)
    if not os.path.isabs(path) and not path.startswith("~") and r.folder:
        path = os.path.join(r.folder, path)
    return EnvFile(path, secret)


def parse_socket_ifname(r: Reader, raw: Any, entry: str) -> str | None:
    if raw is None or raw == "auto":
        return raw
    if not isinstance(raw, str) or not _IFNAME.match(raw):
        raise r.fail(
            entry,
            f'must be "auto" or a network interface name (1 to 15 letters, digits, or _.:-), got {r.show(raw, False)}',
        )
    return raw


def parse_sync(r: Reader, raw: Any) -> SyncSpec | None:
    """`sync: {src, dest, exclude}` at the top level; null means no sync."""
    if raw is None:
        return None
    if raw is True:
        raise r.fail(
            "sync", "must be a mapping (`sync: {}` copies the current folder to every workdir), got True (bool)"
        )
    spec = r.mapping(raw, "sync", SYNC_KEYS)
    exclude = spec.get("exclude")
    if exclude is not None and not isinstance(exclude, list):
        raise r.fail("sync.exclude", f"must be a list of gitignore-style patterns, got {r.show(exclude, False)}")
    return SyncSpec(
        src="." if spec.get("src") is None else r.text(spec["src"], "sync.src"),
        dest=None if spec.get("dest") is None else r.text(spec["dest"], "sync.dest"),
        exclude=tuple(r.text(p, f"sync.exclude[{i}]") for i, p in enumerate(exclude or [])),
        relay=parse_relay(r, spec.get("relay", "auto")),
    )


def parse_relay(r: Reader, raw: Any) -> bool | None:
    """`sync.relay`: true, false or "auto" (None: from SYNC_RELAY_MIN_NODES nodes with the same changes)."""
    if raw is None or raw == "auto":
        return None
    if not isinstance(raw, bool):
        raise r.fail(
            "sync.relay",
            "must be true (the nodes pass the tree on to each other), false (each gets it "
            f'from here) or "auto", got {r.show(raw, False)}',
        )
    return raw
