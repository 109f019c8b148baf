"""The settings a run uses, resolved, and where each came from (`--dry-run`'s list; pure): the command line's over
the settings' files and variables, over the inventory's (`retries`, `job.hang_timeout`, `job.on_hang`), over the
defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.plan.launchplan import LaunchPlan
from launcher.plan.settings import FROM_INVENTORY
from launcher.settings import GROUP_OF, Settings


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def used_settings(plan: LaunchPlan, hosts_from: str | None = None) -> list[tuple[str, Any, str]]:
    """(name, the value the run uses, where it came from) of every setting that is not its default, or that was set
    somewhere (the plan's `settings.sources`); the inventory first where `hosts_from` says where it was named."""
    settings, defaults, out = plan.settings, Settings(), []
    inventory = {"retries": plan.cluster.retries, "hang_timeout": plan.job.hang_timeout, "on_hang": plan.job.on_hang}
    for name in GROUP_OF:
        value = settings.value(name)
        said = settings.sources.get(name)
        if said is None:
            if value == defaults.value(name):
                continue
            said = "the caller"  # a value whose source was not told
        mine = inventory.get(name)
        if name in FROM_INVENTORY and mine is not None and mine != value and not said.startswith(plan.cluster.source):
            said += f" (over the inventory's {FROM_INVENTORY[name]}: {_shown(mine)})"
        out.append((name, value, said))
    if hosts_from is not None:
        out.insert(0, ("hosts", Path(plan.cluster.source), hosts_from))
    return out


def settings_text(plan: LaunchPlan, hosts_from: str | None = None) -> list[str]:
    """`--dry-run`'s lines on the settings: each that the run uses and is not its default, and where it came from."""
    used = used_settings(plan, hosts_from)
    if not used:
        return ["settings: every one at its default"]
    width = max(len(name) for name, _, _ in used)
    shown = [(name, _shown(value), said) for name, value, said in used]
    value_width = max(len(value) for _, value, _ in shown)
    return [
        "settings the run uses that are not their defaults, and where each came from:",
        *(f"  {name:<{width}}  {value:<{value_width}}  {said}" for name, value, said in shown),
    ]
