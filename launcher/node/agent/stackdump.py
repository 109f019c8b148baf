"""Every worker's Python stack, taken from outside the script (stdlib only, Python 3.8+).

No ptrace: a run's workers start with the run directory's `hook/` first on PYTHONPATH, where a `sitecustomize.py`
(launcher/node/worker/hook.py, which also keeps the progress records) registers `faulthandler` on a real-time signal,
writing to `stacks/<pid>.txt` of the run directory (then it runs the node's own sitecustomize, if there is one).
The agent, as the same user, sends that signal to each worker whose file exists (so the hook is in place and the
signal cannot kill it), and reads what each wrote. faulthandler dumps from the signal handler itself, in C: a rank
blocked in a collective answers too. A rank that cannot answer (stopped, in uninterruptible sleep, a zombie) is
reported as what /proc says it is. py-spy, where it is installed and allowed to attach, adds native frames; it is
never the only source. A rank's helpers (DataLoader workers, forked ones too) answer after it.
"""

import os
import signal
import time

from launcher.node.common import bounds
from launcher.node.common.child import which
from launcher.node.common.proc import rank_processes, signal_process, start_time
from launcher.node.wire import timing
from launcher.node.worker import collectives, hook, loss, patches

HOOK_DIR = "hook"
STACKS_DIR = "stacks"
STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in uninterruptible sleep",
    "T": "stopped",
    "t": "stopped by a tracer",
    "Z": "a zombie",
    "X": "dead",
    "I": "idle",
}
SOURCES_DIR = "sources"
SILENT_STATES = ("T", "t", "Z", "X")
"""States in which a process runs no signal handler: asking for its stack would only wait."""


def stack_signal():
    """The signal the hook answers: a real-time one no library claims (SIGUSR2 where there are none)."""
    rtmin = getattr(signal, "SIGRTMIN", None)
    return int(rtmin) + 7 if rtmin is not None else int(signal.SIGUSR2)


def install_hook(run_dir, env, make=True, collecting=None):
    """Write the hook (launcher/node/worker/hook.py: stacks on a signal, progress records;
    launcher/node/worker/patches.py: torch's modules patched as they are imported; launcher/node/worker/collectives.py:
    the collectives' thread) into the run directory and point the workers' environment at it (PYTHONPATH first); with
    `make` false, only the environment (nothing written). `collecting`: the thread's settings (status_s, arrivals_s,
    keep, cost_factor: launcher.limits.COLLECTIVES), None for no thread."""
    folders = [
        os.path.join(run_dir, name)
        for name in (HOOK_DIR, STACKS_DIR, hook.PROGRESS_DIR, hook.COLLECTIVES_DIR, hook.PHASES_DIR)
    ]
    hook_dir, stacks, progress, collected, _ = folders  # phases/: the hook writes there beside progress/
    if make:
        for folder in folders:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        written = (
            (hook, "sitecustomize"),
            (patches, hook.PATCHES_MODULE),
            (collectives, hook.COLLECTIVES_MODULE),
            (loss, hook.LOSS_MODULE),
        )
        for module, name in written:
            with open(os.path.join(hook_dir, name + ".py"), "w") as handle:
                handle.write(module.__loader__.get_source(module.__name__))  # the node's loader and a file's both
    env[hook.STACKS_ENV] = "%s:%d" % (stacks, stack_signal())
    env[hook.PROGRESS_ENV] = "%s:%d:%r:%d" % (progress, bounds.RECORD_BYTES, bounds.RECORD_FLUSH_S, bounds.LOSS_RING)
    if collecting:
        env[hook.COLLECTIVES_ENV] = "%s:%r:%r:%d:%r" % (
            collected,
            float(collecting["status_s"]),
            float(collecting["arrivals_s"]),
            int(collecting["keep"]),
            float(collecting["cost_factor"]),
        )
    env["PYTHONPATH"] = hook_dir + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")


def proc_state(pid):
    """(state letter, kernel wait channel, CPU seconds) of a process from /proc; letter None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / float(ticks)
    except (OSError, IndexError, ValueError):
        return None, None, None
    try:
        with open("/proc/%d/wchan" % pid) as handle:
            wchan = handle.read().strip() or None
    except OSError:
        wchan = None
    return fields[0], (None if wchan == "0" else wchan), cpu


def collect(run_dir, mark, wait_s):
    """Every worker's stack: ask each that can answer, wait up to `wait_s` for all, and say what each is. Each rank's
    own process comes first (with its `collectives`: `_collectives`), then its helpers (DataLoader and compile
    workers: `helper`, `parent`, `owner`)."""
    folder = os.path.join(run_dir, STACKS_DIR)
    asked = {}
    report = []
    ranks, helpers = rank_processes(mark)
    for pid, start, rank, local_rank, _ in ranks:
        report.append(_ask(folder, pid, start, {"rank": rank, "local_rank": local_rank}, asked))
        report[-1]["collectives"] = _collectives(run_dir, pid, start)
        for helper, helper_start, _, parent, owner in helpers:
            if owner == pid:
                report.append(
                    _ask(
                        folder,
                        helper,
                        helper_start,
                        {"rank": rank, "local_rank": local_rank, "helper": True, "parent": parent, "owner": pid},
                        asked,
                    )
                )
    texts = _read_answers(asked, wait_s)
    kept = kept_sources(run_dir)
    for entry in report:
        if entry["pid"] in asked:
            entry["stack"] = texts.get(entry["pid"]) or None
            if entry["stack"] is None:
                state, _, _ = proc_state(entry["pid"])
                entry["why"] = "no answer within %g s (/proc state %s)" % (wait_s, state)
        entry["lines"], unread = source_lines(entry["stack"], started_epoch(entry["pid"]), kept)
        if unread:
            entry["unread"] = unread  # the frames' files changed since the rank started: their lines now are others
        _add_pyspy(entry, wait_s)
    return report


def _collectives(run_dir, pid, start):
    """A rank's process groups as its collectives' thread last read them, and of its arrivals each group's newest
    alone (a look wants where each rank is, and since when: a rank behind is a finding once the others have waited
    a while); None without its file."""
    from launcher.node.agent.records import RankCollectives, read_collectives

    found = RankCollectives().fields(read_collectives(run_dir, pid, start), time.time())
    if found is None:
        return None
    return dict(found, arrivals={group: rows[-1:] for group, rows in (found.get("arrivals") or {}).items() if rows})


def _ask(folder, pid, start, fields, asked):
    """One process's entry; the signal sent when it can answer (`asked`: pid -> its file and its size before)."""
    state, wchan, cpu = proc_state(pid)
    entry = dict(
        fields, pid=pid, state=state, state_name=STATES.get(state, state), wchan=wchan, cpu_s=cpu, stack=None, why=None
    )
    path = os.path.join(folder, "%d.txt" % pid)
    if state in SILENT_STATES:
        entry["why"] = "it is %s (/proc state %s): it cannot answer" % (entry["state_name"], state)
    elif not os.path.exists(path):
        entry["why"] = "it has no stack hook (not a Python process, or its python ignores PYTHONPATH)"
    else:
        before = os.path.getsize(path)  # before the signal: the answer may be written before the call returns
        if signal_process(pid, start, stack_signal()):
            asked[pid] = (path, before)
        else:
            entry["why"] = "it ended before it could be asked"
    return entry


def _read_answers(asked, wait_s):
    """The text each asked worker appended to its file: complete once it has grown and stopped growing."""
    deadline = time.monotonic() + wait_s
    sizes = {pid: before for pid, (_, before) in asked.items()}
    settled = set()
    while len(settled) < len(asked) and time.monotonic() < deadline:
        time.sleep(timing("poll_s"))
        for pid, (path, before) in asked.items():
            size = os.path.getsize(path) if os.path.exists(path) else before
            if size > before and size == sizes[pid]:
                settled.add(pid)
            sizes[pid] = size
    texts = {}
    for pid, (path, before) in asked.items():
        try:
            with open(path, "rb") as handle:
                handle.seek(before)
                texts[pid] = handle.read().decode("utf-8", "replace")
        except OSError:
            continue
    return texts


def keep_script(run_dir, workdir, script):
    """A copy of the job's script in the run directory, taken before its ranks start: a user edits the script while
    it trains, and a frame's line must be read from the text the rank runs (`source_lines`). Never a cost to the run
    (a script that cannot be read, or is over bounds.SOURCE_MAX_BYTES, is not kept)."""
    import json
    import shutil

    path = os.path.realpath(os.path.join(workdir, os.path.expanduser(script)))
    try:
        found = os.stat(path)
        if found.st_size > bounds.SOURCE_MAX_BYTES:
            return
        folder = os.path.join(run_dir, SOURCES_DIR)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        shutil.copyfile(path, os.path.join(folder, "script.py"))
        with open(os.path.join(folder, "index.json"), "w") as handle:
            json.dump({path: {"copy": "script.py", "mtime": found.st_mtime}}, handle)
    except (OSError, ValueError):
        return


def kept_sources(run_dir):
    """{real path: (the copy's path, the file's mtime when it was copied)} of `keep_script`'s copies."""
    import json

    folder = os.path.join(run_dir, SOURCES_DIR)
    try:
        with open(os.path.join(folder, "index.json")) as handle:
            index = json.load(handle)
        return {path: (os.path.join(folder, kept["copy"]), float(kept["mtime"])) for path, kept in index.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def started_epoch(pid):
    """When a process started, in seconds since the epoch, to the clock tick: now, less the seconds since boot
    (/proc/uptime, 10 ms) after its start (/proc/<pid>/stat, in ticks); btime is whole seconds, off by up to one).
    None if it is gone."""
    ticks = start_time(pid)
    try:
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None if ticks is None else time.time() - (uptime - ticks / float(os.sysconf("SC_CLK_TCK")))


def source_lines(stack, started=None, kept=None):
    """({"file:line": the source line} of every frame in a faulthandler dump, read here where the files are;
    {file: why its lines were not read}).

    A file changed after the process `started` (epoch seconds) holds other lines than the ones it runs: its lines
    come from the run's copy of it where one was kept before then (`kept`: `kept_sources`), else none are read."""
    import linecache

    lines, unread, chosen = {}, {}, {}  # chosen: each file's source, looked at once a dump (dozens of its frames)
    for line in (stack or "").splitlines():
        frame = line.strip()
        if not frame.startswith('File "'):
            continue
        path, _, rest = frame[6:].partition('", line ')
        number = rest.split(" ", 1)[0]
        if not number.isdigit() or path in unread:
            continue
        if path not in chosen:
            chosen[path] = _source_of(path, started, kept or {})
            if chosen[path] is not None:
                linecache.checkcache(chosen[path])  # a long-lived agent: the file may have changed since it read it
        read = chosen[path]
        if read is None:
            unread[path] = "changed since the rank started"
            continue
        text = linecache.getline(read, int(number)).strip()
        if text:
            lines["%s:%s" % (path, number)] = text
    return lines, unread


def _source_of(path, started, kept):
    """The file to read a frame's line from: the frame's own, its kept copy, or None (changed, no copy of it)."""
    try:
        changed = started is not None and os.stat(path).st_mtime > started + bounds.MTIME_SLACK_S
    except OSError:
        return path  # gone, or not a file (`<frozen ...>`): linecache says nothing
    if not changed:
        return path
    copy = kept.get(os.path.realpath(path))
    return copy[0] if copy is not None and copy[1] <= started + bounds.MTIME_SLACK_S else None


def pyspy():
    """py-spy from the node's venv (beside this python: a venv's bin is on no PATH unless activated), else PATH."""
    import sys

    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else which("py-spy", os.environ.get("PATH"))


def _add_pyspy(entry, wait_s):
    """py-spy's dump with native frames, where it is installed and may attach (never needed)."""
    exe = pyspy()
    if exe is None or entry["state"] in SILENT_STATES:
        return
    import subprocess  # here: 12.7 ms of imports that every start would pay (launcher/node/common/child.py)

    try:
        done = subprocess.run(
            [exe, "dump", "--pid", str(entry["pid"]), "--native"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=wait_s,
        )
    except (OSError, subprocess.TimeoutExpired):
        return
    if done.returncode == 0:
        entry["pyspy"] = done.stdout.decode("utf-8", "replace")
