"""The hosts inventory: YAML text -> a validated, typed `Cluster` (pure: no DNS, no SSH, no files but the one read)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from launcher.config.container import parse_container
from launcher.config.elastic import parse_elastic, parse_resume_args
from launcher.config.fields import parse_node_fields, parse_sync, reserved_reason
from launcher.config.model import (
    DEFAULT_MASTER_PORT,
    DEFAULTS,
    ENV_KEYS,
    HOST_KEY_POLICIES,
    HOST_KEYS,
    JOB_FORMS,
    JOB_KEYS,
    RENDEZVOUS_KEYS,
    TOP_KEYS,
    Cluster,
    EnvVar,
    Host,
    Job,
    Rendezvous,
)
from launcher.config.reader import ENV_NAME, HOST_NAME, Reader
from launcher.config.text import render, typed
from launcher.config.torchrun import refusal
from launcher.config.yamltext import load_yaml
from launcher.errors import InventoryError
from launcher.paths import hint
from launcher.settings import ON_HANG

MISSING = (
    "no such file: `{init}` writes one from what your nodes say over SSH, `{example}` the reference "
    "(every key, what it does, its default)"
)
"""A missing inventory's message; `{init}` and `{example}` in the caller's words (`launcher.paths.hint`): a user of
the installed command has no checkout, and no hosts/example.yaml of its own until `init --example` writes it."""


def load_inventory(path: str | Path) -> Cluster:
    """Read and validate the inventory file at `path`."""
    return parse_inventory(read_hosts_file(path), str(path))


def read_hosts_file(path: str | Path) -> str:
    """The text of an inventory or hostfile; a missing or unreadable file is an `InventoryError`."""
    source = str(path)
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(
            source, MISSING.format(init=hint("init --hosts NODE1,NODE2"), example=hint("init --example"))
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(source, f"cannot read it: {exc}") from None


def cluster_from_data(
    data: Any, source: str, lines: Mapping[str, int] | None = None, folder: str | None = None
) -> Cluster:
    """Validate an inventory already loaded as Python data (a hostfile builds one), exactly as YAML text would be.

    `lines` maps entries ("hosts[1]") to lines of `source`; `folder` is where a relative env_file is (default: the
    folder of `source`).
    """
    return parse_cluster(Reader(source, dict(lines or {}), {}, folder), data)


def is_host_name(text: str) -> bool:
    """Whether `text` is acceptable as a host name, ssh alias or address (never starting with '-')."""
    return bool(HOST_NAME.match(text))


def parse_inventory(text: str, source: str = "<inventory>") -> Cluster:
    """Validate inventory YAML text; every problem raises `InventoryError` naming source, line, entry, field."""
    data, lines, written = load_yaml(text, source)
    return parse_cluster(Reader(source, lines, written), data)


def parse_cluster(r: Reader, data: Any) -> Cluster:
    if data is None:
        raise r.fail("", "the file is empty; it needs at least a `hosts:` list")
    top = r.mapping(data, "", TOP_KEYS)
    defaults = r.mapping(top.get("defaults"), "defaults", HOST_KEYS)
    raw_hosts = top.get("hosts")
    if raw_hosts is None:
        raise r.fail("hosts", "is missing: list at least one host")
    if not isinstance(raw_hosts, list):
        raise r.fail("hosts", f"must be a list of host names or mappings, got {typed(raw_hosts)}")
    if not raw_hosts:
        raise r.fail("hosts", "is empty: list at least one host")
    hosts = tuple(parse_host(r, raw, f"hosts[{i}]", defaults) for i, raw in enumerate(raw_hosts))
    raw_spares = top.get("spares") or []
    if not isinstance(raw_spares, list):
        raise r.fail("spares", f"must be a list of host names or mappings, as `hosts:` is, got {typed(raw_spares)}")
    spares = tuple(parse_host(r, raw, f"spares[{i}]", defaults) for i, raw in enumerate(raw_spares))
    seen: dict[str, str] = {}
    for entry, host in [
        *((f"hosts[{i}]", h) for i, h in enumerate(hosts)),
        *((f"spares[{i}]", h) for i, h in enumerate(spares)),
    ]:
        if host.name in seen:
            raise r.fail(entry, f"host {render(host.name)} is listed twice (also {seen[host.name]})")
        seen[host.name] = entry
    policy = top.get("host_key_policy", "strict")
    if policy not in HOST_KEY_POLICIES:
        choices = ", ".join(HOST_KEY_POLICIES)
        raise r.fail("host_key_policy", f"must be one of {choices}, got {typed(policy)}")
    rendezvous = parse_rendezvous(r, top.get("rendezvous"), hosts)
    ssh_config = top.get("ssh_config")
    if ssh_config is not None:
        ssh_config = r.text(ssh_config, "ssh_config")
    return Cluster(
        source=r.source,
        hosts=hosts,
        rendezvous=rendezvous,
        job=parse_job(r, top["job"], rendezvous.elastic.max_restarts) if top.get("job") is not None else None,
        ssh_config=ssh_config,
        host_key_policy=policy,
        sync=parse_sync(r, top.get("sync")),
        retries=r.count(top.get("retries", 0), "retries"),
        spares=spares,
        lines=r.lines,
    )


def parse_host(r: Reader, raw: Any, entry: str, defaults: dict[str, Any]) -> Host:
    if isinstance(raw, str):
        raw = {"name": raw}
    elif not isinstance(raw, dict):
        raise r.fail(entry, f"must be a host name or a mapping with `name:`, got {typed(raw)}")
    fields = r.mapping(raw, entry, ("name", "addr", *HOST_KEYS))
    if "name" not in fields:
        raise r.fail(entry, "has no `name:` (the ssh alias or address of the node)")
    name = r.host_name(fields["name"], f"{entry}.name")
    merged = {**DEFAULTS, **defaults, **fields}

    def get(key: str, check: Callable[[Any, str], Any]) -> Any:
        where = f"{entry}.{key}" if key in fields else f"defaults.{key}"
        value = merged.get(key)
        if value is None and key not in DEFAULTS:  # null leaves user, port, key to ssh config
            return None
        if value is None and key == "workdir":
            raise r.fail(where, 'must be a directory, got nothing (a bare ~ is null in YAML: write "~")')
        return check(value, where)

    base = parse_env(r, defaults.get("env"), "defaults.env")
    secrets = frozenset(name for name, var in base.items() if var.secret)
    own = parse_env(r, fields.get("env"), f"{entry}.env", secrets)
    # A host's override of a secret default stays secret: its errors, its dry-run line and its command.json.
    env = {**base, **{name: replace(var, secret=True) if name in secrets else var for name, var in own.items()}}
    return Host(
        name=name,
        addr=r.host_name(fields["addr"], f"{entry}.addr") if fields.get("addr") is not None else name,
        python=get("python", r.text),
        workdir=get("workdir", r.text),
        nproc_per_node=get("nproc_per_node", r.nproc),
        user=get("user", r.text),
        port=get("port", r.port),
        identity_file=get("identity_file", r.text),
        env=tuple(env.values()),
        **parse_node_fields(r, entry, fields, defaults, env),
        container=parse_container(r, defaults, fields, entry),
    )


def parse_rendezvous(r: Reader, raw: Any, hosts: tuple[Host, ...]) -> Rendezvous:
    fields = r.mapping(raw, "rendezvous", RENDEZVOUS_KEYS)
    addr = fields.get("master_addr")
    port = fields.get("master_port")
    first = hosts[0]
    other = next((h for h in hosts[1:] if addr in (h.name, h.addr) and addr not in (first.name, first.addr)), None)
    if other is not None:
        # torchrun's static rendezvous store listens on node rank 0; every other node would wait for it at
        # master_addr, where nothing listens, until a timeout.
        raise r.fail(
            "rendezvous.master_addr",
            f"is {render(addr)}, a node that is not the first host: "
            f"torchrun's store runs on node rank 0 ({first.name}); list {other.name} first, "
            "or drop master_addr",
        )
    return Rendezvous(
        master_addr=first.addr if addr is None else r.host_name(addr, "rendezvous.master_addr"),
        master_port=DEFAULT_MASTER_PORT if port is None else r.port(port, "rendezvous.master_port"),
        master_addr_explicit=addr is not None,
        elastic=parse_elastic(r, fields, len(hosts)),
    )


def parse_job(r: Reader, raw: Any, max_restarts: int = 0) -> Job:
    fields = r.mapping(raw, "job", JOB_KEYS)
    forms = [name for name in JOB_FORMS if fields.get(name) is not None]
    if not forms:
        raise r.fail(
            "job",
            "has no `script:` (the training script, relative to workdir), `module:` (run as "
            "`python -m`) or `command:` (a program, not Python)",
        )
    if len(forms) > 1:
        raise r.fail(f"job.{forms[1]}", f"and job.{forms[0]} are both set: a job runs one script, module or command")
    form = forms[0]
    value = r.text(fields[form], f"job.{form}")
    if value.startswith("-"):
        raise r.fail(f"job.{form}", f"{value[:60]!r} starts with '-': torchrun would read it as an option")
    hang, on_hang = fields.get("hang_timeout"), fields.get("on_hang")
    if on_hang is not None and on_hang not in ON_HANG:
        raise r.fail("job.on_hang", f"must be one of {', '.join(ON_HANG)}, got {typed(on_hang)}")
    return Job(
        **{form: value},
        args=_strings(r, fields.get("args"), "job.args"),
        torchrun=_torchrun(r, fields.get("torchrun"), max_restarts),
        resume_args=parse_resume_args(r, fields.get("resume_args")),
        hang_timeout=None if hang is None else r.seconds(hang, "job.hang_timeout"),
        on_hang=on_hang,
        progress=parse_progress(r, fields.get("progress")),
    )


def _strings(r: Reader, raw: Any, entry: str) -> tuple[str, ...]:
    """A list of words (job.args, job.torchrun); null is none."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise r.fail(entry, f"must be a list of words, got {typed(raw)}")
    return tuple(r.word(a, f"{entry}[{i}]") for i, a in enumerate(raw))


def _torchrun(r: Reader, raw: Any, max_restarts: int) -> tuple[str, ...]:
    """`job.torchrun`: torchrun's options as words, none of them one the launcher sets (`launcher.config.torchrun`)."""
    torchrun_args = _strings(r, raw, "job.torchrun")
    refused = refusal(torchrun_args, max_restarts)
    if refused is not None:
        raise r.fail(f"job.torchrun[{refused[0]}]", refused[1])
    return torchrun_args


def parse_progress(r: Reader, raw: Any) -> str | None:
    """`job.progress`: a regular expression with a group (named `step`, or the first one) that is the step."""
    if raw is None:
        return None
    text = r.text(raw, "job.progress")
    try:
        groups = re.compile(text).groups
    except re.error as exc:
        raise r.fail("job.progress", f"is not a regular expression ({exc})") from None
    if not groups:
        raise r.fail("job.progress", "has no group for the step number: write it as 'step (?P<step>\\d+)'")
    return text


def parse_env(r: Reader, raw: Any, entry: str, secret: frozenset[str] = frozenset()) -> dict[str, EnvVar]:
    """`NAME: value` entries; errors never show the values of the names in `secret`."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise r.fail(entry, f"must be a mapping of NAME: value, got {typed(raw)}")
    out: dict[str, EnvVar] = {}
    for name, value in raw.items():
        where = f"{entry}.{name}"
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise r.fail(
                where,
                f"{render(name)} is not a valid environment variable name "
                "(letters, digits and _, not starting with a digit)",
            )
        reserved = reserved_reason(name)
        if reserved is not None:
            raise r.fail(where, reserved)
        if isinstance(value, dict):
            out[name] = parse_env_spec(r, name, value, where, name in secret)
        else:
            out[name] = EnvVar(name, value=r.word(value, where, secret=name in secret))
    return out


def parse_env_spec(r: Reader, name: str, raw: dict[Any, Any], where: str, hidden: bool) -> EnvVar:
    """The `{value: ...}` / `{from_env: ...}` form; once it says `secret: true`, no error shows its values."""
    spec = r.mapping(raw, where, ENV_KEYS, secret=hidden)
    if ("value" in spec) == ("from_env" in spec):
        raise r.fail(where, "needs exactly one of `value:` or `from_env:`")
    secret = r.secret_flag(spec.get("secret", False), f"{where}.secret")
    hidden = hidden or secret
    from_env = spec.get("from_env")
    if "from_env" in spec and (not isinstance(from_env, str) or not ENV_NAME.match(from_env)):
        # it may be the secret itself, pasted where its variable's name belongs
        raise r.fail(f"{where}.from_env", f"must be an environment variable name, got {r.show(from_env, hidden)}")
    literal = r.word(spec["value"], f"{where}.value", secret=hidden) if "value" in spec else None
    return EnvVar(name, value=literal, from_env=from_env, secret=secret)
