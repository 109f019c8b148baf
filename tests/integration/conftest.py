"""Everything here runs real processes: real sshd sandbox nodes, torchrun, a real slurmctld (`-m integration`)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.integration)
