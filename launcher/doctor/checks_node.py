"""The doctor's checks of each node's own setup: SSH, the job's script (or module, or command), free disk, the clock
(its Python, torch and packages: checks_python.py; its GPUs: checks_gpu.py). Pure functions from the probes'
`Evidence` to `Finding`s."""

from __future__ import annotations

import shlex

from launcher.doctor.evidence import Evidence, Finding
from launcher.doctor.registry import check, compare, listed, probes_of
from launcher.errors import NodeFailure
from launcher.limits import MAX_CLOCK_SKEW_S, MIN_DISK_BYTES
from launcher.paths import hint
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
    major, same = compare(ev, hashes) if hashes else ("", [])
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
