"""The inventory's settings for nodes that share nothing: the env torchrun sets (refused), setup, forward_env,
env_file, socket_ifname, sync, and `cluster_from_data`."""

from __future__ import annotations

import pytest

from launcher.config.fields import RESERVED_ENV
from launcher.config.inventory import cluster_from_data, parse_inventory
from launcher.config.model import EnvFile, EnvVar, ForwardEnv, SyncSpec
from launcher.errors import InventoryError
from tests.support.inventory import BAD_FLAG, HIDDEN, SRC, assert_error, error, parse


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
