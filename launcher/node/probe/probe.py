"""The doctor's probe: one stdlib-only script, sent to each node over SSH, that prints one JSON object.

Nothing is installed on a node. The launcher runs `PYTHON -c BOOTSTRAP` (`launcher.doctor.probe_command`); the
bootstrap loads the node package (launcher/node/loader.py) from the first stdin line, and `main` reads a JSON
request from the second. What it reads lives in launcher/node/probe/facts.py (versions, GPUs),
launcher/node/common/netif.py (the interface toward the master, the same answer `socket_ifname: auto` gets) and
listener.py (the TCP check).
Kept to Python 3.8 syntax and the standard library: it runs under whatever interpreter the node has, and it
never imports torch (seconds, and the point is to look before anything starts).

Two modes:
- probe (every node): hostname, Python, torch/CUDA/NCCL versions read from the installed files, the GPUs the run
  would see (launcher/node/common/gpus.py: nvidia-smi, started first and bounded by the request's gpu_timeout_s), its
  InfiniBand ports, what each requested name resolves to here, the node's own hostname, the job's script (its
  sha256), module (found, not imported) or command (on PATH: launcher/node/probe/runnable.py), the installed
  distributions (`checks: all` only), the interface toward the master, free disk, the clock; last, when asked, a
  TCP connection to master_addr:master_port that must answer with the doctor's token (so we know it reached *our*
  listener).
- listen (the master, a second session started just before the probes): bind master_port on 0.0.0.0 with
  SO_REUSEADDR on, as torchrun's store binds (is it free?), answer every connection with the token, and stop
  when the launcher closes stdin (or after max_s, whatever happens to the launcher).

`inv doctor` runs those two modes in sessions of their own. A launch with the doctor on runs them inside the
agent instead (launcher/node/agent/gatechecks.py, `GateChecks`): the agent runs `probe`, holds the listener
(`open_listener`, `serve`) on the master, and runs `tcp_connect` when the launcher asks, all in its one session.

Like the agent, the probe has no defaults of its own for what the controller decides: how long the listener lives
(max_s) and how long a node tries to reach it (connect.window, connect.token_read_s) arrive in the request
(`launcher.doctor.request`). A request without one gets an error reply (exit 2), never a guess. The bounds on the
probe's own local work (DNS, nvidia-smi, the /proc scan) are in launcher/node/common/bounds.py with every other node
number.
"""

import json
import os
import socket
import sys
import threading
import time

from launcher.node.common import bounds
from launcher.node.common.gpus import ask_gpus, gpu_info, visible_spec
from launcher.node.common.netif import route_to
from launcher.node.probe.facts import packages, python_info, python_wrapper, torch_info
from launcher.node.probe.listener import listen, tcp_connect
from launcher.node.probe.runnable import job_info
from launcher.node.wire import BadRequest, error_text, host_arg, seconds

# --- names, addresses, routes -----------------------------------------------------------------------------


def resolve(name):
    """What `name` resolves to here (unique addresses, in getaddrinfo's order), or the error."""
    try:
        infos = socket.getaddrinfo(host_arg(name), None, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return {"error": error_text(exc)}
    addrs = []
    for info in infos:
        addr = info[4][0].split("%")[0]
        if addr not in addrs:
            addrs.append(addr)
    return {"addrs": addrs}


def resolve_all(names, budget, workers):
    """Resolve the names on at most `workers` threads (a cluster of N nodes once started N threads on each); a name
    not answered within `budget` s, all names together, is an error."""
    results = {}
    todo = list(names)
    lock = threading.Lock()

    def work():
        while True:
            with lock:
                if not todo:
                    return
                name = todo.pop()
            results[name] = resolve(name)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(max(1, min(workers, len(names))))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + budget
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {n: results.get(n, {"error": f"no answer within {budget:g} s (DNS server unreachable?)"}) for n in names}


def hosts_lines(name):
    """/etc/hosts lines that map `name` (to show the one to change)."""
    found = []
    try:
        with open("/etc/hosts", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                parts = line.split("#")[0].split()
                if len(parts) >= 2 and name in parts[1:]:
                    found.append(" ".join(parts))
    except OSError:
        pass
    return found


# --- files ------------------------------------------------------------------------------------------------


def disk_free(workdir):
    path = workdir
    while path and not os.path.exists(path):  # a missing workdir: the disk it would be made on
        parent = os.path.dirname(path)
        path = parent if parent != path else ""
    try:
        found = os.statvfs(path or "/")  # shutil.disk_usage's own answer, without shutil's imports (bz2, lzma)
        return found.f_bavail * found.f_frsize
    except OSError:
        return None


def ib_ports():
    """The node's InfiniBand/RoCE ports from sysfs (what `ibstat` shows): [{device, port, state, link_layer,
    rate}]; NCCL uses them (NET/IB) unless it falls back to sockets."""
    root = "/sys/class/infiniband"
    found = []
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return found
    for device in devices:
        try:
            ports = sorted(os.listdir(os.path.join(root, device, "ports")))
        except OSError:
            continue
        for port in ports:
            item = {"device": device, "port": port}
            for name in ("state", "link_layer", "rate"):
                try:
                    with open(os.path.join(root, device, "ports", port, name)) as handle:
                        item[name] = handle.read().strip()
                except OSError:
                    item[name] = None
            found.append(item)
    return found


# --- the probe --------------------------------------------------------------------------------------------


def probe(request):
    """Mode probe: everything the doctor compares across nodes, in one JSON object."""
    started = time.monotonic()
    connect = request.get("connect")
    if connect:  # checked first: a request the probe cannot finish gets its error before any work
        window = seconds(connect, "window", "connect")
        read_s = seconds(connect, "token_read_s", "connect")
    full = request.get("checks", "all") == "all"
    # nvidia-smi first (seconds on 8 GPUs without persistence mode), its answer collected after the names meanwhile
    asked = ask_gpus(seconds(request, "gpu_timeout_s", "probe"))
    workdir = os.path.expanduser(request.get("workdir") or "~")
    hostname = socket.gethostname()
    names = list(request.get("names", []))
    wanted = names + ([hostname] if hostname not in names else [])
    resolved = resolve_all(wanted, bounds.RESOLVE_BUDGET_S, request.get("resolve_workers") or len(wanted))
    reply = {
        "mode": "probe",
        "hostname": hostname,
        "python": dict(python_info(), wrapper=python_wrapper(request.get("python"))),
        "torch": torch_info(),
        "resolve": {n: resolved[n] for n in names},
        "self": {"hostname": hostname, "hosts_lines": hosts_lines(hostname), **resolved[hostname]},
        "workdir": {"path": workdir, "exists": os.path.isdir(workdir)},
        "script": None,
        "route": route_to(request["master_addr"], request["master_port"]) if request.get("master_addr") else None,
        "disk_free": disk_free(workdir),
        "gpus": gpu_info(asked, visible_spec(request), request.get("gpus")),
        "ib": ib_ports(),
    }
    reply.update(job_info(request, workdir))  # the job's script (its sha256), module (importable?) or command
    if full:
        reply["packages"] = packages()
    if connect:  # last: the master's listener has had the most time to come up
        reply["tcp"] = tcp_connect(request["master_addr"], request["master_port"], connect["token"], window, read_s)
    reply["elapsed"] = round(time.monotonic() - started, 3)
    reply["time"] = time.time()
    return reply


def main():
    request = json.loads(sys.stdin.readline())
    mode = "listen" if request.get("mode") == "listen" else "probe"
    try:
        reply, code = (listen if mode == "listen" else probe)(request), 0
    except BadRequest as exc:  # the controller's bug, said as one line (its finding shows stderr's last line)
        reply, code = {"mode": mode, "error": str(exc)}, 2
        sys.stderr.write(f"probe: {exc}\n")
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
