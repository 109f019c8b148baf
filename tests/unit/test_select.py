"""--include / --exclude in DeepSpeed's syntax: which hosts and GPUs remain, and the sentences for mistakes."""

from __future__ import annotations

import textwrap

import pytest

from launcher.config.hostfile import parse_hostfile
from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster, EnvVar, Job
from launcher.config.selection import select_hosts
from launcher.errors import LauncherError, PlanError
from launcher.plan.dryrun import dry_run_text
from launcher.plan.launchplan import plan_launch

SRC = "hosts.txt"


def workers(*slots: int | str) -> Cluster:
    """A cluster of worker-0, worker-1, ... with these nproc_per_node, as a hostfile (or an inventory for auto)."""
    if all(isinstance(s, int) for s in slots):
        return parse_hostfile("".join(f"worker-{i} slots={s}\n" for i, s in enumerate(slots)), SRC)
    hosts = ", ".join(f"{{name: worker-{i}, nproc_per_node: {s}}}" for i, s in enumerate(slots))
    return parse_inventory(f"hosts: [{hosts}]\n", SRC)


def devices(cluster: Cluster) -> dict[str, list[int]]:
    """DeepSpeed's view of a selection: host -> the GPU indices it uses."""
    out = {}
    for host in cluster.hosts:
        assert all(v.name != "CUDA_VISIBLE_DEVICES" for v in host.env)  # the node maps them through its own value
        used = list(host.gpus) if host.gpus is not None else list(range(int(host.nproc_per_node)))
        assert len(used) == host.nproc_per_node
        out[host.name] = used
    return out


def error(cluster: Cluster, include: str | None = None, exclude: str | None = None) -> str:
    with pytest.raises(PlanError) as info:
        select_hosts(cluster, include, exclude)
    assert isinstance(info.value, LauncherError) and "\n" not in str(info.value)
    return str(info.value)


# --- DeepSpeed's own examples (tests/unit/launcher/test_run.py and the docs) ---------------------------------


def test_deepspeed_parser_local() -> None:
    hosts = workers(4)
    assert select_hosts(hosts, None, None) is hosts
    assert select_hosts(hosts, "", "") is hosts
    assert devices(select_hosts(hosts, None, "worker-0:1")) == {"worker-0": [0, 2, 3]}
    assert devices(select_hosts(hosts, None, "worker-0:1,2")) == {"worker-0": [0, 3]}
    assert devices(select_hosts(hosts, "worker-0:1", None)) == {"worker-0": [1]}
    assert devices(select_hosts(hosts, "worker-0:1,1", None)) == {"worker-0": [1]}  # repeats do no harm
    assert devices(select_hosts(hosts, "worker-0:1@worker-0:0,1", None)) == {"worker-0": [0, 1]}
    assert devices(select_hosts(hosts, "worker-0", None)) == {"worker-0": [0, 1, 2, 3]}
    # DeepSpeed returns no hosts at all here; an empty cluster cannot run, so it is an error
    assert error(hosts, exclude="worker-0") == "hosts.txt: --exclude 'worker-0' leaves no host to run on"
    assert error(hosts, exclude="worker-0:0,1,2,3") == ("hosts.txt: --exclude 'worker-0:0,1,2,3' leaves no host "
                                                        "to run on")


def test_deepspeed_parser_multinode() -> None:
    hosts = workers(4, 4)
    assert devices(select_hosts(hosts, "worker-1:0,3", None)) == {"worker-1": [0, 3]}
    assert devices(select_hosts(hosts, None, "worker-1")) == {"worker-0": [0, 1, 2, 3]}
    assert devices(select_hosts(hosts, None, "worker-0:0,1@worker-1:3")) == {"worker-0": [2, 3], "worker-1": [0, 1, 2]}


def test_deepspeed_parse_inclusion_exclusion() -> None:
    hosts = workers(4, 4)
    assert devices(select_hosts(hosts, "worker-0", None)) == {"worker-0": [0, 1, 2, 3]}
    assert devices(select_hosts(hosts, "worker-0@worker-1:0,2", None)) == {"worker-0": [0, 1, 2, 3], "worker-1": [0, 2]}
    assert devices(select_hosts(hosts, "worker-1:0,2", None)) == {"worker-1": [0, 2]}
    assert devices(select_hosts(hosts, None, "worker-0:1")) == {"worker-0": [0, 2, 3], "worker-1": [0, 1, 2, 3]}


@pytest.mark.parametrize("spec", ["worker-0:4", "worker-0:99", "worker-0:0,4"])
def test_deepspeed_out_of_range_indices(spec: str) -> None:
    hosts = workers(4)
    index = max(int(i) for i in spec.partition(":")[2].split(","))
    for flag, kwargs in (("--include", {"include": spec}), ("--exclude", {"exclude": spec})):
        assert error(hosts, **kwargs) == (f"hosts.txt: {flag} {spec!r}: worker-0 has GPU indices 0 to 3 "
                                          f"(nproc_per_node 4), not {index}")


def test_deepspeed_parser_errors() -> None:
    hosts = workers(4, 4)
    assert error(hosts, "A", "B") == "hosts.txt: --include and --exclude cannot be used together; give one of them"
    assert error(hosts, include="jeff") == ("hosts.txt: --include 'jeff': no host 'jeff' in the inventory; "
                                            "the hosts are worker-0, worker-1")
    assert error(hosts, exclude="jeff") == ("hosts.txt: --exclude 'jeff': no host 'jeff' in the inventory; "
                                            "the hosts are worker-0, worker-1")
    assert error(hosts, include="worker-1:4").endswith("worker-1 has GPU indices 0 to 3 (nproc_per_node 4), not 4")
    assert error(hosts, exclude="worker-1:4").endswith("worker-1 has GPU indices 0 to 3 (nproc_per_node 4), not 4")
    assert error(hosts, exclude="worker-1@worker-0:1@5") == ("hosts.txt: --exclude '5': no host '5' in the inventory; "
                                                             "the hosts are worker-0, worker-1")


def test_deepspeed_docs_examples() -> None:
    hosts = workers(4, 4, 4, 4)  # worker-0 .. worker-3
    assert devices(select_hosts(hosts, None, "worker-2:0@worker-3:0,1")) == {
        "worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3], "worker-2": [1, 2, 3], "worker-3": [2, 3]}
    assert devices(select_hosts(hosts, "worker-2:0,1", None)) == {"worker-2": [0, 1]}
    local = parse_hostfile("localhost slots=4\n", SRC)
    assert devices(select_hosts(local, "localhost:1", None)) == {"localhost": [1]}
    assert devices(select_hosts(local, "localhost:0,1,2,3", None)) == {"localhost": [0, 1, 2, 3]}


# --- what the selection does to the cluster ------------------------------------------------------------------


def test_indices_set_nproc_and_the_hosts_gpus_and_leave_its_env() -> None:
    cluster = parse_inventory("defaults: {env: {NCCL_DEBUG: INFO}, nproc_per_node: 8}\nhosts: [a, b]\n", SRC)
    a, b = select_hosts(cluster, "b:6,0,3@a", None).hosts
    assert (a.nproc_per_node, a.gpus, a.env) == (8, None, (EnvVar("NCCL_DEBUG", value="INFO"),))
    assert (b.nproc_per_node, b.gpus, b.env) == (3, (0, 3, 6), (EnvVar("NCCL_DEBUG", value="INFO"),))


def test_include_keeps_inventory_order_whatever_the_order_named() -> None:
    cluster = workers(1, 1, 1)
    assert [h.name for h in select_hosts(cluster, "worker-2@worker-0", None).hosts] == ["worker-0", "worker-2"]


def test_a_whole_host_named_beside_its_indices_is_whole() -> None:
    assert devices(select_hosts(workers(4), "worker-0:1@worker-0", None)) == {"worker-0": [0, 1, 2, 3]}
    assert devices(select_hosts(workers(4, 2), None, "worker-0:1@worker-0")) == {"worker-1": [0, 1]}


def test_spaces_around_hosts_are_ignored() -> None:
    assert devices(select_hosts(workers(2, 2), " worker-1 : 1 @ worker-0", None)) == {"worker-0": [0, 1],
                                                                                       "worker-1": [1]}


def test_include_with_auto_takes_any_index_and_exclude_refuses() -> None:
    cluster = workers("auto", 2)
    assert devices(select_hosts(cluster, "worker-0:5,7", None)) == {"worker-0": [5, 7]}
    assert error(cluster, exclude="worker-0:1") == (
        "hosts.txt: --exclude 'worker-0:1': worker-0's nproc_per_node is auto, so its GPU indices are not known; "
        "set a number in the inventory, or exclude the whole host")
    assert [h.name for h in select_hosts(cluster, None, "worker-0").hosts] == ["worker-1"]


def test_the_master_follows_the_first_remaining_host() -> None:
    cluster = parse_inventory("hosts: [{name: a, addr: 10.0.0.1}, {name: b, addr: 10.0.0.2}, c]\n"
                              "rendezvous: {master_port: 29611}\njob: {script: t.py}\n", SRC)
    for include, exclude in (("b@c", None), (None, "a")):
        picked = select_hosts(cluster, include, exclude)
        assert (picked.rendezvous.master_addr, picked.rendezvous.master_port) == ("10.0.0.2", 29611)
        assert not picked.rendezvous.master_addr_explicit
        node = plan_launch(picked, run_id="r").nodes[0]
        assert node.argv[node.argv.index("--master-addr") + 1] == "10.0.0.2"
        assert node.argv[node.argv.index("--nnodes") + 1] == "2"
    assert select_hosts(cluster, "a@c", None).rendezvous.master_addr == "10.0.0.1"


def test_an_explicit_master_must_stay() -> None:
    cluster = parse_inventory("hosts: [a, b, c]\nrendezvous: {master_addr: a}\n", SRC)
    assert select_hosts(cluster, None, "b").rendezvous.master_addr == "a"
    sentence = ("leaves out a, node rank 0, where rendezvous.master_addr (a) points; keep it, or drop master_addr "
                "from the inventory so that the first remaining host is the master")
    assert error(cluster, exclude="a") == f"hosts.txt: --exclude 'a' {sentence}"
    assert error(cluster, include="b@c") == f"hosts.txt: --include 'b@c' {sentence}"
    external = parse_inventory("hosts: [a, b]\nrendezvous: {master_addr: 10.9.9.9}\n", SRC)
    assert "where rendezvous.master_addr (10.9.9.9) points" in error(external, exclude="a")


def test_line_numbers_follow_the_hosts_new_places() -> None:
    cluster = parse_inventory("hosts:\n  - a\n  - name: b\n    port: 22\n  - c\n", SRC)
    picked = select_hosts(cluster, None, "a")
    assert (picked.lines["hosts[0]"], picked.lines["hosts[0].port"], picked.lines["hosts[1]"]) == (3, 4, 5)
    assert "hosts[2]" not in picked.lines and picked.lines["hosts"] == 1


def test_a_plan_of_the_selection() -> None:
    picked = select_hosts(workers(4, 4), None, "worker-0:0")
    plan = plan_launch(picked, Job("t.py"), run_id="r")
    assert plan.cluster.world_size == 7
    assert [n.rank_offset for n in plan.nodes] == [0, 3]
    assert plan.nodes[0].gpus == (1, 2, 3) and plan.nodes[1].gpus is None
    assert "CUDA_VISIBLE_DEVICES='<GPUs 1,2,3 among those the node shows>' " in plan.nodes[0].shell_line()
    assert ("gpus 1,2,3 (--include/--exclude): CUDA_VISIBLE_DEVICES is the entries 1,2,3 of the node's own "
            "CUDA_VISIBLE_DEVICES where its login, setup or env sets one, else 1,2,3") in dry_run_text(plan)


def test_ipv6_host_names() -> None:
    cluster = parse_hostfile("fe80::1%eth0 slots=4\n::1 slots=2\n", SRC)
    assert devices(select_hosts(cluster, "fe80::1%eth0:1,2@::1", None)) == {"fe80::1%eth0": [1, 2], "::1": [0, 1]}
    assert devices(select_hosts(cluster, None, "::1:0")) == {"fe80::1%eth0": [0, 1, 2, 3], "::1": [1]}


# --- mistakes ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("include", "sentence"), [
    ("worker-0@", "--include 'worker-0@': a host name is empty (hosts are separated by @)"),
    ("@worker-0", "--include '@worker-0': a host name is empty (hosts are separated by @)"),
    ("worker-0@@worker-1", "--include 'worker-0@@worker-1': a host name is empty (hosts are separated by @)"),
    ("worker-0:", "--include 'worker-0:': no GPU index after ':' (write NAME:0,1, or NAME alone for the whole host)"),
    ("worker-0:a", "--include 'worker-0:a': 'a' is not a GPU index (0, 1, 2, ...)"),
    ("worker-0:-1", "--include 'worker-0:-1': '-1' is not a GPU index (0, 1, 2, ...)"),
    ("worker-0:0,,1", "--include 'worker-0:0,,1': '' is not a GPU index (0, 1, 2, ...)"),
    ("worker-0:1.5", "--include 'worker-0:1.5': '1.5' is not a GPU index (0, 1, 2, ...)"),
    ("wroker-1", "--include 'wroker-1': no host 'wroker-1' in the inventory; did you mean 'worker-1'?"),
    ("worker-0:2", "--include 'worker-0:2': worker-0 has GPU indices 0 to 1 (nproc_per_node 2), not 2"),
])
def test_include_mistakes(include: str, sentence: str) -> None:
    assert error(workers(2, 2), include=include) == f"hosts.txt: {sentence}"


def test_indices_where_the_inventory_already_sets_cuda_visible_devices_are_places_in_it() -> None:
    # The node's agent maps them through the value (launcher/node/common/devices.py): a:1 of '2,3' is GPU 3.
    cluster = parse_inventory("hosts: [{name: a, nproc_per_node: 2, env: {CUDA_VISIBLE_DEVICES: '2,3'}}, b]\n", SRC)
    a = select_hosts(cluster, "a:1", None).hosts[0]
    assert (a.gpus, a.nproc_per_node, a.env) == ((1,), 1, (EnvVar("CUDA_VISIBLE_DEVICES", value="2,3"),))
    assert select_hosts(cluster, None, "a:1").hosts[0].gpus == (0,)
    assert select_hosts(cluster, "a", None).hosts[0].gpus is None


def test_many_hosts_are_listed_briefly() -> None:
    cluster = workers(*[1] * 12)
    assert error(cluster, include="zzz") == (
        "hosts.txt: --include 'zzz': no host 'zzz' in the inventory; the hosts are worker-0, worker-1, worker-2, "
        "worker-3, worker-4, worker-5, worker-6, worker-7 and 4 more")


def test_long_specs_are_cut() -> None:
    text = error(workers(1), include="x" * 500)
    assert len(text) < 300 and "…" in text


def test_the_inventory_is_not_changed() -> None:
    cluster = parse_inventory(textwrap.dedent("""\
        hosts:
          - {name: a, nproc_per_node: 4}
          - b
    """), SRC)
    before = (cluster.hosts, cluster.rendezvous, dict(cluster.lines))
    select_hosts(cluster, None, "a:0")
    select_hosts(cluster, "b", None)
    assert (cluster.hosts, cluster.rendezvous, dict(cluster.lines)) == before
