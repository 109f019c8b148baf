"""What a user has who installed the launcher from its wheel: a venv without torch and with `ddpl` on its PATH, and
a project of their own (a git repository with its train.py, a module, a shell command and a ddpl.yaml)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.nodeenv import REPO, closure, declared_requirements, link_distribution, make_venv
from tests.support.project import git, write


def build_wheel(into: Path) -> Path:
    """The package's wheel, built from a copy of this checkout's files (git's list: what a clone holds), so the
    build leaves nothing in the checkout. No build isolation: this interpreter's setuptools, no index."""
    names = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    source = into / "source"
    for name in filter(None, names):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(into / "dist")], check=True, capture_output=True, cwd=into)
    return next((into / "dist").glob("ddp_launcher-*.whl"))


def user_venv(folder: Path, wheel: Path) -> Path:
    """A fresh venv holding the wheel (installed, not editable) and its declared dependencies, no torch: the
    dependencies are linked from this interpreter's install (as the nodes' venv is: no index needed), the wheel
    installed by pip, which writes the `ddpl` script. Returns the venv's bin folder."""
    python, site = make_venv(folder)
    for dist in closure(declared_requirements((), node=False)).values():  # the dependencies alone: no torch extra
        link_distribution(dist, site)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, capture_output=True)
    return python.parent


TRAIN = """\
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank}/{world} role={os.environ.get('ROLE_NAME')} in {os.getcwd()}", flush=True)
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 3
t = torch.zeros(4)
for step in range(steps):
    t += rank + step
    dist.all_reduce(t)
    print(f"step {step}", flush=True)
    if steps > 3:
        time.sleep(0.1)
print(f"CHECKSUM rank={rank} sha256={hashlib.sha256(str(t.tolist()).encode()).hexdigest()}", flush=True)
dist.destroy_process_group()
"""

MODULE = """\
import os

print(f"module {__name__} rank {os.environ['RANK']} role={os.environ.get('ROLE_NAME')}", flush=True)
"""

COMMAND = """\
#!/bin/sh
echo "command rank $RANK of $WORLD_SIZE: $*"
"""

API_SCRIPT = """\
import json, os, signal, sys, threading, time
from launcher import api

def leftovers():
    return (len(os.listdir("/proc/self/fd")), sorted(t.name for t in threading.enumerate()),
            [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)])

def settled(before):
    for _ in range(50):  # the SSH transports' threads end a moment after their connections close
        if leftovers() == before:
            return True
        time.sleep(0.1)
    return leftovers()

before, said, lines = leftovers(), [], []
first = api.launch("hosts/cluster.yaml", on_output=lines.append, on_message=said.append, doctor=False, grace=2)
sums = {l.split("sha256=")[1] for l in lines if "CHECKSUM" in l}
report = {"ok": first.ok, "run_id": first.run_id, "nodes": [n.state for n in first.nodes], "sums": len(sums),
          "logs": str(first.logs), "clean_after_first": settled(before) is True}

def interrupt_once_started(line):
    said.append(line)
    if line.startswith("started "):
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()

try:
    api.launch("hosts/cluster.yaml", args=["--steps", "100000"], on_output=lines.append,
               on_message=interrupt_once_started, doctor=False, grace=2)
    report["interrupted"] = False
except KeyboardInterrupt:
    report["interrupted"] = True
stopped_id = next(l.split("run ")[1] for l in said if l.startswith("started ") and "run " in l)
report["after_interrupt"] = [s.state for s in api.run("hosts/cluster.yaml", stopped_id, grace=2).status()]
report["clean_after_interrupt"] = settled(before) is True

run = api.launch("hosts/cluster.yaml", args=["--steps", "100000"], detach=True, on_message=said.append, doctor=False,
                 grace=2)
for _ in range(20):  # its workers start a moment after the launch returns
    snap = run.top()
    if len(snap.ranks) == 2:
        break
report["top_ranks"] = sorted(r.rank for r in snap.ranks)
report["stop"] = [s.state for s in run.stop()]
report["wait"] = [n.state for n in run.wait(timeout=60).nodes]
page = run.report()  # with its charts: matplotlib is one of the install's own dependencies (#69)
report["page"] = [isinstance(page, api.RunPage), page.path.name, page.path.is_file(), bool(page.headline),
                  page.summary["run"] == run.run_id, "<svg" in page.path.read_text()]
report["clean_at_end"] = settled(before) is True
report["left"] = repr([leftovers(), before])  # what differs where it is not clean: the failure's message
print(json.dumps(report))
"""


def user_project(root: Path) -> Path:
    """The user's repository: their code, a ddpl.yaml that names the inventory `ddpl init` writes and a logs folder
    (which no .gitignore names: a new user's has none), a subfolder they work in; one commit."""
    write(root / "train.py", TRAIN)
    write(root / "pkg" / "__init__.py", "")
    write(root / "pkg" / "train.py", MODULE)
    write(root / "run.sh", COMMAND)
    os.chmod(root / "run.sh", 0o755)
    write(root / "ddpl.yaml", "hosts: hosts/cluster.yaml\nlog_dir: logs\ngrace: 2\n")
    write(root / "api_script.py", textwrap.dedent(API_SCRIPT))
    write(root / ".gitignore", "__pycache__/\n")
    write(root / "src" / "notes.md", "where the user works\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "init")
    return root
