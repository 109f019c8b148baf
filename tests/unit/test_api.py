"""The Python API's pure parts: its options checked as the command line's, output handed on in whole lines, `top`'s
JSON as objects, a detached run's end from its nodes' states, errors that are the launcher's typed ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher import api
from launcher.errors import InventoryError, LauncherError, RunFailed, UsageError
from launcher.run.control import NodeState


def test_options_are_checked_as_the_command_lines() -> None:
    settings = api._settings({"grace": "2.5", "log_dir": "runs", "retries": 1}, detach=True)
    assert (settings.run.grace, settings.output.log_dir, settings.run.retries, settings.run.detach) == (
        2.5, Path("runs"), 1, True)
    assert settings.sources == dict.fromkeys(("grace", "log_dir", "retries", "detach"), "the caller")
    with pytest.raises(LauncherError, match="--grace must be from 0 to 86400 seconds, got '-1'"):
        api._settings({"grace": -1})
    with pytest.raises(LauncherError, match="unknown option 'gracee'"):
        api._settings({"gracee": 1})


def test_errors_are_typed_never_an_exit(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="no such file"):
        api.launch(tmp_path / "none.yaml")
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts: [a]\njob: {script: t.py}\n")
    with pytest.raises(UsageError, match="--script and --module both name what to run"):
        api.launch(inventory, "t.py", module="m")


def test_output_reaches_the_callback_in_whole_lines() -> None:
    seen: list[str] = []
    stream = api._LineStream(seen.append)
    stream.write("node-0 r0  | a\nnode-0 r0  | b")
    stream.write("c\nnode-1 r1  | d\n")
    stream.write("no end")
    stream.end()
    assert seen == ["node-0 r0  | a", "node-0 r0  | bc", "node-1 r1  | d", "no end"]
    assert not stream.isatty()


def test_top_is_objects_and_keeps_fields_it_does_not_name() -> None:
    data = {"run": "r", "nodes": [{"node": "n0", "reachable": True, "problem": None, "load1": 1.5, "cpus": 2,
                                   "mem_total_bytes": 10, "mem_available_bytes": 5, "gpus": [{"index": 0}],
                                   "new_field": 1}],
            "ranks": [{"node": "n0", "rank": 0, "local_rank": 0, "pid": 7, "steps_per_s": 3.5, "step": 9,
                       "straggler": False, "helpers": []}]}
    snap = api.TopSnapshot.of(data)
    assert snap.run_id == "r" and snap.nodes[0].gpus == ({"index": 0},) and snap.nodes[0].load1 == 1.5
    rank = snap.ranks[0]
    assert (rank.node, rank.rank, rank.steps_per_s, rank.step, rank.cpu_percent) == ("n0", 0, 3.5, 9, None)
    assert rank.data["helpers"] == []


def test_a_detached_runs_end_names_the_first_node_that_did_not_exit_0() -> None:
    states = [NodeState("n0", "exited", "r", 0, 1.0, 5.0), NodeState("n1", "exited", "r", 3, 1.0, 4.0),
              NodeState("n2", "stopped", "r", 137, 1.0, 6.0)]
    result = api._states_result("r", api._settings({}), states)
    assert not result.ok and result.failed_node == "n1" and result.exit_code == 3
    assert result.root_cause == "run r FAILED: n1: exit code 3"
    assert [n.state for n in result.nodes] == ["exited", "exited", "stopped"]
    with pytest.raises(RunFailed, match="n1: exit code 3"):
        result.check()
    fine = api._states_result("r", api._settings({"log_dir": "runs"}), states[:1])
    assert fine.ok and fine.check() is fine and fine.logs == Path("runs/r")
