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
   exit code is 1: nothing is left half-written. Nothing under dest is ever deleted.

Names are checked: relative, no `..`, no empty or `.` parts; no parent directory under dest may be a symlink
(writing through it could land outside dest); a symlink's target must stay inside dest.
Kept compatible with Python 3.8: it runs under whatever interpreter the node has.
"""

import contextlib
import errno
import json
import os
import shutil
import sys

CHUNK = 1 << 20
KINDS = ("file", "link")


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

    def __init__(self, dest, token):
        self.dest = dest
        self.token = token
        self.made = []  # directories created here, parents first
        self.staged = []  # (temporary path, final path, header)

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
                os.mkdir(path)
                self.made.append(path)
        path = self.dest
        for part in parts:
            path = os.path.join(path, part)
            if os.path.islink(path):
                raise Refused(f"{path} is a symlink on the node; refusing to write through it (it may point outside "
                              "the destination)")
            if not os.path.lexists(path):
                os.mkdir(path)
                self.made.append(path)
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
        tmp = os.path.join(parent, f".{parts[-1][:200]}.{self.token}.sync")
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

    def commit(self):
        for tmp, _final, header in self.staged:
            if header["kind"] == "file":
                os.chmod(tmp, int(header["mode"]) & 0o777)
                os.utime(tmp, ns=(int(header["mtime_ns"]), int(header["mtime_ns"])))
        for tmp, final, _header in self.staged:
            os.replace(tmp, final)
        self.staged = []

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


def main():
    request = json.loads(sys.stdin.readline())
    dest = os.path.abspath(os.path.expanduser(request["dest"]))
    try:
        reply({"dest": dest, "manifest": manifest(dest, request["paths"]), "free": free_bytes(dest)})
        # From here stdin is binary: the controller sent nothing more before reading the answer above.
        count, total = receive(dest, request["token"], sys.stdin.buffer)
    except Refused as exc:
        reply({"error": str(exc)})
        sys.exit(1)
    except OSError as exc:
        reply({"error": os_sentence(exc, dest)})
        sys.exit(1)
    except Exception as exc:
        reply({"error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
    reply({"ok": True, "entries": count, "bytes": total})


if __name__ == "__main__":
    main()
