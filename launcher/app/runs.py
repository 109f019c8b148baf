"""The commands on a run (status, stop, logs, stacks, top, report), from the CLI and the Python API alike: one opening
(`_opening`: the run id checked before any node is contacted, the settings, the output), then the action on the
inventory's nodes or, with `job`, a SLURM job's. What the API returns as data (`states`, `stopped`, `stacks_of`)
is what the CLI's forms render."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.app.hosts import Hosts, load_inventory
from launcher.run import attempts
from launcher.run.actions import check_run_id
from launcher.run.run_io import RunIO
from launcher.settings import Settings

if TYPE_CHECKING:  # types only: each command imports what it alone uses (a status: no stacks, no rich live view)
    from launcher.config.model import Cluster
    from launcher.report.pagedata import Page
    from launcher.run.control import NodeState
    from launcher.run.takestacks import StacksReport


def _opening(run_id: str | None, settings: Settings | None, run_io: RunIO | None) -> tuple[Settings, RunIO]:
    """What every command on a run does first: the run id checked (a usage error before any node is contacted),
    the settings and the output as given, else the defaults."""
    check_run_id(run_id)
    return settings or Settings(), run_io or RunIO()


def states(
    hosts: str | Hosts, run_id: str | None = None, settings: Settings | None = None, run_io: RunIO | None = None
) -> list[NodeState]:
    """Each node's state of the run (`api.Run.status`, what `status` shows)."""
    from launcher.run import control as run_control

    settings, run_io = _opening(run_id, settings, run_io)
    return run_control.status(load_inventory(hosts), run_id, settings, run_io=run_io)


def stopped(
    hosts: str | Hosts, run_id: str | None = None, settings: Settings | None = None, run_io: RunIO | None = None
) -> list[NodeState]:
    """Stop the run on every node (TERM, grace, KILL); each node's state after (`api.Run.stop`, what `stop` shows)."""
    from launcher.run import control as run_control

    settings, run_io = _opening(run_id, settings, run_io)
    return run_control.stop(load_inventory(hosts), run_id, settings, run_io=run_io)


def stacks_of(
    hosts: str | Hosts,
    run_id: str | None = None,
    settings: Settings | None = None,
    run_io: RunIO | None = None,
    job: str | None = None,
) -> StacksReport:
    """Every rank's stack of a running run, grouped, kept under logs/<run id>/ (`api.Run.stacks`, what `stacks`
    prints); with `job`, the run inside that SLURM batch job, reached through the job's own steps."""
    settings, run_io = _opening(run_id, settings, run_io)
    if job:
        from launcher.app import slurm as on_slurm

        return on_slurm.job_stacks(job, load_inventory(hosts), run_id, settings, run_io)
    from launcher.run.takestacks import collect_stacks

    return collect_stacks(load_inventory(hosts), run_id, settings, run_io.err)


def status(
    hosts: str | Hosts,
    run_id: str | None = None,
    settings: Settings | None = None,
    *,
    job: str | None = None,
    run_io: RunIO | None = None,
) -> int:
    """Per node: the run's state, exit code and times, and what the launcher kept about it (a hang's answer,
    stragglers, attempts); with `job`, a SLURM batch job's state."""
    settings, run_io = _opening(run_id, settings, run_io)
    if job:
        from launcher.app import slurm as on_slurm

        return on_slurm.job_status(job, settings, run_io)
    from launcher.paths import hint
    from launcher.plan.retry import summary
    from launcher.report.hangs import latest_answer
    from launcher.report.states import console, launcher_lines, problems, say, state_table
    from launcher.run.launchstragglers import stragglers_of

    found = states(hosts, run_id, settings, run_io)
    con = console(run_io.out)
    shown = run_id or next((s.run_id for s in found if s.run_id), None)
    con.print(state_table(f"run {shown or '(none)'} on {len(found)} node(s)", found, stop=False))
    problems(con, found)
    source = hosts.path if isinstance(hosts, Hosts) else hosts
    for line in launcher_lines(found, hint(f"attach --hosts {source} --run {shown}"), time.time()):
        say(con, line)
    for note in _detached_notes(hosts, found):
        say(con, note)
    hang = latest_answer(settings.output.log_dir, shown) if shown else None
    if hang is not None:
        say(con, f"last {hang}")
    told = stragglers_of(settings.output.log_dir, shown) if shown else []
    # A detached run: no launcher told its stragglers. One look where every node runs it (one out of reach would cost
    # its connect timeout again, and a look at part of the run judges part of it).
    if shown and not told and found and all(s.state == "running" for s in found):
        from launcher.run.topfeed import stragglers_now

        told = stragglers_now(load_inventory(hosts), shown, settings)
    for line in told:
        say(con, line)
    tried = attempts.read_attempts(settings.output.log_dir, shown) if shown else []
    if len(tried) > 1:
        say(con, f"run {shown} is one of {len(tried)} attempts of a launch (--retries):")
        for line in summary(tried):
            say(con, f"  {line}")
    _page_if_due(hosts, shown, [s.state for s in found], settings, con)
    return _code(found)


def _detached_notes(hosts: str | Hosts, found: list[NodeState]) -> tuple[str, ...]:
    """A running detached run (no node has a launcher's console): what of its inventory's retries and on_hang no
    launcher is there to do."""
    running = [s for s in found if s.state == "running"]
    if not running or any(s.launcher for s in running):
        return ()
    from launcher.plan.settings import for_run

    return for_run(Settings(), load_inventory(hosts), where="detached").run.notes


def _page_if_due(hosts: str | Hosts, run_id: str | None, found: list[str], settings: Settings, con: Any) -> None:
    """A run that has ended everywhere and has no page yet (a detached run) gets it now, by a process of its own; the
    line says where and when (it appeared seconds later without a word)."""
    from launcher.app.pages import page_due, page_later, page_path
    from launcher.paths import relative
    from launcher.report.states import say

    if run_id is not None and page_due(settings, run_id, found):
        page_later(load_inventory(hosts), [run_id], settings)
        say(con, f"the run's page: {relative(page_path(settings, run_id))} (written in a few seconds)")


def stop(
    hosts: str | Hosts,
    run_id: str | None = None,
    settings: Settings | None = None,
    *,
    job: str | None = None,
    run_io: RunIO | None = None,
) -> int:
    """Stop a run on every node (TERM, grace, KILL) and say what was left; with `job`, scancel a SLURM job."""
    settings, run_io = _opening(run_id, settings, run_io)
    if job:
        from launcher.app import slurm as on_slurm

        return on_slurm.job_stop(job, settings, run_io)
    from launcher.report.states import console, problems, say, state_table

    found = stopped(hosts, run_id, settings, run_io)
    con = console(run_io.out)
    if all(s.found == 0 and s.state not in ("unreachable", "error") for s in found):
        say(
            con,
            f"nothing was running on {len(found)} node(s)"
            + (f" (run {found[0].run_id})" if found and found[0].run_id else ""),
        )
    else:
        shown = run_id or next((s.run_id for s in found if s.run_id), None)
        con.print(state_table(f"stop run {shown or '(none)'}", found, stop=True))
    problems(con, found)
    left = sum(s.left for s in found)
    if left:
        con.print(f"[red]{left} process(es) of the run could not be killed[/]")
    return 1 if left else _code(found)


def _code(found: list[NodeState]) -> int:
    """1 when a node could not be reached or answered with an error."""
    return 1 if any(s.state in ("unreachable", "error") for s in found) else 0


def logs(
    hosts: str | Hosts,
    run_id: str | None = None,
    node: str | None = None,
    rank: int | None = None,
    follow: bool = False,
    settings: Settings | None = None,
    *,
    job: str | None = None,
    run_io: RunIO | None = None,
) -> int:
    """Replay a run's log from its nodes (with `follow`, until it ends); with `job`, a SLURM job's output file."""
    settings, run_io = _opening(run_id, settings, run_io)
    if job:
        from launcher.app import slurm as on_slurm

        return on_slurm.job_logs(job, follow, settings, run_io)
    from launcher.app.pages import page_later, page_path
    from launcher.run.runlogs import logs as node_logs

    cluster = load_inventory(hosts)
    code = node_logs(cluster, run_id, node=node, rank=rank, follow=follow, settings=settings, run_io=run_io)
    if run_id is None or not page_path(settings, run_id).exists():
        page_later(cluster, [run_id], settings, if_ended=True)  # a detached run's page, once it ended: its own process
    return code


def stacks(
    hosts: str | Hosts,
    run_id: str | None = None,
    settings: Settings | None = None,
    job: str | None = None,
    run_io: RunIO | None = None,
) -> int:
    """Every rank's stack of a running run, grouped, and kept under logs/<run id>/; 1 when no node answered.
    With `job`, the run inside that SLURM batch job, reached through the job's own steps."""
    settings, run_io = _opening(run_id, settings, run_io)
    report = stacks_of(hosts, run_id, settings, run_io, job)
    for line in report.lines():
        run_io.out.write(line + "\n")
    return 0 if report.stacks else 1


def top(
    hosts: str | Hosts,
    run_id: str | None = None,
    settings: Settings | None = None,
    *,
    once: bool = False,
    as_json: bool = False,
    job: str | None = None,
    run_io: RunIO | None = None,
) -> int:
    """Every node and rank of a running run at once: live (q quits, the run goes on), or one look (`once`)."""
    from launcher.run import topfeed as run_top

    settings, run_io = _opening(run_id, settings, run_io)
    if once and as_json:  # the value the API's Run.top() returns, as JSON
        run_io.out.write(json.dumps(top_snapshot(hosts, run_id, settings, run_io, job)) + "\n")
        return 0
    cluster, nodes = _reached_as(hosts, settings, job)
    return run_top.top(cluster, run_id, settings, run_io, once=once, nodes=nodes)


def _reached_as(hosts: str | Hosts, settings: Settings, job: str | None) -> tuple[Cluster, dict[str, Any] | None]:
    """The inventory's cluster, and with `job` the nodes of that running SLURM batch job as its own steps reach them
    (`launcher.slurm.slurmlaunch.SlurmNode`; None: each node over SSH)."""
    cluster = load_inventory(hosts)
    if not job:
        return cluster, None
    from launcher.app import slurm as on_slurm

    return on_slurm.job_nodes(job, cluster, settings)


def top_snapshot(
    hosts: str | Hosts, run_id: str | None, settings: Settings, run_io: RunIO, job: str | None = None
) -> dict[str, Any]:
    """One look at every node and rank of a running run, judged: the value `inv top --once --json` prints."""
    from launcher.run import topfeed as run_top

    cluster, nodes = _reached_as(hosts, settings, job)
    return run_top.snapshot(cluster, run_id, settings, run_io.err, nodes)


def written_page(
    hosts: str | Hosts, run_id: str | None, settings: Settings, run_io: RunIO, job: str | None = None
) -> tuple[Path, Page]:
    """Write the run's page (the newest run of the inventory by default): where, and the page. With `job`, of the run
    inside that running SLURM batch job, through the job's own steps."""
    from launcher.app.pages import write_page

    cluster, given = _reached_as(hosts, settings, job)
    return write_page(cluster, run_id, settings, run_io.err, given)


def report(
    hosts: str | Hosts,
    run_id: str | None = None,
    settings: Settings | None = None,
    *,
    as_json: bool = False,
    run_io: RunIO | None = None,
    job: str | None = None,
) -> int:
    """Write the run's page and say where, with its headline (`written_page`). The nodes it could not reach are
    named (their figures are those they gave an earlier write); 1 when none could be: it added nothing."""
    settings, run_io = _opening(run_id, settings, run_io)
    path, page = written_page(hosts, run_id, settings, run_io, job)
    if as_json:
        run_io.out.write(json.dumps(dict(page.summary(), page=str(path))) + "\n")
    else:
        run_io.out.write(f"{page.headline}\npage: {path}\n")
    for note in page.notes:
        run_io.err.write(f"note: {note}\n")
    if page.unreached and len(page.unreached) == len(page.exits):
        run_io.err.write(f"could not reach {', '.join(page.unreached)}: the page has nothing new\n")
        return 1
    return 0
