"""The one home of defaults: numbers checked where they arrive, limits that follow the grace period."""

from __future__ import annotations

import pytest

from launcher.errors import LauncherError
from launcher.limits import heartbeat_interval
from launcher.options import from_config
from launcher.settings import Settings


def test_a_long_grace_period_never_outlives_the_action_limit() -> None:
    # A stop with grace G takes up to G seconds on the node: the controller must wait longer than that.
    for grace in (0.0, 10.0, 43.0, 300.0):
        assert Settings.of(grace=grace).run.action_timeout > grace + 5


def test_heartbeats_come_several_times_per_timeout() -> None:
    assert heartbeat_interval(30.0) == 5.0
    assert heartbeat_interval(2.0) == 0.5
    assert heartbeat_interval(None) == 5.0


def test_an_attached_run_has_no_heartbeat_bound_unless_one_is_set() -> None:
    """A laptop closed for lunch must not end its run: no bound by default, and 0 (what invoke.yaml can say) is none;
    the nodes' request carries None, which the agent reads as no bound."""
    assert Settings().run.heartbeat_bound is None
    assert from_config({"heartbeat_timeout": 0}, {}).run.heartbeat_bound is None
    assert from_config({}, {"heartbeat_timeout": "900"}).run.heartbeat_bound == 900.0


@pytest.mark.parametrize(("key", "value", "sentence"), [
    ("grace", "nan", "invoke.yaml: launcher.grace must be a finite number of seconds, got 'nan'"),
    ("silence_timeout", 0, "invoke.yaml: launcher.silence_timeout must be from 1 to 86400 seconds, got '0'"),
    ("console_buffer", 1.5, "invoke.yaml: launcher.console_buffer must be a whole number, got '1.5'"),
    ("heartbeat_timeout", 1e-9, "invoke.yaml: launcher.heartbeat_timeout must be 0 (no bound) or from 1 to 86400 "
     "seconds, got '1e-09'"),
    ("probe_timeout", 1e10, "invoke.yaml: launcher.probe_timeout must be from 0.1 to 86400 seconds, "
     "got '10000000000.0'"),
    ("retry_cooldown", 86401, "invoke.yaml: launcher.retry_cooldown must be from 0 to 86400 seconds, got '86401'"),
    ("console_buffer", 10**9, "invoke.yaml: launcher.console_buffer must be from 1 to 100000000, got '1000000000'"),
    ("grace", True, "invoke.yaml: launcher.grace must be a number of seconds, got 'True'"),
])
def test_config_values_are_checked_naming_their_key(key: str, value: object, sentence: str) -> None:
    with pytest.raises(LauncherError) as caught:
        from_config({key: value}, {})
    assert str(caught.value) == sentence


def test_what_hang_timeout_means_is_one_text_and_every_other_agrees_cpu_time_is_never_progress() -> None:
    """launcher/watch/hang.py's rule: a line, a step or a batch is progress; CPU time never is (a hung collective
    keeps a CPU busy). Its options, the launch task's help, the inventory's job.hang_timeout, the example inventory
    and invoke.yaml once said a rank's CPU growth was progress."""
    import re
    from pathlib import Path

    from launcher import tasks
    from launcher.settings import HANG_TIMEOUT_HELP
    from launcher.watch import hang

    assert "CPU time is never progress" in HANG_TIMEOUT_HELP and "CPU time is never progress" in hang.__doc__
    assert tasks.launch.help["hang-timeout"].startswith(HANG_TIMEOUT_HELP)
    repo = Path(__file__).resolve().parents[2]
    for name in ("invoke.yaml", "hosts/example.yaml", "launcher/config/example.yaml", "launcher/settings.py",
                 "launcher/config/model.py", "launcher/tasks.py", "README.md", "docs/usage.md", "docs/commands.md",
                 "docs/watching.md", "docs/troubleshooting.md", "docs/clusters.md"):
        for said in re.findall(r"hang[_ -]timeout.{0,300}", (repo / name).read_text(), re.S):
            cpu = said[:said.find("CPU") + 40] if "CPU" in said else ""
            assert not cpu or "CPU time is never progress" in cpu or "CPU time says nothing" in cpu, (name, said)
