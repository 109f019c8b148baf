"""The doctor's checks of each node's own setup: SSH, Python, torch (and CUDA/NCCL), the job's script (or module,
or command), installed packages, free disk, the clock (its GPUs: checks_gpu.py). Pure functions from the probes'
`Evidence` to `Finding`s."""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from launcher.config.model import Host
from launcher.doctor.evidence import Evidence, Finding, ProbeFailed
from launcher.doctor.registry import check, compare, listed, probes_of
from launcher.errors import NodeFailure
from launcher.limits import MAX_CLOCK_SKEW_S, MIN_DISK_BYTES, SLOW_PROBE_FACTOR, SLOW_PROBE_MARGIN_S, SLOW_PROBE_SHARE
from launcher.paths import hint
from launcher.transport.program import SETUP_FAILED
from launcher.units import human_bytes


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
    text, last = (failed.stderr or failed.stdout).strip(), failed.last_line
    python = host.python
    if failed.exit_code == SETUP_FAILED:  # the node's setup lines, before any python ran
        return Finding(
            host.name,
            "python",
            "fail",
            last or "a setup line failed",
            f"fix `setup:` for {host.name} in the inventory (its lines run in the node's shell first)",
        )
    if failed.exit_code in (126, 127) or "No such file" in text:
        return Finding(
            host.name,
            "python",
            "fail",
            f"python {python} cannot run on {host.name}: {last or 'not found'}",
            f"set `python:` for {host.name} in the inventory to an interpreter that exists there "
            f"(`ssh {host.name} 'command -v python3'`)",
        )
    if failed.exit_code == -1:
        within = f"within {timeout:g} s (probe_timeout)" if timeout else "in time"
        return Finding(
            host.name,
            "python",
            "fail",
            f"the probe did not answer {within}",
            f"is {host.name} overloaded, or does its python hang at start? "
            f"try `ssh {host.name} {shlex.quote(python)} -c pass`; if it only starts slowly (a cold "
            "network filesystem), raise --probe-timeout (launcher.probe_timeout in invoke.yaml)",
        )
    return Finding(
        host.name,
        "python",
        "fail",
        f"the probe gave no answer (exit {failed.exit_code}): {last or 'no output'}",
        f"see what {python} says there: `ssh {host.name} {shlex.quote(python)} "
        f"-c 'import sys; print(sys.version)'` (the probe needs Python 3.8 or newer)",
    )


@check("python", fast=True)
def check_python(ev: Evidence) -> list[Finding]:
    """The probe ran (else why not), and every node's Python matches the majority's version."""
    out = []
    for host in ev.cluster.hosts:
        outcome = ev.outcomes.get(host.name)
        if isinstance(outcome, ProbeFailed):
            out.append(_probe_failure(host, outcome, ev.probe_timeout))
    probes = probes_of(ev)
    if not probes:
        return out
    full = {h: p["python"]["version"] for h, p in probes.items()}
    minor = {h: ".".join(v.split(".")[:2]) for h, v in full.items()}
    major_minor, _ = compare(ev, minor)
    major_full, same_full = compare(ev, {h: v for h, v in full.items() if minor[h] == major_minor})
    for h, p in probes.items():
        if minor[h] != major_minor:
            same = [x for x, v in minor.items() if v == major_minor]
            out.append(
                Finding(
                    h,
                    "python",
                    "fail",
                    f"Python {full[h]} here, {major_minor} on {listed(same)}",
                    f"point `python` for {h} at a Python {major_minor} interpreter "
                    f"(like {probes[same[0]]['python']['executable']} on {same[0]})",
                )
            )
        elif full[h] != major_full:
            out.append(
                Finding(
                    h,
                    "python",
                    "warn",
                    f"Python {full[h]} here, {major_full} on {listed(same_full)}",
                    f"use the same Python build everywhere ({major_full}) to rule out subtle differences",
                )
            )
        else:
            out.append(
                Finding(
                    h,
                    "python",
                    "ok",
                    f"Python {full[h]} ({_interpreter(p['python'])})",
                    note=bool(p["python"].get("wrapper")),
                )
            )
    return out + _slow_probes(ev, probes)


def _interpreter(python: Mapping[str, Any]) -> str:
    """The interpreter a node runs, and the wrapper it runs through (`python:` a script, a shim): fine either way,
    since the launcher stops a run by its session and its mark, never by the pid it started."""
    wrapper = python.get("wrapper")
    if not wrapper:
        return str(python["executable"])
    how = "execs it" if wrapper.get("execs") else "does not exec (it stays as python's parent)"
    return f"{wrapper['runs']} through {wrapper['path']}, a wrapper that {how}: fine"


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


def _slow_probes(ev: Evidence, probes: Mapping[str, Any]) -> list[Finding]:
    """A warning for each answered probe slower than `slow_probe_limit`, with its time and the others'."""
    times = {h: ev.probe_times[h] for h in probes if h in ev.probe_times}
    limit = slow_probe_limit(times.values(), ev.probe_timeout)
    # A probe that waited out nvidia-smi's bound is slow for that reason: its gpus finding says so, not its python.
    times = {h: t for h, t in times.items() if not (probes[h].get("gpus") or {}).get("late")}
    normal = [t for t in times.values() if t <= limit]
    allowed = f"{ev.probe_timeout:g} s" if ev.probe_timeout else "its limit"
    out = []
    for h, took in times.items():
        if took <= limit:
            continue
        others = f"the others {_seconds_range(normal)}" if normal else f"of the {allowed} allowed"
        out.append(
            Finding(
                h,
                "python",
                "warn",
                f"{h}'s probe took {took:.1f} s ({others}): a cold start of its python (a network "
                "filesystem?) or a loaded node; launch will wait for it",
                f"nothing to do if it was a cold start; otherwise look at {h}'s load (`ssh {h} uptime`) "
                f"and where its python lives; the doctor and launch wait up to --probe-timeout ({allowed} "
                "now) for a probe",
            )
        )
    return out


@check("torch", fast=True)
def check_torch(ev: Evidence) -> list[Finding]:
    """torch is installed everywhere, at the same version, CUDA build and NCCL."""
    probes = probes_of(ev)
    out = []
    have = {h: p["torch"]["version"] for h, p in probes.items() if p["torch"].get("version")}
    major, same = compare(ev, have) if have else (None, [])
    cuda = {
        h: probes[h]["torch"].get("cuda") or "none"
        for h in have
        if have[h] == major and probes[h]["torch"].get("cuda_known")
    }
    major_cuda, same_cuda = compare(ev, cuda) if cuda else (None, [])
    nccl = {h: probes[h]["torch"]["nccl"] for h in have if probes[h]["torch"].get("nccl")}
    major_nccl, same_nccl = compare(ev, nccl) if nccl else (None, [])
    for h, p in probes.items():
        exe = p["python"]["executable"]
        if h not in have:
            hint = f"install torch=={major} there" if major else "install torch there"
            out.append(
                Finding(
                    h,
                    "torch",
                    "fail",
                    f"torch is not installed for {exe}",
                    f"{hint} (`{exe} -m pip install torch`), or point `python` for {h} at the "
                    "interpreter of the environment that has it",
                )
            )
        elif have[h] != major:
            out.append(
                Finding(
                    h,
                    "torch",
                    "fail",
                    f"torch {have[h]} here, {major} on {listed(same)}",
                    f"install torch=={major} for {exe} on {h} (`{exe} -m pip install torch=={major}`), "
                    f"or point its `python` at an environment that has it",
                )
            )
        elif h in cuda and cuda[h] != major_cuda:
            out.append(
                Finding(
                    h,
                    "torch",
                    "fail",
                    f"torch built for CUDA {cuda[h]} here, {major_cuda} on {listed(same_cuda)}",
                    f"install the same torch build (CUDA {major_cuda}) on {h}",
                )
            )
        elif h in nccl and nccl[h] != major_nccl:
            out.append(
                Finding(
                    h,
                    "torch",
                    "warn",
                    f"NCCL {nccl[h]} here, {major_nccl} on {listed(same_nccl)}",
                    f"install the same NCCL ({major_nccl}) on {h}: mixed NCCL versions can hang",
                )
            )
        else:
            extra = f", CUDA {cuda.get(h, '?')}" + (f", NCCL {nccl[h]}" if h in nccl else "")
            out.append(Finding(h, "torch", "ok", f"torch {have[h]}{extra}"))
    return out


@check("script", fast=True)
def check_script(ev: Evidence) -> list[Finding]:
    """What the job runs is there on every node, whichever form it takes: its script (the same sha256 everywhere),
    its module (importable by the node's python) or its command (on the node's PATH)."""
    job = ev.cluster.job
    if job is None:
        return []
    form, value = job.form
    return _script_findings(ev, value) if form == "script" else _found_findings(ev, form, value)


def _script_findings(ev: Evidence, script: str) -> list[Finding]:
    probes = {h: p for h, p in probes_of(ev).items() if p.get("script") is not None}
    hashes = {h: p["script"]["sha256"] for h, p in probes.items() if p["script"].get("sha256")}
    major, same = compare(ev, hashes) if hashes else (None, [])
    ref = same[0] if same else None
    out = []
    for h, p in probes.items():
        info = p["script"]
        workdir = p["workdir"]["path"]
        source = (
            f"e.g. `rsync -a {ref}:{shlex.quote(probes[ref]['workdir']['path'])}/ {h}:{shlex.quote(workdir)}/`"
            if ref
            else f"`{hint('launch --sync')}` sends this project's tree"
        )
        if h not in hashes:
            where = info["path"] if p["workdir"]["exists"] else f"{info['path']} (workdir {workdir} does not exist)"
            out.append(
                Finding(
                    h,
                    "script",
                    "fail",
                    f"{script} is missing on {h}: {where}",
                    _missing_fix(ev, h, source, ref is not None),
                )
            )
        elif hashes[h] != major:
            out.append(
                Finding(
                    h,
                    "script",
                    "fail",
                    f"{script} differs on {h} (sha256 {hashes[h][:12]}), {listed(same)} have {major[:12]}",
                    f"sync the code so every node runs the same script ({source})",
                )
            )
        else:
            out.append(Finding(h, "script", "ok", f"{script} sha256 {hashes[h][:12]}"))
    return out


def _missing_fix(ev: Evidence, host: str, source: str, elsewhere: bool) -> str:
    """What gives `host` the script it lacks: another node's copy, this project's (`launch --sync`), or, where this
    machine lacks it too, its name to check."""
    if not elsewhere and ev.local_script is not None and not ev.local_script[1]:
        return (
            f"no node has it, nor this machine at {ev.local_script[0]}: check the script's name (--script, "
            f"job.script), or fix `workdir` for {host}"
        )
    return f"copy the code to {host} ({source}), or fix `workdir` for {host}"


def _found_findings(ev: Evidence, form: str, value: str) -> list[Finding]:
    """A module's or a command's finding on each node: where it was found, or why it cannot start there."""
    out = []
    for h, p in probes_of(ev).items():
        info = p.get(form)
        if info is None:
            continue
        if info.get("error") is None:
            out.append(Finding(h, "script", "ok", f"{form} {value}: {info.get('origin') or info.get('path')}"))
            continue
        exe, workdir = p["python"]["executable"], p["workdir"]["path"]
        if info.get("late"):
            out.append(
                Finding(
                    h,
                    "script",
                    "warn",
                    f"module {value}: not found in time on {h}: {info['error']}",
                    f"look at the folders {exe} imports from on {h} (a network filesystem that hangs?)",
                )
            )
        elif form == "module":
            out.append(
                Finding(
                    h,
                    "script",
                    "fail",
                    f"module {value} cannot be imported by {exe} on {h}: {info['error']}",
                    f"install it for {exe} on {h} (`{exe} -m pip install ...`), or put its code in the "
                    f"workdir {workdir} (launch --sync copies this project there), or set PYTHONPATH in "
                    "the inventory's env",
                )
            )
        else:
            out.append(
                Finding(
                    h,
                    "script",
                    "fail",
                    f"command {value} cannot be started on {h}: {info['error']}",
                    f"install it on {h}, give its path (absolute, or relative to the workdir {workdir}), "
                    "or put its folder on PATH (a `setup:` line, or PATH in the inventory's env)",
                )
            )
    return out


def _package_diff(mine: list[str], theirs: list[str], limit: int = 5) -> tuple[int, str]:
    a = dict(item.split("==", 1) for item in mine)
    b = dict(item.split("==", 1) for item in theirs)
    differences = [f"{n} {a[n]} (not {b[n]})" for n in sorted(a.keys() & b.keys()) if a[n] != b[n]]
    differences += [f"+{n} {a[n]}" for n in sorted(a.keys() - b.keys())]
    differences += [f"-{n} {b[n]}" for n in sorted(b.keys() - a.keys())]
    more = f" and {len(differences) - limit} more" if len(differences) > limit else ""
    shown = ", ".join(differences[:limit]) + more
    return len(differences), shown


@check("packages")
def check_packages(ev: Evidence) -> list[Finding]:
    """The same installed distributions everywhere (a warning: differences may not matter)."""
    probes = {h: p["packages"] for h, p in probes_of(ev).items() if p.get("packages")}
    if not probes:
        return []
    major, same = compare(ev, {h: p["sha256"] for h, p in probes.items()})
    ref = same[0]
    out = []
    for h, pkgs in probes.items():
        if pkgs["sha256"] == major:
            out.append(Finding(h, "packages", "ok", f"{pkgs['count']} distributions, the same as {listed(same)}"))
            continue
        count, shown = _package_diff(pkgs["list"], probes[ref]["list"])
        out.append(
            Finding(
                h,
                "packages",
                "warn",
                f"{count} difference(s) from {ref}: {shown}",
                f"install the same packages on {h} as on {ref} (compare `pip freeze` on both)",
            )
        )
    return out


@check("disk")
def check_disk(ev: Evidence) -> list[Finding]:
    """At least 1 GiB free in each node's workdir."""
    out = []
    for h, p in probes_of(ev).items():
        free = p.get("disk_free")
        if free is None:
            continue
        where = p["workdir"]["path"]
        if free < MIN_DISK_BYTES:
            out.append(
                Finding(
                    h,
                    "disk",
                    "warn",
                    f"only {human_bytes(free)} free for {where}",
                    f"free space on {h}: checkpoints and logs are written there",
                )
            )
        else:
            out.append(Finding(h, "disk", "ok", f"{human_bytes(free)} free"))
    return out


@check("clock")
def check_clock(ev: Evidence) -> list[Finding]:
    """Each node's clock within MAX_CLOCK_SKEW_S of the controller's."""
    if ev.clock is None:
        return []
    sent, received = ev.clock
    out = []
    for h, p in probes_of(ev).items():
        when = p.get("time")
        if when is None:
            continue
        # The node read its clock between `sent` and `received`: anything outside is skew (a lower bound).
        skew = when - received if when > received else (when - sent if when < sent else 0.0)
        if abs(skew) > MAX_CLOCK_SKEW_S:
            way = "ahead of" if skew > 0 else "behind"
            out.append(
                Finding(
                    h,
                    "clock",
                    "warn",
                    f"clock {abs(skew):.1f} s {way} the controller's",
                    f"enable time sync on {h} (chrony, systemd-timesyncd): logs and timeouts compare times",
                )
            )
        else:
            out.append(Finding(h, "clock", "ok", f"within {max(abs(skew), received - sent):.1f} s of the controller"))
    return out
