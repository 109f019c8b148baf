"""What the inventory's values become: defaults inherited and overridden, derived values (addr, rendezvous, world
size, lines), and job arguments and env values that reach the node as written."""

from __future__ import annotations

import pytest

from launcher.config.inventory import parse_inventory
from launcher.config.model import DEFAULT_MASTER_PORT, Cluster, Host, Job
from launcher.errors import InventoryError
from tests.support.inventory import SRC, assert_error, error, parse

# --- defaults and derived values -----------------------------------------------------------------------------


def test_built_in_defaults() -> None:
    host = parse("hosts: [gpu01]\n").hosts[0]
    assert host == Host(name="gpu01", addr="gpu01", python="python3", workdir="~", nproc_per_node=1)
    assert (host.user, host.port, host.identity_file, host.env) == (None, None, None, ())


def test_defaults_are_inherited_and_overridden_per_host() -> None:
    cluster = parse("""\
        defaults:
          user: ubuntu
          port: 2222
          identity_file: ~/.ssh/id_ed25519
          python: /opt/venv/bin/python
          workdir: ~/project
          nproc_per_node: 8
        hosts:
          - gpu01
          - name: gpu02
            user: admin
            port: 22
            identity_file: ~/.ssh/other
            python: /usr/bin/python3
            workdir: /scratch
            nproc_per_node: 4
          - name: gpu03
            port: ~
            user: ~
    """)
    one, two, three = cluster.hosts
    assert one == Host(name="gpu01", addr="gpu01", user="ubuntu", port=2222, identity_file="~/.ssh/id_ed25519",
                       python="/opt/venv/bin/python", workdir="~/project", nproc_per_node=8)
    assert two == Host(name="gpu02", addr="gpu02", user="admin", port=22, identity_file="~/.ssh/other",
                       python="/usr/bin/python3", workdir="/scratch", nproc_per_node=4)
    # null on an optional field leaves it to ssh config, whatever the defaults say
    assert (three.user, three.port, three.identity_file) == (None, None, "~/.ssh/id_ed25519")
    assert three.nproc_per_node == 8


def test_errors_in_inherited_defaults_name_the_defaults_entry() -> None:
    assert_error("defaults:\n  python: 3\nhosts: [a, b]\n", "defaults.python", "must be a non-empty string", line=2)


def test_yaml_anchors_and_merge_keys_work() -> None:
    cluster = parse("""\
        defaults: &base {nproc_per_node: 8}
        hosts:
          - &first {name: a, user: ops, port: 2222}
          - {<<: *first, name: b, nproc_per_node: 2}
          - {name: c, <<: *base}
    """)
    assert [(h.name, h.nproc_per_node, h.user, h.port) for h in cluster.hosts] == [
        ("a", 8, "ops", 2222), ("b", 2, "ops", 2222), ("c", 8, None, None)]


def test_recursive_and_exponential_aliases_are_handled() -> None:
    assert_error("hosts: [a]\nx: &x [*x]\n", "x", "unknown key 'x'", line=2)
    assert_error("hosts: &h [a, *h]\n", "hosts[1]", "must be a host name or a mapping")
    laughs = ["a: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    laughs += [f"b{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    assert_error("\n".join(laughs) + "\nhosts: [a]\n", "a", "unknown key 'a'", line=1)


def test_addr_defaults_to_name() -> None:
    a, b = parse("hosts: [gpu01, {name: gpu02, addr: 10.0.0.2}]\n").hosts
    assert (a.name, a.addr) == ("gpu01", "gpu01")
    assert (b.name, b.addr) == ("gpu02", "10.0.0.2")


def test_rendezvous_defaults_to_the_first_hosts_addr_and_29500() -> None:
    assert DEFAULT_MASTER_PORT == 29500
    rdzv = parse("hosts: [gpu01, gpu02]\n").rendezvous
    assert (rdzv.master_addr, rdzv.master_port) == ("gpu01", 29500)
    rdzv = parse("hosts: [{name: gpu01, addr: 10.0.0.1}, gpu02]\nrendezvous: {}\n").rendezvous
    assert (rdzv.master_addr, rdzv.master_port) == ("10.0.0.1", 29500)
    rdzv = parse("hosts: [gpu01, gpu02]\nrendezvous: {master_addr: 10.9.9.9, master_port: 29611}\n").rendezvous
    assert (rdzv.master_addr, rdzv.master_port) == ("10.9.9.9", 29611)
    rdzv = parse("hosts: [gpu01]\nrendezvous: {master_port: 1234}\n").rendezvous
    assert (rdzv.master_addr, rdzv.master_port) == ("gpu01", 1234)


@pytest.mark.parametrize(("hosts", "world"), [
    ("[a]", 1),
    ("[{name: a, nproc_per_node: 4}, {name: b, nproc_per_node: 2}]", 6),
    ("[{name: a, nproc_per_node: 8}, b, {name: c, nproc_per_node: 3}]", 12),
    ("[{name: a, nproc_per_node: 4}, {name: b, nproc_per_node: auto}]", None),
    ("[{name: a, nproc_per_node: auto}]", None),
])
def test_world_size(hosts: str, world: int | None) -> None:
    assert parse(f"hosts: {hosts}\n").world_size == world


def test_host_lookup_and_line_numbers() -> None:
    cluster = parse("hosts:\n  - a\n\n  - name: b\n    port: 22\n")
    assert cluster.host("b").port == 22
    with pytest.raises(KeyError):
        cluster.host("c")
    assert (cluster.lines["hosts"], cluster.lines["hosts[0]"], cluster.lines["hosts[1]"]) == (1, 2, 4)
    assert cluster.lines["hosts[1].port"] == 5


def test_source_defaults_to_a_placeholder() -> None:
    with pytest.raises(InventoryError, match=r"^<inventory>:1: hosts: is empty"):
        parse_inventory("hosts: []\n")


def test_master_addr_on_another_node_is_refused() -> None:
    text = "hosts: [a, {name: b, addr: 10.0.0.2}]\nrendezvous: {master_addr: 10.0.0.2}\n"
    with pytest.raises(InventoryError, match=r"c\.yaml:2: rendezvous\.master_addr: is '10\.0\.0\.2', a node that is "
                                             r"not the first host: .*node rank 0 \(a\); list b first"):
        parse_inventory(text, "c.yaml")
    assert parse_inventory("hosts: [a, b]\nrendezvous: {master_addr: 10.0.0.1}\n").rendezvous.master_addr == "10.0.0.1"


# --- job arguments and env values arrive as written ----------------------------------------------------------


def written(value: str) -> Cluster:
    """An inventory with `value` as a job argument and as every form of env value, in defaults and on a host."""
    return parse(f"""\
        defaults:
          env:
            D: {value}
            DV: {{value: {value}}}
        hosts:
          - name: a
            env:
              H: {value}
              HV: {{value: {value}, secret: true}}
        job:
          script: x.py
          args:
            - {value}
    """)


def written_values(cluster: Cluster) -> list[str | None]:
    assert cluster.job is not None
    return [*cluster.job.args, *(var.value for var in cluster.hosts[0].env)]


@pytest.mark.parametrize("value", [
    "010", "0123", "1:30", "1.10", "3.0", "-0", "+1", "0x10", "0b101", "1_000", "1e3", "1.5e+3", ".inf", ".NaN",
    "yes", "No", "on", "OFF", "2024-01-01", "2024-01-01 10:00:00", "plain words",
])
def test_plain_args_and_env_values_reach_the_node_as_written(value: str) -> None:
    assert written_values(written(value)) == [value] * 5  # not YAML 1.1's 8, 90, 1.1, True, date(2024, 1, 1)


@pytest.mark.parametrize(("value", "reads"), [
    ("'010'", "010"), ('"1:30"', "1:30"), ("'yes'", "yes"), ("'true'", "true"), ("''", ""),
    ("!!str 0x10", "0x10"), ("! 011", "011"),
    ("!!int 010", "8"), ("!!float 1", "1.0"),  # a tag asks YAML to read the value: it is what the user asked for
])
def test_quoted_values_stay_and_tagged_values_are_what_yaml_reads(value: str, reads: str) -> None:
    assert written_values(written(value)) == [reads] * 5


def test_values_as_written_through_anchors_aliases_and_merge_keys() -> None:
    cluster = parse("""\
        defaults:
          env: &common {A: &v 010, B: {value: 1:30}, C: 1.10}
        hosts:
          - name: a
            env: {<<: *common, C: '1.10x', D: *v}
          - name: b
            env:
              <<: [{A: 0x10}, *common]
              B: 0o7
        job: {script: x.py, args: [*v, 1e3]}
    """)
    a, b = cluster.hosts
    assert [(v.name, v.value) for v in a.env] == [("A", "010"), ("B", "1:30"), ("C", "1.10x"), ("D", "010")]
    assert [(v.name, v.value) for v in b.env] == [("A", "0x10"), ("B", "0o7"), ("C", "1.10")]
    assert cluster.job == Job("x.py", args=("010", "1e3"))


@pytest.mark.parametrize("value", ["~", "null", "NULL", ""])
def test_an_empty_arg_or_env_value_says_how_to_write_an_empty_string(value: str) -> None:
    message = "must be a string or a number, got nothing; write '' for an empty string"
    exc = error(f"hosts: [a]\njob:\n  script: x.py\n  args:\n    - ok\n    - {value}\n")
    assert str(exc) == f"{SRC}:6: job.args[1]: {message}"
    exc = error(f"hosts:\n  - name: a\n    env:\n      A: {value}\n")
    assert str(exc) == f"{SRC}:4: hosts[0].env.A: {message}"
    exc = error(f"defaults:\n  env:\n    A:\n      value: {value}\nhosts: [a]\n")
    assert str(exc) == f"{SRC}:4: defaults.env.A.value: {message}"


@pytest.mark.parametrize(("value", "shown"), [("true", "True"), ("False", "False"), ("TRUE", "True")])
def test_true_and_false_say_quote_it(value: str, shown: str) -> None:
    message = f"must be a string or a number, got {shown} (bool); quote it if you mean the word"
    exc = error(f"hosts: [a]\njob:\n  script: x.py\n  args: [--flag, {value}]\n")
    assert str(exc) == f"{SRC}:4: job.args[1]: {message}"
    exc = error(f"hosts:\n  - name: a\n    env:\n      A: {{value: {value}}}\n")
    assert str(exc) == f"{SRC}:4: hosts[0].env.A.value: {message}"
    assert written_values(written(f'"{value}"')) == [value] * 5
