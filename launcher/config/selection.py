"""`--include` / `--exclude` in DeepSpeed's syntax (`worker-1:0,2@worker-2`): a smaller `Cluster` (pure).

Hosts are separated by `@`; a host may be followed by `:` and a comma list of its GPU (local) indices. Indices
become the host's nproc_per_node and its `gpus` (ascending; a repeated index counts once, as in DeepSpeed): places
among the GPUs the node already shows, so the node's agent makes CUDA_VISIBLE_DEVICES from the value its login,
setup or the inventory's env gives (`4,5,6,7` with `:0,2` is `4,6`: a shared node's allocation is kept), or from
the indices where none is set (launcher/node/common/gpus.py `chosen`). Node ranks keep the inventory order.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping

from launcher.config.model import Cluster, Host
from launcher.config.text import shown
from launcher.errors import SelectionError


def select_hosts(cluster: Cluster, include: str | None, exclude: str | None) -> Cluster:
    """The cluster with only the hosts (and GPUs) that `include` names, or without those `exclude` names.

    None or "" means not given. Every mistake is a `SelectionError` (a PlanError, exit code 2) of one sentence
    naming the option and the host.
    """
    if include and exclude:
        raise SelectionError(cluster.source, "--include and --exclude cannot be used together; give one of them")
    if not include and not exclude:
        return cluster
    flag, spec = ("--include", include) if include else ("--exclude", exclude or "")
    wanted = _parse(cluster, flag, spec)
    kept: list[tuple[int, Host]] = []
    for i, host in enumerate(cluster.hosts):
        if include:
            if host.name in wanted:
                kept.append((i, _restrict(host, wanted[host.name], flag, spec, cluster.source)))
        elif host.name not in wanted:
            kept.append((i, host))
        elif (indices := wanted[host.name]) is not None:  # a whole host named goes entirely
            rest = _remaining(host, indices, flag, spec, cluster.source)
            if rest is not None:
                kept.append((i, rest))
    if not kept:
        raise SelectionError(cluster.source, f"{flag} {shown(spec)} leaves no host to run on")
    return _rebuilt(cluster, kept, flag, spec)


def _parse(cluster: Cluster, flag: str, spec: str) -> dict[str, frozenset[int] | None]:
    """Host name -> the indices named (None: the whole host); a host named twice gets the union."""
    names = [h.name for h in cluster.hosts]
    wanted: dict[str, frozenset[int] | None] = {}
    for piece in (p.strip() for p in spec.split("@")):
        if not piece:
            raise SelectionError(
                cluster.source, f"{flag} {shown(spec)}: a host name is empty (hosts are separated by @)"
            )
        name, indices = piece, None
        if piece not in names and ":" in piece:  # an IPv6 name keeps its colons; `name:0,2` names indices
            name, _, text = piece.rpartition(":")
            name, indices = name.strip(), _indices(text, cluster.source, flag, piece)
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"the hosts are {_listed(names)}"
            raise SelectionError(
                cluster.source, f"{flag} {shown(piece)}: no host {shown(name)} in the inventory; {hint}"
            )
        before = wanted.get(name, frozenset())
        wanted[name] = None if before is None or indices is None else before | indices
    return wanted


def _indices(text: str, source: str, flag: str, piece: str) -> frozenset[int]:
    if not text:
        raise SelectionError(
            source, f"{flag} {shown(piece)}: no GPU index after ':' (write NAME:0,1, or NAME alone for the whole host)"
        )
    found = set()
    for word in text.split(","):
        if not re.fullmatch(r"\d{1,6}", word.strip()):
            raise SelectionError(source, f"{flag} {shown(piece)}: {shown(word)} is not a GPU index (0, 1, 2, ...)")
        found.add(int(word))
    return frozenset(found)


def _check_range(host: Host, indices: frozenset[int], flag: str, piece: str, source: str) -> None:
    count = host.nproc_per_node
    if count != "auto" and max(indices) >= count:
        raise SelectionError(
            source,
            f"{flag} {shown(piece)}: {host.name} has GPU indices 0 to {count - 1} "
            f"(nproc_per_node {count}), not {max(indices)}",
        )


def _restrict(host: Host, indices: frozenset[int] | None, flag: str, spec: str, source: str) -> Host:
    """The included host: all of it, or only `indices`."""
    if indices is None:
        return host
    _check_range(host, indices, flag, _piece(spec, host.name), source)
    return _with_devices(host, sorted(indices))


def _remaining(host: Host, indices: frozenset[int], flag: str, spec: str, source: str) -> Host | None:
    """The host less the excluded `indices`; None when none are left."""
    piece = _piece(spec, host.name)
    if host.nproc_per_node == "auto":
        raise SelectionError(
            source,
            f"{flag} {shown(piece)}: {host.name}'s nproc_per_node is auto, so its GPU indices "
            "are not known; set a number in the inventory, or exclude the whole host",
        )
    _check_range(host, indices, flag, piece, source)
    rest = [i for i in range(host.nproc_per_node) if i not in indices]
    return _with_devices(host, rest) if rest else None


def _with_devices(host: Host, devices: list[int]) -> Host:
    return dataclasses.replace(host, nproc_per_node=len(devices), gpus=tuple(devices))


def _rebuilt(cluster: Cluster, kept: list[tuple[int, Host]], flag: str, spec: str) -> Cluster:
    """The cluster with the kept hosts; the master follows the first of them unless the inventory named it."""
    rdzv = cluster.rendezvous
    first = cluster.hosts[0]
    if kept[0][1].name != first.name:
        if rdzv.master_addr_explicit:
            raise SelectionError(
                cluster.source,
                f"{flag} {shown(spec)} leaves out {first.name}, node rank 0, where "
                f"rendezvous.master_addr ({rdzv.master_addr}) points; keep it, or drop master_addr from "
                "the inventory so that the first remaining host is the master",
            )
        rdzv = dataclasses.replace(rdzv, master_addr=kept[0][1].addr)
    return dataclasses.replace(
        cluster,
        hosts=tuple(host for _, host in kept),
        rendezvous=rdzv,
        lines=_renumbered(cluster.lines, [i for i, _ in kept]),
    )


def _renumbered(lines: Mapping[str, int], kept: list[int]) -> dict[str, int]:
    """Line numbers with `hosts[i]...` entries renamed to the hosts' new places (dropped hosts' entries go)."""
    new_place = {old: new for new, old in enumerate(kept)}
    out = {}
    for entry, line in lines.items():
        match = re.match(r"hosts\[(\d+)\]", entry)
        if match is None:
            out[entry] = line
        elif int(match[1]) in new_place:
            out[f"hosts[{new_place[int(match[1])]}]{entry[match.end() :]}"] = line
    return out


def _piece(spec: str, name: str) -> str:
    """The part of `spec` that names host `name` with indices (for messages)."""
    pieces = [p.strip() for p in spec.split("@")]
    return next((p for p in pieces if p.rpartition(":")[0].strip() == name), spec)


def _listed(names: list[str]) -> str:
    return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
