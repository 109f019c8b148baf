"""The sandbox's process helpers for tests: `launcher.sandbox.observe`, where bench/ takes them from too."""

from launcher.sandbox.observe import (
    children,
    free_port,
    gone,
    parent,
    pids_with_env,
    processes_mentioning,
    reserve_base_addr,
    run_processes,
    sshd_family,
)

__all__ = [
    "children",
    "free_port",
    "gone",
    "parent",
    "pids_with_env",
    "processes_mentioning",
    "reserve_base_addr",
    "run_processes",
    "sshd_family",
]
