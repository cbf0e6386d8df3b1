"""What every store is, whatever holds its database: ``StoreBase``.

Two kinds of store build on it: ``Store`` (``_store/db.py``), a store directory holding a
SQLite database and its ``artifacts/``, and ``PostgresStore`` (``_store/pgstore.py``), a
PostgreSQL database with its payloads where the store records. This class holds what they
share (how a reader reads, where driver errors are translated, the store's meta) and
names what each provides; it imports neither, so that ``Store.open``, which turns any
location into one of them (``_store/db.py``), imports both without a circle.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Self

import apsw

from .._errors import StoreError, SyncError
from .backend import ArtifactBackend, StoreBackend
from .sqlite import Sync

__all__ = ["StoreBase", "unfinished_creation"]


def unfinished_creation(location: str, missing: str, *, init: str) -> StoreError:
    """The error for a store whose creation was cut short (either kind records something
    of its identity after its schema): what is ``missing``, and ``init`` (how to run
    ``evidence init`` again) to finish it."""
    return StoreError(f"{location}: this store's creation did not finish ({missing})",
                      path=location, hint=f"run {init} again: it finishes the store")


class StoreBase:
    """An open store: its database (``backend``, and ``connection``, the one write
    connection, owned by the writer) and its artifact store (``artifacts``)."""

    path: Path  # the store directory (a database server's store has none: None)
    db_path: Path
    connection: Any
    artifacts: ArtifactBackend
    backend: StoreBackend
    sync: Sync
    busy_timeout_ms: int
    schema_version: int
    vfs: str | None
    sync_failed: str | None  # why, once an fsync failed in this process
    read_only: bool  # opened with read_only=True: ``connection`` cannot write
    _store_id = ""  # read when the store was opened (``store_id``)

    @property
    def location(self) -> str:
        """What messages and reports call the store: its directory, or a connection string
        (without its password)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @property
    def store_id(self) -> str:
        """The store's identity, read when it was opened (it never changes): answering it
        (the service's handshake, on the event loop's thread) never touches the write
        connection, which the writer may be using on its commit thread meanwhile."""
        return self._store_id or self.meta("store_id")

    def meta(self, key: str) -> str:
        rows = self.connection.execute(
            "SELECT value FROM store_meta WHERE key = ?", (key,)).fetchall()
        return rows[0][0] if rows else ""

    def reader(self) -> contextlib.AbstractContextManager[apsw.Connection]:
        """A read-only connection for one short snapshot; closed on exit."""
        return self.backend.reader()

    def snapshot(self) -> contextlib.AbstractContextManager[apsw.Connection]:
        """One consistent read: a read-only connection inside one read transaction, with
        errors translated (``StoreError`` and its kin); the transaction ends on exit."""
        return self.backend.snapshot()

    def errors(self) -> contextlib.AbstractContextManager[None]:
        """The translation boundary for work on a connection of this store (the writer's,
        or a reader's between its snapshots): apsw errors become ``StoreError`` and kin."""
        return self.backend.errors()

    def check_writable(self) -> None:
        """Raise ``StoreError`` if the store was opened read-only."""
        if self.read_only:
            raise StoreError(f"{self.path} was opened read-only",
                             hint="open it without read_only to write", path=str(self.path))

    def _sync_error(self) -> SyncError:
        return SyncError(
            f"{self.location}: an fsync of the store failed ({self.sync_failed}); nothing "
            "more is acknowledged from it until it is resynced",
            hint="check the disk (dmesg); once it works, open the store again (opening it "
            "for writing makes it durable first) and redeliver what was not acknowledged",
            path=self.location)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
