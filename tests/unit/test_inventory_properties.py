"""Properties of the inventory loader: whatever the input (a mutated valid inventory, random YAML values, random or
damaged text), a valid `Cluster` that can be planned, or one `InventoryError`."""

from __future__ import annotations

import copy
import fnmatch
import functools
import operator
import re
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.config.fields import RESERVED_ENV
from launcher.config.inventory import parse_inventory
from launcher.config.model import (
    ENV_FILE_KEYS,
    ENV_KEYS,
    FORWARD_ENV_KEYS,
    HOST_KEY_POLICIES,
    HOST_KEYS,
    JOB_KEYS,
    RENDEZVOUS_KEYS,
    SYNC_KEYS,
    TOP_KEYS,
    Cluster,
    EnvFile,
    EnvVar,
    ForwardEnv,
    Host,
    Job,
    SyncSpec,
)
from launcher.errors import InventoryError
from launcher.plan.dryrun import dry_run_text
from launcher.plan.launchplan import plan_launch
from tests.support.inventory import SRC

VALID: dict[str, Any] = {
    "defaults": {"user": "ubuntu", "port": 22, "identity_file": "~/.ssh/id", "python": "/opt/venv/bin/python",
                 "workdir": "~/project", "nproc_per_node": 8,
                 "env": {"NCCL_DEBUG": "WARN", "TOKEN": {"from_env": "TOKEN", "secret": True}},
                 "setup": ["source /opt/venv/bin/activate", "module load cuda/12.4"],
                 "forward_env": ["WANDB_*", {"pattern": "HF_TOKEN", "secret": True}],
                 "env_file": {"path": ".env", "secret": True}, "socket_ifname": "auto"},
    "ssh_config": "~/.ssh/config",
    "host_key_policy": "strict",
    "hosts": ["gpu01", {"name": "gpu02", "addr": "10.0.0.2", "nproc_per_node": 4,
                        "env": {"A": {"value": "x", "secret": False}}, "setup": "ulimit -n 65536",
                        "forward_env": ["AWS_*"], "env_file": "gpu02.env", "socket_ifname": "eth0"}],
    "sync": {"src": ".", "dest": "~/project", "exclude": [".git", "*.pt"]},
    "rendezvous": {"master_addr": "gpu01", "master_port": 29500},
    "job": {"script": "train/ddp.py", "args": ["--epochs", 3]},
}
ALL_KEYS = sorted({*TOP_KEYS, *HOST_KEYS, *RENDEZVOUS_KEYS, *JOB_KEYS, *ENV_KEYS, *FORWARD_ENV_KEYS, *ENV_FILE_KEYS,
                   *SYNC_KEYS, "name", "addr", "nproc_per_nod"})
_HOST_NAME_OK = re.compile(r"[^-\s][^\s]*\Z")
_ENV_NAME_OK = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

def locations(data: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every value in `data` (the root is `()`)."""
    children = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    return [path, *(p for key, child in children for p in locations(child, (*path, key)))]


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(),
    st.text(max_size=12), st.sampled_from(["auto", "strict", "accept-new", "gpu01", "-x", "a b", "1X", "22", "~"]),
    st.sampled_from(ALL_KEYS),
)
keys = st.one_of(st.sampled_from(ALL_KEYS), st.sampled_from(ALL_KEYS), st.text(max_size=8), st.integers(-3, 3),
                 st.booleans(), st.none())
# Pieces of the valid inventory, so that mutations also build valid ones in new shapes.
fragments = st.sampled_from([value for path in locations(VALID) if path
                             for value in [functools.reduce(operator.getitem, path, VALID)]]).map(copy.deepcopy)
values = st.one_of(fragments, st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)), max_leaves=8))


def check_cluster(cluster: Cluster) -> None:
    """What every caller may rely on: the types the dataclasses promise, and the rules the loader enforces."""
    assert isinstance(cluster, Cluster)
    assert cluster.hosts and all(isinstance(h, Host) for h in cluster.hosts)
    assert len({h.name for h in cluster.hosts}) == len(cluster.hosts)
    for host in cluster.hosts:
        for name in (host.name, host.addr):
            assert isinstance(name, str) and _HOST_NAME_OK.match(name), name
        for text in (host.python, host.workdir):
            assert isinstance(text, str) and text.strip() and "\n" not in text and "\0" not in text
        for text in (host.user, host.identity_file):
            assert text is None or (isinstance(text, str) and text.strip())
        assert host.nproc_per_node == "auto" or (type(host.nproc_per_node) is int and host.nproc_per_node >= 1)
        assert host.port is None or (type(host.port) is int and 1 <= host.port <= 65535)
        assert len({v.name for v in host.env}) == len(host.env)
        for var in host.env:
            assert isinstance(var, EnvVar) and _ENV_NAME_OK.match(var.name)
            assert (var.value is None) != (var.from_env is None)
            assert var.value is None or (isinstance(var.value, str) and "\0" not in var.value)
            assert var.from_env is None or _ENV_NAME_OK.match(var.from_env)
            assert isinstance(var.secret, bool)
            assert not any(fnmatch.fnmatchcase(var.name, reserved) for reserved in RESERVED_ENV), var.name
        for line in host.setup:
            assert isinstance(line, str) and line.strip() and "\n" not in line and "\0" not in line
        assert len({f.pattern for f in host.forward_env}) == len(host.forward_env)
        for item in host.forward_env:
            assert isinstance(item, ForwardEnv) and re.fullmatch(r"[A-Za-z0-9_?*]+", item.pattern), item
            assert re.search(r"[A-Za-z0-9_]", item.pattern) and isinstance(item.secret, bool)
            assert not any(fnmatch.fnmatchcase(name, item.pattern) for name in RESERVED_ENV if "*" not in name)
        if host.env_file is not None:
            assert isinstance(host.env_file, EnvFile) and isinstance(host.env_file.secret, bool)
            assert host.env_file.path.strip() and "\n" not in host.env_file.path and "\0" not in host.env_file.path
        assert host.socket_ifname is None or re.fullmatch(r"[A-Za-z0-9_.:-]{1,15}", host.socket_ifname)
        if host.socket_ifname is not None:
            assert not {v.name for v in host.env} & {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}
    rdzv = cluster.rendezvous
    assert isinstance(rdzv.master_addr, str) and _HOST_NAME_OK.match(rdzv.master_addr)
    assert type(rdzv.master_port) is int and 1 <= rdzv.master_port <= 65535
    if cluster.job is not None:
        forms = [f for f in (cluster.job.script, cluster.job.module, cluster.job.command) if f is not None]
        assert len(forms) == 1 and isinstance(forms[0], str) and forms[0].strip()  # exactly one form of job
        assert isinstance(cluster.job.args, tuple) and all(isinstance(a, str) for a in cluster.job.args)
    assert cluster.host_key_policy in HOST_KEY_POLICIES
    assert cluster.ssh_config is None or isinstance(cluster.ssh_config, str)
    if cluster.sync is not None:
        assert isinstance(cluster.sync, SyncSpec) and isinstance(cluster.sync.src, str) and cluster.sync.src.strip()
        assert cluster.sync.dest is None or (isinstance(cluster.sync.dest, str) and cluster.sync.dest.strip())
        assert isinstance(cluster.sync.exclude, tuple) and all(isinstance(p, str) and p.strip()
                                                               for p in cluster.sync.exclude)
    assert isinstance(cluster.rendezvous.master_addr_explicit, bool)
    assert cluster.world_size is None or cluster.world_size >= len(cluster.hosts)
    plan = plan_launch(cluster, cluster.job or Job("train.py"), run_id="r")  # a valid cluster can be planned
    dry_run_text(plan)


def outcome(text: str) -> Cluster | InventoryError:
    try:
        cluster = parse_inventory(text, SRC)
    except InventoryError as exc:
        assert str(exc).startswith(SRC)
        return exc
    check_cluster(cluster)
    return cluster


def mutate(data: dict[str, Any], draw: st.DrawFn) -> dict[str, Any]:
    """One random edit somewhere in `data`: delete, replace, rename, add next to, wrap in a list, or duplicate."""
    path = draw(st.sampled_from(locations(data)))
    parent: Any = data
    for key in path[:-1]:
        parent = parent[key]
    if not path:  # the root: add a top-level key
        data[draw(keys)] = draw(values)
        return data
    key = path[-1]
    action = draw(st.sampled_from(["delete", "replace", "replace", "rename", "add", "wrap", "duplicate"]))
    if action == "delete":
        del parent[key]
    elif action == "replace":
        parent[key] = draw(values)
    elif action == "wrap":
        parent[key] = [parent[key]]
    elif isinstance(parent, dict):
        if action == "rename":
            parent[draw(keys)] = parent.pop(key)
        elif action == "add":
            parent[draw(keys)] = draw(values)
        else:
            parent[draw(keys)] = copy.deepcopy(parent[key])
    elif action == "duplicate":
        parent.append(parent[key])  # the same object twice: YAML writes an anchor and an alias
    else:
        parent.insert(key, draw(values))
    return data


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=None)


def test_the_valid_base_inventory_is_valid() -> None:
    assert isinstance(outcome(dump(VALID)), Cluster)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_inventories_give_a_cluster_or_an_inventory_error(data: st.DataObject) -> None:
    inventory = copy.deepcopy(VALID)
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        inventory = mutate(inventory, data.draw)
    outcome(dump(inventory))


@settings(max_examples=150, deadline=None)
@given(values)
def test_random_yaml_values_give_a_cluster_or_an_inventory_error(value: Any) -> None:
    outcome(dump(value))
    outcome(dump({"hosts": value}))
    outcome(dump({"hosts": ["a"], "job": value}))


@settings(max_examples=200, deadline=None)
@given(st.one_of(
    st.text(max_size=80),
    st.lists(st.sampled_from(["hosts", ":", " ", "\n", "  ", "- ", "[", "]", "{", "}", ",", "a", "name", "port",
                              "22", "&x", "*x", "<<", "!!int", "!!timestamp", "!!binary", "?", "'", '"', "#",
                              "---", "|", ">", "~", "2024-13-01", "\t", "%YAML 1.1", "env", "X"]),
             max_size=30).map("".join),
))
def test_random_text_gives_a_cluster_or_an_inventory_error(text: str) -> None:
    outcome(text)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_damaged_valid_text_gives_a_cluster_or_an_inventory_error(data: st.DataObject) -> None:
    text = dump(VALID)
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        i = data.draw(st.integers(0, len(text)), label="at")
        j = data.draw(st.integers(i, min(len(text), i + 12)), label="to")
        text = text[:i] + data.draw(st.text(max_size=6), label="insert") + text[j:]
    outcome(text)
