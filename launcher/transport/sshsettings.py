"""How the launcher's SSH connections are made beyond what a user sets (`launcher.settings.SshSettings`, one value
every caller of `transport` passes whole): the ciphers asked for, how often an idle connection's thread wakes."""

from __future__ import annotations

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
