"""An Invoke runtime config with `launcher.defaults` and `launcher.job`, as the hostfile tests use it."""

from __future__ import annotations

from pathlib import Path

import yaml


def config_file(tmp_path: Path, defaults: object = None, job: object = None) -> Path:
    """An Invoke runtime config (`inv -f FILE`) with `launcher.defaults` and `launcher.job`, as invoke.yaml holds."""
    launcher: dict = {}
    if defaults is not None:
        launcher["defaults"] = defaults
    if job is not None:
        launcher["job"] = job
    path = tmp_path / "conf.yaml"
    path.write_text(yaml.safe_dump({"launcher": launcher}))
    return path
