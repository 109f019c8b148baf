"""Log lines from many nodes on one console: whole lines, `node-1 r3 |` prefixes, a stable colour per node,
and a mirror of every node's raw output in `logs/<run_id>/<node>.log` on the controller."""

from __future__ import annotations

import re
import sys
from collections import deque
from pathlib import Path
from typing import IO

# torchrun --tee prefixes each worker line with `[<role><local rank>]:`; the role is "default".
_RANK_PREFIX = re.compile(rb"^\[[A-Za-z_]+(\d+)\]:")
_COLOURS = (36, 33, 32, 35, 34, 31, 96, 93, 92, 95, 94, 91)  # ANSI foreground colours, cycled by node
TAIL_LINES = 40


class LineSplitter:
    """Turns a byte stream into whole lines; keeps an unfinished last line until it is completed."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, data: bytes) -> list[bytes]:
        data = self._rest + data
        *lines, self._rest = data.split(b"\n")
        return lines

    def flush(self) -> list[bytes]:
        rest, self._rest = self._rest, b""
        return [rest] if rest else []


class NodeLog:
    """One node's output: split into lines, printed with a prefix, mirrored raw to a local file, tail kept."""

    def __init__(self, name: str, index: int, width: int, rank_offset: int | None, mirror: Path | None,
                 colour: bool):
        self.name = name
        self.rank_offset = rank_offset
        self.splitter = LineSplitter()
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._mirror: IO[bytes] | None = None
        if mirror is not None:
            mirror.parent.mkdir(parents=True, exist_ok=True)
            self._mirror = open(mirror, "ab")  # noqa: SIM115 - closed in close()
        label = name.ljust(width)
        code = _COLOURS[index % len(_COLOURS)]
        self._start = f"\x1b[{code}m" if colour else ""
        self._end = "\x1b[0m" if colour else ""
        self._label = label
        self._cache: dict[bytes, bytes] = {b"": self.prefix(None).encode()}

    def prefix(self, local_rank: int | None) -> str:
        if local_rank is None:
            tag = self._label + "    "
        elif self.rank_offset is None:
            tag = f"{self._label} l{local_rank:<2}"
        else:
            tag = f"{self._label} r{self.rank_offset + local_rank:<2}"
        return f"{self._start}{tag} |{self._end} "

    def _split_rank(self, line: bytes) -> tuple[bytes, int | None, bytes]:
        """(torchrun's `[default3]:` tag or b"", the local rank or None, the rest of the line)."""
        if line[:1] == b"[":
            match = _RANK_PREFIX.match(line)
            if match:
                return line[:match.end()], int(match.group(1)), line[match.end():]
        return b"", None, line

    def _format_lines(self, lines: list[bytes], parts: list[bytes]) -> None:
        # The hot path of a chatty job (a million lines): one cached prefix per torchrun tag, bytes until the end.
        cache = self._cache
        for line in lines:
            if line[-1:] == b"\r":
                line = line.rstrip(b"\r")
            end = line.find(b"]:", 0, 24) if line[:1] == b"[" else -1
            prefix = cache.get(line[:end + 2]) if end > 0 else cache.get(b"")
            if prefix is None:
                tag, local, _ = self._split_rank(line)
                prefix = cache[tag] = (self.prefix(local)).encode()
                end = len(tag) - 2
            parts.append(prefix + line[end + 2:] if end > 0 and prefix is not cache[b""] else prefix + line)
        for line in lines[-TAIL_LINES:]:
            _, local, body = self._split_rank(line)
            text = body.decode("utf-8", errors="replace").rstrip("\r")
            self.tail.append(text if local is None else f"[local rank {local}] {text}")

    def feed(self, data: bytes, out: IO[str] | None) -> None:
        if self._mirror is not None:
            self._mirror.write(data)
        self._print(self.splitter.feed(data), out)

    def _print(self, lines: list[bytes], out: IO[str] | None) -> None:
        if not lines:
            return
        parts: list[bytes] = []
        self._format_lines(lines, parts)
        if out is not None:
            parts.append(b"")
            out.write(b"\n".join(parts).decode("utf-8", errors="replace"))

    def close(self, out: IO[str] | None) -> None:
        self._print(self.splitter.flush(), out)
        if self._mirror is not None:
            self._mirror.close()
            self._mirror = None


def supports_colour(stream: IO[str] = sys.stdout) -> bool:
    """Colour only on a terminal that is not marked dumb, and never when NO_COLOR is set."""
    import os

    return stream.isatty() and os.environ.get("TERM") != "dumb" and "NO_COLOR" not in os.environ


def root_cause_block(lines: list[str]) -> list[str]:
    """torchrun's "Root Cause (first observed failure)" block from a node's log tail, if it printed one."""
    for i, line in enumerate(lines):
        if "Root Cause (first observed failure)" in line:
            block = []
            for rest in lines[i + 1:]:
                if rest.startswith("=====") and block:
                    break
                block.append(rest)
            return block
    return []


def failed_rank(block: list[str]) -> tuple[int | None, int | None, int | None]:
    """(global rank, local rank, worker exit code) named in a root-cause block."""
    rank = local = code = None
    for line in block:
        match = re.search(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", line)
        if match:
            rank, local = int(match.group(1)), int(match.group(2))
        match = re.search(r"exitcode\s*:\s*(-?\d+)", line)
        if match:
            code = int(match.group(1))
    return rank, local, code
