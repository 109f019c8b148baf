"""The node-side programs need nothing that this project does not declare: run them where nothing else is installed.

train/ddp.py runs on the nodes under torch and this project's declared dependencies; launcher/node/ (agent, probe,
syncd, selector) holds stdlib-only programs sent to any Python 3.8+. The test machine's Python may hold more:
numpy there once hid a `.numpy()` call that failed on every rank of a fresh venv.

So each program runs here under a venv of this interpreter that holds only what it may use. For train/ddp.py that is
the declared closure (tests/support/nodeenv.py), the same interpreter every sandbox node of the integration tests
runs its programs with. For the agent and the probe it is an empty venv: the standard library alone.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from launcher import doctor
from launcher.config.inventory import parse_inventory
from launcher.limits import NODE_TIMING
from launcher.plan.launchplan import plan_launch
from launcher.run import actions as run_actions
from launcher.slurm.step import step_input
from launcher.transport.program import python_command
from tests import _train_helpers as h
from tests.support import nodeenv
from tests.support.nodeenv import Env

pytestmark = pytest.mark.integration

REPO = h.REPO
STDLIB_PROGRAMS = tuple(sorted(str(p.relative_to(REPO)) for p in (REPO / "launcher" / "node").rglob("*.py")))
# Nothing from the caller's environment may widen the venvs' sys.path.
CLEAN_ENV: dict[str, str | None] = {"PYTHONPATH": None, "PYTHONHOME": None}


@pytest.fixture(scope="session")
def declared_env() -> Env:
    """A venv holding only the declared closure (torch and this project's dependencies): the sandbox nodes' python."""
    return nodeenv.declared_env()


@pytest.fixture(scope="session")
def stdlib_env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    """A venv with nothing installed: what a node's bare Python offers the agent and the probe."""
    return nodeenv.build_stdlib_env(tmp_path_factory.mktemp("stdlib-env") / "venv")


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module the file imports, at any depth (lazy imports inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names |= {_top(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(_top(node.module))
    return names - {"__future__"}


def _top(module: str) -> str:
    """A module's top-level name; the node package's own modules (sent with the program) count as stdlib."""
    return "sys" if module == "launcher.node" or module.startswith("launcher.node.") else module.partition(".")[0]


def run_on_node(python: Path, stdin: bytes, cwd: Path, **env: str) -> dict:
    """Run `PYTHON -c BOOTSTRAP` through a shell with the program and its request on stdin, as the launcher does on
    a node (cwd: the node's home); its JSON reply (the last stdout line), or a failure that shows what it printed."""
    full_env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV} | env
    result = subprocess.run(
        ["sh", "-c", python_command(str(python))],
        input=stdin,
        capture_output=True,
        cwd=cwd,
        env=full_env,
        timeout=60,
    )
    out, err = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("program", STDLIB_PROGRAMS)
def test_stdlib_programs_import_only_the_standard_library(program: str) -> None:
    # Every import, including those inside functions that the runs below do not reach.
    # (sys.stdlib_module_names is this Python's; the nodes' 3.8+ has all of these programs' modules.)
    # `sitecustomize`: the worker hook (node/worker/hook.py) imports the node's own one after itself, where there
    # is one.
    outside = sorted(imported_modules(REPO / program) - set(sys.stdlib_module_names) - {"sitecustomize"})
    assert outside == [], f"{program} imports {outside}, which a node's bare Python does not have"


def test_probe_answers_under_a_bare_python(stdlib_env: Env, tmp_path: Path) -> None:
    request = {"mode": "probe", "checks": "all", "names": ["localhost"], "workdir": str(REPO), "script": "train/ddp.py",
               "gpu_timeout_s": 10.0}
    reply = run_on_node(stdlib_env.python, doctor.probe_input(request), tmp_path)
    assert reply["mode"] == "probe"
    assert reply["python"]["executable"] == str(stdlib_env.python)
    assert reply["script"]["sha256"]
    assert reply["packages"]["count"] == 0, reply["packages"]  # the venv really is bare


def test_agent_answers_under_a_bare_python(stdlib_env: Env, tmp_path: Path) -> None:
    # `runs` executes the whole module (every top-level import) and a full request/reply round.
    request = run_actions.agent_input({"action": "runs", "node": "node-0"})
    reply = run_on_node(stdlib_env.python, request, tmp_path, XDG_CACHE_HOME=str(tmp_path / "cache"))
    assert reply == {"runs": []}


def test_an_srun_task_picks_its_agent_request_under_a_bare_python(stdlib_env: Env, tmp_path: Path) -> None:
    # What every task of a `launch --slurm` step runs first: the selector, then the agent with this node's request.
    plan = plan_launch(parse_inventory("hosts: [node-0, node-1]\njob: {script: train/ddp.py}\n", "inv.yaml"))
    stdin = step_input(run_actions.AGENT_SOURCE, [(c, {"action": "runs", "node": c.host.name, "timing": NODE_TIMING})
                                                  for c in plan.nodes])
    reply = run_on_node(stdlib_env.python, stdin, tmp_path, XDG_CACHE_HOME=str(tmp_path / "cache"),
                        SLURM_NODEID="1", SLURMD_NODENAME="node-1")
    assert reply == {"runs": []}


def test_declared_env_holds_the_declared_closure_and_nothing_else(declared_env: Env, tmp_path: Path) -> None:
    # The probe's own package listing (every dist-info folder on sys.path) checks the fixture from inside.
    request = {"mode": "probe", "checks": "all", "names": [], "gpu_timeout_s": 10.0}
    reply = run_on_node(declared_env.python, doctor.probe_input(request), tmp_path)
    listed = {item.partition("==")[0] for item in reply["packages"]["list"]}
    assert listed == declared_env.distributions
    assert {"torch", "fabric"} <= listed and "numpy" not in listed
    assert reply["torch"]["version"] == metadata.version("torch")


def test_ddp_imports_resolve_in_the_declared_env(declared_env: Env) -> None:
    # Every import, including those inside functions that one short run does not reach. The script's own folder
    # comes first on sys.path, as when it is run.
    check = (
        "import importlib.util, sys; sys.path.insert(0, sys.argv[1]); "
        "print(' '.join(n for n in sys.argv[2:] if importlib.util.find_spec(n) is None))"
    )
    names = sorted({name for module in h.TRAIN_SCRIPT.parent.glob("*.py") for name in imported_modules(module)})
    out = subprocess.check_output(
        [declared_env.python, "-I", "-c", check, str(h.TRAIN_SCRIPT.parent), *names], text=True
    )
    assert out.split() == [], f"train/ imports {out.split()}, which no declared dependency provides"


def test_ddp_trains_in_the_declared_env(declared_env: Env, tmp_path: Path) -> None:
    # One short real run: 64 samples / (2 ranks x 8) = 4 steps.
    weights = tmp_path / "weights.pt"
    args = ["--dataset-size", "64", "--batch-size", "8", "--epochs", "1", "--save-weights", str(weights)]
    r = h.run(h.torchrun_cmd(2, h.free_port(), *args, python=str(declared_env.python)), env=CLEAN_ENV)
    assert r.returncode == 0, r.describe()
    digest = h.assert_replicas_in_sync(r.output, 2)
    assert digest == h.state_dict_checksum(h.load(weights)), r.describe()
