"""Shared pieces of the benchmarks: sandboxes on private addresses, the baselines, timing and statistics.

Every figure is compared with a baseline measured in the same run, at the same N, interleaved with it (launcher,
baseline, launcher, baseline, ...), so that the load of whatever else runs on this small machine falls on both.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from devtools import sandbox
from devtools.observe import end_runs_under, free_port, reserve_base_addr, run_processes, subnets_for
from devtools.observe import kill_marked as kill_marked  # re-exported: the figures end their runs by their mark
from devtools.observe import pids_with_env as pids_with_env  # re-exported: bench/stop.py takes it from here
from devtools.sandbox import procs
from launcher.node import wire
from launcher.transport.program import BOOTSTRAP

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
DRIVER = (sys.executable, "-m", "bench._drive")
"""The fan-out driver as a fresh process; started in REPO (run_timed's cwd), whose bench and launcher it imports."""
RUN_ID = re.compile(rf"run ({wire.RUN_ID_PATTERN})")
"""A run id as the launcher prints it (`run <id>`); group 1 is the id."""
MARK_ENV = wire.RUN_ID_ENV
"""The environment variable every process of a run carries (`<run id>/<node>`)."""
RUNS_ROOT = Path(os.path.expanduser(wire.RUNS_ROOT))
"""Where the agent keeps run directories on each node (the sandbox's nodes share this machine's home)."""
OUR_RUNS: set[str] = set()
"""Run ids this bench started; their run directories are removed at the end (the log figure's are large)."""


def note_runs(text: str) -> list[str]:
    """Remember the run ids printed in a launcher's output; returns them."""
    ids = sorted(set(RUN_ID.findall(text)))
    OUR_RUNS.update(ids)
    return ids


def node_run_dir(box: Box, index: int, run_id: str) -> Path:
    """Node `index`'s run directory of `run_id`: in the node's own cache home when the sandbox gives each node one
    (sandbox.node_cache), else in the home the nodes share."""
    shared = RUNS_ROOT / run_id / f"node-{index}"
    node_cache = getattr(sandbox, "node_cache", None)
    if node_cache is None:
        return shared
    own = node_cache(box.box.state_dir, index) / "ddp-launcher" / "runs" / run_id / f"node-{index}"
    return own if own.exists() or not shared.exists() else shared


def remove_run_dirs() -> int:
    """Remove the run directories of this bench's runs (only ours: colleagues' tests may be reading theirs)."""
    import shutil

    removed = 0
    for run_id in sorted(OUR_RUNS):
        if run_processes(run_id):
            continue
        path = RUNS_ROOT / run_id
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    OUR_RUNS.clear()
    return removed


# --------------------------------------------------------------------------------------------------------------
# Statistics.


def stats(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of a list of seconds (or any numbers), and the raw values."""
    vals = [float(v) for v in values]
    if not vals:
        return {"median": None, "min": None, "max": None, "runs": []}
    return {"median": round(statistics.median(vals), 4), "min": round(min(vals), 4), "max": round(max(vals), 4),
            "runs": [round(v, 4) for v in vals]}


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    if not a or not b or not a.get("median") or not b.get("median"):
        return None
    return round(a["median"] / b["median"], 3)


def paired_ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    """Median of run-by-run ratios a[k]/b[k] (runs interleaved, so a slow spell of the machine hits both)."""
    if not a or not b or len(a["runs"]) != len(b["runs"]) or not a["runs"]:
        return None
    return round(statistics.median(x / y for x, y in zip(a["runs"], b["runs"], strict=True) if y), 3)


# --------------------------------------------------------------------------------------------------------------
# Sandboxes that never collide with the tests' (they count K from 10; we take 200 and up).


def reserve_subnet(nodes: int, first: int = 200) -> tuple[str, contextlib.ExitStack]:
    """A base address 127.0.K.2 for `nodes` nodes that no other sandbox uses (K from 200: the tests count from 10)."""
    return reserve_base_addr(first, 250, subnets_for(nodes))


@dataclass
class Box:
    """A running sandbox for the bench: its files, python and master port."""

    box: sandbox.Sandbox
    n: int
    master_port: int
    python: str
    root: Path

    @property
    def inventory(self) -> Path:
        return self.box.inventory

    @property
    def ssh_config(self) -> Path:
        return self.box.ssh_config

    @property
    def addrs(self) -> list[str]:
        return [node.addr for node in self.box.nodes]

    @property
    def tmp_env(self) -> str:
        """`TMPDIR=...` for a baseline's torchrun: without --log-dir it leaves a torchelastic_* folder in $TMPDIR;
        this one goes away with the bench's scratch folder."""
        return f"TMPDIR={shlex.quote(str(self.root))} "


LOGIN_RC = sandbox.PATH_ONLY_RC
"""The bench's nodes log in with a ~/.bashrc of their own that only sets PATH (why: PATH_ONLY_RC; 8 nodes queued
0.6-1.3 s on pyenv's lock for the ssh loop from run to run, each login ~50 ms of CPU on it); every method here logs
in the same way."""


REAL_LOGIN_ENV = "BENCH_REAL_LOGIN"
"""Set (`python -m bench.run --real-login`): the nodes log in with this machine's own ~/.bashrc (pyenv in a shared
home, as labs with NFS homes have) in place of LOGIN_RC, for every method alike."""


@contextlib.contextmanager
def sandbox_of(n: int, root: Path, *, script: str = "train/ddp.py", script_args: Sequence[str] = (),
               nproc_per_node: int = 1, node_env: dict[int, dict[str, str]] | None = None) -> Iterator[Box]:
    """A sandbox of `n` nodes on a free 127.0.K.2+ and a free master port; always brought down. `node_env`: more of
    node i's sessions' environment (its container runtime's own storage)."""
    base, lock = reserve_subnet(n)
    folder = Path(tempfile.mkdtemp(prefix=f"n{n}-", dir=root))
    state = folder / "state"
    port = free_port()
    try:
        box = sandbox.up(n, state_dir=state, inventory=folder / "sandbox.yaml", base_addr=base, master_port=port,
                         script=script, script_args=list(script_args), nproc_per_node=nproc_per_node,
                         ready_timeout=30.0, login_rc=None if os.environ.get(REAL_LOGIN_ENV) else LOGIN_RC,
                         node_env=node_env)
        yield Box(box, n, port, sandbox.default_python(), folder)
    finally:
        try:
            for i in range(n):  # a run the figure left (its launcher killed) lives on within its bound: not here
                end_runs_under(sandbox.node_cache(state, i))
            sandbox.down(state)
        finally:
            lock.close()


# --------------------------------------------------------------------------------------------------------------
# Processes.


@dataclass
class Timed:
    seconds: float
    code: int
    stdout: str
    stderr: str
    cpu_s: float = 0.0
    """User + system CPU seconds of the process and the children it waited for."""
    maxrss_kb: int = 0
    """ru_maxrss from wait4() (kB). Beware: a forked child keeps its parent's high-water mark across exec, so
    this is at least the bench's own size; the fan-out driver reports its own VmHWM instead."""
    peak: dict[str, int] | None = None
    """With `sample=True`: the process tree's peak processes, threads, fds and RSS (kB), sampled (bench/usage.py)."""
    began: float = 0.0
    """The wall clock (time.time()) at the spawn: what a job's own wall-clock lines are measured from."""


def finish(proc: subprocess.Popen[bytes], timeout: float = 30) -> int | None:
    """The exit code of a process started in a session of its own; None when it had to be killed (its group)."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None


def run_timed(argv: Sequence[str], *, timeout: float = 300, env: dict[str, str] | None = None,
              stdout: int | IO[Any] | None = subprocess.PIPE, cwd: Path = REPO, sample: bool = False) -> Timed:
    """Run a process to its end; wall time from spawn to exit, with its CPU and peak memory from wait4().

    `sample`: also watch its process tree's threads, fds and memory while it runs (Timed.peak).
    """
    full_env = {**os.environ, **(env or {})}
    began, start = time.time(), time.perf_counter()
    proc = subprocess.Popen(list(argv), cwd=cwd, env=full_env, stdout=stdout, stderr=subprocess.PIPE,
                            start_new_session=True)
    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []
    # Read both pipes without deadlock; threads keep the wait4() for this exact pid (its own rusage).
    import threading

    def drain(pipe: IO[bytes] | None, into: list[bytes]) -> None:
        if pipe is None:
            return
        for chunk in iter(lambda: pipe.read(1 << 16), b""):
            into.append(chunk)

    readers = [threading.Thread(target=drain, args=(proc.stdout, out_chunks), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, err_chunks), daemon=True)]
    for t in readers:
        t.start()
    sampler = None
    if sample:
        from bench.usage import Sampler

        sampler = Sampler(proc.pid).start()
    deadline = start + timeout
    status = None
    usage = None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.002)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in readers:
        t.join(10)
    return Timed(seconds, proc.returncode, b"".join(out_chunks).decode("utf-8", "replace"),
                 b"".join(err_chunks).decode("utf-8", "replace"),
                 cpu_s=usage.ru_utime + usage.ru_stime, maxrss_kb=usage.ru_maxrss,
                 peak=sampler.stop().as_dict() if sampler else None, began=began)


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float] | None:
    """Least squares y = fixed + per_node * x, with r²; None with fewer than two distinct x."""
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    fixed = my - slope * mx
    total = sum((y - my) ** 2 for y in ys)
    residual = sum((y - fixed - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return {"fixed": round(fixed, 4), "per_node": round(slope, 5),
            "r2": round(1 - residual / total, 4) if total else 1.0, "points": len(xs)}


def wait_gone(find: Callable[[], list[int]], timeout: float, poll: float = 0.02,
              start: float | None = None) -> tuple[float | None, int, float | None]:
    """Wait until `find` (a full /proc scan) finds nothing.

    Between full scans only the pids found so far are watched (a scan of every process's environment every 20 ms
    would take a good part of a core from the very stop it measures); a full scan confirms the end.
    Returns (seconds until none was left, or None on timeout; how many were left at the end; seconds until the
    first of them was gone, i.e. when the stop reached the processes), all from `start` (default: now).
    """
    start = time.perf_counter() if start is None else start
    watched = set(find())
    first_drop = None
    while True:
        now = time.perf_counter() - start
        live = {pid for pid in watched if procs.alive(pid)}  # a zombie has no environment: the scans skip it too
        if first_drop is None and live != watched:
            first_drop = now
        if not live:
            again = set(find())
            if not again:
                return now, 0, first_drop if first_drop is not None else now
            watched = again
            continue
        if now > timeout:
            return None, len(set(find())), first_drop
        time.sleep(poll)


def machine() -> dict[str, Any]:
    import platform

    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def read_text(path: Path) -> str:
    """A file's text as it is now; "" when it is not there (yet)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, poll: float) -> Any:
    """predicate()'s first true value, polled every `poll` s; RuntimeError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def run_alone(name: str, run: Callable[[Path], dict[str, Any]]) -> int:
    """A figure's module run by itself (`python -m bench.NAME`): `run(scratch folder)`, its result printed and
    written to bench/results/NAME.json; the scratch folder removed after."""
    root = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    try:
        result = run(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0



def node_agents() -> set[int]:
    """Node agents now running on this machine: Pythons with the bootstrap as an argument of their own (`-c`); not
    the login shells that started them, whose one argument is the whole command line that holds it."""
    found = set()
    for pid in procs.pids_mentioning(BOOTSTRAP):
        try:
            if BOOTSTRAP.encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.add(pid)
        except OSError:
            continue
    return found
