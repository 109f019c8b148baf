"""How an attached run ended (launcher.plan.ends.run_end, pure): one classification, which the console says and the
attempts decide on, for every way a run ends; and no code reads a decision's words to find out what it decided."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from launcher.events import EndKind, HangSuspected, NodeEnd
from launcher.limits import AWAY_EXIT, HANG_EXIT, INTERRUPTED_EXIT, STOPPED_EXIT
from launcher.node.wire import HEARTBEAT_TIMEOUT, STOPPED_ELSEWHERE
from launcher.plan.ends import Absence, Supervised, run_end, start_failed
from launcher.plan.recovery import How
from tests.helpers import REPO


def end(node: str, kind: str = "exited", code: int | None = 0, t: float = 1.0, **more: object) -> NodeEnd:
    return NodeEnd(node, EndKind(kind), t, code, **more)  # type: ignore[arg-type]


OK = [end("n0"), end("n1")]
HANG = HangSuspected("", 9.0, 30.0, {}, False, "rank 1 never entered all_reduce #12", (("n1", 1),), 11)


@pytest.mark.parametrize(("ends", "seen", "how", "code", "absence"), [
    (OK, Supervised(2), How.OK, 0, None),
    ([], Supervised(2, left=True), How.LEFT, AWAY_EXIT, Absence.LEFT),
    ([end("n0", "taken", None), end("n1", "taken", None)], Supervised(2), How.LEFT, AWAY_EXIT, Absence.TAKEN),
    ([end("n0", "lost", None), end("n1", "lost", None)], Supervised(2, cut_off=True), How.LOST, AWAY_EXIT,
     Absence.CUT_OFF),
    ([end("n0", code=143, stop_reason=HEARTBEAT_TIMEOUT), end("n1", code=143, stop_reason=HEARTBEAT_TIMEOUT)],
     Supervised(2), How.LAUNCHER_GONE, AWAY_EXIT, Absence.NO_LAUNCHER),
    ([end("n0", code=143, asked_to_stop=True), end("n1", code=143, asked_to_stop=True)],
     Supervised(2, interrupted=True), How.INTERRUPTED, INTERRUPTED_EXIT, None),
    ([end("n0", code=143, asked_to_stop=True), end("n1", code=143, asked_to_stop=True)],
     Supervised(2, hang=HANG), How.HANG, HANG_EXIT, None),
    ([end("n0", stop_reason=STOPPED_ELSEWHERE, code=143), end("n1", stop_reason=STOPPED_ELSEWHERE, code=143)],
     Supervised(2), How.STOPPED, STOPPED_EXIT, None),
    ([end("n0"), end("n1", "lost", None)], Supervised(1), How.OK, 0, None),  # an elastic group that went on
    ([end("n0"), end("n1", "lost", None)], Supervised(2), How.LOST, 1, None),  # a static one needs every node
    ([end("n0", code=143, asked_to_stop=True), end("n1", code=137)], Supervised(2), How.KILLED, 137, None),
    ([end("n0", code=143, asked_to_stop=True), end("n1", code=1)], Supervised(2), How.FAILED, 1, None),
])
def test_every_way_an_attached_run_ends_is_one_typed_value(ends: list[NodeEnd], seen: Supervised, how: How,
                                                            code: int, absence: Absence | None) -> None:
    ended = run_end(ends, seen)
    assert (ended.end.how, ended.code, ended.absence) == (how, code, absence)
    assert ended.going_on == (absence in (Absence.LEFT, Absence.TAKEN))


def test_the_ends_details_are_the_deciders() -> None:
    hung = run_end(OK, Supervised(2, hang=HANG)).end
    assert (hung.node, hung.rank, hung.step) == ("n1", 1, 11)
    assert hung.summary == "it hung after step 11: n1 held the run up (rank 1)"  # the lines' word: no counts
    counted = run_end(OK, Supervised(2, hang=replace(HANG, counted=10))).end
    assert counted.summary == "it hung after 10 optimizer steps: n1 held the run up (rank 1)"
    failed = run_end([end("n0", code=143, asked_to_stop=True), end("n1", code=1, t=0.5)], Supervised(2))
    assert failed.origin is not None and failed.origin.node == "n1" and failed.end.node == "n1"
    went_on = run_end([end("n0"), end("n1", "lost", None)], Supervised(1))
    assert [e.node for e in went_on.went_on_without] == ["n1"]
    assert start_failed(False).end.how == How.NO_START and start_failed(True).code == INTERRUPTED_EXIT


def test_no_code_reads_a_decisions_words_to_know_what_it_decided() -> None:
    """The decisions are typed (`Retry`, `Final` with its `Reason`, `GoOnWithout`, ...): nothing in the product finds
    out what was decided by matching their text (`"not a node" in reason`, `reason.split("; no retry")`)."""
    matching = re.compile(r"""["'][^"']+["']\s+(not\s+)?in\s+[\w.]*(decision|reason)\b"""
                          r"""|(decision\.\w+|\breason)\.(split|startswith|endswith|find|index)\(""")
    found = [f"{p.relative_to(REPO)}:{i}" for p in (REPO / "launcher").rglob("*.py")
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if matching.search(line)]
    assert found == []
