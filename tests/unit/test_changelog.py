"""The version lives in one place (launcher.__version__, which pyproject.toml reads) and the changelog's newest
section names it."""

from __future__ import annotations

import re

import launcher
from tests.helpers import REPO


def test_the_changelogs_newest_section_is_the_version() -> None:
    sections = re.findall(r"^## (\d+\.\d+\.\d+)\b", (REPO / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert sections and sections[0] == launcher.__version__, (sections[:2], launcher.__version__)
    assert 'version = {attr = "launcher.__version__"}' in (REPO / "pyproject.toml").read_text(encoding="utf-8")
