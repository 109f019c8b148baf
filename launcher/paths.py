"""Where the launcher's own files are, and how a path is shown to a user: the bottom layer, it imports nothing."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""This checkout (tasks.py's folder): a submitted SLURM job starts there and runs the same code."""


def relative(path: Path) -> str:
    """`path` relative to the current folder when it is under it (as a user typed it), else whole."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def command_name() -> str:
    """The command that runs the launcher's tasks in this process, as the hints in messages name it: `ddpl` (the
    installed command, or `python -m launcher`), else `inv` (a checkout's tasks.py)."""
    first = sys.argv[0] if sys.argv else ""
    return "ddpl" if Path(first).name == "ddpl" or Path(first).parts[-2:] == ("launcher", "__main__.py") else "inv"
