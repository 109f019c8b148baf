"""The sandbox's record on disk: sandbox.json in its state folder (what `load`, `down` and `running` go by), written
whole or not at all, read with its fields checked, and the lock that serializes up/down/stop_node on one folder."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from devtools.sandbox.limits import SandboxError

NAME = "sandbox.json"
_NODE_KEYS = {"name", "addr", "port", "pid", "start_time"}
_DAEMON_KEYS = {"name", "exe", "pid", "start_time"}


def exists(state_dir: Path) -> bool:
    """A sandbox is recorded in `state_dir` (its processes may have died since)."""
    return (state_dir / NAME).exists()


def remove(state_dir: Path) -> None:
    """Forget the sandbox recorded in `state_dir` (once its processes are stopped)."""
    (state_dir / NAME).unlink()


def write(
    state_dir: Path,
    nodes: list[dict[str, Any]],
    ssh_config: Path,
    known_hosts: Path,
    identity: Path,
    inventory: Path,
    cluster: dict[str, Any] | None = None,
) -> None:
    """Record a started sandbox: its nodes (and SLURM daemons) by pid and start time, and its client files."""
    state = {
        "state_dir": str(state_dir),
        "ssh_config": str(ssh_config),
        "known_hosts": str(known_hosts),
        "identity_file": str(identity),
        "inventory": str(inventory),
        "nodes": nodes,
        **({"slurm": cluster} if cluster is not None else {}),
    }
    tmp = state_dir / f"{NAME}.tmp"  # renamed into place: a reader never sees half a file
    tmp.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    tmp.replace(state_dir / NAME)


def read(state_dir: Path) -> dict[str, Any]:
    """The record in `state_dir`; a SandboxError that says what to do when there is none or it is unreadable."""
    path = state_dir / NAME
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        if not all(node.keys() >= _NODE_KEYS for node in state["nodes"]):
            raise ValueError("a node lacks a field")
        if "slurm" in state and not all(d.keys() >= _DAEMON_KEYS for d in state["slurm"]["daemons"]):
            raise ValueError("a SLURM daemon lacks a field")
        return state
    except FileNotFoundError:
        raise SandboxError(f"no sandbox is up in {state_dir}: start one with `inv sandbox.up`.") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SandboxError(f"{path} is unreadable ({exc}); stop stray nodes by hand, then delete it.") from None


@contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Serialize up/down/stop_node on one state folder, across processes."""
    with open(state_dir / ".lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
