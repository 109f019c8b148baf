"""Figures for a run alive but stuck (python -m bench.hang [--sizes 2,16,64] [--repeat N]).

- answer_s: from the hang bound (the last node started + the hang timeout) to the grouped answer of an attached run
  (every node's agent takes its workers' stacks over the run's own sessions, twice, HANG_LOOKS_APART_S apart, and
  is asked for NCCL's dumps);
- stacks_s: `inv stacks` from another terminal on a detached run, a fresh process as a user types it (its
  connections and every node's agent included);
- watch cost: a real job's (train/ddp.py, 2 nodes x 2 ranks) wall time with the watch on against off
  (`--hang-timeout 0`: the agents then read no /proc for progress), and each node's agent's CPU per second of a
  healthy light run (a step line every 0.2 s for STEADY_S), on against off, read from /proc.

The job is bench/workloads/hang_worker.py in place of torchrun (one worker a node, no torch) except for the real-job
figure.
Results go to bench/results/hang.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import MARK_ENV, REPO, log, run_alone, sandbox_of
from launcher import events
from launcher.config.inventory import load_inventory
from launcher.errors import RunFailed
from launcher.plan.launchplan import plan_launch
from launcher.plan.settings import for_run
from launcher.run import launch as run_launch
from launcher.run.run_io import RunIO
from launcher.settings import Settings

WORKER = str(REPO / "bench" / "workloads" / "hang_worker.py")
TIMEOUT_S = 5.0


STEADY_S = 12.0
TICKS = os.sysconf("SC_CLK_TCK")


def light_plan(inventory: Path, *args: str, settings: Settings | None = None):
    """The inventory's plan, each node running the light worker with `args`, with `settings` (as the user's)."""
    cluster = load_inventory(inventory)
    plan = plan_launch(cluster, settings=for_run(settings or Settings(), cluster))
    nodes = tuple(dataclasses.replace(c, argv=(c.host.python, WORKER, *args), home_args=(0,)) for c in plan.nodes)
    return dataclasses.replace(plan, nodes=nodes)


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, IndexError, ValueError):
        return None


def _agents_of(run_id: str) -> list[int]:
    """The agents of a light run: each worker's grandparent (agent -> hang_worker.py in torchrun's place -> worker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{MARK_ENV}={run_id}/".encode() not in (entry / "environ").read_bytes():
                continue
            if b"worker" not in (entry / "cmdline").read_bytes():
                continue
            stand_in = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            found.append(int(Path(f"/proc/{stand_in}/stat").read_text().rsplit(")", 1)[1].split()[1]))
        except (OSError, IndexError, ValueError):
            continue
    return found


def agent_cpu(inventory: Path, root: Path, watch: bool) -> float | None:
    """CPU seconds per second of each node's agent (the median node) over a healthy attached light run."""
    settings = Settings.of(hang_timeout=None if watch else 0, log_dir=root / "logs")
    plan = light_plan(inventory, "steady", str(STEADY_S), settings=settings)
    samples: dict[int, list[tuple[float, float]]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            for pid in _agents_of(plan.run_id):
                cpu = _cpu_s(pid)
                if cpu is not None:
                    samples.setdefault(pid, []).append((time.monotonic(), cpu))

    devnull = open(os.devnull, "w")  # noqa: SIM115
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run_launch.launch_run(plan, RunIO(out=devnull, err=devnull))
    finally:
        done.set()
        sampler.join()
    rates = [(last[1] - first[1]) / (last[0] - first[0]) for first, *_, last in
             (s for s in samples.values() if len(s) >= 3)]
    return round(statistics.median(rates), 4) if rates else None


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
    settings = Settings.of(hang_timeout=TIMEOUT_S, log_dir=root / "logs")
    with contextlib.suppress(RunFailed):  # the run is stopped for its hang: exit code 124
        run_launch.launch_run(light_plan(inventory, settings=settings),
                              RunIO(out=devnull, err=devnull, on_event=on_event))
    bound = max(started) + TIMEOUT_S
    ranks = sum(len(a.get("workers", [])) for a in hang[0].answers.values() if isinstance(a, dict)) if hang else 0
    return {"answer_s": round(hang[0].time - bound, 3) if hang else None, "ranks": ranks}


def stacks_time(inventory: Path, root: Path) -> dict:
    """`inv stacks` on a detached light run: a fresh process, every node's agent, the grouped answer."""
    env = {**os.environ, "INVOKE_LAUNCHER_LOG_DIR": str(root / "logs")}
    devnull = open(os.devnull, "w")  # noqa: SIM115
    run_launch.launch_run(light_plan(inventory, settings=Settings.of(detach=True, log_dir=root / "logs")),
                         RunIO(out=devnull, err=devnull))
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


def run(sizes: list[int], repeat: int, job_repeat: int, root: Path) -> dict:
    """Every figure of this module: a row per size, the watch's cost on a real job and on the agents."""
    rows = []
    for n in sizes:
        with sandbox_of(n, root) as box:
            answers = [answer_time(box.inventory, root) for _ in range(repeat)]
            stacks = [stacks_time(box.inventory, root) for _ in range(repeat)]
        row = {"nodes": n, "answer_s": [a["answer_s"] for a in answers], "ranks": answers[-1]["ranks"],
               "stacks_s": [s["stacks_s"] for s in stacks], "stacks_answer": stacks[-1]["answer"]}
        log(f"hang n={n}: answer {row['answer_s']} s after the bound ({row['ranks']} ranks); "
            f"inv stacks {row['stacks_s']} s")
        rows.append(row)
    with sandbox_of(2, root, nproc_per_node=2) as box:
        on, off = [], []
        for k in range(job_repeat):  # pairs whose order alternates: the machine's drift cancels (as bench/top.py)
            for watch in ((True, False) if k % 2 else (False, True)):
                (on if watch else off).append(job_wall(box.inventory, root, watch=watch))
        cpu_on, cpu_off = [], []
        for _ in range(job_repeat):
            cpu_off.append(agent_cpu(box.inventory, root, watch=False))
            cpu_on.append(agent_cpu(box.inventory, root, watch=True))
    job = {"watch_on_s": [round(x, 2) for x in on], "watch_off_s": [round(x, 2) for x in off],
           "ratio": round(statistics.median(a / b for a, b in zip(on, off, strict=True)), 3),  # of the pairs
           "agent_cpu_on": cpu_on, "agent_cpu_off": cpu_off, "steady_s": STEADY_S}
    log(f"real job (train/ddp.py, 2 nodes x 2): watch on {job['watch_on_s']} s, off {job['watch_off_s']} s, "
        f"ratio {job['ratio']}; agent CPU s/s on {cpu_on}, off {cpu_off}")
    return {"timeout_s": TIMEOUT_S, "rows": rows, "job": job}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2,16,64")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--job-repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    return run_alone("hang", lambda root: run(sizes, args.repeat, args.job_repeat, root))


if __name__ == "__main__":
    sys.exit(main())
