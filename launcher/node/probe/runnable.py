"""Whether a node can start the job (stdlib only, Python 3.8+): its script (there, and its sha256), its module
(importable by this interpreter: found as `python -m` would find it, never imported), its command (on PATH).

The doctor's probe asks these of the job that will run, whichever form it takes (`job.script`, `job.module`,
`job.command`, or `--script`, `--module`, `--command`): torchrun started on a missing one fails on every rank with
a traceback each, after the rendezvous.
"""

import os
import sys
import threading

from launcher.node.common import bounds
from launcher.node.common.child import which
from launcher.node.probe.facts import sha256, with_site
from launcher.node.wire import error_text


def script_info(workdir, script):
    path = script if os.path.isabs(script) else os.path.join(workdir, script)
    digest = sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(bounds.HASH_BLOCK), b""):
                digest.update(block)
            size = handle.tell()
    except OSError as exc:
        return {"path": path, "error": error_text(exc)}
    return {"path": path, "sha256": digest.hexdigest(), "size": size}


def module_info(workdir, name, pythonpath=None, budget=bounds.MODULE_FIND_S):
    """Where `python -m NAME` run in `workdir` finds its code: {"origin"} or {"error"}; {"late": True, "error"}
    when the search took longer than `budget` (a hung filesystem on the path: it may still import).

    The search runs on a thread of its own, bounded; `pythonpath` is the inventory's PYTHONPATH for the job, if it
    sets one."""
    answer = {}

    def work():
        try:
            answer.update(find_module(name, search_path(workdir, pythonpath)))
        except Exception as exc:  # a finder's own failure (an unreadable folder on the path): said, not raised
            answer["error"] = error_text(exc)

    thread = threading.Thread(target=work, daemon=True, name="module-search")
    thread.start()
    thread.join(budget)
    if thread.is_alive():
        return {"name": name, "late": True, "error": "no answer within %g s (a hung filesystem on the path?)" % budget}
    return dict(answer, name=name)


def search_path(workdir, pythonpath=None):
    """The folders a worker's `python -m` looks in: its working directory first (the workdir), the job's PYTHONPATH
    (relative to the workdir), then this interpreter's own (its site-packages and the folders its .pth files name)."""
    with_site()
    extra = [os.path.join(workdir, p) for p in (pythonpath or "").split(os.pathsep) if p]
    return [workdir] + extra + [p for p in sys.path if p]


def find_module(name, path):
    """Find `name` as the import system would, one part at a time, reading each package's folders from its spec:
    no package's `__init__` runs (importlib.util.find_spec imports the parents, and a package's import may take
    seconds, or import torch). A package found last is run through its `__main__`, as `python -m` does."""
    parts = name.split(".")
    spec, search = None, path
    for i in range(len(parts)):
        full = ".".join(parts[: i + 1])
        spec = _find_spec(full, search, i == 0)
        if spec is None:
            return {"error": "No module named %r" % full}
        search = spec.submodule_search_locations
        if search is None and i < len(parts) - 1:
            return {"error": "%s is not a package (%s)" % (full, spec.origin)}
    if spec.submodule_search_locations is not None:
        main = _find_spec(name + ".__main__", list(spec.submodule_search_locations), False)
        if main is None:
            return {
                "error": "No module named %s.__main__; %r is a package and cannot be directly executed" % (name, name)
            }
        spec = main
    return {"origin": spec.origin}


def _find_spec(full, path, top):
    """The first meta path finder's spec for `full`: the path finder searches `path`; the others (built-in, frozen)
    are asked as for any top-level import."""
    from importlib.machinery import PathFinder

    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find(full, path if finder is PathFinder or not top else None)
        if spec is not None:
            return spec
    return None


def command_info(workdir, command, path=None):
    """Where the job's command is: {"path"} or {"error"}. A bare name is looked for on PATH (the inventory's for the
    job, if it sets one, else this session's: setup lines included); one with a slash is relative to the workdir,
    where torchrun starts it."""
    if os.sep in command:
        full = os.path.normpath(os.path.join(workdir, os.path.expanduser(command)))  # an absolute one stays itself
        if which(full, None) is not None:
            return {"name": command, "path": full}
        why = "not executable" if os.path.isfile(full) else "no such file"
        return {"name": command, "error": "%s: %s" % (full, why)}
    search = path if path is not None else os.environ.get("PATH", os.defpath)
    found = which(command, search)
    if found is None:
        return {"name": command, "error": "not found on PATH (%s)" % search}
    return {"name": command, "path": found}


def job_info(request, workdir):
    """The probe's answers on the job of `request`: {"script": ...}, {"module": ...} or {"command": ...} ({} when
    it names none)."""
    env = request.get("job_env") or {}
    if request.get("script"):
        return {"script": script_info(workdir, request["script"])}
    if request.get("module"):
        return {"module": module_info(workdir, request["module"], env.get("PYTHONPATH"))}
    if request.get("command"):
        return {"command": command_info(workdir, request["command"], env.get("PATH"))}
    return {}
