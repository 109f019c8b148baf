"""One vocabulary of event names (launcher.node.wire.Event): what the node programs say, the controller reads.

The node side is read as source (`ast`): every `emit`/`emit_parts` call names its event as `Event.NAME`, never as a
bare string, and every such name is one the controller handles (launcher.run.sessions.HANDLERS) or deliberately
ignores (IGNORED, with the reason); every handled or ignored name is said somewhere. Other readers of the agent's
stderr (launcher.run.control `_agent_error`) take only the `message` of its `error` events.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import zlib
from types import SimpleNamespace
from typing import Any

import pytest

from launcher import events
from launcher.node import wire
from launcher.node.wire import EVENTS, Event
from launcher.run import sessions
from tests.helpers import REPO

NODE = REPO / "launcher/node"
NODE_SOURCES = {path.relative_to(NODE).as_posix(): path.read_text(encoding="utf-8")
                for path in sorted(NODE.rglob("*.py"))}
"""Every node module, its sub-packages' too, by its path under launcher/node/ (`agent/runner.py`)."""
EMITTERS = ("emit", "emit_parts")


def _calls(source: str) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) in EMITTERS]


def _vocabulary_name(node: ast.expr) -> str | None:
    """The event name `node` spells as `Event.NAME` (None for anything else: a literal, a variable)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Event":
        return getattr(Event, node.attr, None)
    return None


def _event_fields(source: str) -> list[ast.expr]:
    """The values given to an `event` key in a dict literal (a program that writes its own event line)."""
    return [value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Dict)
            for key, value in zip(node.keys, node.values, strict=True)
            if isinstance(key, ast.Constant) and key.value == "event"]


def emitted() -> dict[str, set[str]]:
    """Every event name the node programs say -> the files that say it."""
    found: dict[str, set[str]] = {}
    for file, source in NODE_SOURCES.items():
        for node in [call.args[0] for call in _calls(source) if call.args] + _event_fields(source):
            name = _vocabulary_name(node)
            if name is not None:
                found.setdefault(name, set()).add(file)
    return found


def test_the_vocabulary_names_each_event_once() -> None:
    assert len(EVENTS) == len(set(EVENTS)) and set(EVENTS) == {v for k, v in vars(Event).items() if k.isupper()}


@pytest.mark.parametrize("file", list(NODE_SOURCES))
def test_node_programs_name_every_event_from_the_vocabulary(file: str) -> None:
    source = NODE_SOURCES[file]
    bare = [f"line {c.lineno}: {ast.unparse(c)[:80]}" for c in _calls(source)
            if not c.args or _vocabulary_name(c.args[0]) is None]
    written = [f"line {v.lineno}: {ast.unparse(v)}" for v in _event_fields(source) if _vocabulary_name(v) is None]
    assert bare + written == []


def test_every_event_the_node_says_is_handled_or_deliberately_ignored() -> None:
    said = set(emitted())
    handled, ignored = set(sessions.HANDLERS), set(sessions.IGNORED)
    assert not handled & ignored
    assert said - {Event.PART} == handled | ignored, said ^ (handled | ignored | {Event.PART})
    assert said == set(EVENTS)  # no name in the vocabulary that nobody says
    assert all(why.strip() for why in sessions.IGNORED.values())


def test_the_finder_sees_literals_and_names() -> None:
    source = 'emit("ready")\nemit(Event.READY)\nemit_parts(Event.STACKS, 9)\nx = {"event": "error"}\n'
    assert [_vocabulary_name(c.args[0]) for c in _calls(source)] == [None, "ready", "stacks"]
    assert [ast.unparse(v) for v in _event_fields(source)] == ["'error'"]


# --- the controller's table, fed the lines an agent writes ---------------------------------------------------------


def _session() -> tuple[sessions.Sessions, sessions.Session]:
    link = sessions.Sessions({}, {}, "", lambda event: None, heartbeat_timeout=30.0)  # its heartbeat never starts
    return link, sessions.Session(SimpleNamespace(host=SimpleNamespace(name="n0")), channel=None)  # type: ignore[arg-type]


def _line(name: str, **fields: Any) -> bytes:
    return json.dumps({"event": name, "time": 5.0, **fields}).encode()


def _taken(link: sessions.Sessions) -> list[events.NodeEvent]:
    found = []
    while not link.control.empty():
        found.append(link.control.get_nowait())
    return found


@pytest.mark.parametrize(("name", "fields", "typed"), [
    (Event.READY, {}, events.Ready),
    (Event.PROBED, {"probe": {}, "listener": None}, events.Probed),
    (Event.TCP, {"tcp": {"ok": True}}, events.Reached),
    (Event.STARTED, {"pid": 7}, events.Started),
    (Event.ERROR, {"message": "no"}, events.Message),
    (Event.STOPPING, {"reason": "stop"}, events.Stopping),
    (Event.ALIVE, {"progress": [{"rank": 0}]}, events.Beat),
    (Event.STACKS, {"workers": [], "nccl": {}}, events.StacksTaken),
    (Event.NCCL, {"nccl": {"a": "b"}}, events.NcclDumps),
])
def test_each_handled_name_becomes_its_typed_event(name: str, fields: dict[str, Any], typed: type) -> None:
    link, session = _session()
    link._agent_line(session, _line(name, **fields))
    [event] = _taken(link)
    assert type(event) is typed and event.node == "n0"


def test_exited_ignored_and_unknown_names_put_nothing_on_the_queue() -> None:
    link, session = _session()
    for name in [*sessions.IGNORED, "no-such-event", Event.ALIVE]:  # a beat without progress is only a heartbeat
        link._agent_line(session, _line(name, reason="stop", left=0, run_id="r"))
    link._agent_line(session, _line(Event.EXITED, code=3, left=0, reason=None))
    link._agent_line(session, json.dumps({"event": ["not", "a", "name"]}).encode())
    assert _taken(link) == [] and session.reported is not None and session.reported["code"] == 3


def test_parts_are_put_together_and_dispatched(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[bytes] = []
    monkeypatch.setattr(wire, "emit", lambda name, **fields: lines.append(_line(name, **fields)))
    wire.emit_parts(Event.STACKS, 16, workers=[{"rank": r, "stack": "x" * 50} for r in range(3)], nccl={})
    assert len(lines) > 1
    link, session = _session()
    for line in lines:
        link._agent_line(session, line)
    [event] = _taken(link)
    assert isinstance(event, events.StacksTaken) and [w["rank"] for w in event.workers] == [0, 1, 2]
    damaged = base64.b64encode(zlib.compress(b"[")).decode()
    link._agent_line(session, _line(Event.PART, of=Event.NCCL, seq=0, count=1, data=damaged))
    [message] = _taken(link)
    assert isinstance(message, events.Message) and "nccl event came damaged" in message.text



def test_a_probe_answer_past_the_line_cut_goes_in_parts_and_comes_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """srun cuts long output lines: a master's `probed` (its probe, its listener's reply, 8 GPUs) goes in `part` events
    of at most the request's chunk, and the launcher has it whole (gatechecks.GateChecks.run sends it so)."""
    lines: list[bytes] = []
    monkeypatch.setattr(wire, "emit", lambda name, **fields: lines.append(_line(name, **fields)))
    gpus = [{"index": i, "uuid": "GPU-" + hashlib.sha256(bytes([i])).hexdigest(),
             "bus": hashlib.sha256(bytes([i, i])).hexdigest()} for i in range(16)]
    wire.emit_parts(Event.PROBED, 800, probe={"python": {"version": "3.11.2"}, "gpus": gpus}, listener={"free": True})
    assert len(lines) > 1 and all(len(line) < 1000 for line in lines), [len(line) for line in lines]
    link, session = _session()
    for line in lines:
        link._agent_line(session, line)
    [event] = _taken(link)
    assert isinstance(event, events.Probed) and session.checked[Event.PROBED]["probe"]["gpus"] == gpus


def test_a_failed_actions_words_are_its_error_events_and_shell_lines() -> None:
    # `inv logs --follow` of a run lost on a node: the agent said `run` first; that is no error to show.
    from launcher.run.control import _agent_error
    from launcher.transport.channel import Result

    err = b"\n".join([_line(Event.RUN, run_id="r"), _line(Event.ERROR, message="run r was lost"), b"bash: oops", b""])
    assert _agent_error(Result(1, b"", err)) == "run r was lost; bash: oops"
