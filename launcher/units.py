"""Quantities as people read them. Pure; below every module that shows one (the doctor's findings, `inv top`)."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """Bytes as people read them: 512 B, 1.5 KiB, 23.5 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable
