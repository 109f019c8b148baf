"""What a run uses of the inventory's settings, resolved once (pure): the command line's and the settings files'
(`launcher.options`) over the inventory's (`retries`, `job.hang_timeout`, `job.on_hang`), over the defaults; whether a
restart can apply where the run is followed (`recovery.restarts`) is folded in here too, with what the user is told of
a setting that does not apply (`RunSettings.notes`).

The application layer calls it once per command; the plan holds the value (`LaunchPlan.settings`) and every room that
follows the run reads it there (the node's request, the hang watch, the attempts, a stop's grace, the straggler teller).
"""

from __future__ import annotations

from dataclasses import replace

from launcher.config.model import Cluster, Job
from launcher.plan.recovery import WHERE, restarts
from launcher.settings import Settings

FROM_INVENTORY = {"retries": "retries", "hang_timeout": "job.hang_timeout", "on_hang": "job.on_hang"}
"""The settings an inventory may set too, by their inventory key."""


def for_run(settings: Settings, cluster: Cluster, job: Job | None = None, *, where: str = "attached") -> Settings:
    """The settings a run of `job` (default: the inventory's) on `cluster` uses, followed `where` (`recovery.WHERE`):
    each one set by the user (`settings.sources`), else the inventory's, else its default. Raises a UsageError for
    an option given that cannot apply there (`--retries` with a detached run)."""
    if where not in WHERE:
        raise ValueError(f"a run is followed one of {', '.join(WHERE)} ways, not {where!r}")
    job = job or cluster.job
    mine = {
        "retries": cluster.retries,
        "hang_timeout": job.hang_timeout if job is not None else None,
        "on_hang": job.on_hang if job is not None else None,
    }
    defaults = Settings()
    found = {
        name: value
        for name, value in mine.items()
        if value is not None and value != defaults.value(name) and not settings.given(name)
    }
    if where == "attach":  # `attach` follows one attempt: the launch that started the run chose whether to start again
        found.pop("retries", None)
    resolved = settings.updated(found, {name: f"{cluster.source} ({FROM_INVENTORY[name]})" for name in found})
    run = resolved.run
    policy = restarts(
        0 if where == "attach" else run.retries,
        run.on_hang,
        source=cluster.source,
        where=where,
        given=settings.given("retries"),
        on_hang_given=settings.given("on_hang"),
    )
    decided = {"retries": policy.retries, "on_hang": policy.on_hang}
    # A value the policy changed is no longer the one its source set (the note says why): none is shown as set.
    sources = {
        name: origin
        for name, origin in resolved.sources.items()
        if name not in decided or decided[name] == resolved.value(name)
    }
    run = replace(run, retries=policy.retries, on_hang=policy.on_hang, notes=policy.notes)
    return replace(resolved, run=run, sources=sources)
