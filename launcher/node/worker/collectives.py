"""Each rank's collectives, read from inside the worker (stdlib only, Python 3.8+): the hook's second part, written
into the run directory's `hook/` beside `sitecustomize.py` (launcher/node/agent/stackdump.py `install_hook`).

What a rank did with its collectives is the one thing about a running job that CUDA's asynchrony cannot hide: a rank
waiting for a stuck peer spins in whatever synchronisation comes first, but it *entered* the collective, and its peer
did not. torch's flight recorder keeps, per process group, the last collective enqueued, started and completed
(`pg_status`), and per collective its sequence number, name and the wall-clock time it was created (`entries`): for
gloo in torch's own recorder (`_dump_fr_trace`, torch 2.7+; TORCH_FR_BUFFER_SIZE=0 empties it), for NCCL in
NCCL's (`_dump_nccl_trace`).

A daemon thread (the main thread may be blocked in the very collective that hangs) reads the group status every
`status_s` (a dump without entries: some microseconds), and the entries, for the times each rank arrived at each
collective, every `arrivals_s` or `cost_factor` (100) times as long as the last such read took, whichever is longer,
so reading costs under 1% of the process's time whatever the recorder's buffer. It writes `collectives/<pid>`, one
JSON object replaced whole (a rename), that the node's agent reads (`launcher/node/agent/records.py`
`read_collectives`). Any failure ends the thread and says why in the file; the program goes on untouched. Forked
children (DataLoader workers) have no thread: threads do not survive a fork.
"""

import json
import os
import pickle
import sys
import threading
import time

HOOK_MODULE = "_ddp_launcher_hook"
"""The hook's name in sys.modules (launcher/node/worker/hook.py MODULE_NAME): its `recorder` keeps the progress."""
READERS = (("flight recorder", "_dump_fr_trace"), ("nccl flight recorder", "_dump_nccl_trace"))
"""torch's recorders, as (the source a rank's figures are said to come from, the function that dumps it)."""


def _int(value, default=-1):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class Watcher:
    """One rank's collectives as its recorders say them, and the file that carries them to the agent."""

    def __init__(self, folder, status_s, arrivals_s, keep, cost_factor, start):
        self.folder, self.status_s, self.arrivals_s, self.keep, self.start = folder, status_s, arrivals_s, keep, start
        self.cost_factor = cost_factor
        self.groups = {}  # group -> {desc, size, enqueued, started, completed, in_flight}
        self.arrivals = {}  # group -> [[seq, name, created wall seconds], ...], oldest first
        self.names = {}  # (group, seq) -> name, of the entries read
        self.descs = {}  # group -> what the program called it (`default_pg`), where the entries say it
        self.sources = []
        self.next_full, self.cost_s, self.why = 0.0, 0.0, ""

    def ready(self):
        """Whether the program's process group is there to read (torch itself is never imported from here)."""
        dist = sys.modules.get("torch.distributed")
        try:
            return dist is not None and dist.is_available() and dist.is_initialized()
        except Exception:  # the main thread is importing it right now (a module half made): next time
            return False

    def look(self, now):
        """Read every recorder there is: the groups always, their entries when a full read is due."""
        c10d = sys.modules.get("torch._C._distributed_c10d")
        full = now >= self.next_full
        began = time.monotonic()
        sources, groups = [], {}
        for source, name in READERS:
            dump = getattr(c10d, name, None)
            if dump is None:
                continue
            try:
                data = pickle.loads(dump(full, False, False))  # (collectives, stack traces, only active)
            except Exception:  # a recorder this build has but cannot use (NCCL's, on a CPU build)
                continue
            if not isinstance(data, dict) or not isinstance(data.get("pg_status"), dict) or not data["pg_status"]:
                continue  # CUDA builds have both recorders: the one of no group is not a source
            sources.append(source)
            self.read_groups(data, groups)
            if full:
                self.read_entries(data.get("entries") or ())
        self.sources, self.groups = sources, groups
        for group, status in groups.items():
            seq = status["completed"] + 1
            if status["enqueued"] >= seq:
                status["in_flight"] = [seq, self.names.get((group, seq))]
        if full:
            self.cost_s = time.monotonic() - began
            self.next_full = now + max(self.arrivals_s, self.cost_factor * self.cost_s)

    def read_groups(self, data, groups):
        config = data.get("pg_config") if isinstance(data.get("pg_config"), dict) else {}
        for group, status in data["pg_status"].items():
            if not isinstance(status, dict):
                continue
            named = config.get(group) if isinstance(config.get(group), dict) else {}
            ranks = named.get("ranks")
            groups[str(group)] = {
                "desc": str(named.get("desc") or self.descs.get(str(group)) or group),
                "size": len(json.loads(ranks)) if isinstance(ranks, str) and ranks.startswith("[") else None,
                "enqueued": _int(status.get("last_enqueued_collective")),
                "started": _int(status.get("last_started_collective")),
                "completed": _int(status.get("last_completed_collective")),
                "in_flight": None,
            }

    def read_entries(self, entries):
        newest = {group: kept[-1][0] for group, kept in self.arrivals.items() if kept}
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("is_p2p"):
                continue
            named = entry.get("process_group")
            group = str(named[0]) if isinstance(named, (list, tuple)) and named else str(entry.get("pg_id"))
            if isinstance(named, (list, tuple)) and len(named) > 1 and named[1] not in ("", "undefined"):
                self.descs[group] = str(named[1])
            seq, created = _int(entry.get("collective_seq_id")), _int(entry.get("time_created_ns"), 0)
            name = str(entry.get("profiling_name") or "collective").rpartition(":")[2]
            self.names[(group, seq)] = name
            if (group not in newest or seq > newest[group]) and created > 0:
                self.arrivals.setdefault(group, []).append([seq, name, created / 1e9])
        for kept in self.arrivals.values():
            kept.sort()
            del kept[: -self.keep]
        kept = {(group, row[0]) for group, rows in self.arrivals.items() for row in rows}
        kept.update((group, status["completed"] + 1) for group, status in self.groups.items())
        self.names = {key: name for key, name in self.names.items() if key in kept}

    def write(self, now):
        record = {
            "v": 1,
            "rank": _int(os.environ.get("RANK")),
            "start": self.start,
            "t": now,
            "wall": time.time(),
            "source": " and ".join(self.sources),
            "cost_s": round(self.cost_s, 6),
            "groups": self.groups,
            "arrivals": self.arrivals,
            "why": self.why,
        }
        path = os.path.join(self.folder, str(os.getpid()))
        with open(path + ".new", "w") as handle:
            json.dump(record, handle, separators=(",", ":"))
        os.replace(path + ".new", path)

    def run(self):
        try:
            while True:
                time.sleep(self.status_s)
                now = time.monotonic()
                recorder = getattr(sys.modules.get(HOOK_MODULE), "recorder", None)
                if recorder is not None:  # the counts a hang left unwritten (the main thread writes no more)
                    recorder.catch_up(now)
                if self.ready():
                    self.look(now)
                    self.write(now)
        except Exception as exc:  # reading stops for this process, and its file says why
            self.why = " ".join(("%s: %s" % (type(exc).__name__, exc)).split())
            try:
                self.write(time.monotonic())
            except Exception:
                pass


def watch(setting, start):
    """Start the thread (the hook's COLLECTIVES_ENV: `<folder>:<status s>:<arrival s>:<kept per group>:<cost
    factor>`); the watcher, or None for a setting it cannot read."""
    try:
        folder, status_s, arrivals_s, keep, cost_factor = setting.rsplit(":", 4)
        watcher = Watcher(folder, float(status_s), float(arrivals_s), int(keep), float(cost_factor), start)
    except ValueError:
        return None
    threading.Thread(target=watcher.run, name="ddp-launcher-collectives", daemon=True).start()
    return watcher
