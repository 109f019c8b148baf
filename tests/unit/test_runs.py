"""The controller's side of a run that needs no network: what each node's agent is told, and run ids."""

from __future__ import annotations

import ast
import re

import pytest

from launcher.config.inventory import parse_inventory
from launcher.errors import LauncherError
from launcher.limits import heartbeat_interval
from launcher.plan.launchplan import plan_launch
from launcher.plan.request import start_request
from launcher.plan.settings import for_run
from launcher.run.actions import check_run_id
from launcher.run.nodeenv import resolve_env
from launcher.settings import Settings
from launcher.transport.program import node_files

INVENTORY = """
defaults: {python: /usr/bin/python3, env: {A: "1", TOKEN: {from_env: MY_TOKEN, secret: true}}}
hosts: [node-0, node-1]
job: {script: train.py}
"""


def agent_reads() -> set[str]:
    """Every `request["KEY"]` the agent reads without a default."""
    # The agent's own modules; the probe it runs in a launch's check reads the preflight section (tested apart).
    probe_only = set(node_files("probe.probe")) - {"launcher/node/wire.py", "launcher/node/common/netif.py"}
    probe_only.add("launcher/node/probe/image.py")  # a container host's probe: its own request (tested apart)
    tree = ast.parse("\n".join(source for path, source in node_files("agent.agent").items() if path not in probe_only))
    return {node.slice.value for node in ast.walk(tree)
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "request"
            and isinstance(node.slice, ast.Constant) and isinstance(node.ctx, ast.Load)}  # what it writes: its own


def test_the_start_request_carries_every_number_the_agent_uses() -> None:
    settings = Settings.of(grace=3.0, heartbeat_timeout=8.0, silence_timeout=20.0)
    cluster = parse_inventory(INVENTORY, "inv.yaml")
    plan = plan_launch(cluster, settings=for_run(settings, cluster))  # every number: the plan's
    request = start_request(plan, plan.nodes[1], {"A": "1"})
    assert (request["grace"], request["heartbeat_timeout"]) == (3.0, 8.0)
    assert request["alive_interval"] == heartbeat_interval(20.0) < settings.run.silence_timeout
    assert request["mark"] == f"{plan.run_id}/node-1" and request["secret_names"] == ["TOKEN"]
    unbound = plan_launch(cluster, settings=for_run(Settings.of(), cluster))  # the default: no heartbeat bound
    assert start_request(unbound, unbound.nodes[1], {})["heartbeat_timeout"] is None
    # The agent has no defaults of its own: whatever it reads from a start request, the request has.
    # (`report`'s two sizes come in its own request: launcher.app.pages.report_request)
    # (`container` only on a container host: launcher.plan.containerplan.container_request, tested apart)
    start_keys = agent_reads() - {"node", "run_id", "follow", "action", "tail_bytes", "series_bytes", "trace_bytes",
                                  "container"}
    assert start_keys <= set(request), start_keys - set(request)


def test_from_env_values_are_read_at_launch_and_a_missing_one_is_named() -> None:
    plan = plan_launch(parse_inventory(INVENTORY, "inv.yaml"))
    assert resolve_env(plan.nodes[0], {"MY_TOKEN": "s3cret"}) == {"A": "1", "TOKEN": "s3cret"}
    with pytest.raises(LauncherError, match=r"node-0: env TOKEN is to be copied from \$MY_TOKEN, which is not set"):
        resolve_env(plan.nodes[0], {})


@pytest.mark.parametrize("bad", ["../../x", "x[/]", "20261122-031500-A1B2C3", "20261122-031500-a1b2c3/..", ""])
def test_run_ids_are_checked(bad: str) -> None:
    with pytest.raises(LauncherError, match=re.escape("--run must be a run id like 20261122-031500-a1b2c3")):
        check_run_id(bad)
    assert check_run_id("20261122-031500-a1b2c3") == "20261122-031500-a1b2c3"
    assert check_run_id(None) is None


def test_a_node_action_past_its_limit_says_so_not_exit_code_minus_one() -> None:
    from launcher.run.control import _agent_error
    from launcher.transport.channel import Result

    assert _agent_error(Result(-1, b"", b"", timed_out=30.0)) == (
        "no answer within 30 s (the grace period plus 20 s): the node is slow or hung, and what became of the run "
        "there is not known")
    assert _agent_error(Result(3, b"", b'{"message": "no such run"}\n')) == "no such run"
