"""The user's project: its root folder (the git work tree's top, else the current folder), where its settings'
relative paths start, and whether its files may be read at all (git's `safe.directory` rule: only this user's)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from launcher.errors import UnsafeProject

CONFIG_NAME = "ddpl"
"""The project's config file is `ddpl.yaml` at its root (or .yml, .json); the user's is `~/.ddpl.yaml`."""
SAFE_SETTING = "safe_directories"
"""The user-level setting (~/.ddpl.yaml) that lists other users' project folders this user trusts."""


def find_root(start: Path | None = None) -> Path:
    """The project `start` (default: the current folder) is in: the nearest folder up that holds `.git` (a folder,
    or a file in a worktree or submodule), else `start` itself. No git process: a `ddpl` start stays quick."""
    start = (start or Path.cwd()).absolute()
    return next((folder for folder in (start, *start.parents) if (folder / ".git").exists()), start)


def resolve(path: str | Path, root: Path | None) -> Path:
    """A path from a settings file: relative to the project root (None: as it is, relative to the current folder)."""
    path = Path(path).expanduser()
    return path if root is None or path.is_absolute() else root / path


def _name(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_owner(path: Path, safe: Iterable[str] = ()) -> None:
    """An `UnsafeProject` error when `path` or its folder belongs to another user than this process's, unless the
    folder is one of `safe` (the user's `safe_directories`, `*` for all)."""
    me = os.geteuid()
    folder = path.absolute().parent
    trusted = {str(Path(s).expanduser().absolute()) for s in safe if s != "*"}
    if "*" in safe or str(folder) in trusted or str(folder.resolve()) in trusted:
        return
    for item in (folder, path):
        try:
            owner = item.stat().st_uid
        except OSError:
            continue  # not there: nothing is read from it
        if owner != me:
            raise UnsafeProject(
                str(item),
                _name(owner),
                _name(me),
                f"{SAFE_SETTING} in ~/.{CONFIG_NAME}.yaml ({SAFE_SETTING}: [{folder}])",
            )
