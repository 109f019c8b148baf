"""Inventories and readings of a launch plan that the plan's tests share: torchrun's words, a node's shell line."""

from __future__ import annotations

import textwrap

from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster
from launcher.plan.launchplan import NodeCommand

HETERO = """\
    defaults: {python: /opt/venv/bin/python, workdir: ~/project}
    hosts:
      - {name: gpu01, nproc_per_node: 4}
      - {name: gpu02, addr: 10.0.0.2, nproc_per_node: 2}
    rendezvous: {master_port: 29611}
    job: {script: train/ddp.py, args: [--epochs, 3]}
"""

NASTY_WORDS = [
    "plain",
    "two words",
    "",
    " ",
    "it's",
    'say "hi"',
    "$(rm -rf ~)",
    "`id`",
    "a; rm -rf /",
    "a && b || c",
    "line one\nline two",
    "tab\there",
    "ünïcødé ✓ 日本",
    "$HOME",
    "${PATH}",
    "*",
    "~",
    "~/x",
    "--nnodes",
    "-m",
    "\\",
    "'\"'\"'",
    "a|b>c<d",
    "#not a comment",
    "!event",
]


UNSET = ["-u", "RANK", "-u", "LOCAL_RANK", "-u", "WORLD_SIZE", "-u", "LOCAL_WORLD_SIZE", "-u", "GROUP_RANK",
         "-u", "ROLE_RANK", "-u", "ROLE_WORLD_SIZE", "-u", "GROUP_WORLD_SIZE", "-u", "NODE_RANK", "-u", "MASTER_ADDR",
         "-u", "MASTER_PORT"]
"""The `env -u NAME` words every shell line starts its env with (TORCHELASTIC_* is removed by the agent)."""
ORDER_TEXT = 'CUDA_DEVICE_ORDER="${CUDA_DEVICE_ORDER:-PCI_BUS_ID}"'
"""... then the GPU order: PCI_BUS_ID (nvidia-smi's numbering) unless the node sets one."""
HEAD = [*UNSET, "CUDA_DEVICE_ORDER=${CUDA_DEVICE_ORDER:-PCI_BUS_ID}"]
"""Those words as a shell reads them."""


def cluster(text: str) -> Cluster:
    """The inventory `text` (indented as the tests write it), parsed."""
    return parse_inventory(textwrap.dedent(text), "test.yaml")


def as_shell_reads(node: NodeCommand) -> list[str]:
    """argv as the node's shell reads it from shell_line(): `~/` in home words becomes $HOME (unexpanded by shlex)."""
    return [("$HOME/" + w[2:] if i in node.home_args and w.startswith("~/") else w) for i, w in enumerate(node.argv)]
