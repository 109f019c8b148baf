"""Host keys as OpenSSH checks them: the user's and the global known_hosts files, `@revoked`, HostKeyAlias,
hashed names and wildcards, strict or accept-new. Part of the transport layer (with `sshconfig` and `transport`).
"""

from __future__ import annotations

import fcntl
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from launcher.transport.sshconfig import SSHTarget
from launcher.transport.sshsettings import PREFERRED_CIPHERS


@dataclass(frozen=True)
class _KnownKey:
    """A key that a known_hosts file records for a host, and where (`file:line`)."""

    key: paramiko.PKey
    where: str


@dataclass(frozen=True)
class KnownHosts:
    """What the known_hosts files say about one host, each line with its `file:line`."""

    keys: tuple[_KnownKey, ...] = ()
    """Its host keys: one of them must be the key it offers."""
    revoked: tuple[_KnownKey, ...] = ()
    """`@revoked` keys: never accepted, for any host the line names."""
    authorities: tuple[str, ...] = ()
    """`@cert-authority` lines naming the host (where): host certificates are not checked here."""


def known_hosts(target: SSHTarget) -> KnownHosts:
    """Every line recorded for the target, in the user's known_hosts files and then the global ones, as ssh reads
    them, under the name ssh looks it up by (`key_name`: HostKeyAlias, or host[:port]).

    Nothing here goes into Paramiko's own host-key stores, so nothing from a global file can ever be saved into the
    user's file.
    """
    name = key_name(target)
    keys: list[_KnownKey] = []
    revoked: list[_KnownKey] = []
    authorities: list[str] = []
    for path in (*target.known_hosts_files, *target.global_known_hosts_files):
        try:
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines, 1):
            parts = line.split()  # OpenSSH takes any run of blanks between fields; Paramiko one space or tab
            marker = parts[0] if parts and parts[0].startswith("@") else None
            if marker:
                parts = parts[1:]
            if not parts or parts[0].startswith("#") or marker not in (None, "@revoked", "@cert-authority"):
                continue
            if not _host_matches(parts[0].split(","), name):  # names first: a global file may hold thousands
                continue
            where = f"{path}:{number}"
            if marker == "@cert-authority":
                authorities.append(where)
                continue
            try:
                entry = paramiko.hostkeys.HostKeyEntry.from_line(" ".join(parts))
            except (paramiko.SSHException, ValueError):
                continue
            if entry is not None:
                (revoked if marker == "@revoked" else keys).append(_KnownKey(entry.key, where))
    return KnownHosts(tuple(keys), tuple(revoked), tuple(authorities))


def _known_keys(target: SSHTarget) -> list[_KnownKey]:
    """The host keys recorded for the target (see `known_hosts`)."""
    return list(known_hosts(target).keys)


def _host_matches(patterns: Sequence[str], name: str) -> bool:
    """OpenSSH's rule for a known_hosts name list: hashed names, `*` and `?` wildcards, and `!` vetoes the line."""
    name = name.lower()
    matched = False
    for pattern in patterns:
        if pattern.startswith("|1|"):
            matched = matched or paramiko.HostKeys.hash_host(name, pattern) == pattern
            continue
        regex = re.escape(pattern.removeprefix("!").lower()).replace(r"\*", ".*").replace(r"\?", ".")
        if re.fullmatch(regex, name):
            if pattern.startswith("!"):
                return False
            matched = True
    return matched


class _HostKeyChanged(paramiko.BadHostKeyException):
    """The host offered a key that no known_hosts file vouches for, while `where` records another one."""

    def __init__(self, hostname: str, got: paramiko.PKey, expected: _KnownKey):
        super().__init__(hostname, got, expected.key)
        self.where = expected.where


class HostKeyRevoked(paramiko.SSHException):
    """The host offered a key that a known_hosts file marks `@revoked` (OpenSSH: REVOKED HOST KEY DETECTED)."""

    def __init__(self, name: str, key: paramiko.PKey, where: str):
        super().__init__(f"the {key.get_name()} host key for {name} is marked as revoked ({where})")
        self.where = where


class HostKeyUnknown(paramiko.SSHException):
    """No known_hosts file records the host (under the name ssh looks it up by)."""

    def __init__(self, name: str, authorities: Sequence[str]):
        super().__init__(f"Server {name!r} not found in known_hosts")
        self.name = name
        self.authorities = tuple(authorities)


class _KnownHostsPolicy(paramiko.RejectPolicy):
    """OpenSSH's check against the user's and the global known_hosts files: a key marked `@revoked` is refused
    whatever else says; the host is let in when any file records the key it offers; a host recorded with other keys
    only is refused as changed, an unknown one as unknown. Keys are looked up under `name` (`key_name`).

    Paramiko's own check consults only one file set (global keys hide the user's) and is never given any key here:
    this policy decides every connection.
    """

    def __init__(self, known: KnownHosts, name: str):
        self.known = known
        self.name = name

    # RejectPolicy's stub says it never returns; this one returns for a key the known_hosts files record.
    def missing_host_key(  # type: ignore[override]
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        bad = next((k for k in self.known.revoked if k.key == key), None)
        if bad is not None:
            raise HostKeyRevoked(self.name, key, bad.where)
        if any(k.key == key for k in self.known.keys):
            return
        if self.known.keys:
            same_type = [k for k in self.known.keys if k.key.get_name() == key.get_name()]
            raise _HostKeyChanged(self.name, key, (same_type or list(self.known.keys))[0])
        self.unknown_host(client, self.name, key)

    def unknown_host(self, client: paramiko.SSHClient, name: str, key: paramiko.PKey) -> None:
        raise HostKeyUnknown(name, self.known.authorities)


class _AcceptNewPolicy(_KnownHostsPolicy):
    """OpenSSH's `accept-new`: as strict, except that a host no file knows has its key learnt once, into the user's
    first known_hosts file, under the name ssh would write (HostKeyAlias, or host[:port]); a host that any file (a
    global one included) records with another key, or a revoked key, is still refused."""

    _lock = threading.Lock()

    def __init__(self, known: KnownHosts, name: str, known_hosts: str):
        super().__init__(known, name)
        self.known_hosts = known_hosts

    def unknown_host(self, client: paramiko.SSHClient, name: str, key: paramiko.PKey) -> None:
        line = f"{name} {key.get_name()} {key.get_base64()}\n"
        Path(self.known_hosts).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with self._lock, open(self.known_hosts, "a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # other launchers may be learning keys at the same moment
            f.write(line)


def policy_for(target: SSHTarget, host_key_policy: str) -> tuple[_KnownHostsPolicy, KnownHosts]:
    """The host key policy of one connection, and what the known_hosts files say of the host."""
    known = known_hosts(target)
    if host_key_policy == "accept-new" and target.known_hosts_files:
        return _AcceptNewPolicy(known, key_name(target), target.known_hosts_files[0]), known
    return _KnownHostsPolicy(known, key_name(target)), known  # strict, or accept-new with nowhere to learn into


def host_key_order(known: Sequence[_KnownKey]) -> Callable[..., paramiko.Transport]:
    """A Transport factory that asks the server for the key types known for it first, as OpenSSH orders
    HostKeyAlgorithms (Paramiko does it only for keys in its own stores, which stay empty here), and for the
    ciphers of PREFERRED_CIPHERS before Paramiko's own order."""
    types = {k.key.get_name() for k in known}

    def plain(algorithm: str) -> str:
        algorithm = algorithm.removesuffix("-cert-v01@openssh.com")
        return "ssh-rsa" if algorithm.startswith("rsa-sha2-") else algorithm

    def make(sock: Any, **kwargs: Any) -> paramiko.Transport:
        transport = paramiko.Transport(sock, **kwargs)
        options = transport.get_security_options()
        options.key_types = sorted(options.key_types, key=lambda algorithm: plain(algorithm) not in types)
        options.ciphers = sorted(options.ciphers, key=lambda cipher: cipher not in PREFERRED_CIPHERS)
        return transport

    return make


def key_name(target: SSHTarget) -> str:
    """The name ssh looks the host's key up by, and learns it under: HostKeyAlias as written, else host[:port]."""
    if target.host_key_alias:
        return target.host_key_alias
    return target.hostname if target.port == 22 else f"[{target.hostname}]:{target.port}"
