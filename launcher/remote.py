"""Running a stdlib-only Python program on a node with nothing installed there.

The command line holds only the node's interpreter and a one-line bootstrap; the program's source comes as the
first stdin line (JSON-encoded) and its request as the second. Arguments never pass through a remote shell, and
secrets in a request never appear in `ps`. The agent (runs) and the probe (doctor) both travel this way.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from launcher.plan import quote_path

BOOTSTRAP = "import sys,json;exec(json.loads(sys.stdin.readline()))"


def python_command(python: str) -> str:
    """The shell command that runs the bootstrap under the node's interpreter (`~/` is the node's home)."""
    return f"{quote_path(python)} -c {shlex.quote(BOOTSTRAP)}"


def program_input(source: str, request: Mapping[str, Any]) -> bytes:
    """What to write to the command's stdin: the program, then its request."""
    return (json.dumps(source) + "\n" + json.dumps(request) + "\n").encode()
