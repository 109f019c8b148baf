"""Stopping a light run on N nodes (`sleep 600` in place of torchrun), four ways, each timed from the stop until no
process of the run is left on any node (polled every 20 ms):

- launcher, Ctrl-C: bench/_drive.py runs it attached; SIGINT to the launcher's process group.
- launcher, `inv stop --run ID` on a `--detach`ed run: a fresh process (imports included); its CPU seconds and its
  process tree's peak threads, file descriptors and memory are kept too.
- (a) an ssh loop started each node's `exec -a bench-TOKEN-$(hostname) sleep 600`; a second loop stops them with
  `pkill -f '^bench-TOKEN-<that node>$'` on every node, as one would by hand.
- (p) the same two commands through `pdsh -R ssh -f N`.
The sandbox's nodes share one process table, so each node's pkill names its own node (every node has its own
hostname): one node's pkill never stops another's sleep.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.baselines import have_pdsh, pdsh_argv, pdsh_env, ssh_loop_script
from bench.common import (
    DRIVER,
    REPO,
    RUN_ID,
    Box,
    finish,
    fit_line,
    kill_marked,
    log,
    note_runs,
    run_processes,
    sandbox_of,
    stats,
    wait_gone,
)
from bench.usage import Sampler
from devtools.sandbox import procs
from launcher.node.wire import RUN_ID_ENV

GONE_TIMEOUT_S = 60.0
UP_TIMEOUT_S = 120.0
SLEEP = ["sleep", "600"]
WAYS = ("sigint", "inv_stop", "ssh_loop", "pdsh")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _wait_for(predicate: Any, what: str, timeout: float = UP_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def _nodes_of_run(run_id: str) -> set[str]:
    """The nodes on which a process of the run is running (its mark says `<run id>/<node>`)."""
    prefix = f"{RUN_ID_ENV}={run_id}/".encode()
    nodes = set()
    for pid in run_processes(run_id):
        with contextlib.suppress(OSError):
            for var in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                if var.startswith(prefix):
                    nodes.add(var[len(prefix):])
    return nodes


def _named(prefix: bytes) -> list[int]:
    """Live processes whose argv[0] starts with `prefix` (the baselines' renamed sleeps; not the ssh clients or
    pkill, whose command lines only mention it)."""
    found = []
    for pid in procs.pids():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(prefix) and procs.alive(pid):
                found.append(pid)
    return found


def _spawn(argv: list[str], out: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(out, "wb") as sink:
        return subprocess.Popen(argv, cwd=REPO, env={**os.environ, **(env or {})}, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _drive(box: Box, root: Path, out: Path, detach: bool) -> subprocess.Popen[bytes]:
    argv = [*DRIVER, "--log-dir", str(root / "logs"),
            *(["--detach"] if detach else []), str(box.inventory), "--", *SLEEP]  # positionals last, together
    return _spawn(argv, out)


def _launcher_up(box: Box, out: Path, proc: subprocess.Popen[bytes] | None = None) -> str:
    """The run id once every node runs its sleep; raises at once if an attached launcher exited before that."""
    def run_id() -> str | None:
        if (m := RUN_ID.search(_read(out))):
            return m.group(1)
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the launcher exited ({proc.returncode}) before it started:\n{_read(out)[-2000:]}")
        return None

    run_id = _wait_for(run_id, "the run id")
    note_runs(f"run {run_id}")
    _wait_for(lambda: len(_nodes_of_run(run_id)) == box.n, f"a sleep on each of {box.n} nodes")
    return run_id


def sigint(box: Box, root: Path, k: int) -> dict[str, Any]:
    out = root / f"scale-attached-{box.n}-{k}.out"
    proc = _drive(box, root, out, detach=False)
    run_id = None
    try:
        run_id = _launcher_up(box, out, proc)
        start = time.perf_counter()
        os.killpg(proc.pid, signal.SIGINT)
        gone_s, left, _ = wait_gone(lambda: run_processes(run_id), GONE_TIMEOUT_S, start=start)
        code = finish(proc)
        return {"gone_s": gone_s, "left": left, "exit_s": time.perf_counter() - start, "code": code}
    finally:
        if proc.poll() is None:
            finish(proc, 0.1)
        if run_id:
            kill_marked(f"{RUN_ID_ENV}={run_id}/".encode())


def _timed_stop(argv: list[str], out: Path, env: dict[str, str], remaining: Callable[[], list[int]]) -> dict[str, Any]:
    """Run a stopper: seconds until `remaining()` is empty and until it exits, its exit code, CPU and peak usage."""
    start = time.perf_counter()
    stopper = _spawn(argv, out, env)
    sampler = Sampler(stopper.pid).start()
    gone_s, left, _ = wait_gone(remaining, GONE_TIMEOUT_S, start=start)
    _, status, usage = os.wait4(stopper.pid, 0)
    return {"gone_s": gone_s, "left": left, "exit_s": time.perf_counter() - start,
            "code": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak": sampler.stop().as_dict()}


def inv_stop(box: Box, root: Path, k: int) -> dict[str, Any]:
    out = root / f"scale-detached-{box.n}-{k}.out"
    run_id = None
    try:
        launch = _drive(box, root, out, detach=True)
        if finish(launch, UP_TIMEOUT_S) != 0:
            raise RuntimeError(f"the detached launch failed:\n{_read(out)[-2000:]}")
        run_id = _launcher_up(box, out)
        return _timed_stop([sys.executable, "-m", "invoke", "stop", "--hosts", str(box.inventory), "--run", run_id],
                           root / f"scale-stop-{box.n}-{k}.out", {"INVOKE_LAUNCHER_LOG_DIR": str(root / "logs")},
                           lambda: run_processes(run_id))
    finally:
        if run_id:
            kill_marked(f"{RUN_ID_ENV}={run_id}/".encode())


def baseline(box: Box, root: Path, k: int, way: str) -> dict[str, Any]:
    """(a) or (p): start a renamed sleep on every node, then stop them all with pkill the same way."""
    token = f"bench-{secrets.token_hex(4)}-"
    start_cmd = f"exec -a {token}$(hostname) {' '.join(SLEEP)}"
    stop_cmd = f"pkill -TERM -f \"^{token}$(hostname) \""
    if way == "ssh_loop":
        def argv(cmd: str) -> list[str]:
            return ["bash", "-c", ssh_loop_script(box.ssh_config, [cmd] * box.n)]
        env: dict[str, str] = {}
    else:
        def argv(cmd: str) -> list[str]:
            return pdsh_argv(box.n, cmd)
        env = pdsh_env(box.ssh_config)
    starter = _spawn(argv(start_cmd), root / f"scale-{way}-{box.n}-{k}.out", env)
    mine = token.encode()
    try:
        _wait_for(lambda: len(_named(mine)) == box.n, f"{way}: a sleep on each of {box.n} nodes")
        return _timed_stop(argv(stop_cmd), root / f"scale-{way}-stop-{box.n}-{k}.out", env, lambda: _named(mine))
    finally:
        for pid in _named(mine):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(starter.pid, signal.SIGKILL)
        starter.wait()


def run(sizes: list[int], repeat: int | dict[int, int], root: Path) -> dict[str, Any]:
    """Each way `repeat` times per N (a number, or N -> runs), in rotated order; a run that did not come up is
    recorded and tried again once."""
    ways = [w for w in WAYS if w != "pdsh" or have_pdsh()]
    rows, failures = [], []
    for n in sizes:
        runs = repeat if isinstance(repeat, int) else repeat.get(n, 2)
        results: dict[str, list[dict[str, Any]]] = {w: [] for w in ways}
        with sandbox_of(n, root, script="bench/workloads/lines.py") as box:
            log(f"stop at scale: {n} nodes, {runs} runs of {', '.join(ways)}")
            for k in range(runs):
                for way in ways[k % len(ways):] + ways[:k % len(ways)]:
                    for attempt in range(2):
                        try:
                            if way == "sigint":
                                results[way].append(sigint(box, root, 10 * k + attempt))
                            elif way == "inv_stop":
                                results[way].append(inv_stop(box, root, 10 * k + attempt))
                            else:
                                results[way].append(baseline(box, root, 10 * k + attempt, way))
                            break
                        except RuntimeError as exc:
                            failures.append({"nodes": n, "way": way, "error": str(exc)[-2500:]})
                            log(f"stop at scale: {way} on {n} nodes did not come up: {str(exc).splitlines()[0]}")
        row: dict[str, Any] = {"nodes": n}
        for way, got in results.items():
            gone = [r["gone_s"] for r in got if r["gone_s"] is not None]
            row[way] = {**stats(gone), "left_total": sum(r["left"] for r in got),
                        "timeouts": sum(r["gone_s"] is None for r in got), "runs_detail": got}
            if way != "sigint":
                row[way]["cpu_s"] = stats([r["cpu_s"] for r in got])
                for key in ("threads", "fds", "processes"):
                    row[way][f"peak_{key}"] = stats([r["peak"][key] for r in got])
                row[way]["tree_rss_mb"] = stats([round(r["peak"]["rss_kb"] / 1024, 1) for r in got])
        rows.append(row)
        log(f"stop at scale {n}: " + ", ".join(f"{w} {row[w]['median']}s, {row[w]['left_total']} left" for w in ways))
    fits = {w: fit_line([r["nodes"] for r in rows if r[w]["median"] is not None],
                        [r[w]["median"] for r in rows if r[w]["median"] is not None]) for w in ways}
    return {"rows": rows, "ways": ways, "start_failures": failures, "fits": fits,
            "repeat": repeat if isinstance(repeat, int) else {str(k): v for k, v in repeat.items()},
            "job": " ".join(SLEEP)}
