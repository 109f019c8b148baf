"""A node's environment for torchrun, resolved on the controller at launch: env file, forwarded variables, `env`.

Precedence (later wins): the host's `env_file`, then its `forward_env` matches, then `socket_ifname` (set by the
node's agent, which alone knows the interface for `auto`), then the inventory's `env`. Names torchrun sets
(RESERVED_ENV) never leave this machine from an env file or a forwarded glob. Which names are secret travels with
the values, so the agent keeps them out of its run directory's command.json.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator, Mapping
from fnmatch import fnmatchcase

from dotenv import dotenv_values
from dotenv.parser import Binding, parse_stream

from launcher.config.fields import RESERVED_ENV, SOCKET_ENV
from launcher.config.model import EnvFile
from launcher.errors import LauncherError
from launcher.plan.launchplan import NodeCommand

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class NodeEnv(Mapping[str, str]):
    """The variables sent to one node (name -> value), and which of them are secret."""

    def __init__(self, values: Mapping[str, str], secret_names: frozenset[str] = frozenset()):
        self._values = dict(values)
        self.secret_names = secret_names
        """Names whose values are never shown, logged or written to the node's command.json."""

    def __getitem__(self, name: str) -> str:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:  # values stay out of tracebacks and test reports: they may be secrets
        return f"NodeEnv(names={sorted(self._values)}, secret_names={sorted(self.secret_names)})"


def is_reserved(name: str) -> bool:
    """Whether torchrun sets `name` (an exact name of RESERVED_ENV, or TORCHELASTIC_*)."""
    return any(fnmatchcase(name, reserved) for reserved in RESERVED_ENV)


def _line_of(binding: Binding) -> int:
    """The line of a dotenv entry: python-dotenv's `line` is where the blank lines before it begin."""
    text = binding.original.string
    return binding.original.line + text[: len(text) - len(text.lstrip())].count("\n")


def read_env_file(host: str, env_file: EnvFile) -> dict[str, str]:
    """The variables of a dotenv file on this machine, by python-dotenv's rules (`${NAME}` expands from the file's
    earlier lines and this machine's environment); a file that cannot be read, a line that cannot be parsed, a
    name without a value or an invalid name is one LauncherError (never quoting a value)."""
    path = os.path.expanduser(env_file.path)
    where = f"{host}: env_file {env_file.path}"
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise LauncherError(
            f"{where} cannot be read ({exc.strerror or exc}); create it, or change env_file in the inventory"
        ) from None
    except UnicodeDecodeError:
        raise LauncherError(f"{where} is not UTF-8 text") from None
    for binding in parse_stream(io.StringIO(text)):
        # Nothing of the file is quoted: a token pasted without `NAME=` parses as a name.
        line = f"{where}, line {_line_of(binding)}"
        if binding.error:
            raise LauncherError(f"{line}: cannot be read as NAME=value")
        if binding.key is not None and not _NAME.match(binding.key):
            raise LauncherError(
                f"{line}: the name before `=` is not a variable name (letters, digits and _, not starting with a digit)"
            )
        if binding.key is not None and binding.value is None:
            raise LauncherError(f"{line}: has no `=`; write NAME=value (NAME= for an empty value)")
    values = {}
    for name, value in dotenv_values(stream=io.StringIO(text)).items():
        values[name] = "" if value is None else value  # None only for the names refused above
    return values


def forwarded(command: NodeCommand, environ: Mapping[str, str]) -> tuple[dict[str, str], set[str]]:
    """The controller's variables that the host's `forward_env` patterns match, and the secret ones among them
    (a name is secret when any secret pattern matches it); reserved names are left out."""
    values: dict[str, str] = {}
    secret: set[str] = set()
    for name in sorted(environ):
        matching = [item for item in command.forward_env if fnmatchcase(name, item.pattern)]
        if not matching or is_reserved(name):
            continue
        values[name] = environ[name]
        if any(item.secret for item in matching):
            secret.add(name)
    return values, secret


def explicit(command: NodeCommand, environ: Mapping[str, str]) -> dict[str, str]:
    """The inventory's `env`; `from_env` values come from the controller's environment now."""
    values = {}
    for var in command.env:
        if var.from_env is not None:
            if var.from_env not in environ:
                raise LauncherError(
                    f"{command.host.name}: env {var.name} is to be copied from ${var.from_env}, "
                    f"which is not set here; export it or remove it from the inventory"
                )
            values[var.name] = environ[var.from_env]
        else:
            values[var.name] = var.value or ""
    return values


def resolve_env(command: NodeCommand, environ: Mapping[str, str]) -> NodeEnv:
    """Everything sent to this node's environment, by precedence: env_file < forward_env < socket_ifname < env."""
    values: dict[str, str] = {}
    secret: set[str] = {v.name for v in command.env if v.secret}
    if command.env_file is not None:
        from_file = {k: v for k, v in read_env_file(command.host.name, command.env_file).items() if not is_reserved(k)}
        values.update(from_file)
        if command.env_file.secret:
            secret.update(from_file)
    copied, secret_copied = forwarded(command, environ)
    values.update(copied)
    secret.update(secret_copied)
    if command.socket_ifname is not None:  # the agent sets these; an env file or a forwarded glob does not win
        for name in SOCKET_ENV:
            values.pop(name, None)
    values.update(explicit(command, environ))
    # A name is secret when any source of it is (a secret file's value that `env` replaced included): hiding one
    # value too many costs a line in command.json, one too few leaks it.
    return NodeEnv(values, frozenset(secret & values.keys()))
