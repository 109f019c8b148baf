"""The `attach` action (stdlib only, Python 3.8+): a launcher's new session to a run that lives on this node, after its
connection dropped, its laptop slept, or from another terminal (`ddpl attach`).

While the run's supervisor lives, this session hands it its stdin, stdout and events
(launcher/node/agent/launcherconsole.py) and waits until the supervisor lets it go: the supervisor streams the log from
the offset the launcher has, sends the events, and takes the messages. When the supervisor has ended (the run ended
while no launcher was there), the session replays what the launcher missed: the log from its offset and the end the
supervisor kept (`end.json`). When the supervisor died while its processes live, or the run was lost, it says so (exit
code SUPERVISOR_GONE): the launcher then stops what is left."""

import json
import os

from launcher.node.agent.launcherconsole import hand_over, read_record, start_offset, wait_released
from launcher.node.agent.rundir import END_RECORD, find_run_dir, read_text, stop_recorded
from launcher.node.common.proc import marked_pids
from launcher.node.wire import (
    ATTACH_REFUSED,
    EVENT_OUT,
    STOPPED_ELSEWHERE,
    SUPERVISOR_GONE,
    SUPERVISOR_SILENT,
    Event,
    emit,
    timing,
    write_all,
)


def attach(request):
    run_id, run_dir = find_run_dir(request)
    if run_dir is None:
        emit(Event.ERROR, message="no run %s on this node" % (run_id or "at all"))
        return ATTACH_REFUSED
    asked = {key: request.get(key) for key in ("owner", "who", "take_over", "offset")}
    sock, answer = hand_over(run_dir, asked, (0, 1, EVENT_OUT))
    if answer is not None and answer.get("taken"):
        emit(Event.TAKEN, by=answer.get("by"), at=answer.get("at"))
        return 0
    if answer is not None and answer.get("silent"):
        emit(Event.ERROR, message=answer["silent"])
        return SUPERVISOR_SILENT
    if sock is None:
        if read_record(run_dir) is None and read_text(os.path.join(run_dir, "exit_code")) is None:
            emit(
                Event.ERROR,
                message="run %s on this node is detached (or an older launcher's): it has no console "
                "to attach to; status, logs --follow and stop work on it" % run_id,
            )
            return ATTACH_REFUSED
        return replay(request, run_id, run_dir)
    released = wait_released(sock)  # the supervisor writes to this session's pipes until then; this process does not
    if released.get("released") == Event.TAKEN:
        emit(Event.TAKEN, by=released.get("by"), at=released.get("at"))
    return 0


def replay(request, run_id, run_dir):
    """The run ended while no launcher was there: the log from the launcher's offset, then the end as kept."""
    code = read_text(os.path.join(run_dir, "exit_code"))
    if code is None:
        left = len(marked_pids("%s/%s" % (run_id, request["node"])))
        emit(
            Event.ERROR,
            message="the run's supervisor on this node is gone (killed?) while %d of its processes live" % left
            if left
            else "run %s was lost on this node: its supervisor is gone, and no exit code nor any of "
            "its processes is left" % run_id,
        )
        return SUPERVISOR_GONE
    try:
        ended = json.loads(read_text(os.path.join(run_dir, END_RECORD), "{}"))
    except ValueError:
        ended = {}
    if not isinstance(ended, dict) or "code" not in ended:  # a detached supervisor's end, or one the disk refused
        ended = {"code": int(code), "left": 0, "reason": STOPPED_ELSEWHERE if stop_recorded(run_dir) else None}
    log = os.path.join(run_dir, "log")
    offset = start_offset(log, request.get("offset"), request["tail_bytes"])
    emit(Event.ATTACHED, log_bytes=os.path.getsize(log), away_s=None, replay=True, owner_was=None)
    with open(log, "rb") as f:
        f.seek(offset)
        while True:
            chunk = f.read(int(timing("read_chunk")))
            if not chunk or not write_all(1, chunk):
                break
    emit(Event.EXITED, **ended)
    return 0
