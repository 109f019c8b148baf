"""DeepSpeed/MPI hostfiles (`worker-1 slots=8`, one host a line) -> the same validated `Cluster` as an inventory.

Pure: the only file read is the one `load_hosts` is given. A hostfile says names and slots; everything else comes
from `defaults` (invoke.yaml's `launcher.defaults`) and `job`, checked exactly as an inventory's would be.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from os.path import dirname
from pathlib import Path
from typing import Any

from launcher.config.inventory import cluster_from_data, is_host_name, parse_inventory, read_hosts_file
from launcher.config.model import Cluster
from launcher.config.text import shown
from launcher.errors import InventoryError
from launcher.options import MAX_NPROC_PER_NODE

DEFAULTS_SOURCE = "invoke.yaml"
"""Where the `defaults` and `job` given to a hostfile come from, for messages (`invoke.yaml: launcher.defaults...`)."""
HOSTFILE_SETTINGS = ("ssh_config", "host_key_policy")
"""Keys of `defaults` that are a whole inventory's settings, not a host's: a hostfile has no other place for them."""
_SLOTS = re.compile(r"slots=(\d+)\Z")
_MPICH = re.compile(r"([^:]+):(\d+)\Z")  # MPICH's `host:4` (an IPv6 address has more than one colon)
_OPTION = re.compile(r"[A-Za-z_]+=\S*\Z")
_FORMAT = "a line is NAME or NAME slots=N"


def _meaningful(text: str) -> list[tuple[int, list[str]]]:
    """(line number, words) of each line that says something: comments (whole-line or trailing) and blanks go."""
    lines = []
    for number, line in enumerate(text.splitlines(), start=1):
        parts = line.split("#", 1)[0].split()
        if parts:
            lines.append((number, parts))
    return lines


def looks_like_hostfile(text: str) -> bool:
    """Whether the first meaningful line is `NAME` or `NAME slots=N` (or another `key=value`), not YAML's `key:`."""
    lines = _meaningful(text)
    if not lines:
        return False
    first, *rest = lines[0][1]
    return is_host_name(first) and not first.endswith(":") and all(_OPTION.match(word) for word in rest)


def parse_hostfile(
    text: str,
    source: str,
    defaults: Mapping[str, Any] | None = None,
    job: Mapping[str, Any] | None = None,
    *,
    defaults_source: str = DEFAULTS_SOURCE,
) -> Cluster:
    """Validate a hostfile: node ranks follow its lines; a host without slots gets defaults' nproc_per_node (or 1);
    `ssh_config` and `host_key_policy` in `defaults` are the cluster's.

    Errors in a line name `source:line`; errors in `defaults` or `job` name `defaults_source` and the key under
    `launcher.`; a relative `env_file` in `defaults` is relative to `defaults_source`'s folder.
    """
    hosts: list[dict[str, Any]] = []
    lines: dict[str, int] = {}
    seen: dict[str, int] = {}
    for number, parts in _meaningful(text):
        name, *options = parts
        mpich = _MPICH.match(name)
        if mpich and is_host_name(mpich[1]):
            raise _error(source, number, f"{shown(name)} is MPICH's NAME:N form; write {mpich[1]} slots={mpich[2]}")
        if not is_host_name(name) or name.endswith(":"):
            raise _error(source, number, f"{shown(name)} is not a host name, ssh alias or IP address ({_FORMAT})")
        if name in seen:
            raise _error(source, number, f"host {shown(name)} is listed twice (also line {seen[name]})")
        seen[name] = number
        entry = f"hosts[{len(hosts)}]"
        lines[entry] = lines[f"{entry}.name"] = number
        hosts.append({"name": name, **_slots(options, source, number)})
        if "nproc_per_node" in hosts[-1]:
            lines[f"{entry}.nproc_per_node"] = number
    if not hosts:
        raise InventoryError(source, f"no hosts: list one per line ({_FORMAT}; # starts a comment)")
    lines["hosts"] = min(lines.values())
    data: dict[str, Any] = {"hosts": hosts}
    if isinstance(defaults, Mapping):
        data["defaults"] = {k: v for k, v in defaults.items() if k not in HOSTFILE_SETTINGS}
        data.update({k: v for k, v in defaults.items() if k in HOSTFILE_SETTINGS})
    elif defaults is not None:
        data["defaults"] = defaults  # not a mapping: the inventory's check names the mistake
    if job is not None:
        data["job"] = dict(job) if isinstance(job, Mapping) else job
    try:
        return cluster_from_data(data, source, lines, folder=dirname(defaults_source))
    except InventoryError as exc:
        if exc.entry in HOSTFILE_SETTINGS:
            entry = f"launcher.defaults.{exc.entry}"
        elif exc.entry is not None and exc.entry.startswith(("defaults", "job")):
            entry = f"launcher.{exc.entry}"
        else:
            raise
        raise InventoryError(defaults_source, exc.reason, entry=entry) from None


def _error(source: str, line: int, message: str) -> InventoryError:
    return InventoryError(source, message, line=line)


def _slots(options: list[str], source: str, line: int) -> dict[str, Any]:
    """`slots=N` (at most once) as nproc_per_node; nothing when the line gives none."""
    found: dict[str, Any] = {}
    for word in options:
        if not word.startswith("slots="):
            raise _error(source, line, f"{shown(word)} is not slots=N; {_FORMAT}")
        match = _SLOTS.match(word)
        digits = "" if match is None else match[1].lstrip("0")
        if not digits:
            raise _error(source, line, f"{shown(word)} is not slots=N with N a positive integer")
        if len(digits) > 9 or int(digits) > MAX_NPROC_PER_NODE:  # int() refuses 4,300 digits: never ask it
            raise _error(
                source, line, f"{shown(word)} is more than {MAX_NPROC_PER_NODE} (worker processes on one node)"
            )
        if found:
            raise _error(source, line, "gives slots= twice")
        found["nproc_per_node"] = int(digits)
    return found


def load_hosts(
    path: str | Path,
    defaults: Mapping[str, Any] | None = None,
    job: Mapping[str, Any] | None = None,
    defaults_source: str = DEFAULTS_SOURCE,
) -> Cluster:
    """Read `path` once: a hostfile (see `looks_like_hostfile`) gets `defaults` and `job` (from the settings file
    `defaults_source`); a YAML inventory is self-contained (its own `defaults:` and `job:`; the others are not used)."""
    text = read_hosts_file(path)
    if looks_like_hostfile(text):
        return parse_hostfile(text, str(path), defaults, job, defaults_source=defaults_source)
    return parse_inventory(text, str(path))
