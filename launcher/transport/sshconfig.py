"""How OpenSSH would reach a host: its ssh config applied by `ssh -G` (Include, Match), and ProxyJump hops.

Part of the transport layer (with `hostkeys` and `transport`): nothing here opens a connection.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import paramiko

from launcher.config.model import Host
from launcher.errors import LauncherError

SSH_G_TIMEOUT = 10.0
"""Seconds `ssh -G` may take to print a host's config (it reads files, resolves nothing)."""
MAX_JUMP_DEPTH = 8
"""ProxyJump hops followed through jump hosts' own ProxyJump, at most (a config that loops would never end)."""


@dataclass(frozen=True)
class SSHTarget:
    """How to reach one host, as OpenSSH itself would (its config already applied)."""

    name: str
    hostname: str
    port: int = 22
    user: str | None = None
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    known_hosts_files: tuple[str, ...] = ()
    """The user's known_hosts files (`UserKnownHostsFile`); accept-new learns into the first."""
    global_known_hosts_files: tuple[str, ...] = ()
    """`GlobalKnownHostsFile` (by default /etc/ssh/ssh_known_hosts and ssh_known_hosts2): trusted, never written."""
    server_alive_interval: float = 0.0
    """`ServerAliveInterval`: seconds between keepalives, 0 for none."""
    proxy_jump: str | None = None
    """`ProxyJump` as written: hops `[user@]host[:port]`, comma-separated, the first one reached first."""
    explicit_identity: str | None = None
    """The inventory's identity_file, which must exist (unlike ssh's default candidates)."""
    host_key_alias: str | None = None
    """`HostKeyAlias`: the name the host's key is looked up and learnt under, instead of host[:port]."""


def resolve_target(host: Host, ssh_config: str | None) -> SSHTarget:
    """Resolve an inventory host through ssh config, never through local DNS.

    OpenSSH's `ssh -G` applies the config exactly as `ssh` would (Include, Match, wildcards), which Paramiko's
    own parser does not; without an `ssh` binary we fall back to Paramiko's parser.
    """
    args = ["ssh", "-G"]
    if ssh_config:
        args += ["-F", os.path.expanduser(ssh_config)]
    if host.user:
        args += ["-l", host.user]
    if host.port:
        args += ["-p", str(host.port)]
    args += ["--", host.name]
    options: dict[str, list[str]] = {}
    if shutil.which("ssh"):
        out = subprocess.run(args, capture_output=True, text=True, timeout=SSH_G_TIMEOUT, check=False)
        if out.returncode == 0:
            for line in out.stdout.splitlines():
                key, _, value = line.partition(" ")
                options.setdefault(key.lower(), []).append(value)
    if not options:
        options = _paramiko_options(host.name, ssh_config)

    def first(key: str, default: str | None = None) -> str | None:
        return options.get(key, [default])[0]

    def files(key: str, default: str) -> tuple[str, ...]:
        paths = (p for v in options.get(key, [default]) for p in v.split())
        return tuple(os.path.expanduser(p) for p in paths if p.lower() != "none")

    jump = first("proxyjump")
    alias = first("hostkeyalias")
    identity = os.path.expanduser(host.identity_file) if host.identity_file else None
    identities = tuple(os.path.expanduser(p) for p in options.get("identityfile", []))
    return SSHTarget(
        name=host.name,
        hostname=first("hostname", host.name) or host.name,
        port=host.port or int(first("port", "22") or 22),
        user=host.user or first("user"),
        identity_files=((identity,) if identity else ()) + identities,
        identities_only=(first("identitiesonly", "no") or "no").lower() == "yes",
        known_hosts_files=files("userknownhostsfile", "~/.ssh/known_hosts"),
        global_known_hosts_files=files("globalknownhostsfile", "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"),
        server_alive_interval=_seconds(first("serveraliveinterval", "0")),
        proxy_jump=None if jump in (None, "none") else jump,
        explicit_identity=identity,
        host_key_alias=None if alias in (None, "none") else alias,
    )


def _seconds(value: str | None) -> float:
    """`ssh -G` prints intervals in whole seconds; anything else (Paramiko's parser keeps '1m') counts as none."""
    try:
        return max(0.0, float(value or 0))
    except ValueError:
        return 0.0


def _paramiko_options(name: str, ssh_config: str | None) -> dict[str, list[str]]:
    path = Path(os.path.expanduser(ssh_config or "~/.ssh/config"))
    if not path.exists():
        return {}
    found = paramiko.SSHConfig.from_path(str(path)).lookup(name)
    return {k.lower(): (v if isinstance(v, list) else [str(v)]) for k, v in found.items()}


@dataclass(frozen=True)
class Hop:
    """One ProxyJump hop as written: `[user@]host[:port]` or `ssh://[user@]host[:port]`."""

    host: str
    user: str | None = None
    port: int | None = None


_HOP = re.compile(
    r"^(?:ssh://)?(?:(?P<user>[^@\s]+)@)?(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:@\s/\[\]]+))"
    r"(?::(?P<port>\d+))?/?$"
)


def parse_jumps(spec: str) -> list[Hop]:
    """ProxyJump's hops, in the order they are reached (as `ssh -J a,b`: a first, then b through a)."""
    hops = []
    for word in spec.split(","):
        found = _HOP.match(word.strip())
        if not found or (found["port"] and not 0 < int(found["port"]) < 65536):
            raise LauncherError(f"ProxyJump {spec!r}: cannot read the hop {word.strip()!r} (want [user@]host[:port])")
        hops.append(Hop(found["v6"] or found["host"], found["user"], int(found["port"]) if found["port"] else None))
    return hops


def hop_target(hop: Hop, ssh_config: str | None) -> SSHTarget:
    """A hop resolved through the ssh config, as `ssh -J` resolves it (its user and port as written win)."""
    return resolve_target(
        Host(name=hop.host, addr="", python="", workdir="", nproc_per_node=1, user=hop.user, port=hop.port), ssh_config
    )
