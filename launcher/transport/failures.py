"""The typed SSH failures: whatever the SSH stack raised, as a one-line `NodeFailure` with its likely fix."""

from __future__ import annotations

import os
import shlex
import socket

import paramiko
from paramiko.ssh_exception import NoValidConnectionsError

from launcher.errors import NodeFailure
from launcher.transport.channel import ExecTimeout
from launcher.transport.hostkeys import HostKeyRevoked, HostKeyUnknown, key_name
from launcher.transport.sshconfig import SSHTarget


def classify(target: SSHTarget, exc: BaseException) -> NodeFailure:
    """Turn whatever the SSH stack raised into a one-line failure with the likely fix."""
    # Paramiko's own exceptions and the network's (OSError's) are apart: no class is both.
    failure = _ssh_failure(target, exc) or _network_failure(target, exc)
    return failure or NodeFailure(target.name, "ssh", f"{type(exc).__name__}: {exc}")


def _ssh_failure(target: SSHTarget, exc: BaseException) -> NodeFailure | None:
    """What the SSH server's side refused or never said: its host key (revoked, unknown, changed), its greeting,
    the user's keys; None for anything else."""
    where, name = f"{target.hostname}:{target.port}", target.name
    if isinstance(exc, HostKeyRevoked | HostKeyUnknown | paramiko.BadHostKeyException):
        return _host_key_failure(target, exc)
    # A server that accepts TCP but never completes the handshake: Paramiko says "banner" or, when its reader
    # thread gave up first, "No existing session".
    if isinstance(exc, paramiko.SSHException) and ("banner" in str(exc) or "No existing session" in str(exc)):
        return NodeFailure(
            name,
            "timeout",
            f"{where} accepted the connection but sent no SSH greeting in time",
            "is it an SSH server on that port, and is the node overloaded?",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        user = target.user or os.environ.get("USER", "you")
        return NodeFailure(
            name,
            "auth",
            f"{user}@{where} refused every key offered",
            "check `user` and `identity_file`, or run `ssh-copy-id` for that node",
        )
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return NodeFailure(
            name,
            "host-key-unknown",
            f"{where} is not in known_hosts (host_key_policy: strict)",
            f"check its fingerprint and run `ssh-keyscan -p {target.port} {target.hostname} >> "
            f"~/.ssh/known_hosts`, or set `host_key_policy: accept-new`",
        )
    return None


def _host_key_failure(
    target: SSHTarget, exc: HostKeyRevoked | HostKeyUnknown | paramiko.BadHostKeyException
) -> NodeFailure:
    """A host key the policy refused: revoked, unknown (strict), or another than known_hosts holds."""
    where, name = f"{target.hostname}:{target.port}", target.name
    if isinstance(exc, HostKeyRevoked):
        return NodeFailure(
            name,
            "host-key-revoked",
            f"REVOKED HOST KEY DETECTED: the host key of {where} is marked as revoked in {exc.where}: "
            "refusing to connect",
            "this could mean that a stolen key is being used to impersonate this host: ask the "
            "node's administrator (never remove the @revoked line to get in)",
        )
    if isinstance(exc, HostKeyUnknown):
        ca = (
            (
                f"; known_hosts trusts a certificate authority for it ({exc.authorities[0]}), which this launcher "
                "does not check"
            )
            if exc.authorities
            else ""
        )
        return NodeFailure(
            name,
            "host-key-unknown",
            f"{exc.name} is not in known_hosts (host_key_policy: strict)" + ca,
            f"check its fingerprint and run `ssh-keyscan -p {target.port} {target.hostname} >> "
            f"~/.ssh/known_hosts`, or set `host_key_policy: accept-new`",
        )
    line = getattr(exc, "where", "known_hosts")
    # `ssh-keygen -R` alone edits ~/.ssh/known_hosts: name the file that holds the line (UserKnownHostsFile,
    # GlobalKnownHostsFile), so the fix acts where the key is.
    file = line.rpartition(":")[0] if ":" in line else "~/.ssh/known_hosts"
    return NodeFailure(
        name,
        "host-key-changed",
        f"the host key of {where} differs from the one in {line}: refusing to connect",
        f"if the node was reinstalled, verify the new key and remove that line "
        f"(`ssh-keygen -f {shlex.quote(file)} -R {shlex.quote(key_name(target))}`)",
    )


def _network_failure(target: SSHTarget, exc: BaseException) -> NodeFailure | None:
    """What the network did: a name that does not resolve, a session that did not open in time, a refused
    connection, no answer, another OS error; None for anything else."""
    where, name = f"{target.hostname}:{target.port}", target.name
    if isinstance(exc, socket.gaierror):
        return NodeFailure(
            name,
            "unresolvable",
            f"cannot resolve {target.hostname!r}",
            "check the name, or give it a `HostName` in your ssh config or an address in the inventory",
        )
    if isinstance(exc, ExecTimeout):
        return NodeFailure(
            name,
            "timeout",
            f"{where} did not {exc.what} within {exc.seconds:g} s (connect_timeout)",
            "is the node overloaded or its sshd stuck? try `ssh` to it; raise --connect-timeout if it is only slow",
        )
    if isinstance(exc, NoValidConnectionsError | ConnectionRefusedError):
        return NodeFailure(
            name, "refused", f"connection refused by {where}", "is sshd running on the node, and is the port right?"
        )
    if isinstance(exc, socket.timeout | TimeoutError):
        return NodeFailure(
            name, "timeout", f"no answer from {where} in time", "is the node up, and does a firewall let you through?"
        )
    if isinstance(exc, OSError):
        return NodeFailure(
            name,
            "refused",
            f"cannot connect to {where}: {exc.strerror or exc}",
            "is the node up and the address right?",
        )
    return None
