"""The inventory's fields one by one: their types and bounds, host names, env (names, values, the mapping form), job."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from launcher.config.inventory import parse_inventory
from launcher.config.model import HOST_KEY_POLICIES, EnvVar, Job
from launcher.errors import InventoryError
from tests.support.inventory import BAD_FLAG, SRC, assert_error, parse

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
