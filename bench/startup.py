"""What a launch costs the controller itself, phase by phase, and what it would take on a cluster whose nodes do not
share this machine's 2 cores (python -m bench.startup [--nodes 2,8,16,32,64] [--repeat 3]):

- per N, a light command (`PYTHON -c pass`) through bench/_drive.py with its trace: the controller's CPU seconds
  (all its threads, and its `ssh -G` children) and wall seconds for start (interpreter, imports, inventory, plan),
  connect (every host's `ssh -G`, handshake and auth), sessions (programs sent, ready/go, events to the end) and
  exit; its peak memory (VmHWM);
- a node's own time: at N = 1, from the channel opened to the node's `exited` event (its login shell, the agent,
  the command, the sweep), which on a real cluster every node spends at once on its own CPUs;
- the estimate for such a cluster: start + the controller's connect CPU at N (its handshakes; one round trip on
  a real network is less) + the larger of a node's own time and the controller's session CPU at N + exit;
- each node's agent's peak memory (VmHWM), sampled while a run of 8 nodes lasts.
Results go to bench/results/startup.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import DRIVER, log, node_agents, note_runs, run_alone, run_timed, sandbox_of


def _phases(trace: dict[str, Any], spawn: float, wall: float) -> dict[str, float]:
    cpu = trace["cpu"]
    exited = max(v[1] for v in trace["exited"].values())
    opened = max(v[1] for v in trace["channel"].values())
    return {
        "start_s": trace["planned"] - spawn, "start_cpu_s": cpu["imported_planned"],
        "connect_s": max(v[1] for v in trace["connect"].values()) - trace["planned"],
        "connect_cpu_s": cpu["connected"] - cpu["connect_start"],
        "sessions_s": trace["returned"] - max(v[1] for v in trace["connect"].values()),
        "sessions_cpu_s": cpu["returned"] - cpu["connected"],
        "exit_s": spawn + wall - trace["returned"], "node_own_s": exited - opened, "wall_s": wall,
    }


def _drive(box: Any, root: Path, name: str) -> tuple[dict[str, float], int]:
    out = root / f"{name}.json"
    spawn = time.time()
    result = run_timed([*DRIVER, str(box.inventory), "--log-dir",
                        str(root / "logs"), "--trace", str(out)], timeout=300)
    note_runs(result.stderr)
    if result.code != 0:
        raise RuntimeError(result.stderr[-1500:])
    rss = next(int(line.split()[1]) for line in result.stderr.splitlines()
               if line.startswith("bench-driver-peak-rss-kb:"))
    return _phases(json.loads(out.read_text()), spawn, result.seconds), rss


def _agent_peaks(stop: threading.Event, peaks: dict[int, int]) -> None:
    """Each node agent's VmHWM, until `stop`."""
    while not stop.is_set():
        for pid in node_agents():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peaks[pid] = max(peaks.get(pid, 0), int(line.split()[1]))
            except OSError:
                continue
        stop.wait(0.02)


def agent_memory(root: Path) -> dict[str, float]:
    """The agents of a run of 8 nodes whose command sleeps 2 s: their peak memory, sampled the whole time."""
    with sandbox_of(8, root) as box:
        peaks: dict[int, int] = {}
        stop = threading.Event()
        sampler = threading.Thread(target=_agent_peaks, args=(stop, peaks), daemon=True)
        sampler.start()
        command = [box.python, "-c", "import time; time.sleep(2)"]
        result = run_timed([*DRIVER, "--log-dir", str(root / "logs"),
                            str(box.inventory), "--", *command], timeout=300)  # positionals last, together
        stop.set()
        sampler.join()
        note_runs(result.stderr)
    mb = sorted(round(kb / 1024, 1) for kb in peaks.values())
    return {"agents": len(mb), "median_mb": statistics.median(mb) if mb else float("nan"),
            "max_mb": max(mb) if mb else float("nan")}


def run(sizes: list[int], repeat: int, root: Path) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    with sandbox_of(1, root, script="bench/workloads/lines.py") as box:
        _drive(box, root, "warm")
        alone = [_drive(box, root, f"n1-{k}")[0]["node_own_s"] for k in range(repeat)]
    node_own = statistics.median(alone)
    for n in sizes:
        with sandbox_of(n, root, script="bench/workloads/lines.py") as box:
            _drive(box, root, f"warm-{n}")
            runs = [_drive(box, root, f"n{n}-{k}") for k in range(repeat)]
        row = {key: round(statistics.median(r[key] for r, _ in runs), 3) for key in runs[0][0]}
        row["rss_mb"] = round(statistics.median(rss for _, rss in runs) / 1024, 1)
        row["cluster_estimate_s"] = round(row["start_s"] + row["connect_cpu_s"]
                                          + max(node_own, row["sessions_cpu_s"]) + row["exit_s"], 3)
        rows[str(n)] = row
        log(f"startup {n}: {row}")
    memory = agent_memory(root)
    log(f"startup: a node's own time {node_own:.3f} s; agents' peak memory {memory}")
    return {"node_own_s": round(node_own, 3), "node_own_runs": [round(x, 3) for x in alone], "rows": rows,
            "agent_memory": memory}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="2,8,16,32,64")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    return run_alone("startup", lambda root: run([int(n) for n in args.nodes.split(",")], args.repeat, root))


if __name__ == "__main__":
    sys.exit(main())
