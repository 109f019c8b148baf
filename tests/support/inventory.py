"""Parsing inventory text as the tests of launcher/config/ do: the one `InventoryError` it raises, and its parts."""

from __future__ import annotations

import re
import textwrap

import pytest

from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster
from launcher.errors import InventoryError

SRC = "hosts/cluster.yaml"
BAD_FLAG = "must be true or false, got a value of type {} (not shown: the entry is secret)"
"""A malformed `secret:` is not quoted: it may be the token itself."""
HIDDEN = "abc123secret"
"""A secret's value, or a key beside `secret: true`: no error about its entry shows it."""


def parse(text: str) -> Cluster:
    return parse_inventory(textwrap.dedent(text), SRC)


def error(text: str) -> InventoryError:
    """The one InventoryError that parsing `text` raises."""
    with pytest.raises(InventoryError) as info:
        parse(text)
    exc = info.value
    assert str(exc).startswith(SRC), str(exc)
    assert "\n" not in str(exc), "one error, one line"
    return exc


def assert_error(text: str, entry: str | None, reason: str | re.Pattern[str], line: int | None = None) -> None:
    exc = error(text)
    assert exc.entry == entry, str(exc)
    if isinstance(reason, re.Pattern):
        assert reason.search(exc.reason), str(exc)
    else:
        assert reason in exc.reason, str(exc)
    if line is not None:
        assert exc.line == line, str(exc)
        assert str(exc).startswith(f"{SRC}:{line}: "), str(exc)
