"""Figures of `inv top` (python -m bench.top [--repeat N]):

- view_cpu: each node's `top` agent, CPU seconds per second of a live view (a snapshot a second, the ranks' files
  read every 0.1 s), over VIEW_S of a detached light run (bench/workloads/hang_worker.py `steady`: a step line every
  0.2 s);
- first_frame_s: from nothing (connections included) to a frame with every node's figures, at 2, 16 and 64 nodes;
- once_s: `inv top --once --json` as a user types it (a fresh process: connect, a look of 3 s, the answer);
- job: train/ddp.py on 2 nodes x 2 ranks, its wall time with a live view open on it the whole time against none,
  in pairs of alternating order; the median of the pairs' ratios (target <= 1.02x).
Results go to bench/results/top.json.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, RUN_ID, log, node_agents, run_alone, sandbox_of
from bench.hang import _cpu_s, light_plan
from launcher.config.inventory import load_inventory
from launcher.run import launch as run_launch
from launcher.run.run_io import RunIO
from launcher.run.topfeed import SshFeed, wait_first
from launcher.settings import Settings
from launcher.transport.connections import close_all, connect_all

VIEW_S = 10.0
JOB_PAIRS = 3
"""Pairs of ddp.py runs (viewed, alone) per repeat."""
JOB_ARGS = "--epochs 12"
"""ddp.py's run takes ~7.7 s here, not its default ~5.7: more of it is training, which the view must not slow."""


def open_view(inventory: Path, run_id: str) -> tuple[SshFeed, dict]:
    cluster = load_inventory(inventory)
    nodes, _ = connect_all(cluster, cluster.hosts)
    feed = SshFeed(cluster, nodes, run_id, {}).start()
    wait_first(feed, 30.0)
    return feed, nodes


def view_cpu(inventory: Path, root: Path) -> dict:
    """A detached light run; a live view on it for VIEW_S; the view's agents' CPU per second, per node."""
    plan = light_plan(inventory, "steady", "600", settings=Settings.of(detach=True, log_dir=root / "logs"))
    quiet = RunIO(out=io.StringIO(), err=io.StringIO())
    run_launch.launch_run(plan, quiet)
    time.sleep(2)
    before = node_agents()
    feed, nodes = open_view(inventory, plan.run_id)
    try:
        mine = sorted(node_agents() - before)
        first = {pid: (time.monotonic(), _cpu_s(pid)) for pid in mine}
        time.sleep(VIEW_S)
        rates = []
        for pid, (t0, c0) in first.items():
            c1 = _cpu_s(pid)
            if c0 is not None and c1 is not None:
                rates.append((c1 - c0) / (time.monotonic() - t0))
        views = feed.views()
    finally:
        feed.close()
        close_all(nodes.values())
        subprocess.run([sys.executable, "-m", "invoke", "stop", "--hosts", str(inventory), "--run", plan.run_id],
                       cwd=REPO, env={**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(root / "logs")},
                       capture_output=True, timeout=300)
    return {"agents": len(rates), "cpu_per_s": [round(r, 4) for r in rates],
            "ranks_seen": sum(len(v.snapshot["ranks"]) for v in views if v.snapshot)}


def first_view(inventory: Path, root: Path) -> float:
    plan = light_plan(inventory, "steady", "600", settings=Settings.of(detach=True, log_dir=root / "logs"))
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(root / "logs")}
    run_launch.launch_run(plan, RunIO(out=io.StringIO(), err=io.StringIO()))
    time.sleep(1)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "invoke", "top", "--hosts", str(inventory), "--once", "--json"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - t0
    subprocess.run([sys.executable, "-m", "invoke", "stop", "--hosts", str(inventory), "--run", plan.run_id],
                   cwd=REPO, env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return took


def job_wall(inventory: Path, root: Path, viewed: bool) -> float:
    """train/ddp.py to its end, with a live view on it from its start (viewed) or none."""
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(root / "logs")}
    out = root / "job.out"
    t0 = time.perf_counter()
    with out.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "invoke", "launch", "--hosts", str(inventory),
                                 "--skip-doctor", "--args", JOB_ARGS], cwd=REPO, env=env, stdout=sink,
                                stderr=subprocess.STDOUT)
    feed = nodes = None
    try:
        if viewed:
            while proc.poll() is None and not RUN_ID.search(out.read_text(errors="replace")):
                time.sleep(0.05)
            found = RUN_ID.search(out.read_text(errors="replace"))
            if found and proc.poll() is None:
                feed, nodes = open_view(inventory, found.group(1))
        code = proc.wait(timeout=600)
    finally:
        if feed is not None:
            feed.close()
            close_all(nodes.values())
    assert code == 0, out.read_text()[-2000:]
    return time.perf_counter() - t0


def first_frame(inventory: Path, root: Path) -> float:
    """From nothing (connections included, imports not) to a frame with every node's figures, on a detached light
    run: what the live view takes to show the whole run."""
    plan = light_plan(inventory, "steady", "600", settings=Settings.of(detach=True, log_dir=root / "logs"))
    run_launch.launch_run(plan,
                         RunIO(out=io.StringIO(), err=io.StringIO()))
    time.sleep(2)
    t0 = time.perf_counter()
    feed, nodes = open_view(inventory, plan.run_id)
    took = time.perf_counter() - t0
    complete = all(v.snapshot is not None for v in feed.views())
    feed.close()
    close_all(nodes.values())
    subprocess.run([sys.executable, "-m", "invoke", "stop", "--hosts", str(inventory), "--run", plan.run_id],
                   cwd=REPO, env={**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(root / "logs")},
                   capture_output=True, timeout=600)
    return took if complete else float("nan")


def job_pairs(root: Path, pairs: int) -> tuple[list[float], list[float]]:
    """ddp.py's wall time viewed and alone, in pairs whose order alternates (ABBA): a drift of the shared machine
    (another process, the page cache) falls on both sides alike."""
    on, off = [], []
    with sandbox_of(2, root, nproc_per_node=2) as box:
        job_wall(box.inventory, root, viewed=False)  # warm-up: the page cache holds torch after it
        for i in range(pairs):
            for viewed in (False, True) if i % 2 == 0 else (True, False):
                (on if viewed else off).append(job_wall(box.inventory, root, viewed=viewed))
    return on, off


def paired_ratio(on: list[float], off: list[float]) -> float:
    """The median of each pair's viewed/alone: the figure a 2% effect shows in, where 10% run-to-run noise would hide
    it in a ratio of two medians."""
    return round(statistics.median(a / b for a, b in zip(on, off, strict=True)), 3)


def run(repeat: int, root: Path, sizes: tuple[int, ...] = (2, 16, 64)) -> dict:
    frames = {}
    for n in sizes:
        with sandbox_of(n, root) as box:
            frames[n] = [round(first_frame(box.inventory, root), 3) for _ in range(repeat)]
        log(f"top: first frame at {n} nodes {frames[n]} s")
    with sandbox_of(2, root) as box:
        cpu = [view_cpu(box.inventory, root) for _ in range(repeat)]
        first = [first_view(box.inventory, root) for _ in range(repeat)]
    on, off = job_pairs(root, JOB_PAIRS * repeat)
    rates = [r for c in cpu for r in c["cpu_per_s"]]
    result = {"first_frame_s": {str(n): f for n, f in frames.items()}, "view_s": VIEW_S, "view_cpu_per_s": rates,
              "agents": [c["agents"] for c in cpu],
              "once_s": [round(f, 3) for f in first],
              "job": {"viewed_s": [round(x, 2) for x in on], "alone_s": [round(x, 2) for x in off],
                      "ratio": paired_ratio(on, off)}}
    log(f"top: view agents' CPU s/s {rates}; --once --json {result['once_s']} s; ddp.py 2x2 viewed "
        f"{result['job']['viewed_s']} s, alone {result['job']['alone_s']} s, ratio {result['job']['ratio']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    return run_alone("top", lambda root: run(args.repeat, root))


if __name__ == "__main__":
    sys.exit(main())
