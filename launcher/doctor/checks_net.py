"""The doctor's checks between nodes: names (every node resolves every other alike, and no host maps its own name
to loopback), the master's port, a TCP connection to it from every node, the interface toward it. Pure."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from launcher.config.model import Cluster
from launcher.doctor.evidence import Evidence, Finding
from launcher.doctor.registry import answers_of, check, listed, majority, master_host, probes_of
from launcher.paths import hint, stop_call


@cache
def is_address(name: str) -> bool:
    """An IP address written out: it is what it resolves to, on every node. Remembered: a launch asks it of every
    host's name once for each host's probe request (65,536 times at 256 nodes, 0.12 s of parsing)."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def requested_names(cluster: Cluster) -> list[str]:
    """Every name a node must resolve: each host's addr (how peers reach it) and master_addr, less the addresses
    written out (a node would only echo them: at 256 nodes given by address, 65,536 answers for nothing)."""
    names = [h.addr for h in cluster.hosts]
    return [n for n in dict.fromkeys([*names, cluster.rendezvous.master_addr]) if not is_address(n)]


def _views(probes: Mapping[str, dict[str, Any]], name: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Per probed host: the addresses `name` resolves to there, or the error."""
    views, errors = {}, {}
    for h, p in probes.items():
        answer = p.get("resolve", {}).get(name)
        if answer is None:
            continue
        if answer.get("addrs"):
            views[h] = answer["addrs"]
        else:
            errors[h] = answer.get("error", "no address")
    return views, errors


def _consensus(ev: Evidence, name: str, views: Mapping[str, list[str]]) -> tuple[tuple[str, ...], str] | None:
    """What the peers agree `name` is (a sorted address set) and the address to put in /etc/hosts.

    A node is not asked about its own address (its /etc/hosts may hold the 127.0.1.1 trap); on a tie the view
    that holds the owner's own address wins.
    """
    owner = next((h.name for h in ev.cluster.hosts if h.addr == name), None)
    judges = {h: tuple(sorted(v)) for h, v in views.items() if h != owner} or {
        h: tuple(sorted(v)) for h, v in views.items()
    }
    if not judges:
        return None
    own = set(views.get(owner, [])) if owner else set()
    prefer = next((s for s in judges.values() if own & set(s)), None)
    chosen = majority(judges, prefer)
    first = next(views[h][0] for h, s in judges.items() if s == chosen)
    return chosen, first


@check("dns", fast=True)
def check_dns(ev: Evidence) -> list[Finding]:
    """Every node resolves master_addr and every peer's addr, to the addresses its peers agree on."""
    probes = probes_of(ev)
    problems: dict[str, list[Finding]] = {h: [] for h in probes}
    names = requested_names(ev.cluster)
    owners = {h.addr: h.name for h in reversed(ev.cluster.hosts)}  # the first host of an addr, as `next` found it
    for name in names:
        owner = owners.get(name)
        views, errors = _views(probes, name)
        agreed = _consensus(ev, name, views)
        for h, error in errors.items():
            if agreed:
                fix = f'add "{agreed[1]} {name}" to /etc/hosts on {h}'
            else:
                fix = (
                    f"no node can resolve {name}: fix the name in {ev.cluster.source}, or add it to DNS "
                    "or /etc/hosts on every node"
                )
            problems[h].append(Finding(h, "dns", "fail", f"{h} cannot resolve {name} ({error})", fix))
        for h, addrs in views.items():
            if h == owner or agreed is None or tuple(sorted(addrs)) == agreed[0]:
                continue  # a node's view of its own name is the hostname check's business
            others = [x for x, v in views.items() if tuple(sorted(v)) == agreed[0] and x != h]
            problems[h].append(
                Finding(
                    h,
                    "dns",
                    "fail",
                    f"{h} resolves {name} to {', '.join(addrs)}, {listed(others)} to {', '.join(agreed[0])}",
                    f'make {name} resolve to {agreed[1]} on {h}: "{agreed[1]} {name}" in its /etc/hosts, or fix DNS',
                )
            )
    out = []
    for h, found in problems.items():
        out += found or [
            Finding(
                h,
                "dns",
                "ok",
                f"resolves {len(names)} name(s) like its peers"
                if names
                else "every peer and the master are given by address: nothing to resolve",
            )
        ]
    return out


def _loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr == "::1"


@check("hostname", fast=True)
def check_hostname(ev: Evidence) -> list[Finding]:
    """The 127.0.1.1 trap: a node's own hostname resolves, on it, to an address its peers don't use for it."""
    out = []
    probes = probes_of(ev)
    for host in ev.cluster.hosts:
        p = probes.get(host.name)
        if p is None:
            continue
        out.append(_hostname_finding(host.name, p, _peers_view(ev, probes, host.name, host.addr)))
    return out


def _peers_view(
    ev: Evidence, probes: Mapping[str, dict[str, Any]], name: str, addr: str
) -> tuple[tuple[str, ...], str] | None:
    """Where node `name`'s peers reach it (the address set they agree `addr` is, and the address for /etc/hosts),
    or None when no peer resolved it."""
    if is_address(addr):
        return (addr,), addr  # what every peer reaches
    views, _ = _views(probes, addr)
    peer_views = {h: v for h, v in views.items() if h != name}
    return _consensus(ev, addr, peer_views) if peer_views else None


def _hostname_finding(name: str, p: Mapping[str, Any], agreed: tuple[tuple[str, ...], str] | None) -> Finding:
    """Node `name`'s own hostname as its probe `p` resolved it, against where its peers reach it (`agreed`)."""
    me = p["self"]
    hostname = me["hostname"]
    good = agreed[1] if agreed else (p.get("route") or {}).get("ip")
    lines = [line for line in me.get("hosts_lines", []) if good is None or not line.startswith(f"{good} ")]
    if me.get("error"):
        fix = (
            f'add "{good} {hostname}" to /etc/hosts on {name}'
            if good
            else f"make {hostname} resolvable on {name} (/etc/hosts or DNS)"
        )
        return Finding(
            name,
            "hostname",
            "fail",
            f"its own hostname {hostname} does not resolve there ({me['error']}): gloo cannot pick an address",
            fix,
        )
    addrs = me.get("addrs", [])
    if agreed is None or set(addrs) & set(agreed[0]):
        return Finding(name, "hostname", "ok", f"{hostname} -> {', '.join(addrs)}")
    trap = all(_loopback(a) for a in addrs)
    if lines:
        fix = f'on {name}, replace "{lines[0]}" in /etc/hosts with "{good} {hostname}"'
    else:
        fix = f'make {hostname} resolve to {good} on {name} ("{good} {hostname}" in /etc/hosts)'
    detail = f"{hostname} resolves to {', '.join(addrs)} on {name}, but its peers reach it at {', '.join(agreed[0])}"
    if trap:
        return Finding(
            name,
            "hostname",
            "fail",
            f"{detail}: gloo there would listen on {addrs[0]}, which they cannot reach",
            fix,
        )
    return Finding(
        name,
        "hostname",
        "warn",
        f"{detail}: gloo there would use {addrs[0]}; make sure the others can reach it",
        fix,
    )


@check("port", fast=True)
def check_port(ev: Evidence) -> list[Finding]:
    """master_port is free on the master (its listen-mode probe could bind it)."""
    master = master_host(ev)
    port = ev.cluster.rendezvous.master_port
    listener = ev.listener
    if listener is None or master.name not in answers_of(ev):
        return []  # the master is unreachable or its python failed: those findings say it
    if "failed" in listener:
        return [
            Finding(
                master.name,
                "port",
                "fail",
                f"could not check port {port}: {listener['failed']}",
                f"retry; if it persists run `ssh {master.name} ss -ltnp 'sport = :{port}'`",
            )
        ]
    if listener.get("free"):
        return [Finding(master.name, "port", "ok", f"port {port} is free on {master.name}")]
    holders = listener.get("holders") or []
    who = "; ".join(_held_by(h) for h in holders)
    states = listener.get("states") or []
    why = who or (
        "something listens on it"
        if "listening" in states
        else "a socket listens on it (perhaps in another container or network namespace)"
    )
    runs = [h for h in holders if h.get("run")]
    stop = (
        _stop_run(ev, runs[0])
        if runs
        else f"stop pid {holders[0]['pid']} on {master.name}"
        if holders
        else f"find its owner with `ss -ltnp 'sport = :{port}'` on {master.name}"
    )
    return [
        Finding(
            master.name,
            "port",
            "fail",
            f"master_port {port} is taken on {master.name} ({listener.get('error', 'in use')}): {why}",
            f"{stop}, or set rendezvous.master_port to a free port",
        )
    ]


def _stop_run(ev: Evidence, holder: Mapping[str, Any]) -> str:
    """How to stop the launcher run that holds the port, saying whose it is: its user, and the inventory it was
    started from where that is not this one (the command that stops it names that inventory)."""
    run_id = holder["run"].partition("/")[0]
    theirs = holder.get("inventory")
    ours = str(Path(ev.cluster.source).resolve())
    hosts = ev.cluster.source if theirs in (None, ours) else theirs
    said = [
        f"{holder['user']}'s" if holder.get("user") else "",
        "started from this inventory" if theirs == ours else f"started from {theirs}" if theirs else "",
    ]
    whose = ", ".join(x for x in said if x)
    stop = hint(f"stop --hosts {hosts} --run {run_id}", stop_call(hosts, run_id))
    return f"stop run {run_id} ({whose}{': ' if whose else ''}`{stop}`)"


def _held_by(holder: Mapping[str, Any]) -> str:
    """One holder of the port in words: its pid, who it is and its socket's state; a run that is starting holds no
    socket yet (launcher/node/probe/listener.py `runs_starting`): its torchrun binds the port once it is up."""
    if holder.get("state") == "starting":
        return f"launcher run {holder['run'].partition('/')[0]} is starting there; its torchrun binds it once up"
    return f"pid {holder['pid']} ({_holder(holder)}) {holder['state']}"


def _holder(holder: Mapping[str, Any]) -> str:
    """A port holder as a person knows it: the launcher run it belongs to (torchrun's store), or its command."""
    if holder.get("run"):
        return f"launcher run {holder['run'].partition('/')[0]}: {holder['command'][:40] or '?'}"
    return holder["command"][:60] or "?"


@check("tcp", fast=True)
def check_tcp(ev: Evidence) -> list[Finding]:
    """Every node opened a TCP connection to master_addr:master_port and reached our listener."""
    listener = ev.listener
    if not listener or not listener.get("free"):
        return []  # no listener of ours was up: the port finding says why
    master = master_host(ev)
    rdzv = ev.cluster.rendezvous
    target = f"{rdzv.master_addr}:{rdzv.master_port}"
    out = []
    for h, p in answers_of(ev).items():  # a container host's check is made on the host, whatever its image did
        tcp = p.get("tcp")
        if tcp is None:
            continue
        if tcp.get("ok"):
            took = tcp.get("elapsed", 0.0)
            out.append(Finding(h, "tcp", "ok", f"reached {target} ({tcp.get('peer')}) in {took:.2f} s"))
            continue
        error = tcp.get("error", "failed")
        if error.startswith("cannot resolve"):
            fix = f"make {rdzv.master_addr} resolvable on {h} (see its dns finding)"
        elif error.startswith("something else"):
            fix = (
                f"{rdzv.master_addr} leads to another machine from {h}: it must be {master.name}'s address "
                f"(check DNS or /etc/hosts on {h})"
            )
        elif error.startswith("connected to"):
            fix = (
                f"check that {rdzv.master_addr} is {master.name}'s address on {h} (DNS or /etc/hosts); "
                f"if it is, {master.name} was too busy to answer: run the doctor again"
            )
        else:
            fix = (
                f"let {h} reach TCP port {rdzv.master_port} on {master.name} (firewall, security group), "
                f"and check that {rdzv.master_addr} resolves to {master.name}'s address there"
            )
        out.append(Finding(h, "tcp", "fail", f"{h} cannot open a TCP connection to {target}: {error}", fix))
    return out


@check("iface")
def check_iface(ev: Evidence) -> list[Finding]:
    """The interface and address each node would use toward master_addr."""
    out = []
    master_addr = ev.cluster.rendezvous.master_addr
    for h, p in probes_of(ev).items():
        route = p.get("route")
        if route is None:
            continue
        if route.get("error", "").startswith("gai error"):
            continue  # master_addr does not resolve there: the dns finding says so
        if route.get("error"):
            out.append(
                Finding(
                    h,
                    "iface",
                    "warn",
                    f"no route toward {master_addr}: {route['error']}",
                    f"check {h}'s routes and name resolution for {master_addr}",
                )
            )
        else:
            out.append(
                Finding(
                    h,
                    "iface",
                    "ok",
                    f"{route.get('iface') or '?'} {route['ip']} toward {master_addr} "
                    "(for NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME)",
                )
            )
    return out
