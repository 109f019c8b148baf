"""NCCL's flight recorder for a run's workers (stdlib only, Python 3.8+): the environment that turns it on, the
debug-info pipes that make it dump on request, and the dumps that travel back.

On a node with a GPU the agent points the recorder into the run directory's `nccl/` folder, under the current names
(TORCH_FR_*) and, for a torch older than FR_NAMES_ONLY_SINCE, the deprecated ones (TORCH_NCCL_*) too; a user who
set any of them runs the recorder their way and gets nothing of ours. torch dumps by itself when NCCL's watchdog
times out. When the launcher finds a hang first, it asks (`ask_dumps`): each rank's process group made a FIFO
`<pipe prefix><rank>.pipe`, which torch's monitor thread reads about once a second, and it dumps `<dump
prefix><rank>` when something was written.
"""

import os
import stat
import time

from launcher.node.common.bounds import FR_NAMES_ONLY_SINCE
from launcher.node.common.child import which
from launcher.node.wire import NCCL_PREFIX, timing

NCCL_DIR = "nccl"
PIPE_PREFIX, PIPE_SUFFIX = "pipe_rank_", ".pipe"
"""torch makes <prefix><rank>.pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE), a FIFO it reads for dump requests."""
DUMP_NAMES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
PIPE_NAMES = ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DEBUG_INFO_PIPE_FILE")
USER_NAMES = (
    "TORCH_FR_BUFFER_SIZE",
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    *DUMP_NAMES,
    *PIPE_NAMES,
)
"""Any of these in the workers' environment: the user set the recorder up, and nothing of it is set for them."""
DEPRECATED_NAMES = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
"""The names torch 2.11 warns of (`use TORCH_FR_BUFFER_SIZE instead`), once a rank each; the pipe's and
TORCH_NCCL_DUMP_ON_TIMEOUT it reads without a word."""


def has_gpu():
    """Whether this node has an NVIDIA GPU (its driver's device, or nvidia-smi)."""
    if os.path.exists("/dev/nvidiactl"):
        return True
    return which("nvidia-smi", os.environ.get("PATH")) is not None


def flight_recorder_env(run_dir, env, settings, gpu, torch_version=None, make=True):
    """Turn NCCL's flight recorder on for the run's workers, dumping into the run directory on a timeout or when
    asked through its pipe; only on a node with GPUs, and never when the user set any of its variables. Whether it
    did. `torch_version` ("2.11.0+cu130", None: unknown) decides whether the deprecated names are set too; with `make`
    false the folder is not made (the environment only)."""
    if not gpu or any(name in env for name in tuple(settings) + USER_NAMES):
        return False
    folder = os.path.join(run_dir, NCCL_DIR)
    if make:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    env.update(settings)
    for name in DUMP_NAMES:
        env[name] = os.path.join(folder, NCCL_PREFIX)
    for name in PIPE_NAMES:
        env[name] = os.path.join(folder, PIPE_PREFIX)
    if _release(torch_version) >= FR_NAMES_ONLY_SINCE:
        for name in DEPRECATED_NAMES:
            env.pop(name, None)
    return True


def _release(version):
    """(major, minor) of a torch version string; (0, 0) when there is none or it reads otherwise."""
    parts = (version or "").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


def _stamp(path):
    """(mtime in ns, size) of a regular file; None when there is none."""
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return (found.st_mtime_ns, found.st_size) if stat.S_ISREG(found.st_mode) else None


def _poke(path):
    """Write one byte to a FIFO without ever blocking: False when it is no FIFO or nobody reads it (ENXIO: the rank
    that made it is gone)."""
    try:
        if not stat.S_ISFIFO(os.lstat(path).st_mode):
            return False
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.write(fd, b"1")
        return True
    except OSError:  # full (EAGAIN): a request is already waiting there
        return False
    finally:
        os.close(fd)


def ask_dumps(run_dir, wait_s):
    """Ask torch for a dump through each rank's debug-info pipe in the run directory, then wait up to `wait_s` for
    the dumps to be written (new, and no longer growing). The ranks asked."""
    folder = os.path.join(run_dir, NCCL_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    asked = {}
    for name in names:
        rank = name[len(PIPE_PREFIX) : -len(PIPE_SUFFIX)]
        if name.startswith(PIPE_PREFIX) and name.endswith(PIPE_SUFFIX) and rank.isdigit():
            dump = os.path.join(folder, NCCL_PREFIX + rank)
            before = _stamp(dump)  # before the request: the dump may come before the write returns
            if _poke(os.path.join(folder, name)):
                asked[int(rank)] = (dump, before)
    seen = {rank: before for rank, (_, before) in asked.items()}
    done = set()
    deadline = time.monotonic() + wait_s
    while len(done) < len(asked) and time.monotonic() < deadline:
        time.sleep(timing("poll_s"))
        for rank, (dump, before) in asked.items():
            now = _stamp(dump)
            if now is not None and now != before and now == seen[rank]:
                done.add(rank)
            seen[rank] = now
    return sorted(asked)


def nccl_dumps(run_dir, max_bytes, sent=None):
    """The flight recorder's dumps in the run directory, {name: base64 text}, up to `max_bytes` in all. `sent`
    ({name: stamp}, updated): leave out a dump already sent as it is now (a new dump of a rank is sent again)."""
    folder, found, total = os.path.join(run_dir, NCCL_DIR), {}, 0
    if not os.path.isdir(folder):
        return found  # no GPU, or no dump: base64 is not imported at every run's end
    import base64

    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        stamp = _stamp(path)  # a regular file only: reading a pipe would wait
        if not name.startswith(NCCL_PREFIX) or stamp is None or total + stamp[1] > max_bytes:
            continue
        if sent is not None and sent.get(name) == stamp:
            continue
        with open(path, "rb") as handle:
            found[name] = base64.b64encode(handle.read()).decode("ascii")
        total += stamp[1]
        if sent is not None:
            sent[name] = stamp
    return found
