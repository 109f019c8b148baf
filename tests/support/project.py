"""A small project tree to sync: tracked code, an untracked file, git-ignored outputs, a nested .gitignore, data."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def project(root: Path, with_git: bool) -> Path:
    """A small project: tracked code, an untracked file, git-ignored outputs, a nested .gitignore, a data folder."""
    write(root / "train.py", "print('train')\n")
    write(root / "pkg" / "model.py", "W = 1\n")
    write(root / ".gitignore", "*.log\nout/\n")
    write(root / "run.log", "ignored\n")
    write(root / "out" / "ckpt.pt", "ignored\n")
    write(root / "pkg" / ".gitignore", "cache.bin\n!keep.log\n")
    write(root / "pkg" / "cache.bin", "ignored by the nested .gitignore\n")
    write(root / "pkg" / "keep.log", "re-included by the nested .gitignore\n")
    write(root / "data" / "big.bin", "excluded by the inventory\n")
    write(root / "notes.txt", "untracked, not ignored\n")
    if with_git:
        git(root, "init", "-q")
        git(root, "add", "train.py", "pkg/model.py", ".gitignore", "pkg/.gitignore")
        git(root, "commit", "-q", "-m", "init")
    return root


EXPECTED = {".gitignore", "notes.txt", "pkg/.gitignore", "pkg/keep.log", "pkg/model.py", "train.py"}


def conf_made_a_link(root: Path, elsewhere: Path, secret: str) -> Path:
    """A tracked `conf/credentials`, then `conf` replaced by a link to `elsewhere` (git still lists the file)."""
    write(root / "conf" / "credentials", "tracked\n")
    git(root, "add", "conf/credentials")
    git(root, "commit", "-q", "-m", "conf")
    write(elsewhere / "credentials", secret)
    (root / "conf" / "credentials").unlink()
    (root / "conf").rmdir()
    (root / "conf").symlink_to(elsewhere)
    return elsewhere
