"""The launcher's import graph has no cycle, between modules or between its folders, and its bottom layer imports
nothing above it (#22's rule, and #31's for folders and type-only imports, kept from now).

Every import counts: a lazy one inside a function (a cycle hidden by a lazy import is still a cycle), and one under
`if TYPE_CHECKING:` (a type that needs its user's module to be named is a knot all the same).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from tests.helpers import REPO

PACKAGE = REPO / "launcher"
BOTTOM = ("launcher.errors", "launcher.limits", "launcher.settings", "launcher.options", "launcher.paths")
"""Modules every layer may import, which import no launcher module themselves (settings: limits only; options: errors,
limits and settings)."""


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The launcher modules `name` imports (a `from package import module` counts as the module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
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


def cycles_of(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle a depth-first walk meets, as `a -> b -> a`."""
    cycles: list[str] = []
    state: dict[str, str] = {}
    trail: list[str] = []

    def visit(node: str) -> None:
        state[node] = "open"
        trail.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*trail[trail.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt)
        trail.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)
    return cycles


def unit(name: str, known: dict[str, Path]) -> str:
    """The folder a module belongs to (`launcher.run`; a folder inside one is a folder of its own:
    `launcher.node.agent`, beside `launcher.node`'s own modules), or the module itself at the top
    (`launcher.options`)."""
    if known[name].name == "__init__.py":
        return name
    return name.rpartition(".")[0] if name.count(".") > 1 else name


def test_the_launcher_has_no_import_cycle() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    cycles = cycles_of(graph)
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def test_no_two_folders_import_each_other() -> None:
    """config, plan, transport, node, run, report, doctor, sync, slurm, sandbox, app: a stage imports the stages
    below it, never one above (the top-level modules count as folders of their own, and so do node's sub-packages:
    agent imports common, common never agent)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        for target in imports(name, path, known):
            if unit(target, known) != unit(name, known):
                graph.setdefault(unit(name, known), set()).add(unit(target, known))
    cycles = cycles_of(graph)
    assert cycles == [], "folders importing each other:\n" + "\n".join(cycles)


def test_the_bottom_layer_imports_no_launcher_module_above_it() -> None:
    known = modules()
    for name in BOTTOM:
        allowed = {"launcher.options": {"launcher.errors", "launcher.limits", "launcher.settings"},
                   "launcher.settings": {"launcher.limits"}}.get(name, set())
        assert imports(name, known[name], known) <= allowed, name


def test_the_controller_imports_only_the_wire_of_the_node_package() -> None:
    """Everything in launcher/ outside launcher/node/ imports one node module: launcher.node.wire, what both sides
    agree on (launcher.transport.program takes the package itself too, to find the folder it sends)."""
    known = modules()
    found = []
    for name, path in sorted(known.items()):
        if name == "launcher.node" or name.startswith("launcher.node."):
            continue
        allowed = {"launcher.node.wire", "launcher.node"} if name == "launcher.transport.program" else {
            "launcher.node.wire"}
        found += [f"{name} imports {target}" for target in sorted(imports(name, path, known))
                  if target.startswith("launcher.node") and target not in allowed]
    assert found == [], "\n".join(found)


def test_the_node_package_imports_only_the_standard_library_and_itself() -> None:
    """Every module under launcher/node/ runs on a node with nothing installed, under Python 3.8+: it imports the
    standard library and launcher.node.* only, never relatively (the launcher ships what the import lines name), and
    worker/ not even that: its files are copied into the run directory, where no node package is."""
    stdlib = set(sys.stdlib_module_names) | {"sitecustomize"}  # the hook imports the node's own after itself
    found = []
    for path in sorted((PACKAGE / "node").rglob("*.py")):
        worker = path.parent.name == "worker"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = ["." * node.level + (node.module or "")]
            else:
                continue
            for imported in names:
                own = imported == "launcher.node" or imported.startswith("launcher.node.")
                if imported.partition(".")[0] not in stdlib and (worker or not own):
                    found.append(f"{path.relative_to(REPO)}: {imported}")
    assert found == [], "\n".join(found)


TESTS_NAMED = re.compile(r"(?<![\w.])tests[/.]\w")
"""A path under tests/ (`tests/scripts/sleeper.py`) or a module of it (`python -m tests.support.x`) in a string."""


def test_bench_imports_nothing_from_tests() -> None:
    """Nor runs anything of the tests': no string of a bench file (its workloads too) names a file or module there."""
    for path in sorted((REPO / "bench").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {n for n in names if n == "tests" or n.startswith("tests.")}, path.name
        strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        named = [text for text in strings if text == "tests" or TESTS_NAMED.search(text)]  # "tests": REPO / "tests"
        assert not named, f"{path.relative_to(REPO)} names the tests' files: {named}"


def test_report_imports_nothing_from_run_and_events_sit_below_both() -> None:
    # The typed events and NodeEnd are below run/ (which makes them) and report/ (which says them): no folder cycle.
    known = modules()
    for name in (n for n in known if n.startswith("launcher.report.")):
        assert not {m for m in imports(name, known[name], known) if m.startswith("launcher.run")}, name
    below = imports("launcher.events", known["launcher.events"], known)
    assert below <= {"launcher.errors", "launcher.node", "launcher.node.wire"}, below
    assert "launcher.run.events" not in known  # no alias that only renames


def test_the_product_imports_none_of_the_checkouts_tools() -> None:
    """The wheel ships `launcher` alone: nothing in it may import the sandbox (devtools/), the bench or the tests."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in ("devtools", "bench",
                                                                                               "tests")]
    assert found == [], "\n".join(found)


IO_MODULES = {"os", "time", "socket", "subprocess", "threading", "select", "signal", "shutil", "tempfile",
              "pathlib", "paramiko", "fabric", "invoke", "rich", "queue", "concurrent"}
"""What a pure module does not import: the clock, files, processes, threads, the network, the terminal (io's
in-memory buffers are no I/O)."""


def test_watch_is_pure_it_judges_what_was_seen_at_the_time_it_is_given() -> None:
    """watch/ imports nothing that does I/O or reads the clock, and no room that does (run/, transport/, report/):
    asking the nodes and stopping a run are run/'s (run/hangcheck.py, run/topfeed.py)."""
    known = modules()
    for name, path in known.items():
        if not name.startswith("launcher.watch"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        stdlib = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        stdlib |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   and not n.level}
        assert not stdlib & IO_MODULES, (name, stdlib & IO_MODULES)
        rooms = {unit(m, known) for m in imports(name, path, known)}
        assert not rooms & {"launcher.run", "launcher.transport", "launcher.report", "launcher.app"}, (name, rooms)
