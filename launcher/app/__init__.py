"""The application layer: what each task does, between parsing its options (launcher/tasks.py, `ddpl` and `inv`)
or a call of the Python API (launcher/api.py) and the core modules (load, plan, run, render), split by what the user
asks: launching (launching.py: launch, sync), the commands on a run (runs.py: status, stop, logs, stacks, top,
report, one shared opening), the doctor (checks.py), SLURM (slurm.py: --slurm, --job, slurm.submit), a new cluster
(newcluster.py: init) and the run's page (pages.py: gathered, built and written). Every task comes through here;
nothing below imports it."""

from launcher.app.checks import doctor, doctor_report
from launcher.app.hosts import Hosts, load_inventory
from launcher.app.job import JobWords
from launcher.app.launching import launch, sync
from launcher.app.newcluster import init, init_example
from launcher.app.runs import logs, report, stacks, status, stop, top
from launcher.app.slurm import submit as slurm_submit
from launcher.errors import LauncherError


def main_error(exc: LauncherError) -> tuple[str, int]:
    """The message and exit code a task shows for a launcher error (one sentence, no traceback)."""
    return str(exc), getattr(exc, "exit_code", 1) or 1


__all__ = ["Hosts", "JobWords", "doctor", "doctor_report", "init", "init_example", "launch", "load_inventory", "logs",
           "main_error", "report", "slurm_submit", "stacks", "status", "stop", "sync", "top"]
