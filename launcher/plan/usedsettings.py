"""The settings a run uses, resolved, and where each came from (`--dry-run`'s list; pure): the command line's over
the settings' files and variables, over the inventory's (`retries`, `job.hang_timeout`, `job.on_hang`), over the
defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from launcher.options import Options
from launcher.plan.launchplan import LaunchPlan
from launcher.plan.runsettings import SETTINGS, RunSettings

FROM_INVENTORY = {"retries": "retries", "hang_timeout": "job.hang_timeout", "on_hang": "job.on_hang"}
"""The settings an inventory may set too (its key); the plan holds what the run uses of them (`SETTINGS`)."""


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def used_settings(plan: LaunchPlan, opts: Options, where: Mapping[str, str]) -> list[tuple[str, Any, str]]:
    """(name, the value the run uses, where it came from) of every setting that is not its default, or that was set
    somewhere (`where`: name -> `--grace`, a settings file, a variable; the defaults are not in it)."""
    defaults, run_defaults, out = Options(), RunSettings(), []
    inventory = {"retries": plan.cluster.retries, "hang_timeout": plan.job.hang_timeout, "on_hang": plan.job.on_hang}
    for field in fields(Options):
        name = field.name
        ran, unset = (plan.settings, run_defaults) if name in SETTINGS else (opts, defaults)
        value, default = getattr(ran, name), getattr(unset, name)
        if name in where:
            said = where[name]
            mine = inventory.get(name)
            if name in FROM_INVENTORY and mine is not None and mine != value:
                said += f" (over the inventory's {FROM_INVENTORY[name]}: {_shown(mine)})"
        elif name in FROM_INVENTORY and value != default:
            said = f"{plan.cluster.source} ({FROM_INVENTORY[name]})"
        elif value != default:
            said = "the caller"  # an API keyword, or a setting whose source was not told
        else:
            continue
        out.append((name, value, said))
    if "hosts" in where:
        out.insert(0, ("hosts", Path(plan.cluster.source), where["hosts"]))
    return out


def settings_text(plan: LaunchPlan, opts: Options, where: Mapping[str, str]) -> list[str]:
    """`--dry-run`'s lines on the settings: each that the run uses and is not its default, and where it came from."""
    used = used_settings(plan, opts, where)
    if not used:
        return ["settings: every one at its default"]
    width = max(len(name) for name, _, _ in used)
    shown = [(name, _shown(value), said) for name, value, said in used]
    value_width = max(len(value) for _, value, _ in shown)
    return ["settings the run uses that are not their defaults, and where each came from:",
            *(f"  {name:<{width}}  {value:<{value_width}}  {said}" for name, value, said in shown)]
