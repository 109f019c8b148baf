"""torchrun started while the node waits for `go` (stdlib only, Python 3.8+): its python imports torch during the
doctor's checks and the wait for the other nodes, and runs torchrun itself only on `go`.

Why: torchrun's first seconds are its import of torch (1-2 s of CPU on a small node), and an ssh loop starts that
import the moment each node has logged in. The launcher's start holds every node until all are ready (a run starts
on all nodes or on none), and with the doctor on until its checks pass: before this, the import began only then.

What it may and may not do before `go`: the process is started with torchrun's whole environment (its run mark
included, so a stop's sweep finds it), in torchrun's folder and its own session, and imports
`torch.distributed.launcher.api` (what `torch.distributed.run` imports, without running it). It makes nothing:
no run directory, no log, no named file; what it prints (an import's warning) waits in a file without a name
(O_TMPFILE) and goes first into torchrun's log on `go`. On `go` the agent sends the path of
torchrun's own log; the program sends its output there and runs torchrun's words as the launcher planned them
(behind the store wait on nodes 1+). An `abort`, a stop or a failed check kills it; if the agent itself dies first,
the kernel kills it (PR_SET_PDEATHSIG, cleared on `go`). Whatever goes wrong before `go` (an import error, a
process that died) leaves torchrun to start as it did without this: the log shows torchrun's own error.

Started as `python -c SOURCE WORKDIR <the planned words after python>`, where the planned words are
`-m torch.distributed.run ...` or the store wait's `-c SOURCE ...` (launcher/node/agent/storewait.py).
"""

import os
import signal

from launcher.node.agent.storewait import SOURCE as STORE_WAIT
from launcher.node.agent.storewait import TORCHRUN
from launcher.node.common import child

# prctl(1, 9): PR_SET_PDEATHSIG, SIGKILL; prctl(1, 0) clears it. The death that matters is the agent's, and the
# parent may be another process: a node's `python:` can be a wrapper that runs python without `exec` (`conda run`, a
# site's shell script), and so stays between them. So the agent's presence is read from the pipe it holds, never from
# the parent's pid: a pipe whose only writer is gone hangs up (checked once the signal is set, for an agent that died
# before), and reads end of file (after the import, for an agent that died during it behind a wrapper).
SOURCE = """\
import os, sys
os.chdir(sys.argv[1])
try:
    import ctypes
    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)
except Exception:
    pass
import select
gone = select.poll()
gone.register(0, select.POLLIN)
if any(ev & select.POLLHUP and not ev & select.POLLIN for _, ev in gone.poll(0)):
    os._exit(0)
try:
    import torch.distributed.launcher.api
except Exception:
    pass
line = sys.stdin.readline()
if not line.endswith("\\n"):
    os._exit(0)
try:
    sys.stdout.flush()
    sys.stderr.flush()
except Exception:
    pass
fd = os.open(line[:-1], os.O_WRONLY | os.O_APPEND)
if "_on_go" in globals():
    _on_go(line[:-1])
try:
    same = os.fstat(1)
    if (same.st_dev, same.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
        raise OSError("already the log")
    os.lseek(1, 0, 0)
    chunk = os.read(1, 65536)
    while chunk:
        os.write(fd, chunk)
        chunk = os.read(1, 65536)
except OSError:
    pass
os.dup2(fd, 1)
os.dup2(fd, 2)
os.close(fd)
fd = os.open(os.devnull, os.O_RDONLY)
os.dup2(fd, 0)
os.close(fd)
try:
    ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)
except Exception:
    pass
words = sys.argv[2:]
if words[0] == "-m":
    import runpy
    sys.argv[:] = [sys.argv[0]] + words[2:]
    runpy.run_module(words[1], run_name="__main__", alter_sys=True)
else:
    sys.argv[:] = ["-c"] + words[2:]
    exec(compile(words[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""


class Prestarted:
    """torchrun's python, started and importing torch, held until `go` (`release`) or killed (`drop`)."""

    def __init__(self, proc, planned, env, go_fd):
        self.proc, self.planned, self.env, self.go_fd = proc, planned, env, go_fd

    def release(self, argv, env, log_path):
        """The held process as torchrun with these words, its output to `log_path`; None (and it is gone) when it
        cannot be: other words or environment than it started with, or it has ended."""
        if argv != self.planned or env != self.env or self.proc.poll() is not None:
            self.drop()
            return None
        try:
            os.write(self.go_fd, (log_path + "\n").encode())
        except OSError:
            self.drop()
            return None
        os.close(self.go_fd)
        self.go_fd = None
        return self.proc

    def drop(self):
        """Kill it (its session: it started nothing yet) and wait for it; nothing once it was let go."""
        if self.go_fd is None:
            return
        try:  # before the pipe closes: its end of file would let it exit by itself first (0, not killed)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        os.close(self.go_fd)
        self.go_fd = None
        self.proc.wait()


def hold(argv, workdir, env):
    """Start torchrun's python for `argv` (the launcher's own `-m torch.distributed.run` words, or their store wait
    form) held before torchrun; None where it does not apply or cannot start (torchrun then starts on `go`)."""
    if not _launcher_form(argv) or getattr(os, "posix_spawn", None) is None:
        return None
    python = argv[0]
    if os.sep in python and not os.path.isabs(python):
        python = os.path.join(workdir, python)  # relative to torchrun's folder, as child.start resolves it
    program = child.which(python, env.get("PATH"))
    if program is None:
        return None
    read_fd, write_fd = os.pipe()
    early = early_output(env)
    actions = [
        (os.POSIX_SPAWN_DUP2, read_fd, 0),
        (os.POSIX_SPAWN_DUP2, early, 1) if early is not None else (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    command = [argv[0], "-c", SOURCE, workdir, *argv[1:]]
    try:
        proc = child.spawn_in_session(program, command, env, actions)
    except (OSError, NotImplementedError):
        os.close(write_fd)
        return None
    finally:
        os.close(read_fd)
        if early is not None:
            os.close(early)
    return Prestarted(proc, list(argv), dict(env), write_fd)


def early_output(env):
    """A file without a name (O_TMPFILE) for what the held python prints before `go` (an import's warnings), which
    it copies into torchrun's log on `go`; None where the system or the folder has no such files (then /dev/null)."""
    try:
        return os.open(env.get("TMPDIR") or "/tmp", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except (AttributeError, OSError):
        return None


def _launcher_form(argv):
    return tuple(argv[1:3]) in (TORCHRUN, ("-c", STORE_WAIT))
