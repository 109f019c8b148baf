"""The node side of `inv sync`: a stdlib-only program that the launcher sends over SSH (stdin) to each node.

Like the agent, it arrives as the first stdin line of `PYTHON -c BOOTSTRAP`; its request is the second line:
`{"dest": DIR, "paths": [relative paths the controller has]}`. One session does the whole sync:

1. It answers one JSON line on stdout: for each requested path that exists under dest, what is there
   (`[kind, size, mtime_ns, mode, link target]`), and the free bytes where dest is (or would be made).
2. The controller, having compared, sends the changed entries: for each, a JSON header line
   `{"path", "kind", "size", "mtime_ns", "mode", "target"}` followed by `size` bytes of a file's content;
   then `{"end": true}`. Nothing else travels before step 1's answer, so the binary stream never reaches
   the text reader that read the two request lines.
3. Every entry is written to a temporary name beside its final one; only when the whole stream has arrived are
   they renamed into place, and mtimes and modes set. On any error (a bad name, no space, a permission, the stream
   ending early) every temporary file and every directory made here is removed, one JSON line says why, and the
   exit code is 1: nothing is left half-written. A rename that fails part way (EBUSY on a bind-mounted file, a
   directory in the way) puts back every file renamed before it (each old file was kept under a hard link), so the
   node ends with its whole old tree or the whole new one, and the line says which. Nothing under dest is ever
   deleted.

One sync at a time per destination: the session holds a lock file in dest (`.ddp-launcher-sync.lock`, a POSIX
lock, which NFS honours) from before its manifest to after its renames, so two launches syncing one shared
workdir take turns (up to the request's `lock_wait` seconds), and the second sees what the first wrote. A sync into
a home directory itself is refused unless the request says the user asked for it (`sync.dest`): the tree's
dotfiles (`.gitignore`, `.env`, `.config/`) would land over the user's own.

Names are checked: relative, no `..`, no empty or `.` parts; no parent directory under dest may be a symlink
(writing through it could land outside dest); a symlink's target must stay inside dest and may not pass through
another symlink (a chain `d/up -> ..`, `d/e -> up/../../x` would leave it).
Kept compatible with Python 3.8: it runs under whatever interpreter the node has.
"""

import contextlib
import errno
import fcntl
import json
import os
import shutil
import sys
import time

CHUNK = 1 << 20
KINDS = ("file", "link")
LOCK_NAME = ".ddp-launcher-sync.lock"
TEMP_PREFIX = ".ddp-sync."
"""Temporary names are `.ddp-sync.<token>.<n>` (and `.old` for a kept old file): short whatever the entry's name."""


class Refused(Exception):
    """One sentence for the controller: why this node's sync cannot go on."""


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def check_name(path):
    """The relative path's parts, or Refused when it is absolute, has `..`, `.` or empty parts, or a NUL."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\0" in path:
        raise Refused(f"refusing path {path!r}: only relative paths inside the destination are allowed")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise Refused(f"refusing path {path!r}: it would leave the destination (`..`, `.` or empty parts)")
    return parts


def check_link_target(path, target):
    """A symlink's target must be relative and resolve (lexically) inside dest."""
    if not target or target.startswith("/") or "\0" in target:
        raise Refused(f"refusing symlink {path} -> {target}: it points outside the destination")
    depth = len(path.split("/")) - 1
    for part in target.split("/"):
        if part == "..":
            depth -= 1
        elif part not in ("", "."):
            depth += 1
        if depth < 0:
            raise Refused(f"refusing symlink {path} -> {target}: it points outside the destination")


def link_chain(path, target, is_link):
    """The first path (relative to dest) that `path`'s target passes through and that `is_link` says is a symlink,
    else None: targets are checked lexically, so a symlink on the way could lead anywhere."""
    parts = path.split("/")[:-1]
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            parts = parts[:-1]
            continue
        parts.append(part)
        if is_link("/".join(parts)):
            return "/".join(parts)
    return None


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


def describe(full):
    try:
        st = os.lstat(full)
    except OSError:
        return None
    if os.path.islink(full):
        return ["link", 0, st.st_mtime_ns, 0, os.readlink(full)]
    if os.path.isdir(full):
        return ["dir", 0, st.st_mtime_ns, 0, None]
    if not os.path.isfile(full):
        return ["other", 0, st.st_mtime_ns, 0, None]
    return ["file", st.st_size, st.st_mtime_ns, st.st_mode & 0o777, None]


def manifest(dest, paths):
    found = {}
    for path in paths:
        check_name(path)
        entry = describe(os.path.join(dest, path))
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
        if not os.path.isdir(self.dest):
            if os.path.lexists(self.dest):
                raise Refused(f"the destination {self.dest} exists and is not a directory")
            missing = []
            path = self.dest
            while path and not os.path.lexists(path):
                missing.append(path)
                path = os.path.dirname(path)
            for path in reversed(missing):
                self.mkdir(path)
        path = self.dest
        for part in parts:
            path = os.path.join(path, part)
            if os.path.islink(path):
                raise Refused(f"{path} is a symlink on the node; refusing to write through it (it may point outside "
                              "the destination)")
            if not os.path.lexists(path):
                self.mkdir(path)
            elif not os.path.isdir(path):
                raise Refused(f"{path} is a file on the node where the tree has a directory")
        return path

    def add(self, header, stream):
        parts = check_name(header.get("path"))
        kind = header.get("kind")
        if kind not in KINDS:
            raise Refused(f"unknown entry kind {kind!r} for {header.get('path')}")
        parent = self.directory(parts[:-1])
        final = os.path.join(parent, parts[-1])
        if os.path.isdir(final) and not os.path.islink(final):
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
        with os.fdopen(fd, "wb") as out:
            left = size
            while left:
                chunk = stream.read(min(CHUNK, left))
                if not chunk:
                    raise Refused(f"the stream ended in the middle of {header['path']} (the controller stopped "
                                  "sending)")
                out.write(chunk)
                left -= len(chunk)

    def check_links(self):
        """Refuse a link whose target passes through another symlink, of this stream or already on the node."""
        links = {h["path"] for _t, _f, h in self.staged if h["kind"] == "link"}

        def is_link(rel):
            return rel in links or os.path.islink(os.path.join(self.dest, rel))

        for _tmp, _final, header in self.staged:
            if header["kind"] == "link":
                via = link_chain(header["path"], header["target"], is_link)
                if via is not None:
                    raise Refused(f"refusing symlink {header['path']} -> {header['target']}: it passes through the "
                                  f"symlink {via}, and a chain of links can lead outside the destination")

    def commit(self):
        """Rename every staged entry into place: all of them, or (a rename failing) none, the old files put back."""
        self.check_links()
        for tmp, _final, header in self.staged:
            if header["kind"] == "file":
                os.chmod(tmp, int(header["mode"]) & 0o777)
                os.utime(tmp, ns=(int(header["mtime_ns"]), int(header["mtime_ns"])))
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
            return (f"renaming {path} into place failed ({why}), and {len(failed)} file(s) renamed before it could "
                    f"not be put back ({', '.join(failed[:3])}): the node holds a mix of the old and the new tree; "
                    "run the sync again")
        return (f"renaming {path} into place failed ({why}); the {len(done)} file(s) renamed before it were put "
                "back: the node keeps its old tree")

    def abort(self):
        for tmp, _final, _header in self.staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        for path in reversed(self.made):
            with contextlib.suppress(OSError):
                os.rmdir(path)


def receive(dest, token, stream):
    """Stage every entry of the stream, then rename them all into place; returns (entries, bytes)."""
    stage = Stage(dest, token)
    count = total = 0
    try:
        while True:
            line = stream.readline()
            if not line:
                raise Refused("the controller's stream ended before its end mark")
            header = json.loads(line.decode("utf-8"))
            if header.get("end"):
                break
            stage.add(header, stream)
            count += 1
            if header["kind"] == "file":  # a link carries a target, not bytes
                total += int(header["size"])
        stage.commit()
    except BaseException:
        stage.abort()
        raise
    return count, total


def refuse_home(dest, request):
    """A home directory itself is no place for a project tree unless the user named it (`sync.dest`)."""
    if request.get("home_ok"):
        return
    if os.path.realpath(dest) == os.path.realpath(os.path.expanduser("~")):
        raise Refused(f"refusing to sync into the home directory {dest} itself: the tree's dotfiles (.gitignore, .env, "
                      ".config/) would land over the user's own; set a workdir for this host, or sync.dest in the "
                      "inventory (`dest: '~'` if you mean it)")


def make_dest(dest):
    """Make dest and its missing parents; the directories made, parents first."""
    if os.path.lexists(dest) and not os.path.isdir(dest):
        raise Refused(f"the destination {dest} exists and is not a directory")
    missing = []
    path = dest
    while path and not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    made = []
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:  # another sync made it at the same moment
            continue
        made.append(path)
    return made


def lock_dest(dest, wait):
    """Hold dest's lock file (a POSIX lock: NFS honours it), waiting up to `wait` s for another sync to end."""
    path = os.path.join(dest, LOCK_NAME)
    deadline = time.monotonic() + wait
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if time.monotonic() > deadline:
                raise Refused(f"another sync into {dest} is under way (waited {wait:g} s for it); run this one "
                              "again when it has ended") from None
            time.sleep(0.1)
            continue
        try:  # the holder before us removes the file when done: a lock on that old file locks nothing
            if os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino:
                return fd, path
        except FileNotFoundError:
            pass
        os.close(fd)


def unlock_dest(lock):
    fd, path = lock
    with contextlib.suppress(OSError):
        os.unlink(path)  # while still held: whoever waits sees the file gone and takes a new one
    os.close(fd)


def main():
    request = json.loads(sys.stdin.readline())
    dest = os.path.abspath(os.path.expanduser(request["dest"]))
    made, lock, ok = [], None, False
    try:
        refuse_home(dest, request)
        made = make_dest(dest)
        lock = lock_dest(dest, float(request["lock_wait"]))
        reply({"dest": dest, "manifest": manifest(dest, request["paths"]), "free": free_bytes(dest)})
        # From here stdin is binary: the controller sent nothing more before reading the answer above.
        count, total = receive(dest, request["token"], sys.stdin.buffer)
        ok = True
    except Refused as exc:
        reply({"error": str(exc)})
        sys.exit(1)
    except OSError as exc:
        reply({"error": os_sentence(exc, dest)})
        sys.exit(1)
    except Exception as exc:
        reply({"error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
    finally:
        if lock is not None:
            unlock_dest(lock)
        if not ok:
            for path in reversed(made):  # the destination this failed sync made, if nothing else went in since
                with contextlib.suppress(OSError):
                    os.rmdir(path)
    reply({"ok": True, "entries": count, "bytes": total})


if __name__ == "__main__":
    main()
