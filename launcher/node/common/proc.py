"""This user's processes as /proc shows them (stdlib only, Python 3.8+): a pid and its start time name one
process for good; a run's processes are the ones whose environment carries its mark (never found by name).

Where they are looked for: below the run's supervisor when it is their reaper (`become_reaper`: every orphan of the run
stays below it, so the tree holds the whole run, a handful of processes), else in one pass over /proc (every process
of this user; where many nodes share one process table, as the sandbox's 256 do, a pass read ~1,300 environments,
21 ms, on every node at every run's end)."""

import os
import select
import signal

from launcher.node.common.bounds import PR_SET_CHILD_SUBREAPER, TREE_READS
from launcher.node.loader import node_path
from launcher.node.wire import RUN_ID_ENV, RUNS_ROOT


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def start_time(pid):
    """When the process started (clock ticks after boot, /proc/<pid>/stat field 22), or None when there is none.

    With the pid it names one process for good: a pid reused by a later process comes with a later start time.
    """
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])  # field 22; fields 1-2 are before the ")"
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid, start):
    """Whether `pid` is still the process that started at `start`, and runs as this agent's user."""
    try:
        if os.stat("/proc/%d" % pid).st_uid != os.geteuid():
            return False
    except OSError:
        return False
    return start is not None and start_time(pid) == start


def is_marked(pid, start, mark):
    """Whether `pid` is still the process that started at `start`, this user's, and carries the run's mark."""
    if not same_process(pid, start):
        return False
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = f.read()
    except OSError:
        return False
    needle = ("\0%s=%s\0" % (RUN_ID_ENV, mark)).encode()
    # The start time again: the environment just read was that process's, not a successor's on a reused pid.
    return needle in b"\0" + env and start_time(pid) == start


def environments(pids, uid=None):
    """(pid, environment) of each of `pids` that is still there, the environment with a NUL in front (so a `\0NAME=`
    needle finds the first variable too); with `uid`, only that user's (one stat a process: another user's ends
    there, before its environment is read)."""
    for pid in pids:
        try:
            if uid is not None and os.stat("/proc/%d" % pid).st_uid != uid:
                continue
            with open("/proc/%d/environ" % pid, "rb") as f:
                yield pid, b"\0" + f.read()
        except OSError:
            continue


def own_environments():
    """`environments` of each of this user's processes but this one: one pass over /proc."""
    me = os.getpid()
    return environments((int(e) for e in os.listdir("/proc") if e.isdigit() and int(e) != me), os.geteuid())


def become_reaper():
    """Make this process the reaper of every orphan below it (prctl PR_SET_CHILD_SUBREAPER, Linux 3.4+): a worker's
    child whose parent died, or a daemon that double-forked, stays below it instead of going to init. True when
    set; False where ctypes or the call is missing (the run's processes are then looked for in a pass over /proc)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):
        return False


def children_listed():
    """Whether this kernel lists a task's children (/proc/<pid>/task/<tid>/children, CONFIG_PROC_CHILDREN)."""
    return os.path.exists("/proc/self/task/%d/children" % os.getpid())


def own_zombies(pid):
    """The children of `pid` that have ended and wait to be reaped (state Z)."""
    return [kid for kid in task_children(pid) or () if not alive(kid) and os.path.exists("/proc/%d" % kid)]


def task_children(pid):
    """The pids the kernel lists as children of each of `pid`'s tasks; None when `pid` is gone."""
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return None
    kids = []
    for tid in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, tid)) as f:
                kids += [int(k) for k in f.read().split()]
        except (OSError, ValueError):
            continue
    return kids


def descendants(pid):
    """The pids below `pid` (zombies too: the reaper does not wait for orphans), read from the kernel's lists of
    each task's children."""
    below, todo = [], [pid]
    while todo:
        kids = task_children(todo.pop())
        if kids is None:
            continue  # gone meanwhile: its children moved up to the reaper
        below += kids
        todo += kids
    return below


def run_tree(mark):
    """The pids below the run's reaper (its supervisor, `become_reaper`), or None when it has none alive to read (no
    reaper record, the supervisor killed, a kernel without children lists): then only a pass over /proc finds them."""
    try:
        with open(os.path.join(node_path(RUNS_ROOT), mark, "reaper")) as f:
            pid, start = (int(w) for w in f.read().split())
    except (OSError, ValueError):
        return None
    if not children_listed():
        return None
    seen = None
    for _ in range(TREE_READS):
        # A reaper killed a moment ago (a stop that kills a silent supervisor) is a zombie whose orphans have moved up
        # already: an empty tree then would be "nothing left", and a torchrun would outlive its stop.
        if not (same_process(pid, start) and alive(pid)):
            return None
        below = sorted(descendants(pid))
        if below == seen:
            return below if alive(pid) else None
        seen = below
    return seen if alive(pid) else None


def marked_processes(mark):
    """This user's live processes that carry the run's mark, as {pid: start time}: below the run's reaper when it
    has one alive, else from a pass over /proc. Only a marked one is pinned by its start time and checked again
    (`is_marked`)."""
    needle = ("\0%s=%s\0" % (RUN_ID_ENV, mark)).encode()
    found = {}
    tree = run_tree(mark)
    for pid, env in own_environments() if tree is None else environments(tree):
        if needle in env:
            start = start_time(pid)
            if start is not None and is_marked(pid, start, mark):
                found[pid] = start
    return found


def marked_pids(mark):
    """Pids of this user's live processes whose environment carries the run's mark (zombies have none)."""
    return list(marked_processes(mark))


def signal_process(pid, start, sig):
    """Send `sig` to `pid` only if it is still the process seen (same start time and user); True when sent.

    With a pidfd (Python 3.9+ on Linux 5.3+) the check and the signal reach the same process for certain; without
    one, the pid would have to die and be reused between two system calls.
    """
    pidfd = None
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal"):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:
            pidfd = None  # no pidfds on this kernel (or a sandbox forbids them): the check alone
    try:
        if not same_process(pid, start):
            return False
        if pidfd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(pidfd, sig)
        return True
    except OSError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def environ_of(pid):
    """A process's environment as {name: value} (bytes), or {} when it cannot be read."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(w.partition(b"=")[::2] for w in entries if w)


def run_of(pid):
    """The launcher run a process belongs to (its mark, `<run>/<node>`), where this user may read its environment."""
    mark = environ_of(pid).get(RUN_ID_ENV.encode())
    return mark.decode("utf-8", "replace") if mark else None


def live_marks():
    """{run mark: how many of this user's live processes carry it} (a Counter: 0 for any other): one pass over /proc
    for every run listed."""
    from collections import Counter

    needle = ("\0%s=" % RUN_ID_ENV).encode()
    marks = Counter()
    for _, env in own_environments():
        at = env.find(needle)
        if at >= 0:
            marks[env[at + len(needle) : env.find(b"\0", at + 1)].decode("utf-8", "replace")] += 1
    return marks


def stdout_gone():
    """Whether nobody reads stdout anymore (a pipe or socket whose other end closed), found without writing."""
    try:
        poller = select.poll()
        poller.register(1, 0)  # no events asked for: only POLLERR / POLLHUP can come back
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def parent_of(pid):
    """The parent's pid (/proc/<pid>/stat field 4), or None when the process is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def rank_processes(mark, marked=None):
    """The run's live processes on this node that carry a RANK, told apart: (ranks, helpers).

    ranks: [(pid, start time, rank, local rank, restart count or None)] by rank, each rank's own process: the topmost
    of its RANK (its parent, torchrun's agent, has none). helpers: [(pid, start time, rank, parent pid, owner pid)],
    the processes below a rank's own that inherited its RANK (DataLoader workers, forked or spawned; torch.compile's
    workers), `owner` the rank's own process. torchrun itself has no RANK. `marked`: the run's processes as a pass
    over /proc just found them (`marked_processes`), else one is made."""
    found = {}
    for pid, start in (marked_processes(mark) if marked is None else marked).items():
        env = environ_of(pid)
        try:
            rank, local_rank = int(env[b"RANK"]), int(env[b"LOCAL_RANK"])
        except (KeyError, ValueError):
            continue
        restart = env.get(b"TORCHELASTIC_RESTART_COUNT", b"")
        found[pid] = (start, rank, local_rank, int(restart) if restart.isdigit() else None, parent_of(pid))
    ranks, helpers = [], []
    for pid, (start, rank, local_rank, restart, parent) in found.items():
        owner, above = None, parent
        for _ in range(len(found)):  # up the chain while the processes above carry the same RANK
            if above not in found or found[above][1] != rank:
                break
            owner, above = above, found[above][4]
        if owner is None:
            ranks.append((pid, start, rank, local_rank, restart))
        else:
            helpers.append((pid, start, rank, parent, owner))
    return sorted(ranks, key=lambda w: w[2]), sorted(helpers, key=lambda h: (h[2], h[0]))


def workers(mark, marked=None):
    """The run's live ranks on this node, each by its own process: [(pid, start time, rank, local rank, restart
    count or None)] (`rank_processes` without the helpers)."""
    return rank_processes(mark, marked)[0]
