"""The doctor's `gpus` check (one of the fast ones: a launch runs it too): the GPUs each node's run would use, read
by its probe (launcher/node/common/gpus.py), against what the run needs. Pure, from the probes' `Evidence` to
`Finding`s.

On each node: nvidia-smi answers (a stuck or failing driver fails); torch is a CUDA build where there are GPUs, for
a CUDA the driver supports; the GPUs the run uses are readable and nobody else's work is on them; there are as many
as nproc_per_node asks for (one MIG device a process, as CUDA shows it). Between nodes: the same GPU count (with
nproc_per_node auto a node that lost a GPU would change the world size without a word: a failure; with a number, a
warning), the same model and driver (warnings: the run works, at the pace of the slowest).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from launcher.config.model import Host
from launcher.doctor.evidence import Evidence, Finding, Status
from launcher.doctor.registry import check, compare, listed, probes_of
from launcher.limits import GPU_DRIVER_FLOOR, GPU_DRIVER_FOR_CUDA
from launcher.paths import hint

WHEELS = "https://download.pytorch.org/whl"


def version_key(text: str | None) -> tuple[int, ...]:
    """`550.54.15` as (550, 54, 15); what is not a number counts as 0."""
    return tuple(int(part) if part.isdigit() else 0 for part in (text or "").split("."))


def newest_cuda(driver: str | None) -> str | None:
    """The newest CUDA (of those torch is built for) that `driver` supports in full, or None."""
    fits = [c for c, d in GPU_DRIVER_FOR_CUDA.items() if driver and version_key(driver) >= version_key(d)]
    return max(fits, key=version_key) if fits else None


def driver_fix(host: str) -> str:
    return (
        f"look at the driver on {host}: `nvidia-smi` by hand, `dmesg | grep -i xid` for a GPU that fell off the "
        "bus; a node without GPUs needs no nvidia-smi on its PATH"
    )


def _torch_build(host: Host, probe: Mapping[str, Any], gpus: Mapping[str, Any]) -> Finding | None:
    """torch's CUDA against this node's GPUs and driver: a CPU build, or a CUDA the driver cannot run."""
    torch = probe.get("torch") or {}
    if not torch.get("version") or not torch.get("cuda_known"):
        return None  # no torch (its own finding), or its CUDA unknown
    driver, cuda, version = gpus.get("driver"), torch.get("cuda"), torch["version"]
    newest = newest_cuda(driver)
    exe = (probe.get("python") or {}).get("executable", "python")
    if cuda is None:
        wheel = f"cu{newest.replace('.', '')}" if newest else "cu<XY>"
        return Finding(
            host.name,
            "gpus",
            "fail",
            f"{gpus['count']} GPU(s) here, but torch {version} is a CPU build (torch.version.cuda is None): "
            "nproc_per_node auto would start one worker per CPU core, and these ranks would use gloo while "
            "GPU nodes use NCCL (the run waits out its process-group timeout)",
            f"install torch's CUDA build for driver {driver} (CUDA {newest or '?'} at most): `{exe} -m pip "
            f"install torch=={version.split('+')[0]} --index-url {WHEELS}/{wheel}` (a cuXY no newer that "
            "pytorch.org lists for that torch)",
        )
    floor = GPU_DRIVER_FLOOR.get(cuda.split(".")[0])
    if not driver or floor is None:
        return None
    if version_key(driver) < version_key(floor):
        return Finding(
            host.name,
            "gpus",
            "fail",
            f"torch {version} is built for CUDA {cuda}, which needs driver {floor} or newer; {host.name} "
            f"has {driver}: CUDA will not start",
            f"update the driver on {host.name}, or install a torch built for CUDA {newest or 'an older CUDA'}",
        )
    full = GPU_DRIVER_FOR_CUDA.get(".".join(cuda.split(".")[:2]))
    if full and version_key(driver) < version_key(full):
        return Finding(
            host.name,
            "gpus",
            "warn",
            f"driver {driver} is older than CUDA {cuda}'s ({full}): torch runs by CUDA's minor version "
            "compatibility, without what needs the newer driver (PTX for a newer GPU, newer APIs)",
            f"update the driver on {host.name} to {full} or newer, or install torch built for CUDA "
            f"{newest or 'an older CUDA'}",
        )
    return None


def _used(host: Host, gpus: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The devices the run uses: the first nproc_per_node it sees (local rank i takes cuda:i), all with auto."""
    devices = list(gpus.get("devices") or [])[: gpus.get("count", 0)]
    return devices if host.nproc_per_node == "auto" else devices[: int(host.nproc_per_node)]


def _holders(device: Mapping[str, Any]) -> str:
    pids = ", ".join(str(p) for p in device.get("pids") or []) or "no process visible here"
    runs = f"; launcher run {', '.join(device['runs'])}" if device.get("runs") else ""
    memory = device.get("memory_used_mib")
    use = device.get("utilization")
    return (
        f"pid {pids}{runs}; {'?' if memory is None else f'{memory:.0f}'} MiB, "
        f"{'?' if use is None else f'{use:.0f}'}% used"
    )


def _gpu_name(device: Mapping[str, Any]) -> str:
    where = f"GPU {device['index']}"
    return f"{where} (MIG {device['mig_name']} {device['mig']})" if device.get("mig") else where


def _count_problem(host: Host, gpus: Mapping[str, Any]) -> Finding | None:
    nproc, count = host.nproc_per_node, gpus.get("count", 0)
    if nproc == "auto" or int(nproc) <= count:
        return None
    if gpus.get("mig"):
        first: dict[str, Any] = next(iter(gpus.get("devices") or []), {})
        return Finding(
            host.name,
            "gpus",
            "fail",
            f"nproc_per_node is {nproc}, but CUDA shows each process one MIG device ({_gpu_name(first)}): "
            f"{nproc} ranks would share it, and NCCL refuses two ranks on one device",
            f"set nproc_per_node: 1 for {host.name}, or turn MIG off on its GPUs (`nvidia-smi -mig 0`)",
        )
    return Finding(
        host.name,
        "gpus",
        "fail",
        f"nproc_per_node is {nproc} but {count} GPU(s) visible",
        f"set nproc_per_node: {count} (or auto) for {host.name}, or expose more GPUs (CUDA_VISIBLE_DEVICES)",
    )


def _in_use(host: Host, used: list[dict[str, Any]], in_use_ok: bool) -> list[Finding]:
    """A GPU the run uses that cannot be read, or that someone's work is on (said, not failed, for `doctor --job`
    on a running job: its own run is there)."""
    out = []
    for device in used:
        if device.get("unreadable"):
            out.append(
                Finding(
                    host.name,
                    "gpus",
                    "fail",
                    f"{_gpu_name(device)} cannot be read: {device['unreadable']} (fallen off the bus?)",
                    f"`nvidia-smi -q -i {device['index']}` and `dmesg | grep -i xid` on {host.name}; reset "
                    f"it, or leave it out (--exclude {host.name}:{device['cuda']})",
                )
            )
        elif device.get("busy"):
            out.append(
                Finding(
                    host.name,
                    "gpus",
                    "ok" if in_use_ok else "fail",
                    f"{_gpu_name(device)} (cuda:{device['cuda']} for this run) is in use: {_holders(device)}",
                    ""
                    if in_use_ok
                    else f"stop those processes (`nvidia-smi` on {host.name}; a launcher run: "
                    f"`{hint('stop --run ID', 'api.run(HOSTS, ID).stop()')}`), or leave the GPU out "
                    f"(--exclude {host.name}:{device['cuda']})",
                )
            )
    return out


def _summary(host: Host, gpus: Mapping[str, Any], used: list[dict[str, Any]]) -> str:
    names = ", ".join(gpus.get("names") or [])
    text = f"{gpus['count']} GPU(s) {names}, driver {gpus.get('driver')}, nproc_per_node {host.nproc_per_node}"
    if gpus.get("mig") and used and used[0].get("mig"):
        text += f"; MIG: each process sees one MIG device, {_gpu_name(used[0])}"
    others = [d for d in gpus.get("devices") or [] if d.get("busy") and d not in used]
    if others:
        text += f"; {', '.join(_gpu_name(d) for d in others)} busy, not this run's"
    return text


def _node(host: Host, probe: Mapping[str, Any], in_use_ok: bool) -> list[Finding]:
    """One node's GPUs against its torch, its nproc_per_node and what else runs on them."""
    gpus, name = probe.get("gpus"), host.name
    if gpus is None:
        return []
    if not gpus.get("smi") or (not gpus.get("error") and not gpus.get("total")):
        extra = "; nproc_per_node auto starts one worker per CPU core" if host.nproc_per_node == "auto" else ""
        return [Finding(name, "gpus", "ok", f"no GPUs: gloo on CPU{extra}")]
    if gpus.get("error"):
        return [Finding(name, "gpus", "fail", gpus["error"], driver_fix(name))]
    if gpus.get("spec_error"):
        return [
            Finding(
                name,
                "gpus",
                "fail",
                gpus["spec_error"],
                f"name GPUs that {name} shows (`--include {name}:0` is its first), or the whole host",
            )
        ]
    if gpus["count"] == 0:
        return [
            Finding(
                name,
                "gpus",
                "fail",
                f"nvidia-smi lists {gpus['total']} GPU(s), but CUDA_VISIBLE_DEVICES="
                f"{gpus.get('spec')} names none: this node's run would see no GPU (gloo here, NCCL elsewhere)",
                "set CUDA_VISIBLE_DEVICES to indices or UUIDs that `nvidia-smi -L` lists, or unset it",
            )
        ]
    used = _used(host, gpus)
    found = [f for f in (_torch_build(host, probe, gpus), _count_problem(host, gpus)) if f is not None]
    found += _in_use(host, used, in_use_ok)
    if gpus.get("warning"):
        found.append(Finding(name, "gpus", "warn", gpus["warning"], driver_fix(name)))
    if not any(f.status == "fail" for f in found):
        found.insert(0, Finding(name, "gpus", "ok", _summary(host, gpus, used)))
    return found


def _between(ev: Evidence, gpus: Mapping[str, Mapping[str, Any]]) -> list[Finding]:
    """Each node's GPU count, model and driver against the majority's."""
    hosts = {h.name: h for h in ev.cluster.hosts}
    out = []
    counts = {h: g.get("count", 0) for h, g in gpus.items()}
    major, same = compare(ev, counts)
    for h, count in counts.items():
        if count == major:
            continue
        auto = hosts[h].nproc_per_node == "auto"
        status: Status
        if not count or not major:  # GPUs on some nodes only: their ranks use NCCL, the others gloo
            why, status = "; its ranks and the others' would pick different backends (NCCL, gloo)", "fail"
        else:
            why = (
                ": with nproc_per_node auto it starts that many workers, so the world size and the global batch "
                "change without a word"
                if auto
                else ": one lost (off the bus) or taken?"
            )
            status = "fail" if auto else "warn"
        out.append(
            Finding(
                h,
                "gpus",
                status,
                f"{count} GPU(s) here, {major} on {listed(same)}{why}",
                f"`nvidia-smi -L` and `dmesg | grep -i xid` on {h}; set nproc_per_node to a number every "
                f"node gives, or leave {h} out (--exclude {h})",
            )
        )
    for key, what, fix in (
        ("names", "GPU model", "the slowest GPU paces every step of the run: run on one model"),
        ("driver", "driver", "install the same driver everywhere"),
    ):
        values = {
            h: ", ".join(g[key]) if isinstance(g.get(key), list) else g.get(key) for h, g in gpus.items() if g.get(key)
        }
        top, alike = compare(ev, values) if values else (None, [])
        out += [
            Finding(h, "gpus", "warn", f"{what} {v} here, {top} on {listed(alike)}", fix)
            for h, v in values.items()
            if v != top
        ]
    return out


@check("gpus", fast=True)
def check_gpus(ev: Evidence) -> list[Finding]:
    """Each node's GPUs are readable, free, enough for nproc_per_node, run by a torch built for their driver; and
    alike between nodes."""
    probes = probes_of(ev)
    out: list[Finding] = []
    for host in ev.cluster.hosts:
        if host.name in probes:
            out += _node(host, probes[host.name], ev.gpus_in_use)
    read = {
        h: p["gpus"]
        for h, p in probes.items()
        if (p.get("gpus") or {}).get("smi") is not None and not p["gpus"].get("error")
    }
    return out + (_between(ev, read) if len(read) > 1 else [])
