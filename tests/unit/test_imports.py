"""The launcher's import graph has no cycle, and its bottom layer imports nothing of it (#22's rule, kept from now).

Every import counts, a lazy one inside a function too (a cycle hidden by a lazy import is still a cycle); only
imports under `if TYPE_CHECKING:` do not, as they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "launcher"
BOTTOM = ("launcher.errors", "launcher.options", "launcher.paths")
"""Modules every layer may import, which import no launcher module themselves (options: errors only)."""


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The launcher modules `name` imports (a `from package import module` counts as the module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
                   for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            submodules = {f"{base}.{a.name}" for a in node.names} & known.keys()
            found |= submodules or ({base} & known.keys())
    return found - {name}


def test_the_launcher_has_no_import_cycle() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    cycles, state, trail = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        trail.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*trail[trail.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt)
        trail.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def test_the_bottom_layer_imports_no_launcher_module_above_it() -> None:
    known = modules()
    for name in BOTTOM:
        allowed = {"launcher.errors"} if name == "launcher.options" else set()
        assert imports(name, known[name], known) <= allowed, name


def test_bench_imports_nothing_from_tests() -> None:
    for path in sorted((REPO / "bench").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {n for n in names if n == "tests" or n.startswith("tests.")}, path.name


def test_report_imports_nothing_from_run_and_events_sit_below_both() -> None:
    # The typed events and NodeEnd are below run/ (which makes them) and report/ (which says them): no folder cycle.
    known = modules()
    for name in (n for n in known if n.startswith("launcher.report.")):
        assert not {m for m in imports(name, known[name], known) if m.startswith("launcher.run")}, name
    below = imports("launcher.events", known["launcher.events"], known)
    assert below <= {"launcher.errors", "launcher.node", "launcher.node.protocol"}, below
    assert "launcher.run.events" not in known  # no alias that only renames
