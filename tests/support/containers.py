"""Sandbox nodes that run their job in a container (podman, as root here): each node with a podman storage of its
own, as separate machines have (its containers.conf and storage.conf through its sshd's SetEnv), the test image
built once (devtools/podman.py: busybox, 2 MB) and seen read-only by every node; the inventory's `container:`
runs the nodes' own interpreter, bind-mounted read-only at its paths (the image holds no Python: the choice is said
in docs/development.md). A node may have an image of its own under the same tag (`differing`): the doctor's case.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devtools import podman as pm
from devtools.sandbox import Sandbox
from devtools.sandbox.procs import pids_mentioning
from tests.support.nodeenv import node_python

TAG = "localhost/ddpl-test:1"


@functools.cache
def shared_image() -> tuple[Path, str]:
    """The test image in a storage root of its own, built once a process and removed at its exit: (root, id)."""
    root = Path(tempfile.mkdtemp(prefix="ddpl-podman-shared-"))
    atexit.register(pm.discard_root, root)
    return root, pm.build_test_image(TAG, root / "root")


def interpreter_paths() -> list[str]:
    """What the nodes' interpreter needs inside the image, each at its own path: /usr, this Python's prefixes (the
    node venv links its packages from this one's), the node venv."""
    venv = Path(node_python()).parents[1]
    paths = ["/usr", *(f"/{d}" for d in ("lib", "lib64") if Path(f"/{d}").is_dir() and not Path(f"/{d}").is_symlink())]
    for prefix in (sys.base_prefix, sys.prefix, str(venv)):
        if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
            paths.append(prefix)
    return [f"{p}:{p}:ro" for p in paths]


@dataclass
class ContainerNodes:
    """A sandbox whose nodes run the job in the test image; each node's podman root and environment."""

    sandbox: Sandbox
    roots: list[Path]
    envs: list[dict[str, str]] = field(default_factory=list)

    def containers(self, run: str | None = None) -> dict[str, list[str]]:
        """Each node's containers (any state), of one run (its label) or of any launcher run."""
        label = f"{pm.RUN_LABEL}={run}" if run else pm.RUN_LABEL
        return {f"node-{i}": pm.containers_by_label(label, env) for i, env in enumerate(self.envs)}

    def left(self) -> dict[str, list[str]]:
        """The nodes that still have any launcher container, with their names."""
        return {node: names for node, names in self.containers().items() if names}


def container_nodes(
    make_sandbox: Callable[..., Sandbox],
    root: Path,
    nodes: int = 2,
    differing: Mapping[int, str] | None = None,
    container: Mapping[str, Any] | None = None,
    session_env: Mapping[str, str] | None = None,
    **up_kwargs: Any,
) -> ContainerNodes:
    """`make_sandbox(nodes, node_env=...)` whose inventory runs the job in TAG on every node; `differing` {i:
    marker}: node i imports another image under the same tag into its own storage; `container`: more of the
    inventory's `container:` keys; `session_env`: more of every node's sessions' environment (paths: a registry's
    registries.conf). `root`: where the nodes' podman roots go (removed by `discard`)."""
    shared, _ = shared_image()
    roots, envs, node_env = [], [], {}
    for i in range(nodes):
        own = root / f"podman-{i}"
        env = pm.podman_env(own, image_stores=[shared / "root" / "graph"], base={})
        if differing and i in differing:
            pm.build_test_image(TAG, own, marker=differing[i], image_stores=[shared / "root" / "graph"])
        roots.append(own)
        envs.append(pm.podman_env(own, image_stores=[shared / "root" / "graph"]))
        node_env[i] = {**{k: env[k] for k in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF")}, **(session_env or {})}
    box = make_sandbox(nodes, node_env=node_env, **up_kwargs)
    data = yaml.safe_load(box.inventory.read_text())
    defaults = data.setdefault("defaults", {})
    defaults["container"] = {
        "image": TAG,
        "mounts": interpreter_paths(),
        "host_python": defaults.get("python") or node_python(),
        **(container or {}),
    }
    box.inventory.write_text(yaml.safe_dump(data, sort_keys=False))
    return ContainerNodes(box, roots, envs)


def short_folder() -> Path:
    """A folder for the nodes' podman roots with a short path: with a storage root of 48 characters or more, podman
    4.3 ends every `podman run` 20 s late here (its conmon's timeout; a 46-character root: 0.15 s), and pytest's
    tmp_path is longer. `discard` removes it."""
    return Path(tempfile.mkdtemp(prefix="ddpl-ct-", dir="/tmp"))


def discard(nodes: ContainerNodes | None) -> None:
    """Every container and image of the nodes' own roots, the roots, and their folder once it is empty."""
    if nodes is not None:
        for own in nodes.roots:
            try:
                pm.discard_root(own)
            finally:  # a runtime that failed to answer (a loaded suite) leaves no folder behind all the same
                shutil.rmtree(own, ignore_errors=True)
        for folder in {own.parent for own in nodes.roots}:
            # A runtime's cleanup still under way (conmon's `podman container cleanup` of a node's last container)
            # makes its root's tmp/ again after the rmtree: gone once nothing names the folder any more.
            deadline = time.monotonic() + 15
            while pids_mentioning(str(folder)) and time.monotonic() < deadline:
                time.sleep(0.2)
            shutil.rmtree(folder, ignore_errors=True)
