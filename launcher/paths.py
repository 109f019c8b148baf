"""Where the launcher's own files are, and how a path is shown to a user: the bottom layer, it imports nothing."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""This checkout (tasks.py's folder): a submitted SLURM job starts there and runs the same code."""


def relative(path: Path) -> str:
    """`path` relative to the current folder when it is under it (as a user typed it), else whole."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
