"""torchrun started as a child of the supervisor (stdlib only, Python 3.8+), without importing `subprocess`.

Importing subprocess (selectors, threading's helpers, its C module) cost 12.7 ms of CPU on every node at every start
(`python -S -c 'import subprocess'`: 21.3 ms against 8.6), a third of what the agent spends; 256 nodes pay it at
once. `os.posix_spawn` (Python 3.8+) does what the start needs: Popen's own behaviour is kept where it matters,
namely PATH from the child's environment, a new session, stdin from /dev/null, stdout and stderr into the log,
SIGPIPE and SIGXFSZ back to their defaults (Python ignores them; a job's shell pipeline must not inherit that), and
no descriptor of the agent left open in the child. Where posix_spawn cannot (no setsid on an old C library, another
system), subprocess.Popen starts it as before.
"""

import os
import signal
import threading


def which(name, path):
    """The file that runs as `name` with this PATH (a name with a slash is itself), or None: shutil.which's
    answer, without shutil's imports (bz2, lzma: 8.5 ms of CPU here)."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) and not os.path.isdir(name) else None
    for folder in (path if path is not None else os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or os.curdir, name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def exit_code(status):
    """A wait status as Popen's returncode: the exit code, or minus the signal that ended the process."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class Child:
    """A started process with Popen's `pid`, `returncode`, `wait()` and `poll()`: one thread may wait while another
    polls (a poll during the wait answers None, as Popen's does)."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None
        self._lock = threading.Lock()

    def poll(self):
        if self.returncode is None and self._lock.acquire(False):
            try:
                if self.returncode is None:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                    if pid:
                        self.returncode = exit_code(status)
            except ChildProcessError:
                self.returncode = 0  # reaped elsewhere: Popen answers the same
            finally:
                self._lock.release()
        return self.returncode

    def wait(self):
        with self._lock:
            if self.returncode is None:
                try:
                    self.returncode = exit_code(os.waitpid(self.pid, 0)[1])
                except ChildProcessError:
                    self.returncode = 0
        return self.returncode


def start(argv, cwd, env, out_fd):
    """Start `argv` in `cwd` with `env`, in a session of its own, its output into `out_fd`; a `Child`, or Popen's
    object where posix_spawn is missing. Raises OSError as Popen does (a missing program, a missing folder)."""
    spawn = getattr(os, "posix_spawn", None)
    if spawn is not None:
        # No chdir action before Python 3.14: this process moves to the run's folder first (it is the run's supervisor
        # from here on, and every path it uses is absolute), so that a relative program or PATH entry means what it
        # means to Popen, whose child moves before it looks.
        os.chdir(cwd)
        program = which(argv[0], env.get("PATH"))
        if program is None:
            raise FileNotFoundError(2, os.strerror(2), argv[0])
        actions = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, out_fd, 1),
            (os.POSIX_SPAWN_DUP2, out_fd, 2),
        ]
        try:
            return spawn_in_session(program, argv, env, actions)
        except NotImplementedError:
            pass  # no POSIX_SPAWN_SETSID in this C library
    import subprocess

    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=out_fd,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def spawn_in_session(program, argv, env, actions):
    """posix_spawn `program` in a session of its own, SIGPIPE and SIGXFSZ at their defaults, holding no descriptor
    of this process but what `actions` give it; a `Child`. Raises NotImplementedError without POSIX_SPAWN_SETSID."""
    for fd in open_descriptors():  # the events' fd 3 and any a wrapper passed: never the run's to hold
        try:
            os.set_inheritable(fd, False)
        except OSError:
            pass  # the listing's own, closed by now
    return Child(
        os.posix_spawn(
            program, argv, env, file_actions=actions, setsid=True, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ)
        )
    )


def open_descriptors():
    """This process's descriptors above stderr."""
    try:
        return [int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2]
    except OSError:
        return []
