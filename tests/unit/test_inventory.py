"""The inventory loader: every problem is one `InventoryError` naming file, line, entry and field; the rest is typed.
Here the file, its hosts, unknown keys and the inventories hosts/ ships; test_inventory_*.py the rest."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from launcher.config.inventory import load_inventory
from launcher.config.model import (
    CONTAINER_KEYS,
    ENV_FILE_KEYS,
    ENV_KEYS,
    FORWARD_ENV_KEYS,
    HOST_KEYS,
    JOB_KEYS,
    RENDEZVOUS_KEYS,
    SYNC_KEYS,
    TOP_KEYS,
)
from launcher.errors import InventoryError, LauncherError
from tests.support.inventory import SRC, assert_error, error

REPO = Path(__file__).resolve().parents[2]


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


# --- the example file ----------------------------------------------------------------------------------------


def test_example_inventory_loads_and_documents_every_key() -> None:
    path = REPO / "hosts" / "example.yaml"
    cluster = load_inventory(path)
    assert len(cluster.hosts) >= 2
    assert cluster.job is not None
    text = path.read_text(encoding="utf-8")
    keys = {*TOP_KEYS, *HOST_KEYS, *RENDEZVOUS_KEYS, *JOB_KEYS, *ENV_KEYS, *FORWARD_ENV_KEYS, *ENV_FILE_KEYS,
            *SYNC_KEYS, *CONTAINER_KEYS, "name", "addr"}
    undocumented = sorted(k for k in keys if not re.search(rf"^\s*#?\s*(- )?{k}:", text, re.MULTILINE))
    assert not undocumented, f"hosts/example.yaml does not show {undocumented}"
    used = {*cluster.lines}
    for key in ("defaults.user", "defaults.port", "defaults.identity_file", "defaults.python", "defaults.workdir",
                "defaults.nproc_per_node", "defaults.env", "ssh_config", "host_key_policy", "rendezvous.master_addr",
                "rendezvous.master_port", "job.script", "defaults.setup", "defaults.forward_env",
                "defaults.socket_ifname", "sync.src", "sync.dest", "sync.exclude"):
        assert key in used, f"hosts/example.yaml does not set {key}"
    # A first copy runs what the user wrote and nothing more: the keys that change a run behind one's back are shown
    # commented out (a missing env_file stops the launch; retries; resume arguments; sample job arguments).
    for risky in ("defaults.env_file", "retries", "rendezvous.max_restarts", "job.args", "job.resume_args"):
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
