"""Pure parts of elasticity: the inventory's elastic fields, torchrun's c10d words, which failure is worth a retry,
which nodes the next attempt runs on, and rank tags that change at a re-rendezvous."""

from __future__ import annotations

import pytest

from launcher.config.inventory import parse_inventory
from launcher.config.selection import select_hosts
from launcher.errors import InventoryError, PlanError
from launcher.events import NodeEnd
from launcher.plan.dryrun import dry_run_text
from launcher.plan.ends import Supervised, run_end, start_failed
from launcher.plan.launchplan import plan_launch
from launcher.plan.recovery import Final, Retry, after_attempt
from launcher.plan.retry import FAILURES_TO_BLACKLIST, blacklisted, next_nodes, resumed
from launcher.report.lines import NodeLog

THREE = """\
hosts: [node-0, node-1, {name: node-2, addr: 10.0.0.3}]
rendezvous: {master_addr: node-0, master_port: 29611, backend: c10d, nodes: 2:3, max_restarts: 2,
             conf: {last_call_timeout: 1}}
retries: 1
job: {script: train/ddp.py, args: [--epochs, "2"]}
"""


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_c10d_words_for_every_node() -> None:
    plan = plan_launch(parse_inventory(THREE, "c.yaml"), run_id="20261122-101010-abcdef")
    for i, node in enumerate(plan.nodes):
        argv = node.argv
        assert flag(argv, "--nnodes") == "2:3"
        assert flag(argv, "--rdzv-backend") == "c10d"
        assert flag(argv, "--rdzv-endpoint") == "node-0:29611"
        assert flag(argv, "--rdzv-id") == "20261122-101010-abcdef"
        assert flag(argv, "--rdzv-conf") == f"is_host={1 if i == 0 else 0},last_call_timeout=1"
        assert flag(argv, "--max-restarts") == "2"
        assert flag(argv, "--local-addr") == node.host.addr
        assert "--node-rank" not in argv and "--master-addr" not in argv
        assert node.rank_offset is None  # ranks come from torchrun's tags
        assert dict(node.launcher_env)["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    text = dry_run_text(plan)
    assert "(c10d: trains on 2 to 3 of them)" in text and "retries: 1:" in text
    # What a retry adds is said before anything starts: here nothing, and where the attempt is.
    assert ("started again on the nodes that pass the doctor, with the same arguments (job.resume_args adds some) "
            "and DDP_LAUNCHER_ATTEMPT=2, 3, ... in its environment") in " ".join(text.split()), text


def test_static_keeps_its_words_and_adds_max_restarts_only_when_asked() -> None:
    static = parse_inventory("hosts: [a, b]\nrendezvous: {max_restarts: 1}\n", "s.yaml")
    argv = plan_launch(static, parse_inventory("hosts: [a]\njob: {script: t.py}\n").job, run_id="r").nodes[1].argv
    assert flag(argv, "--node-rank") == "1" and flag(argv, "--max-restarts") == "1"
    assert "--rdzv-backend" not in argv


@pytest.mark.parametrize(("text", "message"), [
    ("rendezvous: {backend: c10d, nodes: 4:5}", "c.yaml:2: rendezvous.nodes: asks for at least 4 node(s); the "
                                                "inventory lists 3"),
    ("rendezvous: {nodes: 2:3}", "rendezvous.nodes: needs `backend: c10d`"),
    ("rendezvous: {backend: etcd}", "rendezvous.backend: must be one of static, c10d, got 'etcd'"),
    ("rendezvous: {backend: c10d, conf: {is_host: 1}}", "rendezvous.conf.is_host: is set by the launcher"),
    ("rendezvous: {backend: c10d, conf: {timeout: 'a b'}}", "rendezvous.conf.timeout: must be a number or a word"),
    ("rendezvous: {backend: c10d, nodes: 3:2}", "rendezvous.nodes: needs 1 <= MIN <= MAX, got 3:2"),
    ("retries: -1", "retries: must be a whole number, 0 or more, got -1"),
    ("retries: true", "retries: must be a whole number"),
    ("retries: 1000000000", "c.yaml:2: retries: must be at most 1000, got 1000000000 (int)"),
    ("rendezvous: {max_restarts: 1001}", "c.yaml:2: rendezvous.max_restarts: must be at most 1000, got 1001 (int)"),
    ("job: {script: t.py, resume_args: --resume}", "job.resume_args: must be a list of words"),
])
def test_bad_elastic_fields_name_the_field(text: str, message: str) -> None:
    with pytest.raises(InventoryError) as err:
        parse_inventory("hosts: [a, b, c]\n" + text + "\n", "c.yaml")
    assert message in str(err.value)


def test_nodes_as_written_and_fewer_chosen_hosts_than_min() -> None:
    cluster = parse_inventory("hosts: [a, b, c]\nrendezvous: {backend: c10d, nodes: 2:3}\n", "c.yaml")
    assert cluster.rendezvous.elastic.nodes_range(3) == (2, 3)  # `2:3` unquoted is 123 in YAML 1.1
    job = parse_inventory("hosts: [a]\njob: {script: t.py}\n").job
    with pytest.raises(PlanError, match=r"rendezvous\.nodes asks for at least 2 node"):
        plan_launch(select_hosts(cluster, "a", None), job)


def end(node: str, kind: str = "exited", code: int | None = 1, tail: tuple[str, ...] = (), t: float = 1.0,
        asked: bool = False) -> NodeEnd:
    return NodeEnd(node, kind, t, code, asked_to_stop=asked, tail=tail)


BLOCK = ("Root Cause (first observed failure):", "[0]:", "  rank      : 2 (local_rank: 0)", "  exitcode  : {code}",
         "=====")


@pytest.mark.parametrize(("ends", "how", "why"), [
    ([end("n0", asked=True, code=0), end("n2", "agent-died", None)], "lost",
     "n2 was lost: the launcher's agent on it died"),
    ([end("n1", "lost", None)], "lost", "n1 was lost: the connection to it was lost"),
    ([end("n1", "silent", None)], "lost", "n1 was lost: it stopped answering"),
    ([end("n2", code=137)], "killed", "n2: torchrun was killed by signal 9"),
    ([end("n2", code=-9)], "killed", "n2: torchrun was killed by signal 9"),
    ([end("n2", tail=tuple(line.format(code=-9) for line in BLOCK))], "killed", "n2: a worker was killed by signal 9"),
    ([end("n2", tail=tuple(line.format(code=1) for line in BLOCK))], "failed", None),
    ([end("n2", code=1)], "failed", None),
    ([end("n2", "start-error", 125)], "failed", None),
])
def test_an_attempts_end_is_a_lost_node_a_killed_process_or_the_scripts_own(ends: list[NodeEnd], how: str,
                                                                           why: str | None) -> None:
    found = run_end(ends, Supervised(needs=3)).end
    assert found.how == how and found.node == ends[-1].node
    if why is not None:
        assert found.why == why
    decision = after_attempt(found, [], nodes=["n0", "n1", "n2"], min_nodes=1, retries=1, on_hang="stop",
                             failures={}, now=0.0, cooldown=300.0)
    assert isinstance(decision, Retry) == (how in ("lost", "killed"))


def test_next_nodes_keeps_the_order_and_moves_the_master_when_it_is_gone() -> None:
    cluster = parse_inventory(THREE, "c.yaml")
    kept = next_nodes(cluster, {"node-2": "unreachable"})
    assert [h.name for h in kept.cluster.hosts] == ["node-0", "node-1"]
    assert kept.cluster.rendezvous.master_addr == "node-0" and kept.new_master is None
    moved = next_nodes(cluster, {"node-0": "unreachable"})
    assert [h.name for h in moved.cluster.hosts] == ["node-1", "node-2"]
    assert moved.cluster.rendezvous.master_addr == "node-1" and moved.new_master == "node-1"
    assert moved.dropped == {"node-0": "unreachable"}
    assert flag(plan_launch(moved.cluster, run_id="r").nodes[0].argv, "--rdzv-endpoint") == "node-1:29611"


def test_a_node_that_failed_twice_cools_down() -> None:
    times = [100.0 + i for i in range(FAILURES_TO_BLACKLIST)]
    assert blacklisted({"n1": times[:1]}, 102.0, 300.0) == {}
    assert "caused 2 failed attempts; cooling down for 299 s more" in blacklisted({"n1": times}, 102.0, 300.0)["n1"]
    assert blacklisted({"n1": times}, times[-1] + 300.0, 300.0) == {}


def test_a_retry_adds_nothing_unless_resume_args_say_so_and_then_once() -> None:
    """A retry's default is torchrun's: the same arguments (a default `--resume` broke every script without that
    option in its second attempt); the attempt is in the environment of every process of the run."""
    job = parse_inventory(THREE, "c.yaml").job
    assert job is not None
    assert resumed(job).args == ("--epochs", "2")
    second = plan_launch(parse_inventory(THREE, "c.yaml"), resumed(job), attempt=2)
    assert all(("DDP_LAUNCHER_ATTEMPT", "2") in node.launcher_env for node in second.nodes)
    own = parse_inventory("hosts: [a]\njob: {script: t.py, args: [--epochs, '2'], resume_args: [--resume]}\n").job
    assert own is not None
    assert resumed(own).args == ("--epochs", "2", "--resume")
    assert resumed(resumed(own)).args == ("--epochs", "2", "--resume")
    custom = parse_inventory("hosts: [a]\njob: {script: t.py, resume_args: [--from, last.pt]}\n").job
    assert custom is not None and resumed(custom).args == ("--from", "last.pt")


def test_rank_tags_follow_torchrun_and_say_when_a_rank_moves() -> None:
    log = NodeLog("node-1", 0, 6, None, False)
    text, count = log.format(b"banner\n[default0@r2]:a\n[default1@r3]:b\n[default0@r0]:c\n[default0@r2]:d\n")
    assert text.splitlines() == [
        "node-1     | banner", "node-1 r2  | a", "node-1 r3  | b",
        "node-1     | local rank 0 is now global rank 0 (was 2): the group re-formed", "node-1 r0  | c",
        "node-1     | local rank 0 is now global rank 2 (was 0): the group re-formed", "node-1 r2  | d"]
    assert count == 5
    assert list(log.tail)[-1] == "[local rank 0, rank 2] d"


def test_the_report_says_why_there_was_no_retry() -> None:
    from launcher.errors import RunFailed
    from launcher.plan.retry import Attempt
    from launcher.run.attempts import _with_attempts

    tried = [Attempt(1, "20261122-101010-abcdef", ("n0", "n1"), "n0", 0.0, 5.0, "failed-final", "root cause: n1")]

    def said(failed: RunFailed, retries: int) -> str:
        found = run_end(failed.ends, Supervised(needs=2)).end if failed.ends else start_failed(False).end
        decision = after_attempt(found, [], nodes=["n0", "n1"], min_nodes=1, retries=retries, on_hang="stop",
                                 failures={}, now=0.0, cooldown=300.0)
        assert isinstance(decision, Final)
        return str(_with_attempts(failed, tried, decision))

    script = said(RunFailed("run FAILED", 1, ends=(end("n1"),)), 2)
    assert script.endswith("not retried: the script itself failed (a retry would fail the same way)")
    start = said(RunFailed("could not start", 1), 2)
    assert start.endswith("not retried: the run could not start (a retry would not either)")
    spent = said(RunFailed("run FAILED", 1, ends=(end("n1", "lost"),)), 0)
    assert "attempt 1 (run 20261122-101010-abcdef) on n0, n1; master n0: root cause: n1 after 5 s" in spent
    assert spent.endswith("n1 was lost: the connection to it was lost; no retry left (0 allowed)")


SPARED = """\
hosts: [node-0, node-1]
spares: [node-2, {name: node-3, addr: 10.0.0.4}]
rendezvous: {master_addr: node-0, master_port: 29611}
job: {script: train/ddp.py}
"""


def test_spares_start_no_run_and_a_retry_takes_them_in_order_to_keep_the_runs_size() -> None:
    # issue 69 (11b): a static run whose node sits out shrank while a host stood idle.
    from launcher.plan.retry import with_spares

    cluster = parse_inventory(SPARED, "c.yaml")
    assert [h.name for h in cluster.hosts] == ["node-0", "node-1"] and cluster.spares[1].addr == "10.0.0.4"
    assert [n.host.name for n in plan_launch(cluster, run_id="r").nodes] == ["node-0", "node-1"]
    assert "spares: node-2, node-3 (no run starts there" in dry_run_text(plan_launch(cluster, run_id="r"))
    chosen, taken = with_spares(cluster, {"node-1": "held a hang"}, cluster.spares, 2)
    assert [h.name for h in taken] == ["node-2"] and [h.name for h in chosen.cluster.hosts] == ["node-0", "node-2"]
    assert plan_launch(chosen.cluster, run_id="r").cluster.world_size == 2
    lost_master, taken = with_spares(cluster, {"node-0": "unreachable"}, cluster.spares[1:], 2)
    assert [h.name for h in lost_master.cluster.hosts] == ["node-1", "node-3"]
    assert lost_master.cluster.rendezvous.master_addr == "node-1"
    whole, taken = with_spares(cluster, {}, cluster.spares, 2)
    assert taken == () and [h.name for h in whole.cluster.hosts] == ["node-0", "node-1"]
    with pytest.raises(InventoryError, match=r"spares\[0\]: host 'node-1' is listed twice \(also hosts\[1\]\)"):
        parse_inventory(SPARED.replace("spares: [node-2,", "spares: [node-1,"), "c.yaml")
