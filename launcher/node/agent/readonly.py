"""The agent's read-only actions on a run that lives on this node (status, runs, list, logs, stacks, top, report),
and the check every action's request passes first (`checked`: its names become paths). Python 3.8+, stdlib only."""

import json
import os
import time

from launcher.node.agent import trace
from launcher.node.agent.rundir import find_run_dir, names_problem, read_text, run_state, runs_here
from launcher.node.common import bounds
from launcher.node.common.proc import live_marks, marked_pids, stdout_gone
from launcher.node.wire import Event, emit, reply, timing, write_all


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
            container_started=read_text(os.path.join(run_dir, "container_started")),  # a run in a container
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
