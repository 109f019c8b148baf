"""A run's lifecycle across nodes: start every node's part at once, stream, fail fast, stop, status, logs.

The node side is `launcher/agent.py`, sent over each node's SSH connection; this module drives it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from launcher.errors import ConnectError, LauncherError, NodeFailure, RunFailed
from launcher.inventory import Cluster, Host
from launcher.logs import NodeLog, failed_rank, root_cause_block, supports_colour
from launcher.options import Options
from launcher.plan import RUN_ID_ENV, LaunchPlan, NodeCommand, rank_offsets
from launcher.remote import program_input, python_command
from launcher.transport import Channel, Node, Result, close_all, connect_all, run_all

AGENT_SOURCE = (Path(__file__).with_name("agent.py")).read_text(encoding="utf-8")
HEARTBEAT_SECONDS = 5.0
# Messages of a worker that died only because a peer died first: never the root cause when another exists.
COLLATERAL = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator",
              "ProcessGroupNCCL", "Socket Timeout", "SignalException", "Signals.SIGTERM")


agent_command = python_command


def agent_input(request: dict[str, Any]) -> bytes:
    """The agent's source and one request, for its stdin."""
    return program_input(AGENT_SOURCE, request)


def resolve_env(command: NodeCommand, environ: dict[str, str]) -> dict[str, str]:
    """Values for the node's environment; `from_env` ones come from the controller's environment now."""
    values = {}
    for var in command.env:
        if var.from_env is not None:
            if var.from_env not in environ:
                raise LauncherError(f"{command.host.name}: env {var.name} is to be copied from ${var.from_env}, "
                                    f"which is not set here; export it or remove it from the inventory")
            values[var.name] = environ[var.from_env]
        else:
            values[var.name] = var.value or ""
    return values


def start_request(plan: LaunchPlan, command: NodeCommand, env: dict[str, str], opts: Options) -> dict[str, Any]:
    return {
        "action": "start",
        "run_dir": command.run_dir,
        "mark": f"{plan.run_id}/{command.host.name}",
        "workdir": command.workdir,
        "argv": list(command.argv),
        "expand_home": list(command.home_words),
        "env": env,
        "secret_names": [v.name for v in command.env if v.secret],
        "node_rank": command.node_rank,
        "detach": opts.detach,
        "grace": opts.grace,
        "heartbeat_timeout": opts.heartbeat_timeout,
    }


class _Progress:
    """`connected 14/16`-style progress: one rewritten line on a terminal, one plain line otherwise."""

    def __init__(self, err: IO[str]):
        self.err = err
        self.tty = err.isatty()

    def update(self, text: str) -> None:
        if self.tty:
            self.err.write(f"\r\x1b[K{text}")
            self.err.flush()

    def done(self, text: str) -> None:
        self.err.write(f"\r\x1b[K{text}\n" if self.tty else f"{text}\n")
        self.err.flush()


def connect_or_fail(cluster: Cluster, hosts: Iterable[Host], opts: Options) -> dict[str, Node]:
    """Connect to every host at once; any failure closes the rest and raises `ConnectError`."""
    progress = _Progress(opts.err)
    hosts = list(hosts)
    progress.update(f"connecting to {len(hosts)} node(s)")
    t0 = time.monotonic()
    nodes, failures = connect_all(cluster, hosts, opts.connect_timeout,
                                  on_connect=lambda done, total: progress.update(f"connected {done}/{total}"))
    if failures:
        close_all(nodes.values())
        progress.done(f"connected {len(nodes)}/{len(hosts)}")
        raise ConnectError(failures)
    progress.done(f"connected {len(nodes)}/{len(hosts)} in {time.monotonic() - t0:.1f}s")
    return nodes


class _Session:
    """One node's running agent: a reader thread turns its channel into events on a shared queue."""

    def __init__(self, command: NodeCommand, channel: Channel, events: queue.Queue[tuple[str, str, Any]]):
        self.command = command
        self.name = command.host.name
        self.channel = channel
        self.events = events
        self.started = False
        self.exit_code: int | None = None
        self.exit_time: float | None = None
        self.error_text: list[str] = []
        self.stop_sent = False
        self.stopped_left: int | None = None
        self.thread = threading.Thread(target=self._read, daemon=True, name=f"read-{self.name}")

    def _read(self) -> None:
        err_rest = b""
        while True:
            out, err = self.channel.read()
            if out:
                self.events.put(("out", self.name, out))
            if err:
                *lines, err_rest = (err_rest + err).split(b"\n")
                for line in lines:
                    self.events.put(("err", self.name, line))
            if self.channel.finished:
                self.events.put(("exit", self.name, self.channel.exit_code()))
                return
            if self.channel.closed and not out and not err:
                self.events.put(("lost", self.name, None))
                return
            if not out and not err:
                self.channel.wait_readable(0.5)

    def send(self, word: str) -> None:
        self.channel.send(f"{word}\n".encode())


def launch(plan: LaunchPlan, opts: Options | None = None) -> int:
    """Start the plan on every node at once and (unless detached) stream it to its end.

    Returns 0 when every node's torchrun exited 0; raises `RunFailed` with the root cause otherwise.
    """
    opts = opts or Options()
    cluster = plan.cluster
    envs = {c.host.name: resolve_env(c, dict(os.environ)) for c in plan.nodes}  # before connecting anywhere
    nodes = connect_or_fail(cluster, cluster.hosts, opts)
    try:
        if opts.preflight is not None:
            opts.preflight(cluster, nodes)
        with _interrupt_on(signal.SIGTERM, signal.SIGHUP):
            return _Run(plan, opts, nodes, envs).execute()
    finally:
        close_all(nodes.values())


@contextlib.contextmanager
def _interrupt_on(*signals: signal.Signals) -> Iterator[None]:
    """Treat these signals like Ctrl-C while a run is attached: the run is stopped on every node, not orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, interrupt) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class _Run:
    """The controller's view of one run while it is attached."""

    def __init__(self, plan: LaunchPlan, opts: Options, nodes: dict[str, Node], envs: dict[str, dict[str, str]]):
        self.plan = plan
        self.opts = opts
        self.nodes = nodes
        self.envs = envs
        self.events: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        colour = supports_colour(opts.out)
        width = max(len(c.host.name) for c in plan.nodes)
        mirror = opts.log_dir / plan.run_id
        self.logs = {c.host.name: NodeLog(c.host.name, i, width, c.rank_offset,
                                          None if opts.detach else mirror / f"{c.host.name}.log", colour)
                     for i, c in enumerate(plan.nodes)}
        self.sessions: dict[str, _Session] = {}
        self.interrupts = 0
        self.failure: str | None = None
        self.stop_reason: str | None = None

    def execute(self) -> int:
        progress = _Progress(self.opts.err)
        t0 = time.monotonic()
        for command in self.plan.nodes:
            node = self.nodes[command.host.name]
            try:
                channel = node.open_channel(agent_command(command.host.python))
            except Exception as exc:
                self._abort_start(f"{command.host.name}: cannot open a session: {exc}")
                break
            session = _Session(command, channel, self.events)
            self.sessions[session.name] = session
            request = start_request(self.plan, command, self.envs[session.name], self.opts)
            channel.send(agent_input(request))
            session.thread.start()
        total = len(self.plan.nodes)
        try:
            while self.failure is None and not all(s.started or s.exit_code is not None
                                                   for s in self.sessions.values()):
                self._pump(0.2)
                progress.update(f"started {sum(s.started for s in self.sessions.values())}/{total}")
        except KeyboardInterrupt:
            self._abort_start("interrupted while starting")
        if self.failure is None:
            started = sum(s.started for s in self.sessions.values())
            progress.done(f"started {started}/{total} in {time.monotonic() - t0:.1f}s: run {self.plan.run_id}")
        if self.opts.detach and self.failure is None:
            self._drain(deadline=time.monotonic() + 30)
            self.opts.err.write(f"detached: run {self.plan.run_id} keeps going; `inv status`, `inv logs "
                                f"--follow` and `inv stop` work on it\n")
            return 0
        return self._attend()

    def _abort_start(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            self._stop_all("start failed")

    def _stop_all(self, reason: str, word: str = "stop") -> None:
        self.stop_reason = self.stop_reason or reason
        for session in self.sessions.values():
            if session.exit_code is None and (not session.stop_sent or word == "kill"):
                session.stop_sent = True
                session.send(word)

    def _pump(self, timeout: float) -> None:
        try:
            kind, name, data = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        session = self.sessions[name]
        if kind == "out":
            self.logs[name].feed(data, self.opts.out)
        elif kind == "err":
            self._on_event(session, data)
        elif kind in ("exit", "lost"):
            session.exit_code = data if kind == "exit" else -1
            session.exit_time = time.time()
            self.logs[name].close(self.opts.out)
            if kind == "lost":
                session.error_text.append("the connection to the node was lost")
            if session.exit_code != 0 and not session.stop_sent and not self.opts.detach:
                if not session.started:
                    self._abort_start(f"{name}: " + ("; ".join(session.error_text) or
                                                     f"the agent exited with code {session.exit_code}"))
                else:
                    self._stop_all(f"{name} failed")

    def _on_event(self, session: _Session, line: bytes) -> None:
        try:
            event = json.loads(line)
            kind = event["event"]
        except (ValueError, KeyError, TypeError):
            text = line.decode("utf-8", errors="replace").strip()
            if text:
                session.error_text.append(text)  # the shell's own words, e.g. "python3: command not found"
            return
        if kind == "started":
            session.started = True
        elif kind == "error":
            session.error_text.append(event.get("message", "unknown error"))
        elif kind == "stopped":
            session.stopped_left = event.get("left")

    def _attend(self) -> int:
        last_beat = time.monotonic()
        while any(s.exit_code is None for s in self.sessions.values()):
            try:
                self._pump(0.2)
                # Several beats per timeout, so one late beat (a loaded controller) never stops a healthy run.
                if time.monotonic() - last_beat > min(HEARTBEAT_SECONDS, self.opts.heartbeat_timeout / 4):
                    last_beat = time.monotonic()
                    for s in self.sessions.values():
                        if s.exit_code is None:
                            s.send("hb")
            except KeyboardInterrupt:
                self.interrupts += 1
                if self.interrupts == 1:
                    self.opts.err.write(f"\ninterrupted: stopping the run on every node (TERM, then KILL after "
                                        f"{self.opts.grace:g}s; Ctrl-C again to kill now)\n")
                    self._stop_all("interrupted")
                else:
                    self.opts.err.write("\nkilling the run on every node now\n")
                    self._stop_all("interrupted", word="kill")
        self._drain(deadline=time.monotonic() + 1)
        return self._report()

    def _drain(self, deadline: float) -> None:
        while time.monotonic() < deadline and not self.events.empty():
            self._pump(0.05)

    def _report(self) -> int:
        sessions = list(self.sessions.values())
        err = self.opts.err
        log_hint = f"logs: {self.opts.log_dir / self.plan.run_id}/"
        if self.interrupts:
            left = sum(s.stopped_left or 0 for s in sessions)
            err.write(f"run {self.plan.run_id} stopped on {len(sessions)} node(s)"
                      f"{'' if not left else f'; {left} process(es) could not be killed'}. {log_hint}\n")
            return 130
        failed = [s for s in sessions if s.exit_code != 0]
        if not failed and self.failure is None:
            err.write(f"run {self.plan.run_id}: all {len(sessions)} node(s) exited 0. {log_hint}\n")
            return 0
        raise self._failure(failed)

    def _origin(self, failed: list[_Session]) -> _Session | None:
        """The first failure by time, preferring a node whose workers did not merely lose a peer."""
        own = [s for s in failed if not s.stop_sent] or failed
        if not own:
            return None

        def collateral(s: _Session) -> bool:
            block = "\n".join(root_cause_block(list(self.logs[s.name].tail)))
            return bool(block) and any(word in block for word in COLLATERAL)

        return sorted(own, key=lambda s: (collateral(s), s.exit_time or 0))[0]

    def _failure(self, failed: list[_Session]) -> RunFailed:
        """The report of a failed run: the root cause (node, rank, exit code, its log) and the other nodes."""
        if self.failure is not None:
            others = [s.name for s in self.sessions.values() if s.started]
            stopped = f"; stopped what had started on {', '.join(others)}" if others else "; nothing was started"
            return RunFailed(f"run {self.plan.run_id} could not start: {self.failure}{stopped}", 1)
        origin = self._origin(failed)
        lines = [f"run {self.plan.run_id} FAILED"]
        code = 1
        if origin is not None:
            tail = list(self.logs[origin.name].tail)
            block = root_cause_block(tail)
            rank, local, worker_code = failed_rank(block)
            # The worker's own exit code says more than torchrun's (which is 1 for any worker failure).
            code = worker_code if worker_code else (origin.exit_code or 1)
            code = 128 - code if code < 0 else code  # a worker killed by signal N: 128+N, like a shell
            who = origin.name + (f", rank {rank} (local rank {local})" if rank is not None else "")
            lines.append(f"root cause: {who}, exit code {code}")
            lines += [f"  {line}" for line in (block or tail[-15:])] + [f"  {t}" for t in origin.error_text]
        for s in failed:
            if s is not origin:
                why = "stopped by the launcher" if s.stop_sent else "failed too"
                lines.append(f"{s.name}: exit code {s.exit_code} ({why})")
        lines.append(f"logs: {self.opts.log_dir / self.plan.run_id}/")
        return RunFailed("\n".join(lines), code if code > 0 else 1)


# --- stop, status, logs: each one agent action per node, all nodes in parallel -----------------------------


def _agent_action(nodes: dict[str, Node], cluster: Cluster, request: dict[str, Any],
                  timeout: float | None = 60) -> dict[str, Result | NodeFailure]:
    hosts = [h for h in cluster.hosts if h.name in nodes]
    commands = {h.name: agent_command(h.python) for h in hosts}
    inputs = {h.name: agent_input({**request, "node": h.name}) for h in hosts}
    return run_all([nodes[h.name] for h in hosts], commands, inputs, timeout)


@dataclass
class NodeState:
    """One node's answer to status or stop."""

    host: str
    state: str
    """running, exited, stopped, lost, none (no such run), unreachable or error."""
    run_id: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    found: int = 0
    left: int = 0
    detail: str = ""


def _states(cluster: Cluster, request: dict[str, Any], opts: Options) -> list[NodeState]:
    nodes, failures = connect_all(cluster, cluster.hosts, opts.connect_timeout)
    try:
        results = _agent_action(nodes, cluster, request)
    finally:
        close_all(nodes.values())
    states = []
    for host in cluster.hosts:
        failure = next((f for f in failures if f.host == host.name), None)
        if failure is not None:
            states.append(NodeState(host.name, "unreachable", detail=str(failure)))
            continue
        result = results[host.name]
        if isinstance(result, NodeFailure):
            states.append(NodeState(host.name, "unreachable", detail=str(result)))
            continue
        try:
            answer = json.loads(result.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            states.append(NodeState(host.name, "error", detail=_agent_error(result)))
            continue
        states.append(NodeState(host.name, answer.get("state", "error"), answer.get("run_id"),
                                answer.get("exit_code"), answer.get("started_at"), answer.get("ended_at"),
                                answer.get("found", 0), answer.get("left", 0)))
    return states


def _agent_error(result: Result) -> str:
    messages = []
    for line in result.stderr.decode("utf-8", errors="replace").splitlines():
        try:
            messages.append(json.loads(line).get("message", line))
        except (ValueError, AttributeError):
            if line.strip():
                messages.append(line.strip())
    return "; ".join(messages) or f"the agent exited with code {result.exit_code}"


def stop(cluster: Cluster, run_id: str | None = None, opts: Options | None = None) -> list[NodeState]:
    """Stop a run (the latest on each node by default): TERM its processes, wait `grace`, KILL the rest."""
    opts = opts or Options()
    return _states(cluster, {"action": "stop", "run_id": run_id, "grace": opts.grace}, opts)


def status(cluster: Cluster, run_id: str | None = None, opts: Options | None = None) -> list[NodeState]:
    """Each node's view of a run (the latest by default)."""
    return _states(cluster, {"action": "status", "run_id": run_id}, opts or Options())


def logs(cluster: Cluster, run_id: str | None = None, *, node: str | None = None, rank: int | None = None,
         follow: bool = False, opts: Options | None = None) -> int:
    """Replay (and with `follow`, follow) the log of a run from the nodes, prefixed like a live launch."""
    opts = opts or Options()
    hosts = [h for h in cluster.hosts if node is None or h.name == node]
    if not hosts:
        raise LauncherError(f"{cluster.source}: no host named {node!r} (hosts: "
                            f"{', '.join(h.name for h in cluster.hosts)})")
    nodes = connect_or_fail(cluster, hosts, opts)
    offsets = rank_offsets(cluster)
    colour = supports_colour(opts.out)
    width = max(len(h.name) for h in hosts)
    lock = threading.Lock()
    failures: list[str] = []

    def one(index: int, host: Host) -> None:
        log = NodeLog(host.name, index, width, offsets[host.name], None, colour)
        sink = _RankFilter(opts.out, rank, lock)
        channel = nodes[host.name].open_channel(agent_command(host.python))
        channel.send(agent_input({"action": "logs", "node": host.name, "run_id": run_id, "follow": follow}))
        channel.close_stdin()
        err = bytearray()
        while not channel.finished:
            out, e = channel.read()
            err += e
            if out:
                log.feed(out, sink)
            elif channel.closed:
                break
            else:
                channel.wait_readable(0.5)
        log.close(sink)
        if channel.exit_code() != 0:
            failures.append(f"{host.name}: {_agent_error(Result(channel.exit_code(), b'', bytes(err)))}")

    try:
        threads = [threading.Thread(target=one, args=(i, h), daemon=True) for i, h in enumerate(hosts)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    finally:
        close_all(nodes.values())
    for line in failures:
        opts.err.write(line + "\n")
    return 1 if failures else 0


class _RankFilter:
    """A text sink that keeps only one global rank's lines (when a rank is asked for), whole lines at a time."""

    def __init__(self, out: IO[str], rank: int | None, lock: threading.Lock):
        self.out, self.rank, self.lock = out, rank, lock

    def write(self, text: str) -> None:
        if self.rank is not None:
            tag = f" r{self.rank} "
            text = "".join(line + "\n" for line in text.splitlines() if tag in line.split("|", 1)[0] + " ")
        if text:
            with self.lock:
                self.out.write(text)
                self.out.flush()


__all__ = ["RUN_ID_ENV", "Options", "launch", "logs", "status", "stop"]
