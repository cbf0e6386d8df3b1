"""The fault-injecting VFS now lives in ``evidence.testing.disk`` (issue 6).

``FaultVFS`` keeps the name and API tests/test_writer.py uses: ``arm(op, suffix)`` fails
the next ``op`` on a file whose name ends with ``suffix`` once, and ``fired`` lists what did.
"""

from __future__ import annotations

from evidence.testing.disk import CrashVFS

__all__ = ["FaultVFS"]


class FaultVFS(CrashVFS):
    def __init__(self, name: str = "faultvfs") -> None:
        super().__init__(name)
