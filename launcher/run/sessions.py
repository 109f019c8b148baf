"""Every node agent's session of one attached run: opened all at once, each read by a thread of its own into typed
events, and each kept sure that the launcher lives (heartbeats).

A session is a channel of the node's SSH connection by default, or whatever a `SessionOpener` gives (a task of one
srun step: `launcher/slurm/step.py`). Output goes straight to `on_event` from the reader threads, so consumers must
not block; every other event goes to `control`, where the run's handle takes them one at a time and decides.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from launcher.events import (
    Ended,
    EndKind,
    NodeEnd,
    NodeEvent,
    Output,
)
from launcher.limits import (
    EOF_GRACE_S,
    REATTACH_AFTER_BEATS,
    REATTACH_FIRST_S,
    REATTACH_MAX_S,
    STALL,
    heartbeat_interval,
)
from launcher.node.wire import ATTACH_REFUSED, HEARTBEAT, KILL, STOP, SUPERVISOR_GONE, message_line
from launcher.plan.launchplan import NodeCommand
from launcher.run.agentevents import HANDLERS as HANDLERS  # re-exported: the table of what each event name does
from launcher.run.agentevents import IGNORED as IGNORED
from launcher.run.agentevents import agent_line
from launcher.run.nodesession import Session as Session  # re-exported: the run's modules take it from here
from launcher.run.nodesession import SessionChannel, SessionOpener
from launcher.run.reattach import Reconnector
from launcher.settings import DEFAULT_FANOUT
from launcher.transport.connections import Node, classify
from launcher.transport.program import host_command, program_input

log = logging.getLogger(__name__)


class Sessions:
    """The run's sessions by node name, the queue their events go to, and the heartbeat thread."""

    def __init__(
        self,
        nodes: Mapping[str, Node],
        requests: Mapping[str, dict[str, Any]],
        agent_source: str,
        on_event: Callable[[NodeEvent], None],
        heartbeat_timeout: float | None,
        silence_timeout: float = 30.0,
        reconnector: Reconnector | None = None,
    ):
        self.nodes, self.requests, self.agent_source = nodes, requests, agent_source
        self.on_event = on_event
        self.reconnector = reconnector
        """New sessions to a node whose session ended before its run did (None under SLURM: srun owns the run)."""
        self.silence_timeout = silence_timeout
        self.reattach_after = REATTACH_AFTER_BEATS * heartbeat_interval(silence_timeout)
        self.by_name: dict[str, Session] = {}
        self.control: queue.Queue[NodeEvent] = queue.Queue()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._interval = heartbeat_interval(heartbeat_timeout)
        self._heartbeat = threading.Thread(target=self._beat, daemon=True, name="heartbeat")
        self.heartbeats = 0
        """Heartbeats sent so far (the trace counts them)."""

    def open(self, commands: Sequence[NodeCommand], opener: SessionOpener | None) -> list[str | None]:
        """Every node's session at once (heartbeats flow from the first); an error or None per command, in order."""
        self._heartbeat.start()
        if opener is not None:
            return self._open_with(opener, commands)
        with ThreadPoolExecutor(max_workers=min(DEFAULT_FANOUT, len(commands))) as pool:
            return list(pool.map(self._open_one, commands))  # every session open before any stop is sent

    def _open_one(self, command: NodeCommand) -> str | None:
        node = self.nodes[command.host.name]
        try:
            channel = node.open_channel(host_command(command.host))
        except Exception as exc:  # a closed connection, a session or command the node's sshd never started
            log.info("%s: no session: %s", command.host.name, classify(node.target, exc).detail)
            return classify(node.target, exc).detail
        # The program first, then the session is seen: once registered, other threads send it messages (a heartbeat, the
        # stop when another node's start failed), and a message before the program is read as the program (the node's
        # python: "zlib.error: incorrect header check"; a healthy master named broken). One told nothing yet is told
        # by the gate's abort or the stop that follows the opening.
        channel.send(program_input(self.agent_source, self.requests[command.host.name]))
        self._register(command, channel)
        log.debug("%s: session open, its agent's request sent", command.host.name)
        return None

    def _open_with(self, opener: SessionOpener, commands: Sequence[NodeCommand]) -> list[str | None]:
        """Every session through `opener` at once (an srun step starts all its tasks together)."""
        requests = [(c, self.requests[c.host.name]) for c in commands]
        try:
            opened = opener(self.agent_source, requests)
        except Exception as exc:
            return [str(exc)] * len(requests)
        errors: list[str | None] = []
        for command, channel in zip(commands, opened, strict=True):
            if isinstance(channel, str):
                errors.append(channel)
            else:
                self._register(command, channel)
                errors.append(None)
        return errors

    def attach(
        self,
        commands: Sequence[NodeCommand],
        open_one: Callable[[NodeCommand], SessionChannel | str],
        offsets: Mapping[str, int | None],
    ) -> list[str | None]:
        """An attach session to every node at once (`attach`: the run lives there), each read once opened and taken
        by the node's run when its `attached` event comes, its log from `offsets` (None: the node's last lines); an
        error or None per command, in order."""
        self._heartbeat.start()

        def one(command: NodeCommand) -> str | None:
            opened = open_one(command)
            if isinstance(opened, str):
                return opened
            self._register(command, opened, attaching=True, offset=offsets.get(command.host.name))
            return None

        with ThreadPoolExecutor(max_workers=min(DEFAULT_FANOUT, len(commands))) as pool:
            return list(pool.map(one, commands))

    def _register(
        self, command: NodeCommand, channel: SessionChannel, attaching: bool = False, offset: int | None = 0
    ) -> Session:
        """Track a node's open session, its log from byte `offset` (None: unknown), and start reading it."""
        session = Session(command, channel, attaching=attaching, received=offset or 0, at_known=offset is not None)
        with self._lock:
            self.by_name[session.name] = session
        threading.Thread(target=self._read, args=(session,), daemon=True, name=f"read-{session.name}").start()
        return session

    def close(self) -> None:
        """Stop heartbeats and close the channels (an attached node's run goes on within its heartbeat bound, and
        stops by itself after it unless a launcher attaches)."""
        self._closing.set()
        for session in self.by_name.values():
            session.channel.close()
            if session.following is not None and session.following is not session.channel:
                session.following.close()
        if self.reconnector is not None:
            self.reconnector.close()

    # --- the node's channel -> events ---------------------------------------------------------------------

    def _read(self, session: Session) -> None:
        """Follow the node's session to its end; one that ends before the node's run did is replaced by a new one
        (`Reconnector`: over SSH), within the silence timeout, and the run goes on being read where it was."""
        channel: SessionChannel | None = session.channel
        while channel is not None:
            how = self._follow(session, channel)
            log.debug("%s: its session ended (%s)", session.name, how)
            if not self._may_reattach(session, channel, how):
                return
            channel.close()  # read no more of it: the new session's stream starts at what was read
            channel = self._reattach(session, how)

    def _follow(self, session: Session, channel: SessionChannel) -> str:
        """Read a channel into events until it ends: `finished` (the command exited), `drained` (the connection
        went), `eof` (the command's output ended, its exit not said: its console was let go), `silent` (nothing for
        REATTACH_AFTER_BEATS beats: a connection that carries nothing any more)."""
        session.following = channel
        err_rest, eof_since, last = b"", None, time.monotonic()
        while True:
            out, err = channel.read()
            now = time.monotonic()
            if now - last > STALL:  # this launcher itself was frozen: what it did not read is no node's silence
                session.heard = max(session.heard, now)
            last = now
            if out or err:
                session.heard = now
            if out:
                session.received += len(out)
                session.lines += out.count(b"\n")
                at = session.received - len(out) if session.at_known else None
                self.on_event(Output(session.name, time.time(), out, at))
            if err:
                *lines, err_rest = (err_rest + err).split(b"\n")
                for line in lines:
                    self._agent_line(session, line)
            if channel.finished:
                return "finished"
            if channel.drained:
                return "drained"
            if session.taken is not None:
                return "taken"  # another launcher's now: nothing more to read here
            if out or err:
                continue
            if channel.output_ended:
                eof_since = eof_since or now
                if now - eof_since > EOF_GRACE_S:
                    return "eof"
            elif self._fell_silent(session, now):
                return "silent"
            channel.wait_readable(0.5)

    def _fell_silent(self, session: Session, now: float) -> bool:
        return (
            self.reconnector is not None
            and session.started
            and not session.attaching
            and session.end is None
            and not self._closing.is_set()
            and now - session.heard > self.reattach_after
        )

    def _may_reattach(self, session: Session, channel: SessionChannel, how: str) -> bool:
        """Whether a session that ended is to be replaced by a new one; else its node's end is decided here."""
        if (
            self.reconnector is None
            or self._closing.is_set()
            or session.end is not None
            or session.reported is not None
            or session.taken is not None
        ):
            self._settle(session, channel, how)
            return False
        code = channel.exit_code() if session.attaching and how == "finished" else None
        if code in (SUPERVISOR_GONE, ATTACH_REFUSED):  # the node said its run has no supervisor, or takes no console
            died = session.started or code == SUPERVISOR_GONE
            self._end(session, EndKind.AGENT_DIED if died else EndKind.START_ERROR, code)
            return False
        # Any other end of a new session before the run took it (its supervisor stopped or stuck: SUPERVISOR_SILENT; the
        # connection or sshd going away meanwhile) is one more try, within the silence timeout.
        if not session.started and not session.attaching:
            self._settle(session, channel, how)  # the start's own session: a failed start is no lost console
            return False
        return True

    def _settle(self, session: Session, channel: SessionChannel, how: str) -> None:
        """The node's end, from how its (last) session ended and what its agent said."""
        if session.taken is not None:
            self._end(session, EndKind.TAKEN, reason=f"taken over by {session.taken.get('by') or 'another launcher'}")
        elif how == "finished" or session.reported is not None:
            self._channel_ended(session, channel.exit_code() if how == "finished" else -1)
        else:
            self._end(session, EndKind.LOST)

    def _reattach(self, session: Session, how: str) -> SessionChannel | None:
        """A new session to the node's run, tried with back-off (each try bounded by connect_timeout) until one is
        open; None once the run's handle ended the node as lost (its rule: the silence timeout since the last message
        heard, or the nodes' own bound while no node at all can be reached) or the run is over."""
        assert self.reconnector is not None
        if session.outage is None:  # the silence timeout runs from the last message heard, as for any silent node
            session.outage, session.lost_at, session.lost_how = session.heard, time.monotonic(), how
        delay = REATTACH_FIRST_S
        fresh = how in ("drained", "silent")  # a connection that went, or carries nothing: a new one
        while session.end is None and not self._closing.is_set():
            opened = self.reconnector.open(session.command.host, fresh, session.received)
            if not isinstance(opened, str):
                log.info("%s: a new session, from byte %d of its log", session.name, session.received)
                session.attaching, session.attach_lines = True, session.lines
                return opened
            log.debug("%s: no new session yet: %s (next try in %g s)", session.name, opened, delay)
            session.reconnect_error, fresh = opened, True
            self._closing.wait(delay)
            delay = min(2 * delay, REATTACH_MAX_S)
        return None

    def _agent_line(self, session: Session, line: bytes) -> None:
        agent_line(self.control, session, line)

    def _channel_ended(self, session: Session, status: int) -> None:
        if session.reported is not None:
            reason = session.reported.get("reason")
            # Whether the launcher's stop ended this node is the agent's to say: a stop that came after torchrun had
            # already failed on its own (a race with a peer's collateral failure) does not hide a root cause.
            self._end(
                session,
                EndKind.EXITED,
                int(session.reported.get("code", status)),
                None if reason in (None, STOP, KILL) else str(reason),
                left=int(session.reported.get("left", 0)),
                asked_to_stop=reason in (STOP, KILL),
                before_workers=reason is None and session.reported.get("workers") is False,
            )
        elif not session.started:
            self._end(session, EndKind.START_ERROR, status)
        else:
            self._end(session, EndKind.AGENT_DIED, status)

    def _end(
        self,
        session: Session,
        kind: EndKind,
        code: int | None = None,
        reason: str | None = None,
        left: int = 0,
        asked_to_stop: bool | None = None,
        before_workers: bool = False,
    ) -> None:
        asked = session.asked_to_stop if asked_to_stop is None else asked_to_stop
        end = NodeEnd(
            session.name,
            kind,
            time.time(),
            code,
            reason or session.stop_reason,
            asked,
            left=left,
            before_workers=before_workers,
        )
        self.control.put(Ended(session.name, end.time, end, (session.reported or {}).get("time")))

    # --- heartbeats ------------------------------------------------------------------------------------------

    def _beat(self) -> None:
        while not self._closing.wait(self._interval):
            for session in list(self.by_name.values()):
                if session.end is None:
                    session.channel.send(message_line(HEARTBEAT), block=False)  # never waits on a silent node
                    self.heartbeats += 1
