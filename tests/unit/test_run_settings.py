"""A run's settings are resolved once, in one place (launcher.plan.runsettings), for every way a run is followed:
the command line's over the inventory's over the defaults, and what cannot apply there refused or noted."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.config.inventory import parse_inventory
from launcher.errors import UsageError
from launcher.options import DEFAULT_GRACE, Options
from launcher.plan.launchplan import plan_launch
from launcher.plan.runsettings import SETTINGS, RunSettings, run_settings

INVENTORY = "hosts: [a, b]\nretries: 2\njob: {script: train.py, hang_timeout: 90, on_hang: restart}\n"


def cluster():
    return parse_inventory(INVENTORY, "i.yaml")


def test_the_inventory_then_the_options_win() -> None:
    found = run_settings(cluster())
    assert (found.hang_timeout, found.on_hang, found.retries, found.grace) == (90.0, "restart", 2, DEFAULT_GRACE)
    given = run_settings(cluster(), opts=Options(hang_timeout=5, on_hang="keep", retries=0, grace=1.5,
                                                 straggler_factor=0.5, straggler_hold=3, retry_wait=0.2))
    assert (given.hang_timeout, given.on_hang, given.retries, given.grace) == (5.0, "keep", 0, 1.5)
    assert (given.straggler_factor, given.straggler_hold, given.retry_wait) == (0.5, 3.0, 0.2)
    assert given.notes == ()


def test_a_hang_restart_without_a_retry_stops_and_says_so() -> None:
    found = run_settings(cluster(), opts=Options(retries=0, on_hang="restart"))
    assert (found.on_hang, found.retries) == ("stop", 0)
    assert "a hang stops the run" in found.notes[0]


@pytest.mark.parametrize("where", ["detached", "slurm", "attach"])
def test_only_an_attached_launch_starts_a_run_again(where: str) -> None:
    """The inventory's retries and on_hang restart are noted and dropped; the command line's refused."""
    found = run_settings(cluster(), where=where)
    assert (found.retries, found.on_hang) == (0, "stop")
    assert any("job.on_hang: restart" in note for note in found.notes)
    assert any("retries: 2" in note for note in found.notes) == (where != "attach")  # attach has no retries
    with pytest.raises(UsageError, match="--on-hang restart"):
        run_settings(cluster(), opts=Options(on_hang="restart"), where=where)
    if where != "attach":
        with pytest.raises(UsageError, match="--retries"):
            run_settings(cluster(), opts=Options(retries=1), where=where)


def test_the_plan_holds_them_and_every_setting_is_an_option() -> None:
    settings = run_settings(cluster(), opts=Options(grace=2.0))
    plan = plan_launch(cluster(), settings=settings)
    assert plan.settings is settings and plan.settings.action_timeout > plan.settings.grace
    assert set(SETTINGS) <= {f.name for f in dataclasses.fields(Options)}
    assert RunSettings() == run_settings(parse_inventory("hosts: [a]\njob: {script: t.py}\n", "i.yaml"))


def test_a_command_line_names_only_options_that_exist() -> None:
    """The tasks' overrides are typed (`Given`): each is an option, and a flag left off is not given."""
    from launcher.options import Given, from_config

    assert {f.name for f in dataclasses.fields(Given)} <= {f.name for f in dataclasses.fields(Options)}
    assert Given(grace="2.5", detach=False).values() == {"grace": "2.5"}
    assert from_config({"grace": 10.0}, Given(grace="2.5", retries="1").values()) == Options(grace=2.5, retries=1)
    with pytest.raises(TypeError):
        Given(gracee="2.5")  # type: ignore[call-arg]
