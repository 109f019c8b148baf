"""What the inventory's errors quote: an alias bomb cut short and fast, long values and keys cut, secrets never."""

from __future__ import annotations

import time

import pytest

from launcher.config.model import TOP_KEYS, EnvVar
from tests.support.inventory import HIDDEN, SRC, error, parse

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
