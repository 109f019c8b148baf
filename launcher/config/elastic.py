"""The inventory's fields for runs that survive a lost node: torchrun's elastic rendezvous (`rendezvous.backend`,
`nodes`, `max_restarts`, `conf`), the launcher's own `retries` and the job's `resume_args` (pure: no I/O)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from launcher.config.model import BACKENDS, DEFAULT_RESUME_ARGS, OWN_CONF, Elastic
from launcher.config.reader import Reader
from launcher.config.text import shown

_CONF_KEY = re.compile(r"[a-z_][a-z0-9_]*\Z")


_CONF_VALUE = re.compile(r"[A-Za-z0-9_.:/-]+\Z")


_NODES = re.compile(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?\Z")


def parse_elastic(r: Reader, fields: Mapping[str, Any], hosts: int) -> Elastic:
    backend = fields.get("backend", "static")
    if backend not in BACKENDS:
        raise r.fail("rendezvous.backend", f"must be one of {', '.join(BACKENDS)}, got {r.show(backend, False)}")
    restarts = r.count(fields.get("max_restarts", 0), "rendezvous.max_restarts")
    if backend == "static":
        for key in ("nodes", "conf"):
            if fields.get(key) is not None:
                raise r.fail(
                    f"rendezvous.{key}", "needs `backend: c10d` (a static rendezvous always waits for every host)"
                )
        return Elastic(max_restarts=restarts)
    low, high = parse_nodes(r, fields.get("nodes"), hosts)
    return Elastic("c10d", low, high, restarts, parse_conf(r, fields.get("conf")))


def parse_nodes(r: Reader, value: Any, hosts: int) -> tuple[int | None, int | None]:
    if value is None:
        return None, None
    # `2:3` unquoted is a YAML 1.1 base-60 number (123): read the text as written.
    text = r.written.get("rendezvous.nodes", value if isinstance(value, str) else None)
    if isinstance(value, int) and not isinstance(value, bool) and text is None:
        text = str(value)
    match = _NODES.match(text) if isinstance(text, str) else None
    if match is None:
        raise r.fail(
            "rendezvous.nodes", f'must be "MIN:MAX" (like "2:4") or a number of nodes, got {r.show(value, False)}'
        )
    low = int(match[1])
    high = int(match[2]) if match[2] is not None else low
    if not 1 <= low <= high:
        raise r.fail("rendezvous.nodes", f"needs 1 <= MIN <= MAX, got {low}:{high}")
    if low > hosts:
        raise r.fail("rendezvous.nodes", f"asks for at least {low} node(s); the inventory lists {hosts}")
    return low, high


def parse_conf(r: Reader, value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise r.fail(
            "rendezvous.conf", f"must be a mapping of key: value (torchrun's --rdzv-conf), got {r.show(value, False)}"
        )
    pairs = []
    for key, raw in value.items():
        where = f"rendezvous.conf.{key}"
        if not isinstance(key, str) or not _CONF_KEY.match(key):
            raise r.fail(where, f"{r.show(key, False)} is not a --rdzv-conf key (lower-case letters, digits, _)")
        if key in OWN_CONF:
            raise r.fail(where, "is set by the launcher: the first host holds the rendezvous store")
        text = ("1" if raw else "0") if isinstance(raw, bool) else r.word(raw, where)
        if not _CONF_VALUE.match(text):
            raise r.fail(where, f"must be a number or a word without spaces or commas, got {shown(text)}")
        pairs.append((key, text))
    return tuple(pairs)


def parse_resume_args(r: Reader, value: Any) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_RESUME_ARGS
    if not isinstance(value, list):
        raise r.fail("job.resume_args", f"must be a list of words (added on a retry), got {r.show(value, False)}")
    return tuple(r.word(a, f"job.resume_args[{i}]") for i, a in enumerate(value))
