"""Which GPUs a run on this node sees (stdlib only, Python 3.8+), from nvidia-smi's answers
(launcher/node/common/smi.py): CUDA_VISIBLE_DEVICES read as CUDA reads it, `--include host:0,2` mapped through the value
the node already has, MIG devices, and the GPUs someone else's processes hold. The doctor's probe and `inv top` read
them alike.

The launcher sets CUDA_DEVICE_ORDER=PCI_BUS_ID for a run (unless the node or the inventory sets an order), so CUDA
numbers the GPUs as nvidia-smi does and an index means the same GPU to both (launcher/node/common/devices.py).
"""

import os
import time

from launcher.node.common import bounds, smi
from launcher.node.common.devices import VISIBLE, chosen, entries
from launcher.node.common.proc import run_of


def _seen_by(word, rows, migs):
    """The devices one CUDA_VISIBLE_DEVICES entry names: [(GPU row, MIG device or None)]."""
    if word.isdigit():
        found = [r for r in rows if r["index"] == int(word)]
    elif word.startswith("MIG-GPU-"):  # the R450/R460 form: MIG-<GPU UUID>/<GPU instance>/<compute instance>
        found = [r for r in rows if r["uuid"] == word[4:].split("/")[0]]
    elif word.startswith("MIG-"):
        return [(r, m) for r in rows for m in migs.get(r["index"], []) if m["uuid"].startswith(word)][:1]
    else:
        found = [r for r in rows if r["uuid"].startswith(word)]
    return [(r, m) for r in found[:1] for m in (migs.get(r["index"]) or [None])]


def seen(rows, migs, spec):
    """The devices a process with CUDA_VISIBLE_DEVICES=`spec` (None: unset) sees, in CUDA's order: [(row, MIG)]."""
    if spec is None:
        return [(r, m) for r in rows for m in (migs.get(r["index"]) or [None])]
    out = []
    for word in entries(spec):
        out += [pair for pair in _seen_by(word, rows, migs) if pair not in out]
    return out


def parse_rows(text):
    """nvidia-smi's GPU rows, typed: index, uuid, name, bus, driver, mig (enabled), memory and use (None where not
    reported), `unreadable` (the cell that says why, or None); and its other lines (errors said among them)."""
    rows, other = smi.csv_rows(text, smi.GPU_FIELDS)
    out = []
    for cells in rows:
        if not cells["index"].isdigit():
            other.append(", ".join(cells.values()))
            continue
        bad = [c for c in cells.values() if smi.unreadable(c)]
        out.append(
            {
                "index": int(cells["index"]),
                "uuid": cells["uuid"],
                "name": cells["name"],
                "bus": cells["pci.bus_id"],
                "driver": cells["driver_version"],
                "mig": cells["mig.mode.current"] == "Enabled",
                "memory_used_mib": smi.number(cells["memory.used"]),
                "memory_total_mib": smi.number(cells["memory.total"]),
                "utilization": smi.number(cells["utilization.gpu"]),
                "unreadable": bad[0] if bad else None,
            }
        )
    return out, other


def parse_apps(text):
    """{GPU uuid: [(pid, MiB or None)]} from `--query-compute-apps`."""
    apps = {}
    for cells in smi.csv_rows(text, smi.APP_FIELDS)[0]:
        if cells["pid"].isdigit():
            apps.setdefault(cells["gpu_uuid"], []).append((int(cells["pid"]), smi.number(cells["used_memory"])))
    return apps


def is_busy(row, pids):
    """Someone's work is on the GPU: a process, or memory or use beyond what an idle driver shows."""
    return (
        bool(pids)
        or (row["memory_used_mib"] or 0) > bounds.GPU_BUSY_MIB
        or (row["utilization"] or 0) > bounds.GPU_BUSY_PERCENT
    )


def ask_gpus(timeout):
    """Start the probe's nvidia-smi queries (GPUs, compute processes, the MIG listing); None: no nvidia-smi."""
    exe = smi.path()
    return None if exe is None else smi.Asked(exe, (smi.GPU_QUERY, smi.APP_QUERY, smi.LIST_QUERY), timeout)


def _device(cuda, row, mig, apps):
    pids = [pid for pid, _ in apps.get(row["uuid"], [])]
    item = {
        "cuda": cuda,
        "index": row["index"],
        "uuid": row["uuid"],
        "name": row["name"],
        "pids": pids,
        "runs": sorted({r for r in (run_of(p) for p in pids) if r}),
        "unreadable": row["unreadable"],
        "memory_used_mib": row["memory_used_mib"],
        "utilization": row["utilization"],
    }
    if mig is not None:  # a slice: the parent's memory and use are every tenant's, so they say nothing of it
        item.update(mig=mig["uuid"], mig_name=mig["name"], busy=None)
    else:
        item["busy"] = row["unreadable"] is None and is_busy(row, pids)
    return item


def gpu_info(asked, spec, indices):
    """The probe's `gpus`: what the run sees (`devices`, in CUDA's order; `count`, what torch.cuda.device_count()
    says: one MIG device a process), the driver, MIG, busy and unreadable GPUs; `error` where nothing was read."""
    if asked is None:
        return {"smi": False, "count": 0, "total": 0, "busy": None}
    answers, error = asked.collect()
    if error is not None:  # `late`: it used its whole bound (a slow probe is nvidia-smi's, not python's)
        return {"smi": True, "count": 0, "total": 0, "busy": None, "error": error, "late": asked.late}
    (code, text), (_, apps_text), (_, listing) = answers
    rows, other = parse_rows(text)
    if not rows and code != 0:
        return {
            "smi": True,
            "count": 0,
            "total": 0,
            "busy": None,
            "error": "nvidia-smi failed (exit %d): %s" % (code, (other or ["no output"])[-1]),
        }
    spec, why = chosen(spec, indices)
    pairs = seen(rows, smi.mig_devices(listing) if any(r["mig"] for r in rows) else {}, spec)
    apps = parse_apps(apps_text)
    devices = [_device(i, row, mig, apps) for i, (row, mig) in enumerate(pairs)]
    whole = [d for d in devices if "mig" not in d]
    info = {
        "smi": True,
        "total": len(rows),
        "count": len(whole) + (1 if len(whole) < len(devices) else 0),
        "names": sorted({d["name"] for d in devices}),
        "driver": rows[0]["driver"] if rows else None,
        "devices": devices,
        "spec": spec,
        "mig": any(r["mig"] for r in rows),
        "busy": [d for d in devices if d["busy"]],
        "unreadable": [d for d in devices if d["unreadable"]],
    }
    if why is not None:
        info["spec_error"] = why
    if code != 0 or other:  # rows, and an error beside them: a GPU it could not read (fell off the bus?)
        info["warning"] = "nvidia-smi exit %d: %s" % (code, (other or ["no message"])[-1])
    return info


def visible_spec(request):
    """The CUDA_VISIBLE_DEVICES a run would start with here: the inventory's env (in the request), else the node's
    own (what its login and setup lines set)."""
    given = request.get("cuda_visible_devices")
    return given if given is not None else os.environ.get(VISIBLE)


def run_gpus(rows, apps, spec, ranks):
    """`inv top`'s GPUs of a run: those its ranks use (local rank i takes the i-th GPU it sees) and those its
    processes are on (`ranks`: {pid: global rank}, its ranks' and their helpers'), each with the ranks on it; a GPU
    that cannot be read keeps its row, saying why."""
    pairs = seen(rows, {}, spec)
    used = [row for row, _ in pairs[: len(set(ranks.values()))]]
    found = []
    for row in rows:
        on = sorted({ranks[pid] for pid, _ in apps.get(row["uuid"], []) if pid in ranks})
        if row not in used and not on:
            continue
        found.append(
            {
                "index": row["index"],
                "ranks": on,
                "error": row["unreadable"],
                "util_percent": None if row["utilization"] is None else int(row["utilization"]),
                "mem_used_bytes": _bytes(row["memory_used_mib"]),
                "mem_total_bytes": _bytes(row["memory_total_mib"]),
            }
        )
    return found


def _bytes(mib):
    return None if mib is None else int(mib * 1024 * 1024)


class GpuWatch:
    """`inv top`'s GPUs off its snapshot path: a daemon thread asks nvidia-smi every `refresh_s` (each call within
    `timeout`, never two at once) and keeps the last answer; a snapshot takes it with its age (`view`)."""

    def __init__(self, timeout, refresh_s):
        import threading

        self.timeout, self.refresh_s = timeout, refresh_s
        self.exe = smi.path()
        self.answers, self.at, self.error, self.asked = None, None, None, None
        self.started = time.monotonic()
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        if self.exe is not None:
            threading.Thread(target=self._loop, daemon=True, name="gpus").start()

    def _loop(self):
        while not self.stopped.is_set():
            asked = smi.Asked(self.exe, (smi.GPU_QUERY, smi.APP_QUERY), self.timeout)
            with self.lock:
                self.asked = asked
            answers, error = asked.collect()
            with self.lock:
                self.asked = None
                if error is None:
                    self.answers, self.at = answers, time.monotonic()
                self.error = error
            self.stopped.wait(self.refresh_s)

    def answered(self):
        """Whether a view now would say something of the GPUs: there is no nvidia-smi, or it answered or failed."""
        with self.lock:
            return self.exe is None or self.at is not None or self.error is not None

    def close(self):
        """No more calls; one under way is ended (its session killed)."""
        self.stopped.set()
        with self.lock:
            if self.asked is not None:
                self.asked.stop()

    def view(self, ranks, spec):
        """{"gpus": the run's GPUs (`run_gpus`) or None, "gpus_age_s": how old that answer is, "gpus_error": why
        there is none or it is old}: no nvidia-smi, no GPU column."""
        if self.exe is None:
            return {"gpus": None, "gpus_age_s": None, "gpus_error": None}
        with self.lock:
            answers, at, error = self.answers, self.at, self.error
        now = time.monotonic()
        if answers is None:
            error = error or "no answer from nvidia-smi yet (asked %.0f s ago)" % (now - self.started)
            return {"gpus": None, "gpus_age_s": None, "gpus_error": error}
        (code, text), (_, apps_text) = answers
        rows, other = parse_rows(text)
        if not rows and code != 0:
            error = error or "nvidia-smi failed (exit %d): %s" % (code, (other or ["no output"])[-1])
        return {
            "gpus": run_gpus(rows, parse_apps(apps_text), spec, ranks),
            "gpus_age_s": round(now - at, 1),
            "gpus_error": error,
        }
