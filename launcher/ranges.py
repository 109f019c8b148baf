"""Lists of ranks and node names as short as they can be said (pure): `0-99,101-255`, `node-[0-99,101-255]`. At
256 nodes of 8 GPUs a list written out in full is a screen of numbers; runs of three or more are written as ranges,
as SLURM's hostlists are."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_NUMBERED = re.compile(r"^(?P<stem>.*?)(?P<number>\d+)$")


def numbers_text(numbers: Iterable[int]) -> str:
    """`0,2,3`, `0-7`, `0-99,101-255`: runs of three or more consecutive numbers as ranges."""
    ordered = sorted(set(numbers))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        else:
            parts.extend(str(n) for n in ordered[i : j + 1])
        i = j + 1
    return ",".join(parts)


def names_text(names: Sequence[str]) -> str:
    """Node names as a hostlist: `node-[0-253]`, `gpu[1-3],login` (names with the same stem and plain numbers
    grouped, in first-seen order; numbers with leading zeros and one-name groups kept as they are)."""
    stems: dict[str, list[int]] = {}
    order: list[str] = []
    for name in names:
        match = _NUMBERED.match(name)
        number = match["number"] if match else ""
        if match and (number == "0" or not number.startswith("0")):
            key = match["stem"]
            if key not in stems:
                stems[key] = []
                order.append(key)
            stems[key].append(int(number))
        elif name not in order:
            order.append(name)
    parts = []
    for key in order:
        numbers = stems.get(key)
        if numbers is None:
            parts.append(key)
        elif len(set(numbers)) == 1:
            parts.append(f"{key}{numbers[0]}")
        else:
            parts.append(f"{key}[{numbers_text(numbers)}]")
    return ",".join(parts)
