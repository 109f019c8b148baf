"""The node side of `inv sync`: a stdlib-only program that the launcher sends over SSH (stdin) to each node.

Like the agent, it arrives in the first stdin line of `PYTHON -c BOOTSTRAP` (the node package, launcher/node/loader.py);
its request is the second line:
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
import sys
import time

from launcher.node.sync.syncstage import Stage, StreamEnded, free_bytes, manifest, os_sentence
from launcher.node.wire import LOCK_NAME, SYNC_TIMING, Refused, reply, timing, use_timing


def receive(dest, token, stream, on_end=None):
    """Stage every entry of the stream, then rename them all into place; returns (entries, bytes). `on_end()` runs
    once the end mark is read, before the renames (a relay passes the stream's last bytes on then)."""
    stage = Stage(dest, token)
    count = total = 0
    try:
        while True:
            line = stream.readline()
            if not line.endswith(b"\n"):
                raise StreamEnded("the controller's stream ended before its end mark")
            header = json.loads(line.decode("utf-8"))
            if header.get("end"):
                if on_end is not None:
                    on_end()
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


def receive_relayed(dest, request):
    """The stream, from stdin or from another node as the controller's first line says (`launcher.sync.relay`),
    passed on to the peers it names; (entries, bytes, what the controller hears of the relay)."""
    place = json.loads(sys.stdin.buffer.readline().decode("utf-8"))
    stall_s = float(request["relay_stall_s"])
    conn = None
    if "relay_from" in place:
        from launcher.node.sync.syncrelay import Listener

        listener = Listener()
        reply({"relay_port": listener.port})
        source, conn, peers = listener.accept(place["relay_from"]["node"], place["relay_from"]["token"], stall_s)
    else:
        source, peers = sys.stdin.buffer, place.get("relay_to") or []
    if conn is None and not peers:  # straight from the controller and on to nobody: no socket needed
        return (*receive(dest, request["token"], source), {})
    from launcher.node.sync.syncrelay import Tee, connect

    connected, failed = connect(peers, stall_s)
    tee = Tee(source, connected)
    whole = False
    try:
        count, total = receive(dest, request["token"], tee, on_end=tee.flush)
        whole = True
    except (StreamEnded, OSError) as exc:
        if conn is None or (isinstance(exc, OSError) and not isinstance(exc, socket_errors())):
            raise  # this node's own trouble (its disk), said as it is
        raise Refused("the stream relayed through %s broke off: %s" % (place["relay_from"]["node"], exc)) from None
    finally:
        tee.close(whole)
        if conn is not None:
            conn.close()
    unreached = failed + tee.dropped
    return (
        count,
        total,
        {
            "relayed_to": [n for n, _ in connected if n not in dict(tee.dropped)],
            "unreached": [{"node": n, "why": w} for n, w in unreached],
        },
    )


def socket_errors():
    import socket

    return socket.timeout, ConnectionError


def refuse_home(dest, request):
    """A home directory itself is no place for a project tree unless the user named it (`sync.dest`)."""
    if request.get("home_ok"):
        return
    if os.path.realpath(dest) == os.path.realpath(os.path.expanduser("~")):
        raise Refused(
            f"refusing to sync into the home directory {dest} itself: the tree's dotfiles (.gitignore, .env, "
            ".config/) would land over the user's own; set a workdir for this host, or sync.dest in the "
            "inventory (`dest: '~'` if you mean it)"
        )


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
    """Hold dest's lock file (a POSIX lock: NFS honours it), waiting up to `wait` s for another sync to end; the
    controller hears at once that this node waits (a shared workdir: the other sync may be its own, for another
    node, which must not wait for this one's manifest)."""
    path = os.path.join(dest, LOCK_NAME)
    deadline = time.monotonic() + wait
    said = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            if not said:
                reply({"waiting": "another sync into %s holds its lock" % dest})
                said = True
            if time.monotonic() > deadline:
                raise Refused(
                    f"another sync into {dest} is under way (waited {wait:g} s for it); run this one "
                    "again when it has ended"
                ) from None
            time.sleep(timing("wait_s"))
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
    made, lock, ok, relay, error = [], None, False, {}, None
    try:
        use_timing(request, SYNC_TIMING)
        refuse_home(dest, request)
        made = make_dest(dest)
        lock = lock_dest(dest, float(request["lock_wait"]))
        reply({"dest": dest, "manifest": manifest(dest, request["paths"]), "free": free_bytes(dest)})
        # From here stdin is binary: the controller sent nothing more before reading the answer above.
        if request.get("relay"):
            count, total, relay = receive_relayed(dest, request)
        else:
            count, total = receive(dest, request["token"], sys.stdin.buffer)
        ok = True
    except Refused as exc:
        error = str(exc)
    except OSError as exc:
        error = os_sentence(exc, dest)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if lock is not None:
            unlock_dest(lock)
        if not ok:
            for path in reversed(made):  # the destination this failed sync made, if nothing else went in since
                with contextlib.suppress(OSError):
                    os.rmdir(path)
    if error is not None:  # said after the clean-up: told, the controller may close the connection, and us, at once
        reply({"error": error})
        sys.exit(1)
    reply({"ok": True, "entries": count, "bytes": total, **relay})


if __name__ == "__main__":
    main()
