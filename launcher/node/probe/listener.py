"""The doctor's TCP check (stdlib only, Python 3.8+): the master holds master_port and answers every connection
with the doctor's token; every node connects to it and says what it found (and who holds a taken port)."""

import os
import re
import select
import socket
import time

from launcher.node.common import bounds
from launcher.node.common.proc import run_of
from launcher.node.wire import error_text, host_arg, seconds


def tcp_connect(addr, port, token, window, read_s):
    """Connect to addr:port and read the token (waiting `read_s` s for it); retry refusals for `window` s (the
    listener may be starting)."""
    start = time.monotonic()
    deadline = start + window
    attempts = 0
    last = None
    while True:
        attempts += 1
        try:
            left = deadline - time.monotonic()
            sock = socket.create_connection(
                (host_arg(addr), port), timeout=max(bounds.CONNECT_TRY_MIN_S, min(bounds.CONNECT_TRY_MAX_S, left))
            )
        except socket.gaierror as exc:
            return {"ok": False, "error": f"cannot resolve {addr}: {error_text(exc)}", "attempts": attempts}
        except OSError as exc:
            last = exc
            if time.monotonic() >= deadline:
                return {
                    "ok": False,
                    "error": error_text(last),
                    "attempts": attempts,
                    "elapsed": round(time.monotonic() - start, 3),
                }
            time.sleep(bounds.CONNECT_RETRY_S)
            continue
        try:
            peer = sock.getpeername()[0]
            sock.settimeout(read_s)
            data = b""
            try:
                while b"\n" not in data and len(data) < bounds.TOKEN_MAX_BYTES:
                    chunk = sock.recv(bounds.TOKEN_MAX_BYTES)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
        finally:
            sock.close()  # we close first: the TIME_WAIT stays on our side, not on the master's port
        elapsed = round(time.monotonic() - start, 3)
        result = {
            "ok": data.strip().decode(errors="replace") == token,
            "peer": peer,
            "attempts": attempts,
            "elapsed": elapsed,
        }
        if not data:
            result["error"] = (
                f"connected to {addr}:{port} ({peer}), but no answer came in {read_s:g} s: "
                "something else listens there, or the master is overloaded"
            )
        elif not result["ok"]:
            result["error"] = f"something else answers on {addr}:{port} ({peer}): not the doctor's listener"
        return result


def port_holders(port, budget):
    """Who holds TCP `port` here: state and pid/command when /proc shows them, and the launcher run it belongs to
    (best effort, time-boxed)."""
    inodes = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                next(handle, None)
                for line in handle:
                    parts = line.split()
                    if len(parts) > 9 and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        inodes[parts[9]] = "listening" if parts[3] == "0A" else "bound"
        except (OSError, ValueError):
            continue
    holders = []
    deadline = time.monotonic() + budget
    wanted = {f"socket:[{i}]": state for i, state in inodes.items() if i != "0"}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        if not wanted or time.monotonic() > deadline:
            break
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link in wanted:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as handle:
                        cmd = handle.read(bounds.CMDLINE_BYTES).replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    cmd = ""
                holder = {
                    "pid": int(pid),
                    "command": cmd,
                    "state": wanted.pop(link),
                    "run": run_of(int(pid)),
                    "user": owner_of(int(pid)),
                }
                holder.update(run_record(holder["run"]))
                holders.append(holder)
                break
    return {"states": sorted(set(inodes.values())), "holders": holders}


def owner_of(pid):
    """The name of the user a process runs as (its uid where the name is unknown), or None."""
    try:
        uid = os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def run_record(mark):
    """What launcher run `mark` (`<run id>/<node>`) recorded in its folder here: the inventory it was started from,
    as its controller resolved it ({} where it says nothing): whose run holds a port, and how to stop it."""
    import json
    import re

    from launcher.node.loader import node_path
    from launcher.node.wire import RUN_ID_PATTERN, RUNS_ROOT

    run_id, _, node = (mark or "").partition("/")
    if not re.fullmatch(RUN_ID_PATTERN, run_id) or not node or "/" in node or node.startswith("."):
        return {}
    try:
        with open(os.path.join(node_path(RUNS_ROOT), run_id, node, "command.json"), encoding="utf-8") as handle:
            inventory = json.load(handle).get("inventory")
    except (OSError, ValueError, AttributeError):
        return {}
    return {"inventory": inventory} if isinstance(inventory, str) else {}


def open_listener(port):
    """Bind `port` on 0.0.0.0 as torchrun's store binds it; (server, reply), the server None when the port is taken.

    SO_REUSEADDR lets the last run's TIME_WAIT sockets pass, while a socket that still listens on the port (a live
    store, another server) makes the bind fail: the reply then says who holds it.
    """
    reply = {"mode": "listen", "hostname": socket.gethostname(), "port": port}
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen(bounds.LISTEN_BACKLOG)
    except OSError as exc:
        server.close()
        reply.update(free=False, error=error_text(exc), **port_holders(port, bounds.HOLDERS_BUDGET_S))
        return None, reply
    starting = runs_starting(port, bounds.HOLDERS_BUDGET_S)
    if starting:
        server.close()
        reply.update(
            free=False, error="a run of this launcher is starting on it", states=["starting"], holders=starting
        )
        return None, reply
    reply.update(free=True, accepted=0, peers=[])
    return server, reply


def runs_starting(port, budget):
    """This user's launcher runs here whose torchrun will bind `port` (the store of a static run's node rank 0, a c10d
    run's is_host node) and has not yet: its processes alive, importing torch or in the host's setup. The port is free
    for a second or more after a run started (a launch 2 s after a detached one passed the check, then died with
    EADDRINUSE); as holders, with the run's mark, so the finding says which run and how to stop it."""
    import json

    from launcher.node.common.proc import live_marks
    from launcher.node.loader import node_path
    from launcher.node.wire import RUN_ID_PATTERN, RUNS_ROOT

    root = node_path(RUNS_ROOT)
    deadline = time.monotonic() + budget
    found, marks = [], None
    try:
        run_ids = sorted((r for r in os.listdir(root) if re.fullmatch(RUN_ID_PATTERN, r)), reverse=True)
    except OSError:
        return []
    for run_id in run_ids:
        if time.monotonic() > deadline:
            break
        try:
            nodes = os.listdir(os.path.join(root, run_id))
        except OSError:
            continue
        for node in nodes:
            run_dir = os.path.join(root, run_id, node)
            if os.path.exists(os.path.join(run_dir, "exit_code")):
                continue
            try:
                with open(os.path.join(run_dir, "command.json"), encoding="utf-8") as handle:
                    command = json.load(handle)
            except (OSError, ValueError):
                continue
            if not isinstance(command, dict) or not binds_port(
                command.get("argv") or [], command.get("node_rank"), port
            ):
                continue
            if marks is None:
                marks = live_marks()  # one pass over /proc, only once a run could hold the port
            mark = "%s/%s" % (run_id, node)
            if marks[mark]:
                inventory = command.get("inventory")
                found.append(
                    {
                        "pid": None,
                        "command": "torchrun, starting",
                        "state": "starting",
                        "run": mark,
                        "user": owner_of(os.getpid()),
                        **({"inventory": inventory} if isinstance(inventory, str) else {}),
                    }
                )
    return found


def binds_port(argv, node_rank, port):
    """Whether the torchrun of `argv` binds `port` on this node: its store's (--master-port on node rank 0, or a c10d
    --rdzv-endpoint's port with is_host=1 in --rdzv-conf)."""

    def value(name):
        return argv[argv.index(name) + 1] if name in argv[:-1] else None

    if value("--master-port") == str(port):
        return node_rank == 0
    endpoint = value("--rdzv-endpoint") or ""
    return endpoint.rpartition(":")[2] == str(port) and "is_host=1" in (value("--rdzv-conf") or "")


def serve(server, token, deadline, reply, stop_fd):
    """Answer every connection with the token until `stop_fd` reaches its end (or `deadline`, a monotonic time);
    then close the server. The standalone listener's `stop_fd` is stdin (the launcher closes it once every probe
    has answered); the agent's is a pipe it closes on `go` or `abort`, before torchrun binds the port."""
    token = token.encode() + b"\n"
    conns = []
    open_ = True
    try:
        while open_ and time.monotonic() < deadline:
            ready, _, _ = select.select([server, stop_fd, *conns], [], [], max(0.0, deadline - time.monotonic()))
            for item in ready:
                if item is server:
                    conn, peer = server.accept()
                    conn.setblocking(True)
                    conn.settimeout(bounds.TOKEN_SEND_S)
                    try:
                        conn.sendall(token)
                    except OSError:
                        conn.close()
                        continue
                    conns.append(conn)
                    reply["accepted"] += 1
                    reply["peers"].append(peer[0])
                elif isinstance(item, int):
                    open_ = bool(os.read(item, bounds.DRAIN_BYTES))  # its end: every node has its answer
                else:
                    try:
                        more = item.recv(bounds.DRAIN_BYTES)
                    except OSError:
                        more = b""
                    if not more:  # the client closed first (as it should): no TIME_WAIT on our port
                        item.close()
                        conns.remove(item)
    finally:
        for conn in conns:
            conn.close()
        server.close()
    return reply


def listen(request):
    """Mode listen: is master_port free here; then answer connections with the token until stdin closes."""
    max_s = seconds(request, "max_s", "listen")
    server, reply = open_listener(request["master_port"])
    if server is None:
        return reply
    return serve(server, request["token"], time.monotonic() + max_s, reply, 0)
