"""The doctor's `image` check (a fast one: a launch runs it too) on the container hosts (`container:`): the node's
runtime is there and usable by its user, the image is there, it is the same image on every node (its id, the
config's digest), the probe ran inside it, and a node with NVIDIA GPUs shows them inside. Pure, from the `container`
part of each container host's answer (launcher/node/probe/image.py) to `Finding`s; the versions inside the image are
the python and torch checks', unchanged.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from launcher.config.model import Host
from launcher.doctor.evidence import Evidence, Finding
from launcher.doctor.registry import check, compare, listed
from launcher.paths import hint
from launcher.plan.containerplan import SETUP_FAILED

CDI_FIX = "`sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` (NVIDIA Container Toolkit)"
TOOLKIT_FIX = (
    "install the NVIDIA Container Toolkit and set it up for docker (`sudo nvidia-ctk runtime configure "
    "--runtime=docker`, then restart docker): the launcher passes `--gpus all`"
)
_CREATED = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:\.\d+)?\s*(Z|[+-]\d\d:?\d\d)?")


def short_id(image_id: str) -> str:
    """`sha256:` and the first 12 hex digits, as podman and docker both show an image (podman's Id has no prefix)."""
    return "sha256:" + image_id.removeprefix("sha256:")[:12]


def created_at(text: str | None) -> datetime | None:
    """The image's creation time from the runtime's RFC 3339 (`2001-09-09T01:46:40Z`, nanoseconds, an offset), or
    podman's own `2001-09-09 01:46:40 +0000 UTC`."""
    match = _CREATED.match(text or "")
    if match is None:
        return None
    zone = (match.group(7) or "Z").replace(":", "")
    offset = timedelta(0) if zone == "Z" else timedelta(hours=int(zone[1:3]), minutes=int(zone[3:5]))
    year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
    local = timezone(-offset if zone.startswith("-") else offset)
    return datetime(year, month, day, hour, minute, second, tzinfo=local).astimezone(timezone.utc)


def apart(mine: datetime, theirs: datetime) -> str:
    """How long before or after `theirs` `mine` was built, in the unit a person would use."""
    seconds = (mine - theirs).total_seconds()
    way, span = ("before" if seconds < 0 else "after"), abs(seconds)
    if span < 1:
        return "at the same second as"
    for unit, size, up_to in (("second", 1, 120), ("minute", 60, 7200), ("hour", 3600, 172800)):
        if span < up_to:
            count = round(span / size)
            return f"{count} {unit}{'s' if count != 1 else ''} {way}"
    return f"{round(span / 86400)} days {way}"


@check("image", fast=True, containers=True)
def check_image(ev: Evidence) -> list[Finding]:
    """Each container host's runtime and image, then the same image on every node that has it."""
    out, ready = [], {}
    for host in ev.cluster.hosts:
        answer = ev.outcomes.get(host.name)
        if not isinstance(answer, dict) or not answer.get("container"):
            continue
        facts = answer["container"]
        problem = _node_problem(host, facts) or _gpus_inside(host, facts, answer)
        if problem is not None:
            out.append(problem)
        else:
            ready[host.name] = facts
    return out + _same_image(ev, ready)


def _node_problem(host: Host, facts: Mapping[str, Any]) -> Finding | None:
    """What keeps `host` from running the image: no runtime, one its user may not use, no image, no probe inside."""
    h, image = host.name, facts.get("image", "?")
    if not facts.get("runtime"):
        wanted = facts.get("wanted", "podman or docker")
        return Finding(
            h,
            "image",
            "fail",
            f"{h}: no {wanted} on PATH",
            f"install {wanted} on {h} (Debian: `apt-get install podman`), or put its folder on the PATH its logins "
            "get" + ("" if wanted == "podman or docker" else ", or set container.runtime: auto"),
        )
    kind = facts.get("kind", "podman")
    if not facts.get("usable"):
        return Finding(
            h,
            "image",
            "fail",
            f"{kind} is not usable by this user on {h}: {facts.get('unusable')}",
            _unusable_fix(h, kind, str(facts.get("unusable") or "")),
        )
    if not facts.get("present"):
        return Finding(
            h,
            "image",
            "fail",
            f"{image} is not on {h} ({kind}: {facts.get('missing') or 'not found'})",
            f"`{hint('launch --pull')}` (or `{hint('doctor --pull')}`) pulls it on every node first; or "
            f"`{kind} pull {image}` on {h}",
        )
    failed = facts.get("probe_failed")
    return None if not failed else _probe_failed(host, facts, failed)


def _unusable_fix(h: str, kind: str, why: str) -> str:
    if kind == "docker":
        if "permission denied" in why.lower():
            return f"let the user use docker on {h} (`sudo usermod -aG docker $USER`, then log in again)"
        return (
            f"start docker's daemon on {h} (`sudo systemctl start docker`), or use podman there "
            "(container.runtime: podman)"
        )
    return (
        f"rootless podman needs the uidmap package (newuidmap) and the user's lines in /etc/subuid and /etc/subgid on "
        f"{h}; `podman info` there says what is missing"
    )


def _probe_failed(host: Host, facts: Mapping[str, Any], failed: Mapping[str, Any]) -> Finding:
    """Why the probe gave no answer inside the image: GPUs the runtime cannot give, the setup lines, no python, or
    the runtime's own words."""
    h, image, kind = host.name, facts.get("image", "?"), facts.get("kind", "podman")
    text = f"{failed.get('stderr', '')}\n{failed.get('stdout', '')}"
    last = _said(text)
    code = failed.get("exit_code")
    if "cdi" in text.lower() and kind == "podman":
        return Finding(
            h,
            "image",
            "fail",
            f"podman cannot give {h}'s GPUs to {image}: {last}",
            f"write the CDI spec of {h}'s GPUs: {CDI_FIX}",
        )
    if kind == "docker" and ("device driver" in text or "nvidia-container" in text):
        return Finding(h, "image", "fail", f"docker cannot give {h}'s GPUs to {image}: {last}", f"{TOOLKIT_FIX} on {h}")
    if code == SETUP_FAILED and "setup line" in text:
        return Finding(
            h,
            "image",
            "fail",
            last,
            f"fix `setup:` for {h} in the inventory (its lines run in the image's shell, before its python)",
        )
    if code == -1:
        return Finding(
            h,
            "image",
            "fail",
            f"the probe in {image} did not answer in time on {h}",
            "is the node loaded, or the image's python slow to start? raise --probe-timeout",
        )
    python = shlex.quote(host.python)
    if code == 127 or "exec:" in last or "executable file not found" in text:  # runc's words on the command
        return Finding(
            h,
            "image",
            "fail",
            f"python {host.python} cannot run in {image} on {h}: {last}",
            f"set `python:` for {h} to the image's interpreter (`{kind} run --rm {image} which python3`), "
            "or check container.mounts",
        )
    return Finding(
        h,
        "image",
        "fail",
        f"the probe could not run in {image} on {h} (exit {code}): {last}",
        f"run it by hand on {h} to see: `{kind} run --rm {image} {python} -c pass`; check "
        "container.options and container.mounts",
    )


def _said(text: str) -> str:
    """The line that says why: the runtime's words on the command it could not start (podman 4.3 follows them with
    conmon's noise), else the last."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return next((line for line in lines if "exec:" in line), lines[-1] if lines else "no output")


def _gpus_inside(host: Host, facts: Mapping[str, Any], answer: Mapping[str, Any]) -> Finding | None:
    """A node with NVIDIA devices whose image sees no GPU: the runtime was not given them."""
    gpus = answer.get("gpus") or {}
    if not facts.get("nvidia_device") or gpus.get("count"):
        return None
    h, image, kind = host.name, facts.get("image", "?"), facts.get("kind", "podman")
    seen = f" ({gpus['error']})" if gpus.get("error") else "" if gpus.get("smi") else " (no nvidia-smi inside)"
    if kind == "docker":
        fix = f"{TOOLKIT_FIX} on {h}"
    else:
        specs = ", ".join(facts.get("cdi") or []) or "none in /etc/cdi or /var/run/cdi"
        fix = f"write the CDI spec of {h}'s GPUs (specs there now: {specs}): {CDI_FIX}; the launcher passes " + (
            "`--device nvidia.com/gpu=all`"
        )
    return Finding(h, "image", "fail", f"{h} has NVIDIA GPUs (/dev/nvidiactl), but {image} sees none{seen}", fix)


def _same_image(ev: Evidence, ready: Mapping[str, Mapping[str, Any]]) -> list[Finding]:
    """The nodes that name one image reference have one image: the majority's id, and each node that differs."""
    out = []
    for image in dict.fromkeys(facts["image"] for facts in ready.values()):
        group = {h: facts for h, facts in ready.items() if facts["image"] == image}
        ids = {h: str(facts.get("id")) for h, facts in group.items()}
        major, same = compare(ev, ids)
        built = created_at(group[same[0]].get("created"))
        for h, facts in group.items():
            if ids[h] == major:
                when = f", built {built:%Y-%m-%d %H:%M} UTC" if built else ""
                where = "every node" if len(same) == len(ev.cluster.hosts) else listed(same)
                detail = f"{image} {short_id(major)}{when}, the same on {where} ({facts.get('kind')})"
                out.append(Finding(h, "image", "ok", detail, note=h == same[0]))
                continue
            out.append(_differs(h, image, facts, group, ids, same))
    return out


def _differs(
    h: str,
    image: str,
    facts: Mapping[str, Any],
    group: Mapping[str, Mapping[str, Any]],
    ids: Mapping[str, str],
    same: list[str],
) -> Finding:
    major = ids[same[0]]
    others = "the others'" if set(same) == set(group) - {h} else f"{listed(same)}'s"
    mine, theirs = created_at(facts.get("created")), created_at(group[same[0]].get("created"))
    when = f"built {apart(mine, theirs)} {others}" if mine and theirs else f"not {others}"
    kind = facts.get("kind", "podman")
    return Finding(
        h,
        "image",
        "fail",
        f"{h} has {image} = {short_id(ids[h])}, {when} {short_id(major)}",
        f"give every node the same image: `{hint('launch --pull')}` pulls {image} on every node from its "
        f"registry; an image built on the nodes: build or load it again on {h} (`{kind} save` where it is right, "
        f"`{kind} load` on {h}); naming it by digest (`name@sha256:...`) pins one image",
    )
