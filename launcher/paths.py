"""Where the launcher's own files are, how a path is shown to a user, and how a message names what to run next (the
command the user typed, or the API's call): the bottom layer, it imports nothing."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
"""This checkout (tasks.py's folder): a submitted SLURM job starts there and runs the same code."""


def relative(path: Path) -> str:
    """`path` relative to the current folder when it is under it (as a user typed it), else whole."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


_CALLERS: list[tuple[str, str]] = []
"""How the launcher is being called, innermost last (`called_as`): (`ddpl`, `inv` or `api`; the collection path the
user typed before a task's own name: `ddp.` for `inv ddp.launch`)."""

API = "api"
"""The caller name of the Python API (launcher/api.py): its hints are calls, where it has them."""


@contextmanager
def called_as(name: str, prefix: str = "") -> Iterator[None]:
    """Within: the launcher runs for `name`'s user (the task layer says `ddpl` or `inv` from Invoke's config, the API
    `api`), and every message's hint names that command (`command_name`, `hint`), its tasks under `prefix` (`ddp.`:
    a project's own tasks.py that added the launcher's as a collection, `task_prefix`)."""
    _CALLERS.append((name, prefix))
    try:
        yield
    finally:
        _CALLERS.pop()


def invoked_as(config_prefix: str) -> str:
    """The command a user typed, from the prefix of its Invoke config: `ddpl` (launcher/cliconfig.py), `invoke` for a
    tasks.py run by `inv` (the checkout's, or a project's own with the launcher's tasks added), `fabric` for `fab`."""
    return {"invoke": "inv", "fabric": "fab"}.get(config_prefix, config_prefix)


def command_name() -> str:
    """The command that runs the launcher's tasks in this call, as the hints in messages name it: the one `called_as`
    gave (the API's: `ddpl`, the installed command beside it, for what has no call); outside any, `ddpl` (the
    installed command, or `python -m launcher`), else `inv`."""
    if _CALLERS:
        return "ddpl" if _CALLERS[-1][0] == API else _CALLERS[-1][0]
    first = sys.argv[0] if sys.argv else ""
    return "ddpl" if Path(first).name == "ddpl" or Path(first).parts[-2:] == ("launcher", "__main__.py") else "inv"


def task_prefix(path: str, argv: Sequence[str]) -> str:
    """The collection path a user typed before the task `path` (`launch`, `slurm.submit`) on the command line `argv`:
    `ddp.` for `inv ddp.launch` (a project's tasks.py with `ns.add_collection(launcher.tasks.ns, "ddp")`), "" for
    `ddpl launch` or this checkout's `inv launch`. Invoke does not tell a task the name it was called by."""
    names = {path, path.replace("_", "-")}
    for word in argv[1:]:
        for name in names:
            if word.endswith("." + name) and not word.startswith("-"):
                return word[: -len(name)]
            if word == name:
                return ""
    return ""


def task_call(task: str) -> str:
    """`task` with its options (`doctor --hosts H`) as the user runs it here: `ddpl doctor --hosts H`, `inv ddp.doctor
    ...`."""
    prefix = _CALLERS[-1][1] if _CALLERS else ""
    return f"{command_name()} {prefix}{task}"


def stop_call(hosts: str, run_id: str) -> str:
    """The API's call that stops run `run_id` of the inventory `hosts` (a hint's `api` form)."""
    return f"api.run({hosts!r}, {run_id!r}).stop()"


def detached_hint(source: str) -> str:
    """What works on a detached run of the inventory `source`, in the caller's words: its commands, or the Run handle
    the API returned."""
    if from_api():
        return "the Run handle api.launch returned works on it: status(), logs(), top(), stacks(), stop(), wait()"
    hosts = f"--hosts {source}"
    return f"`{hint(f'status {hosts}')}`, `{hint(f'logs {hosts} --follow')}` and `{hint(f'stop {hosts}')}` work on it"


def from_api() -> bool:
    """Whether this call came through the Python API."""
    return bool(_CALLERS) and _CALLERS[-1][0] == API


def hint(names: str, api: str | None = None) -> str:
    """A command a message tells the user to run, without its quotes: `ddpl WORDS` (`inv WORDS`); from the Python
    API, the call `api` where it has one (`api.doctor('hosts/cluster.yaml')`)."""
    return api if api is not None and from_api() else task_call(names)
