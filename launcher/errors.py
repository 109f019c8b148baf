"""Every error the launcher reports to a user: typed, carrying data, each saying what to do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class _Finding(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def check(self) -> str: ...
    @property
    def detail(self) -> str: ...
    @property
    def fix(self) -> str: ...


class _Report(Protocol):
    """What DoctorFailed reads of the doctor's report (this module, the bottom layer, imports no launcher module)."""

    @property
    def failures(self) -> Sequence[_Finding]: ...


class LauncherError(Exception):
    """Base of every error the launcher reports to a user (one clear message, no traceback)."""

    exit_code: int = 1


USAGE = 2
"""Exit code for wrong input on the command line (found before anything is contacted)."""


class UsageError(LauncherError):
    """An option on the command line is wrong or does not apply; exit code 2, nothing contacted."""

    exit_code = USAGE


class InventoryError(LauncherError):
    """The hosts inventory is malformed; the message names the file, line, entry and field."""

    def __init__(self, path: str, message: str, *, entry: str | None = None, line: int | None = None):
        self.path = path
        self.entry = entry
        self.line = line
        self.reason = message
        where = path if line is None else f"{path}:{line}"
        what = f"{entry}: " if entry else ""
        super().__init__(f"{where}: {what}{message}")


class PlanError(LauncherError, ValueError):
    """The inventory and the job cannot make a plan (no job, a script torchrun would read as an option)."""

    def __init__(self, source: str, message: str):
        self.source = source
        self.reason = message
        super().__init__(f"{source}: {message}")


class SelectionError(PlanError):
    """`--include`/`--exclude` names what the inventory does not have: the command line is wrong (exit code 2)."""

    exit_code = USAGE


class ConnectError(LauncherError):
    """One or more nodes could not be reached; carries one failure per node."""

    def __init__(self, failures: list[NodeFailure]):
        self.failures = failures
        lines = [f"cannot reach {len(failures)} node(s); nothing was started:"]
        lines += [f"  {f}" for f in failures]
        super().__init__("\n".join(lines))


class NodeFailure:
    """Why one node failed (a value, not an exception): its kind, detail and the likely fix."""

    kinds = (
        "unresolvable",
        "refused",
        "timeout",
        "auth",
        "host-key-unknown",
        "host-key-changed",
        "key-file",
        "ssh",
        "remote",
    )

    def __init__(self, host: str, kind: str, detail: str, fix: str = ""):
        self.host, self.kind, self.detail, self.fix = host, kind, detail, fix

    def __str__(self) -> str:
        text = f"{self.host}: {self.kind}: {self.detail}"
        return f"{text} (fix: {self.fix})" if self.fix else text

    def __repr__(self) -> str:
        return f"NodeFailure({self.host!r}, {self.kind!r}, {self.detail!r})"


class SyncFailed(LauncherError):
    """The tree could not be synced to some nodes; one sentence each."""

    def __init__(self, failures: Sequence[NodeFailure], what: str = ""):
        self.failures = list(failures)
        lines = [f"could not sync the code to {len(self.failures)} node(s){what}:"]
        lines += [f"  {f}" for f in self.failures]
        super().__init__("\n".join(lines))


class RunFailed(LauncherError):
    """A launched run failed on at least one node; carries the root cause (like torch's `ChildFailedError`)."""

    def __init__(
        self,
        message: str,
        exit_code: int,
        *,
        node: str | None = None,
        rank: int | None = None,
        tail: tuple[str, ...] = (),
        ends: tuple[Any, ...] = (),
    ):
        self.exit_code = exit_code
        self.node = node
        """The node of the first failure, if one was found."""
        self.rank = rank
        """Its failed global rank, when torchrun named one."""
        self.tail = tail
        """The last lines of that node's output."""
        self.ends = ends
        """How each node's part ended (`launcher.events.NodeEnd`); empty when the run never started."""
        super().__init__(message)


class DoctorFailed(LauncherError):
    """The doctor's fast checks failed before a launch; nothing was started. Carries the report."""

    exit_code = 1

    def __init__(self, report: _Report, more: str | None = None):
        """`more`: a last line, where to look further (the doctor's command: `launcher.doctor.collect.DoctorGate`)."""
        self.report = report
        lines = [f"the doctor found {len(report.failures)} problem(s); nothing was started:"]
        for f in report.failures:
            lines.append(f"  {f.host} {f.check}: {f.detail}")
            if f.fix:
                lines.append(f"    fix: {f.fix}")
        if more:
            lines.append(more)
        super().__init__("\n".join(lines))


class UnsafeProject(LauncherError):
    """A project file (its config, an inventory found through it) belongs to another user: a project's config is
    code this user would run (its inventory's `setup:` lines, an ssh config's `Match exec`), so it is not read."""

    def __init__(self, path: str, owner: str, user: str, setting: str):
        self.path, self.owner = path, owner
        super().__init__(
            f"{path} belongs to {owner}, not to you ({user}): a project's settings are code you run (its "
            f"inventory's setup: lines, its ssh config), so they are never read from another user's "
            f"folder or file. If you trust it, add its folder to {setting}"
        )


class StillRunning(LauncherError, TimeoutError):
    """A run was waited for (`launcher.api.Run.wait`) and is still running at the end of the wait."""
