"""The doctor's probe: one stdlib-only script, sent to each node over SSH, that prints one JSON object.

Nothing is installed on a node. The launcher runs `PYTHON -c BOOTSTRAP` (`launcher.doctor.probe_command`); the
bootstrap reads this file's source from the first stdin line, and `main` reads a JSON request from the second.
Kept to Python 3.8 syntax and the standard library: it runs under whatever interpreter the node has, and it
never imports torch (seconds, and the point is to look before anything starts).

Two modes:
- probe (every node): hostname, Python, torch/CUDA/NCCL versions read from the installed files, GPUs, what each
  requested name resolves to here, the node's own hostname, the script's sha256, the installed distributions,
  the interface toward the master, free disk, the clock; last, when asked, a TCP connection to
  master_addr:master_port that must answer with the doctor's token (so we know it reached *our* listener).
- listen (the master, a second session started just before the probes): bind master_port on 0.0.0.0 with
  SO_REUSEADDR on, as torchrun's store binds (is it free?), answer every connection with the token, and stop
  when the launcher closes stdin (or after max_s, whatever happens to the launcher).

`inv doctor` runs those two modes in sessions of their own. A launch with the doctor on sends this source inside
the agent's start request instead (`launcher/agent.py`, `Preflight`): the agent runs `probe`, holds the listener
(`open_listener`, `serve`) on the master, and runs `tcp_connect` when the launcher asks, all in its one session.

Like the agent, the probe has no defaults of its own for what the controller decides: how long the listener lives
(max_s) and how long a node tries to reach it (connect.window, connect.token_read_s) arrive in the request
(`launcher.doctor.collect`). A request without one gets an error reply (exit 2), never a guess. The bounds on the
probe's own local work below (DNS, nvidia-smi, the /proc scan) are its constants, written here only.
"""

import hashlib
import json
import os
import re
import select
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

RESOLVE_BUDGET_S = 3.0
SMI_TIMEOUT_S = 3.0
HOLDERS_BUDGET_S = 1.0
"""How long the listen mode may scan /proc for who holds a taken port."""
NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


class BadRequest(Exception):
    """A request the probe cannot work from (a number it needs is missing or not one); the message says which."""


def seconds(section, key, where):
    """`section[key]` as a number of seconds >= 0; BadRequest when the controller did not send one."""
    value = section.get(key) if isinstance(section, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise BadRequest(f"the {where} request needs {key} (seconds, a number >= 0); got {value!r}")
    return float(value)


def error_text(exc):
    """An exception as one short line (`[Errno 111] Connection refused`, `gai error -2: Name or ...`)."""
    if isinstance(exc, socket.gaierror):
        return f"gai error {exc.errno}: {exc.strerror}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"[Errno {exc.errno}] {exc.strerror}"
    return f"{type(exc).__name__}: {exc}"


# --- versions ---------------------------------------------------------------------------------------------


def python_info():
    import platform

    return {"version": platform.python_version(), "executable": sys.executable,
            "implementation": platform.python_implementation()}


def assigned_value(text, name):
    """The literal assigned to `name` at the top of a module's text (`cuda: Optional[str] = '12.1'`)."""
    import ast

    match = re.search(r"^" + re.escape(name) + r"\s*(?::[^=\n]*)?=\s*(.+?)\s*$", text, re.MULTILINE)
    if not match:
        return None
    try:
        value = ast.literal_eval(match.group(1))
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def torch_info():
    """torch's version from its installed metadata, CUDA from torch/version.py's text: no `import torch`."""
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        return {"version": None, "error": "importlib.metadata is missing (Python < 3.8)"}
    try:
        dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        return {"version": None}
    info = {"version": dist.version, "cuda": None, "cuda_known": False, "nccl": None}
    try:
        with open(str(dist.locate_file("torch/version.py")), encoding="utf-8") as handle:
            info["cuda"] = assigned_value(handle.read(), "cuda")
            info["cuda_known"] = True
    except (OSError, ValueError):
        pass  # metadata without the package files (e.g. a bare dist-info): CUDA unknown, not "none"
    for name in NCCL_DISTS:  # pip wheels of torch bring their NCCL as a distribution of its own
        try:
            info["nccl"] = metadata.version(name)
            break
        except metadata.PackageNotFoundError:
            continue
    return info


def _dist_entry(folder, entry):
    """(name, version) of a .dist-info/.egg-info folder from its name; None when the name doesn't say."""
    stem, _, kind = entry.rpartition(".")
    if kind not in ("dist-info", "egg-info"):
        return None
    parts = stem.split("-")
    if len(parts) >= 2 and parts[0] and parts[1]:
        return parts[0], parts[1]
    for meta in ("METADATA", "PKG-INFO"):  # e.g. `pkg.egg-info` of a develop install: read its header
        try:
            with open(os.path.join(folder, entry, meta), encoding="utf-8", errors="replace") as handle:
                header = handle.read(4096)
        except OSError:
            continue
        name = re.search(r"^Name:\s*(\S+)", header, re.MULTILINE)
        version = re.search(r"^Version:\s*(\S+)", header, re.MULTILINE)
        if name and version:
            return name.group(1), version.group(1)
    return None


def packages():
    """Installed distributions as sorted `name==version` (the first on sys.path wins, as for imports).

    Read from the metadata folders' names (one listdir per path entry): parsing every METADATA file through
    importlib.metadata costs ~1 ms a distribution, too much for a probe that must be quick.
    """
    seen = {}
    for folder in sys.path:
        try:
            entries = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for entry in entries:
            found = _dist_entry(folder or ".", entry)
            if found is None:
                continue
            name = re.sub(r"[-_.]+", "-", found[0]).lower()
            seen.setdefault(name, found[1])
    items = sorted(f"{name}=={version}" for name, version in seen.items())
    digest = hashlib.sha256("\n".join(items).encode()).hexdigest()
    return {"sha256": digest, "count": len(items), "list": items}


# --- GPUs -------------------------------------------------------------------------------------------------


def _visible(rows, spec):
    """Filter nvidia-smi rows by CUDA_VISIBLE_DEVICES (indices or UUID prefixes); None: all are visible."""
    if spec is None:
        return rows
    keep = []
    for word in [w.strip() for w in spec.split(",") if w.strip()]:
        if word.startswith("-"):
            break  # CUDA stops at the first invalid entry
        for row in rows:
            match = row["index"] == int(word) if word.isdigit() else row["uuid"].startswith(word)
            if match and row not in keep:
                keep.append(row)
    return keep


def gpu_info(visible_spec):
    """Visible GPUs and the busy ones, from nvidia-smi (absent: no GPUs)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"count": 0, "busy": None, "smi": False}
    queries = [
        [smi, "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu", "--format=csv,noheader,nounits"],
        [smi, "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader,nounits"],
    ]
    try:
        procs = [subprocess.Popen(q, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for q in queries]
    except OSError as exc:
        return {"count": 0, "busy": None, "smi": True, "error": error_text(exc)}
    outputs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=SMI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {"count": 0, "busy": None, "smi": True, "error": f"nvidia-smi did not answer in {SMI_TIMEOUT_S:g} s"}
        if proc.returncode != 0:
            why = (err or out).decode(errors="replace").strip().splitlines()
            last = why[-1] if why else f"exit {proc.returncode}"
            return {"count": 0, "busy": None, "smi": True, "error": f"nvidia-smi failed: {last}"}
        outputs.append(out.decode(errors="replace"))
    rows = []
    for line in outputs[0].splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 6 or not cells[0].isdigit():
            continue
        rows.append({"index": int(cells[0]), "uuid": cells[1], "name": cells[2], "memory_used_mib": _num(cells[3]),
                     "memory_total_mib": _num(cells[4]), "utilization": _num(cells[5]), "pids": []})
    by_uuid = {row["uuid"]: row for row in rows}
    for line in outputs[1].splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 2 and cells[0] in by_uuid and cells[1].isdigit():
            by_uuid[cells[0]]["pids"].append(int(cells[1]))
    visible = _visible(rows, visible_spec)
    # Busy: someone's process on it, or memory in use / compute load beyond what an idle driver shows.
    busy = [r for r in visible if r["pids"] or (r["memory_used_mib"] or 0) > 1024 or (r["utilization"] or 0) > 5]
    return {"count": len(visible), "total": len(rows), "smi": True, "names": sorted({r["name"] for r in visible}),
            "busy": [{k: r[k] for k in ("index", "pids", "memory_used_mib", "utilization")} for r in busy]}


def _num(text):
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]" on some boards


# --- names, addresses, routes -----------------------------------------------------------------------------


def resolve(name):
    """What `name` resolves to here (unique addresses, in getaddrinfo's order), or the error."""
    try:
        infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
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
                words = line.split("#")[0].split()
                if len(words) >= 2 and name in words[1:]:
                    found.append(" ".join(words))
    except OSError:
        pass
    return found


def _ipv4_ifaces():
    """(name, address, netmask) of each IPv4 interface, via ioctl (Linux); empty where that doesn't work."""
    import fcntl

    out = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            packed = struct.pack("256s", name[:15].encode())
            try:
                addr = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x8915, packed)[20:24])  # SIOCGIFADDR
                mask = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x891B, packed)[20:24])  # SIOCGIFNETMASK
            except OSError:
                continue
            out.append((name, addr, mask))
    finally:
        sock.close()
    return out


def iface_of(ip):
    """The interface that holds `ip` (best effort: None when unknown)."""
    if ":" in ip:
        try:
            want = socket.inet_pton(socket.AF_INET6, ip).hex()
            with open("/proc/net/if_inet6", encoding="ascii") as handle:
                for line in handle:
                    words = line.split()
                    if len(words) >= 6 and words[0] == want:
                        return words[5]
        except (OSError, ValueError):
            return None
        return None
    try:
        ifaces = _ipv4_ifaces()
        target = struct.unpack("!I", socket.inet_aton(ip))[0]
    except (OSError, ImportError, AttributeError):
        return None
    for name, addr, _ in ifaces:
        if addr == ip:
            return name
    for name, addr, mask in ifaces:  # a secondary address, e.g. 127.0.0.5 on lo (127.0.0.1/8)
        bits = struct.unpack("!I", socket.inet_aton(mask))[0]
        if struct.unpack("!I", socket.inet_aton(addr))[0] & bits == target & bits:
            return name
    return None


def route(master_addr, port):
    """The local address (and interface) this node uses toward the master: a UDP connect sends nothing."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(master_addr, port, 0, socket.SOCK_DGRAM)[0]
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.connect(sockaddr)
            ip = sock.getsockname()[0]
        finally:
            sock.close()
    except (OSError, UnicodeError) as exc:
        return {"error": error_text(exc)}
    return {"ip": ip, "iface": iface_of(ip)}


# --- files ------------------------------------------------------------------------------------------------


def script_info(workdir, script):
    path = script if os.path.isabs(script) else os.path.join(workdir, script)
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            size = handle.tell()
    except OSError as exc:
        return {"path": path, "error": error_text(exc)}
    return {"path": path, "sha256": digest.hexdigest(), "size": size}


def disk_free(workdir):
    path = workdir
    while path and not os.path.exists(path):  # a missing workdir: the disk it would be made on
        parent = os.path.dirname(path)
        path = parent if parent != path else ""
    try:
        return shutil.disk_usage(path or "/").free
    except OSError:
        return None


# --- TCP: the master's listener and every node's connection to it -----------------------------------------


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
            sock = socket.create_connection((addr, port), timeout=max(0.2, min(1.0, deadline - time.monotonic())))
        except socket.gaierror as exc:
            return {"ok": False, "error": f"cannot resolve {addr}: {error_text(exc)}", "attempts": attempts}
        except OSError as exc:
            last = exc
            if time.monotonic() >= deadline:
                return {"ok": False, "error": error_text(last), "attempts": attempts,
                        "elapsed": round(time.monotonic() - start, 3)}
            time.sleep(0.05)
            continue
        try:
            peer = sock.getpeername()[0]
            sock.settimeout(read_s)
            data = b""
            try:
                while b"\n" not in data and len(data) < 256:
                    chunk = sock.recv(256)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
        finally:
            sock.close()  # we close first: the TIME_WAIT stays on our side, not on the master's port
        elapsed = round(time.monotonic() - start, 3)
        result = {"ok": data.strip().decode(errors="replace") == token, "peer": peer, "attempts": attempts,
                  "elapsed": elapsed}
        if not data:
            result["error"] = (f"connected to {addr}:{port} ({peer}), but no answer came in {read_s:g} s: "
                               "something else listens there, or the master is overloaded")
        elif not result["ok"]:
            result["error"] = f"something else answers on {addr}:{port} ({peer}): not the doctor's listener"
        return result


def port_holders(port, budget):
    """Who holds TCP `port` here: state and pid/command when /proc shows them (best effort, time-boxed)."""
    inodes = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                next(handle, None)
                for line in handle:
                    words = line.split()
                    if len(words) > 9 and int(words[1].rsplit(":", 1)[1], 16) == port:
                        inodes[words[9]] = "listening" if words[3] == "0A" else "bound"
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
                        cmd = handle.read(300).replace(b"\0", b" ").decode(errors="replace").strip()
                except OSError:
                    cmd = ""
                holders.append({"pid": int(pid), "command": cmd, "state": wanted.pop(link)})
                break
    return {"states": sorted(set(inodes.values())), "holders": holders}


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
        server.listen(128)
    except OSError as exc:
        server.close()
        reply.update(free=False, error=error_text(exc), **port_holders(port, HOLDERS_BUDGET_S))
        return None, reply
    reply.update(free=True, accepted=0, peers=[])
    return server, reply


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
                    conn.settimeout(1.0)
                    try:
                        conn.sendall(token)
                    except OSError:
                        conn.close()
                        continue
                    conns.append(conn)
                    reply["accepted"] += 1
                    reply["peers"].append(peer[0])
                elif isinstance(item, int):
                    open_ = bool(os.read(item, 4096))  # its end: every node has its answer
                else:
                    try:
                        more = item.recv(64)
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


# --- the probe --------------------------------------------------------------------------------------------


def probe(request):
    """Mode probe: everything the doctor compares across nodes, in one JSON object."""
    started = time.monotonic()
    connect = request.get("connect")
    if connect:  # checked first: a request the probe cannot finish gets its error before any work
        window = seconds(connect, "window", "connect")
        read_s = seconds(connect, "token_read_s", "connect")
    full = request.get("checks", "all") == "all"
    workdir = os.path.expanduser(request.get("workdir") or "~")
    hostname = socket.gethostname()
    names = list(request.get("names", []))
    wanted = names + ([hostname] if hostname not in names else [])
    resolved = resolve_all(wanted, RESOLVE_BUDGET_S, request.get("resolve_workers") or len(wanted))
    reply = {
        "mode": "probe",
        "hostname": hostname,
        "python": python_info(),
        "torch": torch_info(),
        "resolve": {n: resolved[n] for n in names},
        "self": {"hostname": hostname, "hosts_lines": hosts_lines(hostname), **resolved[hostname]},
        "workdir": {"path": workdir, "exists": os.path.isdir(workdir)},
        "script": script_info(workdir, request["script"]) if request.get("script") else None,
        "route": route(request["master_addr"], request["master_port"]) if request.get("master_addr") else None,
        "disk_free": disk_free(workdir),
    }
    if full:
        reply["gpus"] = gpu_info(request.get("cuda_visible_devices", os.environ.get("CUDA_VISIBLE_DEVICES")))
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
