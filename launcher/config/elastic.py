"""The inventory's fields for runs that survive a lost node: torchrun's elastic rendezvous (`rendezvous.backend`,
`nodes`, `max_restarts`, `conf`), the launcher's own `retries` and the job's `resume_args` (pure: no I/O)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from launcher.options import MAX_RETRIES

if TYPE_CHECKING:
    from launcher.errors import InventoryError

Backend = Literal["static", "c10d"]
BACKENDS: tuple[str, ...] = ("static", "c10d")
ELASTIC_KEYS = ("backend", "nodes", "max_restarts", "conf")
"""Keys of `rendezvous:` besides master_addr and master_port."""
DEFAULT_RESUME_ARGS: tuple[str, ...] = ("--resume",)
"""What a retried attempt adds to the job's arguments unless the job says otherwise (`job.resume_args`)."""
OWN_CONF = ("is_host",)
"""`--rdzv-conf` keys the plan sets per node (the first host holds the store): `rendezvous.conf` may not."""

_CONF_KEY = re.compile(r"[a-z_][a-z0-9_]*\Z")
_CONF_VALUE = re.compile(r"[A-Za-z0-9_.:/-]+\Z")
_NODES = re.compile(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?\Z")


@dataclass(frozen=True)
class Elastic:
    """How torchrun forms its worker group: `static` (every node, fixed ranks: the default) or `c10d` (a rendezvous
    that admits MIN to MAX nodes and re-forms the group, without a lost node, up to `max_restarts` times)."""

    backend: Backend = "static"
    min_nodes: int | None = None
    """c10d: the fewest nodes that may train; None means every host (`nodes:` not given)."""
    max_nodes: int | None = None
    """c10d: the most nodes admitted; None means every host."""
    max_restarts: int = 0
    """torchrun's --max-restarts: how often it restarts the worker group (after a failure, or a node lost) itself."""
    conf: tuple[tuple[str, str], ...] = ()
    """Extra `--rdzv-conf key=value` pairs (c10d), e.g. last_call_timeout, join_timeout."""

    def nodes_range(self, hosts: int) -> tuple[int, int]:
        """(MIN, MAX) for a cluster of `hosts` hosts: static runs need all of them."""
        if self.backend == "static":
            return hosts, hosts
        return (self.min_nodes or hosts, min(self.max_nodes or hosts, hosts))


class ElasticFields:
    """The checks of the elastic fields; mixed into the inventory's `_Parser`."""

    if TYPE_CHECKING:
        written: Mapping[str, str]

        def fail(self, entry: str, message: str) -> InventoryError: ...
        def word(self, value: Any, entry: str, secret: bool = False) -> str: ...
        def show(self, value: Any, secret: bool) -> str: ...

    def elastic(self, fields: Mapping[str, Any], hosts: int) -> Elastic:
        backend = fields.get("backend", "static")
        if backend not in BACKENDS:
            raise self.fail("rendezvous.backend",
                            f"must be one of {', '.join(BACKENDS)}, got {self.show(backend, False)}")
        restarts = self.count(fields.get("max_restarts", 0), "rendezvous.max_restarts")
        if backend == "static":
            for key in ("nodes", "conf"):
                if fields.get(key) is not None:
                    raise self.fail(f"rendezvous.{key}", "needs `backend: c10d` (a static rendezvous always waits "
                                    "for every host)")
            return Elastic(max_restarts=restarts)
        low, high = self.nodes(fields.get("nodes"), hosts)
        return Elastic("c10d", low, high, restarts, self.conf(fields.get("conf")))

    def nodes(self, value: Any, hosts: int) -> tuple[int | None, int | None]:
        if value is None:
            return None, None
        # `2:3` unquoted is a YAML 1.1 base-60 number (123): read the text as written.
        text = self.written.get("rendezvous.nodes", value if isinstance(value, str) else None)
        if isinstance(value, int) and not isinstance(value, bool) and text is None:
            text = str(value)
        match = _NODES.match(text) if isinstance(text, str) else None
        if match is None:
            raise self.fail("rendezvous.nodes", f'must be "MIN:MAX" (like "2:4") or a number of nodes, got '
                            f"{self.show(value, False)}")
        low = int(match[1])
        high = int(match[2]) if match[2] is not None else low
        if not 1 <= low <= high:
            raise self.fail("rendezvous.nodes", f"needs 1 <= MIN <= MAX, got {low}:{high}")
        if low > hosts:
            raise self.fail("rendezvous.nodes", f"asks for at least {low} node(s); the inventory lists {hosts}")
        return low, high

    def conf(self, value: Any) -> tuple[tuple[str, str], ...]:
        if value is None:
            return ()
        if not isinstance(value, dict):
            raise self.fail("rendezvous.conf", f"must be a mapping of key: value (torchrun's --rdzv-conf), got "
                            f"{self.show(value, False)}")
        pairs = []
        for key, raw in value.items():
            where = f"rendezvous.conf.{key}"
            if not isinstance(key, str) or not _CONF_KEY.match(key):
                raise self.fail(where, f"{self.show(key, False)} is not a --rdzv-conf key "
                                "(lower-case letters, digits, _)")
            if key in OWN_CONF:
                raise self.fail(where, "is set by the launcher: the first host holds the rendezvous store")
            text = ("1" if raw else "0") if isinstance(raw, bool) else self.word(raw, where)
            if not _CONF_VALUE.match(text):
                raise self.fail(where, f"must be a number or a word without spaces or commas, got {_shown(text)}")
            pairs.append((key, text))
        return tuple(pairs)

    def count(self, value: Any, entry: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(entry, f"must be a whole number, 0 or more, got {self.show(value, False)}")
        if value > MAX_RETRIES:
            raise self.fail(entry, f"must be at most {MAX_RETRIES}, got {self.show(value, False)}")
        return value

    def resume_args(self, value: Any) -> tuple[str, ...]:
        if value is None:
            return DEFAULT_RESUME_ARGS
        if not isinstance(value, list):
            raise self.fail("job.resume_args",
                            f"must be a list of words (added on a retry), got {self.show(value, False)}")
        return tuple(self.word(a, f"job.resume_args[{i}]") for i, a in enumerate(value))


def _shown(text: str) -> str:
    return repr(text if len(text) <= 70 else text[:69] + "…")
