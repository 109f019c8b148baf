"""Figure `sync`: `inv sync` of a 1,000-file, 50 MB tree to 8 sandbox nodes (each its own workdir) against an rsync
loop (`rsync -a -e "ssh -F <sandbox ssh config>" TREE/ node-i:DIR/`, all nodes in parallel), in the same run:
the first sync (empty destinations), a second one with nothing changed, and one with one file changed.

Both sides are fresh processes timed from spawn to exit (the launcher: `python -m invoke sync`, imports and SSH
handshakes included; the loop: bash, 8 rsync and 8 ssh clients). Runs are interleaved (launcher first on even
runs, rsync first on odd ones); each run starts from empty destinations.
"""

from __future__ import annotations

import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO, Box, log, ratio, run_timed, sandbox_of, stats

NODES = 8
FILES = 1000
TOTAL_BYTES = 50_000_000
PHASES = ("first", "unchanged", "one_changed")
VARIANTS = ("launcher", "direct", "rsync")
LABELS = {"first": "first sync, empty nodes", "unchanged": "again, nothing changed",
          "one_changed": "again, one file changed"}
SENT = re.compile(r"^node-\d+: sent (\d+) file\(s\)", re.M)


def make_tree(root: Path, files: int = FILES, total: int = TOTAL_BYTES) -> Path:
    """A source-tree-like mix in 40 folders: many small files, some medium, a few large; `total` bytes in all."""
    rng = random.Random(0)
    large, medium = 5, 95
    small = files - large - medium
    sizes = [rng.randint(500, 9_500) for _ in range(small)] + [rng.randint(50_000, 150_000) for _ in range(medium)]
    rest = total - sum(sizes)
    if rest < large:
        raise ValueError(f"{files} files cannot make only {total} bytes with this mix")
    sizes += [rest // large + (1 if i < rest % large else 0) for i in range(large)]
    for i, size in enumerate(sizes):
        path = root / f"pkg{i % 40:02d}" / f"file{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(size))
    return root


def own_workdirs(box: Box, root: Path, inventory: Path | None = None, **top: Any) -> list[Path]:
    """Point each node's workdir at a folder of its own (the sandbox's nodes share one file system), in the box's
    inventory or in a copy of it at `inventory` (with `top`'s keys)."""
    data = yaml.safe_load(box.inventory.read_text())
    workdirs = [root / f"node-{i}" for i in range(box.n)]
    data["hosts"] = [{"name": f"node-{i}", "workdir": str(w)} for i, w in enumerate(workdirs)]
    data.update(top)
    (inventory or box.inventory).write_text(yaml.safe_dump(data, sort_keys=False))
    return workdirs


def rsync_loop(box: Box, tree: Path, dests: list[Path]) -> list[str]:
    import shlex

    ssh = shlex.quote(f"ssh -F {box.ssh_config}")
    lines = [f"rsync -a -e {ssh} {shlex.quote(str(tree))}/ node-{i}:{shlex.quote(str(d))}/ &"
             for i, d in enumerate(dests)]
    return ["bash", "-c", "\n".join([*lines, "wait"])]


def run(repeat: int, root: Path) -> dict[str, Any]:
    if shutil.which("rsync") is None:
        raise RuntimeError("rsync is not installed (scripts/setup installs it)")
    tree = make_tree(root / "tree")
    changed = sorted(tree.rglob("*.bin"))[17]
    times: dict[str, dict[str, list[float]]] = {v: {p: [] for p in PHASES} for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    problems: list[str] = []
    with sandbox_of(NODES, root) as box:
        ours = own_workdirs(box, root / "launcher")  # sync.relay: auto (8 nodes: relayed)
        direct_inventory = root / "direct.yaml"
        direct = own_workdirs(box, root / "direct", direct_inventory, sync={"relay": False})
        theirs = [root / "rsync" / f"node-{i}" for i in range(NODES)]
        (root / "rsync").mkdir()  # rsync makes only the last folder of its destination
        argvs = {v: [sys.executable, "-m", "invoke", "-r", str(REPO), "sync", "--hosts", str(inventory)]
                 for v, inventory in (("launcher", box.inventory), ("direct", direct_inventory))}
        argvs["rsync"] = rsync_loop(box, tree, theirs)
        expected = {"first": FILES, "unchanged": 0, "one_changed": 1}
        for rep in range(repeat):
            for d in (*ours, *direct, *theirs):
                shutil.rmtree(d, ignore_errors=True)
            order = VARIANTS[rep % len(VARIANTS):] + VARIANTS[:rep % len(VARIANTS)]
            for phase in PHASES:
                if phase == "one_changed":
                    changed.write_bytes(changed.read_bytes()[::-1] + b"changed")
                for variant in order:
                    if variant == "direct" and phase != "first":
                        continue  # a relay changes only what a first sync sends
                    result = run_timed(argvs[variant], cwd=tree, timeout=600)
                    if result.code != 0:
                        raise RuntimeError(f"{variant} {phase} failed ({result.code}):\n"
                                           f"{(result.stdout + result.stderr)[-2000:]}")
                    times[variant][phase].append(result.seconds)
                    if phase == "first":
                        cpu[variant].append(result.cpu_s)
                    if variant != "rsync":
                        counts = [int(n) for n in SENT.findall(result.stdout)]
                        if counts != [expected[phase]] * NODES:
                            problems.append(f"run {rep} {phase} ({variant}): sent {counts}, expected "
                                            f"{expected[phase]} each")
                log(f"sync run {rep} {phase}: " + ", ".join(f"{v} {times[v][phase][-1]:.2f}s" for v in VARIANTS
                                                            if times[v][phase]))
            for d in (*ours, *theirs):  # both ends hold the tree as it is now
                if (d / changed.relative_to(tree)).read_bytes() != changed.read_bytes():
                    problems.append(f"run {rep}: {d} does not hold the changed file")
    phases = {p: {"launcher": stats(times["launcher"][p]), "rsync": stats(times["rsync"][p])} for p in PHASES}
    for p in phases.values():
        p["launcher_over_rsync"] = ratio(p["launcher"], p["rsync"])
    phases["first"]["direct"] = stats(times["direct"]["first"])
    phases["first"]["direct_over_rsync"] = ratio(phases["first"]["direct"], phases["first"]["rsync"])
    return {"nodes": NODES, "files": FILES, "bytes": TOTAL_BYTES, "repeat": repeat, "phases": phases,
            "launcher_cpu_first_s": stats(cpu["launcher"]), "rsync_cpu_first_s": stats(cpu["rsync"]),
            "direct_cpu_first_s": stats(cpu["direct"]), "problems": problems,
            "note": "wall time from spawn to exit of `python -m invoke sync` (imports, 8 SSH connections; "
                    "sync.relay auto, so relayed through the nodes, and false: every node straight from here) and of "
                    "a bash loop of 8 parallel `rsync -a -e 'ssh -F ...'`; CPU: wait4() rusage of each (the nodes' "
                    "sshd, syncd and rsync servers not included)"}


def rows(fig: dict[str, Any], cell: Any) -> list[list[str]]:
    """Table rows for bench/run.py: one per phase, then the CPU of the first sync and any problem."""
    n = str(fig["nodes"])
    what = f"{fig['files']:,} files, {fig['bytes'] / 1e6:.0f} MB"
    out = []
    for phase, label in LABELS.items():
        p = fig["phases"][phase]
        r = p["launcher_over_rsync"]
        out.append([f"sync: {label} ({what})", n, cell(p["launcher"]), f"rsync loop: {cell(p['rsync'])}", "",
                    "–" if r is None else f"{r:.2f}x rsync", "(figure only)", "–"])
    first = fig["phases"]["first"]
    if "direct" in first:
        r = first["direct_over_rsync"]
        out.append([f"sync: first sync, sync.relay: false ({what})", n, cell(first["direct"]),
                    f"rsync loop: {cell(first['rsync'])}", "", "–" if r is None else f"{r:.2f}x rsync",
                    "(figure only)", "–"])
    out.append(["sync: CPU of the first sync", n, cell(fig["launcher_cpu_first_s"], "CPU s"),
                f"rsync loop: {cell(fig['rsync_cpu_first_s'], 'CPU s')}", "", "", "(figure only)", "–"])
    if fig["problems"]:
        out.append(["sync: wrong counts or content", n, "; ".join(fig["problems"])[:300], "", "", "", "none expected",
                    "MISSED"])
    return out
