"""The controller's side of `inv sync`, before anything travels: the project tree to send (in a git work tree
`git ls-files --cached --others --exclude-standard`, otherwise a walk that honours every `.gitignore`, less
`sync.exclude`), and which entries differ from what a node has (rsync's quick check: size and mtime).

The inventory's env files and any file named `.env` never travel (they hold secrets; their values reach the nodes
with the launch), nor does anything reached through a symlinked folder of the tree (it lies outside it).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.config.model import Cluster, SyncSpec
from launcher.errors import LauncherError
from launcher.node.wire import LOCK_NAME, TEMP_PREFIX, Refused, check_link_target, check_name, link_chain

TIME_UNITS = (10**3, 10**6, 10**9)
"""Granularities a node's file system may keep mtimes in (µs, ms, s); a time cut to one of them still matches."""


SECRET_NAMES = (".env",)
"""File names never synced wherever they are in the tree: dotenv's default name, which holds tokens."""


def spec_of(cluster: Cluster) -> SyncSpec:
    """The inventory's `sync:` settings, or their defaults (this tree, to each host's workdir)."""
    return cluster.sync or SyncSpec()


@dataclass(frozen=True)
class Entry:
    """One file or symlink of the tree."""

    path: str
    """Relative, `/`-separated."""
    kind: str
    """"file" or "link"."""
    size: int = 0
    mtime_ns: int = 0
    mode: int = 0o644
    target: str | None = None
    """A link's target (relative, inside the tree)."""
    identity: tuple[int, int, int] | None = field(default=None, compare=False)
    """A file's (st_dev, st_ino, st_ctime_ns) when listed: the file a send opens is this one (its inode not reused:
    a new file's ctime is newer), or its path is checked again."""


@dataclass(frozen=True)
class Tree:
    """The local tree to sync, and what was left out and why."""

    root: Path
    entries: tuple[Entry, ...]
    how: str
    """"git ls-files" or "walk + .gitignore"."""
    notes: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    @property
    def paths(self) -> set[str]:
        return {e.path for e in self.entries}


def env_files(cluster: Cluster) -> list[Path]:
    """The inventory's env files on this machine: never synced, whatever their `secret:` says."""
    found = {Path(h.env_file.path).expanduser().absolute() for h in cluster.hosts if h.env_file is not None}
    return sorted(found)


def project_tree(cluster: Cluster, outputs: Sequence[Path] = ()) -> tuple[SyncSpec, Tree]:
    """The inventory's sync settings and the tree they send: its source less sync.exclude, its env files, and the
    launcher's own folders `outputs` (its log_dir)."""
    spec = spec_of(cluster)
    return spec, local_tree(spec.src, spec.exclude, env_files(cluster), outputs)


def local_tree(
    src: str | Path, exclude: Sequence[str] = (), leave_out: Sequence[Path] = (), outputs: Sequence[Path] = ()
) -> Tree:
    """List the tree at `src`: git's view of it in a work tree, else a walk honouring .gitignore; less `exclude`,
    the files `leave_out` (the inventory's env files), any `.env`, what lies behind a symlinked folder, and the
    launcher's own output folders `outputs` (its log_dir), which no .gitignore needs to name."""
    root = Path(src).expanduser().absolute()
    if not root.is_dir():
        raise LauncherError(f"sync source {root} is not a directory")
    try:
        return _list_tree(root, exclude, leave_out, _inside(root, outputs))
    except OSError as exc:  # an unreadable folder or .gitignore: one sentence, before any node is contacted
        where = exc.filename or root
        raise LauncherError(
            f"cannot read {where} to list the sync tree ({exc.strerror or exc}); fix its "
            "permissions or leave it out with sync.exclude"
        ) from None


def _inside(root: Path, folders: Sequence[Path]) -> list[str]:
    """Each of `folders` that lies in the tree at `root`, relative to it (`logs`); the others are no part of it."""
    found = []
    for folder in folders:
        try:
            rel = Path(folder).expanduser().absolute().resolve().relative_to(root.resolve())
        except ValueError:
            continue
        if rel.parts:
            found.append(rel.as_posix())
    return found


def _list_tree(root: Path, exclude: Sequence[str], leave_out: Sequence[Path], ours: Sequence[str] = ()) -> Tree:
    from pathspec import GitIgnoreSpec

    excluded = GitIgnoreSpec.from_lines([*exclude, *(f"/{folder}/" for folder in ours)])
    names = _git_names(root)
    how = "git ls-files"
    if names is None:
        names, how = list(_walk_names(root, excluded)), "walk + .gitignore"
    secret_files = {str(p) for p in leave_out}
    entries: list[Entry] = []
    behind_links: dict[str, list[str]] = {}
    notes = [
        f"left out {folder}/: the launcher's own output (its log_dir), never synced"
        for folder in ours
        if (root / folder).is_dir()
    ]
    for name in names:
        base = name.rsplit("/", 1)[-1]
        if excluded.match_file(name) or base == LOCK_NAME or base.startswith(TEMP_PREFIX):
            continue  # a sync into this very tree (a shared workdir) is under way: not part of the tree
        if str(root / name) in secret_files or base in SECRET_NAMES:
            notes.append(f"left out {name}: an env file (its values reach the nodes with the launch, never as a file)")
            continue
        link = _symlinked_folder(root, name)
        if link is not None:
            behind_links.setdefault(link, []).append(name)
            continue
        found = _entry(root, name)
        if isinstance(found, Entry):
            entries.append(found)
        elif found:
            notes.append(found)
    for link, under in behind_links.items():
        notes.append(
            f"skipped {len(under)} file(s) under {link}/: {link} is a symlink (-> "
            f"{os.readlink(root / link)}), and what lies behind it is not part of the tree"
        )
    entries, chained = _without_link_chains(entries)
    return Tree(root, tuple(sorted(entries, key=lambda e: e.path)), how, tuple(notes + chained))


def _symlinked_folder(root: Path, name: str) -> str | None:
    """The first folder on `name`'s way that is a symlink (git still lists files under a folder since replaced by a
    link), else None."""
    parts = name.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        if os.path.islink(root.joinpath(*parts[:i])):
            return "/".join(parts[:i])
    return None


def _without_link_chains(entries: list[Entry]) -> tuple[list[Entry], list[str]]:
    """The entries less every link whose target passes through another link of the tree, and a note for each."""
    links = {e.path for e in entries if e.kind == "link"}
    kept, notes = [], []
    for e in entries:
        via = link_chain(e.path, e.target or "", links.__contains__) if e.kind == "link" else None
        if via is None:
            kept.append(e)
        else:
            notes.append(
                f"skipped symlink {e.path} -> {e.target}: it passes through the symlink {via}, and a chain "
                "of links can lead outside the tree"
            )
    return kept, notes


def _git_names(root: Path) -> list[str] | None:
    """What git would commit under `root` (tracked and untracked, less ignored); None outside a work tree."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            capture_output=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None  # no git here: the walk honours .gitignore itself
    if listed.returncode != 0:
        raise LauncherError(f"`git ls-files` failed in {root}: {listed.stderr.decode(errors='replace').strip()}")
    unread = re.search(r"could not open directory '([^']*)': (.*)", listed.stderr.decode(errors="replace"))
    if unread:  # git only warns, and leaves that folder's files out of every node: an error here
        raise PermissionError(errno.EACCES, unread[2].strip(), str(root / unread[1].rstrip("/")))
    return list(dict.fromkeys(os.fsdecode(n) for n in listed.stdout.split(b"\0") if n))  # unmerged: once


def _walk_names(root: Path, excluded: Any) -> Iterable[str]:
    """Every file under `root` that no .gitignore on its way (the deepest deciding) nor `excluded` leaves out."""
    from pathspec import GitIgnoreSpec

    pending: list[tuple[str, tuple[tuple[str, Any], ...]]] = [("", ())]
    while pending:
        rel, specs = pending.pop()
        here = root / rel
        items = sorted(os.scandir(here), key=lambda d: d.name)  # first: an unreadable folder is named as such
        ignore = here / ".gitignore"
        if ignore.is_file():
            specs = (*specs, (rel, GitIgnoreSpec.from_lines(ignore.read_text(errors="replace").splitlines())))
        for item in items:
            path = f"{rel}/{item.name}" if rel else item.name
            is_dir = item.is_dir(follow_symlinks=False)
            if item.name == ".git" or _ignored(specs, path, is_dir) or (is_dir and excluded.match_file(path + "/")):
                continue
            if is_dir:
                pending.append((path, specs))
            else:
                yield path


def _ignored(specs: Sequence[tuple[str, Any]], path: str, is_dir: bool) -> bool:
    """git's rule: the deepest .gitignore with a matching pattern decides (its last match, `!` re-includes)."""
    for base, spec in reversed(specs):
        relative = path[len(base) + 1 :] if base else path
        decided = spec.check_file(relative + "/" if is_dir else relative).include
        if decided is not None:
            return bool(decided)
    return False


def _entry(root: Path, name: str) -> Entry | str | None:
    """The entry for `name`, or a note saying why it does not travel (None: gone since listing)."""
    try:
        check_name(name)
    except Refused as exc:
        return f"skipped: {exc}"
    try:
        st = os.lstat(root / name)
    except FileNotFoundError:
        return None  # deleted but still in git's index: nothing to send
    if stat.S_ISREG(st.st_mode):
        return Entry(
            name,
            "file",
            st.st_size,
            st.st_mtime_ns,
            st.st_mode & 0o777,
            identity=(st.st_dev, st.st_ino, st.st_ctime_ns),
        )
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(root / name)
        try:
            check_link_target(name, target)
        except Refused:
            return f"skipped symlink {name} -> {target}: it points outside the tree"
        return Entry(name, "link", target=target)
    if stat.S_ISDIR(st.st_mode):
        return f"skipped {name}/: a directory git lists as one entry (a submodule?)"
    return f"skipped {name}: not a regular file or a symlink"


def is_current(entry: Entry, there: Sequence[Any] | None) -> bool:
    """rsync's quick check: the node has this entry when kind, size, mode and mtime (or a link's target) match."""
    if there is None:
        return False
    kind, size, mtime_ns, mode, target = there
    if kind != entry.kind:
        return False
    if kind == "link":
        return target == entry.target
    return size == entry.size and mode == entry.mode and same_time(entry.mtime_ns, mtime_ns)


def same_time(local_ns: int, remote_ns: int) -> bool:
    """Equal mtimes, allowing a node file system that keeps them in µs, ms or whole seconds."""
    return local_ns == remote_ns or any(
        remote_ns % unit == 0 and remote_ns == local_ns - local_ns % unit for unit in TIME_UNITS
    )


def changed(entries: Iterable[Entry], manifest: Mapping[str, Sequence[Any]]) -> list[Entry]:
    """The entries a node lacks or has otherwise."""
    return [e for e in entries if not is_current(e, manifest.get(e.path))]


def size_text(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def describe_tree(cluster: Cluster, tree: Tree, spec: SyncSpec) -> list[str]:
    """What will travel, and notes: skipped entries, a job script that is not in the tree."""
    lines = [
        f"syncing {tree.root} ({len(tree.entries)} files, {size_text(tree.size)}; {tree.how}"
        + (f"; excluding {', '.join(spec.exclude)}" if spec.exclude else "")
        + ")"
    ]
    lines += [f"note: {n}" for n in tree.notes]
    job = cluster.job
    if (
        job is not None
        and job.script is not None
        and spec.dest is None
        and not os.path.isabs(job.script)
        and os.path.normpath(job.script) not in tree.paths
    ):
        lines.append(f"note: the job's script {job.script} is not in the synced tree (ignored or excluded?)")
    return lines
