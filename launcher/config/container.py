"""The inventory's `container:` (in `defaults` and per host): the image torchrun runs in on a node, and how (pure).

A host's mapping is merged over the defaults' key by key (`container: {image: ...}` on one host keeps the defaults'
mounts); `container: false` on a host runs it bare. The runtime's own options that the launcher sets (the name, the
labels, host networking, IPC and PIDs, the mounts of the workdir and the run's folder, stdin) are refused in
`options` with what to write instead, as `job.torchrun` refuses torchrun's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from launcher.config.model import CONTAINER_KEYS, PULL_POLICIES, RUNTIMES, Cluster, Container
from launcher.config.reader import Reader
from launcher.config.text import typed

_SET_BY = "the launcher sets it"

OWNED_OPTIONS: dict[str, str] = {
    "--name": f"{_SET_BY}: ddpl-<run id>-<node>, so a stop and the doctor find the run's container",
    "--label": f"{_SET_BY}: ddpl.run and ddpl.node name the run's container",
    "--network": "the run uses the node's network (NCCL and the rendezvous reach the other nodes directly)",
    "--net": "the run uses the node's network (NCCL and the rendezvous reach the other nodes directly)",
    "--pid": "the run's processes keep the node's pids, so stop, stacks and top find them",
    "--ipc": "the run uses the node's IPC namespace (NCCL's shared memory between local ranks)",
    "--rm": "the agent removes the container itself, once it has its exit code",
    "--detach": "the node's agent follows the container as it follows torchrun",
    "-d": "the node's agent follows the container as it follows torchrun",
    "--interactive": "the run's environment comes on stdin (secrets are never on a command line)",
    "-i": "the run's environment comes on stdin (secrets are never on a command line)",
    "--tty": "the run's output goes to its log, not a terminal",
    "-t": "the run's output goes to its log, not a terminal",
    "--workdir": "the host's workdir is the container's, mounted at the same path",
    "-w": "the host's workdir is the container's, mounted at the same path",
    "--env": "write the variable in the host's env: (a secret's value is never on a command line)",
    "-e": "write the variable in the host's env: (a secret's value is never on a command line)",
    "--env-file": "write env_file: in the inventory (its values are sent on stdin, never on a command line)",
    "--entrypoint": "the launcher starts torchrun with the image's python (`python:`), behind setup: lines",
    "--log-driver": "the run's output goes to the run's log on the node",
    "--sig-proxy": "the node's agent signals the run's processes itself",
    "--pull": "write container.pull: (missing, always or never), or run `launch --pull` first",
    "--gpus": "the node's GPUs are passed the runtime's way when it has NVIDIA GPUs (--include chooses among them)",
}
"""The runtime's `run` options (docker's and podman's spelling) the launcher sets, and why or what to write instead."""


def owned_option(word: str) -> str | None:
    """The launcher's option that `word` is (`--name=x`, `-e`, `-eNAME=x`), or None."""
    if word.startswith("--"):
        name = word.split("=", 1)[0]
        return name if name in OWNED_OPTIONS else None
    if word.startswith("-") and len(word) >= 2:
        return word[:2] if word[:2] in OWNED_OPTIONS else None
    return None


def parse_container(r: Reader, defaults: Mapping[str, Any], fields: Mapping[str, Any], entry: str) -> Container | None:
    """The host's container: its own mapping merged over the defaults' (False on the host: none)."""
    base = _section(r, defaults.get("container"), "defaults.container")
    if "container" in fields and fields["container"] is False:
        return None
    own = _section(r, fields.get("container"), f"{entry}.container")
    if base is None and own is None:
        return None
    merged = {**(base or {}), **(own or {})}

    def where(key: str) -> str:
        return f"{entry}.container.{key}" if own is not None and key in own else f"defaults.container.{key}"

    if merged.get("image") is None:
        section = f"{entry}.container" if own is not None else "defaults.container"
        raise r.fail(section, "has no `image:` (the image torchrun runs in)")
    return Container(
        image=image_ref(r, merged["image"], where("image")),
        runtime=_choice(r, merged.get("runtime", "auto"), where("runtime"), RUNTIMES),
        mounts=tuple(mount(r, m, f"{where('mounts')}[{i}]") for i, m in enumerate(_list(r, merged, "mounts", where))),
        options=_options(r, _list(r, merged, "options", where), where("options")),
        pull=_choice(r, merged.get("pull", "missing"), where("pull"), PULL_POLICIES),
        host_python=r.text(merged.get("host_python", "python3"), where("host_python")),
    )


def _section(r: Reader, raw: Any, entry: str) -> dict[str, Any] | None:
    """A `container:` as written: a mapping, or an image reference alone (`container: nvcr.io/nvidia/pytorch:24.05`)."""
    if raw is None:
        return None
    if isinstance(raw, str):
        return {"image": raw}
    if raw is False:
        raise r.fail(entry, "false turns a host's container off; in defaults, leave `container:` out instead")
    return r.mapping(raw, entry, CONTAINER_KEYS)


def image_ref(r: Reader, value: Any, entry: str) -> str:
    """An image reference as the runtime takes it (`nvcr.io/nvidia/pytorch:24.05-py3`, `localhost/train`,
    `train@sha256:...`): one word, no option."""
    text = r.text(value, entry)
    if text.startswith("-") or any(c.isspace() for c in text):
        raise r.fail(entry, f"must be an image reference (`registry/name:tag`), got {typed(value)}")
    return text


def mount(r: Reader, value: Any, entry: str) -> str:
    """A bind mount: `PATH` (the same path inside, read-write), `SRC:DEST` or `SRC:DEST:ro` (or `:rw`); paths
    absolute or under `~`, which is the node's home."""
    text = r.text(value, entry)
    parts = text.split(":")
    if len(parts) > 3 or any(not p for p in parts) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise r.fail(entry, f"must be PATH, SRC:DEST or SRC:DEST:ro, got {typed(value)}")
    for path in parts[:2]:
        if not path.startswith(("/", "~")):
            raise r.fail(entry, f"must name absolute paths (or ~/...), got {typed(value)}")
    return text


def _list(r: Reader, merged: Mapping[str, Any], key: str, where: Any) -> list[Any]:
    raw = merged.get(key)
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise r.fail(where(key), f"must be a list, got {typed(raw)}")
    return raw


def _options(r: Reader, raw: list[Any], entry: str) -> tuple[str, ...]:
    words = tuple(r.text(w, f"{entry}[{i}]") for i, w in enumerate(raw))
    for i, word in enumerate(words):
        name = owned_option(word)
        if name is not None:
            raise r.fail(f"{entry}[{i}]", f"{name} is the launcher's: {OWNED_OPTIONS[name]}")
    return words


def _choice(r: Reader, value: Any, entry: str, choices: tuple[str, ...]) -> Any:
    if value not in choices:
        raise r.fail(entry, f"must be one of {', '.join(choices)}, got {typed(value)}")
    return value


def with_image(cluster: Cluster, image: str | None) -> Cluster:
    """The cluster with every node's container running `image` (`--image`): a host's own container keeps its other
    settings, a bare host gets one with the defaults. None: as it is."""
    if image is None:
        return cluster
    if not image.strip() or image.startswith("-") or any(c.isspace() for c in image):
        raise ValueError(f"--image must be an image reference (registry/name:tag), got {image!r}")
    hosts = tuple(
        replace(h, container=replace(h.container, image=image) if h.container else Container(image=image))
        for h in cluster.hosts
    )
    return replace(cluster, hosts=hosts)
