"""examples/: the scripts a newcomer copies stay short and need nothing but torch and the standard library (a
fresh venv with `pip install torch` has no numpy), unlike train/ddp.py, the tests' and benches' workload."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from launcher.config.starter import EXAMPLE_LINE
from tests.helpers import REPO

EXAMPLES = sorted((REPO / "examples").glob("*.py"))
MAX_LINES = 100  # pytorch/examples' DDP tutorial is about that long


def top_level_imports(path: Path) -> set[str]:
    """The top-level names `path` imports (`torch.nn` -> `torch`); a relative import counts as its own name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or "").split(".")[0])
    return names


def test_there_is_an_example() -> None:
    assert REPO / "examples" / "ddp_minimal.py" in EXAMPLES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_is_under_100_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines < MAX_LINES, f"{path.name}: {lines} lines"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_imports_only_torch_and_the_standard_library(path: Path) -> None:
    others = {n for n in top_level_imports(path) if n != "torch" and n not in sys.stdlib_module_names}
    assert others == set(), f"{path.name} imports {sorted(others)}"


def test_the_import_check_sees_what_it_must_refuse(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import os, numpy.linalg\nfrom torch import nn\nfrom . import helper\nfrom tqdm import tqdm\n")
    assert top_level_imports(script) == {"os", "numpy", "torch", ".", "tqdm"}


def test_what_points_newcomers_at_it_names_it() -> None:
    """The README, the usage guide, the inventories (`ddpl init`'s, `init --example`'s, hosts/minimal.yaml) and
    train/ddp.py's docstring name the example, and it is there."""
    named = "examples/ddp_minimal.py"
    assert (REPO / named).is_file() and named in EXAMPLE_LINE
    for doc in ("README.md", "docs/usage.md", "launcher/config/example.yaml", "hosts/minimal.yaml", "train/ddp.py"):
        assert named in (REPO / doc).read_text(encoding="utf-8"), doc
