"""Pure text of the sandbox: node names and addresses, sshd/ssh configs, known_hosts, /etc/hosts, the inventory."""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from devtools.sandbox.limits import SandboxError

SSHD = "/usr/sbin/sshd"
TRAP_ADDR = "127.0.1.1"
"""Where Debian's installer maps a machine's own hostname: peers can't reach it there."""

# Words that need no quoting in ssh/sshd config files; '%' would be read as a token, '~' as home.
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./@+,=-]*\Z")



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


def node_name(index: int) -> str:
    """The name of node `index`."""
    return f"node-{index}"


def node_addresses(base_addr: str, count: int) -> list[str]:
    """`count` consecutive loopback addresses from `base_addr` (network namespaces don't work here), past 127.0.0.1
    and 127.0.1.1: 256 nodes from the default 127.0.0.2 end at 127.0.1.2."""
    try:
        base = ipaddress.IPv4Address(base_addr)
    except ValueError:
        raise SandboxError(f"base address {base_addr!r} is not an IPv4 address.") from None
    loopback = ipaddress.IPv4Network("127.0.0.0/8")
    reserved = {ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv4Address(TRAP_ADDR)}  # localhost; Debian's own name
    addrs = []
    at = base
    while len(addrs) < count and at in loopback and at != loopback.broadcast_address:
        if at not in reserved:
            addrs.append(str(at))
        at += 1
    if base not in loopback or len(addrs) < count:
        raise SandboxError(f"{count} nodes from {base_addr} do not fit in 127.0.0.0/8; pick another base address.")
    return addrs


def node_cache(state_dir: Path, index: int) -> Path:
    """Node `index`'s XDG cache home: its run directories are under ddp-launcher/runs there."""
    return state_dir / node_name(index) / "cache"


def config_path(path: Path) -> str:
    """`path` as a word of an ssh/sshd config file; refused unless absolute and of plain characters."""
    text = str(path)
    if not _PLAIN_PATH.match(text):
        raise SandboxError(f"the sandbox's state folder must be an absolute path of plain characters, got {text!r}.")
    return text


def render_sshd_config(addr: str, port: int, host_key: Path, pid_file: Path, authorized_keys: Path,
                       cache_home: Path | None = None, env: Mapping[str, str] | None = None) -> str:
    """sshd_config of one node: root by key only, many sessions at once, quiet log, its own cache home (and `env`
    in its sessions' environment: paths, as the cache home)."""
    # The nodes share this machine's home; a cache folder of their own keeps each node's run directories
    # (~/.cache/ddp-launcher) apart, as on separate machines, so "the latest run" means this sandbox's.
    values = {**({"XDG_CACHE_HOME": str(cache_home)} if cache_home is not None else {}), **(env or {})}
    own_cache = [f"SetEnv {' '.join(f'{k}={config_path(Path(v))}' for k, v in values.items())}"] if values else []
    return "\n".join(
        [
            f"ListenAddress {addr}:{port}",
            *own_cache,
            f"HostKey {config_path(host_key)}",
            f"PidFile {config_path(pid_file)}",
            f"AuthorizedKeysFile {config_path(authorized_keys)}",
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
                f"    IdentityFile {config_path(identity_file)}",
                "    IdentitiesOnly yes",
                f"    UserKnownHostsFile {config_path(known_hosts)}",
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
    env: Mapping[str, str] | None = None,
) -> str:
    """The launcher inventory (YAML) for the sandbox; a node with its own python is written as a mapping, `env` as
    every node's `defaults.env`."""
    overrides = python_override or {}
    hosts: list[Any] = [
        {"name": name, "python": overrides[i]} if i in overrides else name for i, name in enumerate(names)
    ]
    data = {
        "ssh_config": str(ssh_config),
        "host_key_policy": "strict",
        "defaults": {"python": python, "workdir": str(workdir), "nproc_per_node": nproc_per_node,
                     **({"env": dict(env)} if env else {})},
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


def node_command(name: str, hosts_file: Path, sshd_config: Path, unshare: str = "unshare",
                 login_rc: tuple[Path, Path] | None = None) -> list[str]:
    """argv that runs sshd with its own hostname and /etc/hosts; unshare and sh exec, so the pid is sshd's.

    `login_rc` (the node's file, the login user's ~/.bashrc): the node's logins read its own instead."""
    rc = f" && mount --bind {shlex.quote(str(login_rc[0]))} {shlex.quote(str(login_rc[1]))}" if login_rc else ""
    script = (
        f"hostname {shlex.quote(name)}"
        f" && mount --bind {shlex.quote(str(hosts_file))} /etc/hosts{rc}"
        f" && exec {SSHD} -D -e -f {shlex.quote(str(sshd_config))}"
    )
    return [unshare, "--uts", "--mount", "--propagation", "private", "/bin/sh", "-c", script]
