"""Figure: the job in a container image (`container:`, podman) against the same job bare, on the same 2 nodes.

train/ddp.py for 20 steps, 1 process a node: `inv launch` of the sandbox's inventory, and of the same inventory with
`container:` (the busybox test image of devtools/podman.py, the nodes' interpreter bind-mounted read-only: what the
container costs is the runtime's start, not an image's size), interleaved. Each node has a podman storage of its own.
Figures: command -> first optimizer step on every rank (the run's page's headline, from the job's own lines), and the
whole launch. Target: <= 1.15x bare at 2 nodes. Where the time goes is on each run's page (its container phase).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.common import free_port, log, paired_ratio, ratio, run_timed, sandbox_of, stats
from bench.job import JOB_ARGS, SCRIPT, check, first_step_s
from devtools import podman

TARGET = 1.15
TAG = "localhost/ddpl-bench:1"
VARIANTS = ("bare", "container")


def _interpreter_mounts() -> list[str]:
    """This machine's interpreter (the sandbox nodes' python) at its paths inside the image, read-only."""
    paths = ["/usr"]
    for prefix in (sys.base_prefix, sys.prefix):
        if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
            paths.append(prefix)
    return [f"{p}:{p}:ro" for p in paths]


def _inventories(box: Any, root: Path) -> dict[str, Path]:
    data = yaml.safe_load(box.inventory.read_text())
    boxed = dict(data, defaults={**data.get("defaults", {}), "container": {
        "image": TAG, "mounts": _interpreter_mounts(), "host_python": box.python}})
    paths = {}
    for name, text in (("bare", data), ("container", boxed)):
        paths[name] = root / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(text, sort_keys=False))
    return paths


def _launch(inventory: Path, root: Path) -> Any:
    data = yaml.safe_load(inventory.read_text())
    data["rendezvous"]["master_port"] = free_port()
    inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    result = run_timed([sys.executable, "-m", "invoke", "launch", "--hosts", str(inventory)], timeout=180,
                       env={"INVOKE_LAUNCHER_LOG_DIR": str(root / "logs"), "INVOKE_LAUNCHER_PAGE": "0"})
    check(result, f"inv launch ({inventory.stem})")
    return result


def run(repeat: int, root: Path) -> dict[str, Any]:
    if podman.unavailable():
        return {"skipped": podman.unavailable()}
    roots = Path(tempfile.mkdtemp(prefix="ddpl-bc-", dir="/tmp"))  # short: podman 4.3 is slow past 48 characters
    shared = roots / "image"
    try:
        podman.build_test_image(TAG, shared)
        node_env = {}
        for i in range(2):
            env = podman.podman_env(roots / f"n{i}", image_stores=[shared / "graph"], base={})
            node_env[i] = {k: env[k] for k in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF")}
        with sandbox_of(2, root, script=SCRIPT, script_args=JOB_ARGS, node_env=node_env) as box:
            paths = _inventories(box, box.root)
            _launch(paths["container"], box.root)  # untimed: a fresh storage's first container
            wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
            first: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for rep in range(repeat):
                for variant in (VARIANTS if rep % 2 == 0 else VARIANTS[::-1]):
                    result = _launch(paths[variant], box.root)
                    wall[variant].append(result.seconds)
                    stepped = first_step_s(result, 2)
                    if stepped is not None:
                        first[variant].append(stepped)
        row = {v: {**stats(wall[v]), "first_step_s": stats(first[v])} for v in VARIANTS}
        row["first_step_ratio"] = ratio(row["container"]["first_step_s"], row["bare"]["first_step_s"])
        row["first_step_paired"] = paired_ratio(row["container"]["first_step_s"], row["bare"]["first_step_s"])
        row["wall_ratio"] = ratio(row["container"], row["bare"])
        row["ok"] = row["first_step_ratio"] is not None and row["first_step_ratio"] <= TARGET
        log(f"container: command -> first step {row['container']['first_step_s']['median']:.2f}s in the image, "
            f"{row['bare']['first_step_s']['median']:.2f}s bare ({row['first_step_ratio']}x)")
        return {"nodes": 2, "job": f"{SCRIPT} {' '.join(JOB_ARGS)}", **row}
    finally:
        for own in sorted(roots.iterdir()) if roots.exists() else []:
            podman.discard_root(own)
        podman.discard_root(roots)
