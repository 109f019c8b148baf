"""How a value is shown: a configuration error's value cut to a length, repr built piece by piece (an alias bomb
costs no more than its first characters), and typed ("'x' (str)"). Pure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

SHOWN = 70
"""At most this many characters of a value in a message (entries get twice that)."""
_BRACKETS: dict[type, tuple[str, str]] = {list: ("[", "]"), tuple: ("(", ")"), set: ("{", "}")}


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown(text: str) -> str:
    """A word of a message, quoted and cut to SHOWN characters."""
    return repr(shorten(text, SHOWN))


def render(value: Any, limit: int = SHOWN) -> str:
    """`repr(value)` cut at `limit` characters, built piece by piece: an alias bomb (10**9 leaves) costs no more."""
    out: list[str] = []
    size = 0
    for piece in _repr_pieces(value, limit):
        out.append(piece)
        size += len(piece)
        if size > limit:
            break
    return shorten("".join(out), limit)


def _repr_pieces(value: Any, limit: int) -> Iterator[str]:
    """The pieces of `repr(value)` in order, lazily; every container yields a bracket before going deeper, so
    `_render` stops after at most `limit` levels even in a list that contains itself."""
    if isinstance(value, dict):
        yield "{"
        for i, (key, item) in enumerate(value.items()):
            yield ", " if i else ""
            yield from _repr_pieces(key, limit)
            yield ": "
            yield from _repr_pieces(item, limit)
        yield "}"
    elif type(value) in _BRACKETS and value:  # YAML builds lists, sets (`!!set`) and tuples (`!!omap`)
        opening, closing = _BRACKETS[type(value)]
        yield opening
        for i, item in enumerate(value):
            yield ", " if i else ""
            yield from _repr_pieces(item, limit)
        yield ",)" if type(value) is tuple and len(value) == 1 else closing
    elif isinstance(value, str | bytes):
        yield repr(value[: limit + 1])  # longer than the limit either way, and never copied whole
    else:
        yield repr(value)


def typed(value: Any) -> str:
    return "nothing" if value is None else f"{render(value)} ({type(value).__name__})"
