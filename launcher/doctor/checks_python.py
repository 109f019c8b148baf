"""The doctor's checks of each node's Python environment: its interpreter (and how long the probe took to start
there), torch with its CUDA build and NCCL, the installed packages. Pure functions from the probes' `Evidence` to
`Finding`s."""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from launcher.config.model import Host
from launcher.doctor.evidence import Evidence, Finding, ProbeFailed
from launcher.doctor.registry import check, compare, listed, probes_of
from launcher.limits import SLOW_PROBE_FACTOR, SLOW_PROBE_MARGIN_S, SLOW_PROBE_SHARE
from launcher.transport.program import SETUP_FAILED


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
        key = "python:"
        if host.container is not None:  # the host's own Python runs the launcher's programs beside the image
            python, key = host.container.host_python, "container.host_python:"
        return Finding(
            host.name,
            "python",
            "fail",
            f"python {python} cannot run on {host.name}: {last or 'not found'}",
            f"set `{key}` for {host.name} in the inventory to an interpreter that exists there "
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


@dataclass(frozen=True)
class _Compared:
    """One property of torch on the nodes that report it: each node's value, the majority's and who has it."""

    values: dict[str, str]
    major: str | None
    same: list[str]


def _compared(ev: Evidence, values: dict[str, str]) -> _Compared:
    major, same = compare(ev, values) if values else (None, [])
    return _Compared(values, major, same)


@check("torch", fast=True)
def check_torch(ev: Evidence) -> list[Finding]:
    """torch is installed everywhere, at the same version, CUDA build and NCCL."""
    probes = probes_of(ev)
    have = {h: p["torch"]["version"] for h, p in probes.items() if p["torch"].get("version")}
    version = _compared(ev, have)
    cuda = {
        h: probes[h]["torch"].get("cuda") or "none"
        for h in have
        if have[h] == version.major and probes[h]["torch"].get("cuda_known")
    }
    nccl = {h: probes[h]["torch"]["nccl"] for h in have if probes[h]["torch"].get("nccl")}
    builds = _compared(ev, cuda), _compared(ev, nccl)
    return [
        _torch_finding(h, p["python"]["executable"], version, *builds, managed=bool(p["torch"].get("managed")))
        for h, p in probes.items()
    ]


def _torch_finding(
    h: str, exe: str, version: _Compared, cuda: _Compared, nccl: _Compared, managed: bool = False
) -> Finding:
    """Node `h`'s torch against the majority's: missing, another version, another CUDA build, another NCCL, or
    the same. `managed`: `exe` is the distribution's own python, whose pip refuses to install (PEP 668)."""
    have, major = version.values, version.major
    if h not in have:
        wanted = f"torch=={major}" if major else "torch"
        fix = (
            f"make a venv with it there (`{exe} -m venv ~/venvs/train && ~/venvs/train/bin/pip install {wanted}`: "
            f"{exe} is the system's, whose pip refuses to install, PEP 668) and set `python: ~/venvs/train/bin/python` "
            f"for {h}, or point `python` at an environment that has it"
            if managed
            else f"install {wanted} there (`{exe} -m pip install {wanted}`), or point `python` for {h} at the "
            "interpreter of the environment that has it"
        )
        return Finding(h, "torch", "fail", f"torch is not installed for {exe}", fix)
    if have[h] != major:
        return Finding(
            h,
            "torch",
            "fail",
            f"torch {have[h]} here, {major} on {listed(version.same)}",
            f"install torch=={major} for {exe} on {h} (`{exe} -m pip install torch=={major}`), "
            f"or point its `python` at an environment that has it",
        )
    if h in cuda.values and cuda.values[h] != cuda.major:
        return Finding(
            h,
            "torch",
            "fail",
            f"torch built for CUDA {cuda.values[h]} here, {cuda.major} on {listed(cuda.same)}",
            f"install the same torch build (CUDA {cuda.major}) on {h}",
        )
    if h in nccl.values and nccl.values[h] != nccl.major:
        return Finding(
            h,
            "torch",
            "warn",
            f"NCCL {nccl.values[h]} here, {nccl.major} on {listed(nccl.same)}",
            f"install the same NCCL ({nccl.major}) on {h}: mixed NCCL versions can hang",
        )
    extra = f", CUDA {cuda.values.get(h, '?')}" + (f", NCCL {nccl.values[h]}" if h in nccl.values else "")
    return Finding(h, "torch", "ok", f"torch {have[h]}{extra}")


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
