"""The doctor's task: every node probed once, in parallel, its findings as a table or JSON (and, asked, the
network measured with the run's own backend); under SLURM through the job's own steps."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from launcher.app.hosts import Hosts, load_inventory, with_project_src
from launcher.app.job import JobArgs, job_of
from launcher.errors import UsageError
from launcher.run.run_io import RunIO
from launcher.settings import Settings

if TYPE_CHECKING:  # the report's type only: a task imports rich and the doctor when it runs
    from launcher.doctor import CheckMode
    from launcher.doctor.evidence import Report


def doctor(
    hosts: str | Hosts,
    *,
    as_json: bool = False,
    checks: CheckMode = "all",
    settings: Settings | None = None,
    net: bool = False,
    slurm: bool = False,
    job: str | None = None,
    run_io: RunIO | None = None,
    net_all_gpus: bool = False,
    job_args: JobArgs | None = None,
    pull: bool = False,
) -> int:
    """Probe every node once, in parallel; print a table (or JSON) of findings; 1 when any check fails. With `net`,
    then measure the network between the nodes with the run's own backend (a `net` column; with `net_all_gpus` one
    rank a GPU). With `slurm` (in an allocation) or `job`, the allocation's nodes, each reached through a step of the
    job instead of SSH. `job_args`: the job to check, as launch's --script, --module or --command name it. `pull`:
    first the container image on every node at once (`--pull`, a line each on stderr); 1 too where one failed."""
    from launcher import doctor as doctor_checks
    from launcher.report.states import console

    run_io = run_io or RunIO()
    if pull and (slurm or job):
        raise UsageError("--pull does not go with --slurm or --job (the nodes are reached through SLURM)")
    failed = _pulled(hosts, settings or Settings(), run_io) if pull else {}
    report = doctor_report(
        hosts,
        checks=checks,
        settings=settings,
        net=net,
        slurm=slurm,
        job=job,
        run_io=run_io,
        net_all_gpus=net_all_gpus,
        job_args=job_args,
    )
    if as_json:
        run_io.out.write(doctor_checks.report_json(report) + "\n")
    else:
        doctor_checks.render_table(report, console(run_io.out))
    if failed:
        from launcher.app.pulling import pull_failed

        run_io.err.write(f"error: {pull_failed(failed, 'the checks above show the image each node has')}\n")
    return 0 if report.ok and not failed else 1


def _pulled(hosts: str | Hosts, settings: Settings, run_io: RunIO) -> dict[str, str]:
    """`--pull` before the checks: the nodes whose pull failed, with why (each node's line said already)."""
    from launcher.app.pulling import pull_images

    return pull_images(load_inventory(hosts), settings, run_io.err)


def doctor_report(
    hosts: str | Hosts,
    *,
    checks: CheckMode = "all",
    settings: Settings | None = None,
    net: bool = False,
    slurm: bool = False,
    job: str | None = None,
    run_io: RunIO | None = None,
    net_all_gpus: bool = False,
    job_args: JobArgs | None = None,
) -> Report:
    """The doctor's findings on every node (what `doctor` prints): `launcher.doctor.evidence.Report`; the job checked
    is the one `job_args` name, else the inventory's."""
    from launcher import doctor as doctor_checks

    settings, run_io = settings or Settings(), run_io or RunIO()
    cluster = with_project_src(load_inventory(hosts), hosts)  # the script check looks for the script there too
    if job_args is not None and job_args.given() is not None:
        cluster = replace(cluster, job=job_of(cluster, job_args))
    if slurm or job:
        from launcher.app import slurm as on_slurm

        return on_slurm.slurm_doctor(
            cluster, job, checks=checks, net=net, settings=settings, run_io=run_io, all_gpus=net_all_gpus
        )
    report = doctor_checks.run_doctor(
        cluster, ssh=settings.ssh, checks=checks, probe_timeout=settings.run.probe_timeout
    )
    if net:
        from launcher.doctor.net import with_net  # torchrun on every node: only when asked

        report = with_net(report, cluster, settings, all_gpus=net_all_gpus)
    return report
