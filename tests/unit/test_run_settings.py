"""A command's settings are declared once (launcher.settings) and resolved once for a run (launcher.plan.settings:
the command line's over the settings files' over the inventory's over the defaults, and what cannot apply where the
run is followed refused or noted), with where each came from; no room below the application layer reads the user's
raw options."""

from __future__ import annotations

import ast
import dataclasses
import re

import pytest

from launcher.config.inventory import parse_inventory
from launcher.errors import UsageError
from launcher.options import CONFIG_KEYS, Given, from_config
from launcher.plan.launchplan import plan_launch
from launcher.plan.settings import for_run
from launcher.settings import DEFAULT_GRACE, GROUP_OF, GROUPS, INTERNAL, Settings
from tests.helpers import REPO

INVENTORY = "hosts: [a, b]\nretries: 2\njob: {script: train.py, hang_timeout: 90, on_hang: restart}\n"


def cluster():
    return parse_inventory(INVENTORY, "i.yaml")


def test_the_inventory_then_the_options_win() -> None:
    found = for_run(Settings(), cluster()).run
    assert (found.hang_timeout, found.on_hang, found.retries, found.grace) == (90.0, "restart", 2, DEFAULT_GRACE)
    given = for_run(Settings.of(hang_timeout=5, on_hang="keep", retries=0, grace=1.5, straggler_factor=0.5,
                                straggler_hold=3, retry_wait=0.2), cluster()).run
    assert (given.hang_timeout, given.on_hang, given.retries, given.grace) == (5.0, "keep", 0, 1.5)
    assert (given.straggler_factor, given.straggler_hold, given.retry_wait) == (0.5, 3.0, 0.2)
    assert given.notes == ()


def test_each_value_says_where_it_came_from() -> None:
    """The command line's, a settings file's, the inventory's; one at its default is not noted."""
    mine = from_config({"grace": 4.0, "silence_timeout": 30.0}, Given(retries="1").values(),
                       origins={"grace": "/etc/ddpl.yaml", "silence_timeout": "default"})
    resolved = for_run(mine, cluster())
    assert resolved.sources == {"grace": "/etc/ddpl.yaml", "retries": "--retries",
                                "hang_timeout": "i.yaml (job.hang_timeout)", "on_hang": "i.yaml (job.on_hang)"}
    assert (resolved.run.retries, resolved.run.hang_timeout, resolved.run.grace) == (1, 90.0, 4.0)


def test_a_hang_restart_without_a_retry_stops_and_says_so() -> None:
    found = for_run(Settings.of(retries=0, on_hang="restart"), cluster()).run
    assert (found.on_hang, found.retries) == ("stop", 0)
    assert "a hang stops the run" in found.notes[0]


@pytest.mark.parametrize("where", ["detached", "slurm", "attach"])
def test_only_an_attached_launch_starts_a_run_again(where: str) -> None:
    """The inventory's retries and on_hang restart are noted and dropped; the command line's refused."""
    found = for_run(Settings(), cluster(), where=where)
    assert (found.run.retries, found.run.on_hang) == (0, "stop")
    assert "retries" not in found.sources and "on_hang" not in found.sources  # what applies is not what was set
    assert any("job.on_hang: restart" in note for note in found.run.notes)
    assert any("retries: 2" in note for note in found.run.notes) == (where != "attach")  # attach has no retries
    with pytest.raises(UsageError, match="--on-hang restart"):
        for_run(Settings.of(on_hang="restart"), cluster(), where=where)
    if where != "attach":
        with pytest.raises(UsageError, match="--retries"):
            for_run(Settings.of(retries=1), cluster(), where=where)


def test_the_plan_holds_them() -> None:
    settings = for_run(Settings.of(grace=2.0), cluster())
    plan = plan_launch(cluster(), settings=settings)
    assert plan.settings is settings and plan.settings.run.action_timeout > plan.settings.run.grace
    assert Settings() == for_run(Settings(), parse_inventory("hosts: [a]\njob: {script: t.py}\n", "i.yaml"))


def test_every_setting_is_declared_once() -> None:
    """Each setting a user may set is a field of one group, its default there alone; the command line and the
    settings files name only settings that exist."""
    names = [f.name for kind in GROUPS.values() for f in dataclasses.fields(kind) if f.name not in INTERNAL]
    assert len(names) == len(set(names)) == len(GROUP_OF)
    assert {f.name for f in dataclasses.fields(Given)} <= set(GROUP_OF)
    assert set(CONFIG_KEYS) - {"hosts"} <= set(GROUP_OF)
    # Nowhere else is a setting's default written again: no field of that name with that value (a flag's False is
    # "not given"; the inventory's keys, config/, are a layer of their own).
    defaults, again = Settings(), []
    for path in (REPO / "launcher").rglob("*.py"):
        if path == REPO / "launcher" / "settings.py" or "config" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in GROUP_OF \
                    and isinstance(node.value, ast.Constant) and node.value.value not in (None, False) \
                    and node.value.value == defaults.value(node.target.id):
                again.append(f"{path.relative_to(REPO)}:{node.lineno} {node.target.id}")
    assert again == []


def test_no_room_below_the_application_reads_the_users_options() -> None:
    """The options are resolved once, in app/: every room below reads the resolved `Settings`."""
    below = ("run", "doctor", "sync", "report", "watch", "plan", "slurm", "transport")
    found = [f"{p.relative_to(REPO)}:{i}" for room in below for p in (REPO / "launcher" / room).rglob("*.py")
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bopts\.|\bOptions\b", line)]
    assert found == []


def test_a_command_line_names_only_options_that_exist() -> None:
    """The tasks' overrides are typed (`Given`): each is a setting, and a flag left off is not given."""
    assert Given(grace="2.5", detach=False).values() == {"grace": "2.5"}
    given = from_config({"grace": 10.0}, Given(grace="2.5", retries="1").values())
    assert (given.run.grace, given.run.retries) == (2.5, 1)
    assert given.sources == {"grace": "--grace", "retries": "--retries"}
    with pytest.raises(TypeError):
        Given(gracee="2.5")  # type: ignore[call-arg]
