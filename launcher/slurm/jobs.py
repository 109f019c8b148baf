"""A batch job by its id: submit (sbatch), state (scontrol, sacct, the script's end record), output, cancel (scancel).

SLURM is asked through its commands only. A job SLURM still holds (running, or ended less than MinJobAge ago,
300 s by default) comes from `scontrol show job`; an older one from sacct where accounting is set up, else from
the one line the batch script writes when the launch ends (`batch.record_path`).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from launcher.errors import LauncherError
from launcher.limits import QUERY_TIMEOUT, SACCT_TIMEOUT, SLURM_POLL, SLURM_TAIL_CHUNK, SUBMIT_TIMEOUT
from launcher.settings import DEFAULT_LOG_DIR
from launcher.slurm.batch import check_job_id, output_path, record_path

LOG_SUBDIR = "slurm"
"""The folder under the launcher's log dir for batch scripts, job output and end records."""
DEFAULT_SLURM_LOG_DIR = Path(DEFAULT_LOG_DIR) / LOG_SUBDIR
"""Where `inv slurm.submit` writes batch scripts, and its jobs their output and end records."""
OUTPUT_UMASK = "0077"
"""The umask slurmstepd creates a batch job's output file with (SLURM_UMASK at submit): 0600, as the local logs."""
UNKNOWN = "UNKNOWN"
"""The state of a job neither SLURM nor an end record knows."""
LIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESV_DEL_HOLD",
    }
)
"""States of a job that holds (or waits for) nodes; squeue lists exactly these by default."""
_FORGOTTEN = "Invalid job id"  # scontrol's and squeue's words for a job the controller no longer holds
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=")


@dataclass(frozen=True)
class JobState:
    """What SLURM (or the job's end record) says about one batch job."""

    job_id: str
    state: str
    """SLURM's word: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ... or UNKNOWN."""
    exit_code: int | None = None
    """The batch script's exit code, once it ended (None: not known)."""
    signal: int | None = None
    """The signal that ended it, when one did (SLURM's ExitCode `0:15`)."""
    nodes: str = ""
    """The allocation's nodes, in SLURM's form (`node-[0-1]`); empty while pending."""
    reason: str = ""
    """Why it waits or failed, in SLURM's word (`Resources`, `PartitionConfig`, `NonZeroExitCode`)."""
    output: Path | None = None
    """The job's output file (stdout and stderr)."""
    source: str = ""
    """Where this came from: scontrol, sacct or record (empty when nothing knows the job)."""

    @property
    def ended(self) -> bool:
        """Whether the job holds no node any more (or nothing knows it)."""
        return self.state not in LIVE_STATES

    @property
    def known(self) -> bool:
        return self.state != UNKNOWN


# ---- pure: SLURM's text to values -----------------------------------------------------------------------------------


def parse_fields(line: str) -> dict[str, str]:
    """`Key=value` pairs of one `scontrol show job -o` line (or an end record); a value may hold spaces."""
    found = list(_FIELD.finditer(line))
    fields: dict[str, str] = {}
    for match, after in zip(found, [*found[1:], None], strict=True):
        end = after.start() if after else len(line)
        fields[match.group(1)] = line[match.end() : end].strip()
    return fields


def parse_exit(text: str) -> tuple[int | None, int | None]:
    """SLURM's `ExitCode=2:0` (exit code, signal) as numbers; (None, None) when it is not that form."""
    code, _, signal = text.partition(":")
    if not code.isdigit():
        return None, None
    return int(code), int(signal) if signal.isdigit() and int(signal) else None


def _blank(value: str) -> str:
    return "" if value in ("(null)", "None", "") else value


def state_from_fields(job_id: str, fields: dict[str, str], source: str, output: Path | None) -> JobState:
    """A JobState from scontrol's (or the end record's) fields; `output` when they name no StdOut."""
    exit_code, signal = parse_exit(fields.get("ExitCode", ""))
    state = fields.get("JobState", "").split(" ")[0] or UNKNOWN
    stdout = _blank(fields.get("StdOut", ""))
    return JobState(
        job_id,
        state,
        exit_code if state not in LIVE_STATES else None,
        signal,
        _blank(fields.get("NodeList", "")),
        _blank(fields.get("Reason", "")),
        Path(stdout) if stdout else output,
        source,
    )


def parse_sacct(job_id: str, text: str, output: Path | None) -> JobState | None:
    """The job's line of `sacct -n -P -X -o JobID,State,ExitCode,NodeList,Reason`, or None when it has none."""
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) >= 5 and cells[0] == job_id:
            exit_code, signal = parse_exit(cells[2])
            state = cells[1].split(" ")[0] or UNKNOWN  # `CANCELLED by 0`
            return JobState(job_id, state, exit_code, signal, _blank(cells[3]), _blank(cells[4]), output, "sacct")
    return None


# ---- I/O: SLURM's commands and the job's files ----------------------------------------------------------------------


def run_slurm(
    argv: Sequence[str], timeout: float = QUERY_TIMEOUT, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one SLURM command; a missing command or a hang is a LauncherError, never a traceback."""
    try:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=None if env is None else dict(env),
        )
    except FileNotFoundError:
        raise LauncherError(
            f"{argv[0]} not found: SLURM's commands are not installed on this machine (or not on PATH)"
        ) from None
    except subprocess.TimeoutExpired:
        raise LauncherError(
            f"`{' '.join(argv)}` did not answer in {timeout:.0f}s: is slurmctld up (`scontrol ping`)?"
        ) from None


def failure(result: subprocess.CompletedProcess[str]) -> str:
    """What a failed SLURM command concluded (its last line: `fatal: ...`, `Batch job submission failed: ...`)."""
    lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
    text = lines[-1].strip()[:300] if lines else f"exit code {result.returncode}"
    if "configuration" in text:
        text += " (is SLURM set up on this machine? SLURM_CONF names its slurm.conf)"
    return text


def private_folder(folder: Path) -> None:
    """Make the log folder (0700: job output can hold tokens, and it sits on a disk every node shares); a folder
    that others could read is closed. An OSError (read-only, a file in the way, no space) is one LauncherError."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if folder.stat().st_mode & 0o077:  # made by an older version, or by mkdir under a lax umask
            folder.chmod(0o700)
    except OSError as exc:
        raise LauncherError(
            f"cannot use {folder} for SLURM job files: {exc.strerror or exc}; make it writable, "
            "or set launcher.log_dir in invoke.yaml"
        ) from None


def submit(script_text: str, script_path: Path) -> str:
    """Write the batch script to `script_path` (0600, its folder 0700) and submit it; the job id sbatch gives.

    sbatch gets SLURM_UMASK=0077: slurmstepd creates the job's output file with it (0600); the script sets the
    submitter's own umask back for everything the job writes itself (`BatchSpec.umask`)."""
    private_folder(script_path.parent)
    try:
        fd = os.open(script_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(script_text)
    except OSError as exc:
        with contextlib.suppress(OSError):  # a half-written script; on a read-only disk there is none
            script_path.unlink()
        raise LauncherError(
            f"cannot write the batch script {script_path}: {exc.strerror or exc}; free some space "
            "or make the folder writable (or set launcher.log_dir in invoke.yaml)"
        ) from None
    result = run_slurm(
        ["sbatch", "--parsable", str(script_path)], SUBMIT_TIMEOUT, env={**os.environ, "SLURM_UMASK": OUTPUT_UMASK}
    )
    job_id = result.stdout.strip().split(";")[0]  # `123;cluster` on a federation
    if result.returncode != 0 or not job_id.isdigit():
        raise LauncherError(f"sbatch did not take {script_path}: {failure(result)}")
    return job_id


def _scontrol(job_id: str, output: Path) -> JobState | None:
    """What the controller holds about the job; None once it has forgotten it (MinJobAge after the end)."""
    result = run_slurm(["scontrol", "-o", "show", "job", job_id])
    if result.returncode != 0:
        if _FORGOTTEN in result.stderr:
            return None
        raise LauncherError(f"scontrol show job {job_id} failed: {failure(result)}")
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return state_from_fields(job_id, parse_fields(lines[0]), "scontrol", output) if lines else None


def _sacct(job_id: str, output: Path) -> JobState | None:
    """What accounting remembers; None when it does not know the job or is not set up (`accounting storage is
    disabled`: a cluster without slurmdbd)."""
    try:
        result = run_slurm(
            ["sacct", "-j", job_id, "-n", "-P", "-X", "-o", "JobID,State,ExitCode,NodeList,Reason"], SACCT_TIMEOUT
        )
    except LauncherError:  # no sacct, or a hung slurmdbd: the end record may still say
        return None
    return parse_sacct(job_id, result.stdout, output) if result.returncode == 0 else None


def _record(job_id: str, log_dir: Path, output: Path) -> JobState | None:
    """The line the batch script wrote when its launch ended, if there is one."""
    try:
        line = Path(record_path(log_dir, job_id)).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return state_from_fields(job_id, parse_fields(line), "record", output) if line else None


def job_state(job_id: str, log_dir: Path = DEFAULT_SLURM_LOG_DIR) -> JobState:
    """The job's state from the controller, else accounting, else its end record; UNKNOWN when none knows it."""
    job_id = check_job_id(job_id)
    output = Path(output_path(log_dir, job_id))
    return (
        _scontrol(job_id, output)
        or _sacct(job_id, output)
        or _record(job_id, log_dir, output)
        or JobState(job_id, UNKNOWN, output=output)
    )


def is_listed(job_id: str) -> bool:
    """Whether squeue still lists the job: it is pending, running, or its processes are being ended."""
    result = run_slurm(["squeue", "-h", "-j", check_job_id(job_id), "-o", "%T"])
    if result.returncode != 0:
        if _FORGOTTEN in result.stderr:
            return False
        raise LauncherError(f"squeue -j {job_id} failed: {failure(result)}")
    return any(line.strip() in LIVE_STATES for line in result.stdout.splitlines())


def _output(state: JobState, log_dir: Path) -> Path:
    """The job's output file: where SLURM says (StdOut), else where `inv slurm.submit` had it written."""
    return state.output or Path(output_path(log_dir, state.job_id))


class _Tail:
    """Copies what a file gained since the last look; multi-byte characters split between looks stay whole."""

    def __init__(self, path: Path, out: IO[str]):
        self.path, self.out, self.offset = path, out, 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def copy(self) -> bool:
        """Print what is new, a chunk at a time (a job's output can be gigabytes); False while the file does not
        exist. A file that cannot be read is one sentence."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                while data := f.read(SLURM_TAIL_CHUNK):
                    self.offset += len(data)
                    self.out.write(self.decoder.decode(data))
                    self.out.flush()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise LauncherError(f"cannot read the job's output {self.path}: {exc.strerror or exc}") from None
        return True


def read(job_id: str, out: IO[str], log_dir: Path = DEFAULT_SLURM_LOG_DIR) -> tuple[JobState, bool]:
    """Print the job's output as it is now; its state, and whether the output file was there."""
    state = job_state(job_id, log_dir)
    return state, _Tail(_output(state, log_dir), out).copy()


def follow(
    job_id: str, out: IO[str], log_dir: Path = DEFAULT_SLURM_LOG_DIR, poll: float = SLURM_POLL
) -> tuple[JobState, bool]:
    """Print the job's output as it grows, until the job ends; its final state, and whether there was output."""
    state = job_state(job_id, log_dir)
    tail = _Tail(_output(state, log_dir), out)
    while True:
        found = tail.copy()  # after the state: a job seen ended has written all it will
        if state.ended:
            return state, found
        time.sleep(poll)
        state = job_state(job_id, log_dir)


def cancel(job_id: str, wait: float, log_dir: Path = DEFAULT_SLURM_LOG_DIR) -> JobState:
    """scancel the job (SLURM sends TERM to every process of it, KILL after its KillWait), then wait up to `wait`
    seconds until squeue no longer lists it: every node has ended its processes. The state after that."""
    job_id = check_job_id(job_id)
    result = run_slurm(["scancel", job_id])
    if result.returncode != 0:
        raise LauncherError(f"scancel {job_id} failed: {failure(result)}")
    deadline = time.monotonic() + wait
    while is_listed(job_id) and time.monotonic() < deadline:
        time.sleep(min(SLURM_POLL / 2, max(0.0, deadline - time.monotonic())))
    return job_state(job_id, log_dir)


__all__ = [
    "DEFAULT_SLURM_LOG_DIR",
    "LIVE_STATES",
    "UNKNOWN",
    "JobState",
    "cancel",
    "follow",
    "is_listed",
    "job_state",
    "parse_exit",
    "parse_fields",
    "parse_sacct",
    "read",
    "run_slurm",
    "state_from_fields",
    "submit",
]
