"""Running a node program (`launcher/node/`, stdlib only) on a node with nothing installed there.

The command line holds only the node's setup lines (the inventory's `setup:`, run first in the same shell), the
node's interpreter and a one-line bootstrap; the program comes as the first stdin line (zlib-compressed, in
base64: the node package's loader and sources, `node_program`) and its request as the second. Arguments never pass
through a remote shell, and secrets in a request never appear in `ps`. Every node program travels this way: the
agent (runs, supervise), the probe and listener (doctor), syncd, and under SLURM the selector before the agent.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import re
import shlex
import zlib
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import launcher.node as node_package
from launcher.config.model import Host
from launcher.limits import NODE_CODE_CACHE
from launcher.node.wire import EVENTS_FD
from launcher.plan.containerplan import SETUP_FAILED, SETUP_MESSAGE, setup_steps
from launcher.plan.launchplan import quote_path

__all__ = ["SETUP_FAILED", "SETUP_MESSAGE"]  # where the doctor and the tests have read them

BOOTSTRAP = "import sys,zlib,binascii;exec(zlib.decompress(binascii.a2b_base64(sys.stdin.readline())))"
"""What `python -c` runs on a node: the program of the first stdin line (`program_line`)."""


def python_command(python: str, setup: Sequence[str] = ()) -> str:
    """The shell command that runs the bootstrap under the node's interpreter (`~/` is the node's home).

    With setup lines, each runs first in the node's login shell, in order, then the interpreter replaces the shell
    (`exec`), so the node program, and torchrun after it, inherit what they set up (an activated venv puts a bare
    `python` on PATH). Each line runs as `{ LINE; }` in that same shell, with stdin from /dev/null (the program
    arrives on stdin and no setup line may eat it) and stdout sent to stderr (stdout carries the node program's
    answers; the launcher shows stderr lines as the node's messages). The first line that fails stops the command:
    the shell writes `SETUP_MESSAGE` after the line's own words and exits with `SETUP_FAILED`.
    """
    # -S: no site at start (~20 ms of CPU a session on a pyenv or conda Python): the node programs are stdlib; what
    # reads the installed packages adds it then (launcher/node/probe/facts.py `with_site`).
    # 3>&2: the session's stderr again as fd 3, where the node program writes its events (wire.EVENTS_FD): a
    # `python:` wrapper that sends the program's own stderr elsewhere (`exec python "$@" 2>/dev/null`) keeps them.
    # exec: the node program replaces the login shell, so it alone holds the session's pipes (an attached run's
    # supervisor that lets its console go closes them, and the launcher sees that session's output end).
    program = f"{quote_path(python)} -S -c {shlex.quote(BOOTSTRAP)} {EVENTS_FD}>&2"
    if not setup:
        return f"exec {program}"
    steps = setup_steps(setup)
    return "; ".join([*steps, f"exec {program}"])


def host_command(host: Host) -> str:
    """`python_command` for one inventory host: its setup lines, then its interpreter; on a container host its own
    Python alone (the setup lines and `python:` are the image's: launcher/plan/containerplan.py)."""
    if host.container is not None:
        return python_command(host.container.host_python)
    return python_command(host.python, host.setup)


@cache
def program_line(source: str) -> str:
    """A node program as the bootstrap reads it: zlib-compressed, in base64, one line. The agent's sources are
    ~200 kB and travel in every session to every node (53 MB a launch at 256 nodes, as JSON text); compressed, 80 kB.
    Compressed once a process: a program's text does not change."""
    return binascii.b2a_base64(zlib.compress(source.encode(), 9), newline=False).decode("ascii")


def program_input(source: str, request: Mapping[str, Any]) -> bytes:
    """What to write to the command's stdin: the program, then its request."""
    return (program_line(source) + "\n" + json.dumps(request) + "\n").encode()


def _module(file_name: str, source: str) -> tuple[str, str, str]:
    """A module as the loader takes it: file name, source, and the digest its compiled form is cached under."""
    digest = hashlib.sha256(f"{file_name}\0{source}".encode()).hexdigest()[:32]
    return file_name, source, digest


@cache
def _node_sources() -> tuple[str, dict[str, tuple[str, str, str]]]:
    """The loader's source and every module of the node package, its sub-packages' too (name -> (file name, source,
    digest)), read once: `launcher/node/agent/runner.py` is `launcher.node.agent.runner`, a folder's `__init__.py`
    the package itself."""
    folder = Path(node_package.__file__).parent  # the package's own folder (importlib.resources: 6 ms of imports)
    modules = {"launcher": _module("launcher/__init__.py", "")}  # the controller's package root is not the node's
    for item in sorted(folder.rglob("*.py")):
        path = item.relative_to(folder)
        parts = path.with_suffix("").parts
        name = ".".join(("launcher", "node", *(parts[:-1] if parts[-1] == "__init__" else parts)))
        modules[name] = _module(f"launcher/node/{path.as_posix()}", item.read_text(encoding="utf-8"))
    return modules["launcher.node.loader"][1], modules


_NODE_IMPORT = re.compile(
    r"^\s*(?:from (launcher\.node(?:\.\w+)*) import (?:\(((?:[^)#]|#.*$)*)\)|([\w, ]+))"
    r"|import (launcher\.node(?:\.\w+)+))",
    re.M,
)
"""A node module's imports of others: `from launcher.node.agent import runner` (a module of a package),
`from launcher.node.agent.runner import x`, `import launcher.node.agent.runner`, a parenthesised list over several
lines too (`from launcher.node.common import (`), comments in it as well."""


def _needed(entry: str, modules: Mapping[str, tuple[str, str, str]]) -> set[str]:
    """`entry` (a module under launcher.node: `agent.agent`) and the node modules it imports, and theirs (read from
    their import lines), with the packages that hold them (their `__init__`, which Python imports first)."""
    needed, todo = {"launcher", "launcher.node"}, [f"launcher.node.{entry}"]
    while todo:
        name = todo.pop()
        if name in needed or name not in modules:
            continue
        needed.add(name)
        todo.append(name.rpartition(".")[0])
        for base, listed, names, plain in _NODE_IMPORT.findall(modules[name][1]):
            if plain:
                todo.append(plain)
                continue
            todo.append(base)  # a name that is no module (a function, a constant) is not in `modules`: skipped
            listed = re.sub(r"#.*", "", listed)  # a name's comment inside the parentheses
            todo.extend(f"{base}.{n.split()[0]}" for n in (listed or names).split(",") if n.strip())
    return needed


def node_files(entry: str) -> dict[str, str]:
    """The node modules program `entry` is sent with, as file name -> source (the loader's first)."""
    loader, modules = _node_sources()
    files = {"launcher/node/loader.py": loader}
    files.update({modules[name][0]: modules[name][1] for name in sorted(_needed(entry, modules)) if modules[name][1]})
    return files


@cache
def node_program(entry: str) -> str:
    """The source the bootstrap execs for node program `entry`, its module under launcher/node/ (`agent.agent`,
    `probe.probe`, `probe.seek`, `sync.syncd`, `slurm.selector`): the loader, then `run()` of that module with the
    node modules it imports (each compiled, or taken from the node's code cache, when first imported)."""
    loader, modules = _node_sources()
    if f"launcher.node.{entry}" not in modules or modules[f"launcher.node.{entry}"][0].endswith("__init__.py"):
        raise ValueError(f"no node program {entry!r} in launcher/node/ (a package is none: `agent.agent`)")
    sent = {name: modules[name] for name in sorted(_needed(entry, modules))}
    return f"{loader}\nrun({f'launcher.node.{entry}'!r}, {json.dumps(sent)}, {json.dumps(NODE_CODE_CACHE)})\n"
