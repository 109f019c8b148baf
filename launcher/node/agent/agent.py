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
messages.py (the launcher's messages), readonly.py (the actions that only read: status, runs, list, logs, stacks,
top, report), logmerge.py, rundir.py, common/proc.py, common/netif.py. Kept compatible with Python 3.8: it runs
under whatever interpreter the node has.
"""

import json
import os
import signal
import sys
import time

from launcher.node.agent import trace
from launcher.node.agent.readonly import (
    action_list,
    action_logs,
    action_report,
    action_runs,
    action_stacks,
    action_status,
    action_top,
    checked,
    listed_runs,
    refuse,
)
from launcher.node.agent.rundir import (
    find_run_dir,
    leader_of,
    names_problem,
    record_stopped_by,
    run_dir_of,
    run_state,
)
from launcher.node.agent.runner import choose_gpus, socket_ifname, stop_run

# Each action imports what it alone needs (a start: attached, netif, runner's spawn; stacks: stacks): a node's `stop`
# or `status` session then compiles and imports a third of the node package and half the stdlib it would.
from launcher.node.common import bounds
from launcher.node.common.proc import alive, marked_pids, same_process, signal_process
from launcher.node.wire import AGENT_TIMING, RUNS_ROOT, Event, emit, reply, timing, use_timing


def start(request):
    import threading

    from launcher.node.agent.attached import supervise_run
    from launcher.node.agent.gatechecks import GateChecks
    from launcher.node.agent.messages import LauncherMessages
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
    checks = GateChecks(section, int(request["event_chunk"])) if section else None
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
    container = request.get("container")
    if container is None and (
        request["argv"][0] != os.path.expanduser(request["argv"][0]) or os.sep in request["argv"][0]
    ):
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
    problem = choose_gpus(request, {} if container else os.environ)  # a container's: the image's, not the login's
    if problem is not None:
        return "%s: %s; name GPUs the node shows, or the whole host" % (node, problem)
    return None


def wait_for_go(request, messages):
    """Ready, then nothing until every node is: a run starts on all nodes or on none (no run directory, no
    process). None on `go`, else the agent's exit code."""
    emit(Event.READY)
    bound = request["heartbeat_timeout"]
    if not messages.wait_for_go(bounds.UNHEARD_BEFORE_GO_S if bound is None else bound, request["alive_interval"]):
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
    if marked_pids(mark):
        record_stopped_by(run_dir, request.get("by"))  # `inv stop`'s, the API's: whose
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
