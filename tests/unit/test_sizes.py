"""The house's size rules (docs/development.md), kept by a test: no module of the repository's code (the product,
the bench, the demo's training program, the examples, the checkout's tools and scripts, the tests and their helpers,
the top-level modules) over 400 lines, no function over 60. A module or function that grows past them is split where
its concepts part, not excused."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

MODULE_MAX_LINES = 400
FUNCTION_MAX_LINES = 60
FOLDERS = ("launcher", "bench", "train", "examples", "devtools", "scripts", "tests")


def sources() -> list[Path]:
    return sorted([*(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py")), *REPO.glob("*.py")])


def test_no_module_is_over_400_lines() -> None:
    over = [f"{p.relative_to(REPO)}: {n}" for p in sources()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_MAX_LINES]
    assert over == [], "modules over 400 lines:\n" + "\n".join(over)


def test_no_function_is_over_60_lines() -> None:
    over = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > FUNCTION_MAX_LINES:
                    over.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines}")
    assert over == [], "functions over 60 lines:\n" + "\n".join(over)
