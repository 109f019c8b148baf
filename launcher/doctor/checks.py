"""The doctor's checks: pure functions from the probes' `Evidence` to `Finding`s, each registered once by name."""

from __future__ import annotations

import shlex
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.config.model import Cluster, Host
from launcher.doctor.evidence import Evidence, Finding, ProbeFailed
from launcher.errors import NodeFailure
from launcher.transport.program import SETUP_FAILED

MIN_DISK_BYTES = 1 << 30
MAX_CLOCK_SKEW_S = 5.0
SLOW_PROBE_MARGIN_S = 2.0
"""A slow probe answered at least this much later than the typical node's (above SSH and interpreter-start noise)."""
SLOW_PROBE_FACTOR = 2.0
"""... and took at least this many times as long (a load every node shares is nobody's fault)."""
SLOW_PROBE_SHARE = 0.5
"""A probe that used more than this share of probe_timeout is slow whatever its peers took: the next may not fit."""

CheckFunction = Callable[[Evidence], list[Finding]]


@dataclass(frozen=True)
class Check:
    """A registered check: its name (a column of the table), whether `launch` runs it first, and its function."""

    name: str
    fast: bool
    run: CheckFunction


_REGISTRY: dict[str, Check] = {}
"""Name -> check, in registration order: the order of the definitions below is the order of the table's columns."""


def check(name: str, *, fast: bool = False) -> Callable[[CheckFunction], CheckFunction]:
    """Register the decorated function as the check `name`; `fast` puts it in the launch's preflight."""

    def register(function: CheckFunction) -> CheckFunction:
        if name in _REGISTRY:
            raise ValueError(f"the doctor check {name!r} is registered twice")
        _REGISTRY[name] = Check(name, fast, function)
        return function

    return register


# --------------------------------------------------------------------------------------------------------
# Small helpers.


def _names(hosts: Iterable[str], limit: int = 4) -> str:
    hosts = list(hosts)
    if len(hosts) <= limit:
        return ", ".join(hosts)
    return f"{', '.join(hosts[:limit])} and {len(hosts) - limit} more"


def _majority(values: Mapping[str, Any], prefer: Any = None) -> Any:
    """The most common value; a tie goes to `prefer` when it is among the tied, else to the first seen."""
    counts = Counter(values.values())
    best = max(counts.values())
    tied = [v for v, c in counts.items() if c == best]
    return prefer if prefer in tied else tied[0]


def _probes(ev: Evidence) -> dict[str, dict[str, Any]]:
    """The hosts whose probe answered, in inventory order."""
    return {h.name: o for h in ev.cluster.hosts if isinstance(o := ev.outcomes.get(h.name), dict)}


def _master(ev: Evidence) -> Host:
    """torchrun's rendezvous store runs on node rank 0: the first host."""
    return ev.cluster.hosts[0]


def _compare(ev: Evidence, values: Mapping[str, Any]) -> tuple[Any, list[str]]:
    """The majority value (ties: the master's) and the hosts that have it."""
    major = _majority(values, values.get(_master(ev).name))
    return major, [h for h, v in values.items() if v == major]


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable


def slow_probe_limit(times: Iterable[float], timeout: float | None) -> float:
    """Seconds above which an answered probe is slow (a warning with its time, never a failure).

    Slow means an outlier among its peers: both SLOW_PROBE_MARGIN_S later and SLOW_PROBE_FACTOR times longer than
    the typical node (the lower median, so that a minority of slow nodes, or one of two, does not set the norm);
    or past SLOW_PROBE_SHARE of `timeout`, whatever the others took. So 64 nodes that share one slow start (2
    cores, one cold filesystem) are not warned about until they pass half the limit, while a lone cold node is.
    """
    values = list(times)
    if not values:
        return float("inf")
    typical = statistics.median_low(values)
    limit = max(typical + SLOW_PROBE_MARGIN_S, typical * SLOW_PROBE_FACTOR)
    return min(limit, timeout * SLOW_PROBE_SHARE) if timeout else limit


def _seconds_range(times: list[float]) -> str:
    low, high = f"{min(times):.1f}", f"{max(times):.1f}"
    return f"{low} s" if low == high else f"{low}-{high} s"


def requested_names(cluster: Cluster) -> list[str]:
    """Every name a node must resolve: each host's addr (how peers reach it) and master_addr."""
    names = [h.addr for h in cluster.hosts]
    return list(dict.fromkeys([*names, cluster.rendezvous.master_addr]))


# --------------------------------------------------------------------------------------------------------
# The checks: each a pure function of the evidence.


@check("ssh", fast=True)
def check_ssh(ev: Evidence) -> list[Finding]:
    """Each node's SSH connection: its typed failure and fix, or connected."""
    out = []
    for host in ev.cluster.hosts:
        outcome = ev.outcomes.get(host.name)
        if isinstance(outcome, NodeFailure):
            out.append(Finding(host.name, "ssh", "fail", f"{outcome.kind}: {outcome.detail}", outcome.fix))
        elif outcome is not None:
            out.append(Finding(host.name, "ssh", "ok", "connected"))
    return out


def _probe_failure(host: Host, failed: ProbeFailed, timeout: float | None) -> Finding:
    text = (failed.stderr or failed.stdout).strip()
    last = text.splitlines()[-1] if text else ""
    python = host.python
    if failed.exit_code == SETUP_FAILED:  # the node's setup lines, before any python ran
        return Finding(host.name, "python", "fail", last or "a setup line failed",
                       f"fix `setup:` for {host.name} in the inventory (its lines run in the node's shell first)")
    if failed.exit_code in (126, 127) or "No such file" in text:
        return Finding(host.name, "python", "fail", f"python {python} cannot run on {host.name}: {last or 'not found'}",
                       f"set `python:` for {host.name} in the inventory to an interpreter that exists there "
                       f"(`ssh {host.name} 'command -v python3'`)")
    if failed.exit_code == -1:
        within = f"within {timeout:g} s (probe_timeout)" if timeout else "in time"
        return Finding(host.name, "python", "fail", f"the probe did not answer {within}",
                       f"is {host.name} overloaded, or does its python hang at start? "
                       f"try `ssh {host.name} {shlex.quote(python)} -c pass`; if it only starts slowly (a cold "
                       "network filesystem), raise --probe-timeout (launcher.probe_timeout in invoke.yaml)")
    return Finding(host.name, "python", "fail", f"the probe failed (exit {failed.exit_code}): {last or 'no output'}",
                   f"run `ssh {host.name} {shlex.quote(python)} -V`: the probe needs Python 3.8 or newer")


@check("python", fast=True)
def check_python(ev: Evidence) -> list[Finding]:
    """The probe ran (else why not), and every node's Python matches the majority's version."""
    out = []
    for host in ev.cluster.hosts:
        outcome = ev.outcomes.get(host.name)
        if isinstance(outcome, ProbeFailed):
            out.append(_probe_failure(host, outcome, ev.probe_timeout))
    probes = _probes(ev)
    if not probes:
        return out
    full = {h: p["python"]["version"] for h, p in probes.items()}
    minor = {h: ".".join(v.split(".")[:2]) for h, v in full.items()}
    major_minor, _ = _compare(ev, minor)
    major_full, same_full = _compare(ev, {h: v for h, v in full.items() if minor[h] == major_minor})
    for h, p in probes.items():
        exe = p["python"]["executable"]
        if minor[h] != major_minor:
            same = [x for x, v in minor.items() if v == major_minor]
            out.append(Finding(h, "python", "fail",
                               f"Python {full[h]} here, {major_minor} on {_names(same)}",
                               f"point `python` for {h} at a Python {major_minor} interpreter "
                               f"(like {probes[same[0]]['python']['executable']} on {same[0]})"))
        elif full[h] != major_full:
            out.append(Finding(h, "python", "warn", f"Python {full[h]} here, {major_full} on {_names(same_full)}",
                               f"use the same Python build everywhere ({major_full}) to rule out subtle differences"))
        else:
            out.append(Finding(h, "python", "ok", f"Python {full[h]} ({exe})"))
    return out + _slow_probes(ev, probes)


def _slow_probes(ev: Evidence, probes: Mapping[str, Any]) -> list[Finding]:
    """A warning for each answered probe slower than `slow_probe_limit`, with its time and the others'."""
    times = {h: ev.probe_times[h] for h in probes if h in ev.probe_times}
    limit = slow_probe_limit(times.values(), ev.probe_timeout)
    normal = [t for t in times.values() if t <= limit]
    allowed = f"{ev.probe_timeout:g} s" if ev.probe_timeout else "its limit"
    out = []
    for h, took in times.items():
        if took <= limit:
            continue
        others = f"the others {_seconds_range(normal)}" if normal else f"of the {allowed} allowed"
        out.append(Finding(h, "python", "warn",
                           f"{h}'s probe took {took:.1f} s ({others}): a cold start of its python (a network "
                           "filesystem?) or a loaded node; launch will wait for it",
                           f"nothing to do if it was a cold start; otherwise look at {h}'s load (`ssh {h} uptime`) "
                           f"and where its python lives; the doctor and launch wait up to --probe-timeout ({allowed} "
                           "now) for a probe"))
    return out


@check("torch", fast=True)
def check_torch(ev: Evidence) -> list[Finding]:
    """torch is installed everywhere, at the same version, CUDA build and NCCL."""
    probes = _probes(ev)
    out = []
    have = {h: p["torch"]["version"] for h, p in probes.items() if p["torch"].get("version")}
    major, same = _compare(ev, have) if have else (None, [])
    cuda = {h: probes[h]["torch"].get("cuda") or "none" for h in have
            if have[h] == major and probes[h]["torch"].get("cuda_known")}
    major_cuda, same_cuda = _compare(ev, cuda) if cuda else (None, [])
    nccl = {h: probes[h]["torch"]["nccl"] for h in have if probes[h]["torch"].get("nccl")}
    major_nccl, same_nccl = _compare(ev, nccl) if nccl else (None, [])
    for h, p in probes.items():
        exe = p["python"]["executable"]
        if h not in have:
            hint = f"install torch=={major} there" if major else "install torch there"
            out.append(Finding(h, "torch", "fail", f"torch is not installed for {exe}",
                               f"{hint} (`{exe} -m pip install torch`), or point `python` for {h} at the "
                               "interpreter of the environment that has it"))
        elif have[h] != major:
            out.append(Finding(h, "torch", "fail", f"torch {have[h]} here, {major} on {_names(same)}",
                               f"install torch=={major} for {exe} on {h} (`{exe} -m pip install torch=={major}`), "
                               f"or point its `python` at an environment that has it"))
        elif h in cuda and cuda[h] != major_cuda:
            out.append(Finding(h, "torch", "fail", f"torch built for CUDA {cuda[h]} here, {major_cuda} on "
                               f"{_names(same_cuda)}", f"install the same torch build (CUDA {major_cuda}) on {h}"))
        elif h in nccl and nccl[h] != major_nccl:
            out.append(Finding(h, "torch", "warn", f"NCCL {nccl[h]} here, {major_nccl} on {_names(same_nccl)}",
                               f"install the same NCCL ({major_nccl}) on {h}: mixed NCCL versions can hang"))
        else:
            extra = f", CUDA {cuda.get(h, '?')}" + (f", NCCL {nccl[h]}" if h in nccl else "")
            out.append(Finding(h, "torch", "ok", f"torch {have[h]}{extra}"))
    return out


def _views(ev: Evidence, name: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Per probed host: the addresses `name` resolves to there, or the error."""
    views, errors = {}, {}
    for h, p in _probes(ev).items():
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
        h: tuple(sorted(v)) for h, v in views.items()}
    if not judges:
        return None
    own = set(views.get(owner, [])) if owner else set()
    prefer = next((s for s in judges.values() if own & set(s)), None)
    chosen = _majority(judges, prefer)
    first = next(views[h][0] for h, s in judges.items() if s == chosen)
    return chosen, first


@check("dns", fast=True)
def check_dns(ev: Evidence) -> list[Finding]:
    """Every node resolves master_addr and every peer's addr, to the addresses its peers agree on."""
    problems: dict[str, list[Finding]] = {h: [] for h in _probes(ev)}
    names = requested_names(ev.cluster)
    for name in names:
        owner = next((h.name for h in ev.cluster.hosts if h.addr == name), None)
        views, errors = _views(ev, name)
        agreed = _consensus(ev, name, views)
        for h, error in errors.items():
            if agreed:
                fix = f'add "{agreed[1]} {name}" to /etc/hosts on {h}'
            else:
                fix = (f"no node can resolve {name}: fix the name in {ev.cluster.source}, or add it to DNS "
                       "or /etc/hosts on every node")
            problems[h].append(Finding(h, "dns", "fail", f"{h} cannot resolve {name} ({error})", fix))
        for h, addrs in views.items():
            if h == owner or agreed is None or tuple(sorted(addrs)) == agreed[0]:
                continue  # a node's view of its own name is the hostname check's business
            others = [x for x, v in views.items() if tuple(sorted(v)) == agreed[0] and x != h]
            problems[h].append(Finding(
                h, "dns", "fail",
                f"{h} resolves {name} to {', '.join(addrs)}, {_names(others)} to {', '.join(agreed[0])}",
                f'make {name} resolve to {agreed[1]} on {h}: "{agreed[1]} {name}" in its /etc/hosts, or fix DNS'))
    out = []
    for h, found in problems.items():
        out += found or [Finding(h, "dns", "ok", f"resolves {len(names)} name(s) like its peers")]
    return out


def _loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr == "::1"


@check("hostname", fast=True)
def check_hostname(ev: Evidence) -> list[Finding]:
    """The 127.0.1.1 trap: a node's own hostname resolves, on it, to an address its peers don't use for it."""
    out = []
    for host in ev.cluster.hosts:
        p = _probes(ev).get(host.name)
        if p is None:
            continue
        me = p["self"]
        hostname = me["hostname"]
        views, _ = _views(ev, host.addr)
        peer_views = {h: v for h, v in views.items() if h != host.name}
        agreed = _consensus(ev, host.addr, peer_views) if peer_views else None
        good = agreed[1] if agreed else (p.get("route") or {}).get("ip")
        lines = [line for line in me.get("hosts_lines", []) if good is None or not line.startswith(f"{good} ")]
        if me.get("error"):
            fix = f'add "{good} {hostname}" to /etc/hosts on {host.name}' if good else \
                f"make {hostname} resolvable on {host.name} (/etc/hosts or DNS)"
            out.append(Finding(host.name, "hostname", "fail",
                               f"its own hostname {hostname} does not resolve there ({me['error']}): "
                               "gloo cannot pick an address", fix))
            continue
        addrs = me.get("addrs", [])
        if agreed is None or set(addrs) & set(agreed[0]):
            out.append(Finding(host.name, "hostname", "ok", f"{hostname} -> {', '.join(addrs)}"))
            continue
        trap = all(_loopback(a) for a in addrs)
        if lines:
            fix = f'on {host.name}, replace "{lines[0]}" in /etc/hosts with "{good} {hostname}"'
        else:
            fix = f'make {hostname} resolve to {good} on {host.name} ("{good} {hostname}" in /etc/hosts)'
        detail = (f"{hostname} resolves to {', '.join(addrs)} on {host.name}, but its peers reach it at "
                  f"{', '.join(agreed[0])}")
        if trap:
            out.append(Finding(host.name, "hostname", "fail",
                               f"{detail}: gloo there would listen on {addrs[0]}, which they cannot reach", fix))
        else:
            out.append(Finding(host.name, "hostname", "warn",
                               f"{detail}: gloo there would use {addrs[0]}; make sure the others can reach it", fix))
    return out


@check("port", fast=True)
def check_port(ev: Evidence) -> list[Finding]:
    """master_port is free on the master (its listen-mode probe could bind it)."""
    master = _master(ev)
    port = ev.cluster.rendezvous.master_port
    listener = ev.listener
    if listener is None or master.name not in _probes(ev):
        return []  # the master is unreachable or its python failed: those findings say it
    if "failed" in listener:
        return [Finding(master.name, "port", "fail", f"could not check port {port}: {listener['failed']}",
                        f"retry; if it persists run `ssh {master.name} ss -ltnp 'sport = :{port}'`")]
    if listener.get("free"):
        return [Finding(master.name, "port", "ok", f"port {port} is free on {master.name}")]
    holders = listener.get("holders") or []
    who = "; ".join(f"pid {h['pid']} ({h['command'][:60] or '?'}) {h['state']}" for h in holders)
    states = listener.get("states") or []
    why = who or ("something listens on it" if "listening" in states else
                  "a socket listens on it (perhaps in another container or network namespace)")
    stop = f"stop pid {holders[0]['pid']}" if holders else f"find its owner with `ss -ltnp 'sport = :{port}'`"
    return [Finding(master.name, "port", "fail",
                    f"master_port {port} is taken on {master.name} ({listener.get('error', 'in use')}): {why}",
                    f"{stop} on {master.name}, or set rendezvous.master_port to a free port")]


@check("tcp", fast=True)
def check_tcp(ev: Evidence) -> list[Finding]:
    """Every node opened a TCP connection to master_addr:master_port and reached our listener."""
    listener = ev.listener
    if not listener or not listener.get("free"):
        return []  # no listener of ours was up: the port finding says why
    master = _master(ev)
    rdzv = ev.cluster.rendezvous
    target = f"{rdzv.master_addr}:{rdzv.master_port}"
    out = []
    for h, p in _probes(ev).items():
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
            fix = (f"{rdzv.master_addr} leads to another machine from {h}: it must be {master.name}'s address "
                   f"(check DNS or /etc/hosts on {h})")
        elif error.startswith("connected to"):
            fix = (f"check that {rdzv.master_addr} is {master.name}'s address on {h} (DNS or /etc/hosts); "
                   f"if it is, {master.name} was too busy to answer: run the doctor again")
        else:
            fix = (f"let {h} reach TCP port {rdzv.master_port} on {master.name} (firewall, security group), "
                   f"and check that {rdzv.master_addr} resolves to {master.name}'s address there")
        out.append(Finding(h, "tcp", "fail", f"{h} cannot open a TCP connection to {target}: {error}", fix))
    return out


@check("script", fast=True)
def check_script(ev: Evidence) -> list[Finding]:
    """The job's script exists on every node, with the same sha256."""
    job = ev.cluster.job
    if job is None:
        return []
    probes = {h: p for h, p in _probes(ev).items() if p.get("script") is not None}
    hashes = {h: p["script"]["sha256"] for h, p in probes.items() if p["script"].get("sha256")}
    major, same = _compare(ev, hashes) if hashes else (None, [])
    ref = same[0] if same else None
    out = []
    for h, p in probes.items():
        info = p["script"]
        workdir = p["workdir"]["path"]
        source = f"e.g. `rsync -a {ref}:{shlex.quote(probes[ref]['workdir']['path'])}/ {h}:{shlex.quote(workdir)}/`" \
            if ref else "from your checkout"
        if h not in hashes:
            where = info["path"] if p["workdir"]["exists"] else f"{info['path']} (workdir {workdir} does not exist)"
            out.append(Finding(h, "script", "fail", f"{job.script} is missing on {h}: {where}",
                               f"copy the code to {h} ({source}), or fix `workdir` for {h}"))
        elif hashes[h] != major:
            out.append(Finding(h, "script", "fail",
                               f"{job.script} differs on {h} (sha256 {hashes[h][:12]}), "
                               f"{_names(same)} have {major[:12]}",
                               f"sync the code so every node runs the same script ({source})"))
        else:
            out.append(Finding(h, "script", "ok", f"{job.script} sha256 {hashes[h][:12]}"))
    return out


@check("gpus")
def check_gpus(ev: Evidence) -> list[Finding]:
    """Enough visible GPUs for nproc_per_node, and none busy."""
    out = []
    for host in ev.cluster.hosts:
        gpus = (_probes(ev).get(host.name) or {}).get("gpus")
        if gpus is None:
            continue
        nproc = host.nproc_per_node
        count = gpus.get("count", 0)
        if gpus.get("error"):
            out.append(Finding(host.name, "gpus", "warn", gpus["error"],
                               f"check the driver on {host.name} (`nvidia-smi`)"))
        elif count == 0:
            extra = "; nproc_per_node auto starts one worker per CPU core" if nproc == "auto" else ""
            out.append(Finding(host.name, "gpus", "ok", f"no GPUs: gloo on CPU{extra}"))
        elif nproc != "auto" and int(nproc) > count:
            out.append(Finding(host.name, "gpus", "fail", f"nproc_per_node is {nproc} but {count} GPU(s) visible",
                               f"set nproc_per_node: {count} (or auto) for {host.name}, or expose more GPUs "
                               "(CUDA_VISIBLE_DEVICES)"))
        else:
            names = ", ".join(gpus.get("names") or [])
            out.append(Finding(host.name, "gpus", "ok", f"{count} GPU(s) {names}, nproc_per_node {nproc}".strip()))
        for busy in gpus.get("busy") or []:
            pids = ", ".join(str(p) for p in busy.get("pids", [])) or "no pid visible"
            out.append(Finding(host.name, "gpus", "warn",
                               f"GPU {busy['index']} is busy ({pids}; {busy.get('memory_used_mib') or 0:.0f} MiB, "
                               f"{busy.get('utilization') or 0:.0f}% used)",
                               f"wait for those processes or stop them before launching (`nvidia-smi` on {host.name})"))
    return out


def _package_diff(mine: list[str], theirs: list[str], limit: int = 5) -> tuple[int, str]:
    a = dict(item.split("==", 1) for item in mine)
    b = dict(item.split("==", 1) for item in theirs)
    words = [f"{n} {a[n]} (not {b[n]})" for n in sorted(a.keys() & b.keys()) if a[n] != b[n]]
    words += [f"+{n} {a[n]}" for n in sorted(a.keys() - b.keys())]
    words += [f"-{n} {b[n]}" for n in sorted(b.keys() - a.keys())]
    shown = ", ".join(words[:limit]) + (f" and {len(words) - limit} more" if len(words) > limit else "")
    return len(words), shown


@check("packages")
def check_packages(ev: Evidence) -> list[Finding]:
    """The same installed distributions everywhere (a warning: differences may not matter)."""
    probes = {h: p["packages"] for h, p in _probes(ev).items() if p.get("packages")}
    if not probes:
        return []
    major, same = _compare(ev, {h: p["sha256"] for h, p in probes.items()})
    ref = same[0]
    out = []
    for h, pkgs in probes.items():
        if pkgs["sha256"] == major:
            out.append(Finding(h, "packages", "ok", f"{pkgs['count']} distributions, the same as {_names(same)}"))
            continue
        count, shown = _package_diff(pkgs["list"], probes[ref]["list"])
        out.append(Finding(h, "packages", "warn", f"{count} difference(s) from {ref}: {shown}",
                           f"install the same packages on {h} as on {ref} (compare `pip freeze` on both)"))
    return out


@check("disk")
def check_disk(ev: Evidence) -> list[Finding]:
    """At least 1 GiB free in each node's workdir."""
    out = []
    for h, p in _probes(ev).items():
        free = p.get("disk_free")
        if free is None:
            continue
        where = p["workdir"]["path"]
        if free < MIN_DISK_BYTES:
            out.append(Finding(h, "disk", "warn", f"only {_human_bytes(free)} free for {where}",
                               f"free space on {h}: checkpoints and logs are written there"))
        else:
            out.append(Finding(h, "disk", "ok", f"{_human_bytes(free)} free"))
    return out


@check("clock")
def check_clock(ev: Evidence) -> list[Finding]:
    """Each node's clock within MAX_CLOCK_SKEW_S of the controller's."""
    if ev.clock is None:
        return []
    sent, received = ev.clock
    out = []
    for h, p in _probes(ev).items():
        when = p.get("time")
        if when is None:
            continue
        # The node read its clock between `sent` and `received`: anything outside is skew (a lower bound).
        skew = when - received if when > received else (when - sent if when < sent else 0.0)
        if abs(skew) > MAX_CLOCK_SKEW_S:
            way = "ahead of" if skew > 0 else "behind"
            out.append(Finding(h, "clock", "warn", f"clock {abs(skew):.1f} s {way} the controller's",
                               f"enable time sync on {h} (chrony, systemd-timesyncd): logs and timeouts compare times"))
        else:
            out.append(Finding(h, "clock", "ok", f"within {max(abs(skew), received - sent):.1f} s of the controller"))
    return out


@check("iface")
def check_iface(ev: Evidence) -> list[Finding]:
    """The interface and address each node would use toward master_addr."""
    out = []
    master_addr = ev.cluster.rendezvous.master_addr
    for h, p in _probes(ev).items():
        route = p.get("route")
        if route is None:
            continue
        if route.get("error", "").startswith("gai error"):
            continue  # master_addr does not resolve there: the dns finding says so
        if route.get("error"):
            out.append(Finding(h, "iface", "warn", f"no route toward {master_addr}: {route['error']}",
                               f"check {h}'s routes and name resolution for {master_addr}"))
        else:
            out.append(Finding(h, "iface", "ok", f"{route.get('iface') or '?'} {route['ip']} toward {master_addr} "
                               "(for NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME)"))
    return out


CHECKS: tuple[str, ...] = tuple(_REGISTRY)
"""Every check, in column order."""
FAST_CHECKS: tuple[str, ...] = tuple(name for name, c in _REGISTRY.items() if c.fast)
"""What matters for starting a run: `launch` checks these before it starts anything."""


def selected_checks(checks: str) -> tuple[str, ...]:
    """The names of the checks a mode runs: "all" or "fast"."""
    if checks == "all":
        return CHECKS
    if checks == "fast":
        return FAST_CHECKS
    raise ValueError(f"checks must be 'all' or 'fast', got {checks!r}")


def evaluate(ev: Evidence, checks: str = "all") -> list[Finding]:
    """Run the selected checks; findings in inventory order, then check order."""
    names = selected_checks(checks)
    findings = [f for name in names for f in _REGISTRY[name].run(ev)]
    order = {h.name: i for i, h in enumerate(ev.cluster.hosts)}
    return sorted(findings, key=lambda f: (order.get(f.host, len(order)), names.index(f.check)))
