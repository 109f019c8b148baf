"""The node side of a run: a stdlib-only program that the launcher sends over SSH (stdin) to each node.

Nothing is installed on a node. The launcher runs `PYTHON -c BOOTSTRAP`; the bootstrap loads the node package
(launcher/node/loader.py) from the first stdin line, and `main` reads a JSON request from the second. Actions:

- start: with the doctor on, first run the doctor's probe that came in the request and say `probed` with its
  answer (the master also holds master_port open meanwhile, and each node connects to it when the launcher says
  `tcp`, answering `tcp`); check the workdir, python and run directory, say `ready` and wait for `go` (sent once
  every node is ready and the launcher's checks passed: a run starts on all nodes or on none; `abort` or `stop`
  instead ends the agent with nothing made). An attached run's torchrun python starts meanwhile and imports torch,
  held until `go` (launcher/node/agent/prestart.py); then make the run directory and start torchrun under `setsid`
  (one process group; every process of the run also carries DDP_LAUNCHER_RUN=<run id>/<node> in its
  environment); record pid, times and exit code.
  Attached: stream the log to the launcher's session, obey its `stop` lines, and go on when that session ends (a
  dropped connection, a laptop asleep, a killed launcher): a launcher reconnects with `attach`; only when none has sent
  a message for the heartbeat bound does the node stop its part. Detached: a daemon keeps the run; returns at once.
- attach: hand this session to a running attached run's supervisor (or replay the end of one that ended meanwhile).
- stop: TERM the run's process group and every process carrying its mark, a grace period, then KILL; report.
- status: running / exited / stopped / lost, with times.
- logs: print the log, optionally following it until the run ends.
- runs: list this node's run ids.
- report: what the run's page needs from this node (its state, the ranks' start phases, its series, its log's end).
- stacks: every worker's Python stack (launcher/node/agent/stackdump.py); top: the workers as `inv top` shows them, a
  JSON line every interval until the launcher closes stdin (launcher/node/agent/sampler.py).

Protocol (launcher/node/wire.py): stdout carries the run's log bytes (or an action's JSON reply); stderr one
JSON event per line. The parts: runner.py (torchrun's start, end and stop), attached.py (an attached run),
logmerge.py, rundir.py, common/proc.py, common/netif.py. Kept compatible with Python 3.8: it runs under whatever
interpreter the node has.
"""

import json
import os
import signal
import sys
import time

from launcher.node.agent import trace
from launcher.node.agent.rundir import (
    find_run_dir,
    leader_of,
    names_problem,
    read_text,
    run_dir_of,
    run_state,
    runs_here,
)
from launcher.node.agent.runner import choose_gpus, socket_ifname, stop_run

# Each action imports what it alone needs (a start: attached, netif, runner's spawn; stacks: stacks): a node's `stop`
# or `status` session then compiles and imports a third of the node package and half the stdlib it would.
from launcher.node.common import bounds
from launcher.node.common.proc import alive, live_marks, marked_pids, same_process, signal_process, stdout_gone
from launcher.node.wire import AGENT_TIMING, RUNS_ROOT, Event, emit, reply, timing, use_timing, write_all


def checked(action):
    """The action, once the request's run id and node name are ones this agent accepts (they become paths)."""

    def run(request):
        problem = names_problem(request)
        return refuse(problem) if problem else action(request)

    return run


def refuse(message):
    emit(Event.ERROR, message=message)
    return 2


def follow_log(log, run_dir, run_id, mark):
    """Copy the log to stdout as it grows until the run ends, is lost, or the launcher is gone; the exit status."""
    exit_file = os.path.join(run_dir, "exit_code")
    quiet_checks, next_check = 0, time.time()
    while True:
        chunk = log.read(int(timing("read_chunk")))
        if chunk:
            if not write_all(1, chunk):
                return 1  # the launcher is gone: nobody to follow for
            continue
        if os.path.exists(exit_file):
            return 0 if write_all(1, log.read()) else 1
        if time.time() >= next_check:
            next_check = time.time() + timing("check_s")
            if stdout_gone():
                return 1
            # Checks in a row, check_s apart: the supervisor writes the exit code a moment after torchrun is gone.
            quiet_checks = 0 if marked_pids(mark) else quiet_checks + 1
            if quiet_checks >= bounds.LOST_AFTER_CHECKS:
                write_all(1, log.read())
                emit(
                    Event.ERROR,
                    message="run %s was lost on this node: no exit code recorded and none of its "
                    "processes alive (its supervisor was killed); the log ends here" % run_id,
                )
                return 1
        time.sleep(timing("wait_s"))


def start(request):
    import threading

    from launcher.node.agent.attached import LauncherMessages, supervise_run
    from launcher.node.agent.gatechecks import GateChecks
    from launcher.node.agent.runner import prestart, spawn, start_detached

    run_id, _, node = request["mark"].partition("/")
    problem = names_problem({"run_id": run_id or None, "node": node}) or (None if run_id else "the run has no id")
    if problem or request["run_dir"] != "%s/%s/%s" % (RUNS_ROOT, run_id, node):
        return refuse(problem or "the run directory must be %s/<run id>/<node>" % RUNS_ROOT)
    run_dir = run_dir_of(request)
    trace.note(
        "start: run %s on %s, node rank %s, %s; the launcher %s",
        run_id,
        node,
        request.get("node_rank"),
        "detached" if request["detach"] else "attached",
        request.get("who"),
    )
    messages = LauncherMessages(bool(request.get("reattach")))
    section = request.get("gate")  # only with the doctor on
    checks = GateChecks(section) if section else None
    messages.on_tcp = checks.tcp if checks is not None else None
    threading.Thread(target=messages.listen, daemon=True, name="listen").start()
    problem = node_problem(request, run_dir)
    # An attached run's torchrun imports torch while the doctor checks and the other nodes get ready.
    held = prestart(request, run_dir) if problem is None and not request["detach"] else None
    try:
        try:
            if checks is not None:
                checks.run()  # the doctor's evidence first: the launcher judges it even when a check below failed
            code = refuse(problem) if problem else wait_for_go(request, messages)
        finally:
            if checks is not None:
                checks.close()  # master_port is let go before torchrun's store binds it
        if code is not None:
            return code
        if request["detach"]:
            return start_detached(request, run_dir)
        try:
            proc = spawn(request, run_dir, held)
        except OSError as exc:
            emit(Event.ERROR, message="cannot start torchrun: %s" % exc)
            return 2
    finally:
        if held is not None:
            held.drop()  # nothing once torchrun was let go
    emit(Event.STARTED, pid=proc.pid, run_dir=run_dir)
    return supervise_run(request, run_dir, proc, messages)


def node_problem(request, run_dir):
    """What keeps this node from starting the run (its workdir, python, run directory, socket interface, GPUs), or
    None with the request completed (`socket_ifname` found, `visible_devices` chosen)."""
    node = request["mark"].partition("/")[2]
    workdir = os.path.expanduser(request["workdir"])
    if not os.path.isdir(workdir):
        return "workdir %s does not exist on this node" % request["workdir"]
    if request["argv"][0] != os.path.expanduser(request["argv"][0]) or os.sep in request["argv"][0]:
        python = os.path.expanduser(request["argv"][0])
        if not os.access(python, os.X_OK):
            return "python %s is not an executable file on this node" % request["argv"][0]
    if os.path.exists(run_dir):
        return "run directory %s already exists" % request["run_dir"]
    ifname, problem = socket_ifname(request)
    if problem is not None:
        return (
            "%s: socket_ifname auto found no interface toward master_addr %s: %s; name the interface in the "
            "inventory (socket_ifname: eth0)" % (node, request["master_addr"], problem)
        )
    request["socket_ifname"] = ifname  # auto, found once: spawn (here or in the supervisor) sets this
    problem = choose_gpus(request, os.environ)
    if problem is not None:
        return "%s: %s; name GPUs the node shows, or the whole host" % (node, problem)
    return None


def wait_for_go(request, messages):
    """Ready, then nothing until every node is: a run starts on all nodes or on none (no run directory, no
    process). None on `go`, else the agent's exit code."""
    emit(Event.READY)
    if not messages.wait_for_go(request["heartbeat_timeout"], request["alive_interval"]):
        emit(Event.ABORTED, reason=messages.stop_message)
        return 0
    return None


@checked
def action_stop(request):
    grace = request.get("grace")
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        return refuse("a stop request needs its grace period (seconds, a number >= 0); got %r" % (grace,))
    if request.get("choose"):
        # `inv stop` without --run, in this one session: this node's runs first, then the run chosen from every
        # node's (a line on stdin; none when nothing is to be stopped, or the choice failed)
        reply({"runs": listed_runs(request["node"])})
        chosen = json.loads(sys.stdin.readline() or "{}").get("run_id")
        if chosen is None:
            return reply({"run_id": None, "state": "none", "found": 0, "left": 0})
        request = dict(request, run_id=chosen)
    run_id, run_dir = find_run_dir(request)
    if run_dir is None:
        return reply({"run_id": run_id, "state": "none", "found": 0, "left": 0})
    trace.to(run_dir)
    trace.note(
        "stop asked from another session (grace %g s%s)",
        grace,
        ", its silent supervisor killed first" if request.get("kill_supervisor") else "",
    )
    mark = "%s/%s" % (run_id, request["node"])
    taken = taken_from(request, run_dir)
    if taken is not None:  # a launcher that lost the run to another one's `attach` stops nothing of it
        return reply(dict(run_state(run_id, run_dir, request["node"]), taken=taken, found=0, left=0))
    # ("keeper": the file's name before 2026-11-29, in a run started by an older launcher and stopped by this one)
    supervisor = leader_of(run_dir, "supervisor") or leader_of(run_dir, "keeper")
    if request.get("kill_supervisor") and supervisor is not None and same_process(*supervisor):
        # The launcher found this run's agent silent (stopped, stuck): it can neither stop its run nor record it.
        signal_process(supervisor[0], supervisor[1], signal.SIGKILL)
        deadline = time.time() + timing("supervisor_wait_s")
        while alive(supervisor[0]) and same_process(*supervisor) and time.time() < deadline:
            time.sleep(timing("supervisor_poll_s"))  # dead, its orphans below whoever reaps them: found by a /proc pass
    found, left = stop_run(run_dir, mark, grace)
    # The run's supervisor records the exit code a moment after torchrun is gone; a dead supervisor never will.
    deadline = time.time() + timing("supervisor_wait_s")
    while (
        found
        and not os.path.exists(os.path.join(run_dir, "exit_code"))
        and time.time() < deadline
        and supervisor is not None
        and same_process(*supervisor)
        and alive(supervisor[0])
    ):
        time.sleep(timing("supervisor_poll_s"))
    result = run_state(run_id, run_dir, request["node"])
    result.update(found=found, left=left)
    return reply(result)


def taken_from(request, run_dir):
    """Who owns the run now, when a launcher that no longer does asks to stop it (its `owner` is not the run's)."""
    if not request.get("owner"):
        return None
    from launcher.node.agent.launcherconsole import read_record

    record = read_record(run_dir) or {}
    owner = record.get("owner_id")
    return None if owner in (None, request["owner"]) else {"by": record.get("owner"), "at": record.get("owner_since")}


@checked
def action_status(request):
    run_id, run_dir = find_run_dir(request)
    return reply(run_state(run_id, run_dir, request["node"]))


@checked
def action_runs(request):
    return reply({"runs": runs_here(request["node"])[1]})


@checked
def action_list(request):
    """Every run on this node with its state (as `status` says it), the nodes it was started on and the inventory it
    was started from: what `inv stop` and `inv status` choose from, and all `inv status` needs."""
    return reply({"runs": listed_runs(request["node"])})


def listed_runs(node):
    """`list`'s runs: each run's state, nodes and inventory."""
    root, run_ids = runs_here(node)
    marks = live_marks()
    found = []
    for run_id in run_ids:
        run_dir = os.path.join(root, run_id, node)
        try:
            recorded = json.loads(read_text(os.path.join(run_dir, "command.json"), "{}"))
            nodes, inventory = recorded.get("nodes"), recorded.get("inventory")
        except (ValueError, AttributeError):
            nodes = inventory = None
        state = run_state(run_id, run_dir, node, marks["%s/%s" % (run_id, node)])
        found.append(dict(state, nodes=nodes, inventory=inventory))
    return found


@checked
def action_logs(request):
    run_id, run_dir = find_run_dir(request)
    if run_dir is None:
        emit(Event.ERROR, message="no run %s on this node" % (run_id or "at all"))
        return 3
    emit(Event.RUN, run_id=run_id)
    with open(os.path.join(run_dir, "log"), "rb") as log:
        if request.get("follow"):
            return follow_log(log, run_dir, run_id, "%s/%s" % (run_id, request["node"]))
        while True:
            chunk = log.read(int(timing("read_chunk")))
            if not chunk:
                return 0
            if not write_all(1, chunk):
                return 1  # the launcher is gone


@checked
def action_stacks(request):
    """Every worker's stack of the run on this node, without stopping it (`inv stacks`), and NCCL's flight recorder
    asked for its dumps where torch made its pipes (GPU nodes): on a GPU they say what a rank waits on."""
    from launcher.node.agent.recorder import ask_dumps, nccl_dumps
    from launcher.node.agent.stackdump import collect

    run_id, run_dir = find_run_dir(request)
    if run_dir is None:
        return reply({"run_id": run_id, "state": "none", "workers": []})
    mark = "%s/%s" % (run_id, request["node"])
    workers = collect(run_dir, mark, request["stacks_wait_s"])
    if request.get("nccl_dump_wait_s"):
        ask_dumps(run_dir, request["nccl_dump_wait_s"])
    return reply(
        {
            "run_id": run_id,
            "state": run_state(run_id, run_dir, request["node"])["state"],
            "workers": workers,
            "nccl": nccl_dumps(run_dir, request["nccl_max_bytes"]),
        }
    )


@checked
def action_top(request):
    """The run's workers on this node as `inv top` shows them: a JSON line each interval
    (launcher/node/agent/sampler.py)."""
    from launcher.node.agent.sampler import watch

    run_id, run_dir = find_run_dir(request)
    state = run_state(run_id, run_dir, request["node"])["state"]
    if state != "running":
        return reply({"run_id": run_id, "state": state, "running": False})
    mark = "%s/%s" % (run_id, request["node"])

    def line(snapshot):
        snapshot.update(run_id=run_id, node=request["node"])
        return write_all(1, (json.dumps(snapshot) + "\n").encode())

    watch(run_dir, mark, request["top"], line)
    return 0


@checked
def action_report(request):
    """What the run's page needs from this node (launcher.report.page): its state, each rank's start (the hook's
    phases), the series its supervisor sampled, the end of its log, and this node's clock now."""
    from launcher.node.agent.series import read_series
    from launcher.node.worker.hook import PHASES_DIR

    run_id, run_dir = find_run_dir(request)
    if run_dir is None:
        return reply({"run_id": run_id, "state": "none"})
    phases = {}
    folder = os.path.join(run_dir, PHASES_DIR)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        phases[name] = read_text(os.path.join(folder, name), "").splitlines()
    tail = read_tail(os.path.join(run_dir, "log"), int(request["tail_bytes"]))
    agent_trace = read_tail(os.path.join(run_dir, trace.TRACE_FILE), int(request["trace_bytes"]))
    state = run_state(run_id, run_dir, request["node"])
    from launcher.node.agent.runner import read_stop  # how a stop ended its processes: the page says it

    return reply(
        dict(
            state,
            phases=phases,
            series=read_series(run_dir, int(request["series_bytes"])),
            log_tail=tail.decode("utf-8", "replace"),
            node_time=time.time(),
            stop=read_stop(run_dir),
            trace=agent_trace.decode("utf-8", "replace"),
        )
    )


def read_tail(path, size):
    """The last `size` bytes of a file (b"" where there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read()
    except OSError:
        return b""


@checked
def action_attach(request):
    """A launcher's new session to a run that lives here (a dropped connection, `ddpl attach`): node/attach.py."""
    from launcher.node.agent.attach import attach

    return attach(request)


ACTIONS = {
    "start": start,
    "attach": action_attach,
    "stop": action_stop,
    "status": action_status,
    "logs": action_logs,
    "runs": action_runs,
    "list": action_list,
    "stacks": action_stacks,
    "top": action_top,
    "report": action_report,
}


def main():
    request = json.loads(sys.stdin.readline())
    try:
        use_timing(request, AGENT_TIMING)
        code = ACTIONS[request["action"]](request)
    except Exception as exc:
        emit(Event.ERROR, message="%s: %s" % (type(exc).__name__, exc))
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main()
