"""Each node program is sent with exactly the node modules it imports, across the node package's sub-packages and
however the import is written (read with `ast`, the way Python reads it, against the launcher's own quick reading of
import lines), with the packages that hold them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from launcher.transport.program import _needed, node_files, node_program

NODE = Path(__file__).resolve().parents[2] / "launcher" / "node"
PROGRAMS = ("agent.agent", "probe.probe", "sync.syncd", "slurm.selector", "probe.seek")


def _files() -> dict[str, Path]:
    """Every node module by name (`launcher.node.agent.runner`; a folder's `__init__.py` is its package)."""
    found = {}
    for path in NODE.rglob("*.py"):
        parts = path.relative_to(NODE).with_suffix("").parts
        found[".".join(("launcher", "node", *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def _imported(module: str, files: dict[str, Path]) -> set[str]:
    """The node modules `module` imports (top level or inside functions), and the packages that hold each."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(files[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("launcher.node"):
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("launcher.node.")}
    return {package for name in found & files.keys() for package in _with_packages(name)}


def _with_packages(name: str) -> set[str]:
    """`launcher.node.agent.runner` and the packages Python imports before it (`launcher.node.agent`, ...)."""
    parts = name.split(".")
    return {".".join(parts[:n]) for n in range(2, len(parts) + 1)}


def _sent(program: str) -> set[str]:
    files = {path.relative_to(NODE.parents[1]).as_posix(): name for name, path in _files().items()}
    return {files[path] for path in node_files(program)}


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_program_ships_exactly_the_node_modules_it_imports(program: str) -> None:
    files = _files()
    todo, closure = sorted(_with_packages(f"launcher.node.{program}")), set()
    while todo:
        module = todo.pop()
        if module not in closure:
            closure.add(module)
            todo.extend(_imported(module, files))
    closure.add("launcher.node.loader")  # every program: its loader first
    assert _sent(program) == closure, f"sent without {sorted(closure - _sent(program))}, " \
                                      f"sent but not imported {sorted(_sent(program) - closure)}"


def test_each_program_ships_only_its_own_folders() -> None:
    def folders(program: str) -> set[str]:
        return {name.split(".")[2] for name in _sent(program) if name.count(".") >= 2} - {"wire", "loader"}

    assert folders("agent.agent") == {"agent", "common", "probe", "worker"}  # the start gate's probe, the hook
    assert folders("probe.probe") == {"common", "probe"}
    assert folders("sync.syncd") == {"common", "sync"}
    assert folders("slurm.selector") == {"slurm"}
    assert folders("probe.seek") == {"common", "probe"}  # init --image: the runtime, as the agent finds it
    assert folders("probe.image") == {"common", "probe"}


def test_a_parenthesised_import_over_several_lines_counts() -> None:
    sources = {"a": "from launcher.node.b import (\n    ONE,\n    TWO,\n)\n"
                    "from launcher.node import (\n    c,\n    d,\n)\n",
               "b": "", "c": "from launcher.node import e\nimport os\n", "d": "", "e": "", "f": ""}
    modules = {f"launcher.node.{name}": (f"launcher/node/{name}.py", text, "") for name, text in sources.items()}
    needed = {name.rpartition(".")[2] for name in _needed("a", modules) if name.startswith("launcher.node.")}
    assert needed == {"a", "b", "c", "d", "e"}


def test_imports_across_sub_packages_count_with_their_packages() -> None:
    sources = {
        "launcher/node/__init__.py": "",
        "launcher/node/run/__init__.py": '"""A package."""\n',
        "launcher/node/run/main.py": ("from launcher.node.shared import (\n    tool,  # a comment, (a, b)\n)\n"
                                      "from launcher.node.deep.inner.mod import NAME as OTHER\n"
                                      "import launcher.node.plain.mod\n"
                                      "def later():\n    from launcher.node.run import helper  # lazy\n"),
        "launcher/node/run/helper.py": "",
        "launcher/node/run/unused.py": "",
        "launcher/node/shared/__init__.py": "",
        "launcher/node/shared/tool.py": "from launcher.node.shared.base import x\n",
        "launcher/node/shared/base.py": "",
        "launcher/node/shared/other.py": "",
        "launcher/node/deep/__init__.py": "",
        "launcher/node/deep/inner/__init__.py": "",
        "launcher/node/deep/inner/mod.py": "",
        "launcher/node/plain/__init__.py": "",
        "launcher/node/plain/mod.py": "",
    }
    modules = {path[:-3].replace("/", ".").removesuffix(".__init__"): (path, text, "")
               for path, text in sources.items()}
    needed = _needed("run.main", modules) - {"launcher", "launcher.node"}
    assert needed == {f"launcher.node.{name}" for name in (
        "run", "run.main", "run.helper", "shared", "shared.tool", "shared.base", "deep", "deep.inner",
        "deep.inner.mod", "plain", "plain.mod")}


def test_a_package_is_no_program() -> None:
    with pytest.raises(ValueError, match="no node program 'agent'"):
        node_program("agent")
