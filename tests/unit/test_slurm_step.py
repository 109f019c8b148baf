"""SLURM without a cluster: the allocation's nodes as the plan's cluster, the step's command line, its input that
each task picks its own part of (the selector, run for real), and srun's merged output told apart per node."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from launcher.config.inventory import parse_inventory
from launcher.errors import LauncherError
from launcher.plan.launchplan import plan_launch
from launcher.plan.request import start_request
from launcher.slurm.allocation import allocation_cluster, allocation_nodes, cpus_per_task
from launcher.slurm.step import SELECTOR_SOURCE, SrunStep, srun_argv, step_input
from launcher.transport.program import BOOTSTRAP, program_line

INVENTORY = textwrap.dedent("""\
    defaults: {python: /opt/venv/bin/python, workdir: ~/project, nproc_per_node: 2}
    hosts:
      - login-1
      - {name: gpu-7, nproc_per_node: 4}
    rendezvous: {master_addr: login-1, master_port: 29611}
    job: {script: train/ddp.py}
""")


def test_the_allocation_nodes_are_the_cluster_and_the_first_is_the_master() -> None:
    cluster = allocation_cluster(parse_inventory(INVENTORY, "slurm.yaml"), ["gpu-3", "gpu-7", "gpu-9"])
    plan = plan_launch(cluster)
    assert [c.host.name for c in plan.nodes] == ["gpu-3", "gpu-7", "gpu-9"]
    assert [c.node_rank for c in plan.nodes] == [0, 1, 2]  # SLURM_NODEID order
    assert cluster.rendezvous.master_addr == "gpu-3" and cluster.rendezvous.master_port == 29611
    assert [c.host.nproc_per_node for c in plan.nodes] == [2, 4, 2]  # gpu-7 keeps its own entry
    assert plan.nodes[0].host.python == "/opt/venv/bin/python"
    argv = plan.nodes[2].argv
    assert argv[argv.index("--node-rank") + 1] == "2" and argv[argv.index("--master-addr") + 1] == "gpu-3"


def test_outside_an_allocation_the_error_says_how_to_get_one() -> None:
    with pytest.raises(LauncherError, match="salloc"):
        allocation_nodes({"PATH": "/usr/bin"})


def test_srun_runs_one_task_per_node_and_ends_the_step_on_a_bad_exit() -> None:
    argv = srun_argv(["a", "b"], "python3 -c X", kill_on_bad_exit=True, job_name="run-1")
    line = " ".join(argv)
    assert "--nodes 2" in line and "--ntasks-per-node 1" in line and "--kill-on-bad-exit=1" in line
    assert "--label" in argv and argv[-3:] == ["/bin/sh", "-c", "python3 -c X"]
    assert "--kill-on-bad-exit=0" in srun_argv(["a"], "x", kill_on_bad_exit=False, job_name="r")
    assert "--overlap" not in argv  # in an allocation: the run's step is the only one
    assert "--overlap" in srun_argv(["a"], "x", kill_on_bad_exit=True, job_name="r", overlap=True)  # beside a job's


@pytest.mark.parametrize(("env", "cpus"), [
    ({"SLURM_CPUS_PER_TASK": "6", "SLURM_JOB_CPUS_PER_NODE": "32(x2)"}, 6),
    ({"SLURM_JOB_CPUS_PER_NODE": "32(x2)"}, 32),
    ({"SLURM_JOB_CPUS_PER_NODE": "16,8(x3),24"}, 8),
    ({}, None),
])
def test_each_node_s_task_gets_the_cpus_the_job_holds_there(env: dict[str, str], cpus: int | None) -> None:
    # srun 22.05 gives a step's task one CPU unless told: torchrun and all its workers would share it.
    assert cpus_per_task(env) == cpus
    argv = srun_argv(["a"], "x", kill_on_bad_exit=True, job_name="r", cpus_per_task=cpus)
    assert ("--cpus-per-task" in argv) == (cpus is not None)


ECHO_PROGRAM = textwrap.dedent("""\
    import json, sys
    request = json.loads(sys.stdin.readline())
    print(json.dumps(request), flush=True)
    for line in sys.stdin:
        print("word", line.strip(), flush=True)
""")


def _step_input() -> bytes:
    cluster = allocation_cluster(parse_inventory(INVENTORY, "slurm.yaml"), ["gpu-3", "gpu-7"])
    plan = plan_launch(cluster)
    return step_input(ECHO_PROGRAM, [(c, {"node": c.host.name, "rank": c.node_rank}) for c in plan.nodes])


def test_each_task_runs_the_program_with_its_own_request_then_the_words() -> None:
    env = {"SLURM_NODEID": "1", "SLURMD_NODENAME": "gpu-7", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", BOOTSTRAP], input=_step_input() + b"hb\ngo\n",
                          capture_output=True, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert json.loads(lines[0]) == {"node": "gpu-7", "rank": 1}
    assert lines[1:] == ["word hb", "word go"]


def test_a_task_on_another_node_than_planned_says_so_and_runs_nothing() -> None:
    env = {"SLURM_NODEID": "1", "SLURMD_NODENAME": "gpu-3", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", BOOTSTRAP], input=_step_input(), capture_output=True, env=env,
                          timeout=30)
    assert done.returncode == 2 and done.stdout == b""
    assert "SLURM put node id 1 on gpu-3, the plan on gpu-7" in json.loads(done.stderr)["message"]


def test_srun_lines_go_to_their_node_and_its_task_end_ends_that_node_only() -> None:
    step = SrunStep(["gpu-3", "gpu-7", "gpu-9"], "x", kill_on_bad_exit=True, job_name="r")
    step._route([b"0: hello"], is_err=False)
    step._route([b"1: {\"event\": \"ready\"}"], is_err=True)
    step._route([b"srun: error: gpu-7: task 1: Exited with exit code 3"], is_err=True)
    step._route([b"srun: error: gpu-9: task 2: Killed"], is_err=True)
    step._route([b"srun: launch/slurm: _step_signal: Terminating StepId=7.0"], is_err=True)
    first, second, third = step.channels
    assert first.read() == (b"hello\n", b"") and not first.finished
    assert second.read() == (b"", b"{\"event\": \"ready\"}\n")
    assert second.finished and second.exit_code() == 3
    assert third.finished and third.exit_code() == 137  # SIGKILL, as a shell says it
    assert first.read() == (b"", b"")  # srun's chatter after the tasks spoke is no node's message
    assert step.srun_lines == ["srun: launch/slurm: _step_signal: Terminating StepId=7.0"]


def test_what_srun_says_before_any_task_spoke_is_every_node_s_message() -> None:
    step = SrunStep(["a", "b"], "x", kill_on_bad_exit=True, job_name="r")
    step._route([b"srun: error: Unable to create step for job 9: Invalid node name specified"], is_err=True)
    step._route([b"srun: error: a,b: tasks 0-1: Terminated"], is_err=True)
    for channel in step.channels:
        assert b"Invalid node name" in channel.read()[1]
        assert channel.exit_code() == 143


def test_a_word_every_session_sends_in_a_round_reaches_srun_once() -> None:
    step = SrunStep(["a", "b", "c"], "x", kill_on_bad_exit=True, job_name="r")
    step.proc = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        for word in (b"hb\n", b"go\n", b"hb\n"):
            assert all(channel.send(word, block=False) for channel in step.channels)
        step.proc.stdin.close()
        assert step.proc.stdout.read() == b"hb\ngo\nhb\n"
    finally:
        step.proc.wait(timeout=10)


@pytest.mark.parametrize(("given", "option"), [
    ({"sync": True}, "--sync"), ({"retries": 2}, "--retries"), ({"detach": True}, "--detach")])
def test_options_of_an_ssh_launch_are_refused_with_slurm_before_anything_starts(
        tmp_path, given: dict[str, object], option: str) -> None:
    from launcher import app
    from launcher.errors import USAGE
    from launcher.settings import Settings
    inventory = tmp_path / "slurm.yaml"
    inventory.write_text(INVENTORY)
    settings = Settings.of({name: value for name, value in given.items() if name in ("retries", "detach") and value})
    with pytest.raises(LauncherError, match=f"{option} does not apply to --slurm") as excinfo:
        app.launch(str(inventory), slurm=True, sync=bool(given.get("sync")), settings=settings)
    assert excinfo.value.exit_code == USAGE


def test_the_step_input_is_linear_in_nodes_and_every_task_gets_its_exact_request() -> None:
    """srun gives every task the whole stdin: the shared part (probe source, run settings) must travel once."""
    from launcher import doctor
    from launcher.node.slurm.selector import merged
    from launcher.run import actions as run_actions
    def requests(count: int) -> list[tuple[Any, dict[str, Any]]]:
        names = [f"gpu-{i}" for i in range(count)]
        cluster = allocation_cluster(parse_inventory(INVENTORY, "slurm.yaml"), names)
        plan = plan_launch(cluster)
        return [(c, start_request(plan, c, {}, doctor.DoctorGate())) for c in plan.nodes]

    small, large = requests(8), requests(256)
    per_task = len(step_input(run_actions.AGENT_SOURCE, large))
    old_way = sum(len(json.dumps(r)) for _, r in large)  # every node's whole request, in every task's stdin
    print(f"step input per task at 256 nodes: {per_task / 1e6:.2f} MB (every request whole: {old_way / 1e6:.1f} MB)")
    programs = sum(len(program_line(p)) + 1 for p in (SELECTOR_SOURCE, run_actions.AGENT_SOURCE))  # once, any size
    assert (per_task - programs) * 10 < old_way  # the probe is the agent's own module now: in no request
    growth = (per_task - len(step_input(run_actions.AGENT_SOURCE, small))) / (256 - 8)
    assert growth < 1_000, f"{growth:.0f} bytes per node"  # a node's own part, not the probe's source again
    lines = step_input(run_actions.AGENT_SOURCE, large).decode().splitlines()
    common, parts = json.loads(lines[2]), json.loads(lines[3])
    for i, (_, request) in enumerate(large):
        assert merged(common, parts[str(i)]["request"]) == json.loads(json.dumps(request))
