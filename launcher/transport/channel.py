"""One running command on a node's SSH connection (a Paramiko channel): its stdin written without ever blocking
the caller past a bound, its stdout and stderr read as they come, its exit code; and a bounded `exec` (Paramiko's
own waits without limit on a node whose sshd stopped answering)."""

from __future__ import annotations

import contextlib
import select
import selectors
import threading
import time
from dataclasses import dataclass
from typing import Any

import paramiko

from launcher.limits import SEND_LOCK_WAIT as _SEND_LOCK_WAIT


@dataclass
class Result:
    """What a finished remote command gave back."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: float | None = None
    """The limit (seconds) it ran past without ending, if it did (exit_code is then -1)."""


class ExecTimeout(TimeoutError):
    """The node's sshd did not open a session, or start a command, within the connect timeout."""

    def __init__(self, node: str, what: str, seconds: float):
        super().__init__(f"{node}: the node's sshd did not {what} within {seconds:g} s")
        self.what, self.seconds = what, seconds


def _exec(chan: paramiko.Channel, command: str, timeout: float, node: str) -> None:
    """`chan.exec_command(command)`, waiting at most `timeout` for the server's answer.

    Paramiko's own exec_command waits on its event with no limit; this sends the same request and waits with one.
    """
    message = paramiko.Message()
    message.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
    message.add_int(chan.remote_chanid)
    message.add_string("exec")
    message.add_boolean(True)
    message.add_string(command)
    raw: Any = chan  # Paramiko's own steps of exec_command, which are no public API (nor typed)
    raw._event_pending()
    raw.transport._send_user_message(message)
    if not chan.event.wait(timeout):
        chan.close()
        raise ExecTimeout(node, "start the command", timeout)
    if not chan.event_ready:
        raise raw.transport.get_exception() or paramiko.SSHException("Channel closed.")


def _writable(sock: Any) -> bool:
    """True when `sock` takes data now: a socket, or under a ProxyJump the jump host's channel and its own socket."""
    if isinstance(sock, paramiko.Channel):
        transport = sock.get_transport()
        return (
            not sock.closed
            and not sock.eof_sent
            and sock.send_ready()
            and transport is not None
            and _writable(transport.sock)
        )
    try:
        poller = select.poll()
        poller.register(sock, select.POLLOUT)
        return any(event & select.POLLOUT for _, event in poller.poll(0))
    except (OSError, ValueError, TypeError):
        return False


class Channel:
    """One running remote command: write to its stdin, read its stdout/stderr as they come, get its exit code."""

    def __init__(self, node: str, chan: paramiko.Channel):
        self.node = node
        self._chan = chan
        self._send_lock = threading.Lock()
        self._drained = False

    def send(self, data: bytes, block: bool = True, timeout: float | None = None) -> bool:
        """Write to the command's stdin; False when the channel is already gone, or (`timeout`) the node took none of
        the data for that many seconds (a node whose disk hung stops reading).

        With `block=False` it never waits on the node (heartbeats, stop words): it sends only when all of `data`
        goes at once (paramiko's `send_ready()` and the window, no key exchange under way, the socket writable)
        and returns False otherwise. It waits at most a moment for another send on this channel to end, so that
        words are never cut into each other, and gives up if that one is stuck.
        """
        if not self._send_lock.acquire(timeout=-1 if block else _SEND_LOCK_WAIT):
            return False
        try:
            if self._chan.eof_sent:  # after close_stdin Paramiko's sendall spins on 0 bytes until the channel closes
                return False
            if block:
                self._chan.settimeout(timeout)  # Paramiko waits for window space at most this long
                try:  # a view: Paramiko's sendall slices what is left after each packet, a copy of it for bytes
                    self._chan.sendall(memoryview(data))  # type: ignore[arg-type]  # its stub: bytes; any buffer
                finally:
                    self._chan.settimeout(None)
                return True
            return self._takes_now(len(data)) and self._chan.send(data) == len(data)
        except (OSError, EOFError, paramiko.SSHException):
            return False
        finally:
            self._send_lock.release()

    def _takes_now(self, size: int) -> bool:
        """True when `size` bytes go out in one packet without waiting for the window, a rekey or the socket."""
        chan = self._chan
        transport = chan.get_transport()
        if chan.closed or transport is None or not transport.is_active() or not chan.send_ready():
            return False  # send_ready() is also True on a closed channel: "a send would fail at once"
        return (
            size <= min(chan.out_window_size, chan.out_max_packet_size - 64)  # Paramiko's own cut
            and transport.clear_to_send.is_set()
            and _writable(transport.sock)
        )

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self._chan.shutdown_write()

    def wait_readable(self, timeout: float) -> None:
        """Block until there is output, the command ended, or `timeout` passed.

        Through `selectors` (epoll/poll), not `select.select`, which refuses a descriptor above 1024: each channel
        holds a pipe of its own, so ~330 nodes would get there.
        """
        with selectors.DefaultSelector() as selector:
            selector.register(self._chan, selectors.EVENT_READ)
            selector.select(timeout)

    def read(self) -> tuple[bytes, bytes]:
        """Whatever stdout and stderr hold now (empty when nothing new); `drained` then says if that is all."""
        gone = self.closed  # before the read: what came before the close is in the buffers by now
        out = self._chan.recv(1 << 16) if self._chan.recv_ready() else b""
        err = self._chan.recv_stderr(1 << 16) if self._chan.recv_stderr_ready() else b""
        self._drained = gone and not out and not err
        return out, err

    @property
    def drained(self) -> bool:
        """True when the connection was gone before the last read and that read found nothing: no more output
        will come. (`closed` seen after an empty read is not that: output may have come with the close between
        the read and the look, and would be dropped.)"""
        return self._drained

    def read_line(self, out: bytearray, err: bytearray, deadline: float) -> bool:
        """Read into `out` and `err` until `out` holds a whole line (True), or the command ended, the connection
        went or `deadline` (monotonic) passed first (False)."""
        while b"\n" not in out:
            o, e = self.read()
            out += o
            err += e
            if o or e:
                continue
            left = deadline - time.monotonic()
            if self.finished or self.drained or left <= 0:
                return False
            self.wait_readable(min(0.2, left))
        return True

    @property
    def finished(self) -> bool:
        """True once the command exited and all its output has been read.

        sshd may send the exit status before the last data: only the end of the stream (EOF, or the channel
        closing) says nothing more is coming.
        """
        chan = self._chan
        return bool(
            chan.exit_status_ready()
            and (chan.eof_received or chan.closed)
            and not chan.recv_ready()
            and not chan.recv_stderr_ready()
        )

    @property
    def output_ended(self) -> bool:
        """The command's stdout and stderr have ended (sshd said EOF), whether or not it has exited yet."""
        return bool(self._chan.eof_received)

    @property
    def closed(self) -> bool:
        """True when the connection under the channel is gone (the node dropped off)."""
        transport = self._chan.get_transport()
        return self._chan.closed or transport is None or not transport.is_active()

    def exit_code(self) -> int:
        """The command's exit status; -1 when the connection broke before it said."""
        return self._chan.recv_exit_status() if self._chan.exit_status_ready() else -1

    def collect(self, timeout: float | None = None) -> Result:
        """Read everything until the command ends; on timeout the result has exit code -1."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        while True:
            o, e = self.read()
            out += o
            err += e
            if self.finished:
                o, e = self.read()
                return Result(self.exit_code(), bytes(out + o), bytes(err + e))
            if self.drained:
                return Result(-1, bytes(out), bytes(err))
            if deadline is not None and time.monotonic() > deadline:
                return Result(-1, bytes(out), bytes(err), timed_out=timeout)
            if not o and not e:
                self.wait_readable(0.2)

    def close(self) -> None:
        self._chan.close()
