"""An attached run on this machine's console (`RunConsole`): its output, prefixed and mirrored into logs/<run id>/;
the page's journal; Ctrl-C (stop, then kill) and a closed terminal (the run goes on); how the run ended, said (its
exit code, or the RunFailed with the root cause). `launcher.run.handle.RunHandle` holds the run's state and decides."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from launcher.errors import RunFailed
from launcher.events import (
    Beat,
    CaughtUp,
    CutOff,
    Ended,
    EndKind,
    HangRuledOut,
    HangSuspected,
    Left,
    LossFlagged,
    NcclDumps,
    NodeEnd,
    NodeEvent,
    Output,
    Reattached,
    Stopping,
)
from launcher.node.wire import HEARTBEAT_TIMEOUT, STOPPED_ELSEWHERE
from launcher.paths import detached_hint, hint
from launcher.plan.ends import RunEnd, ended_how, run_end, start_failed, went_on_without
from launcher.plan.launchplan import LaunchPlan
from launcher.plan.recovery import How
from launcher.plan.request import start_request
from launcher.report.absence import absence_line, attached_line, cut_off_line
from launcher.report.console import ConsoleWriter, Mirror
from launcher.report.hangs import hang_report, ruled_out_line, write_nccl
from launcher.report.lines import NodeLog, stop_folding, supports_colour
from launcher.report.rootcause import run_failed
from launcher.run.actions import AGENT_SOURCE, agent_action, run_ssh
from launcher.run.catchup import caught_up_line
from launcher.run.handle import RunHandle
from launcher.run.journal import Journal
from launcher.run.launchstragglers import STRAGGLERS_FILE, LaunchStragglers
from launcher.run.nodeenv import NodeEnv
from launcher.run.reattach import Reconnector, new_owner
from launcher.run.run_io import RunIO
from launcher.run.sessions import SessionOpener
from launcher.transport.connections import Node
from launcher.watch.arrival import Arrivals

log = logging.getLogger(__name__)


class Hangup(BaseException):
    """The launcher's terminal closed (SIGHUP) while a run was attached: the run goes on without this launcher."""


class RunConsole:
    """An attached run on the console: its `RunHandle` (the run's state and loop), its output (the console, the
    local log mirror, the page's journal), Ctrl-C and a closed terminal, and how the run ended, said."""

    def __init__(
        self,
        plan: LaunchPlan,
        run_io: RunIO,
        nodes: dict[str, Node],
        envs: dict[str, NodeEnv],
        opener: SessionOpener | None,
        journal: Journal,
        attach: Mapping[str, int | None] | None = None,
    ):
        self.plan, self.run_io = plan, run_io
        settings = self.settings = plan.settings
        self.journal = journal
        self.attach = attach
        """`attach`: each node's offset in its log this machine has (None: none), to take over a run that lives on."""
        folder = settings.output.log_dir / plan.run_id
        self.log_hint = f"logs: {folder}/"
        self.console = ConsoleWriter(
            run_io.out, run_io.err, settings.output.console_buffer, f"{folder}/", settings.output.console_buffer_bytes
        )
        self.mirror = None if settings.run.detach else Mirror(folder, self.console)
        if self.mirror is not None:
            for command in plan.nodes:  # the folder the end names, even if all is quiet
                self.mirror.write(command.host.name, b"")
        colour = supports_colour(run_io.out)
        width = max(len(c.host.name) for c in plan.nodes)
        self.logs = {
            c.host.name: NodeLog(c.host.name, i, width, c.rank_offset, colour, folder) for i, c in enumerate(plan.nodes)
        }
        self.nodes = nodes  # the handle's, which a node reconnected to replaces in place
        self.handle = self._handle(envs, opener)
        self.handle.on_stopping = stop_folding(self.logs, self.settings.output.log_dir / plan.run_id)
        self.handle.spares.on_found = self._spare
        self.interrupts = 0
        """Ctrl-C's so far: the first stops the run (TERM, grace, KILL), the next kills it now."""
        self.end_text = ""
        """The words the launch ended with when they are not a failure's (the journal keeps them for the page)."""
        self.going_on = False
        """The run goes on after this launch returns (left, or taken over by another launcher)."""
        self.away: dict[str, float | None] = {}
        """`attach`: how long each node had heard no launcher when it took this one."""
        self.hang_lines: list[str] = []
        hangs = self.handle.hangs  # one record of the run's collectives, fed by the hang check from the beats
        self.stragglers = LaunchStragglers(
            plan.settings.run.straggler_factor,
            plan.settings.run.straggler_hold,
            settings.output.log_dir / plan.run_id / STRAGGLERS_FILE,
            self._straggler,
            hangs.arrivals if hangs is not None else Arrivals(),
        )

    def _handle(self, envs: dict[str, NodeEnv], opener: SessionOpener | None) -> RunHandle:
        """The run's handle: over SSH with reconnects, or an srun step's sessions (`opener`); each node's request."""
        plan, run_io, owner = self.plan, self.run_io, new_owner()
        reconnector = (
            None
            if opener is not None or plan.settings.run.detach
            else Reconnector(plan.cluster, self.nodes, run_ssh(plan.settings), AGENT_SOURCE, plan.run_id, owner)
        )
        requests = (
            {}
            if self.attach is not None
            else {
                c.host.name: start_request(plan, c, envs[c.host.name], run_io.gate, owner, opener is None)
                for c in plan.nodes
            }
        )
        return RunHandle(plan, self.nodes, requests, AGENT_SOURCE, self._on_event, opener, run_io.gate, reconnector)

    def _straggler(self, line: str) -> None:
        self.console.message(line)
        self.journal.mark("straggler", line)

    def _spare(self, node: str) -> None:
        """A node stands by as a spare (launcher/watch/spares.py): said, marked, torchrun's lines on its end folded."""
        self.logs[node].spare(self.settings.output.log_dir / self.plan.run_id)
        self.console.message(line := self.handle.spares.line(node))
        self.journal.mark("spare", line, node)

    def _on_event(self, event: NodeEvent) -> None:
        # Output comes from each node's reader thread: format and queue it, never wait on the console or disk.
        if isinstance(event, Output):
            if self.mirror is not None and not self.mirror.take(event.node, event.data, event.at):
                self.logs[event.node].format(event.data)  # its tail only: another launcher printed it here
                return
            text, count = self.logs[event.node].format(event.data)
            self.console.lines(event.node, text, count)
        else:
            self.journal.event(event)  # the page's account: phases and marks, never Output (it is not kept there)
        if isinstance(event, Ended):
            text, count = self.logs[event.node].format_rest()
            self.console.lines(event.node, text, count)
            if self.mirror is not None and (line := self.mirror.elsewhere_line(event.node)) is not None:
                self.console.message(line)
        elif isinstance(event, Stopping) and event.reason == HEARTBEAT_TIMEOUT:
            self.console.message(
                f"{event.node}: no launcher heard from for {self.settings.run.heartbeat_bound or 0:g} s "
                "(--heartbeat-timeout); the node stops its part"
            )
        elif isinstance(event, CaughtUp) and (line := caught_up_line(event)) is not None:
            self.console.message(line)
            self.journal.mark("reconnect" if event.node else "away", line, event.node or None, event.since)
        elif isinstance(event, CutOff):
            line = cut_off_line(event.since, event.until)
            self.console.message(line)
            self.journal.mark("away", line, None, event.since)
        elif isinstance(event, Reattached) and event.down_s is None:
            self.away[event.node] = event.away_s
        elif isinstance(event, HangSuspected):
            self.hang_lines = hang_report(self.plan.run_id, event, self.settings.output.log_dir)
            for line in self.hang_lines:
                self.console.message(line)
        elif isinstance(event, HangRuledOut):
            self.console.message(ruled_out_line(event))
            # dumps the look brought (NCCL's watchdog may have written them): each comes once, kept with the run's
            for line in write_nccl(self.settings.output.log_dir / self.plan.run_id, event.answers):
                self.console.message(line)
        elif isinstance(event, Beat) and event.progress:
            self.stragglers.beat(event.node, event.progress)
        elif isinstance(event, LossFlagged):
            stopping = "; stopping the run (--on-nonfinite stop)" if event.stops else ""
            self.console.message(f"loss: {event.line}{stopping}")
            self.journal.mark("loss", event.line, event.node or None)
        elif isinstance(event, NcclDumps):  # an NCCL timeout ended the run: its flight recorder's evidence
            for line in write_nccl(
                self.settings.output.log_dir / self.plan.run_id, {event.node: {"nccl": event.dumps}}
            ):
                self.console.message(line)
        elif isinstance(event, Left):
            low = self.handle.needs
            self.console.message(
                f"{event.node} left the run ({ended_how(event.end)}); {event.remaining} "
                f"node(s) go on (the c10d group needs {low})"
            )
        if self.run_io.on_event is not None:
            self.run_io.on_event(event)

    def execute(self) -> int:
        handle, total = self.handle, len(self.plan.nodes)
        t0 = time.monotonic()
        try:
            interrupted = False
            try:
                if self.attach is None:
                    handle.start()
                else:
                    handle.attach(self.attach)
            except (KeyboardInterrupt, Hangup):  # nothing runs yet: a closed terminal drops the start too
                interrupted = True
                handle.abort("interrupted while starting")
            if handle.start_failure is not None and self.attach is not None:
                return self._not_attached()
            if handle.start_failure is not None:
                self._wait()
                if self.settings.run.detach:  # a detached node's supervisor outlives its agent: stop it by its run id
                    self._stop_detached(handle.started)
                others = handle.started
                stopped = f"; stopped what had started on {', '.join(others)}" if others else "; nothing was started"
                ended = start_failed(interrupted)  # 130: what a shell reports for Ctrl-C
                log.info("the start failed: %s; stopped on %s", handle.start_failure, ", ".join(others) or "none")
                failed = RunFailed(
                    f"run {self.plan.run_id} could not start: {handle.start_failure}{stopped}", ended.code
                )
                self._heard(ended)
                self.journal.end(failed.exit_code, str(failed))
                self.journal.write()
                raise failed
            self.console.message(
                attached_line(self.plan.run_id, self.away)
                if self.attach is not None
                else f"started {total}/{total} in {time.monotonic() - t0:.1f}s: run {self.plan.run_id}"
            )
            log.info(
                "%s on %d node(s) in %.2f s",
                "taken" if self.attach is not None else "started",
                total,
                time.monotonic() - t0,
            )
            self.journal.write()  # a detached run's page has its start from here
            if self.settings.run.detach:
                self._wait()
                self.console.message(
                    f"detached: run {self.plan.run_id} keeps going; {detached_hint(self.plan.cluster.source)}"
                )
                return 0
            return self._ended(self._report, self._wait())
        finally:
            handle.close()
            self.console.close()
            if self.mirror is not None:
                self.mirror.close()

    def _ended(self, report: Any, ends: list[NodeEnd]) -> int:
        """The report's exit code (or its RunFailed), kept in the journal with its words."""
        try:
            code = report(ends)
        except RunFailed as exc:
            self.journal.end(exc.exit_code, str(exc))
            raise
        except BaseException:
            self.journal.end(1, "the launcher itself failed")
            raise
        else:
            self.journal.end(
                code,
                self.end_text or ("interrupted (Ctrl-C)" if self.handle.interrupted else ""),
                going_on=self.going_on,
            )
            return code
        finally:
            self.journal.write()

    def _not_attached(self) -> int:
        """`attach` could not take the run on every node: nothing was stopped; what it took goes on without it."""
        raise RunFailed(
            f"could not attach to run {self.plan.run_id}: {self.handle.start_failure}; nothing was "
            f"stopped, and the run goes on on its nodes"
            + ("" if self.settings.run.heartbeat_bound is None else " within its heartbeat bound"),
            1,
        )

    def _stop_detached(self, names: list[str]) -> None:
        nodes = {name: self.handle.nodes[name] for name in names}
        request = {"action": "stop", "run_id": self.plan.run_id, "grace": self.plan.settings.run.grace}
        agent_action(nodes, self.plan.cluster, request, self.plan.settings.run.action_timeout)

    def _wait(self) -> list[NodeEnd]:
        while True:
            try:
                return self.handle.wait()  # type: ignore[return-value]
            except Hangup:  # the terminal closed: the run goes on on its nodes, within the heartbeat bound
                log.info("the terminal closed (SIGHUP): the run goes on on its nodes")
                self.handle.left = True
                return []
            except KeyboardInterrupt:
                self.interrupts += 1
                self.handle.interrupted = True
                log.info(
                    "interrupted (Ctrl-C or SIGTERM, %d): %s",
                    self.interrupts,
                    "stop" if self.interrupts == 1 else "kill",
                )
                if self.interrupts == 1:  # torchrun's lines on the stop: one a node (`stop_folding`)
                    self.console.message(
                        f"\ninterrupted: stopping the run on every node (TERM, then KILL after "
                        f"{self.plan.settings.run.grace:g}s; Ctrl-C again to kill now)"
                    )
                    self.handle.stop(why="interrupted (Ctrl-C)")
                else:
                    self.console.message("\nkilling the run on every node now")
                    self.handle.stop(kill=True, why="interrupted again (Ctrl-C): killed")

    def _heard(self, ended: RunEnd) -> None:
        if self.run_io.on_end is not None:
            self.run_io.on_end(ended)

    def _report(self, ends: list[NodeEnd]) -> int:
        """How the run ended (`launcher.plan.ends.run_end`), traced and said: its exit code, or its RunFailed."""
        ends = [
            replace(
                e,
                tail=tuple(self.logs[e.node].tail),
                raised=tuple((local, rank, line) for local, (rank, line) in self.logs[e.node].raised.items()),
            )
            for e in ends
        ]
        for line in self.handle.unswept_lines(self.plan.cluster.source):
            self.console.message(line)
        ended = run_end(ends, self.handle.supervised())
        absence = f"; {ended.absence.value}" if ended.absence is not None else ""
        log.info("the run ended: %s (%s); exit code %d%s", ended.end.how, ended.end.why, ended.code, absence)
        for end in ends:
            log.debug(
                "%s: %s, exit code %s, stop reason %s, asked to stop %s, %d process(es) left",
                end.node,
                end.kind,
                end.exit_code,
                end.stop_reason,
                end.asked_to_stop,
                end.left,
            )
        self._heard(ended)
        self._say(ended, ends)
        return ended.code

    def _say(self, ended: RunEnd, ends: list[NodeEnd]) -> None:
        """The run's end in the console's last line, or its RunFailed (a hang's, a failure's root cause)."""
        how, run_id = ended.end.how, self.plan.run_id
        if ended.absence is not None:
            self.going_on = ended.going_on
            self.end_text = absence_line(
                ended,
                ends,
                self.plan.run_id,
                len(self.plan.nodes),
                self.settings.run.heartbeat_bound,
                hint(f"attach --hosts {self.plan.cluster.source} --run {self.plan.run_id}"),
            )
            self.console.message(f"{self.end_text}. {self.log_hint}")
        elif how == How.INTERRUPTED:
            left = sum(e.left for e in ends)
            unconfirmed = [e.node for e in ends if e.kind != EndKind.EXITED]
            self.console.message(
                f"run {run_id} stopped on {len(ends)} node(s)"
                + (f"; {left} process(es) could not be killed" if left else "")
                + (f"; no confirmation from {', '.join(unconfirmed)}" if unconfirmed else "")
                + f". {self.log_hint}"
            )
        elif how in (How.HANG, How.NONFINITE):  # the launcher stopped it: the hang or the loss is the root cause
            said = (
                self.hang_lines[0] + self.handle.losses.before()
                if how == How.HANG
                else f"(--on-nonfinite stop): {ended.end.why}"
            )
            raise RunFailed(
                f"run {run_id} stopped: {said}. {self.log_hint}",
                ended.code,
                node=ended.end.node,
                rank=ended.end.rank,
                ends=tuple(ends),
            )
        elif how == How.STOPPED:
            elsewhere = [e.node for e in ends if e.stop_reason == STOPPED_ELSEWHERE]
            self.console.message(
                f"run {run_id} was stopped from elsewhere (`{hint('stop')}`) on "
                f"{len(elsewhere)} node(s) ({', '.join(elsewhere)}). {self.log_hint}"
            )
        elif how == How.OK and (ended.went_on_without or ended.stood_by):  # an elastic run without some nodes
            self.console.message(f"run {run_id}: {went_on_without(ends, ended)}. {self.log_hint}")
        elif how == How.OK:
            self.console.message(f"run {run_id}: all {len(ends)} node(s) exited 0. {self.log_hint}")
        else:
            failed = run_failed(run_id, ends, self.log_hint)
            if self.handle.losses.before():
                failed.args = (f"{failed}{self.handle.losses.before()}",)
            raise failed
