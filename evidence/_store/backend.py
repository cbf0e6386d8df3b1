"""The two seams every storage backend plugs into: the database, and the artifact store.

    StoreBackend     what the writer, the readers, verify and the archives need from a
                     transactional database: open and migrate, the one write connection,
                     read snapshots, error translation, and the few dialect differences
                     (``Dialect``: placeholders, a list parameter, how a write begins);
    ArtifactBackend  content-addressed payloads: put (durable when ``sync`` returns for
                     it), get, exists, iterate, and remove for reclaim.

The implementations: ``_store/sqlite.py`` (``SQLiteBackend``); ``_store/packs.py``
(``PackStore``: append-only pack segments, new stores), ``_store/artifacts.py``
(``ArtifactStore``, one file per payload: stores made before packs) and ``_store/s3.py``
(``S3ArtifactStore``, one object per payload in an S3-compatible object store). The
guarantees they must keep are written once, as contract tests parametrized over the
implementations (``tests/contract/``): another backend is one more parameter there. This
module defines protocols only and imports none of the implementations: each imports it,
and ``_store/db.py``, where a location becomes a store, has the type checker confirm that
each is what its seam says (``_check_protocols``).

What a later backend has to provide, and where the protocol already leaves room:

- PostgreSQL (issue 16): ``Connection`` is the small part of a DB-API connection the write
  path uses (a psycopg wrapper gives ``changes`` from ``cursor.rowcount``); ``Dialect``
  spells ``%s`` placeholders, ``= ANY(%s)`` for a list, and a write that begins by taking
  the store's advisory lock; ``copy_snapshot`` writes one snapshot into a private SQLite
  file, which the canonical dump reads exactly as it reads a SQLite store's copy, so both
  export the same bytes.
- Artifact packs: ``put`` returns before its bytes are synced, and ``sync(refs)`` makes
  every listed payload durable before it returns; the writer calls it with every payload
  a batch references, before that batch's COMMIT, so "durable before referenced" holds
  as it does for the file store's put (durable already: its ``sync`` has nothing to do).
  A ``sync`` whose fsync failed raises ``ArtifactError`` with ``sync_failed=True``: the
  writer then stops and marks the store, as after a failed fsync of the database. A
  sealed pack never changes, and is read by range: what an object store holds.
- S3-compatible objects (``_store/s3.py``): every method is synchronous and thread-safe; the
  crawler already puts from worker threads (``anyio.to_thread``), and the writer checks
  references on its commit thread, so a blocking HTTP client fits without an event loop
  in the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import msgspec

from .._errors import ArtifactError
from .._model.refs import ArtifactRef

__all__ = ["ArtifactBackend", "Connection", "Dialect", "Removal", "StoreBackend"]

Progress = Callable[[str, int, int], None]  # (phase, done, total)


class Cursor(Protocol):
    """A statement's rows; iterable, like apsw's and DB-API cursors."""

    def __iter__(self) -> Iterator[Any]: ...

    def __next__(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """The part of a database connection the write path, the readers and verify use.

    ``apsw.Connection`` has it as it is. ``changes`` is the row count of the last statement,
    ``total_changes`` the running count (the writer's optimistic path compares two),
    ``last_insert_rowid`` the key the last INSERT gave.
    """

    def execute(self, statement: str, binding: Any = ...) -> Any: ...

    def executemany(self, statement: str, sequenceofbindings: Any) -> Any: ...

    def cursor(self) -> Any: ...

    def changes(self) -> int: ...

    def total_changes(self) -> int: ...

    def last_insert_rowid(self) -> int: ...

    def get_autocommit(self) -> bool: ...

    def close(self) -> None: ...


def _json_array(values: list[Any]) -> object:
    return msgspec.json.encode(values)


@dataclass(frozen=True)
class Dialect:
    """The SQL that differs between database engines, and nothing else.

    Everything else the store runs (``INSERT ... ON CONFLICT (<target>) DO NOTHING``, the
    sequence-guarded ``DO UPDATE ... WHERE``, ``RETURNING``, savepoints, the append-only
    triggers' ``RAISE``-style refusals) is standard enough to be shared.
    """

    name: str
    begin_write: str  # takes the store's write lock, so a writer learns it first
    begin_read: str  # starts one read snapshot
    param: str = "?"
    list_member: str = "{column} IN (SELECT value FROM json_each({param}))"
    encode_list: Callable[[list[Any]], object] = _json_array  # how that parameter is bound
    # The two inserts whose new key the writer reads back (``last_insert_rowid``) end in
    # ``RETURNING <key>`` (SQLite's changes() and last_insert_rowid() are two C calls; a
    # server has no last rowid to ask for).
    returning: bool = False

    def values(self, width: int) -> str:
        """``(?, ?, ...)``: one row's placeholders."""
        return "(" + ", ".join([self.param] * width) + ")"

    def in_list(self, column: str) -> str:
        """``column`` is one of the values of one parameter (bound with ``encode_list``)."""
        return self.list_member.format(column=column, param=self.param)


class StoreBackend(Protocol):
    """A transactional database holding a store's tables (docs/design.md, "Seams").

    The guarantees (tests/contract/test_store_backend.py): evidence tables are append-only,
    enforced by the database itself; ``url_current`` moves forward only; a redelivered
    message is a duplicate or a conflict, never a second row; a write that reports an
    error at COMMIT may still have committed (the writer then reads the commit log).
    """

    dialect: Dialect
    location: str  # what error messages and reports name: a path, a connection string
    # The database engine runs in this process: a transaction is CPU work and local file
    # I/O, never a wait on a server (the writer then commits on its event loop's thread).
    local: bool
    Error: type[Exception]  # the driver's error root (translated at ``errors``)
    BusyError: type[Exception]  # the write lock is held elsewhere: retry, boundedly
    ConstraintError: type[Exception]  # a row the schema refuses: the message fails alone

    def connect_writer(self, *, create: bool = False) -> Connection:
        """The one write connection, with the backend's whole policy applied."""
        ...

    def try_begin_write(self, conn: Connection) -> bool:
        """``begin_write`` if the write lock is free now (True); else False, with nothing
        begun and no wait (a writer committing on its event loop's thread must not stall
        the loop on another process's lock: it waits on a thread instead)."""
        ...

    def migrate(self, conn: Connection) -> int:
        """Apply the migrations this program knows that the store lacks; the version."""
        ...

    def reader(self) -> AbstractContextManager[Connection]:
        """A read-only connection, closed on exit (never writes the store)."""
        ...

    def snapshot(self) -> AbstractContextManager[Connection]:
        """``reader`` inside one read transaction, errors translated: one consistent view."""
        ...

    def errors(self) -> AbstractContextManager[None]:
        """The one boundary where driver errors become ``StoreError`` and its kin."""
        ...

    def is_sync_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` may be a failed fsync, after which reads are no evidence."""
        ...

    def describe(self, exc: BaseException) -> str:
        """A driver error in words, with its code's name."""
        ...

    def after_commit(self, conn: Connection, *, wal_limit_bytes: int,
                     counted: Callable[[str], None]) -> None:
        """Upkeep after each COMMIT, on the write connection; errors are raised, never
        dropped (SQLite: the WAL checkpoint; a server database may do nothing)."""
        ...

    def copy_snapshot(self, dest: Path, *, progress: Progress | None = None) -> int:
        """Write one consistent snapshot into the new SQLite file ``dest`` (the archives
        read it); return its size in pages. Never blocks the writer."""
        ...


class Removal(Protocol):
    """Payloads that reclaim removes together, prepared before it takes the write lock:
    ``commit`` (under the lock, after its re-check) removes them and says how many bytes it
    freed; ``abort`` leaves everything as it was. A pack's removal rewrites the pack
    without them first (``_store/packreclaim.py``); a file's has nothing to prepare."""

    refs: list[ArtifactRef]

    def commit(self) -> int: ...

    def abort(self) -> None: ...


class ArtifactBackend(Protocol):
    """Content-addressed payloads (docs/design.md, "Seams"; tests/contract/).

    Guarantees: a payload is durable once ``sync`` returned for its ref (never later than
    the COMMIT that first references it); ``put`` of the same bytes twice gives the same
    ref and one stored copy; ``read`` returns exactly the bytes put, or raises
    ``ArtifactMissingError`` / ``ArtifactCorruptError``; ``iter_refs`` lists every payload
    once, sorted; ``remove`` deletes one that no row references (reclaim's job).
    """

    read_only: bool
    max_payload: int
    local: bool  # put, check and sync are this process's CPU and local files: no network

    def put(self, namespace: str, data: bytes | Iterable[bytes] | BinaryIO) -> ArtifactRef:
        ...

    def sync(self, refs: Iterable[ArtifactRef]) -> None:
        """Make every listed payload durable (a put whose bytes may still be in flight)."""
        ...

    def batch(self) -> AbstractContextManager[None]:
        """A block whose puts (of this thread) may be written together when it ends:
        their refs are handed on (synced, referenced, sent to another process) only after
        it ended without an error. Where each put is written by itself, a block that only
        runs its body."""
        ...

    def check(self, ref: ArtifactRef) -> None:
        """Raise ``ArtifactMissingError`` or ``ArtifactCorruptError`` (size) if not there."""
        ...

    def check_each(self, refs: Sequence[ArtifactRef]) -> list[ArtifactError | None]:
        """``check`` of each ref, in order: None where it is there, else the
        ``ArtifactMissingError`` or ``ArtifactCorruptError`` that ``check`` raises; any
        other failure (the store cannot be read) raises. For a batch's new payloads, at
        once (a pack store looks at each pack file once, not once per payload)."""
        ...

    def exists(self, ref: ArtifactRef) -> bool: ...

    def open(self, ref: ArtifactRef, *, verify: bool = False) -> BinaryIO: ...

    def read(self, ref: ArtifactRef, *, verify: bool = False) -> bytes: ...

    def verify(self, ref: ArtifactRef) -> None:
        """Re-hash the stored bytes; raise ``ArtifactCorruptError`` if they differ."""
        ...

    def iter_refs(self) -> Iterator[ArtifactRef]: ...

    def age(self, ref: ArtifactRef) -> float | None:
        """Seconds since the payload was last put (reclaim's grace period); None if gone."""
        ...

    def remove(self, ref: ArtifactRef) -> int | None:
        """Delete one payload; the bytes freed (None if it was gone already)."""
        ...

    def plan_removal(self, refs: Iterable[ArtifactRef]) -> list[Removal]:
        """Removals of ``refs`` prepared now (a pack rewritten without them); reclaim
        commits each under the write lock after its re-check, or aborts it."""
        ...

    @property
    def root(self) -> Path | str:
        """Where the payloads are: a directory, or (an object store) its ``s3://`` URL:
        what a worker process is told to open."""
        ...

    def close(self) -> None:
        """Release what the store holds (packs: seal this process's pack)."""
        ...

    def location(self, ref: ArtifactRef) -> str:
        """Where the payload is, for findings and errors: a path, an object URL."""
        ...

    def is_writable(self, ref: ArtifactRef) -> bool:
        """Whether the stored payload could be changed in place (the store keeps every
        payload read-only; verify reports one that is not)."""
        ...

    def writable_each(self, refs: Sequence[ArtifactRef]) -> list[bool]:
        """``is_writable`` of each, each file looked at once (packs: one stat per pack)."""
        ...
