"""How the launcher reaches its nodes over SSH: one value, `SshSettings`, that every caller of `transport` passes whole
(`SshSettings.of(opts)` from the user's options)."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.options import DEFAULT_CONNECT_TIMEOUT, Options

DEFAULT_FANOUT = 64
"""At most this many SSH handshakes (and short node commands: stop, status, logs) under way at once; more nodes go
in waves. Measured on the 64-node sandbox (bench/results, `fanout`): connecting to all 64 nodes took 1.7-1.9 s and
0.5-0.6 CPU s of the launcher whatever the limit from 16 to 64 (2.0 s at 8, 2.3-2.5 s at 4), so a lower limit
buys nothing on the controller. A lower one is for what sits in between: a ProxyJump host whose sshd refuses
handshakes beyond its `MaxStartups` (10 by default)."""

PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
"""Asked for before Paramiko's own first choice (aes128-ctr with hmac-sha2-256): AES-GCM encrypts and authenticates
a packet in one call into OpenSSL, where CTR then HMAC is two, on the controller and on the node's sshd. Measured
here, 100 MB through one channel to a sandbox sshd: 0.29-0.31 CPU s of the launcher and 0.6-0.85 s against 0.36-0.41
and 1.1-1.26 s. OpenSSH offers both since 6.2; a server without them gets Paramiko's order."""

IDLE_POLL_S = 1.0
"""How often each connection's Paramiko thread wakes once the connection is made (Paramiko's own is 0.1 s, needed
for its handshake's timeouts): each wake-up only looks whether the connection was closed, and cost 0.30 ms of
CPU, so a controller holding 256 idle connections spent 8% of a core on nothing. A close is then seen by that
thread up to this much later (the socket is closed at once); keepalives are whole seconds."""


@dataclass(frozen=True)
class SshSettings:
    """How every connection of one task is made."""

    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    """Seconds for each node's TCP connect, SSH handshake and authentication (fractions kept)."""
    keepalive: float | None = None
    """Seconds between SSH keepalives; None takes the ssh config's `ServerAliveInterval`, 0 sends none."""
    fanout: int = DEFAULT_FANOUT
    """At most this many handshakes (and short node commands) under way at once."""

    @classmethod
    def of(cls, opts: Options) -> SshSettings:
        """A task's settings from the user's options (an attached run's add keepalives: `launcher.run.launch`)."""
        return cls(opts.connect_timeout)


DEFAULT_SSH = SshSettings()
"""The settings a caller that names none gets (immutable: one value serves them all)."""
