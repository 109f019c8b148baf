"""What a node has, read from its files (stdlib only, Python 3.8+; torch is never imported): Python, torch, CUDA
and NCCL versions, the installed distributions. Its GPUs: launcher/node/common/gpus.py."""

import os
import re
import sys

from launcher.node.common import bounds
from launcher.node.common.child import which

NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


_site_added = False


def sha256(data=b""):
    """hashlib.sha256, from the built-in module hashlib itself falls back on: hashlib's import (OpenSSL's _hashlib)
    costs 3-4 ms of CPU on every node at every check. hashlib where the build has no such module."""
    for name in ("_sha2", "_sha256"):  # 3.12+, 3.8-3.11
        try:
            return __import__(name).sha256(data)
        except ImportError:
            continue
    import hashlib

    return hashlib.sha256(data)


def with_site():
    """Put the interpreter's site-packages (and the folders its .pth files name) on sys.path, once, as site would.

    Node programs start under `python -S` (launcher/transport/program.py): site's imports cost ~20 ms of CPU on
    every node and every session, and only what reads the installed packages needs them. Even then the .pth files'
    `import` lines are not run (an editable install's finder costs ~3 ms of CPU on every node) nor sitecustomize:
    what reads installed metadata needs the folders, not the hooks. Where site's parts are not as in CPython
    3.8-3.13, site.main() does it all.
    """
    global _site_added
    if not sys.flags.no_site or _site_added:
        return
    import site

    _site_added = True
    real = site.addpackage
    site.addpackage = _pth_folders
    try:
        known = site.venv(site.removeduppaths())
        if site.ENABLE_USER_SITE is None:
            site.ENABLE_USER_SITE = site.check_enableusersite()
        site.addsitepackages(site.addusersitepackages(known))
    except (AttributeError, TypeError):
        site.addpackage = real
        site.main()
    finally:
        site.addpackage = real


def _pth_folders(sitedir, name, known_paths):
    """site.addpackage without running the file's `import` lines: the folders it names join sys.path."""
    import site

    try:
        with open(os.path.join(sitedir, name), encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return known_paths
    for line in lines:
        if not line.strip() or line.startswith(("#", "import ", "import\t")):
            continue
        folder, case = site.makepath(sitedir, line.rstrip())
        if case not in known_paths and os.path.exists(folder):
            sys.path.append(folder)
            known_paths.add(case)
    return known_paths


IMPLEMENTATIONS = {"cpython": "CPython", "pypy": "PyPy", "ironpython": "IronPython", "jython": "Jython"}


def python_info():
    """platform.python_version() and python_implementation(), read as platform reads them but without importing it
    (2 ms of CPU on every node at every launch)."""
    name = sys.implementation.name
    return {
        "version": sys.version.split()[0],
        "executable": sys.executable,
        "implementation": IMPLEMENTATIONS.get(name, name),
    }


def python_wrapper(given):
    """How the `python:` the launcher ran reaches this interpreter: None where it is this interpreter (a venv's link
    too); else {path, runs, execs}: `path` is a wrapper (a shell script, a pyenv shim, `conda run`) that runs `runs`,
    and `execs` says whether it became python (exec) or stays as its parent process."""
    if not given:
        return None
    found = which(os.path.expanduser(given), os.environ.get("PATH"))
    if found is None:
        return None
    path = os.path.abspath(found)
    real, runs = os.path.realpath(path), os.path.realpath(sys.executable)
    if real == runs:
        return None
    try:
        with open("/proc/%d/cmdline" % os.getppid(), "rb") as handle:
            parent = handle.read().split(b"\0")
    except OSError:
        parent = []
    stays = any(os.path.realpath(os.fsdecode(word)) == real for word in parent[:3] if word)
    return {"path": path, "runs": runs, "execs": not stays}


def assigned_value(text, name):
    """The literal assigned to `name` at the top of a module's text (`cuda: Optional[str] = '12.1'`)."""
    match = re.search(r"^" + re.escape(name) + r"\s*(?::[^=\n]*)?=\s*(.+?)\s*$", text, re.MULTILINE)
    if not match:
        return None
    literal = match.group(1)
    if literal == "None":
        return None
    if (
        len(literal) > 1
        and literal[0] == literal[-1]
        and literal[0] in "'\""
        and "\\" not in literal
        and literal[0] not in literal[1:-1]
    ):
        return literal[1:-1]  # a plain quoted string, as torch writes its versions: no `ast` (2.7 ms a probe)
    import ast

    try:
        value = ast.literal_eval(literal)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def torch_info():
    """torch's version from its installed metadata, CUDA from torch/version.py's text: no `import torch`.

    The metadata folders are found by name on sys.path, as `packages` lists them (importlib.metadata's import and
    its search cost a probe ~10 ms on every node).
    """
    with_site()
    found = _first_dists(("torch", *NCCL_DISTS))
    if "torch" not in found:
        # Where to install it: a distribution's own python (Debian 12, Ubuntu 24.04) refuses pip (PEP 668), a venv not.
        managed = sys.prefix == getattr(sys, "base_prefix", sys.prefix) and os.path.exists(
            os.path.join(os.path.dirname(os.__file__), "EXTERNALLY-MANAGED")
        )
        return {"version": None, "managed": managed}
    folder, version = found["torch"]
    info = {"version": version, "cuda": None, "cuda_known": False, "nccl": None}
    try:
        with open(os.path.join(folder, "torch", "version.py"), encoding="utf-8") as handle:
            info["cuda"] = assigned_value(handle.read(), "cuda")
            info["cuda_known"] = True
    except (OSError, ValueError):
        pass  # metadata without the package files (e.g. a bare dist-info): CUDA unknown, not "none"
    for name in NCCL_DISTS:  # pip wheels of torch bring their NCCL as a distribution of its own
        if name in found:
            info["nccl"] = found[name][1]
            break
    return info


def _normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _first_dists(names):
    """{name: (the folder it is installed in, its version)} for those of `names` installed, the first on sys.path
    winning as for imports."""
    wanted, found = {_normal(n): n for n in names}, {}
    for folder, (dist, version) in _dists_on_path():
        name = wanted.get(_normal(dist))
        if name is not None and name not in found:
            found[name] = (folder, version)
    return found


def _dists_on_path():
    """(folder, (name, version)) of every metadata folder on sys.path, in import order (one listdir a folder)."""
    for folder in sys.path:
        try:
            entries = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for entry in entries:
            found = _dist_entry(folder or ".", entry)
            if found is not None:
                yield folder or ".", found


def _dist_entry(folder, entry):
    """(name, version) of a .dist-info/.egg-info folder from its name; None when the name doesn't say."""
    stem, _, kind = entry.rpartition(".")
    if kind not in ("dist-info", "egg-info"):
        return None
    parts = stem.split("-")
    if len(parts) >= 2 and parts[0] and parts[1]:
        return parts[0], parts[1]
    for meta in ("METADATA", "PKG-INFO"):  # e.g. `pkg.egg-info` of a develop install: read its header
        try:
            with open(os.path.join(folder, entry, meta), encoding="utf-8", errors="replace") as handle:
                header = handle.read(bounds.METADATA_HEADER_BYTES)
        except OSError:
            continue
        name = re.search(r"^Name:\s*(\S+)", header, re.MULTILINE)
        version = re.search(r"^Version:\s*(\S+)", header, re.MULTILINE)
        if name and version:
            return name.group(1), version.group(1)
    return None


def packages():
    """Installed distributions as sorted `name==version` (the first on sys.path wins, as for imports).

    Read from the metadata folders' names (one listdir per path entry): parsing every METADATA file through
    importlib.metadata costs ~1 ms a distribution, too much for a probe that must be quick.
    """
    with_site()
    seen = {}
    for _, (name, version) in _dists_on_path():
        seen.setdefault(_normal(name), version)
    items = sorted(f"{name}=={version}" for name, version in seen.items())
    digest = sha256("\n".join(items).encode()).hexdigest()
    return {"sha256": digest, "count": len(items), "list": items}
