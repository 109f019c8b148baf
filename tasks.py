"""This checkout's Invoke tasks (`inv`): the launcher's own, defined once in launcher/tasks.py (the installed `ddpl`
runs the same), and the sandbox, the demo and the bench (devtools/tasks.py), which need this checkout."""

from devtools.tasks import bench, checkout_namespace, demo, sandbox_down, sandbox_up
from launcher.tasks import attach, doctor, init, launch, logs, report, slurm_submit, stacks, status, stop, sync, top

ns = checkout_namespace()

__all__ = ["attach", "bench", "demo", "doctor", "init", "launch", "logs", "ns", "report", "sandbox_down", "sandbox_up",
           "slurm_submit", "stacks", "status", "stop", "sync", "top"]
