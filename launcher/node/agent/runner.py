"""torchrun on a node (stdlib only, Python 3.8+): its environment, its start under setsid with everything recorded,
its end (exit code, sweep), and stopping a run by its recorded leader and its mark."""

import json
import os
import signal
import time

from launcher.node.agent import trace
from launcher.node.agent.rundir import (
    leader_of,
    live_leader,
    node_path,
    record,
    record_leader,
    record_stop,
    write_atomic,
)
from launcher.node.agent.storewait import waiting_argv
from launcher.node.common import bounds, child
from launcher.node.common.devices import VISIBLE, chosen
from launcher.node.common.proc import become_reaper, is_marked, marked_processes, signal_process, start_time
from launcher.node.wire import DEVICE_ORDER, RUN_ID_ENV, Event, close_events_fd, emit, socket_values, timing


def unset_match(name, patterns):
    """Whether `name` is one of `patterns`: an exact name, or a glob ending in `*` (TORCHELASTIC_*)."""
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)


def socket_ifname(request):
    """(interface or None, None) for NCCL/GLOO_SOCKET_IFNAME; (None, why) when `auto` finds no interface. netif (and
    socket: 2 ms of imports) only for `auto`."""
    if request["socket_ifname"] != "auto":
        return request["socket_ifname"], None
    from launcher.node.common.netif import route_iface

    return route_iface(request["master_addr"], request["master_port"])


def socket_env(ifname):
    """NCCL_SOCKET_IFNAME (`=eth0`, that interface only) and GLOO_SOCKET_IFNAME (`eth0`) for an interface name
    (nothing for None)."""
    return {} if ifname is None else socket_values(ifname)


def choose_gpus(request, inherited):
    """`--include host:0,2`'s GPUs (the request's `gpus`) as CUDA_VISIBLE_DEVICES, mapped through the value the node
    already gives (the inventory's env, else its login and setup): kept in the request as `visible_devices` for
    torchrun's environment. None, or why the node cannot give them (it shows fewer GPUs)."""
    if request.get("gpus") is None:
        return None
    own = request["env"].get(VISIBLE, inherited.get(VISIBLE))
    request["visible_devices"], problem = chosen(own, request["gpus"])
    return problem


def torchrun_env(request, inherited):
    """torchrun's environment: the login environment less every name `unset_env` matches (a stale RANK or
    MASTER_ADDR from a .bashrc), then the socket interface, then the request's env, which wins; the GPUs that
    `--include` chose (`choose_gpus`); CUDA_DEVICE_ORDER=PCI_BUS_ID where nothing set an order."""
    env = {k: v for k, v in inherited.items() if not unset_match(k, request["unset_env"])}
    env.update(socket_env(request["socket_ifname"]))
    env.update(request["env"])
    visible = request.get("visible_devices")
    if visible is not None:
        env[VISIBLE] = visible
    env.setdefault(*DEVICE_ORDER)
    env.update(request["launcher_env"])  # after the unset: TORCHELASTIC_* names only the launcher may set
    env[RUN_ID_ENV] = request["mark"]
    # Workers write to files (torchrun --redirects): unbuffered, their lines reach the log (and the launcher) as
    # they are printed, not in 8 KiB blocks.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_env(request, run_dir, make=True):
    """torchrun's whole environment for this run: `torchrun_env`, the workers' hook and (on a GPU node) NCCL's
    flight recorder, all pointing into the run directory; `make` also writes what they point at there."""
    from launcher.node.agent.recorder import USER_NAMES, flight_recorder_env, has_gpu
    from launcher.node.agent.stackdump import install_hook

    # In a container the image's environment is the base (the host's login environment stays outside).
    env = torchrun_env(request, {} if request.get("container") else os.environ)
    collectives = request.get("collectives")
    # every worker's stack on request, without ptrace, and its collectives (launcher/node/agent/stackdump.py)
    install_hook(run_dir, env, make, collectives)
    if has_gpu():  # torch's version (its metadata, no import) says which names of the recorder's it reads
        from launcher.node.probe.facts import torch_info

        flight_recorder_env(run_dir, env, request["flight_recorder"], True, torch_info()["version"], make)
    elif collectives and not any(name in env for name in USER_NAMES):
        env["TORCH_FR_BUFFER_SIZE"] = str(collectives["buffer"])  # gloo's recorder (torch 2.7+), its size bounded
    return env


def planned_argv(request):
    """torchrun's words on this node: `~` expanded where the plan says, behind the store wait on nodes 1+."""
    argv = [node_path(w) if i in request.get("expand_home", []) else w for i, w in enumerate(request["argv"])]
    return argv, waiting_argv(argv, request, timing("store_wait_s"), timing("store_poll_s"))


def prestart(request, run_dir):
    """torchrun's python started now, importing torch while the node waits for `go` (launcher/node/agent/prestart.py);
    None where it cannot be (spawn then starts torchrun as it would without)."""
    planned, env = planned_argv(request)[1], run_env(request, run_dir, False)
    if request.get("container"):
        from launcher.node.agent import container

        return container.hold(request, planned, env)
    from launcher.node.agent.prestart import hold

    return hold(planned, node_path(request["workdir"]), env)


def spawn(request, run_dir, held=None):
    """Start torchrun in its own session (or let go the one `prestart` held); its output goes to the run's log."""
    from launcher.node.agent.logmerge import LogMerger

    os.makedirs(run_dir, mode=0o700)
    argv, started = planned_argv(request)
    _write_command(request, run_dir, argv)
    write_atomic(os.path.join(run_dir, "started_at"), repr(time.time()))
    if request.get("script") and not request.get("container"):  # the text its ranks run, for their stacks' lines
        from launcher.node.agent.stackdump import keep_script

        keep_script(run_dir, node_path(request["workdir"]), request["script"])
    env = run_env(request, run_dir)
    # torchrun's own lines go to a file of their own, its workers' to theirs (--redirects); the merger makes `log`.
    merger = LogMerger(run_dir, request["mark"], request["log_tail"])
    own = open(merger.own, "ab")
    try:
        if request.get("container"):
            # The runtime's children, not ours (a stop finds them by a pass over /proc); and never their reaper: the
            # runtime's monitor (conmon) would end as this process's zombie, which its client waits to see gone.
            from launcher.node.agent import container

            reaper, proc = False, container.start(request, run_dir, started, env, merger.own, held)
        else:
            reaper = become_reaper()  # the run's orphans stay below this process: a stop reads its tree, not /proc
            proc = held.release(started, env, merger.own) if held is not None else None
        if proc is None:
            proc = child.start(started, node_path(request["workdir"]), env, own.fileno())
    except BaseException:
        os.close(merger.out)
        raise
    finally:
        own.close()
    proc.merger = merger.start()  # `finish` drains it before the exit code is recorded
    proc.series = _series(request, run_dir)  # the run's page's numbers, sampled until `finish`
    try:
        if not request.get("container"):  # a container's torchrun records itself from inside (its pid is no child)
            write_atomic(os.path.join(run_dir, "pgid"), str(proc.pid))
            record_leader(run_dir, proc.pid)
        # The supervisor is this process (the attached agent or the detached daemon): it records the exit code.
        supervisor = "%d %d" % (os.getpid(), start_time(os.getpid()))
        write_atomic(os.path.join(run_dir, "supervisor"), supervisor)
        if reaper:
            write_atomic(os.path.join(run_dir, "reaper"), supervisor)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)  # unrecorded, it would be a run nobody can stop: it never started
        proc.wait()
        merger.close()
        raise
    return proc


def _write_command(request, run_dir, argv):
    """command.json: what the run runs, as `status` and `logs` say it (no secret's value)."""
    public = {k: v for k, v in request["env"].items() if k not in request.get("secret_names", [])}
    write_atomic(
        os.path.join(run_dir, "command.json"),
        json.dumps(
            {
                "argv": argv,
                "workdir": request["workdir"],
                "env": dict(socket_env(request["socket_ifname"]), **public),
                "visible_devices": request.get("visible_devices"),
                "unset_env": request["unset_env"],
                "secret_env": sorted(request.get("secret_names", [])),
                "node_rank": request.get("node_rank"),
                "nodes": request.get("nodes"),
                "inventory": request.get("inventory"),
                "image": (request.get("container") or {}).get("image"),
            },
            indent=1,
        ),
    )


def _series(request, run_dir):
    """The run's time series on this node (launcher/node/agent/series.py); None when it cannot be started."""
    try:
        from launcher.node.agent.series import start_series

        return start_series(request, run_dir)
    except Exception:
        return None  # the page loses its timeline, the run nothing


def finish(proc, run_dir, mark, grace):
    """Wait for torchrun, sweep what it left, record its exit code (128+N for a signal, like a shell).

    Whatever ended torchrun (its workers, a KILL, a stop), every process still carrying the run's mark is stopped
    (TERM, grace, KILL) before the exit is recorded: a killed torchrun leaves no worker holding a GPU.
    """
    code = proc.wait()
    # A container's client that ended by itself with the container's code removed it (--rm): nothing to list.
    removed = code >= 0 and code != bounds.RUNTIME_FAILED
    code = 128 - code if code < 0 else code
    series = getattr(proc, "series", None)
    if series is not None:
        series.close()
    _, left = sweep_run(run_dir, mark, grace, containers=not removed)
    proc.merger.close()  # every line in `log` before the exit code says the log is complete
    record(os.path.join(run_dir, "exit_code"), str(code))
    record(os.path.join(run_dir, "ended_at"), repr(time.time()))
    return code, left


def start_detached(request, run_dir):
    """Double fork: a daemon in its own session keeps the run and records its end; we return at once."""
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:
        os.close(read_fd)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        close_events_fd()  # the supervisor outlives the session: holding its stderr would keep the launch waiting
        try:
            proc = spawn(request, run_dir)
            os.write(write_fd, ("%d\n" % proc.pid).encode())
            os.close(write_fd)
            trace.to(run_dir)
            trace.note("torchrun started: pid %d; the run's supervisor is this detached process", proc.pid)
            watcher = None
            if request.get("on_nonfinite") == "stop":  # no launcher follows it: its nodes stop a NaN run themselves
                from launcher.node.agent.nonfinite import watch

                stop = lambda why: stop_run(run_dir, request["mark"], request["grace"], why=why)  # noqa: E731
                watcher = watch(run_dir, request, proc, stop)
            code, left = finish(proc, run_dir, request["mark"], request["grace"])
            if watcher is not None:  # its stop (if it stopped the run) writes how it went: whole before we exit
                watcher.join(request["grace"] + bounds.NONFINITE_STOP_MARGIN_S)
            trace.note("torchrun ended: exit code %s, %d process(es) left", code, left)
        except BaseException as exc:
            try:
                os.write(write_fd, ("error %s\n" % exc).encode())
            except OSError:
                pass
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        answer = pipe.readline().strip()
    if not answer or answer.startswith("error"):
        emit(Event.ERROR, message="cannot start torchrun: %s" % (answer[6:] or "the supervisor died"))
        return 2
    emit(Event.STARTED, pid=int(answer), run_dir=run_dir, detached=True)
    return 0


def signal_run(run_dir, mark, sig, targets=None):
    """Send `sig` to the run's process group (while its leader is the run's) and to every process carrying its
    mark (`targets` when given, else a pass over /proc), each re-checked right before; returns how many marked
    processes got it."""
    targets = marked_processes(mark) if targets is None else targets
    leader = live_leader(run_dir, mark)
    reached = set()
    if leader is not None:
        try:
            os.killpg(leader, sig)
            # Not twice: torchrun's handler logs its first TERM ("Received 15 death signal"), and a second one
            # raised again inside that log call, before its line was out (seen under load).
            reached = {pid for pid in targets if _group_of(pid) == leader}
        except OSError:
            pass
    return len(reached) + sum(
        1 for pid, start in targets.items() if pid not in reached and signal_process(pid, start, sig)
    )


def _group_of(pid):
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def still_marked(targets, mark):
    """Those of `targets` ({pid: start time}) that are still the same marked processes: what a stop waits for,
    read from their own /proc entries and not from a pass over every process of the node."""
    return {pid: start for pid, start in targets.items() if is_marked(pid, start, mark)}


CONTAINER_RECORD = "container.json"
"""Where a run in a container keeps its container's name and client (launcher/node/agent/container.py's RECORD)."""
STOP_OUTCOME = "stop.json"
"""How a stop ended the run's processes (`stop_run`): when it began (wall), its grace, the seconds until nothing but
torchrun was left (`term_s`, null past the grace), whether torchrun was then killed alone (`alone`), how many were
still there at the grace's end and killed (`killed`), and why where no user asked for it (`why`). `report` carries it
to the run's page."""


def stop_run(run_dir, mark, grace, record=True, containers=True, why=None):
    """TERM, wait up to `grace` seconds, KILL what is left; returns (processes found, processes left). A run in a
    container: then its client ended if it still lives (one that pulls the image) and its container removed
    (`containers`: unless its client removed it already). `why`: a stop no user asked for (the node's own, for a
    non-finite loss), kept in its record."""
    found, left = _stop_processes(run_dir, mark, grace, record, why)
    if containers and os.path.exists(os.path.join(run_dir, CONTAINER_RECORD)):
        from launcher.node.agent.container import remove_run_containers

        pulling = remove_run_containers(run_dir, mark, patience=bounds.CONTAINER_CLIENT_S if found else 0.0)
        if pulling and record:
            record_stop(run_dir)
    return found, left


def _stop_processes(run_dir, mark, grace, record, why=None):
    """TERM, wait up to `grace` seconds, KILL what is left; returns (processes found, processes left).

    One pass over /proc finds the run's processes; the waits look at those alone (a pass a poll made every node's
    stop read every process of the node 20 times a second); a last pass finds any the run started meanwhile.
    `record`: note the stop in the run directory (status then says `stopped`) when there was something to stop, and
    how it went (STOP_OUTCOME).
    """
    targets = marked_processes(mark)
    if not targets:  # the common sweep: nothing of the run is left, and nothing is left to start anything
        return 0, 0
    if record:  # before the signal: the run's own supervisor, seeing torchrun end, reads who stopped it
        record_stop(run_dir, why)
    began, t0 = time.time(), time.monotonic()
    found = signal_run(run_dir, mark, signal.SIGTERM, targets)
    leader = leader_of(run_dir)
    leader_pid = {leader[0]} if leader else set()
    deadline = t0 + grace
    term_s, alone, alone_since = None, False, None
    while True:
        targets = still_marked(targets, mark)
        if not targets or time.monotonic() >= deadline:
            break
        if set(targets) <= leader_pid:
            # Only torchrun is left and its workers are gone: its own shutdown (a second or more of Python) has
            # nothing left to save, so do not make the user wait for it, once its own lines are out.
            alone_since = alone_since or time.monotonic()
            if time.monotonic() - alone_since >= bounds.TORCHRUN_ALONE_S:
                term_s, alone = alone_since - t0, True
                signal_run(run_dir, mark, signal.SIGKILL, targets)
        time.sleep(timing("poll_s"))
    if not targets and term_s is None:
        term_s = time.monotonic() - t0
    targets.update(marked_processes(mark))  # started during the grace (a worker restarted), or missed before
    killed = len(set(targets) - (leader_pid if alone else set()))
    if targets:
        signal_run(run_dir, mark, signal.SIGKILL, targets)
        deadline = time.monotonic() + timing("kill_wait_s")
        while still_marked(targets, mark) and time.monotonic() < deadline:
            time.sleep(timing("poll_s"))
    if record:
        _stop_outcome(
            run_dir,
            {
                "at": round(began, 3),
                "grace": grace,
                "alone": alone,
                "killed": killed,
                "term_s": None if term_s is None else round(term_s, 2),
                **({"why": why} if why else {}),
            },
        )
    return found, len(still_marked(targets, mark))


def _stop_outcome(run_dir, outcome):
    record(os.path.join(run_dir, STOP_OUTCOME), json.dumps(outcome))  # best effort: never in a stop's way


def read_stop(run_dir):
    """How a stop ended the run here (STOP_OUTCOME's dict), or None: no stop, or one from before this record."""
    try:
        with open(os.path.join(run_dir, STOP_OUTCOME)) as handle:
            found = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def sweep_run(run_dir, mark, grace, containers=True):
    """Stop what is left of a run that ended by itself, without marking the run as stopped."""
    return stop_run(run_dir, mark, grace, record=False, containers=containers)
