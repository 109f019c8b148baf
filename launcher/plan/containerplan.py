"""A node's container as its agent is asked to run it (pure): the inventory's `container:`, and the setup lines as
the shell inside the image runs them before torchrun's python.

On a container host the node's own Python runs only the launcher's programs (`container.host_python`); the host's
`python:` and `setup:` are the image's: the lines run inside the container, in its shell, before the python that
becomes torchrun, as they run before the agent on a bare host (each in the same shell, stdin from /dev/null, the
first that fails ends the start with SETUP_FAILED and says which).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from launcher.config.model import Container

SETUP_FAILED = 125
"""The node command's exit code when a setup line failed (its own code is in the message): never 126 or 127, which
say that the interpreter itself is missing, nor a code the node programs use (0, 1, 2)."""
SETUP_MESSAGE = "setup line %s of %s failed with exit code %s, so nothing was started on this node: %s"
"""The line the node's shell writes to stderr when a setup line fails (printf format: number, count, code, line)."""


def setup_steps(setup: Sequence[str]) -> list[str]:
    """Each setup line as one shell step: run in this shell (`{ LINE; }`), stdin from /dev/null, stdout to stderr;
    a failure writes SETUP_MESSAGE and exits with SETUP_FAILED."""
    report = shlex.quote(SETUP_MESSAGE + "\\n")  # printf's own escape: the command stays on one line
    return [
        f'{{ {line}; }} </dev/null >&2 || {{ printf {report} {i} {len(setup)} "$?" {shlex.quote(line)} >&2; '
        f"exit {SETUP_FAILED}; }}"
        for i, line in enumerate(setup, start=1)
    ]


def start_script(setup: Sequence[str]) -> str:
    """What `sh -c` runs first in the container: the setup lines, then its arguments (`exec "$@"`: python)."""
    return "; ".join([*setup_steps(setup), 'exec "$@"'])


def container_request(container: Container, setup: Sequence[str]) -> dict[str, Any]:
    """The start request's `container` part: the image and how to run it; the agent adds the run's own."""
    return {
        "image": container.image,
        "runtime": container.runtime,
        "mounts": list(container.mounts),
        "options": list(container.options),
        "pull": container.pull,
        "script": start_script(setup),
    }
