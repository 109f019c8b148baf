"""The batch script `inv slurm.submit` hands to sbatch (pure: values in, text out), and the names of its files."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePath

from launcher.errors import UsageError
from launcher.paths import hint

DEFAULT_JOB_NAME = "ddp"
OUTPUT_PATTERN = "slurm-%j.out"
"""The job's output file in the log dir: SLURM puts the job id for %j (stdout and stderr in one file)."""

_TIME_FORMS = (
    r"\d+",
    r"\d+:[0-5]?\d",
    r"\d+:[0-5]?\d:[0-5]?\d",  # MM, MM:SS, HH:MM:SS
    r"\d+-\d+",
    r"\d+-\d+:[0-5]?\d",
    r"\d+-\d+:[0-5]?\d:[0-5]?\d",
)  # D-HH, D-HH:MM, D-HH:MM:SS
_TIME = re.compile("|".join(f"(?:{form})" for form in _TIME_FORMS))
_NO_LIMIT = ("INFINITE", "UNLIMITED")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_PARTITION = re.compile(rf"{_WORD.pattern}(?:,{_WORD.pattern})*")  # SLURM takes a list: the first with room runs it
_GPUS = re.compile(r"(?:[A-Za-z0-9_.-]+:)?[1-9]\d*")  # `2` or a typed count `a100:2`
_JOB_ID = re.compile(r"[1-9]\d*(?:_\d+)?")  # 123, or 123_4 for one task of an array job
_SBATCH_UNSAFE = re.compile(r"[\s'\"%\\#]")  # sbatch reads #SBATCH lines by its own rules: no quoting, %j patterns


@dataclass(frozen=True)
class BatchSpec:
    """What one batch job asks SLURM for, and the launch it runs on the allocation."""

    nodes: int
    """How many nodes (`--nodes`); one task each, the launcher's agent (`--ntasks-per-node=1`)."""
    log_dir: str
    """Absolute directory of the job's output file (`slurm-<job id>.out`) and end record; every node must see it."""
    workdir: str
    """Absolute directory the job starts in (`--chdir`): the checkout, whose tasks.py `-m invoke` finds, or the
    project whose ddpl.yaml `-m launcher` reads."""
    command: tuple[str, ...]
    """The launch the job runs, word by word (`launch_command`)."""
    job_name: str = DEFAULT_JOB_NAME
    """`--job-name`, what squeue shows."""
    partition: str | None = None
    """`--partition` (None: the cluster's default partition)."""
    time: str | None = None
    """`--time` in one of SLURM's forms (None: the partition's default limit)."""
    gpus_per_node: str | None = None
    """`--gpus-per-node`: a count, or `type:count` (None: ask for no GPUs)."""
    umask: int = 0o022
    """The submitter's umask, set again at the script's start for the files the job writes (its checkpoints):
    sbatch is given a stricter one so that SLURM creates the output file 0600 (`jobs.OUTPUT_UMASK`)."""

    @property
    def output(self) -> str:
        """The `--output` pattern (also `--error`): one file per job, SLURM puts the job id for %j."""
        return str(PurePath(self.log_dir) / OUTPUT_PATTERN)


def output_path(log_dir: str | PurePath, job_id: str) -> PurePath:
    """Where a job submitted with this log dir writes its output."""
    return PurePath(log_dir) / OUTPUT_PATTERN.replace("%j", job_id)


def record_path(log_dir: str | PurePath, job_id: str) -> PurePath:
    """Where the batch script records how the job ended (read once SLURM has forgotten the job)."""
    return PurePath(log_dir) / f"slurm-{job_id}.end"


def check_time(time: str) -> str:
    """`--time` as given, once it is one of SLURM's forms."""
    if time.upper() in _NO_LIMIT or _TIME.fullmatch(time):
        return time
    raise UsageError(
        f"--time must be SLURM's MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS "
        f"(e.g. 30, 2:00:00, 1-12), got {time!r}"
    )


def check_job_id(job_id: str) -> str:
    """A SLURM job id as given (`123`, or `123_4` for one task of an array job), stripped of spaces."""
    text = str(job_id).strip()
    if not _JOB_ID.fullmatch(text):
        raise UsageError(
            f"--job must be a SLURM job id such as 123 or 123_4 (from `{hint('slurm.submit')}`), got {job_id!r}"
        )
    return text


def check_spec(spec: BatchSpec) -> BatchSpec:
    """`spec` as given, once every option is one sbatch accepts and the script can carry unquoted."""
    if isinstance(spec.nodes, bool) or not isinstance(spec.nodes, int) or spec.nodes < 1:
        raise UsageError(f"--nodes must be a whole number of at least 1, got {spec.nodes!r}")
    if not _WORD.fullmatch(spec.job_name):
        raise UsageError(f"--job-name must be one word of letters, digits, '_', '.', '-', got {spec.job_name!r}")
    if spec.partition is not None and not _PARTITION.fullmatch(spec.partition):
        raise UsageError(f"--partition must be a partition name (or several, comma-separated), got {spec.partition!r}")
    if spec.time is not None:
        check_time(spec.time)
    if spec.gpus_per_node is not None and not _GPUS.fullmatch(spec.gpus_per_node):
        raise UsageError(
            f"--gpus-per-node must be a count of at least 1, or type:count (a100:2), got {spec.gpus_per_node!r}"
        )
    for name, path in (("log dir", spec.log_dir), ("workdir", spec.workdir)):
        if not PurePath(path).is_absolute():  # the job starts elsewhere: a relative path would move
            raise UsageError(f"the batch script's {name} must be an absolute path, got {path!r}")
        if _SBATCH_UNSAFE.search(path):
            raise UsageError(
                f"the batch script's {name} {path!r} holds a space, quote, %, # or backslash, which "
                "an #SBATCH line cannot carry; use a plain path"
            )
    if not spec.command:
        raise UsageError("the batch script needs a command to run")
    if not 0 <= spec.umask <= 0o777:
        raise UsageError(f"the batch script's umask must be from 0000 to 0777, got {spec.umask!r}")
    return spec


def launch_command(
    python: str,
    hosts: str,
    *,
    script: str | None = None,
    args: str | None = None,
    skip_doctor: bool = False,
    module: str | None = None,
    command: str | None = None,
    runner: str = "invoke",
) -> tuple[str, ...]:
    """The words of the launch a batch job runs: this installation's tasks, `launch --slurm` on the inventory.
    `runner`: `invoke` (a checkout's tasks.py, found in the folder the job starts in) or `launcher` (the installed
    `ddpl`: `python -m launcher`, which reads the project's ddpl.yaml there)."""
    # `--name=value`: one word per option, whatever the value starts with (`--args=--epochs 2`)
    argv = [python, "-m", runner, "launch", "--slurm", f"--hosts={hosts}"]
    for option, value in (("script", script), ("module", module), ("command", command), ("args", args)):
        if value is not None:
            argv.append(f"--{option}={value}")
    if skip_doctor:
        argv.append("--skip-doctor")
    return tuple(argv)


def _directives(spec: BatchSpec) -> list[str]:
    options: list[tuple[str, str | None]] = [
        ("job-name", spec.job_name),
        ("nodes", str(spec.nodes)),
        ("ntasks-per-node", "1"),
        ("output", spec.output),
        ("error", spec.output),  # one file: the prefixed output and any error in order, as `inv logs` shows them
        ("partition", spec.partition),
        ("time", spec.time),
        ("gpus-per-node", spec.gpus_per_node),
        ("chdir", spec.workdir),
    ]
    return [f"#SBATCH --{name}={value}" for name, value in options if value is not None]


def render_batch_script(spec: BatchSpec) -> str:
    """The batch script for `spec`: #SBATCH lines, the launch, then a one-line record of how the job ended."""
    check_spec(spec)
    record = f'{shlex.quote(spec.log_dir)}/slurm-"$SLURM_JOB_ID".end'
    lines = [
        "#!/bin/bash",
        *_directives(spec),
        f"# Written by `{hint('slurm.submit')}`. The doctor's fast checks run inside the launch below, on every node "
        "of the",
        "# allocation, before torchrun starts (unless --skip-doctor): no separate doctor step here.",
        "",
        "# SLURM created this job's output file 0600 (SLURM_UMASK=0077 at submit); the job's own files get the",
        "# submitter's umask.",
        f"umask {spec.umask:04o}",
        "",
        f"# How the job ended, one line as `scontrol show job -o` writes it: `{hint('status --job')}` reads it once "
        "SLURM",
        "# has forgotten the job (MinJobAge) and no accounting (sacct) remembers it.",
        "record() {",
        '    printf \'JobId=%s JobState=%s ExitCode=%s NodeList=%s EndTime=%s\\n\' "$SLURM_JOB_ID" "$1" "$2" \\',
        f'        "$SLURM_JOB_NODELIST" "$(date +%Y-%m-%dT%H:%M:%S)" > {record}',
        "}",
        "# scancel (or the time limit) sends TERM: bash runs this once the launch has stopped its nodes and exited.",
        "trap 'record CANCELLED 0:15; exit 143' TERM",
        "",
        shlex.join(spec.command),
        "code=$?",
        'if [ "$code" -eq 0 ]; then record COMPLETED 0:0; else record FAILED "$code:0"; fi',
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"
