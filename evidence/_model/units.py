"""Sizes as people read them: the one formatter of byte counts in reports and messages.

Kept in ``_model`` (pure values, no I/O) so that a report built below the CLI (``status``,
``verify``) and the CLI's own lines write a size the same way.
"""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(n: float) -> str:
    """``512 B``, ``1.5 KiB``, ... ``3.0 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
