"""Figures for a run alive but stuck (python bench/hang.py [--sizes 2,16,64] [--repeat N]).

- answer_s: from the hang bound (the last node started + the hang timeout) to the grouped answer of an attached run
  (every node's agent takes its workers' stacks over the run's own sessions);
- stacks_s: `inv stacks` from another terminal on a detached run, a fresh process as a user types it (its
  connections and every node's agent included);
- watch cost: a real job's (train/ddp.py, 2 nodes x 2 ranks) wall time with the watch on against off
  (`--hang-timeout 0`: the agents then read no /proc for progress).

The job is bench/hang_worker.py in place of torchrun (one worker a node, no torch) except for the real-job figure.
Results go to bench/results/hang.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import REPO, RESULTS, log, sandbox_of

from launcher.config.inventory import load_inventory
from launcher.errors import RunFailed
from launcher.options import Options
from launcher.plan.commands import plan_launch
from launcher.run import events
from launcher.run import start as run_start

WORKER = str(REPO / "bench" / "hang_worker.py")
TIMEOUT_S = 5.0


def light_plan(inventory: Path):
    plan = plan_launch(load_inventory(inventory))
    nodes = tuple(dataclasses.replace(c, argv=(c.host.python, WORKER), home_words=(0,)) for c in plan.nodes)
    return dataclasses.replace(plan, nodes=nodes)


def answer_time(inventory: Path, root: Path) -> dict:
    """An attached light run with --hang-timeout TIMEOUT_S: seconds from the bound to the answer."""
    started: list[float] = []
    hang: list[events.HangSuspected] = []

    def on_event(event) -> None:
        if isinstance(event, events.Started):
            started.append(event.time)
        elif isinstance(event, events.HangSuspected):
            hang.append(event)

    devnull = open(os.devnull, "w")  # noqa: SIM115
    opts = Options(hang_timeout=TIMEOUT_S, on_event=on_event, out=devnull, err=devnull, log_dir=root / "logs")
    with contextlib.suppress(RunFailed):  # the run is stopped for its hang: exit code 124
        run_start.launch_run(light_plan(inventory), opts)
    bound = max(started) + TIMEOUT_S
    ranks = sum(len(a.get("workers", [])) for a in hang[0].answers.values() if isinstance(a, dict)) if hang else 0
    return {"answer_s": round(hang[0].time - bound, 3) if hang else None, "ranks": ranks}


def stacks_time(inventory: Path, root: Path) -> dict:
    """`inv stacks` on a detached light run: a fresh process, every node's agent, the grouped answer."""
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(root / "logs")}
    devnull = open(os.devnull, "w")  # noqa: SIM115
    run_start.launch_run(light_plan(inventory), Options(detach=True, out=devnull, err=devnull, log_dir=root / "logs"))
    time.sleep(2)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "invoke", "stacks", "--hosts", str(inventory)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t0
    subprocess.run([sys.executable, "-m", "invoke", "stop", "--hosts", str(inventory)], cwd=REPO, env=env,
                   capture_output=True, timeout=600)
    first = done.stdout.splitlines()[0] if done.stdout else done.stderr.strip()[-200:]
    return {"stacks_s": round(took, 3), "code": done.returncode, "answer": first[:200]}


def job_wall(inventory: Path, root: Path, watch: bool) -> float:
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(root / "logs")}
    args = [] if watch else ["--hang-timeout", "0"]
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "invoke", "launch", "--hosts", str(inventory), "--skip-doctor",
                           *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2,16,64")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--job-repeat", type=int, default=3)
    args = parser.parse_args()
    root = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-hang-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in [int(x) for x in args.sizes.split(",")]:
        with sandbox_of(n, root) as box:
            answers = [answer_time(box.inventory, root) for _ in range(args.repeat)]
            stacks = [stacks_time(box.inventory, root) for _ in range(args.repeat)]
        row = {"nodes": n, "answer_s": [a["answer_s"] for a in answers], "ranks": answers[-1]["ranks"],
               "stacks_s": [s["stacks_s"] for s in stacks], "stacks_answer": stacks[-1]["answer"]}
        log(f"hang n={n}: answer {row['answer_s']} s after the bound ({row['ranks']} ranks); "
            f"inv stacks {row['stacks_s']} s")
        rows.append(row)
    with sandbox_of(2, root, nproc_per_node=2) as box:
        on, off = [], []
        for _ in range(args.job_repeat):
            off.append(job_wall(box.inventory, root, watch=False))
            on.append(job_wall(box.inventory, root, watch=True))
    job = {"watch_on_s": [round(x, 2) for x in on], "watch_off_s": [round(x, 2) for x in off],
           "ratio": round(statistics.median(on) / statistics.median(off), 3)}
    log(f"real job (train/ddp.py, 2 nodes x 2): watch on {job['watch_on_s']} s, off {job['watch_off_s']} s, "
        f"ratio {job['ratio']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "hang.json").write_text(json.dumps({"timeout_s": TIMEOUT_S, "rows": rows, "job": job}, indent=1))
    print(json.dumps({"rows": rows, "job": job}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
