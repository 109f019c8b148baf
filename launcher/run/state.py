"""An attached run's state as one value, as torch elastic's `WorkerState` is its worker group's: the run's (`RunState`)
and each node's (`NodeState`), which the run's handle (`launcher.run.handle.RunHandle`) moves through in one loop.

    STARTING --every node started--> RUNNING --a stop (asked, fail fast, a hang)--> STOPPING --every end--> ENDED
        \\--a node cannot start, the gate refuses, Ctrl-C--> STOPPING (what started is stopped: all or none)

    a node:  OPENING --ready--> READY --go, started--> RUNNING --stop sent--> STOPPING --its end--> ENDED
                                         RUNNING <--a new session (reattached)-- AWAY <--its session lost--
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum


class RunState(str, Enum):
    """The whole attached run."""

    STARTING = "starting"
    """Its sessions open, the start gate's checks run, every node says ready, then `go`."""
    RUNNING = "running"
    """Every node's part started (or, for `attach`, every node's run was taken)."""
    STOPPING = "stopping"
    """A stop went out (asked for, a failed node, a hang, a start that failed): waiting for every node's end."""
    ENDED = "ended"
    """Every node's part ended (and the nodes whose agent died were swept)."""

    def __str__(self) -> str:
        return self.value


class NodeState(str, Enum):
    """One node's part of an attached run, as its session shows it."""

    OPENING = "opening"
    """Its session is open: its agent starts, checks what the gate asks."""
    READY = "ready"
    """Its agent is ready: waiting for `go`."""
    RUNNING = "running"
    """Its part (torchrun) started."""
    AWAY = "away"
    """Its session was lost; a new one is being opened (the silence timeout runs)."""
    STOPPING = "stopping"
    """Asked to stop (TERM, grace, KILL)."""
    ENDED = "ended"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class GroupState:
    """The run's state and every node's, at one moment."""

    run: RunState
    nodes: Mapping[str, NodeState]
