"""What follows an attempt (launcher.plan.recovery, pure): for every way an attempt ends, a restart (on which nodes)
or the end, and why; and whether a launch may restart at all (detached, under SLURM, without retries)."""

from __future__ import annotations

import pytest

from launcher.errors import UsageError
from launcher.events import EndKind, NodeEnd
from launcher.plan.recovery import (
    AttemptEnd,
    FailStart,
    Final,
    GoOnWithout,
    How,
    Reason,
    Retry,
    StopRun,
    after_attempt,
    after_node_end,
    restarts,
)

NODES = ["node-0", "node-1", "node-2"]


def decide(end: AttemptEnd, before: tuple[AttemptEnd, ...] = (), *, nodes: list[str] = NODES, min_nodes: int = 1,
           retries: int = 2, on_hang: str = "restart", failures: dict[str, list[float]] | None = None
           ) -> Retry | Final:
    return after_attempt(end, before, nodes=nodes, min_nodes=min_nodes, retries=retries, on_hang=on_hang,
                         failures=failures or {}, now=100.0, cooldown=300.0)


HUNG = AttemptEnd(How.HANG, "rank 1 (node-1, pid 7) never entered all_reduce #12", "node-1", 1, 11)
NOT_RETRIED = "not retried: the script itself failed (a retry would fail the same way)"


@pytest.mark.parametrize(("end", "then"), [
    (AttemptEnd(How.OK, "exit 0"), Final(Reason.SUCCEEDED, "exit 0", "exit 0")),
    (AttemptEnd(How.FAILED, "root cause: node-1, rank 1, exit code 1", "node-1"),
     Final(Reason.PROGRAM_FAILED, "root cause: node-1, rank 1, exit code 1", NOT_RETRIED)),
    (AttemptEnd(How.NO_START, "it could not start"),
     Final(Reason.NO_START, "it could not start", "not retried: the run could not start (a retry would not either)")),
    (AttemptEnd(How.STOPPED, "stopped from elsewhere"),
     Final(Reason.ENDED_AS_ASKED, "stopped from elsewhere", "not retried: stopped from elsewhere")),
    (AttemptEnd(How.INTERRUPTED, "interrupted (Ctrl-C)"),
     Final(Reason.ENDED_AS_ASKED, "interrupted (Ctrl-C)", "not retried: interrupted (Ctrl-C)")),
    (AttemptEnd(How.LEFT, "this launcher let the run go on without it"),
     Final(Reason.ENDED_AS_ASKED, "this launcher let the run go on without it",
           "not retried: this launcher let the run go on without it")),
    (AttemptEnd(How.LOST, "node-2 was lost: it stopped answering", "node-2"),
     Retry("node-2 was lost: it stopped answering")),
    (AttemptEnd(How.KILLED, "node-2: torchrun was killed by signal 9", "node-2"),
     Retry("node-2: torchrun was killed by signal 9")),
    (AttemptEnd(How.LAUNCHER_GONE, "node-0 lost the launcher (heartbeat-timeout)", "node-0"),
     Retry("node-0 lost the launcher (heartbeat-timeout)")),
    (HUNG, Retry("it hung after step 11: node-1 held the run up (rank 1)",
                 {"node-1": "its rank 1 held the run up after step 11"})),
])
def test_each_way_an_attempt_ends_is_followed_by_a_restart_or_the_end(end: AttemptEnd, then: Retry | Final) -> None:
    assert decide(end) == then


def test_every_end_is_decided_and_typed() -> None:
    for how in How:
        decision = decide(AttemptEnd(how, "why", "node-1", 1, 3))
        assert isinstance(decision, Retry) == (how.retried or how == How.HANG), how
        assert isinstance(decision, Retry | Final) and (isinstance(decision, Retry) or decision.reason in Reason)
    assert AttemptEnd("lost").how is How.LOST  # attempts.json's words read back
    with pytest.raises(ValueError):
        AttemptEnd("crashed")  # type: ignore[arg-type]


def test_a_hang_restarts_only_with_restart_and_a_retry_left() -> None:
    assert decide(HUNG, on_hang="stop") == Final(Reason.HANG_STOPS, HUNG.summary,
                                                 f"not retried: {HUNG.why} (--on-hang stop)")
    assert decide(HUNG, retries=0) == Final(Reason.NO_RETRY_LEFT, HUNG.summary,
                                            "it hung after step 11: node-1 held the run up (rank 1); no retry left "
                                            "(0 allowed)")


def test_the_node_that_held_the_run_up_sits_out_only_where_the_run_can_do_without_it() -> None:
    assert decide(HUNG, min_nodes=3).sit_out == {}  # a c10d range whose minimum is every node: the same nodes
    assert decide(HUNG, nodes=["node-1"]).sit_out == {}  # one node: nothing to do without
    assert decide(AttemptEnd(How.HANG, "every rank waits alike", None, None, 4)).sit_out == {}


def test_the_same_hang_on_another_node_is_the_programs_not_a_nodes() -> None:
    again = AttemptEnd(How.HANG, "rank 1 (node-2) never entered all_reduce #12", "node-2", 1, 11)
    decision = decide(again, (HUNG,))
    assert isinstance(decision, Final) and decision.reason == Reason.PROGRAM_HANGS
    assert decision.text == ("the run hung at the same step twice, on node-1 then node-2: the program, not a node (no "
                             "retry: it would hang there again)")
    elsewhere = AttemptEnd(How.HANG, "rank 1 (node-2) never entered all_reduce #40", "node-2", 1, 39)
    assert isinstance(decide(elsewhere, (HUNG,)), Retry)  # another step: not the same bug
    same_node = decide(HUNG, (HUNG,), failures={"node-1": [10.0, 50.0]})
    assert isinstance(same_node, Retry)  # the same node twice: a bad node, which sits out as one that failed twice
    assert same_node.sit_out["node-1"].startswith("caused 2 failed attempts")


def node_end(kind: str = "exited", code: int | None = 1, **more: object) -> NodeEnd:
    return NodeEnd("node-1", EndKind(kind), 5.0, code, **more)  # type: ignore[arg-type]


def test_a_nodes_end_inside_an_attempt_is_nothing_a_stop_a_group_going_on_or_a_failed_start() -> None:
    """One decision for every node's end: an elastic group goes on while it keeps its minimum; a static one needs
    every node; a node that had not started fails the start, in its agent's words."""
    def after(end: NodeEnd, **given: object) -> object:
        facts: dict[str, object] = {"asked_to_stop": False, "started": True, "remaining": 2, "needs": 3,
                                    "start_failed": False, **given}
        return after_node_end(end, **facts)  # type: ignore[arg-type]

    assert after(node_end(code=0)) is None  # it succeeded
    assert after(node_end(), asked_to_stop=True) is None  # its end is what was asked
    assert after(node_end()) == StopRun("node-1")  # a static group of 3 needs every node
    assert after(node_end(), needs=2) == GoOnWithout("node-1", 2, 2)  # a c10d group keeps its minimum
    assert after(node_end(), needs=2, start_failed=True) == StopRun("node-1")  # the start failed: all stop
    assert after(node_end(), started=False, said=["setup line 1 of 1 failed"]) == \
        FailStart("node-1: setup line 1 of 1 failed")
    assert after(node_end("silent", None, silent_for=31.0), started=False) == \
        FailStart("node-1: stopped answering (nothing for 31 s)")
    assert after(node_end("start-error", 125), started=False) == FailStart("node-1: the agent exited with code 125")


def test_restarts_apply_to_an_attached_run_over_ssh_only() -> None:
    assert restarts(2, "restart", source="c.yaml") == restarts(2, "restart", source="c.yaml")
    attached = restarts(2, "restart", source="c.yaml")
    assert (attached.retries, attached.on_hang, attached.notes) == (2, "restart", ())
    none_left = restarts(0, "restart", source="c.yaml")
    assert none_left.on_hang == "stop" and "a hang stops the run" in none_left.notes[0]
    detached = restarts(2, "restart", source="c.yaml", where="detached")
    assert (detached.retries, detached.on_hang) == (0, "stop")
    assert detached.notes == ("note: c.yaml: retries: 2 does not apply to a detached run: no launcher is there to "
                              "start it again",
                              "note: c.yaml: job.on_hang: restart does not apply to a detached run: no launcher "
                              "watches it for a hang (an attached run's does; `inv top` shows a rank behind)")
    with pytest.raises(UsageError, match="--retries needs an attached run"):
        restarts(2, "stop", source="c.yaml", where="detached", given=True)
    with pytest.raises(UsageError, match="--on-hang restart does not apply to --slurm"):
        restarts(0, "restart", source="c.yaml", where="slurm", on_hang_given=True)


def test_a_run_taken_over_is_followed_to_its_end_and_never_started_again() -> None:
    taken = restarts(0, "restart", source="c.yaml", where="attach")
    assert (taken.retries, taken.on_hang) == (0, "stop")
    assert taken.notes == ("note: c.yaml: job.on_hang: restart does not apply to attach; a hang stops the run",)
    assert restarts(0, "keep", source="c.yaml", where="attach", on_hang_given=True).on_hang == "keep"
    with pytest.raises(UsageError, match=r"--on-hang restart does not apply to attach: it follows the run it takes "
                                         r"over to its end \(`launch --on-hang restart` starts a run again\)"):
        restarts(0, "restart", source="c.yaml", where="attach", on_hang_given=True)
    with pytest.raises(ValueError, match="not 'nowhere'"):
        restarts(0, "stop", source="c.yaml", where="nowhere")
