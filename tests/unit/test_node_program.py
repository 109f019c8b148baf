"""Each node program is sent with every node module it imports, however the import is written (read with `ast`, the
way Python reads it, against the launcher's own quick reading of import lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from launcher.transport.program import _needed, node_files

NODE = Path(__file__).resolve().parents[2] / "launcher" / "node"
PROGRAMS = ("agent", "probe", "syncd", "selector", "seek")


def _imported(module: str) -> set[str]:
    """The node modules `module` imports (top level or inside functions), by stem."""
    tree = ast.parse((NODE / f"{module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "launcher.node":
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("launcher.node."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("launcher.node.")}
    return found


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_program_ships_every_node_module_it_imports(program: str) -> None:
    sent = {Path(name).stem for name in node_files(program)}
    todo, closure = [program], set()
    while todo:
        module = todo.pop()
        if module not in closure:
            closure.add(module)
            todo.extend(_imported(module))
    assert closure <= sent, f"{program} is sent without {sorted(closure - sent)}"


def test_a_parenthesised_import_over_several_lines_counts() -> None:
    sources = {"a": "from launcher.node.b import (\n    ONE,\n    TWO,\n)\n"
                    "from launcher.node import (\n    c,\n    d,\n)\n",
               "b": "", "c": "from launcher.node import e\nimport os\n", "d": "", "e": "", "f": ""}
    modules = {f"launcher.node.{name}": (f"launcher/node/{name}.py", text, "") for name, text in sources.items()}
    needed = {name.rpartition(".")[2] for name in _needed("a", modules) if name.startswith("launcher.node.")}
    assert needed == {"a", "b", "c", "d", "e"}
