"""A small fault-injecting SQLite VFS: fail the next sync or write of a chosen file kind.

Files inherit from ``apsw.VFSFile`` and delegate to the default VFS; an armed fault makes
the next matching operation raise an I/O error once. Enough to put the writer's COMMIT in
the "outcome unknown" state of DESIGN.md rule 11 on demand.
"""

from __future__ import annotations

import apsw


class FaultVFS(apsw.VFS):
    def __init__(self, name: str = "faultvfs") -> None:
        self.name = name
        self.armed: dict[tuple[str, str], int] = {}  # (operation, file suffix) -> countdown
        self.fired: list[tuple[str, str]] = []
        super().__init__(name, "")

    def arm(self, operation: str, suffix: str, after: int = 0) -> None:
        """Fail the ``after``-th next ``operation`` ('sync'|'write') on a file ending in suffix."""
        self.armed[(operation, suffix)] = after

    def should_fail(self, operation: str, filename: str) -> bool:
        for (op, suffix), countdown in list(self.armed.items()):
            if op == operation and filename.endswith(suffix):
                if countdown == 0:
                    del self.armed[(op, suffix)]
                    self.fired.append((op, suffix))
                    return True
                self.armed[(op, suffix)] = countdown - 1
        return False

    def xOpen(self, name, flags):
        return FaultFile(self, name, flags)


class FaultFile(apsw.VFSFile):
    def __init__(self, vfs: FaultVFS, name, flags) -> None:
        self.vfs = vfs
        self.filename = name if isinstance(name, str) else name.filename()
        super().__init__("", name, flags)

    def xWrite(self, data, offset):
        if self.vfs.should_fail("write", self.filename):
            raise apsw.IOError("injected write failure")
        return super().xWrite(data, offset)

    def xSync(self, flags):
        if self.vfs.should_fail("sync", self.filename):
            raise apsw.IOError("injected sync failure")
        return super().xSync(flags)
