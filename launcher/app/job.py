"""The job a launch runs: the inventory's, with what the command line replaces (`--script`, `--module`, `--command`,
`--args`)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from typing import Any

from launcher.config.model import JOB_FORMS, Cluster, Job
from launcher.errors import LauncherError, UsageError


@dataclass(frozen=True)
class JobArgs:
    """What the command line says of the job: one of `--script`, `--module`, `--command` (each replaces the
    inventory's job.script, job.module or job.command), and `--args` (replaces job.args); None: not given."""

    script: str | None = None
    module: str | None = None
    command: str | None = None
    args: str | None = None

    def given(self) -> tuple[str, str] | None:
        """The form given on the command line and its value; a UsageError when two are."""
        forms = [(name, value) for name in JOB_FORMS if (value := getattr(self, name)) is not None]
        if len(forms) > 1:
            raise UsageError(f"--{forms[0][0]} and --{forms[1][0]} both name what to run: give one of them")
        return forms[0] if forms else None


def job_of(cluster: Cluster, job_args: JobArgs) -> Job:
    """The inventory's job, with its script (module, command) and/or arguments replaced from the command line."""
    base, given = cluster.job, job_args.given()
    if given is None and base is None:
        raise LauncherError(
            f"{cluster.source}: no job to run: add a `job: {{script: ...}}` entry, or pass --script "
            "(--module, --command)"
        )
    try:
        args = tuple(shlex.split(job_args.args)) if job_args.args is not None else None
    except ValueError as exc:
        raise LauncherError(f"--args: cannot split {job_args.args!r}: {exc}") from None
    base = base or Job()
    if given is not None:
        forms: dict[str, Any] = {name: given[1] if name == given[0] else None for name in JOB_FORMS}
        base = replace(base, **forms)
    return replace(base, args=base.args if args is None else args)
