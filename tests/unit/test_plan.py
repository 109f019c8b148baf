"""The pure launch plan: torchrun's words per node, rank order and offsets, run dirs and ids. Its shell line is tested
in test_plan_shell.py, its dry run in test_plan_dry_run.py, the settings of nodes that share nothing in
test_plan_share_nothing.py."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from launcher.config.model import Job
from launcher.plan.launchplan import RUNS_ROOT, LaunchPlan, new_run_id, plan_launch, rank_offsets
from tests.support.plans import HETERO, NASTY_WORDS, cluster


def flag(argv: tuple[str, ...], name: str) -> str:
    """The value after flag `name` among torchrun's own options (before the script)."""
    i = argv.index(name)
    return argv[i + 1]


# --- argv ----------------------------------------------------------------------------------------------------


def test_heterogeneous_nodes() -> None:
    plan = plan_launch(cluster(HETERO), run_id="r1")
    first, second = plan.nodes
    assert [n.host.name for n in plan.nodes] == ["gpu01", "gpu02"]
    for node, rank, nproc in ((first, 0, "4"), (second, 1, "2")):
        assert node.argv[:3] == ("/opt/venv/bin/python", "-m", "torch.distributed.run")
        assert flag(node.argv, "--nnodes") == "2"
        assert flag(node.argv, "--node-rank") == str(rank)
        assert flag(node.argv, "--nproc-per-node") == nproc
        assert flag(node.argv, "--master-addr") == "gpu01"
        assert flag(node.argv, "--master-port") == "29611"
        assert node.node_rank == rank
    assert (first.rank_offset, second.rank_offset) == (0, 4)
    assert plan.cluster.world_size == 6


def test_the_whole_argv_of_a_node() -> None:
    node = plan_launch(cluster(HETERO), run_id="r1").nodes[1]
    assert node.argv == (
        "/opt/venv/bin/python", "-m", "torch.distributed.run",
        "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2",
        "--master-addr", "gpu01", "--master-port", "29611",
        "--redirects", "3", "--log-dir", f"{RUNS_ROOT}/r1/gpu02/ranks",
        "train/ddp.py", "--epochs", "3",
    )


def test_master_addr_is_the_first_hosts_addr_on_every_node() -> None:
    plan = plan_launch(cluster("""\
        hosts: [{name: gpu01, addr: 10.0.0.1}, {name: gpu02, addr: 10.0.0.2}, gpu03]
        job: {script: t.py}
    """))
    assert {flag(n.argv, "--master-addr") for n in plan.nodes} == {"10.0.0.1"}
    assert {flag(n.argv, "--master-port") for n in plan.nodes} == {"29500"}


@pytest.mark.parametrize(("nprocs", "offsets"), [
    ([4, 2], [0, 4]),
    ([8, 8, 4, 1], [0, 8, 16, 20]),
    ([4, "auto", 2], [0, 4, None]),
    (["auto", 2], [0, None]),
    ([1, 2, "auto"], [0, 1, 3]),
])
def test_rank_offsets(nprocs: list[int | str], offsets: list[int | None]) -> None:
    hosts = ", ".join(f"{{name: n{i}, nproc_per_node: {p}}}" for i, p in enumerate(nprocs))
    c = cluster(f"hosts: [{hosts}]\njob: {{script: t.py}}\n")
    assert rank_offsets(c) == {f"n{i}": o for i, o in enumerate(offsets)}
    plan = plan_launch(c, run_id="r")
    assert [n.rank_offset for n in plan.nodes] == offsets
    assert [flag(n.argv, "--nproc-per-node") for n in plan.nodes] == [str(p) for p in nprocs]


def test_ranks_follow_inventory_order() -> None:
    plan = plan_launch(cluster("hosts: [zeta, alpha, mid, '10.0.0.1']\njob: {script: t.py}\n"), run_id="r")
    assert [(n.host.name, n.node_rank) for n in plan.nodes] == [("zeta", 0), ("alpha", 1), ("mid", 2),
                                                                ("10.0.0.1", 3)]
    assert [flag(n.argv, "--node-rank") for n in plan.nodes] == ["0", "1", "2", "3"]
    assert {flag(n.argv, "--nnodes") for n in plan.nodes} == {"4"}


@pytest.mark.parametrize("args", [(), ("--epochs", "3"), tuple(NASTY_WORDS)])
def test_script_and_args_come_last_exactly_as_given(args: tuple[str, ...]) -> None:
    job = Job(script="dir with space/train $(x).py", args=args)
    for node in plan_launch(cluster(HETERO), job, run_id="r").nodes:
        assert node.argv[-len(args) - 1:] == (job.script, *args)
        assert node.argv.index(job.script) == len(node.argv) - len(args) - 1


def test_the_inventory_job_is_the_default_and_another_job_replaces_it() -> None:
    c = cluster(HETERO)
    assert plan_launch(c, run_id="r").job == Job("train/ddp.py", ("--epochs", "3"))
    other = Job("eval.py", ("--x",))
    plan = plan_launch(c, other, run_id="r")
    assert plan.job == other
    assert all(n.argv[-2:] == ("eval.py", "--x") for n in plan.nodes)


def test_no_job_at_all_is_an_error() -> None:
    with pytest.raises(ValueError, match="no job"):
        plan_launch(cluster("hosts: [a]\n"))


def test_run_dir_per_node_and_log_dir_inside_it() -> None:
    plan = plan_launch(cluster(HETERO), run_id="20261122-031500-a1b2c3")
    assert RUNS_ROOT == "~/.cache/ddp-launcher/runs"
    for node in plan.nodes:
        assert node.run_dir == f"~/.cache/ddp-launcher/runs/20261122-031500-a1b2c3/{node.host.name}"
        assert flag(node.argv, "--log-dir") == f"{node.run_dir}/ranks"
    assert plan.run_id == "20261122-031500-a1b2c3"


def test_a_plan_gets_a_fresh_run_id() -> None:
    c = cluster(HETERO)
    one, two = plan_launch(c), plan_launch(c)
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", one.run_id)
    assert one.run_id != two.run_id
    assert one.nodes[0].run_dir.endswith(f"/{one.run_id}/gpu01")


def test_env_and_workdir_come_from_the_host() -> None:
    plan = plan_launch(cluster("""\
        defaults: {env: {A: "1"}, workdir: /srv/a}
        hosts: [a, {name: b, env: {A: "2", B: x}, workdir: ~/b}]
        job: {script: t.py}
    """), run_id="r")
    a, b = plan.nodes
    assert (a.workdir, [(v.name, v.value) for v in a.env]) == ("/srv/a", [("A", "1")])
    assert (b.workdir, [(v.name, v.value) for v in b.env]) == ("~/b", [("A", "2"), ("B", "x")])


def test_a_script_that_reads_as_an_option_is_refused() -> None:
    with pytest.raises(ValueError, match="starts with '-'"):
        plan_launch(cluster(HETERO), Job("--nnodes"), run_id="r")


def test_planning_is_a_value() -> None:
    c = cluster(HETERO)
    assert plan_launch(c, run_id="r") == plan_launch(c, run_id="r")
    assert isinstance(plan_launch(c, run_id="r"), LaunchPlan)


def test_the_plan_resolves_the_hang_timeout_and_retries_once() -> None:
    """The command line's (or settings') value wins, else the inventory's; everything after reads the plan."""
    from launcher.config.inventory import parse_inventory
    from launcher.plan.launchplan import plan_launch
    from launcher.plan.settings import for_run
    from launcher.settings import Settings

    cluster = parse_inventory("hosts: [a, b]\nretries: 2\njob: {script: train.py, hang_timeout: 90}\n", "i.yaml")
    plan = plan_launch(cluster)
    assert (plan.settings.run.hang_timeout, plan.settings.run.retries) == (90.0, 2)
    given = plan_launch(cluster, settings=for_run(Settings.of(hang_timeout=0, retries=0), cluster))
    assert (given.settings.run.hang_timeout, given.settings.run.retries) == (0, 0)
    bare = plan_launch(parse_inventory("hosts: [a]\njob: {script: train.py}\n", "i.yaml"))
    assert (bare.settings.run.hang_timeout, bare.settings.run.retries) == (None, 0)  # None: learnt from the run


# --- run ids -------------------------------------------------------------------------------------------------


def test_run_ids_sort_by_time() -> None:
    start = dt.datetime(2026, 11, 22, 3, 15, 0)
    times = [start + dt.timedelta(seconds=s) for s in (0, 1, 59, 60, 3600, 86400, 86400 * 40, 86400 * 400)]
    ids = [new_run_id(t) for t in times]
    assert sorted(ids) == ids
    assert sorted(reversed(ids)) == ids
    assert new_run_id(dt.datetime(2026, 1, 2, 3, 4, 5)).startswith("20260102-030405-")
    assert new_run_id(dt.datetime(2025, 12, 31, 23, 59, 59)) < new_run_id(dt.datetime(2026, 1, 1, 0, 0, 0))


def test_run_ids_differ_even_in_the_same_second() -> None:
    now = dt.datetime(2026, 11, 22, 3, 15, 0)
    ids = {new_run_id(now) for _ in range(10)}
    assert len(ids) == 10
    assert all(re.fullmatch(r"20261122-031500-[0-9a-f]{6}", i) for i in ids)
    assert new_run_id() != new_run_id()
