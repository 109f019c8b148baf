"""A local cluster for tests and demos: N real sshd servers on loopback addresses, each its own hostname."""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import yaml

from launcher.errors import LauncherError
from launcher.plan import RUN_ID_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_STATE_DIR = REPO_ROOT / ".sandbox"
DEFAULT_INVENTORY = REPO_ROOT / "hosts" / "sandbox.yaml"
SSHD = "/usr/sbin/sshd"
MAX_NODES = 200
TRAP_ADDR = "127.0.1.1"
"""Where Debian's installer maps a machine's own hostname: peers can't reach it there."""
STOP_GRACE_S = 3.0

_STATE_FILE = "sandbox.json"
_USER_KEY = "id_ed25519"
_NODE_KEYS = {"name", "addr", "port", "pid", "start_time"}
# Words that need no quoting in ssh/sshd config files; '%' would be read as a token, '~' as home.
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./@+,=-]*\Z")
# The sshd listeners this process started, kept so that stopping them also reaps them (no zombies).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class SandboxError(LauncherError):
    """The sandbox cannot be started, found or stopped; the message says why and what to do."""


@dataclass(frozen=True)
class SandboxNode:
    """One sshd server of the sandbox."""

    name: str
    """Its ssh alias and hostname: node-0, node-1, ..."""
    addr: str
    """The loopback address it listens on (and that every node's /etc/hosts gives for `name`)."""
    port: int
    """The TCP port it listens on."""
    pid: int
    """The sshd listener's process id."""


@dataclass(frozen=True)
class Sandbox:
    """A running sandbox and the files a client needs to use it."""

    state_dir: Path
    """Folder with keys, configs, logs and sandbox.json."""
    nodes: tuple[SandboxNode, ...]
    ssh_config: Path
    """`ssh -F` this file to reach node-i by name."""
    known_hosts: Path
    """Every node's host key, pre-filled."""
    identity_file: Path
    """The private key every node accepts for root."""
    inventory: Path
    """The launcher inventory written for this sandbox."""


# ---------------------------------------------------------------------------------------------------------
# Pure helpers: addresses and file contents.


def node_name(index: int) -> str:
    """The name of node `index`."""
    return f"node-{index}"


def node_addresses(base_addr: str, count: int) -> list[str]:
    """`count` consecutive loopback addresses from `base_addr` (network namespaces don't work here)."""
    try:
        base = ipaddress.IPv4Address(base_addr)
    except ValueError:
        raise SandboxError(f"base address {base_addr!r} is not an IPv4 address.") from None
    loopback = ipaddress.IPv4Network("127.0.0.0/8")
    last = int(base) + count - 1
    if base not in loopback or last > int(loopback.broadcast_address) - 1:
        raise SandboxError(f"{count} nodes from {base_addr} do not fit in 127.0.0.0/8; pick another base address.")
    return [str(base + i) for i in range(count)]


def reserve_base_addr(first: int = 10, last: int = 250) -> tuple[str, IO[str]]:
    """A base address 127.0.K.2 (K from `first` to `last`) that no other sandbox on this machine holds.

    Held through a lock file per K (tests, benchmarks and people share this machine's loopback range); keep the
    returned handle open while the sandbox lives, close it to free K.
    """
    for k in range(first, last + 1):
        handle = open(Path(tempfile.gettempdir()) / f"launcher-sandbox-127.0.{k}.lock", "a")  # noqa: SIM115
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return f"127.0.{k}.2", handle
    raise SandboxError(f"no free sandbox subnet left in 127.0.{first}-{last}.x")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (a master port: every sandbox node shares one port space)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pids_with_env(prefix: bytes) -> list[int]:
    """Live processes on this machine (so on every sandbox node) with an environment entry starting with `prefix`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone, or not ours
            continue
        if any(var.startswith(prefix) for var in environ.split(b"\0")):
            found.append(int(entry))
    return found


def run_processes(run_id: str) -> list[int]:
    """Live processes of a launcher run on any sandbox node: each carries DDP_LAUNCHER_RUN=<run id>/<node>."""
    return pids_with_env(f"{RUN_ID_ENV}={run_id}/".encode())


def node_cache(state_dir: Path, index: int) -> Path:
    """Node `index`'s XDG cache home: its run directories are under ddp-launcher/runs there."""
    return state_dir / node_name(index) / "cache"


def render_sshd_config(addr: str, port: int, host_key: Path, pid_file: Path, authorized_keys: Path,
                       cache_home: Path | None = None) -> str:
    """sshd_config of one node: root by key only, many sessions at once, quiet log, its own cache home."""
    # The nodes share this machine's home; a cache folder of their own keeps each node's run directories
    # (~/.cache/ddp-launcher) apart, as on separate machines, so "the latest run" means this sandbox's.
    own_cache = [f"SetEnv XDG_CACHE_HOME={_config_path(cache_home)}"] if cache_home is not None else []
    return "\n".join(
        [
            f"ListenAddress {addr}:{port}",
            *own_cache,
            f"HostKey {_config_path(host_key)}",
            f"PidFile {_config_path(pid_file)}",
            f"AuthorizedKeysFile {_config_path(authorized_keys)}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # The state folder may live anywhere (e.g. a group-writable tmp); the keys are ours anyway.
            "StrictModes no",
            # Launches open many sessions per node and many nodes at once.
            "MaxSessions 64",
            "MaxStartups 100:30:200",
            "LogLevel ERROR",
            "",
        ]
    )


def render_ssh_config(nodes: Iterable[SandboxNode], identity_file: Path, known_hosts: Path) -> str:
    """Client config: one block per node, strict host keys against the pre-filled known_hosts."""
    blocks = [
        "\n".join(
            [
                f"Host {node.name}",
                f"    HostName {node.addr}",
                f"    Port {node.port}",
                "    User root",
                f"    IdentityFile {_config_path(identity_file)}",
                "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {_config_path(known_hosts)}",
                "    StrictHostKeyChecking yes",
            ]
        )
        for node in nodes
    ]
    return (
        "# Written by the launcher's sandbox; use it with `ssh -F THIS_FILE node-0`.\n\n" + "\n\n".join(blocks) + "\n"
    )


def render_known_hosts(entries: Iterable[tuple[str, int, str]]) -> str:
    """known_hosts lines `[addr]:port TYPE KEY` from (addr, port, contents of the host key's .pub file)."""
    lines = []
    for addr, port, public_key in entries:
        key_type, key = public_key.split()[:2]
        lines.append(f"[{addr}]:{port} {key_type} {key}")
    return "\n".join(lines) + "\n"


def render_hosts(
    index: int, addrs: Sequence[str], *, unresolvable: Iterable[int] = (), loopback_trap: bool = False
) -> str:
    """/etc/hosts of node `index`: localhost and every node, less the `unresolvable` ones.

    With `loopback_trap`, the node's own name points at 127.0.1.1 (Debian's default) instead of its address.
    """
    hidden = set(unresolvable)
    lines = ["127.0.0.1 localhost"]
    for j, addr in enumerate(addrs):
        if j in hidden:
            continue
        lines.append(f"{TRAP_ADDR if loopback_trap and j == index else addr} {node_name(j)}")
    return "\n".join(lines) + "\n"


def render_inventory(
    *,
    ssh_config: Path,
    names: Sequence[str],
    python: str,
    workdir: Path,
    nproc_per_node: int,
    master_port: int,
    script: str,
    script_args: Sequence[str] = (),
    python_override: Mapping[int, str] | None = None,
) -> str:
    """The launcher inventory (YAML) for the sandbox; a node with its own python is written as a mapping."""
    overrides = python_override or {}
    hosts: list[Any] = [
        {"name": name, "python": overrides[i]} if i in overrides else name for i, name in enumerate(names)
    ]
    data = {
        "ssh_config": str(ssh_config),
        "host_key_policy": "strict",
        "defaults": {"python": python, "workdir": str(workdir), "nproc_per_node": nproc_per_node},
        "hosts": hosts,
        "rendezvous": {"master_addr": names[0], "master_port": master_port},
        "job": {"script": script, "args": list(script_args)},
    }
    header = (
        f"# Written by `inv sandbox.up` for a local sandbox of {len(names)} sshd nodes;"
        " `inv sandbox.down` stops them.\n"
    )
    body = yaml.dump(data, Dumper=_InventoryDumper, sort_keys=False, default_flow_style=False, width=1000)
    return header + body


class _InventoryDumper(yaml.SafeDumper):
    """SafeDumper that indents list items under their key, and writes a host mapping on one line."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def represent_dict(self, data: Any) -> yaml.MappingNode:
        node = super().represent_dict(data)
        node.flow_style = "name" in data  # `- {name: node-2, python: /other/python}`
        return node


_InventoryDumper.add_representer(dict, _InventoryDumper.represent_dict)


def node_command(name: str, hosts_file: Path, sshd_config: Path, unshare: str = "unshare") -> list[str]:
    """argv that runs sshd with its own hostname and /etc/hosts; unshare and sh exec, so the pid is sshd's."""
    script = (
        f"hostname {shlex.quote(name)}"
        f" && mount --bind {shlex.quote(str(hosts_file))} /etc/hosts"
        f" && exec {SSHD} -D -e -f {shlex.quote(str(sshd_config))}"
    )
    return [unshare, "--uts", "--mount", "--propagation", "private", "/bin/sh", "-c", script]


def _config_path(path: Path) -> str:
    text = str(path)
    if not _PLAIN_PATH.match(text):
        raise SandboxError(f"the sandbox's state folder must be an absolute path of plain characters, got {text!r}.")
    return text


# ---------------------------------------------------------------------------------------------------------
# Public API.


def up(
    nodes: int,
    *,
    state_dir: Path = DEFAULT_STATE_DIR,
    inventory: Path = DEFAULT_INVENTORY,
    base_addr: str = "127.0.0.2",
    ssh_port: int = 2222,
    python: str | None = None,
    workdir: Path | None = None,
    nproc_per_node: int = 1,
    master_port: int = 29500,
    script: str = "train/ddp.py",
    script_args: Sequence[str] = (),
    unresolvable: Mapping[int, Iterable[int]] | None = None,
    self_loopback_trap: Iterable[int] = (),
    python_override: Mapping[int, str] | None = None,
    ready_timeout: float = 10.0,
) -> Sandbox:
    """Start `nodes` sshd servers and write their keys, ssh config and inventory; return once all accept TCP.

    Faults for tests: `unresolvable` {i: [j, ...]} leaves node j out of node i's /etc/hosts;
    `self_loopback_trap` [i, ...] maps node i's own name to 127.0.1.1 on node i; `python_override` {i: path}
    gives node i another interpreter in the inventory. Nothing is left running when it raises.
    """
    if not 1 <= nodes <= MAX_NODES:
        raise SandboxError(f"a sandbox has 1 to {MAX_NODES} nodes, got {nodes}.")
    if not 1 <= ssh_port <= 65535:
        raise SandboxError(f"ssh port must be 1..65535, got {ssh_port}.")
    addrs = node_addresses(base_addr, nodes)
    hidden = {i: set(js) for i, js in (unresolvable or {}).items()}
    trap = set(self_loopback_trap)
    overrides = dict(python_override or {})
    _check_indices(nodes, {*hidden, *(j for js in hidden.values() for j in js), *trap, *overrides})
    unshare = _preflight()
    state_dir, inventory = Path(state_dir).absolute(), Path(inventory).absolute()
    _config_path(state_dir)
    inventory_text = render_inventory(
        ssh_config=state_dir / "ssh_config",
        names=[node_name(i) for i in range(nodes)],
        python=python or _default_python(),
        workdir=Path(workdir).absolute() if workdir else REPO_ROOT,
        nproc_per_node=nproc_per_node,
        master_port=master_port,
        script=script,
        script_args=script_args,
        python_override=overrides,
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    with _locked(state_dir):
        _clear_stale(state_dir)
        identity, known_hosts, ssh_config = _write_client_files(state_dir, addrs, ssh_port)
        commands = [
            _write_node_files(state_dir, i, addrs, ssh_port, hidden.get(i, ()), i in trap, unshare)
            for i in range(nodes)
        ]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for i, argv in enumerate(commands):
                procs.append(_launch(state_dir / node_name(i), argv))
            _wait_ready(state_dir, addrs, ssh_port, procs, ready_timeout)
            inventory.parent.mkdir(parents=True, exist_ok=True)
            inventory.write_text(inventory_text, encoding="utf-8")
            records = [
                {
                    "name": node_name(i),
                    "addr": addr,
                    "port": ssh_port,
                    "pid": p.pid,
                    "start_time": _start_time(p.pid),
                }
                for i, (addr, p) in enumerate(zip(addrs, procs, strict=True))
            ]
            _write_state(state_dir, records, ssh_config, known_hosts, identity, inventory)
        except BaseException:  # Ctrl-C included: nothing half-started stays behind
            _stop_children(procs)
            raise
    return load(state_dir)


def load(state_dir: Path = DEFAULT_STATE_DIR) -> Sandbox:
    """The sandbox recorded in `state_dir` (its processes may have died since; see `running`)."""
    state = _read_state(Path(state_dir).absolute())
    return Sandbox(
        state_dir=Path(state["state_dir"]),
        nodes=tuple(SandboxNode(n["name"], n["addr"], n["port"], n["pid"]) for n in state["nodes"]),
        ssh_config=Path(state["ssh_config"]),
        known_hosts=Path(state["known_hosts"]),
        identity_file=Path(state["identity_file"]),
        inventory=Path(state["inventory"]),
    )


def down(state_dir: Path = DEFAULT_STATE_DIR) -> list[str]:
    """Stop every node of the sandbox in `state_dir` and forget it; one line per node says what was done."""
    state_dir = Path(state_dir).absolute()
    if not (state_dir / _STATE_FILE).exists():
        return [f"no sandbox is up in {state_dir}; nothing to stop."]
    with _locked(state_dir):
        if not (state_dir / _STATE_FILE).exists():  # another `down` won the race
            return [f"no sandbox is up in {state_dir}; nothing to stop."]
        lines = _stop_records(_read_state(state_dir)["nodes"])
        (state_dir / _STATE_FILE).unlink()
    return lines


def stop_node(state_dir: Path, index: int) -> None:
    """Stop node `index`'s sshd (and its sessions) to simulate a dead node; the others keep running."""
    state_dir = Path(state_dir).absolute()
    with _locked(state_dir):
        records = _read_state(state_dir)["nodes"]
        if not 0 <= index < len(records):
            raise SandboxError(f"the sandbox in {state_dir} has no node {index} (it has {len(records)}).")
        _stop_records([records[index]])


def running(state_dir: Path = DEFAULT_STATE_DIR) -> dict[str, bool]:
    """Node name -> whether its sshd listener is alive; empty when no sandbox is recorded in `state_dir`."""
    path = Path(state_dir).absolute() / _STATE_FILE
    if not path.exists():
        return {}
    return {r["name"]: _is_our_sshd(r) for r in _read_state(path.parent)["nodes"]}


# ---------------------------------------------------------------------------------------------------------
# Starting.


def _check_indices(nodes: int, indices: Iterable[int]) -> None:
    bad = sorted(i for i in indices if not 0 <= i < nodes)
    if bad:
        raise SandboxError(f"fault options name node {bad[0]}, but the sandbox has nodes 0..{nodes - 1}.")


def _preflight() -> str:
    """Fail early, in one sentence, on what would otherwise fail as N confusing sshd logs."""
    if not os.access(SSHD, os.X_OK):
        raise SandboxError(f"{SSHD} is missing: install it with `apt-get install openssh-server`.")
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("ssh-keygen") is None:
        raise SandboxError("the sandbox needs `unshare` (util-linux) and `ssh-keygen` (openssh-client) on PATH.")
    probe = subprocess.run(
        [unshare, "--uts", "--mount", "--propagation", "private", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        raise SandboxError(
            "the sandbox needs root (or user namespaces) to give each node its own hostname and /etc/hosts:"
            f" `unshare --uts --mount` failed: {why}"
        )
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    return unshare


def _clear_stale(state_dir: Path) -> None:
    if not (state_dir / _STATE_FILE).exists():
        return
    records = _read_state(state_dir)["nodes"]
    alive = [r["name"] for r in records if _is_our_sshd(r)]
    if alive:
        raise SandboxError(
            f"a sandbox is already up in {state_dir} ({len(alive)} of {len(records)} nodes running);"
            " stop it first with `inv sandbox.down`."
        )
    _stop_records(records)  # its listeners are gone; this only reaps what this process started
    (state_dir / _STATE_FILE).unlink()


def _ensure_key(path: Path) -> str:
    """Make an ed25519 key pair at `path` unless there is one (keys outlive `down`); return its public key."""
    public = Path(f"{path}.pub")
    if not (path.exists() and public.exists()):
        path.unlink(missing_ok=True)
        public.unlink(missing_ok=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return public.read_text(encoding="utf-8")


def _write_client_files(state_dir: Path, addrs: Sequence[str], port: int) -> tuple[Path, Path, Path]:
    identity, known_hosts, ssh_config = (
        state_dir / _USER_KEY,
        state_dir / "known_hosts",
        state_dir / "ssh_config",
    )
    (state_dir / "authorized_keys").write_text(_ensure_key(identity), encoding="utf-8")
    host_keys = []
    for i, addr in enumerate(addrs):
        (state_dir / node_name(i)).mkdir(exist_ok=True)
        host_keys.append((addr, port, _ensure_key(state_dir / node_name(i) / "ssh_host_ed25519_key")))
    # Pre-filled: many first connections at once would race to learn keys into one file.
    known_hosts.write_text(render_known_hosts(host_keys), encoding="utf-8")
    records = [SandboxNode(node_name(i), addr, port, 0) for i, addr in enumerate(addrs)]
    ssh_config.write_text(render_ssh_config(records, identity, known_hosts), encoding="utf-8")
    return identity, known_hosts, ssh_config


def _write_node_files(
    state_dir: Path,
    index: int,
    addrs: Sequence[str],
    port: int,
    hidden: Iterable[int],
    trap: bool,
    unshare: str,
) -> list[str]:
    """Write node `index`'s sshd_config and hosts file; return the argv that starts it."""
    folder = state_dir / node_name(index)
    config, hosts = folder / "sshd_config", folder / "hosts"
    config.write_text(
        render_sshd_config(
            addrs[index],
            port,
            folder / "ssh_host_ed25519_key",
            folder / "sshd.pid",
            state_dir / "authorized_keys",
            node_cache(state_dir, index),
        ),
        encoding="utf-8",
    )
    hosts.write_text(render_hosts(index, addrs, unresolvable=hidden, loopback_trap=trap), encoding="utf-8")
    (folder / "sshd.pid").unlink(missing_ok=True)  # readiness waits for sshd to write it afresh
    if index == 0:  # the configs differ only in paths: checking one catches a bad template cheaply
        check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise SandboxError(f"sshd rejects {config}: {_last_lines(check.stderr)}")
    return node_command(node_name(index), hosts, config, unshare)


def _launch(folder: Path, argv: list[str]) -> subprocess.Popen[bytes]:
    """Start one node, logging to its folder; not waited on: it outlives this call."""
    with open(folder / "sshd.log", "wb") as log:
        # Own session: a Ctrl-C meant for the caller doesn't reach the nodes.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    _CHILDREN[proc.pid] = proc
    return proc


def _wait_ready(
    state_dir: Path, addrs: Sequence[str], port: int, procs: Sequence[subprocess.Popen[bytes]], timeout: float
) -> None:
    pending = set(range(len(procs)))
    deadline = time.monotonic() + timeout
    while pending:
        for i in sorted(pending):
            folder = state_dir / node_name(i)
            if procs[i].poll() is not None:
                why = _last_lines(_read(folder / "sshd.log"))
                raise SandboxError(f"{node_name(i)} ({addrs[i]}:{port}) did not start: {why}")
            # sshd writes its pid file only after it has bound: this tells our sshd from another server.
            if _read(folder / "sshd.pid").strip() == str(procs[i].pid) and _accepts_tcp(addrs[i], port):
                pending.discard(i)
        if pending and time.monotonic() > deadline:
            i = min(pending)
            raise SandboxError(
                f"{node_name(i)} ({addrs[i]}:{port}) did not accept connections within {timeout:g} s:"
                f" {_last_lines(_read(state_dir / node_name(i) / 'sshd.log'))}"
            )
        if pending:
            time.sleep(0.02)


def _accepts_tcp(addr: str, port: int) -> bool:
    """Whether addr:port accepts a connection; we send a version line so sshd logs no aborted handshake."""
    try:
        with socket.create_connection((addr, port), timeout=1.0) as conn:
            conn.sendall(b"SSH-2.0-sandbox-probe\r\n")  # not waiting for sshd's banner: 20 ms a node
        return True
    except OSError:
        return False


def _default_python() -> str:
    """This interpreter: the nodes share this machine's Python."""
    exe = Path(sys.executable).absolute()
    # Not resolved through symlinks: a venv's bin/python is a link, and resolving it would leave the venv.
    if exe.parent.name == "shims":  # a pyenv shim: call the interpreter it stands for
        exe = Path(sys.prefix) / "bin" / "python3"
    return str(exe)


def _write_state(
    state_dir: Path,
    nodes: list[dict[str, Any]],
    ssh_config: Path,
    known_hosts: Path,
    identity: Path,
    inventory: Path,
) -> None:
    state = {
        "state_dir": str(state_dir),
        "ssh_config": str(ssh_config),
        "known_hosts": str(known_hosts),
        "identity_file": str(identity),
        "inventory": str(inventory),
        "nodes": nodes,
    }
    tmp = state_dir / f"{_STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    tmp.replace(state_dir / _STATE_FILE)


def _read_state(state_dir: Path) -> dict[str, Any]:
    path = state_dir / _STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        if not all(node.keys() >= _NODE_KEYS for node in state["nodes"]):
            raise ValueError("a node lacks a field")
        return state
    except FileNotFoundError:
        raise SandboxError(f"no sandbox is up in {state_dir}: start one with `inv sandbox.up`.") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SandboxError(f"{path} is unreadable ({exc}); stop stray nodes by hand, then delete it.") from None


@contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """Serialize up/down/stop_node on one state folder, across processes."""
    with open(state_dir / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# ---------------------------------------------------------------------------------------------------------
# Stopping: only the processes we started, recognized by pid, start time and executable.


class _Proc(NamedTuple):
    state: str
    ppid: int
    pgrp: int
    start_time: int


def _stat(pid: int) -> _Proc | None:
    """A process's state, parent, group and start time from /proc/PID/stat; None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return _Proc(fields[0], int(fields[1]), int(fields[2]), int(fields[19]))


def _start_time(pid: int) -> int:
    stat = _stat(pid)
    return stat.start_time if stat else -1


def _alive(pid: int, start_time: int) -> bool:
    """Same process still there; a zombie counts as gone (pid 1 may take seconds to reap it)."""
    _reap_children()
    stat = _stat(pid)
    return stat is not None and stat.start_time == start_time and stat.state not in ("Z", "X")


def _reap_children() -> None:
    """Reap the listeners this process started that have exited, whoever stopped them."""
    for pid, proc in list(_CHILDREN.items()):
        if proc.poll() is not None:
            del _CHILDREN[pid]


def _is_our_sshd(record: Mapping[str, Any]) -> bool:
    if not _alive(record["pid"], record["start_time"]):
        return False
    try:
        return os.readlink(f"/proc/{record['pid']}/exe").removesuffix(" (deleted)") == SSHD
    except OSError:
        return False


def _family(leaders: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(pid, start time) of the live processes below `leaders` or in their process groups, leaders excluded.

    Below: the sshd sessions (which start their own process groups) and what they run; only below a leader
    still alive, as a dead one's pid may be someone else's now. In the group: what a node's shell runs
    (hostname, mount) before it execs sshd; the kernel keeps a group's id unused while it has members.
    """
    groups = {pid for pid, _ in leaders}
    children: dict[int, list[tuple[int, int]]] = {}
    found: set[tuple[int, int]] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) and stat.state not in ("Z", "X"):
            children.setdefault(stat.ppid, []).append((int(entry), stat.start_time))
            if stat.pgrp in groups and int(entry) not in groups:
                found.add((int(entry), stat.start_time))
    todo = [pid for pid, start in leaders if _alive(pid, start)] + [pid for pid, _ in found]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child[0])
    return sorted(found)


def _stop_families(leaders: Sequence[tuple[int, int]]) -> set[int]:
    """Stop `leaders` and their families; return the pids that needed SIGKILL.

    Families are collected before the leaders die (their sessions then become orphans, no longer linked to
    them), and again afterwards, for what a dying shell forked between our look and our signal.
    """
    killed: set[int] = set()
    for _ in range(3):
        targets = [t for t in leaders if _alive(*t)] + _family(leaders)
        if not targets:
            break
        killed |= _terminate(targets)
    return killed


def _signal(pid: int, start_time: int, sig: signal.Signals) -> None:
    if _alive(pid, start_time):
        with suppress(ProcessLookupError):
            os.kill(pid, sig)


def _terminate(targets: Sequence[tuple[int, int]], grace: float = STOP_GRACE_S) -> set[int]:
    """SIGTERM, wait up to `grace`, then SIGKILL; return the pids that needed SIGKILL."""
    for pid, start in targets:
        _signal(pid, start, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (left := [t for t in targets if _alive(*t)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid, start in left:
        _signal(pid, start, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while any(_alive(*t) for t in left) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {pid for pid, _ in left}


def _stop_records(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Stop the recorded listeners that are still ours, and their families; one line per node."""
    labels = {r["pid"]: f"{r['name']} ({r['addr']}:{r['port']}, pid {r['pid']})" for r in records}
    lines: dict[int, str] = {}
    listeners: list[tuple[int, int]] = []
    for r in records:
        if _is_our_sshd(r):
            listeners.append((r["pid"], r["start_time"]))
            lines[r["pid"]] = "stopped"
        elif _alive(r["pid"], r["start_time"]):
            lines[r["pid"]] = "left alone: that pid is no longer the sandbox's sshd"
        else:
            lines[r["pid"]] = "already stopped"
    killed = _stop_families(listeners)
    return [f"{labels[pid]}: {what}" + (" (needed SIGKILL)" if pid in killed else "") for pid, what in lines.items()]


def _stop_children(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Stop nodes this call just started (they may not have exec'd sshd yet, so no executable check)."""
    live = [(p.pid, _start_time(p.pid)) for p in procs if p.poll() is None]
    _stop_families(live)
    for p in procs:
        p.poll()
        _CHILDREN.pop(p.pid, None)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _last_lines(text: str, count: int = 2) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[-count:]) if lines else "(sshd wrote nothing)"
