"""The settings of the installed command (`ddpl`): Invoke's config levels, with `ddpl` files whose keys are the
launcher's settings (`grace: 5`, no `launcher:` section), the project's file found at the project's root, never one
another user owns, and where each setting came from.

Levels, later ones win (Invoke's own order): the defaults (launcher/settings.py), /etc/ddpl.yaml, ~/.ddpl.yaml, the
project's ddpl.yaml (its root: `launcher.project.find_root`), DDPL_<KEY> variables (DDPL_GRACE=5), `ddpl -f FILE`.
A checkout's `inv` keeps Invoke's own: invoke.yaml's `launcher:` section, INVOKE_LAUNCHER_<KEY>.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from invoke import Config
from invoke.env import Environment

from launcher.errors import LauncherError
from launcher.project import CONFIG_NAME, SAFE_SETTING, check_owner

SECTION = "launcher"
"""Where the launcher's settings sit in Invoke's config (a ddpl file's keys are put there as they are read)."""
NOT_OPTIONS = ("defaults", "job", SAFE_SETTING)
"""Settings that are no `launcher.settings.Settings` field: what a hostfile takes (defaults, job), and the user's
trusted folders."""


class DdplConfig(Config):
    """Invoke's `Config` for `ddpl`: ddpl.yaml files of the launcher's keys, DDPL_ variables, the project's file only
    when this user owns it and its folder (unless ~/.ddpl.yaml lists the folder in `safe_directories`)."""

    prefix = CONFIG_NAME
    flat = True
    """Files and variables name the launcher's keys directly (`grace`, DDPL_GRACE), not `launcher.grace`."""

    @property
    def project_root(self) -> Path | None:
        """The project folder whose ddpl.yaml was looked for; its settings' relative paths start there."""
        prefix = self._project_prefix
        return None if prefix is None else Path(prefix)

    def safe_directories(self) -> list[str]:
        """Other users' project folders this user trusts: `safe_directories` of /etc/ddpl.yaml and ~/.ddpl.yaml."""
        found: list[str] = []
        for level in (self._system, self._user):
            listed = level.get(SECTION, {}).get(SAFE_SETTING) or []
            found += [str(item) for item in (listed if isinstance(listed, list) else [listed])]
        return found

    def load_project(self, merge: bool = True) -> None:
        prefix = self._project_prefix
        if prefix is not None and self._project_found is None:
            for suffix in self._file_suffixes:
                candidate = Path(f"{prefix}{self.prefix}.{suffix}")
                if candidate.exists():
                    check_owner(candidate, self.safe_directories())
        super().load_project(merge)

    def load_shell_env(self) -> None:
        loader = Environment(config=self._config.get(SECTION, {}), prefix=self._env_prefix)
        self._set(_env={SECTION: loader.load()})
        self.merge()

    def _load_yaml(self, path: Any) -> Any:
        try:
            with open(path, encoding="utf-8") as file:
                return _section(path, yaml.safe_load(file))
        except yaml.YAMLError as exc:
            raise LauncherError(f"{path}: not YAML: {str(exc).splitlines()[0]}") from None

    _load_yml = _load_yaml

    def _load_json(self, path: Any) -> Any:
        try:
            return _section(path, super()._load_json(path))
        except ValueError as exc:
            raise LauncherError(f"{path}: not JSON: {exc}") from None

    def _load_py(self, path: str) -> dict[str, Any]:
        # A ddpl.py in a project is that project's own code: never run as settings (Invoke would exec it).
        raise FileNotFoundError(errno.ENOENT, "not read as settings", path)


def _section(path: Any, data: Any) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LauncherError(
            f"{path}: must be a mapping of settings (`hosts: hosts/cluster.yaml`, `grace: 5`), got "
            f"{type(data).__name__}"
        )
    return {SECTION: data}


def sources(config: Any) -> dict[str, str]:
    """Where each of the launcher's settings came from: `default`, a file's path, a variable's name, or `-f FILE`
    (Invoke's levels, the last that sets it wins); for Invoke's own Config (a checkout's `inv`) too."""
    flat = getattr(config, "flat", False)
    env_prefix = f"{config._env_prefix}{'' if flat else SECTION.upper() + '_'}"
    levels: list[tuple[Mapping[str, Any], str | None]] = [
        (config._defaults, "default"),
        (config._collection, "default"),
        (config._system, config._system_path),
        (config._user, config._user_path),
        (config._project, config._project_path),
        (config._env, None),
        (config._runtime, config._runtime_path),
        (config._overrides, "the command line"),
    ]
    found: dict[str, str] = {}
    for data, where in levels:
        for key in (data or {}).get(SECTION) or {}:
            found[key] = where or f"{env_prefix}{key.upper()}"
    return found


def source_lines(config: Any) -> list[str]:
    """`--config-sources`: the files looked for, the project root, then each setting and where it came from."""
    flat = getattr(config, "flat", False)
    name = f"{CONFIG_NAME if flat else 'invoke'}.yaml"
    files = [
        ("system", config._system_path, f"/etc/{name}"),
        ("user", config._user_path, f"~/.{name}"),
        ("project", config._project_path, f"{config._project_prefix or ''}{name}"),
        ("runtime (-f)", config._runtime_path, None),
    ]
    lines = [
        f"{level} config: {path if path else f'{default} (none)' if default else '(none)'}"
        for level, path, default in files
    ]
    root = getattr(config, "project_root", None)
    if root is not None:
        lines.append(f"project root: {root} (relative paths in settings start here)")
    return [*lines, "settings:", *setting_lines(config)]


def setting_lines(config: Any, changed_only: bool = False) -> list[str]:
    """Each setting, its value and where it came from (`changed_only`: those not at their defaults)."""
    where = sources(config)
    settings = config.get(SECTION, {})
    keys = sorted(k for k in settings if not changed_only or where.get(k, "default") != "default")
    width = max((len(k) for k in keys), default=0)
    return [f"  {key:<{width}} = {settings[key]!r:<24} from {where.get(key, 'default')}" for key in keys]
