"""Every default has one home: the node-side programs take every number from their request or from
launcher/node/common/bounds.py (their own local bounds, each with its reason) or launcher/node/wire.py (the few both
sides agree on: the events' descriptor, an attach session's exit codes), and speak Python 3.8.

The agent's constants are checked against launcher.plan.launchplan's in test_agent.py, and the start request against
what the agent reads in test_runs.py; here the same for the probe, and the rules both node programs keep.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
import yaml

from launcher import doctor
from launcher.config.inventory import parse_inventory
from launcher.config.model import Cluster
from launcher.node.common import bounds
from launcher.run import actions as run_actions
from launcher.settings import DEFAULT_CONNECT_TIMEOUT, DEFAULT_PROBE_TIMEOUT
from launcher.sync import nodepush as sync
from launcher.transport.program import BOOTSTRAP, node_files

REPO = Path(__file__).resolve().parents[2]
ENTRIES = ("agent.agent", "probe.probe", "sync.syncd", "slurm.selector", "probe.seek", "probe.image")
"""Every node program, as `node_program` takes it."""
NODE_PROGRAMS = {path: source for entry in ENTRIES
                 for path, source in node_files(entry).items()}
NODE_PROGRAMS["launcher.transport.program.BOOTSTRAP"] = BOOTSTRAP
"""Everything the controller sends a node to run, as it is sent: the node package's modules, and the bootstrap."""
NUMBERS_HOME = ("launcher/node/common/bounds.py", "launcher/node/wire.py")
"""The node modules that may hold numbers: the node programs' own bounds, and what both sides agree on."""
SENT = {run_actions.AGENT_SOURCE: "agent.agent", doctor.PROBE_SOURCE: "probe.probe", sync.SYNCD_SOURCE: "sync.syncd"}


def probe_numbers() -> set[tuple[str, str]]:
    """(request part, key) of every number the probe reads: its `seconds(part, "KEY", "WHERE")` calls."""
    tree = ast.parse("\n".join(node_files("probe.probe").values()))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "seconds":
            key, where = node.args[1], node.args[2]
            assert isinstance(key, ast.Constant) and isinstance(where, ast.Constant), ast.unparse(node)
            found.add((where.value, key.value))
    return found


def _is_number(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _is_get(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"


def _makes_up_a_number(node: ast.AST) -> bool:
    """`X.get(KEY, <number>)`, or `X.get(KEY) or <number>`."""
    if isinstance(node, ast.Call) and _is_get(node):
        return len(node.args) == 2 and _is_number(node.args[1])
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        return _is_number(node.values[-1]) and any(_is_get(v) for v in node.values[:-1])
    return False


def numeric_defaults(source: str) -> list[str]:
    """Every number `source` falls back on when a request lacks a value: one the program would make up."""
    return [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(ast.parse(source))
            if _makes_up_a_number(node)]


WAITS = ("join", "wait", "sleep", "select", "poll", "settimeout", "communicate", "create_connection", "listen",
         "read", "recv")
"""Calls whose numbers are waits (seconds) or sizes (bytes, a backlog): a bare one there is a number of its own."""


def _numbers(node: ast.AST) -> list[ast.Constant]:
    """The numbers in an expression other than 0 (`max(0.0, left)`, `poll(0)`: not waiting is no number to home) and
    other than an index (`os.path.join(parent, parts[-1])`)."""
    if isinstance(node, ast.Subscript):
        return []
    if isinstance(node, ast.Constant):
        return [node] if type(node.value) in (int, float) and node.value else []
    return [n for child in ast.iter_child_nodes(node) for n in _numbers(child)]


def bare_waits(source: str) -> list[str]:
    """Every number written into a wait or a size: `join(5)`, `sleep(0.05)`, `timeout=max(0.2, ...)`, `recv(256)`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", getattr(node.func, "id", ""))
        given = [*node.args, *(k.value for k in node.keywords)] if name in WAITS else []
        given += [k.value for k in node.keywords if k.arg and "timeout" in k.arg]
        if any(_numbers(arg) for arg in given):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def own_constants(source: str) -> list[str]:
    """Module-level names bound to a number (`SMI_TIMEOUT_S = 3.0`): only bounds.py and wire.py may have them."""
    return [ast.unparse(node.targets[0]) for node in ast.parse(source).body
            if isinstance(node, ast.Assign) and _numbers(node.value) and not any(
                isinstance(n, ast.Name | ast.Attribute | ast.Call) for n in ast.walk(node.value))]


def cluster(master_port: int = 29400) -> Cluster:
    return parse_inventory(yaml.safe_dump({"hosts": ["node-0", "node-1"],
                                           "rendezvous": {"master_addr": "node-0", "master_port": master_port}}),
                           "hosts/test.yaml")


def test_the_controllers_requests_carry_every_number_the_probe_reads() -> None:
    numbers = probe_numbers()
    listen = doctor.listen_request(cluster(), "t0ken", 7.0)
    connect = doctor.connect_section("t0ken", 7.0)
    assert {k for where, k in numbers if where == "listen"} == {"max_s"}
    assert {k for where, k in numbers if where == "connect"} == {"window", "token_read_s"}
    assert {k for where, k in numbers if where == "probe"} == {"gpu_timeout_s"}
    probe = doctor.probe_request(cluster(), cluster().hosts[1], "fast", connect)
    for where, key in numbers:
        assert key in {"listen": listen, "connect": connect, "probe": probe}[where], (where, key)
    # ... and the numbers are the doctor's own, written once in launcher.doctor.request.
    assert listen == {"mode": "listen", "master_port": 29400, "token": "t0ken", "max_s": 7.0 + doctor.LISTENER_MARGIN_S}
    assert connect == {"token": "t0ken", "window": doctor.LISTEN_WINDOW_S, "token_read_s": doctor.TOKEN_READ_S}
    assert doctor.connect_section("t", 2.0)["window"] == 1.0  # a short timeout leaves room for the probe's answer
    probe_req = doctor.probe_request(cluster(), cluster().hosts[1], "fast", connect)
    assert probe_req["connect"] == connect


def test_the_node_programs_keep_no_copy_of_the_controllers_numbers() -> None:
    # What the controller decides lives in launcher.options and launcher.doctor.request; the node's own numbers are
    # only its local bounds, all in launcher/node/common/bounds.py.
    own = {name for name, value in vars(bounds).items() if name.isupper() and (isinstance(value, int | float) or (
        isinstance(value, tuple) and all(isinstance(v, int) for v in value)))}  # a number, or a version's numbers
    assert {"RESOLVE_BUDGET_S", "SMI_REAP_S", "HOLDERS_BUDGET_S", "EVENTS_DRAIN_S"} <= own
    assert own.isdisjoint(vars(doctor)), own & set(vars(doctor))
    source = (REPO / "launcher/node/common/bounds.py").read_text(encoding="utf-8")
    assert sorted(own) == sorted(own_constants(source))  # each a plain number ...
    for statement, after in itertools.pairwise(ast.parse(source).body):  # ... with a docstring that says why
        if isinstance(statement, ast.Assign):
            assert isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant), ast.unparse(statement)


@pytest.mark.parametrize("program", [path for path in NODE_PROGRAMS if path.endswith(".py")])
def test_node_programs_write_no_number_into_a_wait_or_a_size(program: str) -> None:
    assert bare_waits(NODE_PROGRAMS[program]) == []
    assert program in NUMBERS_HOME or own_constants(NODE_PROGRAMS[program]) == []


def test_the_bare_wait_finder_finds_them() -> None:
    source = ('t.join(5)\nt.join(bounds.EVENTS_DRAIN_S)\ntime.sleep(0.05)\ns = f(a, timeout=max(0.2, left))\n'
              'sock.recv(256)\nselect.select([a], [], [], max(0.0, left))\npoller.poll(0)\nx.split(",", 1)\n'
              'server.listen(128)\nrun(cmd, timeout=wait_s)\nos.path.join(a, b[-1])\nC = 3.0\nD = 1 << 20\n'
              'E = len(x) + 1\n')
    assert [line.partition(":")[0] for line in bare_waits(source)] == [
        "line 1", "line 3", "line 4", "line 5", "line 9"]
    assert own_constants(source) == ["C", "D"]


def test_a_fast_probe_fits_in_the_default_probe_timeout() -> None:
    # Each probe has `probe_timeout` to answer (launch's preflight: the fast checks). Its worst case: nvidia-smi's
    # bound or the DNS budget, whichever is longer (nvidia-smi starts first and runs meanwhile), then the
    # refused-connection window, then the wait for the token. Without nvidia-smi it fits in the connect timeout.
    timeout = DEFAULT_PROBE_TIMEOUT
    connect = doctor.connect_section("t", timeout)
    request = doctor.probe_request(cluster(), cluster().hosts[1], "fast", connect)
    worst = max(bounds.RESOLVE_BUDGET_S, request["gpu_timeout_s"]) + connect["window"] + connect["token_read_s"]
    assert worst < timeout
    assert doctor.listen_request(cluster(), "t", timeout)["max_s"] > timeout  # the listener outlives every probe
    short = doctor.connect_section("t", DEFAULT_CONNECT_TIMEOUT)
    assert bounds.RESOLVE_BUDGET_S + short["window"] + short["token_read_s"] < DEFAULT_CONNECT_TIMEOUT


@pytest.mark.parametrize("program", [path for path in NODE_PROGRAMS if path.endswith(".py")])
def test_node_programs_make_up_no_numbers(program: str) -> None:
    assert numeric_defaults(NODE_PROGRAMS[program]) == []


def test_the_numeric_default_finder_finds_them() -> None:
    source = ('a = request.get("max_s", 30.0)\nb = connect.get("window", -1)\nc = request.get("n") or 5\n'
              'd = request.get("checks", "all")\ne = request.get("names", [])\nf = request.get("x", True)\n')
    assert [line.partition(":")[0] for line in numeric_defaults(source)] == ["line 1", "line 2", "line 3"]


@pytest.mark.parametrize("program", list(NODE_PROGRAMS))
def test_node_programs_are_python_3_8(program: str) -> None:
    # A node runs them under whatever interpreter it has; the controller's own floor is 3.10.
    ast.parse(NODE_PROGRAMS[program], program, feature_version=(3, 8))


def test_node_programs_are_sent_as_they_are_in_the_repository() -> None:
    for path in NODE_PROGRAMS:
        if path.endswith(".py"):
            assert NODE_PROGRAMS[path] == (REPO / path).read_text(encoding="utf-8"), path
    for source, entry in SENT.items():  # what the launcher sends is that package, its loader first
        assert source.startswith(NODE_PROGRAMS["launcher/node/loader.py"]) and f"launcher.node.{entry}" in source
