"""One srun step as the nodes' agent sessions: `srun --nodes N --ntasks-per-node 1 --kill-on-bad-exit --label`.

Under SLURM a run's node programs are the tasks of one job step, not an SSH channel a node. The step gives every task
the same stdin and labels their output with the task id (`--label`): one srun process becomes a `SessionChannel` a
node for the supervision (`launcher/run/handle.py`), the same for both transports:

- in: the first bytes are the selector (`selector.py`), the node program and every node's request keyed by node id;
  after that the launcher's words (`hb`, `go`, `stop`...). A word every node's session sends in one round (they all
  do) goes to srun once: each agent reads it once.
- out: a labelled line goes to its node's channel (stdout, stderr), unlabelled. srun's `task 1: Exited with exit
  code 3` ends that node's channel with that code (those exiting 0 end with the step); whatever it says before a
  task spoke is every node's message (it could not start).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

from launcher.errors import LauncherError
from launcher.limits import STEP_END_WAIT
from launcher.plan.launchplan import NodeCommand
from launcher.slurm.jobs import run_slurm
from launcher.transport.program import node_program, program_line

SELECTOR_SOURCE = node_program("slurm.selector")
_LABELLED = re.compile(rb" *(\d+): ")
_TASK_END = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.*)")
_EXIT = re.compile(r"Exited with exit code (\d+)")
_SIGNALS = {signal.strsignal(s) or s.name: 128 + int(s) for s in signal.Signals}
"""srun names a signal that ended a task by its description (`Killed`, `Terminated`): the shell's 128+n code."""


def srun_argv(
    names: Sequence[str],
    command: str,
    *,
    kill_on_bad_exit: bool,
    job_name: str,
    cpus_per_task: int | None = None,
    overlap: bool = False,
    container: Sequence[str] = (),
) -> list[str]:
    """The srun command line of a run's step: a task an allocated node, in its order (`container`: pyxis's flags)."""
    cpus = ["--cpus-per-task", str(cpus_per_task)] if cpus_per_task else []
    if overlap:  # a step beside a running job's own (`--job ID`): it holds the job's CPUs
        cpus.append("--overlap")
    return [
        "srun",
        "--nodes",
        str(len(names)),
        "--ntasks-per-node",
        "1",
        "--ntasks",
        str(len(names)),
        *cpus,
        "--nodelist",
        ",".join(names),
        f"--kill-on-bad-exit={1 if kill_on_bad_exit else 0}",
        "--label",
        "--input",
        "all",
        "--job-name",
        job_name,
        *container,
        "/bin/sh",
        "-c",
        command,
    ]


def step_input(source: str, nodes: Sequence[tuple[NodeCommand, Mapping[str, Any]]]) -> bytes:
    """What the step's stdin starts with: the selector, then the node program, what every node's request shares
    (once), and each node's own part of it by node id; the selector puts a node's request back together. srun
    gives every task all of it, so the shared part (the probe's source, the run's settings) travels once per task,
    not once per node per task: 256 nodes cost each task ~0.3 MB, not 7.7 MB. Node id i is the plan's node i, which
    is the allocation's node i (`scontrol show hostnames` order, SLURM's node ids)."""
    common, own = split_common([dict(request) for _, request in nodes])
    parts = {
        str(i): {"name": command.host.name, "request": delta, "program": "launcher/node/loader.py"}
        for i, ((command, _), delta) in enumerate(zip(nodes, own, strict=True))
    }
    lines = (program_line(SELECTOR_SOURCE), program_line(source), json.dumps(common), json.dumps(parts))
    return "".join(line + "\n" for line in lines).encode()


def split_common(requests: Sequence[dict[str, Any]], depth: int = 4) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What every request holds alike (keys with equal values; mappings split again, `depth` levels down), and
    each request's own rest; `selector.merged(common, own)` is the request again."""
    if not requests:
        return {}, []
    common: dict[str, Any] = {}
    own: list[dict[str, Any]] = [{} for _ in requests]
    for key in requests[0]:
        values = [r.get(key, _MISSING) for r in requests]
        if all(v is not _MISSING and v == values[0] for v in values):
            common[key] = values[0]
        elif depth > 1 and all(isinstance(v, dict) for v in values):
            common[key], parts = split_common(values, depth - 1)
            for mine, part in zip(own, parts, strict=True):
                mine[key] = part
    for request, mine in zip(requests, own, strict=True):
        for key, value in request.items():
            if key not in common:
                mine[key] = value
    return common, own


_MISSING = object()


class StepChannel:
    """One node's task of the step, shaped like `transport.Channel` for the supervision."""

    def __init__(self, step: SrunStep, index: int, name: str):
        self.step, self.index, self.node = step, index, name
        self._out, self._err = bytearray(), bytearray()
        self._code: int | None = None
        """The task's exit code, once srun said it (or the step ended)."""
        self._drained = False

    def _add(self, data: bytes, is_err: bool) -> None:
        with self.step.ready:
            (self._err if is_err else self._out).extend(data)
            self.step.ready.notify_all()

    def _ended(self, code: int) -> None:
        with self.step.ready:
            if self._code is None:
                self._code = code
            self.step.ready.notify_all()

    def send(self, data: bytes, block: bool = True) -> bool:
        return self.step.word(self.index, data)

    def read(self) -> tuple[bytes, bytes]:
        with self.step.ready:
            gone = self.closed
            out, err = bytes(self._out), bytes(self._err)
            self._out.clear()
            self._err.clear()
        self._drained = gone and not out and not err
        return out, err

    def wait_readable(self, timeout: float) -> None:
        with self.step.ready:
            self.step.ready.wait_for(lambda: self._out or self._err or self._code is not None, timeout)

    @property
    def finished(self) -> bool:
        with self.step.ready:
            return self._code is not None and not self._out and not self._err

    @property
    def output_ended(self) -> bool:
        return False  # a task's output ends with the task (`finished`): a step has no console to let go

    @property
    def closed(self) -> bool:
        return self.step.ended and self._code is None

    @property
    def drained(self) -> bool:
        """As `transport.Channel.drained`: the step had ended before the last read, which found nothing."""
        return self._drained

    def exit_code(self) -> int:
        return -1 if self._code is None else self._code

    def close(self) -> None:
        self.step.release(self.index)


class SrunStep:
    """A run's srun process and its per-node channels; `open` is the supervision's `SessionOpener`."""

    def __init__(
        self,
        names: Sequence[str],
        command: str,
        *,
        kill_on_bad_exit: bool,
        job_name: str,
        env: Mapping[str, str] | None = None,
        cpus_per_task: int | None = None,
        overlap: bool = False,
        container: Sequence[str] = (),
    ):
        self.names = list(names)
        self.argv = srun_argv(
            self.names,
            command,
            kill_on_bad_exit=kill_on_bad_exit,
            job_name=job_name,
            cpus_per_task=cpus_per_task,
            overlap=overlap,
            container=container,
        )
        self.job_name = job_name
        self.env = dict(os.environ if env is None else env)
        self.ready = threading.Condition()
        self.channels = [StepChannel(self, i, name) for i, name in enumerate(self.names)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.ended = False
        self.spoke = False
        """Whether any task said anything (before that, srun's own words are every node's)."""
        self.srun_lines: list[str] = []
        """What srun itself said, for the report of a step that would not start."""
        self._asked: dict[bytes, set[int]] = {}
        self._write_lock = threading.Lock()
        self._released: set[int] = set()
        self._readers: list[threading.Thread] = []

    # --- start ------------------------------------------------------------------------------------------------

    def open(self, source: str, nodes: Sequence[tuple[NodeCommand, Mapping[str, Any]]]) -> list[StepChannel | str]:
        """Start the step with the node program and every node's request; a channel a node (or srun's error)."""
        try:
            # Its own session: a Ctrl-C at the terminal is the launcher's to handle (stop words, then the step's
            # end), not srun's (whose first SIGINT only prints task states).
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.env,
                start_new_session=True,
            )
        except OSError as exc:
            return [f"cannot run srun: {exc}"] * len(self.names)
        for stream, is_err in ((self.proc.stdout, False), (self.proc.stderr, True)):
            reader = threading.Thread(target=self._pump, args=(stream, is_err), daemon=True, name="srun-read")
            reader.start()
            self._readers.append(reader)
        threading.Thread(target=self._reap, daemon=True, name="srun-wait").start()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(step_input(source, nodes))
            self.proc.stdin.flush()
        except OSError:
            pass  # srun ended at once: its words and exit come through the readers
        os.set_blocking(self.proc.stdin.fileno(), False)  # from now on a word never waits on a stuck srun
        return list(self.channels)

    # --- in -----------------------------------------------------------------------------------------------------

    def word(self, index: int, data: bytes) -> bool:
        """Send a launcher word once per round: the first node's session to send it writes it, the others' sends
        of the same word are absorbed until a session sends it a second time (the next heartbeat, say)."""
        with self._write_lock:
            asked = self._asked.setdefault(data, set())
            if asked and index not in asked:
                asked.add(index)
                return True
            if not self._write(data):
                return False
            self._asked[data] = {index}
            return True

    def _write(self, data: bytes) -> bool:
        if self.proc is None or self.proc.stdin is None or self.proc.stdin.closed:
            return False
        try:
            return os.write(self.proc.stdin.fileno(), data) == len(data)
        except (BlockingIOError, BrokenPipeError, OSError):
            return False

    # --- out ----------------------------------------------------------------------------------------------------

    def _pump(self, stream: IO[bytes], is_err: bool) -> None:
        rest = b""
        while True:
            chunk = stream.read1(1 << 16)  # type: ignore[attr-defined]
            if not chunk:
                break
            *lines, rest = (rest + chunk).split(b"\n")
            self._route(lines, is_err)
        if rest:
            self._route([rest], is_err)

    def _route(self, lines: list[bytes], is_err: bool) -> None:
        """Each labelled line to its node's channel (a block per node and read, not a lock per line); srun's own
        lines after what came before them."""
        blocks: dict[int, list[bytes]] = {}

        def flush() -> None:
            for index, block in blocks.items():
                self.channels[index]._add(b"".join(block), is_err)
            blocks.clear()

        for line in lines:
            match = _LABELLED.match(line)
            if match is not None and int(match.group(1)) < len(self.channels):
                self.spoke = True
                blocks.setdefault(int(match.group(1)), []).append(line[match.end() :] + b"\n")
            else:
                flush()
                self._srun_said(line.decode("utf-8", errors="replace"))
        flush()

    def _srun_said(self, text: str) -> None:
        ended = _TASK_END.match(text)
        if ended is not None:
            code = _task_code(ended.group(3))
            for index in _task_ids(ended.group(2)):
                if index < len(self.channels):
                    self.channels[index]._ended(code)
            return
        self.srun_lines.append(text)
        if not self.spoke and text.strip():  # srun could not start the step: every node's message
            for channel in self.channels:
                channel._add((text + "\n").encode(), is_err=True)

    def _reap(self) -> None:
        assert self.proc is not None
        code = self.proc.wait()
        for reader in self._readers:
            reader.join()
        with self.ready:  # one moment for all: no channel is ever seen closed without its code
            # A task srun said nothing about exited 0; when srun itself failed before any task spoke, none ran.
            for channel in self.channels:
                channel._ended(0 if self.spoke or code == 0 else code)
            self.ended = True

    # --- end ----------------------------------------------------------------------------------------------------

    def release(self, index: int) -> None:
        """A node's session is closed by the supervision; once all are, the step's stdin closes."""
        self._released.add(index)
        if len(self._released) == len(self.channels) and self.proc is not None and self.proc.stdin is not None:
            with self._write_lock, contextlib.suppress(OSError):
                self.proc.stdin.close()

    def close(self, grace: float) -> list[str]:
        """Make sure the step is over: its stdin closed (each agent stops its part), then SIGTERM to srun (it
        passes it to the tasks), then scancel of the step and SIGKILL. Returns what had to be done, for a note."""
        done: list[str] = []
        proc = self.proc
        if proc is None:
            return done
        for index in range(len(self.channels)):
            self.release(index)
        if _waited(proc, STEP_END_WAIT):
            return done
        done.append("srun still ran after its stdin closed: SIGTERM")
        proc.send_signal(signal.SIGTERM)
        if _waited(proc, grace + STEP_END_WAIT):
            return done
        try:
            done.append(f"the step outlived SIGTERM: scancel {self.cancel()}")
        except LauncherError as exc:  # SLURM's commands fail too: SIGKILL to srun is what is left
            done.append(f"the step outlived SIGTERM and could not be cancelled: {exc}")
        if not _waited(proc, STEP_END_WAIT):
            proc.kill()
            proc.wait()
        return done

    def cancel(self) -> str:
        """scancel this step (found by its name, the run id, in the job's steps); returns the step id."""
        job = self.env.get("SLURM_JOB_ID", "")
        listed = run_slurm(["squeue", "--steps", "--noheader", "--format", "%i %j", "--jobs", job], env=self.env)
        steps = [
            line.split()[0]
            for line in listed.stdout.splitlines()
            if len(line.split()) == 2 and line.split()[1] == self.job_name
        ]
        for step in steps:
            run_slurm(["scancel", step], env=self.env)
        return ", ".join(steps) or "(no step listed)"


def _waited(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def _task_code(how: str) -> int:
    exited = _EXIT.search(how)
    if exited is not None:
        return int(exited.group(1))
    return _SIGNALS.get(how.strip(), 1)


def _task_ids(spec: str) -> list[int]:
    """`1`, `0,2` or `0-3` (srun groups tasks that ended the same way)."""
    ids: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        ids.extend(range(int(low), int(high or low) + 1))
    return ids
