"""Log lines from many nodes on one console: whole lines, `node-1 r3 |` prefixes, a stable colour per node,
a tail per node for the root cause; and torchrun's root-cause block."""

from __future__ import annotations

import re
import sys
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Protocol

from launcher.limits import CUT_MARK, MAX_LINE_BYTES, TAIL_LINES, TAIL_WIDTH

# The node's agent tags each worker line `[<role><local rank>@r<global rank>]:` (launcher/node/agent/logmerge.py
# `LogMerger`), or `[<role><local rank>]:` when it cannot tell the global rank, as torchrun --tee did (older runs'
# logs); the role is "default".
_RANK_PREFIX = re.compile(rb"^\[[A-Za-z_]+(\d+)(?:@r(\d+))?\]:")
_RAISED = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit)(?:: .*)?$")
"""A traceback's last line (`RuntimeError: boom`, `torch.distributed.DistBackendError: ...`): what a rank raised."""
_TORCH_RANK = re.compile(r"^\[rank\d+\]: ?")
"""What torch puts before each line of a traceback a rank raises once its process group is up (`[rank3]: ...`)."""
_RAISED_WORDS = (b"Error", b"Exception", b"Interrupt", b"Exit")
_FRAME = re.compile(r'^ *File "[^"]*", line \d+')
"""A traceback's frame line (`  File "train.py", line 7, in <module>`): the last one before a rank's exception line
is where it raised."""
_FRAME_WORDS = b'File "'
_NOISE = re.compile(
    r"^(?:\S.*?:\d+: \w*Warning: |\[?[WI]\d{4} \d\d:\d\d:\d\d|\s*traceback : To enable traceback see"
    r"|\*{8,}$|Setting OMP_NUM_THREADS environment variable)"
)
"""Lines that are never a cause: Python's warnings (`train.py:3: UserWarning: ...`), torch's own warning and info
log lines (`W1128 15:57:54.402000 ...`, `[W1128 ...`), torchrun's `To enable traceback see` notice and its
OMP_NUM_THREADS banner."""
RANK_WORDS = 3
"""Lines kept of each rank's last output that is not noise: the root cause's words for a rank that raised nothing."""
_COLOURS = (36, 33, 32, 35, 34, 31, 96, 93, 92, 95, 94, 91)  # ANSI foreground colours, cycled by node


class Writer(Protocol):
    """Where a node's formatted lines go: a stream, or anything with its `write`."""

    def write(self, text: str, /) -> object: ...


class LineSplitter:
    """Turns a byte stream into whole lines; keeps an unfinished last line until it is completed.

    Output without newlines is cut every `max_line` bytes: memory stays bounded and no chunk is copied twice.
    """

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._rest = b""
        self._max = max_line

    def feed(self, data: bytes) -> list[bytes]:
        data = self._rest + data if self._rest else data
        *lines, self._rest = data.split(b"\n")
        if len(self._rest) >= self._max:
            rest, cut = self._rest, len(self._rest) - len(self._rest) % self._max
            lines += [rest[i : i + self._max] + CUT_MARK for i in range(0, cut, self._max)]
            self._rest = rest[cut:]
        return lines

    def feed_block(self, data: bytes) -> bytes:
        """The whole lines `data` completes, as one block of bytes ending in a newline (or b""): no list of lines.

        Cut pieces come as lines of their own, marked, as `feed` makes them."""
        data = self._rest + data if self._rest else data
        end = data.rfind(b"\n") + 1
        block, self._rest = data[:end], data[end:]
        if len(self._rest) >= self._max:
            block += b"".join(line + b"\n" for line in self.feed(b""))
        return block

    def flush(self) -> list[bytes]:
        rest, self._rest = self._rest, b""
        return [rest] if rest else []


SPARE = "stood by as a spare"
"""A spare's folded lines' words (`NodeLog.spare`)."""
EXIT_BARRIER = b"Error waiting on exit barrier"
"""torchrun's words when its node's agent lost the store in the exit barrier: its peers' torchrun (the store's host)
ended as this node reached it, after every worker had ended (the run's end, not a failure: exit code 0 follows)."""
BARRIER = "the exit barrier"
"""Its folded lines' words (`NodeLog._format_lines`, on EXIT_BARRIER)."""
FOLDED_WHAT = {SPARE: "(its wait, its end)", BARRIER: "(its store gone as the run ended: no failure)"}
"""What a fold's lines were, by its words (else a stop's: its signal, its traceback)."""


class NodeLog:
    """One node's output: split into lines, printed with a prefix, mirrored raw to a local file, tail kept."""

    def __init__(
        self, name: str, index: int, width: int, rank_offset: int | None, colour: bool, folder: Path | None = None
    ):
        self.name = name
        self.rank_offset = rank_offset
        self.folder = folder
        """Where this machine keeps the node's log (a launch's); None: no fold of its own (`inv logs`)."""
        self.splitter = LineSplitter()
        self._recent: deque[str] = deque(maxlen=TAIL_LINES)
        self.raised: dict[int, tuple[int | None, str]] = {}
        """Local rank -> (its global rank, the last exception line it printed): the root cause's own words."""
        self._frames: dict[int, tuple[str, ...]] = {}
        """Local rank -> the last traceback frame it printed (its `File ...` line and the source line after it)."""
        self._pending: dict[int, str] = {}
        """Local rank -> a frame line whose next line (its source line, or not) has not come yet."""
        self._last_lines: dict[int, tuple[str, ...]] = {}
        """Local rank -> where its last exception was raised and the exception, as tail lines (`tail` keeps them)."""
        self._said: dict[int, deque[str]] = {}
        """Local rank -> its last RANK_WORDS lines that are not noise, as tail lines."""
        self._warned: set[int] = set()
        """Local ranks whose last line was a Python warning (its next line, the warning's source line, is noise)."""
        self._hold: str | None = None
        self._hold_by = "stopped as asked"
        """Once the user asked the run to stop: where torchrun's own lines are, which the console no longer shows."""
        self._held = 0
        label = name.ljust(width)
        code = _COLOURS[index % len(_COLOURS)]
        self._start = f"\x1b[{code}m" if colour else ""
        self._end = "\x1b[0m" if colour else ""
        self._label = label
        self._cache: dict[bytes, bytes] = {b"": self.prefix(None).encode()}
        self._ranks: dict[int, int] = {}
        """Global rank of each local rank, as torchrun's tags last said (c10d assigns them at each rendezvous)."""

    def prefix(self, local_rank: int | None, global_rank: int | None = None) -> str:
        if local_rank is None:
            tag = self._label + "    "
        elif global_rank is not None:
            tag = f"{self._label} r{global_rank:<2}"
        elif self.rank_offset is None:
            tag = f"{self._label} l{local_rank:<2}"
        else:
            tag = f"{self._label} r{self.rank_offset + local_rank:<2}"
        return f"{self._start}{tag} |{self._end} "

    def _split_rank(self, line: bytes) -> tuple[bytes, int | None, int | None, bytes]:
        """(torchrun's `[default3@r7]:` tag or b"", the local rank or None, the global rank or None, the rest)."""
        if line[:1] == b"[":
            match = _RANK_PREFIX.match(line)
            if match:
                global_rank = int(match.group(2)) if match.group(2) is not None else None
                return line[: match.end()], int(match.group(1)), global_rank, line[match.end() :]
        return b"", None, None, line

    def _new_tag(self, line: bytes, parts: list[bytes]) -> tuple[bytes, int]:
        """The prefix of a tag not seen before (and where its tag ends); a line saying so when a rank moved."""
        tag, local, global_rank, _ = self._split_rank(line)
        if local is not None and global_rank is not None:
            before = self._ranks.get(local)
            if before is not None and before != global_rank:
                note = f"local rank {local} is now global rank {global_rank} (was {before}): the group re-formed"
                parts.append(self._cache[b""] + note.encode())
                for old in [t for t in self._cache if t]:  # a tag seen before the change may come back later
                    del self._cache[old]
            self._ranks[local] = global_rank
        prefix = self._cache[tag] = self.prefix(local, global_rank).encode()
        return prefix, len(tag) - 2

    def _format_lines(self, lines: list[bytes], parts: list[bytes]) -> None:
        # The hot path of a chatty job (a million lines): one cached prefix per torchrun tag, bytes until the end.
        cache = self._cache
        for line in lines:
            if line[-1:] == b"\r":
                line = line.rstrip(b"\r")
            end = line.find(b"]:", 0, 24) if line[:1] == b"[" else -1
            prefix = cache.get(line[: end + 2]) if end > 0 else cache.get(b"")
            if prefix is None:
                prefix, end = self._new_tag(line, parts)
            if prefix == cache[b""] and self.folder is not None and EXIT_BARRIER in line:
                self._fold(self.folder, BARRIER)
            if self._hold is not None and prefix == cache[b""]:  # torchrun's own, on a stop the user asked for
                self._held += 1
                continue
            parts.append(prefix + line[end + 2 :] if end > 0 and prefix is not cache[b""] else prefix + line)
        self._keep_tail(lines[-TAIL_LINES:])
        self._note_raised(lines)

    def _note_raised(self, lines: list[bytes]) -> None:
        """Each rank's last exception line among `lines`, wherever it falls: a failed rank's traceback is often
        followed by more lines than the tail keeps (its peers' errors, torchrun's summary)."""
        for line in lines:
            if line[:1] != b"[" or not (
                self._pending or _FRAME_WORDS in line or any(word in line for word in _RAISED_WORDS)
            ):
                continue
            _, local, global_rank, body = self._split_rank(line)
            if local is None:
                continue
            text = _TORCH_RANK.sub("", body.decode("utf-8", errors="replace").rstrip("\r"), count=1)
            frame = self._pending.pop(local, None)
            if _FRAME.match(text):
                self._pending[local] = text[:TAIL_WIDTH]
            elif frame is not None:  # the line after a frame: its source line, if it is one (not Python's ^^^ marks)
                source = text[:TAIL_WIDTH] if text.startswith("    ") and text.strip("^~ ") else None
                self._frames[local] = (frame, source) if source else (frame,)
            if _RAISED.match(text):
                self.raised[local] = (global_rank, text[:TAIL_WIDTH])
                said = (*self._frames.get(local, ()), text[:TAIL_WIDTH])
                self._last_lines[local] = tuple(self._tagged(local, global_rank, x) for x in said)

    @staticmethod
    def _tagged(local: int, global_rank: int | None, text: str) -> str:
        return f"[local rank {local}{'' if global_rank is None else f', rank {global_rank}'}] {text}"

    def _keep_tail(self, lines: list[bytes]) -> None:
        for line in lines:
            _, local, global_rank, body = self._split_rank(line)
            text = body.decode("utf-8", errors="replace").rstrip("\r")
            text = text if len(text) <= TAIL_WIDTH else text[:TAIL_WIDTH] + "…"  # a report, not a dump
            if local is not None:
                own = _TORCH_RANK.sub("", text, count=1)
                text = self._tagged(local, global_rank, text)
                if noise(own) or (local in self._warned and own.startswith("  ")):
                    if "Warning: " in own:
                        self._warned.add(local)
                    else:
                        self._warned.discard(local)
                else:
                    self._warned.discard(local)
                    self._said.setdefault(local, deque(maxlen=RANK_WORDS)).append(text)
            self._recent.append(text)

    @property
    def tail(self) -> tuple[str, ...]:
        """The node's last TAIL_LINES lines, after each rank's own last words where those scrolled out of them: where
        its last exception was raised and the exception, else its last lines that are not noise (a rank that failed
        is often followed by dozens of lines: torchrun's traceback, its summary, its peers')."""
        recent = set(self._recent)
        kept = [
            line
            for local in sorted({*self._last_lines, *self._said})
            for line in self._last_lines.get(local) or self._said.get(local) or ()
            if line not in recent
        ]
        return (*kept, *self._recent)

    def format(self, data: bytes) -> tuple[str, int]:
        """The prefixed text of the whole lines `data` completes, and how many lines that is."""
        block = self.splitter.feed_block(data)
        if not block:
            return "", 0
        text, count = self._bulk(block) if self._hold is None else (None, 0)
        if text is None:  # a line without a known tag (torchrun's own, a new or moved rank): one line at a time
            return self._text(block.split(b"\n")[:-1])
        return text, count

    def _bulk(self, block: bytes) -> tuple[str | None, int]:
        """A block whose every line starts with a tag seen before, prefixed with one bytes.replace per tag (C, not
        a loop over a million lines); (None, 0) when some line does not."""
        count = block.count(b"\n")
        text = b"\n" + block
        while b"\r\n" in text:  # a line's trailing carriage returns, as `_format_lines` drops them
            text = text.replace(b"\r\n", b"\n")
        found = [(b"\n" + tag, b"\n" + prefix) for tag, prefix in self._cache.items() if tag]
        counts = [text.count(tag) for tag, _ in found]  # no tag is the start of another: each ends in `]:`
        if sum(counts) != count:
            return None, 0
        for (tag, prefix), n in zip(found, counts, strict=True):
            if n:
                text = text.replace(tag, prefix)
        self._keep_tail(block.rsplit(b"\n", TAIL_LINES + 1)[-TAIL_LINES - 1 : -1])
        if self._pending or _FRAME_WORDS in block or any(word in block for word in _RAISED_WORDS):  # C searches
            self._note_raised(block.split(b"\n"))
        return text[1:].decode("utf-8", errors="replace"), count

    def format_rest(self) -> tuple[str, int]:
        """The prefixed text of an unfinished last line, at the end of the stream; after a stop the user asked for,
        one line that says how many of torchrun's own lines it brought and where they are."""
        text, count = self._text(self.splitter.flush())
        if self._held:
            what = FOLDED_WHAT.get(self._hold_by, "on it (its signal, its traceback)")
            text += f"{self.prefix(None)}{self._hold_by}; torchrun's {self._held} line(s) {what} are in {self._hold}\n"
            count, self._held = count + 1, 0
        return text, count

    def stop_asked(self, folder: Path | str, by: str = "as asked") -> None:
        """The user (Ctrl-C) or the launcher (`by`: a failed node, a hang, a NaN loss) stops this node's part: from
        here the console leaves out torchrun's own lines (`Received 15 death signal`, its 30-line SignalException
        traceback), which `format_rest` counts in one line at the node's end; the tail, this machine's copy of the
        node's output (in `folder`) and the node's log keep every one. The first stop's words stay."""
        self._fold(folder, f"stopped {by}")

    def spare(self, folder: Path | str) -> None:
        """This node stands by as a spare of a c10d run (launcher/watch/spares.py): torchrun's own lines on it (its
        wait in the rendezvous, the RendezvousConnectionError traceback it ends with when the group ends) fold into
        one at its end, as on a stop; its workers' lines, if the group takes it later, are shown."""
        self._fold(folder, SPARE)

    def _fold(self, folder: Path | str, words: str) -> None:
        """From here torchrun's own lines on this node fold into one at its end, said in `words` (the first fold's)."""
        if self._hold is None:
            self._hold, self._hold_by = f"{folder}/{self.name}.log", words

    def _text(self, lines: list[bytes]) -> tuple[str, int]:
        if not lines:
            return "", 0
        parts: list[bytes] = []
        held = self._held
        self._format_lines(lines, parts)
        if not parts:
            return "", 0
        parts.append(b"")
        return b"\n".join(parts).decode("utf-8", errors="replace"), len(lines) - (self._held - held)

    def feed(self, data: bytes, out: Writer) -> None:
        text, _ = self.format(data)
        if text:
            out.write(text)

    def close(self, out: Writer) -> None:
        text, _ = self.format_rest()
        if text:
            out.write(text)


def stop_folding(logs: Mapping[str, NodeLog], folder: Path) -> Callable[[list[str], str], None]:
    """What a run's handle calls before a stop goes out (`RunHandle.on_stopping`): each node it goes to folds
    torchrun's lines on it into one at its end, saying who stopped it: the user (Ctrl-C, SIGTERM), or the launcher
    and why (the handle's why: `node-1 failed: ...`, `a hang: ...`, `a non-finite loss: ...`)."""

    def fold(names: list[str], why: str) -> None:
        by = "as asked" if why.startswith("interrupted") else f"by the launcher ({why.partition(':')[0]})"
        for name in names:
            logs[name].stop_asked(folder, by)

    return fold


def supports_colour(stream: IO[str] = sys.stdout) -> bool:
    """Colour only on a terminal that is not marked dumb, and never when NO_COLOR is set."""
    import os

    return stream.isatty() and os.environ.get("TERM") != "dumb" and "NO_COLOR" not in os.environ


def noise(text: str) -> bool:
    """A line that is never a cause (`_NOISE`): a warning, torch's log lines, torchrun's notices."""
    return bool(_NOISE.match(text))


_TAIL_TAG = re.compile(r"^\[local rank (\d+)(?:, rank \d+)?\] ")


def rank_lines(tail: Iterable[str], local: int) -> list[str]:
    """The lines of local rank `local` in a node's tail (`NodeLog.tail`), without their tags (ours, torch's)."""
    out = []
    for line in tail:
        match = _TAIL_TAG.match(line)
        if match and int(match.group(1)) == local:
            out.append(_TORCH_RANK.sub("", line[match.end() :], count=1))
    return out


def untagged(line: str) -> str:
    """A tail line without its tags (`[local rank 1, rank 3] [rank3]: `)."""
    match = _TAIL_TAG.match(line)
    return _TORCH_RANK.sub("", line[match.end() :], count=1) if match else line


def without_noise(lines: Iterable[str]) -> list[str]:
    """`lines` (a tail's, tagged or not) less the noise: `noise`, and the source line Python prints under a warning."""
    out: list[str] = []
    warned: set[str | None] = set()  # the tags whose last line was a warning
    for line in lines:
        match = _TAIL_TAG.match(line)
        tag, text = (match.group(1) if match else None), untagged(line)
        if noise(text) or (tag in warned and text.startswith("  ")):
            if "Warning: " in text:
                warned.add(tag)
            else:
                warned.discard(tag)
            continue
        warned.discard(tag)
        out.append(line)
    return out
