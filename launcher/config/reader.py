"""The inventory parser's primitive checks: each value of a mapping entry checked and typed, and every failure an
`InventoryError` that names the file, the line and the entry ("hosts[1].port"). The parsing itself is functions of
a Reader (launcher/config/inventory.py, fields.py, elastic.py): one parser, no mixins."""

from __future__ import annotations

import difflib
import os.path
import re
from collections.abc import Mapping
from typing import Any, Literal

from launcher.config.model import OTHER_WORDS
from launcher.config.text import SHOWN, render, shorten, typed
from launcher.config.yamltext import is_secret
from launcher.errors import InventoryError
from launcher.options import MAX_NPROC_PER_NODE, MAX_RETRIES, MAX_SECONDS

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


# ssh aliases, DNS names, IPv4 and IPv6 literals; never starting with '-' (it would read as an ssh option).
HOST_NAME = re.compile(r"[A-Za-z0-9_:\[][A-Za-z0-9_.:%\[\]-]*\Z")


class Reader:
    """Where each entry was, to say so in errors; and the checks every field uses."""

    def __init__(self, source: str, lines: dict[str, int], written: Mapping[str, str], folder: str | None = None):
        self.source = source
        self.lines = lines
        self.written = written
        """Entry -> the source text of a plain job argument, env value or setup line (see `_written_texts`)."""
        self.folder = os.path.dirname(source) if folder is None else folder
        """What a relative env_file is relative to: the inventory's folder."""

    def fail(self, entry: str, message: str) -> InventoryError:
        line = self.lines.get(entry)
        parent = entry
        while line is None and parent:  # fall back to the nearest enclosing entry that has a line
            shorter = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", parent)
            parent = shorter if shorter != parent else ""  # a top-level name, or a key we cannot split: the root
            line = self.lines.get(parent)
        return InventoryError(self.source, message, entry=shorten(entry, 2 * SHOWN) or None, line=line)

    def mapping(self, value: Any, entry: str, allowed: tuple[str, ...], secret: bool = False) -> dict[str, Any]:
        """`value` as a mapping of `allowed` keys; an unknown key of a `secret` mapping, or of one that says
        `secret:`, is not quoted (`{secret: true, hf_...}`, `value:` forgotten, makes the token a key)."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(entry, f"must be a mapping, got {typed(value)}")
        for key in value:
            if not isinstance(key, str) or key not in allowed:
                ours = OTHER_WORDS.get(str(key).lower())
                close = [ours] if ours in allowed else difflib.get_close_matches(str(key), allowed, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(allowed)}"
                where = f"{entry}.{key}" if entry else str(key)
                if secret or is_secret(value):  # no did-you-mean either: it would say what the secret resembles
                    line = self.lines.get(where)
                    raise InventoryError(
                        self.source,
                        f"has an unknown key (not shown: the entry is secret); known keys: {', '.join(allowed)}",
                        entry=shorten(entry, 2 * SHOWN),
                        line=line or self.lines.get(entry),
                    )
                raise self.fail(where, f"unknown key {render(key)}{hint}")
        return value

    def show(self, value: Any, secret: bool) -> str:
        """The value for a message, or only its type when it belongs to a secret entry."""
        if secret and value is not None:
            return f"a value of type {type(value).__name__} (not shown: the entry is secret)"
        return typed(value)

    def text(self, value: Any, entry: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(entry, f"must be a non-empty string, got {typed(value)}")
        if "\0" in value or "\n" in value:
            raise self.fail(entry, "must not contain a newline or NUL character")
        return value

    def word(self, value: Any, entry: str, secret: bool = False) -> str:
        """A job argument or env value: the text as written, for a plain scalar; a string or a number otherwise."""
        written = self.written.get(entry)
        if value is None:
            raise self.fail(entry, "must be a string or a number, got nothing; write '' for an empty string")
        # true/false are booleans in every YAML version, and almost always a mistake here; yes/no/on/off only in 1.1
        if written is not None and not (isinstance(value, bool) and written.lower() in ("true", "false")):
            return written  # `010`, `1:30`, `1.10`, `yes`: as typed, not as YAML 1.1 reads them (8, 90, 1.1, True)
        if isinstance(value, bool):
            raise self.fail(
                entry, f"must be a string or a number, got {self.show(value, secret)}; quote it if you mean the word"
            )
        # Numbers are fine as arguments (`--epochs: 3`); lists and mappings are almost always a mistake.
        if not isinstance(value, str | int | float):
            raise self.fail(entry, f"must be a string or a number, got {self.show(value, secret)}")
        if isinstance(value, str) and "\0" in value:
            raise self.fail(entry, "must not contain a NUL character")
        return str(value)

    def host_name(self, value: Any, entry: str) -> str:
        if not isinstance(value, str) or not HOST_NAME.match(value):
            raise self.fail(entry, f"must be a host name, ssh alias or IP address, got {typed(value)}")
        return value

    def port(self, value: Any, entry: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            raise self.fail(entry, f"must be a port number from 1 to 65535, got {typed(value)}")
        return value

    def nproc(self, value: Any, entry: str) -> int | Literal["auto"]:
        if value == "auto":
            return "auto"
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(entry, f'must be a positive integer or "auto", got {typed(value)}')
        if value > MAX_NPROC_PER_NODE:
            raise self.fail(
                entry, f"must be at most {MAX_NPROC_PER_NODE} (worker processes on one node), got {typed(value)}"
            )
        return value

    def secret_flag(self, value: Any, entry: str) -> bool:
        """`secret:`'s value; a malformed one is not quoted (it may be the secret, pasted in the wrong place)."""
        if not isinstance(value, bool):
            raise self.fail(entry, f"must be true or false, got {self.show(value, True)}")
        return value

    def seconds(self, value: Any, entry: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_SECONDS:
            raise self.fail(
                entry, f"must be a number of seconds from 0 to {MAX_SECONDS:g}, got {self.show(value, False)}"
            )
        return float(value)

    def count(self, value: Any, entry: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(entry, f"must be a whole number, 0 or more, got {self.show(value, False)}")
        if value > MAX_RETRIES:
            raise self.fail(entry, f"must be at most {MAX_RETRIES}, got {self.show(value, False)}")
        return value
