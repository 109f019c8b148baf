"""Running a stdlib-only Python program on a node with nothing installed there.

The command line holds only the node's setup lines (the inventory's `setup:`, run first in the same shell), the
node's interpreter and a one-line bootstrap; the program's source comes as the first stdin line (JSON-encoded) and
its request as the second. Arguments never pass through a remote shell, and secrets in a request never appear in
`ps`. Every node program travels this way: the agent (runs, supervise), the probe and listener (doctor), syncd.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from launcher.inventory import Host
from launcher.plan import quote_path

BOOTSTRAP = "import sys,json;exec(json.loads(sys.stdin.readline()))"
SETUP_FAILED = 125
"""The node command's exit code when a setup line failed (its own code is in the message): never 126 or 127, which
say that the interpreter itself is missing, nor a code the node programs use (0, 1, 2)."""
SETUP_MESSAGE = "setup line %s of %s failed with exit code %s, so nothing was started on this node: %s"
"""The line the node's shell writes to stderr when a setup line fails (printf format: number, count, code, line)."""


def python_command(python: str, setup: Sequence[str] = ()) -> str:
    """The shell command that runs the bootstrap under the node's interpreter (`~/` is the node's home).

    With setup lines, each runs first in the node's login shell, in order, then the interpreter replaces the shell
    (`exec`), so the node program, and torchrun after it, inherit what they set up (an activated venv puts a bare
    `python` on PATH). Each line runs as `{ LINE; }` in that same shell, with stdin from /dev/null (the program
    arrives on stdin and no setup line may eat it) and stdout sent to stderr (stdout carries the node program's
    answers; the launcher shows stderr lines as the node's messages). The first line that fails stops the command:
    the shell writes `SETUP_MESSAGE` after the line's own words and exits with `SETUP_FAILED`.
    """
    program = f"{quote_path(python)} -c {shlex.quote(BOOTSTRAP)}"
    if not setup:
        return program
    report = shlex.quote(SETUP_MESSAGE + "\\n")  # printf's own escape: the command stays on one line
    steps = [f"{{ {line}; }} </dev/null >&2 || {{ printf {report} {i} {len(setup)} \"$?\" {shlex.quote(line)} >&2; "
             f"exit {SETUP_FAILED}; }}" for i, line in enumerate(setup, start=1)]
    return "; ".join([*steps, f"exec {program}"])


def host_command(host: Host) -> str:
    """`python_command` for one inventory host: its setup lines, then its interpreter."""
    return python_command(host.python, host.setup)


def program_input(source: str, request: Mapping[str, Any]) -> bytes:
    """What to write to the command's stdin: the program, then its request."""
    return (json.dumps(source) + "\n" + json.dumps(request) + "\n").encode()
