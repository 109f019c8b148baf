"""A real SLURM cluster on the sandbox: one munged, one slurmctld, and a slurmd inside each node's namespaces."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, NamedTuple

from devtools.sandbox import procs
from devtools.sandbox.limits import SANDBOX_STOP_LIMIT_S, SandboxError
from devtools.sandbox.procs import Ident
from devtools.sandbox.render import node_cache
from devtools.sandbox.slurmconf import (
    SLURM_CONF_NAME,
    TASK_PROLOG,
    SlurmNode,
    free_ports,
    render_slurm_conf,
    render_task_prolog,
    slurm_dir,
    slurm_env,
    spool_dir,
)
from devtools.sandbox.start import last_lines, read_text
from devtools.sandbox.stop import scan, terminate

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
SLURMSTEPD = "/usr/sbin/slurmstepd"


def require_tools() -> str:
    """Fail early, in one sentence, when SLURM or munge is missing; return nsenter's path."""
    missing = [path for path in (MUNGED, SLURMCTLD, SLURMD, SLURMSTEPD) if not os.access(path, os.X_OK)]
    missing += [tool for tool in ("sinfo", "srun") if shutil.which(tool) is None]
    if missing:
        raise SandboxError(
            f"the SLURM sandbox needs {missing[0]}: install SLURM and munge with"
            " `apt-get install slurm-wlm munge` (scripts/setup does)."
        )
    nsenter = shutil.which("nsenter")
    if nsenter is None:
        raise SandboxError("the SLURM sandbox needs `nsenter` (util-linux) on PATH.")
    return nsenter


# ---------------------------------------------------------------------------------------------------------
# Starting.


def start(state_dir: Path, nodes: Sequence[tuple[str, str, Ident]], timeout: float = 30.0) -> dict[str, Any]:
    """Start munged, slurmctld and, for each node (name, address, its sshd's (pid, start time)), a slurmd in
    that sshd's UTS and mount namespaces; return the record for the state file once sinfo shows every node idle.

    Nothing is left running when it raises.
    """
    nsenter = require_tools()
    folder = slurm_dir(state_dir)
    spool = spool_dir(state_dir)
    for old in (folder, spool):  # a fresh cluster: no jobs or node states of an earlier one
        shutil.rmtree(old, ignore_errors=True)
    for sub in ("state", "log"):
        (folder / sub).mkdir(parents=True)
    for name, _, _ in nodes:
        (spool / name).mkdir(parents=True)
    ports = free_ports(len(nodes) + 1)
    slurm_nodes = [SlurmNode(name, addr, port) for (name, addr, _), port in zip(nodes, ports[1:], strict=True)]
    prolog = folder / TASK_PROLOG
    prolog.write_text(render_task_prolog({name: node_cache(state_dir, i) for i, (name, _, _) in enumerate(nodes)}))
    prolog.chmod(0o755)
    conf = folder / SLURM_CONF_NAME
    conf.write_text(render_slurm_conf(folder, ports[0], slurm_nodes, spool=spool), encoding="utf-8")
    # Another cluster's SLURM_* (say, `inv sandbox.up` run inside an allocation) must not reach our daemons.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | slurm_env(state_dir)
    deadline = time.monotonic() + timeout
    daemons: list[dict[str, Any]] = []
    try:
        _write_munge_key(folder / "munge.key")
        daemons.append(_start_daemon(_munged(folder, spool), env, deadline, daemons))
        # `-f conf` although SLURM_CONF says it too: the command line names this cluster's folder (see _running).
        ctld = _Daemon("slurmctld", SLURMCTLD, [SLURMCTLD, "-f", str(conf)], "slurmctld")
        daemons.append(_start_daemon(ctld, env, deadline, daemons))
        for name, _, (node_pid, node_start) in nodes:
            # nsenter execs slurmd (no fork for these namespaces); slurmd then daemonizes inside them.
            argv = [nsenter, "-t", str(node_pid), "--uts", "--mount", SLURMD, "-f", str(conf), "-N", name]
            record = _start_daemon(_Daemon(f"slurmd {name}", SLURMD, argv, f"slurmd-{name}"), env, deadline, daemons)
            daemons.append({**record, "node": name, "node_pid": node_pid, "node_start_time": node_start})
        _wait_idle(folder, env, daemons, [name for name, _, _ in nodes], timeout, deadline)
    except BaseException:  # Ctrl-C included: nothing half-started stays behind
        _stop_partial(folder, daemons, [ident for _, _, ident in nodes])
        shutil.rmtree(spool, ignore_errors=True)
        raise
    return {"conf": str(conf), "spool": str(spool), "daemons": daemons}


class _Daemon(NamedTuple):
    """How to start one daemon of the cluster."""

    name: str
    """For messages and the state file: munged, slurmctld, slurmd node-0, ..."""
    exe: str
    """The daemon's executable (argv may start with nsenter)."""
    argv: list[str]
    """It forks itself away."""
    stem: str
    """Its pid file is FOLDER/STEM.pid, its log FOLDER/log/STEM.log."""


_DAEMONS = (MUNGED, SLURMCTLD, SLURMD)


def _write_munge_key(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)  # this cluster's own key, never shared
    try:
        os.write(fd, os.urandom(128))  # what `mungekey -c` writes: 1024 random bits
    finally:
        os.close(fd)


def _munged(folder: Path, spool: Path) -> _Daemon:
    return _Daemon(
        "munged",
        MUNGED,
        [
            MUNGED,
            # As root, with --force: the state folder may sit under a private folder (pytest's tmp is 0700), which
            # the munge user cannot enter and munged calls "inaccessible"; every client here (slurm*, srun) is root.
            "--force",
            f"--socket={spool}/munge.socket",  # beside the slurmds' sockets: a short path
            f"--key-file={folder}/munge.key",
            f"--pid-file={folder}/munged.pid",
            f"--log-file={folder}/log/munged.log",
            f"--seed-file={folder}/munged.seed",
        ],
        "munged",
    )


def _start_daemon(
    daemon: _Daemon, env: Mapping[str, str], deadline: float, started: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Run `daemon`; return its record once its pid file names a live process of its executable. Raises, with its
    log, once no such process is left (the `started` ones aside) before it wrote the pid file."""
    folder = Path(env["SLURM_CONF"]).parent
    pid_file, log = folder / f"{daemon.stem}.pid", folder / "log" / f"{daemon.stem}.log"
    out = folder / "log" / f"{daemon.stem}.out"
    with open(out, "wb") as sink:  # a file, not a pipe: the daemon would hold a pipe open and `run` wait on it
        try:
            done = subprocess.run(
                daemon.argv,
                env=env,
                cwd=folder,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                start_new_session=True,  # before it daemonizes too, it is in no group of ours
                timeout=max(1.0, deadline - time.monotonic()),
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SandboxError(f"{daemon.name} did not start in time; see {log}") from None
    if done.returncode != 0:
        why = last_lines(read_text(out) or read_text(log))
        raise SandboxError(f"{daemon.name} failed to start (exit {done.returncode}): {why}; see {log}")
    real, known = os.path.realpath(daemon.exe), {d["pid"] for d in started}
    settled = time.monotonic() + 0.5  # by then its double fork is done: a daemon that is not running has died
    while True:
        text = read_text(pid_file).strip()
        if text.isdigit() and procs.alive(int(text)) and procs.exe(int(text)) == real:
            pid = int(text)
            return {"name": daemon.name, "exe": daemon.exe, "pid": pid, "start_time": procs.start_time(pid),
                    "log": str(log)}
        now = time.monotonic()
        if now > deadline or (now > settled and not set(_running(folder, daemon.exe)) - known):
            why = "did not write its pid file in time" if now > deadline else "exited"
            raise SandboxError(f"{daemon.name} {why}: {last_lines(read_text(log))}; see {log}")
        time.sleep(0.02)


def _running(folder: Path, exe: str) -> list[int]:
    """Live processes of `exe` started for the cluster in `folder`: each names a file of it on its command line."""
    real = os.path.realpath(exe)
    return [pid for pid in procs.pids_mentioning(f"{folder}/") if procs.exe(pid) == real]


def _wait_idle(
    folder: Path,
    env: Mapping[str, str],
    daemons: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    timeout: float,
    deadline: float,
) -> None:
    """Return once sinfo shows every node idle; raise with the log of a daemon that died or of a node that isn't."""
    while True:
        for d in daemons:
            if not procs.alive(d["pid"], d["start_time"]):
                raise SandboxError(f"{d['name']} exited: {last_lines(read_text(Path(d['log'])))}; see {d['log']}")
        states = _node_states(env)
        pending = [name for name in names if states.get(name) != "idle"]
        if not pending:
            return
        if time.monotonic() > deadline:
            log = folder / "log" / (f"slurmd-{pending[0]}.log" if states else "slurmctld.log")
            seen = states.get(pending[0], "not listed by sinfo")
            raise SandboxError(f"SLURM node {pending[0]} is not idle within {timeout:g} s ({seen}); see {log}")
        time.sleep(0.1)


def _node_states(env: Mapping[str, str]) -> dict[str, str]:
    """Node name -> state (idle, down*, ...) from sinfo; empty while slurmctld does not answer."""
    try:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True, timeout=10, check=False
        )
    except subprocess.TimeoutExpired:
        return {}
    if done.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in done.stdout.splitlines() if len(line.split()) == 2)


# ---------------------------------------------------------------------------------------------------------
# Stopping: the recorded daemons that are still ours (pid, start time, executable), and the job steps they ran.


def stop(record: Mapping[str, Any], nodes: Collection[str] | None = None) -> list[str]:
    """Stop the cluster of `record` (slurmctld, then the slurmds with their job steps, then munged); one line per
    daemon. With `nodes`, only those nodes' slurmds and steps."""
    daemons = record["daemons"]
    slurmds = [d for d in daemons if d["exe"] == SLURMD and (nodes is None or d["node"] in nodes)]
    lines: list[str] = []
    if nodes is None:  # first: while its slurmds answer it exits at once; after them it hangs until SIGKILL
        lines += _stop_daemons([d for d in daemons if d["exe"] == SLURMCTLD], strays=())
    lines += _stop_daemons(slurmds, strays=(SLURMD, SLURMSTEPD))
    if nodes is None:
        lines += _stop_daemons([d for d in daemons if d["exe"] == MUNGED], strays=())
        if record.get("spool"):
            shutil.rmtree(record["spool"], ignore_errors=True)
    return lines


def _is_ours(daemon: Mapping[str, Any]) -> bool:
    """The recorded process is alive and still runs the daemon's executable."""
    pid, real = daemon["pid"], os.path.realpath(daemon["exe"])
    return procs.alive(pid, daemon["start_time"]) and procs.exe(pid) == real


def _stop_daemons(daemons: Sequence[Mapping[str, Any]], strays: Iterable[str]) -> list[str]:
    """Stop `daemons` that are still ours, their families, and the `strays` executables in their nodes' namespaces
    (slurmstepd: slurmd double-forks it away, so only its namespace ties it to the node)."""
    lines: list[str] = []
    leaders: list[Ident] = []
    spaces: list[Ident] = []
    for d in daemons:
        label = f"SLURM {d['name']} (pid {d['pid']})"
        if "node_pid" in d:
            spaces.append((d["node_pid"], d["node_start_time"]))
        if _is_ours(d):
            leaders.append((d["pid"], d["start_time"]))
            spaces.append((d["pid"], d["start_time"]))
            lines.append(f"{label}: stopped")
        elif procs.alive(d["pid"], d["start_time"]):
            lines.append(f"{label}: left alone: that pid is no longer the sandbox's {Path(d['exe']).name}")
        else:
            lines.append(f"{label}: already stopped")
    killed = _stop_all(leaders, strays, spaces)
    return [line + (" (needed SIGKILL)" if d["pid"] in killed else "") for d, line in zip(daemons, lines, strict=True)]


def _stop_all(leaders: Sequence[Ident], strays: Iterable[str], spaces: Sequence[Ident]) -> set[int]:
    """TERM, grace, KILL the `leaders`, the processes of `strays` executables in the namespaces of `spaces`, and
    the families of all of them, until none is left; return the pids that needed SIGKILL.

    The leaders go first, alone: a daemon stops its own helpers, and slurmctld signalled together with its
    slurmscriptd hangs in its shutdown until SIGKILL. Their groups keep the helpers findable afterwards.
    """
    stray_exes = frozenset(os.path.realpath(exe) for exe in strays)
    killed: set[int] = set()
    groups: set[int] = set()
    alone = True
    deadline = time.monotonic() + SANDBOX_STOP_LIMIT_S
    with procs.Namespaces("uts") as nodes:
        for ident in spaces:  # held before any signal: a node's stray steps stay findable after its slurmd dies
            nodes.hold(*ident)
        while True:
            live, targets, groups = scan(leaders, groups, nodes, stray_exes)
            if not targets:
                return killed
            if time.monotonic() > deadline:
                left = ", ".join(str(pid) for pid, _ in targets)
                raise SandboxError(f"could not stop processes {left} within {SANDBOX_STOP_LIMIT_S:g} s; "
                                   "kill them by hand.")
            if alone and live:
                killed |= terminate(live)
            else:
                _kill_steps(targets)
                killed |= terminate(targets)
            alone = False


def _kill_steps(targets: Sequence[Ident]) -> None:
    """SIGKILL the slurmstepds among `targets`: they block SIGTERM, so a TERM would only cost the grace period."""
    stepd = os.path.realpath(SLURMSTEPD)
    for pid, start_time in targets:
        if procs.exe(pid) == stepd and procs.alive(pid, start_time):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _stop_partial(folder: Path, daemons: Sequence[Mapping[str, Any]], nodes: Sequence[Ident]) -> None:
    """After a failed start: stop the daemons recorded so far, any that forked before writing its pid file, and
    the steps in the nodes' namespaces."""
    leaders = {(d["pid"], d["start_time"]) for d in daemons if _is_ours(d)}
    leaders |= {(pid, procs.start_time(pid)) for exe in _DAEMONS for pid in _running(folder, exe)}
    _stop_all(sorted(leaders), (SLURMD, SLURMSTEPD), nodes)
