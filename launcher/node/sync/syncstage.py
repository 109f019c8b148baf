"""`inv sync`'s staging on a node (stdlib only, Python 3.8+): names checked, entries written to temporary names,
then renamed into place all together, or everything put back (launcher/node/sync/syncd.py drives it)."""

import contextlib
import errno
import os
import shutil
import stat

from launcher.node.wire import TEMP_PREFIX, Refused, check_link_target, check_name, link_chain, timing

KINDS = ("file", "link")


class StreamEnded(Refused):
    """The stream stopped before its end mark (its sender stopped)."""


def free_bytes(dest):
    path = dest
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    try:
        return shutil.disk_usage(path or "/").free
    except OSError:
        return None


def entry_of(full):
    """What a manifest says of one path: [kind, size, mtime_ns, mode, link target], or None when it is not there."""
    try:
        st = os.lstat(full)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return ["link", 0, st.st_mtime_ns, 0, os.readlink(full)]
    if stat.S_ISDIR(st.st_mode):
        return ["dir", 0, st.st_mtime_ns, 0, None]
    if not stat.S_ISREG(st.st_mode):
        return ["other", 0, st.st_mtime_ns, 0, None]
    return ["file", st.st_size, st.st_mtime_ns, st.st_mode & 0o777, None]


def manifest(dest, paths):
    found = {}
    for path in paths:
        check_name(path)
        entry = entry_of(os.path.join(dest, path))
        if entry is not None:
            found[path] = entry
    return found


def os_sentence(exc, what):
    """An OSError as one sentence that says which path and what kind of trouble."""
    where = exc.filename or what
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return f"no space left on the node's disk while writing {where}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied: {where}"
    if exc.errno == errno.EROFS:
        return f"read-only file system: {where}"
    return f"{where}: {exc.strerror or exc}"


class Stage:
    """Entries written under temporary names, and the directories made for them; `commit` or `abort`."""

    def __init__(self, dest, token, made=None):
        self.dest = dest
        self.token = token
        self.made = list(made or [])  # directories created here, parents first
        self.staged = []  # (temporary path, final path, header)
        self.checked = set()  # directories under dest found (or made) real, not symlinks, during this stream

    def temp_name(self, parent, suffix=""):
        return os.path.join(parent, f"{TEMP_PREFIX}{self.token}.{len(self.staged)}{suffix}")

    def mkdir(self, path):
        """Make one directory; another sync making it at the same moment is no error (it is not ours to remove)."""
        try:
            os.mkdir(path)
        except FileExistsError:
            if os.path.islink(path) or not os.path.isdir(path):
                raise
            return
        self.made.append(path)

    def directory(self, parts):
        """Make (or check) dest and the parent directories of an entry; none under dest may be a symlink."""
        if self.dest not in self.checked and not os.path.isdir(self.dest):
            if os.path.lexists(self.dest):
                raise Refused(f"the destination {self.dest} exists and is not a directory")
            missing = []
            path = self.dest
            while path and not os.path.lexists(path):
                missing.append(path)
                path = os.path.dirname(path)
            for path in reversed(missing):
                self.mkdir(path)
        self.checked.add(self.dest)
        path = self.dest
        for part in parts:
            path = os.path.join(path, part)
            if path in self.checked:  # the one sync under dest's lock: what was a directory still is
                continue
            if os.path.islink(path):
                raise Refused(
                    f"{path} is a symlink on the node; refusing to write through it (it may point outside "
                    "the destination)"
                )
            if not os.path.lexists(path):
                self.mkdir(path)
            elif not os.path.isdir(path):
                raise Refused(f"{path} is a file on the node where the tree has a directory")
            self.checked.add(path)
        return path

    def add(self, header, stream):
        parts = check_name(header.get("path"))
        kind = header.get("kind")
        if kind not in KINDS:
            raise Refused(f"unknown entry kind {kind!r} for {header.get('path')}")
        parent = self.directory(parts[:-1])
        final = os.path.join(parent, parts[-1])
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(final).st_mode):
                raise Refused(f"{final} is a directory on the node where the tree has a {kind}")
        tmp = self.temp_name(parent)
        if kind == "link":
            check_link_target(header["path"], header.get("target"))
            os.symlink(header["target"], tmp)
            self.staged.append((tmp, final, header))
            return
        size = int(header["size"])
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        self.staged.append((tmp, final, header))
        # Straight to the descriptor (a file object's isatty and seek calls cost more than a small file's write);
        # its mode and mtime set on it now, once its last byte is written.
        try:
            left = size
            while left:
                chunk = stream.read(min(int(timing("read_chunk")), left))
                if not chunk:
                    raise StreamEnded(
                        f"the stream ended in the middle of {header['path']} (the controller stopped sending)"
                    )
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                left -= len(chunk)
            os.fchmod(fd, int(header["mode"]) & 0o777)
            os.utime(fd, ns=(int(header["mtime_ns"]), int(header["mtime_ns"])))
        finally:
            os.close(fd)

    def check_links(self):
        """Refuse a link whose target passes through another symlink, of this stream or already on the node."""
        links = {h["path"] for _t, _f, h in self.staged if h["kind"] == "link"}

        def is_link(rel):
            return rel in links or os.path.islink(os.path.join(self.dest, rel))

        for _tmp, _final, header in self.staged:
            if header["kind"] == "link":
                via = link_chain(header["path"], header["target"], is_link)
                if via is not None:
                    raise Refused(
                        f"refusing symlink {header['path']} -> {header['target']}: it passes through the "
                        f"symlink {via}, and a chain of links can lead outside the destination"
                    )

    def commit(self):
        """Rename every staged entry into place: all of them, or (a rename failing) none, the old files put back."""
        self.check_links()
        done = []  # (final path, the kept old entry or None), for each entry renamed into place
        for index, (tmp, final, header) in enumerate(self.staged):
            old = None
            try:
                old = self.keep_old(final, index)
                os.replace(tmp, final)
            except OSError as exc:
                if old is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(old)
                raise Refused(self.rolled_back(done, header["path"], exc)) from None
            done.append((final, old))
        self.staged = []
        for _final, old in done:
            if old is not None:
                with contextlib.suppress(OSError):
                    os.unlink(old)

    def keep_old(self, final, index):
        """A hard link to the entry `final` replaces (None: there is none), so that a failed commit can put it back;
        the final name stays in place all along (a rename would leave a moment without it)."""
        if not os.path.lexists(final):
            return None
        old = os.path.join(os.path.dirname(final), f"{TEMP_PREFIX}{self.token}.{index}.old")
        try:
            os.link(final, old, follow_symlinks=False)
        except OSError as exc:  # a file system without hard links: a copy does
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV, errno.ENOSYS):
                raise
            if os.path.islink(final):
                os.symlink(os.readlink(final), old)
            else:
                shutil.copy2(final, old)
        return old

    def rolled_back(self, done, path, exc):
        """Put back what `done` replaced, newest first; the sentence says what the node holds now."""
        failed = []
        for final, old in reversed(done):
            try:
                if old is None:
                    if os.path.lexists(final) and not os.path.isdir(final):
                        os.unlink(final)
                else:
                    os.replace(old, final)
            except OSError:
                failed.append(final)
        why = exc.strerror or str(exc)
        if failed:
            return (
                f"renaming {path} into place failed ({why}), and {len(failed)} file(s) renamed before it could "
                f"not be put back ({', '.join(failed[:3])}): the node holds a mix of the old and the new tree; "
                "run the sync again"
            )
        return (
            f"renaming {path} into place failed ({why}); the {len(done)} file(s) renamed before it were put "
            "back: the node keeps its old tree"
        )

    def abort(self):
        for tmp, _final, _header in self.staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        for path in reversed(self.made):
            with contextlib.suppress(OSError):
                os.rmdir(path)
