"""The sandbox's lifecycle: up, load, running, stop_node, down; its keys and configs (its record: statefile)."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.sandbox import procs, start, statefile
from devtools.sandbox import slurm as slurm_cluster  # `slurm` is up's flag
from devtools.sandbox.limits import SANDBOX_MAX_NODES, SandboxError
from devtools.sandbox.render import (
    SSHD,
    SandboxNode,
    config_path,
    node_addresses,
    node_cache,
    node_command,
    node_name,
    render_hosts,
    render_inventory,
    render_known_hosts,
    render_ssh_config,
    render_sshd_config,
)
from devtools.sandbox.stop import stop_families
from launcher.config.model import DEFAULT_MASTER_PORT

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = REPO_ROOT / ".sandbox"
DEFAULT_INVENTORY = REPO_ROOT / "hosts" / "sandbox.yaml"

PATH_ONLY_RC = f"export PATH={shlex.quote(os.environ.get('PATH', '/usr/bin:/bin'))}\n"
"""A node login's ~/.bashrc that only sets PATH (the caller's), for the bench's and the tests' nodes: this machine's
root .bashrc runs `pyenv init`, whose rehash takes one lock file for every node (they share this home), so concurrent
logins queue on it in 0.1 s steps; and a login killed mid-rehash (a test's kill -9, a stop) leaves the lock behind,
after which every login waits 60 s (PYENV_REHASH_TIMEOUT) until someone deletes it. Nodes of a real cluster log in
with their own files on their own CPUs."""

_USER_KEY = "id_ed25519"


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
    slurm_conf: Path | None = None
    """With `up(..., slurm=True)`: the slurm.conf of its SLURM cluster (`SLURM_CONF=` this); else None."""


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
    master_port: int = DEFAULT_MASTER_PORT,
    script: str = "train/ddp.py",
    script_args: Sequence[str] = (),
    unresolvable: Mapping[int, Iterable[int]] | None = None,
    self_loopback_trap: Iterable[int] = (),
    python_override: Mapping[int, str] | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 10.0,
    slurm: bool = False,
    slurm_timeout: float = 30.0,
    login_rc: str | None = None,
    node_env: Mapping[int, Mapping[str, str]] | None = None,
) -> Sandbox:
    """Start `nodes` sshd servers and write their keys, ssh config and inventory; return once all accept TCP.
    With `slurm`, also a SLURM cluster on them (munged, slurmctld, a slurmd in each node's namespaces), returned
    once sinfo shows every node idle (within `slurm_timeout` s); reach it with `slurm_env(state_dir)`.

    Faults for tests: `unresolvable` {i: [j, ...]} leaves node j out of node i's /etc/hosts; `self_loopback_trap`
    [i, ...] maps node i's own name to 127.0.1.1 on node i; `python_override` {i: path} gives node i another
    interpreter in the inventory. `env`: the inventory's environment for torchrun on every node. Nothing is left
    running when it raises.

    `login_rc`: what the nodes' logins read as ~/.bashrc (each node its own file), in place of this machine's (the
    bench's nodes: a root .bashrc that runs `pyenv init` takes a lock that concurrent logins wait on in 0.1 s steps).
    `node_env` {i: {NAME: path}}: more of node i's sessions' environment (a container runtime's own storage).
    """
    hidden = {i: set(js) for i, js in (unresolvable or {}).items()}
    trap, overrides = set(self_loopback_trap), dict(python_override or {})
    _check_request(nodes, ssh_port, {*hidden, *(j for js in hidden.values() for j in js), *trap, *overrides})
    addrs = node_addresses(base_addr, nodes)
    unshare = start.require_tools()
    if slurm:
        slurm_cluster.require_tools()
    state_dir, inventory = Path(state_dir).absolute(), Path(inventory).absolute()
    config_path(state_dir)
    inventory_text = render_inventory(ssh_config=state_dir / "ssh_config", names=[node_name(i) for i in range(nodes)],
                                      python=python or start.default_python(),
                                      workdir=Path(workdir).absolute() if workdir else REPO_ROOT,
                                      nproc_per_node=nproc_per_node, master_port=master_port, script=script,
                                      script_args=script_args, python_override=overrides, env=env)
    state_dir.mkdir(parents=True, exist_ok=True)
    with statefile.locked(state_dir):
        _clear_stale(state_dir)
        identity, known_hosts, ssh_config = _write_client_files(state_dir, addrs, ssh_port)
        commands = [_write_node_files(state_dir, i, addrs, ssh_port, hidden.get(i, ()), i in trap, unshare, login_rc,
                                      (node_env or {}).get(i, {})) for i in range(nodes)]
        started, records, cluster = _start_nodes(state_dir, commands, addrs, ssh_port, ready_timeout,
                                                 slurm_timeout if slurm else None)
        _keep(state_dir, inventory, inventory_text, started, (records, ssh_config, known_hosts, identity, cluster))
    return load(state_dir)


def _keep(state_dir: Path, inventory: Path, text: str, started: Any, state: tuple[Any, ...]) -> None:
    """Write the inventory and the state file (records, ssh config, known hosts, identity, SLURM cluster); on any
    failure, Ctrl-C included, stop what started: nothing half-started stays behind."""
    records, ssh_config, known_hosts, identity, cluster = state
    try:
        inventory.parent.mkdir(parents=True, exist_ok=True)
        inventory.write_text(text, encoding="utf-8")
        statefile.write(state_dir, records, ssh_config, known_hosts, identity, inventory, cluster)
    except BaseException:
        if cluster is not None:
            slurm_cluster.stop(cluster)
        _stop_started(started)
        raise


def _check_request(nodes: int, ssh_port: int, indices: Iterable[int]) -> None:
    """A sandbox of 1 to SANDBOX_MAX_NODES nodes on a real port, whose faults name nodes it has."""
    if not 1 <= nodes <= SANDBOX_MAX_NODES:
        raise SandboxError(f"a sandbox has 1 to {SANDBOX_MAX_NODES} nodes, got {nodes}.")
    if not 1 <= ssh_port <= 65535:
        raise SandboxError(f"ssh port must be 1..65535, got {ssh_port}.")
    _check_indices(nodes, indices)


def _start_nodes(state_dir: Path, commands: Sequence[list[str]], addrs: Sequence[str], ssh_port: int,
                 ready_timeout: float, slurm_timeout: float | None,
                 ) -> tuple[list[subprocess.Popen[bytes]], list[dict[str, Any]], dict[str, Any] | None]:
    """Start every node's sshd (and, given `slurm_timeout`, the SLURM cluster on them): the processes, their
    records, the cluster's. Nothing is left running when it raises."""
    started: list[subprocess.Popen[bytes]] = []
    cluster: dict[str, Any] | None = None
    try:
        for i, argv in enumerate(commands):
            started.append(start.start_node(state_dir / node_name(i), argv))
        start.wait_ready(state_dir, addrs, ssh_port, started, ready_timeout)
        records = [{"name": node_name(i), "addr": addr, "port": ssh_port, "pid": p.pid,
                    "start_time": procs.start_time(p.pid)}
                   for i, (addr, p) in enumerate(zip(addrs, started, strict=True))]
        if slurm_timeout is not None:
            homes = [(r["name"], r["addr"], (r["pid"], r["start_time"])) for r in records]
            cluster = slurm_cluster.start(state_dir, homes, slurm_timeout)
    except BaseException:  # Ctrl-C included: nothing half-started stays behind
        _stop_started(started)
        raise
    return started, records, cluster


def load(state_dir: Path = DEFAULT_STATE_DIR) -> Sandbox:
    """The sandbox recorded in `state_dir` (its processes may have died since; see `running`)."""
    state = statefile.read(Path(state_dir).absolute())
    cluster = state.get("slurm")  # absent in the state files of sandboxes without SLURM, and of older versions
    return Sandbox(
        state_dir=Path(state["state_dir"]),
        nodes=tuple(SandboxNode(n["name"], n["addr"], n["port"], n["pid"]) for n in state["nodes"]),
        ssh_config=Path(state["ssh_config"]),
        known_hosts=Path(state["known_hosts"]),
        identity_file=Path(state["identity_file"]),
        inventory=Path(state["inventory"]),
        slurm_conf=Path(cluster["conf"]) if cluster else None,
    )


def down(state_dir: Path = DEFAULT_STATE_DIR) -> list[str]:
    """Stop every node of the sandbox in `state_dir` (its SLURM cluster first, if any) and forget it; one line per
    node and SLURM daemon says what was done."""
    state_dir = Path(state_dir).absolute()
    if not statefile.exists(state_dir):
        return [f"no sandbox is up in {state_dir}; nothing to stop."]
    with statefile.locked(state_dir):
        if not statefile.exists(state_dir):  # another `down` won the race
            return [f"no sandbox is up in {state_dir}; nothing to stop."]
        state = statefile.read(state_dir)
        lines = _stop_cluster(state)  # first: its slurmds live in the nodes' namespaces
        lines += _stop_records(state["nodes"])
        statefile.remove(state_dir)
    return lines


def stop_node(state_dir: Path, index: int) -> None:
    """Stop node `index`'s sshd (and its sessions, and its slurmd with its job steps) to simulate a dead node;
    the others keep running."""
    state_dir = Path(state_dir).absolute()
    with statefile.locked(state_dir):
        state = statefile.read(state_dir)
        records = state["nodes"]
        if not 0 <= index < len(records):
            raise SandboxError(f"the sandbox in {state_dir} has no node {index} (it has {len(records)}).")
        _stop_cluster(state, [records[index]["name"]])
        _stop_records([records[index]])


def running(state_dir: Path = DEFAULT_STATE_DIR) -> dict[str, bool]:
    """Node name -> whether its sshd listener is alive; empty when no sandbox is recorded in `state_dir`."""
    state_dir = Path(state_dir).absolute()
    if not statefile.exists(state_dir):
        return {}
    return {r["name"]: _is_our_sshd(r) for r in statefile.read(state_dir)["nodes"]}


# ---------------------------------------------------------------------------------------------------------
# Files: keys and configs (the record of what runs: statefile).


def _check_indices(nodes: int, indices: Iterable[int]) -> None:
    bad = sorted(i for i in indices if not 0 <= i < nodes)
    if bad:
        raise SandboxError(f"fault options name node {bad[0]}, but the sandbox has nodes 0..{nodes - 1}.")


def _clear_stale(state_dir: Path) -> None:
    if not statefile.exists(state_dir):
        return
    state = statefile.read(state_dir)
    records = state["nodes"]
    alive = [r["name"] for r in records if _is_our_sshd(r)]
    if alive:
        raise SandboxError(
            f"a sandbox is already up in {state_dir} ({len(alive)} of {len(records)} nodes running);"
            " stop it first with `inv sandbox.down`."
        )
    _stop_cluster(state)  # a SLURM daemon may outlive the nodes; stopped only if still ours
    _stop_records(records)  # its listeners are gone; this only reaps what this process started
    statefile.remove(state_dir)


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
    login_rc: str | None = None,
    env: Mapping[str, str] | None = None,
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
            env or {},
        ),
        encoding="utf-8",
    )
    hosts.write_text(render_hosts(index, addrs, unresolvable=hidden, loopback_trap=trap), encoding="utf-8")
    (folder / "sshd.pid").unlink(missing_ok=True)  # readiness waits for sshd to write it afresh
    if index == 0:  # the configs differ only in paths: checking one catches a bad template cheaply
        check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise SandboxError(f"sshd rejects {config}: {start.last_lines(check.stderr)}")
    own_rc = None
    bashrc = Path("~/.bashrc").expanduser()
    if login_rc is not None and bashrc.exists():  # a bind mount needs a file to cover
        (folder / "bashrc").write_text(login_rc, encoding="utf-8")
        own_rc = (folder / "bashrc", bashrc)
    return node_command(node_name(index), hosts, config, unshare, own_rc)


# ---------------------------------------------------------------------------------------------------------
# Stopping: only the processes we started, recognized by pid, start time and executable.


def _is_our_sshd(record: Mapping[str, Any]) -> bool:
    start.reap()
    return procs.alive(record["pid"], record["start_time"]) and procs.exe(record["pid"]) == SSHD


def _stop_records(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Stop the recorded listeners that are still ours, and their families; one line per node."""
    labels = {r["pid"]: f"{r['name']} ({r['addr']}:{r['port']}, pid {r['pid']})" for r in records}
    lines: dict[int, str] = {}
    listeners: list[tuple[int, int]] = []
    for r in records:
        if _is_our_sshd(r):
            listeners.append((r["pid"], r["start_time"]))
            lines[r["pid"]] = "stopped"
        elif procs.alive(r["pid"], r["start_time"]):
            lines[r["pid"]] = "left alone: that pid is no longer the sandbox's sshd"
        else:
            lines[r["pid"]] = "already stopped"
    killed = stop_families(listeners)
    start.reap()
    return [f"{labels[pid]}: {what}" + (" (needed SIGKILL)" if pid in killed else "") for pid, what in lines.items()]


def _stop_cluster(state: Mapping[str, Any], nodes: Sequence[str] | None = None) -> list[str]:
    """Stop the SLURM cluster recorded in `state` (only the slurmds of `nodes`, if given); none: no lines."""
    cluster = state.get("slurm")
    return slurm_cluster.stop(cluster, nodes) if cluster else []


def _stop_started(started: Sequence[subprocess.Popen[bytes]]) -> None:
    """Stop nodes this call just started (they may not have exec'd sshd yet, so no executable check)."""
    stop_families([(p.pid, procs.start_time(p.pid)) for p in started if p.poll() is None])
    start.forget(started)
