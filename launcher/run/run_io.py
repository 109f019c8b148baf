"""A run's I/O (`RunIO`): what a task's run talks to besides its options: where output goes, what runs before `go`,
who hears events.

These are collaborators, not settings: `launcher.settings.Settings` is a frozen value a user's config and command
line make; a `RunIO` is made by the application layer (or the bench, or a test) for one call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from launcher.run.gate import StartGate


@dataclass(frozen=True)
class RunIO:
    """A run's I/O: its output streams, its start gate, its event sink."""

    out: IO[str] = field(default_factory=lambda: sys.stdout)
    """Where node output goes (prefixed lines), and a task's own answer (tables, JSON)."""
    err: IO[str] = field(default_factory=lambda: sys.stderr)
    """Where the launcher's own progress and reports go."""
    gate: StartGate | None = None
    """What runs before anything starts: the doctor's fast checks in every agent's start session
    (`launcher.doctor.collect.DoctorGate`), and work on the open connections first (`launch --sync`)."""
    on_event: Callable[[Any], None] | None = None
    """Called with every typed node event of an attached run (`launcher.run.handle`), from the launcher's threads:
    it must not block. For tools such as the bench."""
    on_end: Callable[[Any], None] | None = None
    """Called once with how an attached run ended (`launcher.plan.ends.RunEnd`), before the launch returns or raises:
    what the attempts decide on (`launcher.run.attempts`)."""
