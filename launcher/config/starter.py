"""The inventory `ddpl init` writes for a new cluster (pure: what was found on the nodes in, commented YAML out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

UNKNOWN_PYTHON = "python3"
"""What an inventory names where no node said which python has torch: the login's, a line the comment says to set."""
IMAGE_PYTHON = "python3"
"""What an inventory written with `init --image` names as `python:`: the image's interpreter, the one with torch
(python3 is on the PATH of the PyTorch images: NVIDIA's, pytorch/pytorch's)."""
EXAMPLE_LINE = "  # a minimal DDP script to start from: examples/ddp_minimal.py in the launcher's repository"
"""The job's first line: where a newcomer finds a script to copy (a comment: the job is the same with or without)."""


@dataclass(frozen=True)
class Found:
    """What `ddpl init` learnt of one node over SSH (None: it could not say)."""

    name: str
    python: str | None = None
    """An interpreter there that has torch (as the node names it, `~/` for its home)."""
    gpus: int = 0
    """GPUs nvidia-smi lists."""
    cpus: int | None = None
    notes: tuple[str, ...] = field(default=())
    """Why something was not found (no torch in any interpreter tried, nvidia-smi failed, unreachable)."""
    given_nproc: int | None = None
    """`--nproc-per-node`, when the command line gave it."""

    @property
    def nproc(self) -> int:
        """Worker processes for this node: as given, else one per GPU, else one (a CPU node: torch uses its cores)."""
        return self.given_nproc or self.gpus or 1


def _flow(value: Any) -> str:
    """A value as one line of YAML, quoted where YAML needs it."""
    return yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip().removesuffix("...").strip()


def _line(text: str, comment: str) -> str:
    """`text`, then its comment in the comments' column (or two spaces after a long text: YAML's ` #`)."""
    return f"{text:<38}  # {comment}" if comment else text


def _common(found: Sequence[Found], key: str) -> Any:
    """The value every node shares for `key` (None when they differ)."""
    values = {getattr(f, key) for f in found}
    return values.pop() if len(values) == 1 else None


def _hosts(found: Sequence[Found], python: str | None, nproc: int | None) -> list[str]:
    names = [f.name for f in found]
    if python is not None and nproc is not None:
        return [_line(f"hosts: {_flow(names)}", "node rank 0 first: it holds the rendezvous")]
    lines = ["hosts:                                  # node rank 0 first: it holds the rendezvous"]
    for f in found:
        own = {
            "name": f.name,
            **({} if python is not None else {"python": f.python or UNKNOWN_PYTHON}),
            **({} if nproc is not None else {"nproc_per_node": f.nproc}),
        }
        unknown = python is None and f.python is None
        lines.append(
            _line(f"  - {_flow(own)}", f"no python with torch was found on {f.name}: set it" if unknown else "")
        )
    return lines


def _python_comment(found: Sequence[Found], image: str | None) -> str:
    if image is not None:
        return "the image's python (torch is in the image; setup: lines run there too)"
    if all(f.python is None for f in found):
        return "no python with torch was found on any node: set it (every host uses this one)"
    return "has torch on every node"


def _container(image: str, command: str) -> list[str]:
    """The defaults' `container:`: the image every node runs the job in, and what the nodes themselves need."""
    return [
        "  container:",
        _line(f"    image: {_flow(image)}", f"torchrun runs in it on every node (`{command}launch --pull` pulls it)"),
        _line("    # host_python: python3", "each node's own Python 3.8+ that runs the launcher's agent"),
        _line("    # mounts: [/data]", "more folders at the same path inside (the workdir is one)"),
    ]


def _nproc_why(found: Sequence[Found]) -> str:
    """Why nproc_per_node is what every node shares: as given, one per GPU, or one a CPU node."""
    if any(f.given_nproc for f in found):
        return "as --nproc-per-node gave"
    gpus = _common(found, "gpus")
    if gpus is None:
        return ""
    return (
        f"nvidia-smi lists {gpus} GPU(s) on every node"
        if gpus
        else "no GPUs (nvidia-smi): one process a node, torch uses its cores"
    )


def _header(command: str, image: str | None) -> list[str]:
    return [
        f"# Written by `{command}init`: your nodes, what it found on them over SSH, and the job to run.",
        "# Check it, then:",
        f"#   {command}doctor                     # same Python and torch everywhere? DNS? port? script?",
        f"#   {command}launch --dry-run           # each node's exact command, and why each flag is there",
        f"#   {command}launch --sync              # copy this project to every workdir, then start",
        *([f"#   {command}launch --pull              # pull the image on every node first"] if image else []),
        f"# Every key, with what it does and its default: `{command}init --example` writes them to hosts/example.yaml.",
    ]


def render_inventory(
    found: Sequence[Found],
    *,
    workdir: str,
    job: Mapping[str, Any],
    master_port: int,
    ssh_config: str | None = None,
    command: str = "ddpl ",
    image: str | None = None,
) -> str:
    """The commented inventory for `found` (in rank order): what every node shares in `defaults:`, what differs on
    its host, the notes of what could not be found as comments. `command`: what comes before a task's name as the
    user runs it (`ddpl `, `inv `, `inv ddp.`: launcher.paths.task_words). `image`: the job runs in this container
    image on every node (`container:` in defaults)."""
    python, nproc = _common(found, "python"), _common(found, "nproc")
    if python is None and all(f.python is None for f in found):
        python = UNKNOWN_PYTHON  # once, in defaults: a host's own line would override the one a user sets
    lines = _header(command, image)
    lines += [f"# {f.name}: {note}" for f in found for note in f.notes]
    lines += _hosts(found, python, nproc)
    if ssh_config is not None:
        lines.append(_line(f"ssh_config: {_flow(ssh_config)}", "how this machine reaches the nodes"))
    lines.append("defaults:")
    if python is not None:
        lines.append(_line(f"  python: {_flow(python)}", _python_comment(found, image)))
    lines.append(_line(f"  workdir: {_flow(workdir)}", f"your code on each node: shared, or `{command}launch --sync`"))
    if nproc is not None:
        lines.append(_line(f"  nproc_per_node: {nproc}", _nproc_why(found)))
    if image is not None:
        lines += _container(image, command)
    lines += [
        "rendezvous:",
        _line(f"  master_port: {master_port}", "a free TCP port on the first node"),
        "job:",
        EXAMPLE_LINE,
        *(_line(f"  {key}: {_flow(value)}", "") for key, value in job.items()),
        "  # module: pkg.train                    # instead of script: torchrun -m pkg.train",
        "  # command: ./train.sh                  # instead of script: a program, not Python",
        "  # torchrun: [--numa-binding, socket]   # torchrun's own options, passed as written",
        "# sync:",
        "#   exclude: [data/, '*.ckpt']          # what --sync leaves out besides .gitignore's",
    ]
    return "\n".join(lines) + "\n"
