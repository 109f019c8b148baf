"""At 256 nodes of 8 GPUs (2,048 ranks) every answer stays a screen: rank lists and node names as ranges, the
states of `inv status` and `inv stop` grouped, the hang answer one line."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from launcher.limits import STATE_ROWS_MAX
from launcher.ranges import names_text, numbers_text
from launcher.report.states import console, problems, state_table
from launcher.run.control import NodeState
from launcher.watch.frames import Frame
from launcher.watch.stackgroups import RankStack, answer


@pytest.mark.parametrize(("numbers", "text"), [
    ([0, 2, 3], "0,2,3"), ([1, 2], "1,2"), ([4], "4"), (range(8), "0-7"),
    ([*range(100), *range(101, 256)], "0-99,101-255"), ([5, 1, 3, 2], "1-3,5"), ([], "")])
def test_numbers_are_said_as_ranges(numbers: list[int], text: str) -> None:
    assert numbers_text(numbers) == text


def test_node_names_are_said_as_a_hostlist() -> None:
    assert names_text([f"node-{i}" for i in range(256) if i != 7]) == "node-[0-6,8-255]"
    assert names_text(["gpu1", "gpu2", "gpu3", "login", "gpu01"]) == "gpu[1-3],login,gpu01"
    assert names_text(["node-3"]) == "node-3"
    assert names_text(["a", "b"]) == "a,b"


def _render(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=160, color_system=None).print(renderable)
    return out.getvalue()


def test_the_states_of_256_nodes_are_a_few_rows_and_the_odd_node_stands_apart() -> None:
    states = [NodeState(f"node-{i}", "running", "r1", started_at=1_800_000_000.0 + i % 3) for i in range(256)]
    states[200] = NodeState("node-200", "exited", "r1", exit_code=1, started_at=1_800_000_000.0)
    states[9] = NodeState("node-9", "unreachable", None, detail="ssh: connection timed out")
    text = _render(state_table("run r1 on 256 node(s)", states, stop=False))
    assert len(text.splitlines()) < 15, text
    assert "node-[0-8,10-199,201-255]" in text and "node-200" in text and "node-9" in text
    few = _render(state_table("run r1", states[:STATE_ROWS_MAX], stop=False))
    assert all(f"node-{i} " in few for i in range(STATE_ROWS_MAX))  # a small cluster: each node its own row


def test_the_same_problem_on_many_nodes_is_said_once() -> None:
    out = io.StringIO()
    problems(console(out), [NodeState(f"node-{i}", "unreachable", detail="ssh: timed out") for i in range(200)])
    assert out.getvalue().strip() == "node-[0-199]: ssh: timed out"


def test_the_hang_answer_of_2048_ranks_is_one_short_line() -> None:
    wait = (Frame("/torch/distributed/distributed_c10d.py", 2800, "all_reduce", None),
            Frame("/job/train.py", 88, "<module>", "dist.all_reduce(t)"))
    sleep = (Frame("/job/train.py", 80, "<module>", "time.sleep(600)"),)
    stacks = [RankStack(f"node-{r // 8}", r, r % 8, 1000 + r, "S", "sleeping", sleep if r == 1000 else wait)
              for r in range(2048)]
    said = answer(stacks)
    assert said.startswith("ranks 0-999,1001-2047 wait in all_reduce (train.py:88); rank 1000 (node-125, pid 2000)")
    assert len(said) < 200, said
