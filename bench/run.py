"""Benchmarks of the launcher on the local sandbox, each against the plain way of doing the same thing, in one run.

    python -m bench.run [--quick] [--only fanout,job,doctor,stop,logs,cpu,failures,sync,elastic] [--real-login]
                        [--skip-doctor-too]

Figures (each the median of >= 2 runs, with min and max; baselines measured in the same run, interleaved):
  fanout  a light command (`PYTHON -c pass`) on N = 1, 2, 4, ..., 64 nodes: the launcher (a fresh process, imports
          included; with the doctor's preflight too up to 16) vs (a) the ssh loop and (p) `pdsh -R ssh -f N`; each
          run's process tree sampled for threads, fds and memory; least-squares cost per node
  job     train/ddp.py, 20 steps, on 2, 4, 8 and 16 nodes: `inv launch` vs (a) vs (d) local torchrun without SSH
  doctor  run_doctor vs (a) and (p) running one light command, N = 2, 4, 16, 64
  stop    SIGINT to an attached launcher, `inv stop` on a detached run: time until no process of the run is left;
          (d) SIGTERM straight to local torchruns (torchrun's own exit time); (a) Ctrl-C on the ssh loop: how many
          remote processes stay (the bench then kills them by their mark). At scale (N = 1, 4, 16, 64, `sleep 600`
          in place of torchrun): Ctrl-C and `inv stop` vs a pkill loop over ssh and pdsh (bench/stop_scale.py)
  logs    1,000,000 lines from a 2-node job through `inv launch` vs the same job writing to a local file
  cpu     the launcher's own CPU seconds and peak memory at N = 16; with fanout: CPU, memory, processes, threads
          and fds of the launcher, the ssh loop and pdsh at 16, 32 and 64 nodes
  failures  a 2-node sleeper run broken five ways (worker crash, kill -9 of a torchrun, of an agent, of the
          launcher; a node's sshd SIGSTOPped), grace 1 s, timeouts 4 s: time until no process of the run is left,
          the launcher's exit code and time, processes left after 60 s (2 runs each; --quick: 1)
  reconnect a node's sshd session SIGKILLed 5 times in one attached run: from the kill to its stream flowing again
          on the launcher's console, every line once, nothing left after Ctrl-C (bench/reconnect.py)
  recover from a hang's start to every rank's first step after `--on-hang restart` started the run again without
          the node that held it (3 nodes, --hang-timeout 15), and where the time went (bench/recover.py)
  sync    `inv sync` of a 1,000-file, 50 MB tree to 8 nodes vs a parallel `rsync -a` loop: first sync, nothing
          changed, one file changed (2 runs; --quick: 1)
  elastic from a node's death to training resumed on the 2 nodes left of 3: relaunch with --retries, and a c10d
          group re-formed by torchrun (3 runs each; --quick: 1)
  hang    a light run stuck at N = 2, 16, 64: from the hang bound to the grouped answer, and `inv stacks` (a fresh
          process) on a detached one; the watch's cost: train/ddp.py's wall time on 2 nodes x 2 with it on vs off,
          and each agent's CPU per second of a healthy run (bench/hang.py)
  top     `inv top`: each node's view agent's CPU per second of a live view, `inv top --once --json` as typed, and
          train/ddp.py's wall time on 2 nodes x 2 with a live view open on it vs none, the first full frame at
          2, 16, 64 nodes (bench/top.py)
  net     `inv doctor --net` at 2, 8, 16 nodes: its time as typed, and the all_reduce bandwidth it reports against a
          plain torch.distributed all_reduce loop run over an ssh loop on the same nodes (bench/net.py)
  container train/ddp.py on 2 nodes in a container image (podman, `container:`) vs the same job bare: command ->
          first optimizer step on every rank, and the whole launch (bench/container.py)
  startup the controller's own CPU and wall per phase of a light launch at 2-64 nodes, a node's own time, the
          estimate for nodes with CPUs of their own, and each agent's peak memory (bench/startup.py)
  scale   only with --only: at 128 and 256 nodes, fan-out (with the preflight too), the doctor, status, top --once,
          stacks and stop beside the ssh loop and pdsh (-f N and its default 32), the console's size, and the
          launcher's cost per node from 2 to 256 (bench/scale.py, ~15 minutes)
--quick: fan-out at 4 and 16, the job at 2, the doctor at 4 and 8, stop at scale at 4 and 16, fewer runs and
diagnostics. The full run takes ~19 minutes on 2 cores. Prints a table, writes bench/results/latest.json,
latest.md and (with matplotlib, the `bench` extra)
latest.png: seconds against N per method for fan-out, the doctor and stop (with --only:
bench/results/only-<figures>.*, so the full table stays). pdsh (scripts/setup installs it) is skipped when absent.
To see where the launcher's fan-out time goes: `python -m bench.trace_fanout`.
Sandboxes use 127.0.200.2 and up (the tests' lock files tell which are free) and free master ports; every
sandbox is brought down and every process the bench started is gone when it ends, even on failure.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import REAL_LOGIN_ENV, REPO, RESULTS, log, machine, remove_run_dirs
from bench.table import markdown, print_table, rows

FIGURES = ("fanout", "job", "doctor", "stop", "logs", "cpu", "failures", "reconnect", "sync", "elastic", "recover",
           "hang", "top", "net", "startup", "container", "scale")
ON_REQUEST = ("scale",)
"""Figures only `--only` runs: 256 sshd nodes take the machine for ~15 minutes, on top of the full run's ~20."""


def plan(quick: bool, only: set[str]) -> dict[str, Any]:
    """What to run: sizes and repeats per figure."""
    full = {
        # 64 nodes share this machine's 2 cores: every SSH session costs ~0.1 s of it (sshd, the login shell, the
        # Pythons), so each run at 64 takes ~4-5 s. The fan-out and the job get 5 runs where a tenth of a second is
        # the difference to tell (3 runs told 0.98x one day and 1.05x the next for the same 2-node job).
        # (A full run measured 1,320 s with N = 1 too, the doctor at 4, --skip-doctor jobs, stop at scale at 1,
        # stop baselines every run, warm-ups, the --tee diagnostic and 3 runs of failures and sync, and 1,236 s
        # without the first five, when each login ran this machine's .bashrc; those went to stay under 20 minutes.)
        "fanout": {"sizes": [2, 4, 8, 16, 32, 64], "repeat": {32: 3, 64: 3}, "default_repeat": 5},
        # 8 and 16 nodes (#36): 8 and 16 torch processes share the 2 cores, ~15 and ~35 s a run: 3 runs each.
        "job": {"sizes": [2, 4, 8, 16], "repeat": {2: 5, 4: 5, 8: 3, 16: 3}, "skip_doctor_too": False,
                "warm_up": False, "page_off_too": True},
        "doctor": {"sizes": [2, 16, 64], "repeat": {64: 2}, "default_repeat": 3},
        "stop": {"repeat": 2, "baselines_every_run": False, "scale_sizes": [4, 16, 64],
                 "scale_repeat": {64: 1}},  # 2 runs below 64 (stop_scale's default); one 64-node run is ~2 minutes
        "logs": {"repeat": 5, "diagnostics": True},  # with the ssh loop: what SSH itself costs over the floor
        "failures": {"repeat": 2},
        "reconnect": {"repeat": 5},
        "sync": {"repeat": 2},
        "elastic": {"repeat": 3},
        "recover": {"repeat": 2},
        "hang": {"sizes": [2, 16, 64], "repeat": 2, "job_repeat": 4},
        "top": {"repeat": 2},
        "net": {"sizes": [2, 8, 16], "repeat": 2},
        "startup": {"sizes": [2, 8, 16, 32, 64], "repeat": 2},
        "container": {"repeat": 5},
        "scale": {"sizes": [128, 256], "repeat": 2},
    }
    short = {
        "fanout": {"sizes": [4, 16], "repeat": {}, "default_repeat": 3},
        "job": {"sizes": [2], "repeat": 3, "skip_doctor_too": False, "warm_up": False},
        "doctor": {"sizes": [4, 8], "repeat": {}, "default_repeat": 3},
        "stop": {"repeat": 3, "baselines_every_run": False, "scale_sizes": [4, 16], "scale_repeat": 1},
        "logs": {"repeat": 3, "diagnostics": False},
        "failures": {"repeat": 1},
        "reconnect": {"repeat": 3},
        "sync": {"repeat": 1},
        "elastic": {"repeat": 1},
        "recover": {"repeat": 1},
        "hang": {"sizes": [2, 16], "repeat": 1, "job_repeat": 2},
        "top": {"repeat": 1},
        "net": {"sizes": [2, 8], "repeat": 1},
        "startup": {"sizes": [2, 16], "repeat": 1},
        "container": {"repeat": 2},
        "scale": {"sizes": [128], "repeat": 1},
    }
    chosen = dict(short if quick else full)
    if only:
        if "cpu" in only and "fanout" not in only:
            chosen["fanout"] = {**chosen["fanout"], "sizes": [16]}
            only = only | {"fanout"}
        return {k: v for k, v in chosen.items() if k in only}
    return {k: v for k, v in chosen.items() if k not in ON_REQUEST}


def repeats(conf: dict[str, Any]) -> dict[int, int]:
    """Runs per N of a figure: its `repeat` exceptions over its `default_repeat`."""
    return {n: conf["repeat"].get(n, conf["default_repeat"]) for n in conf["sizes"]}


def draw_chart(results: dict[str, Any], stem: str, title: str) -> None:
    """The scale figures as a PNG next to the JSON; one line, and no picture, without matplotlib."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log("chart skipped: matplotlib is not installed (pip install -e '.[bench]')")
        return
    from bench import chart

    try:
        path = chart.draw(results, RESULTS / f"{stem}.png", title)
    except Exception as exc:  # a picture is never worth the figures themselves
        log(f"chart skipped: {type(exc).__name__}: {exc}")
        return
    if path is not None:
        print(f"wrote {path.relative_to(REPO)}")


def cpu_figure(fan: dict[str, Any]) -> dict[str, Any] | None:
    big = [r for r in fan["rows"] if r["nodes"] == 16] or fan["rows"][-1:]
    if not big:
        return None
    r = big[0]
    return {"nodes": r["nodes"], "launcher_cpu_s": r["launcher"]["cpu_s"],
            "launcher_peak_rss_mb": r["launcher"]["peak_rss_mb"], "ssh_loop_cpu_s": r["ssh_loop"]["cpu_s"],
            "note": "CPU: wait4() rusage of the driver process (with its `ssh -G` children), of the bash loop (with "
                    "its ssh clients) for (a); the nodes' side (sshd, bash, agents) is not included. Peak RSS: the "
                    "driver's own VmHWM at exit"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer N, 3 runs each (about 4 minutes)")
    parser.add_argument("--only", default="", help=f"comma-separated figures: {', '.join(FIGURES)}")
    parser.add_argument("--real-login", action="store_true",
                        help="the nodes log in with this machine's ~/.bashrc, not the bench's own (every method)")
    parser.add_argument("--skip-doctor-too", action="store_true",
                        help="the real job's figure runs `inv launch --skip-doctor` too, at every N, with more "
                             "runs (8, 6, 4, 3)")
    return parser


def run_figure(name: str, conf: dict[str, Any], root: Path, only: set[str], results: dict[str, Any]) -> None:
    """One figure of the bench, its results put into `results` (the fan-out also gives the CPU figure)."""
    from bench import (
        container,
        doctor_fig,
        elastic,
        failures,
        fanout,
        hang,
        job,
        logs_fig,
        net,
        reconnect,
        recover,
        scale,
        startup,
        stop,
        stop_scale,
        sync_fig,
        top,
    )

    by_repeat = {"failures": failures, "reconnect": reconnect, "sync": sync_fig, "elastic": elastic,
                 "recover": recover, "top": top, "container": container}  # each run(repeat, root)
    if name in by_repeat:
        results[name] = by_repeat[name].run(conf["repeat"], root)
    elif name == "fanout":
        results["fanout"] = fanout.run(conf["sizes"], repeats(conf), root)
        if not only or "cpu" in only:
            results["cpu"] = cpu_figure(results["fanout"])
        if only == {"cpu"}:
            del results["fanout"]
    elif name == "job":
        # `inv launch` runs the doctor's fast checks first; --skip-doctor too shows what they cost.
        results["job"] = job.run(conf["sizes"], conf["repeat"], root, skip_doctor_too=conf["skip_doctor_too"],
                                 warm_up=conf["warm_up"], page_off_too=conf.get("page_off_too", False))
    elif name == "doctor":
        results["doctor"] = doctor_fig.run(conf["sizes"], repeats(conf), root)
    elif name == "stop":
        results["stop"] = stop.run(conf["repeat"], root, conf["baselines_every_run"])
        results["stop_scale"] = stop_scale.run(conf["scale_sizes"], conf["scale_repeat"], root)
    elif name == "logs":
        results["logs"] = logs_fig.run(conf["repeat"], root, diagnostics=conf["diagnostics"])
    elif name == "hang":
        results["hang"] = hang.run(conf["sizes"], conf["repeat"], conf["job_repeat"], root)
    elif name == "net":
        results["net"] = net.run(conf["sizes"], conf["repeat"], root)
    elif name == "scale":
        results["scale"] = scale.run(conf["sizes"], conf["repeat"], root)
    elif name == "startup":
        results["startup"] = startup.run(conf["sizes"], conf["repeat"], root)


def main() -> int:
    parser = _parser()
    args = parser.parse_args()
    if args.real_login:
        os.environ[REAL_LOGIN_ENV] = "1"
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - set(FIGURES)
    if unknown:
        parser.error(f"unknown figure(s) {sorted(unknown)}; choose from {', '.join(FIGURES)}")
    command = ("python -m bench.run" + (" --quick" if args.quick else "") + (f" --only {args.only}" if only else "")
               + (" --real-login" if args.real_login else "") + (" --skip-doctor-too" if args.skip_doctor_too else ""))
    todo = plan(args.quick, only)
    if args.skip_doctor_too and "job" in todo:
        # The job's 3% target (#36) against runs that spread 15-40% here: more interleaved pairs where a run is short.
        todo["job"].update(skip_doctor_too=True, repeat={2: 8, 4: 6, 8: 4, 16: 3})
    # Started as a background job of a script (`cmd &`), this process and so every launcher it Ctrl-Cs would have
    # SIGINT ignored: the stop figures would time out. A handler of our own is reset to the default in children.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # A user's install has bytecode caches (pip writes them; an editable install on first import): this machine's
    # PYTHONDONTWRITEBYTECODE=1 would make every launcher run compile its modules again (~50 ms), a cost no user pays.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.monotonic()
    when = _dt.datetime.now().isoformat(timespec="seconds")
    info = machine()
    results: dict[str, Any] = {}
    root = Path(tempfile.mkdtemp(prefix="ddp-bench-"))
    log(f"{command}: {', '.join(todo)}; scratch in {root}")
    try:
        for name, conf in todo.items():
            t0 = time.monotonic()
            try:
                run_figure(name, conf, root, only, results)
            except Exception as exc:  # one figure failing still leaves the others' figures
                log(f"{name} FAILED: {type(exc).__name__}: {exc}")
                results[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
            log(f"{name} took {time.monotonic() - t0:.0f} s")
    finally:
        remove_run_dirs()
        shutil.rmtree(root, ignore_errors=True)
    wall = time.monotonic() - started
    table_rows = rows(results)
    errors = {k: v for k, v in results.items() if k.endswith("_error")}
    for key, text in errors.items():
        table_rows.append([key.removesuffix("_error"), "", "ERROR: " + " ".join(text.split())[-300:], "", "", "", "",
                           "–"])
    title = f"{command} — {when}, {info['cpus']} CPUs, {wall:.0f} s"
    print_table(table_rows, title)
    RESULTS.mkdir(parents=True, exist_ok=True)
    # A partial run (--only) does not overwrite the last full table: it goes to only-<figures>.*
    stem = (f"only-{'-'.join(sorted(only))}" if only else "latest") + ("-real-login" if args.real_login else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps({
        "command": command, "argv": [shlex.quote(a) for a in sys.argv], "when": when, "machine": info,
        "loadavg_at_end": machine()["loadavg"], "wall_s": round(wall, 1), "results": results}, indent=2) + "\n")
    (RESULTS / f"{stem}.md").write_text(markdown(table_rows, command, when, info, wall))
    print(f"wrote {RESULTS.relative_to(REPO)}/{stem}.json and {stem}.md in {wall:.0f} s")
    draw_chart(results, stem, title)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
