"""The nodes' interpreter in the tests: a venv holding only what the project declares (torch and its dependencies).

This machine's Python carries more (numpy, scipy, ...) than a user's node venv; a node-side program that imports
something undeclared works here and fails there (a `.numpy()` call hid in train/ddp.py's resume until a user
retried a run). So the sandbox nodes of the integration tests run every node program (agent, probe, syncd, the
SLURM selector, torchrun, train/ddp.py) under a venv that holds pyproject.toml's dependencies plus its torch extra
and what they require, recursively: each distribution's files (its RECORD) are symlinked from this interpreter's
install, so a package outside the closure (numpy) cannot be imported. Linking takes a second or two and needs no
package index (`pip install torch==2.13.0 .` into a fresh venv takes ~25 s and 1 GB); the launcher itself is not
in it: nothing is installed on a node, its programs travel over stdin.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself requires tomli before 3.11
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]


class NodeEnvError(RuntimeError):
    """The declared closure cannot be built from this machine's install (run scripts/setup)."""


@dataclass(frozen=True)
class Env:
    python: Path
    """The venv's interpreter."""
    distributions: frozenset[str]
    """Canonical names of the distributions linked into it."""


CONTROLLER_ONLY = ("matplotlib",)
"""Dependencies only the launcher's own machine uses (the run's page's charts), never a node: a node env holding them
would hold numpy (matplotlib's), and a node program's undeclared numpy need would pass here and fail there."""


def declared_requirements(extras: tuple[str, ...] = ("torch",), node: bool = True) -> list[Requirement]:
    """pyproject.toml's dependencies and its `extras` (torch: what a node running train/ddp.py is told to install;
    trainers: Lightning and transformers, for the tests that run them); for a `node`, without CONTROLLER_ONLY."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [*project["dependencies"], *(r for extra in extras for r in project["optional-dependencies"][extra])]
    found = [Requirement(r) for r in wanted]
    return [r for r in found if not node or canonicalize_name(r.name) not in CONTROLLER_ONLY]


def closure(requirements: Iterable[Requirement]) -> dict[str, metadata.Distribution]:
    """The installed distributions that `requirements` need, recursively, by canonical name (markers evaluated here)."""
    found: dict[str, metadata.Distribution] = {}
    expanded: set[tuple[str, str]] = set()
    todo = [(req, "") for req in requirements]  # (requirement, the extra of its dependent that it comes with)
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        try:
            dist = found.get(name) or metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise NodeEnvError(f"{req} is required but not installed here: run scripts/setup") from None
        if not req.specifier.contains(dist.version, prereleases=True):
            raise NodeEnvError(f"{req} is required but {name} {dist.version} is installed here: run scripts/setup")
        found[name] = dist
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted) not in expanded:
                expanded.add((name, wanted))
                todo += [(Requirement(r), wanted) for r in dist.requires or []]
    return found


def make_venv(folder: Path) -> tuple[Path, Path]:
    """An empty venv (no pip, no system site-packages): its interpreter and its site-packages."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(folder)
    python = folder / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = Path(subprocess.check_output([python, "-I", "-c", where], text=True).strip())
    if not (site.is_dir() and site.is_relative_to(folder)):
        raise NodeEnvError(f"unexpected site-packages {site} for the venv {folder}")
    return python, site


def link_distribution(dist: metadata.Distribution, site: Path) -> None:
    """Symlink every file of `dist`'s RECORD (code, compiled bytecode, metadata) into `site`, file by file: folders
    that several distributions share (namespace packages) get only this distribution's files."""
    if dist.files is None:
        raise NodeEnvError(f"{dist.name} {dist.version} has no RECORD, so its files are unknown: reinstall it with pip")
    root = Path(dist.locate_file(""))
    folders: set[Path] = set()
    for file in dist.files:
        if file.is_absolute() or file.parts[0] == "..":
            continue  # console scripts and data outside site-packages: nodes run `python -m`
        target = site / file
        if target.parent not in folders:
            target.parent.mkdir(parents=True, exist_ok=True)
            folders.add(target.parent)
        if not target.is_symlink():
            target.symlink_to(root / file)


def build_declared_env(folder: Path, extras: tuple[str, ...] = ("torch",)) -> Env:
    """A venv in `folder` holding only the declared closure (torch, this project's dependencies, and `extras`)."""
    python, site = make_venv(folder)
    dists = closure(declared_requirements(("torch", *extras)))
    for dist in dists.values():
        link_distribution(dist, site)
    return Env(python, frozenset(dists))


def build_stdlib_env(folder: Path) -> Env:
    """A venv with nothing installed: what a node's bare Python offers the agent and the probe."""
    python, _ = make_venv(folder)
    return Env(python, frozenset())


INHERITED = "LAUNCHER_TESTS_NODE_ENV"
"""The declared env's interpreter, for the test programs this process starts (`python -m tests.support.ifaces`):
they use it rather than link their own (10-40 s on this machine's two cores while the suite runs)."""


@functools.cache
def declared_env() -> Env:
    """This test process's declared env, built once and removed at exit; a child process reuses its parent's."""
    inherited = os.environ.get(INHERITED)
    if inherited and Path(inherited).exists():
        dists = closure(declared_requirements(("torch",)))
        return Env(Path(inherited), frozenset(dists))
    folder = Path(tempfile.mkdtemp(prefix="ddp-launcher-node-env-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    env = build_declared_env(folder / "venv")
    os.environ[INHERITED] = str(env.python)
    return env


def node_python() -> str:
    """The interpreter the sandbox nodes of the tests run every node program with."""
    return str(declared_env().python)


@functools.cache
def trainers_env() -> Env:
    """The declared env with the `trainers` extra (Lightning, transformers), built once and removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix="ddp-launcher-trainers-env-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return build_declared_env(folder / "venv", ("trainers",))
