"""What a launch itself saw of its run, kept for the run's page (`logs/<run id>/journal.json`): when the command
started, each node's start by the launcher's clock (connected, checked, synced, torchrun started) and how far its
clock is from this one, the marks of the run (a hang suspected or ruled out, a straggler, a node that left, a stop),
and its end (the exit code, the root cause's words).

Fed from the launch's events (`launcher.run.launch`); nothing here waits on a disk while a run goes on: the file is
written when the start is over and when the run ends, from the launch's own thread.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from launcher.events import (
    SELF_STOPS,
    Ended,
    HangRuledOut,
    HangSuspected,
    Left,
    NodeEvent,
    Probed,
    Ready,
    Started,
    Stopping,
)

JOURNAL_FILE = "journal.json"


class Journal:
    """One launch's account of its run (see the module's docstring); every time is this machine's wall clock."""

    def __init__(self, run_id: str, folder: Path, command_start: float | None = None):
        self.path = folder / JOURNAL_FILE
        self.lock = threading.Lock()
        self.data: dict[str, Any] = {
            "run_id": run_id,
            "command_start": command_start or time.time(),
            "nodes": {},
            "marks": [],
            "end": None,
        }

    @classmethod
    def resumed(cls, run_id: str, folder: Path) -> Journal:
        """The journal this machine kept of a run (`attach`: its launch's, now carried on), else a new one."""
        journal = cls(run_id, folder)
        kept = read_journal(folder)
        if kept is not None and kept.get("run_id") == run_id:
            journal.data.update(kept)
        return journal

    def phase(self, nodes: list[str], name: str, when: float | None = None) -> None:
        """`name` happened for each of `nodes` at `when` (now)."""
        when = time.time() if when is None else when
        with self.lock:
            for node in nodes:
                self.data["nodes"].setdefault(node, {}).setdefault(name, when)

    def mark(self, kind: str, text: str, node: str | None = None, when: float | None = None) -> None:
        """Something the timeline shows: a hang, a straggler, a node left, a stop, a restart."""
        with self.lock:
            self.data["marks"].append(
                {"t": time.time() if when is None else when, "kind": kind, "node": node, "text": text}
            )

    def event(self, event: NodeEvent) -> None:
        """A launch's event, as the page keeps it."""
        if isinstance(event, Probed):
            self.phase([event.node], "checked", event.time)
        elif isinstance(event, Ready):
            self.phase([event.node], "ready", event.time)
        elif isinstance(event, Started):
            self.phase([event.node], "torchrun", event.time)
            if event.node_time is not None:  # the node's clock against ours (the event's trip, milliseconds, aside)
                with self.lock:
                    self.data["nodes"][event.node]["offset"] = event.time - event.node_time
        elif isinstance(event, HangSuspected):
            self.mark(
                "hang",
                f"hang suspected: {event.why or f'no progress for {event.quiet_s:.0f} s'}",
                event.node or None,
                event.time,
            )
        elif isinstance(event, HangRuledOut):
            self.mark(
                "hang-ruled-out",
                f"no progress for {event.quiet_s:.0f} s, not a hang: {event.why}",
                event.node or None,
                event.time,
            )
        elif isinstance(event, Left):
            self.mark("left", f"{event.node} left the run; {event.remaining} node(s) go on", event.node, event.time)
        elif isinstance(event, Stopping) and event.reason in SELF_STOPS:  # the launcher's own stops: its end says
            self.mark("stop", f"{event.node} stops its part by itself ({event.reason})", event.node, event.time)
        elif isinstance(event, Ended):
            self.phase([event.node], "ended", event.time)

    def end(self, code: int, text: str, going_on: bool = False) -> None:
        """The launch's end: its exit code and the words it ended with (the root cause of a failure); `going_on`: the
        run goes on without this launcher (it left, or another took it over)."""
        with self.lock:
            self.data["end"] = {"t": time.time(), "code": code, "text": text, "going_on": going_on}

    def write(self) -> None:
        """The file, whole or not at all; a disk that refuses costs the page, never the launch. Two launchers may hold
        the run in turn on one machine (`attach --force` while the first one lives, or wakes): what the file holds
        already is kept (`merged`), so neither's marks are lost whichever writes last."""
        with self.lock:
            text = json.dumps(merged(read_journal(self.path.parent), self.data), indent=1)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass


def merged(kept: dict[str, Any] | None, data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the marks and node phases of the journal `kept` of the same run that it lacks, and its end unless
    only `kept`'s is final (a launcher that let the run go on, taken over, ends it for nobody)."""
    if kept is None or kept.get("run_id") != data.get("run_id"):
        return data
    mine = {json.dumps(m, sort_keys=True) for m in data["marks"]}
    marks = data["marks"] + [m for m in kept.get("marks") or [] if json.dumps(m, sort_keys=True) not in mine]
    nodes = {name: {**(kept.get("nodes") or {}).get(name, {}), **phases} for name, phases in data["nodes"].items()}
    end, theirs = data.get("end"), kept.get("end")
    if theirs and not theirs.get("going_on") and (end is None or end.get("going_on")):
        end = theirs
    return {
        **kept,
        **data,
        "marks": sorted(marks, key=lambda m: m["t"]),
        "nodes": {**kept.get("nodes", {}), **nodes},
        "end": end,
    }


def read_journal(folder: Path) -> dict[str, Any] | None:
    """A run's journal (None where no launch on this machine kept one: another machine started it)."""
    try:
        data = json.loads((folder / JOURNAL_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def note_end(folder: Path, run_id: str, began: float, code: int, text: str) -> None:
    """A launch's end where its run kept no account of it (the doctor's checks refused it, a node could not be
    reached: nothing started), so its page can say why; an end already kept stays as it is."""
    journal = Journal(run_id, folder, began)
    found = read_journal(folder)
    if found is not None:
        if found.get("end"):
            return
        journal.data.update(found)
    journal.end(code, text)
    journal.write()


def started_anywhere(folder: Path) -> bool:
    """Whether the launch's account says torchrun started on any node (a run with something to show)."""
    found = read_journal(folder) or {}
    return any("torchrun" in (phases or {}) for phases in (found.get("nodes") or {}).values())
