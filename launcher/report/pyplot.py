"""matplotlib as the run's page draws with it (launcher/report/page.py): found and set up once, its fonts let go."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """matplotlib's pyplot on its file-only backend (Agg: no display on a node or a laptop's ssh session), SVG text
    as text; None where matplotlib cannot be imported (the page then has tables)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "ddp-launcher", "font.size": 9})
    return plt


def release_fonts() -> None:
    """matplotlib keeps each font file it drew with open for the life of the process (font_manager's cache of
    FT2Font objects): a caller's process (`Run.report()` from the API) is left with the files it had."""
    try:
        from matplotlib import font_manager

        font_manager._get_font.cache_clear()  # type: ignore[attr-defined]
    except (ImportError, AttributeError):  # another matplotlib: its cache stays, which costs a file or two
        pass
