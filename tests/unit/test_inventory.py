"""The inventory loader: every problem is one `InventoryError` naming file, line, entry and field; the rest is typed."""

from __future__ import annotations

import copy
import fnmatch
import functools
import operator
import re
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.config.fields import RESERVED_ENV
from launcher.config.inventory import cluster_from_data, load_inventory, parse_inventory
from launcher.config.model import (
    DEFAULT_MASTER_PORT,
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
from launcher.errors import InventoryError, LauncherError
from launcher.plan.launchplan import plan_launch

REPO = Path(__file__).resolve().parents[2]
SRC = "hosts/cluster.yaml"
BAD_FLAG = "must be true or false, got a value of type {} (not shown: the entry is secret)"
"""A malformed `secret:` is not quoted: it may be the token itself."""


def parse(text: str) -> Cluster:
    return parse_inventory(textwrap.dedent(text), SRC)


def error(text: str) -> InventoryError:
    """The one InventoryError that parsing `text` raises."""
    with pytest.raises(InventoryError) as info:
        parse(text)
    exc = info.value
    assert str(exc).startswith(SRC), str(exc)
    assert "\n" not in str(exc), "one error, one line"
    return exc


def assert_error(text: str, entry: str | None, reason: str | re.Pattern[str], line: int | None = None) -> None:
    exc = error(text)
    assert exc.entry == entry, str(exc)
    if isinstance(reason, re.Pattern):
        assert reason.search(exc.reason), str(exc)
    else:
        assert reason in exc.reason, str(exc)
    if line is not None:
        assert exc.line == line, str(exc)
        assert str(exc).startswith(f"{SRC}:{line}: "), str(exc)


# --- the file ------------------------------------------------------------------------------------------------


def test_missing_file_names_it_and_points_to_the_example(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(info.value) == (f"{path}: no such file: `inv init --hosts NODE1,NODE2` writes one from what your nodes "
                               "say over SSH, `inv init --example` the reference (every key, what it does, its "
                               "default)")
    assert isinstance(info.value, LauncherError)


def test_unreadable_file_is_an_inventory_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read it"):
        load_inventory(tmp_path)  # a directory
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"hosts: [caf\xe9]\n")
    with pytest.raises(InventoryError, match=r"latin1\.yaml: cannot read it"):
        load_inventory(bad)


def test_load_inventory_names_the_file_in_errors_and_the_cluster(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("hosts:\n  - a\n  - name: b\n    port: '22'\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(info.value) == f"{path}:4: hosts[1].port: must be a port number from 1 to 65535, got '22' (str)"
    path.write_text("hosts: [a]\n")
    assert load_inventory(path).source == str(path)


@pytest.mark.parametrize(("text", "line", "began"), [
    ("hosts: [a, b\n", 2, "while parsing a flow sequence on line 1"),
    ("hosts:\n  - a\n - b\n", 3, "on line 1"),
    ("hosts:\n  - a\n\tport: 1\n", 3, ""),
    ("hosts: [a]\njob: {script: x, args: [\"unterminated]}\n", 3, "while scanning a quoted scalar on line 2"),
    ("hosts: [a]\n---\nhosts: [b]\n", 2, "single document"),
    ("hosts: *nowhere\n", 1, "undefined alias"),
    ("hosts: a: b\n", 1, "mapping values are not allowed here"),
])
def test_bad_yaml_syntax_names_the_line(text: str, line: int, began: str) -> None:
    exc = error(text)
    assert exc.reason.startswith("not valid YAML: "), str(exc)
    assert exc.line == line, str(exc)
    assert began in exc.reason, str(exc)
    assert exc.entry is None


@pytest.mark.parametrize(("text", "line"), [
    ("hosts: [a]\njob: {script: x, args: [2024-13-01]}\n", 2),  # a timestamp that is no date
    ("hosts: [a]\nssh_config: !!int abc\n", 2),
    ("hosts: [a]\nssh_config: !!float abc\n", 2),
    ("hosts: [a]\n\nssh_config: !!timestamp abc\n", 3),
    ("hosts: [a]\nssh_config: !!int\n", 2),
])
def test_scalars_that_yaml_cannot_build_are_inventory_errors(text: str, line: int) -> None:
    exc = error(text)
    assert exc.reason.startswith("not valid YAML: cannot read"), str(exc)
    assert exc.line == line


@pytest.mark.parametrize(("text", "line"), [("hosts: [a]\njob: {script: \"x\x1fy\"}\n", 2), ("\x00", 1)])
def test_characters_yaml_does_not_allow(text: str, line: int) -> None:
    exc = error(text)
    assert exc.reason.startswith("not valid YAML: character"), str(exc)
    assert exc.line == line


def test_deep_nesting_is_an_inventory_error() -> None:
    depth = sys.getrecursionlimit() // 2  # PyYAML composes a level in two calls: this is always too deep
    exc = error("hosts: " + "[" * depth + "]" * depth + "\n")
    assert exc.reason == "not valid YAML: nested too deeply"


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n", "~\n"])
def test_empty_file(text: str) -> None:
    assert_error(text, None, "the file is empty; it needs at least a `hosts:` list")


@pytest.mark.parametrize("text", ["- a\n- b\n", "gpu01\n", "42\n", "[hosts]\n"])
def test_top_level_must_be_a_mapping(text: str) -> None:
    assert_error(text, None, "must be a mapping, got", line=1)


# --- hosts ---------------------------------------------------------------------------------------------------


def test_missing_hosts() -> None:
    exc = error("""\
        defaults: {user: a}
        job: {script: x}
    """)
    assert str(exc) == f"{SRC}:1: hosts: is missing: list at least one host"


@pytest.mark.parametrize("text", ["hosts:\n", "hosts: ~\n"])
def test_null_hosts_counts_as_missing(text: str) -> None:
    assert_error(text, "hosts", "is missing")


def test_empty_hosts() -> None:
    assert_error("defaults: {}\nhosts: []\n", "hosts", "is empty: list at least one host", line=2)


@pytest.mark.parametrize("value", ["gpu01", "{gpu01: 1}", "3", "true"])
def test_hosts_must_be_a_list(value: str) -> None:
    assert_error(f"hosts: {value}\n", "hosts", "must be a list of host names or mappings, got", line=1)


@pytest.mark.parametrize(("value", "shown"), [
    ("1", "1 (int)"), ("[a]", "['a'] (list)"), ("~", "nothing"), ("true", "True (bool)"), ("1.5", "1.5 (float)"),
])
def test_host_entry_of_wrong_type(value: str, shown: str) -> None:
    exc = error(f"hosts:\n  - a\n  - {value}\n")
    assert str(exc) == f"{SRC}:3: hosts[1]: must be a host name or a mapping with `name:`, got {shown}"


def test_host_mapping_without_name() -> None:
    assert_error("hosts:\n  - a\n  - addr: 10.0.0.2\n    port: 22\n", "hosts[1]", "has no `name:`", line=3)


def test_duplicate_host_names() -> None:
    exc = error("""\
        hosts:
          - a
          - b
          - name: a
            addr: 10.0.0.9
    """)
    assert str(exc) == f"{SRC}:4: hosts[2]: host 'a' is listed twice (also hosts[0])"


@pytest.mark.parametrize(("text", "entry", "line"), [
    ("hosts: [a]\nhosts: [b]\n", "hosts", 2),
    ("hosts:\n  - name: a\n    port: 22\n    port: 23\n", "hosts[0].port", 4),
    ("defaults:\n  env:\n    A: 1\n    A: 2\nhosts: [a]\n", "defaults.env.A", 4),
    ("hosts: [a]\nrendezvous: {master_port: 1, master_port: 2}\n", "rendezvous.master_port", 2),
    ("hosts: [a]\njob:\n  script: x\n  script: y\n", "job.script", 4),
])
def test_duplicate_keys_in_a_mapping(text: str, entry: str, line: int) -> None:
    assert_error(text, entry, "appears twice in the same mapping", line=line)


# --- unknown keys --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "entry", "guess", "line"), [
    ("hots: [a]\n", "hots", "hosts", 1),
    ("hosts: [a]\ndefault: {}\n", "default", "defaults", 2),
    ("hosts: [a]\nhost_key_polcy: strict\n", "host_key_polcy", "host_key_policy", 2),
    ("defaults:\n  nproc_per_nod: 8\nhosts: [a]\n", "defaults.nproc_per_nod", "nproc_per_node", 2),
    ("hosts:\n  - a\n  - name: b\n    nproc_per_nod: 8\n", "hosts[1].nproc_per_nod", "nproc_per_node", 4),
    ("hosts:\n  - name: b\n    adr: 10.0.0.1\n", "hosts[0].adr", "addr", 3),
    ("hosts: [a]\nrendezvous:\n  master_prot: 1\n", "rendezvous.master_prot", "master_port", 3),
    ("hosts: [a]\njob:\n  script: x\n  arg: []\n", "job.arg", "args", 4),
    ("hosts: [a]\ndefaults:\n  env:\n    A: {valeu: x}\n", "defaults.env.A.valeu", "value", 4),
    ("hosts:\n  - name: a\n    env: {A: {from_evn: X}}\n", "hosts[0].env.A.from_evn", "from_env", 3),
    # other tools' words for ours, where ours is allowed there
    ("nodes: [a]\n", "nodes", "hosts", 1),
    ("hosts:\n  - host: 10.0.0.1\n", "hosts[0].host", "name", 2),
    ("hosts:\n  - name: a\n    slots: 8\n", "hosts[0].slots", "nproc_per_node", 3),
    ("defaults: {gpus: 8}\nhosts: [a]\n", "defaults.gpus", "nproc_per_node", 1),
    ("defaults: {key_filename: ~/.ssh/k}\nhosts: [a]\n", "defaults.key_filename", "identity_file", 1),
])
def test_unknown_key_near_miss_suggests_the_key(text: str, entry: str, guess: str, line: int) -> None:
    key = entry.rsplit(".", 1)[-1]
    exc = error(text)
    assert str(exc) == f"{SRC}:{line}: {entry}: unknown key {key!r}; did you mean {guess!r}?"


@pytest.mark.parametrize(("text", "entry", "known"), [
    ("zzz: 1\nhosts: [a]\n", "zzz", TOP_KEYS),
    ("defaults: {zzz: 1}\nhosts: [a]\n", "defaults.zzz", HOST_KEYS),
    ("hosts: [{name: a, zzz: 1}]\n", "hosts[0].zzz", ("name", "addr", *HOST_KEYS)),
    ("rendezvous: {zzz: 1}\nhosts: [a]\n", "rendezvous.zzz", RENDEZVOUS_KEYS),
    ("job: {script: x, zzz: 1}\nhosts: [a]\n", "job.zzz", JOB_KEYS),
    ("hosts: [{name: a, env: {A: {value: x, zzz: 1}}}]\n", "hosts[0].env.A.zzz", ENV_KEYS),
])
def test_unknown_key_lists_the_known_keys(text: str, entry: str, known: tuple[str, ...]) -> None:
    assert_error(text, entry, f"unknown key 'zzz'; known keys: {', '.join(known)}", line=1)


@pytest.mark.parametrize("key", ["true", "1", "~", "2024-01-01", "!!binary Ww=="])
def test_non_string_keys_are_unknown_keys(key: str) -> None:
    exc = error(f"hosts: [a]\n{key}: 1\n")
    assert "unknown key" in exc.reason
    exc = error(f"hosts:\n  - name: a\n    env:\n      {key}: 1\n")
    assert "is not a valid environment variable name" in exc.reason
    assert exc.line is not None


def test_name_and_addr_are_not_defaults() -> None:
    assert_error("defaults: {addr: 10.0.0.1}\nhosts: [a]\n", "defaults.addr", "unknown key 'addr'")


# --- field types ---------------------------------------------------------------------------------------------


def test_the_example_message_from_the_style_guide() -> None:
    text = "# a cluster\n" * 7 + textwrap.dedent("""\
        hosts:
          - gpu01
          - name: gpu02
            nproc_per_node: 4
          - name: gpu03
            addr: 10.0.0.3
            nproc_per_node: eight
    """)
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, SRC)
    assert str(info.value) == (
        "hosts/cluster.yaml:14: hosts[2].nproc_per_node: must be a positive integer or \"auto\", got 'eight' (str)"
    )
    assert (info.value.path, info.value.line, info.value.entry) == (SRC, 14, "hosts[2].nproc_per_node")


@pytest.mark.parametrize(("value", "shown"), [
    ('"22"', "'22' (str)"), ("0", "0 (int)"), ("-1", "-1 (int)"), ("70000", "70000 (int)"), ("65536", "65536 (int)"),
    ("true", "True (bool)"), ("false", "False (bool)"), ("22.0", "22.0 (float)"), ("[22]", "[22] (list)"),
])
def test_bad_ports(value: str, shown: str) -> None:
    message = f"must be a port number from 1 to 65535, got {shown}"
    assert_error(f"hosts:\n  - name: a\n    port: {value}\n", "hosts[0].port", message, line=3)
    assert_error(f"defaults:\n  port: {value}\nhosts: [a]\n", "defaults.port", message, line=2)
    assert_error(f"hosts: [a]\nrendezvous:\n  master_port: {value}\n", "rendezvous.master_port", message, line=3)


@pytest.mark.parametrize("port", [1, 22, 2222, 65535])
def test_good_ports(port: int) -> None:
    cluster = parse(f"hosts: [{{name: a, port: {port}}}]\nrendezvous: {{master_port: {port}}}\n")
    assert cluster.hosts[0].port == port
    assert cluster.rendezvous.master_port == port


@pytest.mark.parametrize(("value", "shown"), [
    ("0", "0 (int)"), ("-1", "-1 (int)"), ("eight", "'eight' (str)"), ("true", "True (bool)"),
    ("1.5", "1.5 (float)"), ("Auto", "'Auto' (str)"), ('"8"', "'8' (str)"), ("~", "nothing"),
])
def test_bad_nproc_per_node(value: str, shown: str) -> None:
    message = f'must be a positive integer or "auto", got {shown}'
    assert_error(f"hosts:\n  - name: a\n    nproc_per_node: {value}\n", "hosts[0].nproc_per_node", message, line=3)
    assert_error(f"defaults:\n  nproc_per_node: {value}\nhosts: [a]\n", "defaults.nproc_per_node", message, line=2)


def test_nproc_per_node_has_an_upper_bound() -> None:
    message = "must be at most 1024 (worker processes on one node), got 1000000000 (int)"
    assert_error("hosts:\n  - name: a\n    nproc_per_node: 1000000000\n", "hosts[0].nproc_per_node", message, line=3)
    assert parse("hosts: [{name: a, nproc_per_node: 1024}]\n").hosts[0].nproc_per_node == 1024


def test_nproc_per_node_auto_and_integers() -> None:
    cluster = parse("defaults: {nproc_per_node: auto}\nhosts: [a, {name: b, nproc_per_node: 3}]\n")
    assert [h.nproc_per_node for h in cluster.hosts] == ["auto", 3]


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("user", "1", "1 (int)"), ("user", '""', "'' (str)"), ("user", '"  "', "'  ' (str)"),
    ("python", "[python3]", "['python3'] (list)"), ("python", "~", "nothing"), ("python", "true", "True (bool)"),
    ("workdir", "{a: 1}", "{'a': 1} (dict)"), ("workdir", "''", "'' (str)"),
    ("identity_file", "3", "3 (int)"),
])
def test_text_fields_must_be_non_empty_strings(field: str, value: str, shown: str) -> None:
    message = f"must be a non-empty string, got {shown}"
    assert_error(f"hosts:\n  - name: a\n    {field}: {value}\n", f"hosts[0].{field}", message, line=3)
    assert_error(f"defaults:\n  {field}: {value}\nhosts: [a]\n", f"defaults.{field}", message, line=2)


def test_a_bare_tilde_workdir_is_null_and_the_error_says_so() -> None:
    message = 'must be a directory, got nothing (a bare ~ is null in YAML: write "~")'
    assert_error("hosts:\n  - name: a\n    workdir: ~\n", "hosts[0].workdir", message, line=3)
    assert_error("defaults:\n  workdir:\nhosts: [a]\n", "defaults.workdir", message, line=2)
    assert parse('hosts: [{name: a, workdir: "~"}]\n').hosts[0].workdir == "~"


@pytest.mark.parametrize("field", ["python", "workdir", "user", "identity_file"])
def test_text_fields_refuse_newlines(field: str) -> None:
    assert_error(f'hosts: [{{name: a, {field}: "x\\ny"}}]\n', f"hosts[0].{field}", "newline")


def test_ssh_config_must_be_a_string() -> None:
    assert_error("hosts: [a]\nssh_config: 5\n", "ssh_config", "must be a non-empty string, got 5 (int)", line=2)
    assert parse("hosts: [a]\nssh_config: ~/.ssh/cfg\n").ssh_config == "~/.ssh/cfg"
    assert parse("hosts: [a]\n").ssh_config is None


@pytest.mark.parametrize("policy", HOST_KEY_POLICIES)
def test_host_key_policy_choices(policy: str) -> None:
    assert parse(f"hosts: [a]\nhost_key_policy: {policy}\n").host_key_policy == policy


@pytest.mark.parametrize(("value", "shown"), [
    ("no", "False (bool)"), ("yes", "True (bool)"),  # YAML 1.1 reads yes/no as booleans
    ("accept_new", "'accept_new' (str)"), ("false", "False (bool)"), ("~", "nothing"), ("auto-add", "'auto-add' (str)"),
    ("Strict", "'Strict' (str)"),
])
def test_host_key_policy_must_be_strict_or_accept_new(value: str, shown: str) -> None:
    assert_error(f"hosts: [a]\nhost_key_policy: {value}\n", "host_key_policy",
                 f"must be one of strict, accept-new, got {shown}", line=2)


def test_host_key_policy_defaults_to_strict() -> None:
    assert parse("hosts: [a]\n").host_key_policy == "strict"


@pytest.mark.parametrize("section", ["defaults", "rendezvous", "job", "hosts[0].env", "defaults.env"])
def test_sections_must_be_mappings(section: str) -> None:
    texts = {
        "defaults": "defaults: [a]\nhosts: [a]\n",
        "rendezvous": "hosts: [a]\nrendezvous: [a]\n",
        "job": "hosts: [a]\njob: train.py\n",
        "hosts[0].env": "hosts: [{name: a, env: [A=1]}]\n",
        "defaults.env": "defaults: {env: A=1}\nhosts: [a]\n",
    }
    assert_error(texts[section], section, "must be a mapping")


# --- host names ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [
    "-oProxyCommand=touch /tmp/x", "-p", "gpu 01", "gpu01 -v", "a;b", "$(id)", "a/b", "gpü", "'gpu01'",
])
def test_host_names_that_ssh_would_misread_are_refused(name: str) -> None:
    quoted = yaml.safe_dump(name, default_style='"').strip().removesuffix("...").strip()
    message = "must be a host name, ssh alias or IP address"
    assert_error(f"hosts:\n  - {quoted}\n", "hosts[0].name", message, line=2)
    assert_error(f"hosts:\n  - name: {quoted}\n", "hosts[0].name", message, line=2)
    assert_error(f"hosts:\n  - name: a\n    addr: {quoted}\n", "hosts[0].addr", message, line=3)
    assert_error(f"hosts: [a]\nrendezvous:\n  master_addr: {quoted}\n", "rendezvous.master_addr", message, line=3)


@pytest.mark.parametrize("name", ["gpu01", "gpu-01.cluster.local", "10.0.0.1", "fe80::1%eth0", "::1", "[::1]", "n_1"])
def test_host_names_aliases_and_addresses_are_accepted(name: str) -> None:
    cluster = parse(f'hosts:\n  - "{name}"\n  - name: b\n    addr: "{name}"\n')
    assert cluster.hosts[0].name == name
    assert cluster.hosts[1].addr == name


@pytest.mark.parametrize("value", ["1", "[a]", "true"])
def test_host_name_must_be_a_string(value: str) -> None:
    assert_error(f"hosts: [{{name: {value}}}]\n", "hosts[0].name", "must be a host name")


# --- env -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["1X", "A-B", "A B", "A.B", "A=B", "", "É"])
def test_env_names_must_be_shell_names(name: str) -> None:
    message = f"{name!r} is not a valid environment variable name"
    assert_error(f'hosts:\n  - name: a\n    env:\n      "{name}": x\n', f"hosts[0].env.{name}", message, line=4)
    assert_error(f'defaults:\n  env:\n    "{name}": x\nhosts: [a]\n', f"defaults.env.{name}", message, line=3)


@pytest.mark.parametrize("name", ["A", "_", "_A1", "nccl_debug", "X9"])
def test_env_names_that_are_fine(name: str) -> None:
    assert parse(f"hosts: [{{name: a, env: {{{name}: x}}}}]\n").hosts[0].env == (EnvVar(name, value="x"),)


def test_env_values_numbers_become_strings() -> None:
    env = parse("hosts: [{name: a, env: {A: 1, B: 0.5, C: '', D: 'x y'}}]\n").hosts[0].env
    assert [(v.name, v.value) for v in env] == [("A", "1"), ("B", "0.5"), ("C", ""), ("D", "x y")]


@pytest.mark.parametrize(("value", "shown"), [
    ("true", "True (bool)"), ("[1]", "[1] (list)"), ("~", "nothing"),
])
def test_env_plain_values_of_wrong_type(value: str, shown: str) -> None:
    assert_error(f"hosts: [{{name: a, env: {{A: {value}}}}}]\n", "hosts[0].env.A",
                 f"must be a string or a number, got {shown}")


def test_env_mapping_form() -> None:
    env = parse("""\
        hosts:
          - name: a
            env:
              LIT: {value: x}
              NUM: {value: 3}
              COPY: {from_env: HOME}
              TOKEN: {from_env: MY_TOKEN, secret: true}
              PASSWORD: {value: hunter2, secret: true}
              OPEN: {value: y, secret: false}
    """).hosts[0].env
    assert env == (
        EnvVar("LIT", value="x"),
        EnvVar("NUM", value="3"),
        EnvVar("COPY", from_env="HOME"),
        EnvVar("TOKEN", from_env="MY_TOKEN", secret=True),
        EnvVar("PASSWORD", value="hunter2", secret=True),
        EnvVar("OPEN", value="y"),
    )


@pytest.mark.parametrize(("spec", "entry", "reason"), [
    ("{value: x, from_env: Y}", "hosts[0].env.A", "needs exactly one of `value:` or `from_env:`"),
    ("{secret: true}", "hosts[0].env.A", "needs exactly one of `value:` or `from_env:`"),
    ("{}", "hosts[0].env.A", "needs exactly one of `value:` or `from_env:`"),
    ("{value: x, secret: 'yes'}", "hosts[0].env.A.secret", BAD_FLAG.format("str")),
    ("{value: x, secret: 1}", "hosts[0].env.A.secret", BAD_FLAG.format("int")),
    ("{value: x, secret: ~}", "hosts[0].env.A.secret", "must be true or false, got nothing"),
    ("{from_env: 1X}", "hosts[0].env.A.from_env", "must be an environment variable name, got '1X' (str)"),
    ("{from_env: ~}", "hosts[0].env.A.from_env", "must be an environment variable name, got nothing"),
    ("{from_env: [X]}", "hosts[0].env.A.from_env", "must be an environment variable name, got ['X'] (list)"),
    ("{value: ~}", "hosts[0].env.A.value", "must be a string or a number, got nothing"),
    ("{value: [x]}", "hosts[0].env.A.value", "must be a string or a number, got ['x'] (list)"),
    ("{value: false}", "hosts[0].env.A.value", "must be a string or a number, got False (bool)"),
])
def test_env_mapping_form_errors(spec: str, entry: str, reason: str) -> None:
    assert_error(f"hosts:\n  - name: a\n    env:\n      A: {spec}\n", entry, reason, line=4)


def test_env_values_refuse_nul_but_keep_newlines() -> None:
    assert_error('hosts: [{name: a, env: {A: "x\\0y"}}]\n', "hosts[0].env.A", "NUL")
    assert parse('hosts: [{name: a, env: {A: "x\\ny"}}]\n').hosts[0].env[0].value == "x\ny"


def test_env_merge_defaults_then_host_and_host_wins() -> None:
    cluster = parse("""\
        defaults:
          env: {NCCL_DEBUG: WARN, OMP_NUM_THREADS: 4, TOKEN: {from_env: TOKEN, secret: true}}
        hosts:
          - a
          - name: b
            env: {NCCL_DEBUG: INFO, EXTRA: x}
          - name: c
            env: {TOKEN: plain}
    """)
    a, b, c = cluster.hosts
    token = EnvVar("TOKEN", from_env="TOKEN", secret=True)
    assert a.env == (EnvVar("NCCL_DEBUG", value="WARN"), EnvVar("OMP_NUM_THREADS", value="4"), token)
    assert b.env == (EnvVar("NCCL_DEBUG", value="INFO"), EnvVar("OMP_NUM_THREADS", value="4"), token,
                     EnvVar("EXTRA", value="x"))
    assert c.env == (EnvVar("NCCL_DEBUG", value="WARN"), EnvVar("OMP_NUM_THREADS", value="4"),
                     EnvVar("TOKEN", value="plain", secret=True))  # a secret default's override stays secret


# --- job -----------------------------------------------------------------------------------------------------


def test_job_script_and_args() -> None:
    job = parse("hosts: [a]\njob:\n  script: train/ddp.py\n  args: [--epochs, 3, --lr, 0.5, '', 'a b', -1]\n").job
    assert job == Job(script="train/ddp.py", args=("--epochs", "3", "--lr", "0.5", "", "a b", "-1"))


@pytest.mark.parametrize("text", ["hosts: [a]\n", "hosts: [a]\njob:\n", "hosts: [a]\njob: ~\n"])
def test_no_job(text: str) -> None:
    assert parse(text).job is None


@pytest.mark.parametrize("args", ["", "[]", "~"])
def test_job_without_args(args: str) -> None:
    assert parse(f"hosts: [a]\njob:\n  script: x.py\n  args: {args}\n").job == Job("x.py")


@pytest.mark.parametrize(("value", "shown"), [
    ("--epochs 3", "'--epochs 3' (str)"), ("{epochs: 3}", "{'epochs': 3} (dict)"), ("3", "3 (int)"),
    ("''", "'' (str)"), ("false", "False (bool)"), ("{}", "{} (dict)"),
])
def test_job_args_must_be_a_list(value: str, shown: str) -> None:
    assert_error(f"hosts: [a]\njob:\n  script: x.py\n  args: {value}\n", "job.args",
                 f"must be a list of words, got {shown}", line=4)


@pytest.mark.parametrize(("value", "shown"), [
    ("true", "True (bool)"), ("[a]", "['a'] (list)"), ("{a: 1}", "{'a': 1} (dict)"), ("~", "nothing"),
])
def test_job_args_elements_must_be_words(value: str, shown: str) -> None:
    assert_error(f"hosts: [a]\njob:\n  script: x.py\n  args:\n    - ok\n    - {value}\n", "job.args[1]",
                 f"must be a string or a number, got {shown}", line=6)


@pytest.mark.parametrize(("job", "entry", "reason"), [
    ("{args: [a]}", "job", "has no `script:`"),
    ("{}", "job", "has no `script:`"),
    ("{script: ~}", "job", "has no `script:`"),
    ("{script: ''}", "job.script", "must be a non-empty string, got '' (str)"),
    ("{script: 3}", "job.script", "must be a non-empty string, got 3 (int)"),
])
def test_job_needs_a_script(job: str, entry: str, reason: str) -> None:
    assert_error(f"hosts: [a]\njob: {job}\n", entry, reason, line=2)


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


# --- what errors quote ---------------------------------------------------------------------------------------


BOMB = "[&a [x,x,x,x,x,x,x,x,x,x]," + ",".join(f"&{b} [{','.join([f'*{a}'] * 10)}]"
                                               for a, b in zip("abcdefgh", "bcdefghi", strict=True)) + "]"
"""A "billion laughs": 10**9 x's in 400 bytes of aliases, whose repr would be gigabytes."""


@pytest.mark.parametrize(("text", "entry", "line"), [
    ("hosts: [a]\njob:\n  script: x.py\n  args: [{bomb}]\n", "job.args[0]", 4),
    ("hosts: [a]\njob:\n  script: {bomb}\n", "job.script", 3),
    ("hosts:\n  - {bomb}\n", "hosts[0]", 2),
    ("hosts:\n  - name: {bomb}\n", "hosts[0].name", 2),
    ("defaults:\n  python: {bomb}\nhosts: [a]\n", "defaults.python", 2),
    ("hosts:\n  - name: a\n    env:\n      A: {bomb}\n", "hosts[0].env.A", 4),
    ("hosts:\n  - name: a\n    env:\n      A:\n        value: {bomb}\n", "hosts[0].env.A.value", 5),
    ("hosts: [a]\nrendezvous:\n  master_port: {bomb}\n", "rendezvous.master_port", 3),
    ("hosts: [a]\nhost_key_policy: {bomb}\n", "host_key_policy", 2),
    ("hosts: [a]\nssh_config: {bomb}\n", "ssh_config", 2),
])
def test_an_alias_bomb_in_an_error_is_short_and_fast(text: str, entry: str, line: int) -> None:
    start = time.perf_counter()
    exc = error(text.format(bomb=BOMB))
    assert time.perf_counter() - start < 0.5
    assert len(str(exc)) < 500, len(str(exc))
    assert str(exc).startswith(f"{SRC}:{line}: {entry}: "), str(exc)
    assert str(exc).endswith("… (list)"), str(exc)


def test_an_alias_bomb_as_a_key_is_refused_fast() -> None:
    start = time.perf_counter()
    exc = error(f"hosts:\n  - name: a\n    env: {{? {BOMB} : 1}}\n")
    assert time.perf_counter() - start < 0.5
    assert str(exc) == f"{SRC}:3: not valid YAML: found unhashable key"


def test_a_merge_key_bomb_is_refused_fast() -> None:
    # each level merges the one before twice: PyYAML would copy 2**21 pairs into x21 (20 s, 175 MB)
    levels = [f"x{i}: &x{i} {{<<: [*x{i - 1}, *x{i - 1}]}}" for i in range(1, 22)]
    text = "hosts: [a]\nx0: &x0 {a: 1}\n" + "\n".join(levels) + "\n"
    start = time.perf_counter()
    exc = error(text)
    assert time.perf_counter() - start < 0.5
    assert str(exc) == f"{SRC}:18: not valid YAML: merge keys (<<) expand the mappings to more than 100000 entries"


def test_merge_keys_of_a_real_inventory_still_merge() -> None:
    hosts = "\n".join(f"  - {{<<: *gpu, name: node-{i}}}" for i in range(500))
    cluster = parse(f"defaults: &gpu {{nproc_per_node: 8, workdir: /w}}\nhosts:\n{hosts}\n")
    assert [h.nproc_per_node for h in cluster.hosts] == [8] * 500


def test_long_values_and_keys_are_cut_in_messages() -> None:
    long = "y" * 100_000
    exc = error(f"hosts: [a]\njob:\n  script: x.py\n  args: [[{long}]]\n")
    assert str(exc) == f"{SRC}:4: job.args[0]: must be a string or a number, got ['{'y' * 67}… (list)"
    exc = error(f"hosts: [a]\n{long[:1000]}: 1\n")  # YAML allows keys of up to 1024 characters
    assert str(exc) == f"{SRC}:2: {'y' * 139}…: unknown key '{'y' * 68}…; known keys: {', '.join(TOP_KEYS)}"
    exc = error(f"hosts: [a]\nssh_config: !!int {long}\n")
    assert len(str(exc)) < 500 and str(exc).startswith(f"{SRC}:2: not valid YAML: cannot read int value 'yyy")


HIDDEN = "abc123secret"


@pytest.mark.parametrize(("spec", "line", "sentence"), [
    ("{value: [abc123secret], secret: true}", 4, "hosts[0].env.TOKEN.value: must be a string or a number, "
     "got a value of type list (not shown: the entry is secret)"),
    ("{secret: true, value: {k: abc123secret}}", 4, "hosts[0].env.TOKEN.value: must be a string or a number, "
     "got a value of type dict (not shown: the entry is secret)"),
    ("{value: !!binary YWJjMTIzc2VjcmV0, secret: true}", 4, "hosts[0].env.TOKEN.value: must be a string or a "
     "number, got a value of type bytes (not shown: the entry is secret)"),
    ("{from_env: abc123secret-value, secret: true}", 4, "hosts[0].env.TOKEN.from_env: must be an environment "
     "variable name, got a value of type str (not shown: the entry is secret)"),
    ("{value: !!int abc123secret, secret: true}", 4,
     "not valid YAML: cannot read int value (not shown: the entry is secret)"),
    ("{value: !!float abc123secret, secret: true}", 4,
     "not valid YAML: cannot read float value (not shown: the entry is secret)"),
    ("{value: [!!timestamp abc123secret], secret: true}", 4,
     "not valid YAML: cannot read timestamp value (not shown: the entry is secret)"),
    ("{secret: true, abc123secret}", 4, "hosts[0].env.TOKEN: has an unknown key (not shown: the entry is secret); "
     "known keys: value, from_env, secret"),  # `value:` forgotten: the token is a key
    ("{abc123secret, secret: true}", 4, "hosts[0].env.TOKEN: has an unknown key (not shown: the entry is secret); "
     "known keys: value, from_env, secret"),
    ("{secret: true,\n        abc123secret: 1, abc123secret: 2}", 5,
     "hosts[0].env.TOKEN: has a key twice (not shown: the entry is secret)"),
])
def test_secret_values_are_never_quoted_in_errors(spec: str, line: int, sentence: str) -> None:
    exc = error(f"hosts:\n  - name: a\n    env:\n      TOKEN: {spec}\n")
    assert str(exc) == f"{SRC}:{line}: {sentence}"
    assert HIDDEN not in str(exc)
    assert HIDDEN in str(error(f"hosts:\n  - name: a\n    env:\n      TOKEN: {spec.replace('true', 'false')}\n"))


def test_an_unknown_key_of_a_secret_forward_or_env_file_is_not_quoted() -> None:
    exc = error(f"hosts:\n  - name: a\n    forward_env:\n      - {{pattern: X, secret: true, {HIDDEN}}}\n")
    assert str(exc) == (f"{SRC}:4: hosts[0].forward_env[0]: has an unknown key (not shown: the entry is secret); "
                        "known keys: pattern, secret")
    exc = error(f"hosts:\n  - name: a\n    env_file: {{path: .env, secret: true, {HIDDEN}}}\n")
    assert str(exc) == (f"{SRC}:3: hosts[0].env_file: has an unknown key (not shown: the entry is secret); "
                        "known keys: path, secret")


def test_a_hosts_plain_override_of_a_secret_default_is_secret_too() -> None:
    exc = error(f"""\
        defaults:
          env: {{TOKEN: {{from_env: TOKEN, secret: true}}}}
        hosts:
          - name: a
            env:
              TOKEN: [{HIDDEN}]
    """)
    assert str(exc) == (f"{SRC}:6: hosts[0].env.TOKEN: must be a string or a number, "
                        "got a value of type list (not shown: the entry is secret)")
    secret_default = "defaults:\n  env: {TOKEN: {from_env: TOKEN, secret: true}}\n"
    exc = error(secret_default + f"hosts: [{{name: a, env: {{TOKEN: {{{HIDDEN}}}}}}}]\n")  # `value:` forgotten
    assert str(exc) == (f"{SRC}:3: hosts[0].env.TOKEN: has an unknown key (not shown: the entry is secret); "
                        "known keys: value, from_env, secret")
    exc = error(secret_default + f"hosts: [{{name: a, env: {{TOKEN: !!int {HIDDEN}}}}}]\n")
    assert str(exc) == f"{SRC}:3: not valid YAML: cannot read int value (not shown: the entry is secret)"
    exc = error(secret_default + f"hosts: [{{name: a, env: {{TOKEN: {{value: x, {HIDDEN}: 1, {HIDDEN}: 2}}}}}}]\n")
    assert str(exc) == f"{SRC}:3: hosts[0].env.TOKEN: has a key twice (not shown: the entry is secret)"
    exc = error("defaults:\n  env: {TOKEN: {from_env: TOKEN, secret: true}}\nhosts: [{name: a, env: {TOKEN: true}}]\n")
    assert str(exc) == (f"{SRC}:3: hosts[0].env.TOKEN: must be a string or a number, "
                        "got a value of type bool (not shown: the entry is secret); quote it if you mean the word")


def test_a_hosts_plain_value_for_a_secret_default_is_a_secret_value() -> None:
    cluster = parse("""\
        defaults:
          env: {WANDB_API_KEY: {value: X, secret: true}}
        hosts:
          - {name: a, env: {WANDB_API_KEY: ghp_hostoverride}}
          - {name: b, env: {WANDB_API_KEY: {value: Y, secret: false}}}
          - c
    """)
    assert [h.env for h in cluster.hosts] == [(EnvVar("WANDB_API_KEY", value="ghp_hostoverride", secret=True),),
                                              (EnvVar("WANDB_API_KEY", value="Y", secret=True),),
                                              (EnvVar("WANDB_API_KEY", value="X", secret=True),)]


def test_a_secret_value_as_written_is_kept() -> None:
    env = parse("hosts: [{name: a, env: {PIN: {value: 0123, secret: true}}}]\n").hosts[0].env
    assert env == (EnvVar("PIN", value="0123", secret=True),)



# --- the example file ----------------------------------------------------------------------------------------


def test_example_inventory_loads_and_documents_every_key() -> None:
    path = REPO / "hosts" / "example.yaml"
    cluster = load_inventory(path)
    assert len(cluster.hosts) >= 2
    assert cluster.job is not None
    text = path.read_text(encoding="utf-8")
    keys = {*TOP_KEYS, *HOST_KEYS, *RENDEZVOUS_KEYS, *JOB_KEYS, *ENV_KEYS, *FORWARD_ENV_KEYS, *ENV_FILE_KEYS,
            *SYNC_KEYS, "name", "addr"}
    undocumented = sorted(k for k in keys if not re.search(rf"^\s*#?\s*(- )?{k}:", text, re.MULTILINE))
    assert not undocumented, f"hosts/example.yaml does not show {undocumented}"
    used = {*cluster.lines}
    for key in ("defaults.user", "defaults.port", "defaults.identity_file", "defaults.python", "defaults.workdir",
                "defaults.nproc_per_node", "defaults.env", "ssh_config", "host_key_policy", "rendezvous.master_addr",
                "rendezvous.master_port", "job.script", "defaults.setup", "defaults.forward_env",
                "defaults.socket_ifname", "sync.src", "sync.dest", "sync.exclude"):
        assert key in used, f"hosts/example.yaml does not set {key}"
    # A first copy runs what the user wrote and nothing more: the keys that change a run behind one's back are shown
    # commented out (a missing env_file stops the launch; retries append --resume; sample job arguments).
    for risky in ("defaults.env_file", "retries", "rendezvous.max_restarts", "job.args"):
        assert risky not in used, f"hosts/example.yaml sets {risky}: show it commented out"
    assert {(h.user, h.port) for h in cluster.hosts} == {("ubuntu", 22)}  # no host with its own login and port
    assert any(v.secret for v in cluster.hosts[0].env)
    assert any(v.from_env for v in cluster.hosts[0].env)
    assert any(h.addr != h.name for h in cluster.hosts)
    assert any(f.secret for f in cluster.hosts[0].forward_env)
    assert {h.socket_ifname for h in cluster.hosts} == {"auto", "eth1"}
    assert len({h.setup for h in cluster.hosts}) > 1, "show a host that replaces the defaults' setup"


def test_the_minimal_inventory_is_hosts_python_workdir_nproc_and_script() -> None:
    cluster = load_inventory(REPO / "hosts" / "minimal.yaml")
    assert [h.name for h in cluster.hosts] == ["gpu01", "gpu02"]
    assert cluster.job is not None and cluster.job.script == "train.py" and cluster.job.args == ()
    keys = {key.split("[")[0] for key in cluster.lines if key}
    assert keys <= {"hosts", "defaults", "defaults.python", "defaults.workdir", "defaults.nproc_per_node", "job",
                    "job.script"}, sorted(cluster.lines)
    assert cluster.retries == 0 and cluster.rendezvous.elastic.max_restarts == 0


# --- properties: whatever the input, a valid Cluster or one InventoryError -----------------------------------


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
    plan.dry_run_text()


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


def test_master_addr_on_another_node_is_refused() -> None:
    text = "hosts: [a, {name: b, addr: 10.0.0.2}]\nrendezvous: {master_addr: 10.0.0.2}\n"
    with pytest.raises(InventoryError, match=r"c\.yaml:2: rendezvous\.master_addr: is '10\.0\.0\.2', a node that is "
                                             r"not the first host: .*node rank 0 \(a\); list b first"):
        parse_inventory(text, "c.yaml")
    assert parse_inventory("hosts: [a, b]\nrendezvous: {master_addr: 10.0.0.1}\n").rendezvous.master_addr == "10.0.0.1"


# --- nodes that share nothing: setup, forward_env, env_file, socket_ifname, sync -----------------------------


def test_reserved_env_is_what_torchrun_sets() -> None:
    assert RESERVED_ENV == ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                            "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                            "TORCHELASTIC_*")


@pytest.mark.parametrize(("name", "reason"), [
    ("RANK", "torchrun sets RANK for every worker; remove it from env"),
    ("LOCAL_RANK", "torchrun sets LOCAL_RANK for every worker; remove it from env"),
    ("WORLD_SIZE", "torchrun sets WORLD_SIZE for every worker; remove it from env"),
    ("LOCAL_WORLD_SIZE", "torchrun sets LOCAL_WORLD_SIZE for every worker; remove it from env"),
    ("GROUP_RANK", "torchrun sets GROUP_RANK for every worker; remove it from env"),
    ("ROLE_RANK", "torchrun sets ROLE_RANK for every worker; remove it from env"),
    ("ROLE_WORLD_SIZE", "torchrun sets ROLE_WORLD_SIZE for every worker; remove it from env"),
    ("GROUP_WORLD_SIZE", "torchrun sets GROUP_WORLD_SIZE for every worker; remove it from env"),
    ("NODE_RANK", "the node rank comes from the order of hosts (torchrun's --node-rank); remove it from env"),
    ("MASTER_ADDR", "torchrun sets MASTER_ADDR from rendezvous.master_addr; set that instead of env"),
    ("MASTER_PORT", "torchrun sets MASTER_PORT from rendezvous.master_port; set that instead of env"),
    ("TORCHELASTIC_RUN_ID", "torchrun sets TORCHELASTIC_RUN_ID for every worker; remove it from env"),
])
def test_env_refuses_what_torchrun_sets(name: str, reason: str) -> None:
    exc = error(f"hosts:\n  - name: a\n    env:\n      NCCL_DEBUG: INFO\n      {name}: '3'\n")
    assert str(exc) == f"{SRC}:5: hosts[0].env.{name}: {reason}"
    exc = error(f"defaults:\n  env:\n    {name}: {{value: x, secret: true}}\nhosts: [a]\n")
    assert str(exc) == f"{SRC}:3: defaults.env.{name}: {reason}"


@pytest.mark.parametrize("name", ["RANKS", "MY_RANK", "rank", "TORCHELASTIC", "MASTER_ADDRESS", "PET_NNODES"])
def test_env_names_near_the_reserved_ones_are_fine(name: str) -> None:
    assert parse(f"hosts: [{{name: a, env: {{{name}: x}}}}]\n").hosts[0].env == (EnvVar(name, value="x"),)


def test_new_fields_default_to_nothing() -> None:
    cluster = parse("hosts: [a]\n")
    host = cluster.hosts[0]
    assert (host.setup, host.forward_env, host.env_file, host.socket_ifname) == ((), (), None, None)
    assert cluster.sync is None


# setup


def test_setup_a_line_or_a_list_and_the_host_replaces_the_defaults() -> None:
    cluster = parse("""\
        defaults:
          setup: [source /opt/conda/bin/activate train, module load cuda/12.4]
        hosts:
          - a
          - name: b
            setup: . ~/venv/bin/activate
          - name: c
            setup: []
          - name: d
            setup: ~
    """)
    assert [h.setup for h in cluster.hosts] == [
        ("source /opt/conda/bin/activate train", "module load cuda/12.4"), (". ~/venv/bin/activate",), (), ()]


@pytest.mark.parametrize(("value", "line"), [
    ("true", "true"), ("010", "010"), ("1:30", "1:30"), ("'yes'", "yes"),
    ('"export A=\'x y\' B=\\"#\\""', "export A='x y' B=\"#\""),
    ("echo ${#HOME} a#b '# not' \"# not\"", "echo ${#HOME} a#b '# not' \"# not\""),
    ("a && b || c", "a && b || c"), ("ulimit -n 65536; export X=1", "ulimit -n 65536; export X=1"),
])
def test_setup_lines_are_kept_as_written(value: str, line: str) -> None:
    assert parse(f"defaults:\n  setup:\n    - {value}\nhosts: [a]\n").hosts[0].setup == (line,)
    assert parse(f"hosts:\n  - name: a\n    setup: {value}\n").hosts[0].setup == (line,)


@pytest.mark.parametrize(("value", "entry", "reason"), [
    ("''", "hosts[0].setup", "must be a non-empty shell line, got '' (str)"),
    ("['  ']", "hosts[0].setup[0]", "must be a non-empty shell line, got '  ' (str)"),
    ("[ok, ~]", "hosts[0].setup[1]", "must be a non-empty shell line, got nothing"),
    ("[[a]]", "hosts[0].setup[0]", "must be a non-empty shell line, got ['a'] (list)"),
    ("{a: b}", "hosts[0].setup", "must be a shell line or a list of them, got {'a': 'b'} (dict)"),
    ('"a\\nb"', "hosts[0].setup", "must be one line without NUL characters; give each command its own list item"),
    ('["a\\0b"]', "hosts[0].setup[0]", "must be one line without NUL characters; give each command its own list item"),
    ("['module load cuda  # for nccl']", "hosts[0].setup[0]", "has a shell comment ('# for nccl'), which would hide "
     "the rest of the node's command line; put it on a YAML comment line instead"),
    ("['# just a comment']", "hosts[0].setup[0]", "has a shell comment ('# just a comment'), which would hide "
     "the rest of the node's command line; put it on a YAML comment line instead"),
    ("['start-daemon &']", "hosts[0].setup[0]", "ends with '&'; each setup line must be a whole command (lines are "
     "joined with &&; write `{ cmd & }` to start something in the background)"),
    ("['a;']", "hosts[0].setup[0]", "ends with ';'; each setup line must be a whole command"),
    ("['a &&']", "hosts[0].setup[0]", "ends with '&'; each setup line must be a whole command"),
    ("['a |']", "hosts[0].setup[0]", "ends with '|'; each setup line must be a whole command"),
    ("['a \\']", "hosts[0].setup[0]", "ends with a backslash; each setup line must be a whole command "
     "(lines are joined with &&)"),
])
def test_setup_errors(value: str, entry: str, reason: str) -> None:
    assert_error(f"hosts:\n  - name: a\n    setup: {value}\n", entry, reason, line=3)


def test_setup_block_scalar_says_one_command_per_item() -> None:
    exc = error("defaults:\n  setup: |\n    module load a\n    module load b\nhosts: [a]\n")
    assert str(exc) == (f"{SRC}:2: defaults.setup: must be one line without NUL characters; "
                        "give each command its own list item")


def test_setup_quoted_operators_are_fine() -> None:
    assert parse("hosts: [{name: a, setup: [\"echo '&'\", 'echo \"a;\"', \"echo \\\\&\"]}]\n").hosts[0].setup == (
        "echo '&'", 'echo "a;"', "echo \\&")


# forward_env


def test_forward_env_strings_and_mappings_concatenated_defaults_first() -> None:
    cluster = parse("""\
        defaults:
          forward_env: [WANDB_*, {pattern: HF_TOKEN, secret: true}]
        hosts:
          - a
          - name: b
            forward_env: ["AWS_?_KEY", {pattern: WANDB_*, secret: true}, {pattern: X, secret: false}]
          - name: c
            forward_env: ~
    """)
    a, b, c = cluster.hosts
    assert a.forward_env == (ForwardEnv("WANDB_*"), ForwardEnv("HF_TOKEN", secret=True))
    # the same pattern twice is one entry, secret when either says so
    assert b.forward_env == (ForwardEnv("WANDB_*", secret=True), ForwardEnv("HF_TOKEN", secret=True),
                             ForwardEnv("AWS_?_KEY"), ForwardEnv("X"))
    assert c.forward_env == a.forward_env


@pytest.mark.parametrize(("value", "entry", "reason"), [
    ("WANDB_*", "hosts[0].forward_env", "must be a list of variable names or globs (e.g. [WANDB_*, HF_*]), "
     "got 'WANDB_*' (str)"),
    ("{pattern: X}", "hosts[0].forward_env", "must be a list of variable names or globs"),
    ("[WANDB-*]", "hosts[0].forward_env[0]", "must be a variable name or a glob of names (letters, digits, _, and * "
     "or ?), got 'WANDB-*' (str)"),
    ("[ok, '1X']", "hosts[0].forward_env[1]", "must be a variable name or a glob of names (letters, digits, _, and * "
     "or ?), got '1X' (str)"),
    ("['HF_[AB]']", "hosts[0].forward_env[0]", "must be a variable name or a glob of names"),
    ("[3]", "hosts[0].forward_env[0]", "got 3 (int)"),
    ("['*']", "hosts[0].forward_env[0]", "is '*', which would copy unrelated variables of your shell (PATH, HOME, "
     "...); name a prefix, such as WANDB_*"),
    ("['?*?']", "hosts[0].forward_env[0]", "is '?*?', which would copy unrelated variables"),
    ("[RANK]", "hosts[0].forward_env[0]", "torchrun sets RANK for every worker; remove it from forward_env"),
    ("[MASTER_ADDR]", "hosts[0].forward_env[0]",
     "torchrun sets MASTER_ADDR from rendezvous.master_addr; set that instead of forward_env"),
    ("[TORCHELASTIC_RUN_ID]", "hosts[0].forward_env[0]",
     "torchrun sets TORCHELASTIC_RUN_ID for every worker; remove it from forward_env"),
    ("[MASTER_*]", "hosts[0].forward_env[0]",
     "would copy MASTER_ADDR, which torchrun sets for every worker; use a pattern that leaves it out"),
    ("['*_SIZE']", "hosts[0].forward_env[0]", "would copy WORLD_SIZE, which torchrun sets for every worker"),
    ("[TORCHELASTIC_*]", "hosts[0].forward_env[0]", "would copy TORCHELASTIC_*, which torchrun sets"),
    ("[TORCH*]", "hosts[0].forward_env[0]", "would copy TORCHELASTIC_*, which torchrun sets"),
    ("[TORCHELASTIC_R*]", "hosts[0].forward_env[0]", "would copy TORCHELASTIC_*, which torchrun sets"),
    ("['*_RUN_ID']", "hosts[0].forward_env[0]", "would copy TORCHELASTIC_RUN_ID, which torchrun sets"),
    ("[{secret: true}]", "hosts[0].forward_env[0]", "has no `pattern:` (a variable name, or a glob such as WANDB_*)"),
    ("[{pattern: X, secret: 'yes'}]", "hosts[0].forward_env[0].secret", BAD_FLAG.format("str")),
    ("[{patern: X}]", "hosts[0].forward_env[0].patern", "unknown key 'patern'; did you mean 'pattern'?"),
    ("[{pattern: X, zzz: 1}]", "hosts[0].forward_env[0].zzz", "unknown key 'zzz'; known keys: pattern, secret"),
])
def test_forward_env_errors(value: str, entry: str, reason: str) -> None:
    assert_error(f"hosts:\n  - name: a\n    forward_env: {value}\n", entry, reason, line=3)


def test_forward_env_names_that_are_fine() -> None:
    patterns = ["WANDB_*", "HF_*", "_X", "a?c", "NCCL_*", "RANKS_*", "X*Y", "CUDA_VISIBLE_DEVICES"]
    host = parse(f"hosts: [{{name: a, forward_env: [{', '.join(repr(p) for p in patterns)}]}}]\n").hosts[0]
    assert [f.pattern for f in host.forward_env] == patterns


def test_a_secret_forward_pattern_is_not_quoted_in_errors() -> None:
    exc = error(f"hosts:\n  - name: a\n    forward_env:\n      - {{pattern: '{HIDDEN}-x', secret: true}}\n")
    assert str(exc) == (f"{SRC}:4: hosts[0].forward_env[0].pattern: must be a variable name or a glob of names "
                        "(letters, digits, _, and * or ?), got a value of type str (not shown: the entry is secret)")


# env_file


@pytest.mark.parametrize(("source", "value", "path"), [
    ("hosts/cluster.yaml", ".env", "hosts/.env"),
    ("hosts/cluster.yaml", "../secrets/train.env", "hosts/../secrets/train.env"),
    ("hosts/cluster.yaml", "/etc/train.env", "/etc/train.env"),
    ("hosts/cluster.yaml", "~/train.env", "~/train.env"),
    ("cluster.yaml", ".env", ".env"),
    ("/abs/dir/cluster.yaml", "a b/.env", "/abs/dir/a b/.env"),
    ("<inventory>", ".env", ".env"),
])
def test_env_file_is_relative_to_the_inventorys_folder(source: str, value: str, path: str) -> None:
    cluster = parse_inventory(f"hosts:\n  - name: a\n    env_file: '{value}'\n", source)
    assert cluster.hosts[0].env_file == EnvFile(path)


def test_env_file_mapping_form_and_the_host_replaces_the_defaults() -> None:
    cluster = parse("""\
        defaults:
          env_file: {path: .env, secret: true}
        hosts:
          - a
          - name: b
            env_file: b.env
          - name: c
            env_file: ~
    """)
    assert [h.env_file for h in cluster.hosts] == [EnvFile("hosts/.env", secret=True), EnvFile("hosts/b.env"), None]


@pytest.mark.parametrize(("value", "entry", "reason"), [
    ("''", "hosts[0].env_file", "must be a non-empty string, got '' (str)"),
    ("[.env]", "hosts[0].env_file", "must be a file path, got ['.env'] (list)"),
    ("3", "hosts[0].env_file", "must be a file path, got 3 (int)"),
    ('"a\\nb"', "hosts[0].env_file", "must not contain a newline or NUL character"),
    ("{secret: true}", "hosts[0].env_file", "has no `path:` (a dotenv file on this machine)"),
    ("{path: ''}", "hosts[0].env_file.path", "must be a non-empty string, got '' (str)"),
    ("{path: .env, secret: 1}", "hosts[0].env_file.secret", BAD_FLAG.format("int")),
    ("{pth: .env}", "hosts[0].env_file.pth", "unknown key 'pth'; did you mean 'path'?"),
])
def test_env_file_errors(value: str, entry: str, reason: str) -> None:
    assert_error(f"hosts:\n  - name: a\n    env_file: {value}\n", entry, reason, line=3)


# socket_ifname


@pytest.mark.parametrize("value", ["auto", "eth0", "ib0", "enp0s31f6", "bond0.100", "eth0:1", "veth-a_b", "a" * 15])
def test_socket_ifname_values(value: str) -> None:
    assert parse(f"hosts: [{{name: a, socket_ifname: '{value}'}}]\n").hosts[0].socket_ifname == value


def test_socket_ifname_the_host_replaces_the_defaults() -> None:
    cluster = parse("defaults: {socket_ifname: auto}\nhosts: [a, {name: b, socket_ifname: ib0}, "
                    "{name: c, socket_ifname: ~}]\n")
    assert [h.socket_ifname for h in cluster.hosts] == ["auto", "ib0", None]


@pytest.mark.parametrize(("value", "shown"), [
    ("'eth 0'", "'eth 0' (str)"), ("''", "'' (str)"), ("a23456789012345x", "'a23456789012345x' (str)"),
    ("3", "3 (int)"), ("[eth0]", "['eth0'] (list)"), ("eth0/1", "'eth0/1' (str)"),
])
def test_socket_ifname_errors(value: str, shown: str) -> None:
    message = f'must be "auto" or a network interface name (1 to 15 letters, digits, or _.:-), got {shown}'
    assert_error(f"hosts:\n  - name: a\n    socket_ifname: {value}\n", "hosts[0].socket_ifname", message, line=3)
    assert_error(f"defaults:\n  socket_ifname: {value}\nhosts: [a]\n", "defaults.socket_ifname", message, line=2)


@pytest.mark.parametrize(("text", "sentence"), [
    ("hosts:\n  - name: a\n    socket_ifname: eth0\n    env: {NCCL_SOCKET_IFNAME: eth1}\n",
     "3: hosts[0].socket_ifname: sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME, but hosts[0].env.NCCL_SOCKET_IFNAME "
     "sets NCCL_SOCKET_IFNAME too; keep one of them"),
    ("defaults:\n  env: {GLOO_SOCKET_IFNAME: eth1}\nhosts:\n  - name: a\n    socket_ifname: auto\n",
     "5: hosts[0].socket_ifname: sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME, but defaults.env.GLOO_SOCKET_IFNAME "
     "sets GLOO_SOCKET_IFNAME too; keep one of them"),
    ("defaults:\n  socket_ifname: auto\nhosts:\n  - a\n  - name: b\n    env: {NCCL_SOCKET_IFNAME: eth1}\n",
     "2: defaults.socket_ifname: sets NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME, but hosts[1].env.NCCL_SOCKET_IFNAME "
     "sets NCCL_SOCKET_IFNAME too; keep one of them"),
])
def test_socket_ifname_and_the_same_variable_in_env_are_refused(text: str, sentence: str) -> None:
    assert str(error(text)) == f"{SRC}:{sentence}"


def test_socket_ifname_overridden_to_null_lets_env_set_it() -> None:
    host = parse("defaults: {socket_ifname: auto}\n"
                 "hosts: [{name: a, socket_ifname: ~, env: {NCCL_SOCKET_IFNAME: eth1}}]\n").hosts[0]
    assert (host.socket_ifname, host.env) == (None, (EnvVar("NCCL_SOCKET_IFNAME", value="eth1"),))


# sync


@pytest.mark.parametrize(("text", "spec"), [
    ("sync: {}\n", SyncSpec()),
    ("sync:\n  src: .\n", SyncSpec()),
    ("sync: {src: ../project, dest: /scratch/project, exclude: [data/, '*.pt', .venv]}\n",
     SyncSpec(src="../project", dest="/scratch/project", exclude=("data/", "*.pt", ".venv"))),
    ("sync: {dest: '~', exclude: []}\n", SyncSpec(dest="~")),
    ("sync: {relay: true}\n", SyncSpec(relay=True)),
    ("sync: {relay: false}\n", SyncSpec(relay=False)),
    ("sync: {relay: auto}\n", SyncSpec()),
    ("sync: {src: ~, dest: ~, exclude: ~}\n", SyncSpec()),
    ("sync: ~\n", None),
])
def test_sync(text: str, spec: SyncSpec | None) -> None:
    assert parse(f"hosts: [a]\n{text}").sync == spec


@pytest.mark.parametrize(("value", "entry", "reason"), [
    ("true", "sync", "must be a mapping (`sync: {}` copies the current folder to every workdir), got True (bool)"),
    ("[.]", "sync", "must be a mapping, got ['.'] (list)"),
    ("{src: ''}", "sync.src", "must be a non-empty string, got '' (str)"),
    ("{dest: 3}", "sync.dest", "must be a non-empty string, got 3 (int)"),
    ("{exclude: data/}", "sync.exclude", "must be a list of gitignore-style patterns, got 'data/' (str)"),
    ("{exclude: [a, '']}", "sync.exclude[1]", "must be a non-empty string, got '' (str)"),
    ("{excludes: [a]}", "sync.excludes", "unknown key 'excludes'; did you mean 'exclude'?"),
    ("{zzz: 1}", "sync.zzz", "unknown key 'zzz'; known keys: src, dest, exclude, relay"),
    ("{relay: yes please}", "sync.relay", 'must be true (the nodes pass the tree on to each other), false (each gets '
                                          """it from here) or "auto", got 'yes please' (str)"""),
])
def test_sync_errors(value: str, entry: str, reason: str) -> None:
    assert_error(f"hosts: [a]\nsync: {value}\n", entry, reason, line=2)


def test_rendezvous_remembers_whether_master_addr_was_given() -> None:
    assert not parse("hosts: [a, b]\n").rendezvous.master_addr_explicit
    assert not parse("hosts: [a, b]\nrendezvous: {master_port: 1234}\n").rendezvous.master_addr_explicit
    assert parse("hosts: [a, b]\nrendezvous: {master_addr: a}\n").rendezvous.master_addr_explicit


def test_cluster_from_data_validates_like_yaml() -> None:
    data = {"defaults": {"setup": "module load x", "env_file": ".env"}, "hosts": ["a", {"name": "b"}]}
    cluster = cluster_from_data(data, "conf/hosts.txt", {"hosts[1]": 7})
    assert [h.setup for h in cluster.hosts] == [("module load x",)] * 2
    assert cluster.hosts[0].env_file == EnvFile("conf/.env")
    assert cluster_from_data(data, "conf/hosts.txt", folder="").hosts[0].env_file == EnvFile(".env")
    with pytest.raises(InventoryError) as info:
        cluster_from_data({"hosts": ["a", {"name": "b", "port": "x"}]}, "conf/hosts.txt", {"hosts[1]": 7})
    assert str(info.value) == "conf/hosts.txt:7: hosts[1].port: must be a port number from 1 to 65535, got 'x' (str)"
