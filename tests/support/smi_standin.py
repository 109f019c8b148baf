"""A stand-in for nvidia-smi (no GPU here): a real program on a node's PATH that answers the queries the launcher
makes in nvidia-smi's own formats, from a JSON file beside it (written by tests/support/gpus.py `install_smi`).

Formats, as NVIDIA's nvidia-smi prints them (`nvidia-smi --help-query-gpu`, `--help-query-compute-apps`):
- `--query-gpu=F1,F2,... --format=csv,noheader,nounits`: a line per GPU, `, ` between fields, `[N/A]` where the
  board does not report a field (utilisation under MIG), `[GPU requires reset]` or `[Unknown Error]` where a GPU
  cannot be read; a field it does not know: `Field "x" is not a valid field to query.`, exit 2.
- `--query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits`: a line per process with a CUDA
  context, nothing when there is none.
- `-L`: `GPU 0: NAME (UUID: GPU-...)`, and under a MIG-enabled GPU `  MIG 3g.40gb     Device  0: (UUID: MIG-...)`.
- a driver that does not answer: `NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. ...`
  on stdout, exit 9.
Modes (`mode` in the JSON): "ok"; "driver" (the failure above); "hang" (it never answers, and a child it started
keeps its stdout open after it is killed: a wait for end of file would block, as with one stuck in the driver);
"lost" (the rows it can read, then `Unable to determine the device handle for GPU...: Unknown Error`, exit 15).
`apps: "ranks"` lists each launcher rank on this node (a process whose environment has RANK, LOCAL_RANK and the
launcher's mark) on the GPU its LOCAL_RANK picks among those its CUDA_VISIBLE_DEVICES shows: as the driver sees
the workers' CUDA contexts.
"""

import json
import os
import sys
import time

GPU_FIELDS = {"index": "index", "uuid": "uuid", "name": "name", "pci.bus_id": "bus", "driver_version": "driver",
              "mig.mode.current": "mig", "memory.used": "used", "memory.total": "total", "utilization.gpu": "util"}
APP_FIELDS = ("pid", "gpu_uuid", "used_memory")
FORMAT = "--format=csv,noheader,nounits"


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
    except OSError:
        return {}


def parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def rank_apps(gpus):
    """(pid, GPU uuid, MiB) of each launcher rank here, on the GPU its LOCAL_RANK picks."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        env = environ(int(entry))
        if b"DDP_LAUNCHER_RUN" not in env or b"LOCAL_RANK" not in env or b"RANK" in environ(parent(int(entry))):
            continue  # not a rank, or a rank's helper (its parent has the same RANK)
        shown = env.get(b"CUDA_VISIBLE_DEVICES", b"").decode()
        indices = [int(w) for w in shown.split(",") if w.strip().isdigit()] if shown else [g["index"] for g in gpus]
        local = int(env[b"LOCAL_RANK"])
        gpu = next((g for g in gpus if local < len(indices) and g["index"] == indices[local]), None)
        if gpu is not None:
            found.append((int(entry), gpu["uuid"], 2048))
    return found


def compute_apps(spec):
    """(pid, GPU uuid, MiB) of each compute process the spec lists, or of the launcher's ranks here."""
    if spec.get("apps") == "ranks":
        return rank_apps(spec["gpus"])
    return [(a["pid"], spec["gpus"][a["gpu"]]["uuid"], a["used"]) for a in spec.get("apps", [])]


def gpu_rows(spec, fields):
    """A GPU's memory.used is its own (the driver's) and its compute processes' together, as the driver counts it."""
    apps = compute_apps(spec)
    for gpu in spec["gpus"]:
        held = sum(used for _, uuid, used in apps if uuid == gpu["uuid"])
        values = dict(gpu, used=gpu["used"] + held if isinstance(gpu["used"], int) else gpu["used"])
        cells = []
        for field in fields:
            value = values.get("error") or values[GPU_FIELDS[field]] if field not in ("index", "uuid") else gpu[field]
            cells.append(str(value))
        print(", ".join(cells))


def hang():
    if os.fork() == 0:  # the child keeps stdout open after its parent is killed
        time.sleep(60)
        os._exit(0)
    time.sleep(60)


def main():
    spec_path, args = sys.argv[1], sys.argv[2:]
    with open(spec_path) as handle:
        spec = json.load(handle)
    with open(spec_path + ".calls", "a") as calls:  # what the launcher asked, for the tests
        calls.write(" ".join(args) + "\n")
    mode = spec.get("mode", "ok")
    if mode == "hang":
        hang()
    if mode == "driver":
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
              "NVIDIA driver is installed and running.")
        return 9
    if args == ["-L"]:
        for gpu in spec["gpus"]:
            print(f"GPU {gpu['index']}: {gpu['name']} (UUID: {gpu['uuid']})")
            for i, mig in enumerate(spec.get("mig", {}).get(str(gpu["index"]), [])):
                print(f"  MIG {mig['name']:<12}Device {i:>2}: (UUID: {mig['uuid']})")
        return 0
    query = next((a for a in args if a.startswith("--query-")), None)
    if query is None or FORMAT not in args:
        print("stand-in: only `-L` and --query-...=... --format=csv,noheader,nounits")
        return 2
    kind, _, wanted = query.partition("=")
    fields = wanted.split(",")
    known = GPU_FIELDS if kind == "--query-gpu" else APP_FIELDS
    for field in fields:
        if field not in known:
            print(f'Field "{field}" is not a valid field to query.')
            return 2
    if kind == "--query-gpu":
        gpu_rows(spec, fields)
    else:
        for pid, uuid, used in compute_apps(spec):
            print(", ".join(str({"pid": pid, "gpu_uuid": uuid, "used_memory": used}[f]) for f in fields))
    if mode == "lost":
        print("Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error")
        return 15
    return 0


if __name__ == "__main__":
    sys.exit(main())
