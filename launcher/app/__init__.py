"""The application layer: what each task does, between parsing its options (launcher/tasks.py, `ddpl` and `inv`)
or a call of the Python API (launcher/api.py) and the core modules (load, plan, run, render), split by what the user
asks: launching (launching.py: launch, attach, sync), the commands on a run (runs.py: status, stop, logs, stacks, top,
report, one shared opening), the doctor (checks.py), SLURM (slurm.py: --slurm, --job, slurm.submit), a new cluster
(newcluster.py: init) and the run's page (pages.py: gathered, built and written). Every task comes through here;
nothing below imports it.

Each name is imported from its room when first asked for (PEP 562): `inv status` imports the commands on a run, not
the doctor, the launch and SLURM as well (a third of every `inv` call's start, ~0.1 s of CPU, paid hundreds of times
a test suite and by every `inv status` a user types)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from launcher.errors import LauncherError

if TYPE_CHECKING:
    from launcher.app.checks import doctor, doctor_report
    from launcher.app.hosts import Hosts, load_inventory
    from launcher.app.job import JobArgs
    from launcher.app.launching import attach, launch, sync
    from launcher.app.newcluster import init, init_example
    from launcher.app.runs import logs, report, stacks, status, stop, top
    from launcher.app.slurm import submit as slurm_submit

ROOMS = {
    "doctor": "checks",
    "doctor_report": "checks",
    "Hosts": "hosts",
    "load_inventory": "hosts",
    "JobArgs": "job",
    "launch": "launching",
    "attach": "launching",
    "sync": "launching",
    "init": "newcluster",
    "init_example": "newcluster",
    "logs": "runs",
    "report": "runs",
    "stacks": "runs",
    "status": "runs",
    "stop": "runs",
    "top": "runs",
    "slurm_submit": "slurm",
}
"""Each name's module in launcher/app/ (`slurm_submit` is slurm.py's `submit`)."""
MODULES = frozenset({*ROOMS.values(), "pages", "pulling"})


def __getattr__(name: str) -> Any:
    if name in MODULES:  # `launcher.app.runs` before anything imported it (a dotted path, mock.patch's)
        return importlib.import_module(f"launcher.app.{name}")
    room = ROOMS.get(name)
    if room is None:
        raise AttributeError(f"module 'launcher.app' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"launcher.app.{room}"), "submit" if name == "slurm_submit" else name)
    globals()[name] = value  # asked once
    return value


def main_error(exc: LauncherError) -> tuple[str, int]:
    """The message and exit code a task shows for a launcher error (one sentence, no traceback)."""
    return str(exc), getattr(exc, "exit_code", 1) or 1


__all__ = [
    "Hosts",
    "JobArgs",
    "attach",
    "doctor",
    "doctor_report",
    "init",
    "init_example",
    "launch",
    "load_inventory",
    "logs",
    "main_error",
    "report",
    "slurm_submit",
    "stacks",
    "status",
    "stop",
    "sync",
    "top",
]
