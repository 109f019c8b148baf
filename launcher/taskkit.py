"""What every task of `launcher.tasks` shares: the `@task` decorator (long options only, but `-v`), one-line errors
and exit codes (`reported`), the settings and the inventory as the command line and the settings files give them, and
the help texts of the options many tasks have."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

from invoke import Context, Exit, Task
from invoke import task as invoke_task

from launcher import app, options, trace
from launcher.cliconfig import NOT_OPTIONS, SECTION, sources
from launcher.errors import USAGE, LauncherError
from launcher.paths import called_as, invoked_as, relative, task_prefix
from launcher.project import check_owner, resolve
from launcher.settings import DEFAULT_PULL_TIMEOUT, Settings

HOSTS_HELP = (
    "inventory, or DeepSpeed/MPI hostfile (`worker-1 slots=8` a line; every other setting from the "
    "defaults and job settings); default: the hosts setting (invoke.yaml's launcher.hosts, ddpl.yaml's "
    "hosts)"
)
INCLUDE_HELP = "only these hosts, DeepSpeed's syntax: worker-1:0,2@worker-2 (GPU indices after :, hosts joined by @)"
EXCLUDE_HELP = "every host but these (or without these GPUs), same syntax as --include"
RUN_HELP = "run id (default: the run of this inventory that is running, else its newest)"
JOB_HELP = "a SLURM job id (from the slurm.submit task): ask SLURM instead of the nodes"
SCRIPT_HELP = "script to run instead of the inventory's job.script (relative to each node's workdir)"
MODULE_HELP = "Python module to run instead of the inventory's job (torchrun -m MODULE)"
COMMAND_HELP = "program to run instead of the inventory's job, not under Python (torchrun --no-python COMMAND)"
ARGS_HELP = (
    "arguments for the script, as one shell-quoted string (replaces job.args); or give them after `--` at the "
    "end, as torchrun takes them: `launch --hosts H -- --steps 200`"
)


def script_args(args: str | None) -> str | None:
    """The script's arguments: `--args`, or the words after the command line's `--` (Invoke keeps them from every
    task: they would be dropped without a word), shell-quoted; an Exit where both are given."""
    argv = sys.argv[1:]
    if "--" not in argv:
        return args
    after = argv[argv.index("--") + 1 :]
    if args is not None:
        raise Exit("error: --args and the words after `--` both give the script's arguments: give one of them", USAGE)
    return shlex.join(after)


class _Task(Task):
    """A task whose `--verbose` is `-v` too, the one short flag (as `ssh -v`, `pip -v`)."""

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        if name == "verbose":
            opts["names"] = [*opts["names"], "v"]
        return opts


def task(*args: Any, **kwargs: Any) -> Any:
    """Invoke's `@task` without its automatic short flags: made from each option's first letter, `-e` meant
    --detach in one task and --exclude in another, and --hang-timeout got a broken `--=STRING` (its `-h` is help's).
    Long options only, one meaning each, everywhere; but `--verbose`, which is `-v` too."""
    if args and callable(args[0]):
        return invoke_task(auto_shortflags=False, klass=_Task)(args[0])
    return invoke_task(*args, auto_shortflags=False, klass=_Task, **kwargs)


IMAGE_HELP = (
    "run the job in this container image on every node (over the inventory's container.image; a host without one "
    "gets podman or docker's defaults)"
)
PULL_HELP = (
    "first pull the container image on every node at once (a line for each node as its pull ends); where one "
    "fails, launch starts nothing"
)
PULL_TIMEOUT_HELP = f"seconds each node has to pull the image with --pull (default: {DEFAULT_PULL_TIMEOUT:g})"
VERBOSE_HELP = (
    "also show the launcher's own trace on the console: connections, messages sent and heard, its "
    "decisions and why, timings (every run writes it to logs/<run id>/launcher.log anyway)"
)


def verbose_on(on: bool) -> None:
    if on:
        trace.verbose()


def reported(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a task body; a LauncherError becomes its message and exit code, never a traceback. Its messages name the
    command that runs it (`ddpl`, or `inv`: the prefix of Invoke's config) and the collection its tasks were added
    as in a project's tasks.py (`inv ddp.doctor`)."""
    path = fn.__name__.replace("_", ".")  # its name in `ns`: slurm_submit is the `submit` of `slurm`

    @wraps(fn)
    def wrapper(c: Context, *args: Any, **kwargs: Any) -> None:
        try:
            with called_as(invoked_as(c.config.prefix), task_prefix(path, sys.argv)):
                code = fn(c, *args, **kwargs)
        except LauncherError as exc:
            message, code = app.main_error(exc)
            raise Exit(f"error: {message}", code) from None
        if code:
            raise Exit(code=code)

    return wrapper


def project_root(c: Context) -> Path | None:
    """The installed command's project folder (`launcher.cliconfig.DdplConfig`); None for a checkout's `inv`, whose
    settings' paths stay relative to the current folder."""
    return getattr(c.config, "project_root", None)


def task_settings(c: Context, given: options.Given | None = None) -> Settings:
    """The `launcher:` settings (invoke.yaml, or ddpl's files), then the options the command line `given`, every
    number checked and noted with where it came from; a relative log_dir in ddpl's settings is the project's."""
    overrides = (given or options.Given()).values()
    try:
        config = {k: v for k, v in c.config.get(SECTION, {}).items() if k not in NOT_OPTIONS}
        root = project_root(c)
        if root is None:
            return options.from_config(config, overrides, origins=sources(c.config))
        if config.get("log_dir") is not None:
            config["log_dir"] = str(resolve(config["log_dir"], root))
        return options.from_config(config, overrides, sources=sources(c.config), section="")
    except LauncherError as exc:
        raise Exit(f"error: {exc}", USAGE) from None


def none_given(what: str, **others: Any) -> None:
    """Exit with a usage error when any of `others` was given: it does not apply to `what`."""
    given = [name for name, value in others.items() if value not in (None, False)]
    if given:
        raise Exit(f"error: --{given[0].replace('_', '-')} does not apply to {what}", USAGE)


def slurm_job(job: str, **others: Any) -> str:
    """`--job` as given, once no option of a run over SSH comes with it (SLURM knows the job's nodes)."""
    none_given("a SLURM job (--job)", **others)
    return job


def inventory_path(c: Context) -> Path:
    """The `hosts` setting's inventory: in ddpl's settings, the project's (only when this user owns it)."""
    config = c.config.get(SECTION, {})
    root, path = project_root(c), Path(config.get("hosts") or options.DEFAULT_HOSTS)
    if root is None:
        return path
    found = resolve(path, root)
    check_owner(found, c.config.safe_directories())
    return Path(relative(found))


def task_hosts(
    c: Context, hosts: str | None, include: str | None = None, exclude: str | None = None, image: str | None = None
) -> app.Hosts:
    """`--hosts` (default: the `hosts` setting), what a hostfile takes from the settings, the hosts chosen, and
    `--image` over the inventory's container image."""
    config = c.config.get(SECTION, {})
    root = project_root(c)
    where = sources(c.config).get("defaults", "invoke.yaml") if root is not None else "invoke.yaml"
    return app.Hosts(
        hosts or str(inventory_path(c)),
        config.get("defaults"),
        config.get("job"),
        include,
        exclude,
        project=root,
        defaults_source=where,
        image=image,
    )


def hosts_from(c: Context, hosts: str | None) -> str | None:
    """Where the inventory was named, unless at its default: `--hosts`, else the settings' file or variable."""
    found = sources(c.config).get("hosts")
    return "--hosts" if hosts else None if found in (None, "default") else found
