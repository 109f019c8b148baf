"""Launching: a run of the job on every node at once (`launch`: attached, detached, with retries, under SLURM), and
the project's tree to every node first (`sync`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from launcher.app.hosts import Hosts, load_inventory, with_project_src
from launcher.app.job import JobArgs, job_of
from launcher.config.model import Cluster, Job
from launcher.errors import LauncherError, RunFailed, UsageError
from launcher.plan.dryrun import dry_run_text
from launcher.plan.launchplan import LaunchPlan, plan_launch
from launcher.plan.settings import for_run
from launcher.run import attempts
from launcher.run import launch as run_launch
from launcher.run.actions import check_run_id
from launcher.run.gate import ConnectionsFirst
from launcher.run.run_io import RunIO
from launcher.settings import Settings


def launch(
    hosts: str | Hosts,
    job: JobArgs | None = None,
    *,
    dry_run: bool = False,
    doctor: bool = True,
    sync: bool = False,
    slurm: bool = False,
    settings: Settings | None = None,
    run_io: RunIO | None = None,
    run_id: str | None = None,
    as_json: bool = False,
    hosts_from: str | None = None,
    pull: bool = False,
) -> int:
    """Start the job on every node at once (with `slurm`: on the allocation's nodes, one srun step). `run_id`: the
    run's id (default: a new one), which a caller may need before the run ends (`launcher.api`). A `dry_run` prints
    the plan and the settings it uses, with where each came from (`hosts_from`: where the inventory was named), the
    agent's request with `as_json`. `pull`: first the container image on every node at once (`--pull`); where a
    node's pull fails, nothing starts."""
    cluster = load_inventory(hosts)
    settings, run_io = settings or Settings(), run_io or RunIO()
    if pull and (dry_run or slurm):
        raise UsageError(f"--pull does not go with {'--dry-run (it starts nothing)' if dry_run else '--slurm'}")
    if slurm:
        from launcher.app import slurm as on_slurm

        return on_slurm.launch_slurm(
            cluster,
            job_of(cluster, job or JobArgs()),
            dry_run=dry_run,
            doctor=doctor,
            sync=sync,
            settings=settings,
            run_io=run_io,
        )
    chosen = job_of(cluster, job or JobArgs())
    # How the run is followed, decided and said before anything starts (the dry run shows what it uses).
    settings = for_run(settings, cluster, chosen, where="detached" if settings.run.detach else "attached")
    for note in settings.run.notes:
        run_io.err.write(note + "\n")
    plan = plan_launch(cluster, chosen, run_id, settings=settings)  # a PlanError names the inventory
    if dry_run:
        return _dry_run(plan, run_io, hosts_from, as_json)
    if pull:
        from launcher.app.pulling import pull_failed, pull_images

        failed = pull_images(plan.cluster, settings, run_io.err)
        if failed:
            raise LauncherError(pull_failed(failed, "nothing was started"))
    named = chosen if chosen != cluster.job else None  # the command line's: a refusal's doctor command names it
    return _started(plan, _gated(plan, hosts, run_io, doctor, sync, named), doctor)


def _dry_run(plan: LaunchPlan, run_io: RunIO, hosts_from: str | None, as_json: bool) -> int:
    """`--dry-run`: the plan, the settings it uses with where each came from, the agent's request with `--json`."""
    from launcher.plan.request import shown_request
    from launcher.plan.usedsettings import settings_text

    shown = [dry_run_text(plan), "", *settings_text(plan, hosts_from)]
    run_io.out.write("\n".join(shown + (["", *shown_request(plan)] if as_json else [])) + "\n")
    return 0


def _gated(
    plan: LaunchPlan, hosts: str | Hosts, run_io: RunIO, doctor: bool, sync: bool, named: Job | None = None
) -> RunIO:
    """What runs before the start: the doctor's fast checks in the agents' sessions, `--sync` over the run's own
    connections before them (the script check then passes)."""
    settings = plan.settings
    if doctor and run_io.gate is None:
        from launcher.doctor.collect import doctor_gate

        run_io = replace(run_io, gate=doctor_gate(settings, run_io.err, named))
    if sync:
        from launcher.sync import push as code_sync

        gate = run_io.gate or ConnectionsFirst()  # the doctor's checks, if on, run in the agents' sessions
        before = code_sync.before_launch(
            with_project_src(plan.cluster, hosts),
            run_io.err,
            stall_timeout=settings.run.silence_timeout,
            outputs=(settings.output.log_dir,),
        )
        run_io = replace(run_io, gate=gate.with_before(before))
    return run_io


def _started(plan: LaunchPlan, run_io: RunIO, doctor: bool) -> int:
    """The run (with its retries), then its page by a process of its own and the line that says where."""
    settings, began = plan.settings, time.time()
    try:
        if not settings.run.retries:
            code = run_launch.launch_run(plan, run_io)
        else:
            from launcher.doctor.collect import between_attempts

            code = attempts.launch_with_retries(plan, run_io, between_attempts(settings, doctor))
    except LauncherError as exc:
        shown = _said_last(exc, _pages(plan, settings, began, exc))
        if shown is exc:
            raise
        raise shown from exc
    except BaseException:
        _pages(plan, settings, began, None)
        raise
    said = _pages(plan, settings, began, None)
    if said:
        run_io.err.write(said + "\n")
    return code


def _pages(plan: LaunchPlan, settings: Settings, began: float, failed: LauncherError | None) -> str:
    """The run's page (each attempt's) by a process of its own, this command returning now; the line that says where
    it will be. A launch that started nothing (the doctor's checks refused it, a node out of reach) has no page: its
    error says why, and its reason is kept for a later `report`."""
    if not settings.output.page:
        return ""
    from launcher.app.pages import page_path
    from launcher.paths import hint, relative
    from launcher.run.journal import note_end, started_anywhere

    tried = [a.run_id for a in attempts.read_attempts(settings.output.log_dir, plan.run_id)] or [plan.run_id]
    if failed is not None:
        note_end(settings.output.log_dir / tried[-1], tried[-1], began, getattr(failed, "exit_code", 1), str(failed))
    if settings.run.detach:
        return (
            ""
            if failed is not None
            else (
                f"its page: {relative(page_path(settings, plan.run_id))}, written at the "
                f"first `{hint('status')}` after the run's end"
            )
        )
    return _page_line(
        plan.cluster, [run_id for run_id in tried if started_anywhere(settings.output.log_dir / run_id)], settings
    )


def _page_line(cluster: Cluster, ran: list[str], settings: Settings) -> str:
    """The page of a run that has ended (each attempt's), started by a process of its own; the line that says where."""
    from launcher.app.pages import page_path
    from launcher.paths import relative

    if not settings.output.page or not ran or not _page_once_ended(cluster, ran, settings):
        return ""
    pages = [relative(page_path(settings, run_id)) for run_id in ran]
    before = f"; its earlier attempts': {', '.join(pages[:-1])}" if len(pages) > 1 else ""
    return f"the run's page: {pages[-1]} (written in a few seconds{before})"


def _said_last(exc: LauncherError, said: str) -> LauncherError:
    """A failure with the page's line last, after its root cause, as after a success."""
    if not said or not isinstance(exc, RunFailed):
        return exc
    return RunFailed(f"{exc}\n{said}", exc.exit_code, node=exc.node, rank=exc.rank, tail=exc.tail, ends=exc.ends)


def attach(
    hosts: str | Hosts,
    run_id: str | None = None,
    *,
    settings: Settings | None = None,
    run_io: RunIO | None = None,
    on_run: Callable[[str], None] | None = None,
    force: bool = False,
) -> int:
    """Take over an attached run whose launcher is gone (a laptop that slept past its reconnects, a killed launcher,
    another terminal): stream it from where this machine's copy stopped, send heartbeats again, stop it everywhere on
    Ctrl-C, and end as its launch would have (its exit code). `run_id`: default, the inventory's running run.
    `force`: take it even from a launcher its nodes hear now (refused otherwise, saying which)."""
    cluster = load_inventory(hosts)
    settings, run_io = settings or Settings(), run_io or RunIO()
    check_run_id(run_id)
    job = cluster.job or Job(command="true")  # the run's own argv is on its nodes; the inventory's job names its
    #                                          progress lines and hang timeout, where it has one

    # A run taken over is followed to its end, one attempt: the launch it came from chose whether to start it again.
    settings = for_run(settings, cluster, job, where="attach")
    for note in settings.run.notes:
        run_io.err.write(note + "\n")

    def plan_for(nodes: Cluster, chosen: str) -> LaunchPlan:
        return plan_launch(nodes, job, chosen, settings=settings)

    chosen: list[str] = []

    def heard(found: str) -> None:
        chosen.append(found)
        if on_run is not None:
            on_run(found)

    try:
        code = run_launch.attach_run(cluster, plan_for, run_id, settings, run_io, heard, force)
    except LauncherError as exc:
        shown = _said_last(exc, _page_line(cluster, chosen, settings))
        if shown is exc:
            raise
        raise shown from exc
    said = _page_line(cluster, chosen, settings)
    if said:
        run_io.err.write(said + "\n")
    return code


def _page_once_ended(cluster: Cluster, run_ids: list[str], settings: Settings) -> bool:
    """The run's page (each attempt's), by a process of its own, once the run has ended: not while it goes on
    without this launcher (it left, or another took it over: that one writes it). Whether it is being written."""
    from launcher.app.pages import page_later
    from launcher.run.journal import read_journal

    end = (read_journal(settings.output.log_dir / run_ids[-1]) or {}).get("end") or {}
    if end.get("going_on"):
        return False
    page_later(cluster, run_ids, settings)
    return True


def sync(hosts: str | Hosts, settings: Settings | None = None, run_io: RunIO | None = None) -> int:
    """Make every node's workdir (or the inventory's sync.dest) hold this tree; 1 when a node could not be synced."""
    from launcher.sync import push as code_sync

    settings, run_io = settings or Settings(), run_io or RunIO()
    return code_sync.sync_hosts(
        with_project_src(load_inventory(hosts), hosts),
        ssh=settings.ssh,
        out=run_io.out,
        stall_timeout=settings.run.silence_timeout,
        outputs=(settings.output.log_dir,),
    )
