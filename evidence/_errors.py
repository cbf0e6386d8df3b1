"""The error tree. Every error the package raises on purpose is an ``EvidenceError``.

    EvidenceError
    ├── StoreError                  opening, configuring or migrating a store
    │   ├── SQLiteVersionError      the linked SQLite has the WAL-reset bug
    │   ├── MigrationError          an applied migration was edited, or the store is newer
    │   ├── CorruptStoreError       the database or its directory is not a usable store
    │   └── SyncError               an fsync of the store failed: what reads show may not be
    │                               on the disk, so nothing is acknowledged until it is
    ├── ArtifactError               the content-addressed payload store
    │   ├── NamespaceError          a namespace that is not [a-z0-9_-]{1,32}
    │   ├── PayloadTooLargeError    a payload over the configured size limit
    │   ├── ArtifactMissingError    a referenced payload is not on disk
    │   ├── ArtifactCorruptError    a payload whose bytes no longer match its digest
    │   └── ArtifactReadError       a payload that could not be read (a server, a disk,
    │                               permissions): no verdict on it, so never a gap
    ├── BrowserError                headless Chromium (rendering): missing, crashed, hung
    ├── MessageError                a message that cannot be decoded or is not valid
    ├── NotFoundError               the store has no record of the attempt, URL or run asked for
    ├── ProofError                  a key, checkpoint or proof that cannot be read or made
    ├── RulesError                  a rules file or rule definition that cannot be used
    ├── URLError                    a URL the normalizer cannot turn into a fetch key
    └── WriterError                 the serialized writer
        ├── WriterClosedError       submit after close, or the writer failed
        ├── CommitError             a batch did not commit; its messages were not acked
        └── ServiceError            the writer service refused the connection or is unreachable

Each error carries what it concerns (a path, a message id, a digest, an SQLite code) as
attributes, and a ``hint``: one sentence saying what to try. ``str(error)`` is the message;
``error.hint`` is printed by the CLI as ``Try: <hint>``.

Lower-layer errors (apsw, OSError) are translated at one boundary each, by small context
managers (``_store/sqlite.map_sqlite_errors``, ``_store/artifactbase._os_errors`` for files).
"""

from __future__ import annotations

__all__ = [
    "ArtifactCorruptError",
    "ArtifactError",
    "ArtifactMissingError",
    "ArtifactReadError",
    "BrowserError",
    "CommitError",
    "CorruptStoreError",
    "EvidenceError",
    "MessageError",
    "MigrationError",
    "NamespaceError",
    "NotFoundError",
    "PayloadTooLargeError",
    "ProofError",
    "RulesError",
    "SQLiteVersionError",
    "ServiceError",
    "StoreError",
    "SyncError",
    "URLError",
    "WriterClosedError",
    "WriterError",
]


def only_evidence_error(exc: BaseException) -> EvidenceError | None:
    """``exc`` if it is an EvidenceError; the first one of a group holding nothing else
    (task groups wrap a task's error); else None."""
    while isinstance(exc, BaseExceptionGroup):
        matched, rest = exc.split(EvidenceError)
        if matched is None or rest is not None:
            return None
        exc = matched.exceptions[0]
    return exc if isinstance(exc, EvidenceError) else None


class EvidenceError(Exception):
    """Root of every error this package raises on purpose."""

    hint: str | None = None

    def __init__(self, message: str, *, hint: str | None = None, **context: object) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint
        # What the error concerns (path, message_id, digest, sqlite_code, ...), as attributes.
        self.context = context
        for key, value in context.items():
            setattr(self, key, value)


class StoreError(EvidenceError):
    """Opening, configuring or migrating a store failed."""


class DatabaseUnreachable(StoreError):
    """No connection to the store's database server could be made."""


class OutageTooLong(DatabaseUnreachable):
    """The database server stayed out of reach longer than the outage deadline: a command
    gives up (a crawl stops, its session open, to be resumed)."""


class WriterLockLost(StoreError):
    """The writer's connection to its PostgreSQL store was lost, and with it its lock, which
    another writer (a standby) holds now: this writer must not write again, and stops."""


class SQLiteVersionError(StoreError):
    """The linked SQLite library is older than the WAL-reset fix."""


class MigrationError(StoreError):
    """A schema migration cannot be applied, or was edited after it was applied."""


class CorruptStoreError(StoreError):
    """The store's directory or database is damaged or not a store at all."""


class SyncError(StoreError):
    """An fsync of the store failed, or making the store durable again after one failed.

    After a failed fsync Linux marks the unwritten pages clean: reads still show them, a
    retried fsync succeeds without writing them, and a power cut loses them. So the writer
    stops rather than acknowledge anything from what reads show, the store is marked
    (``sync-failed``), and the next open for writing rewrites the database and its WAL
    and fsyncs them before anything is acknowledged again (docs/design.md, "The writer").
    """


class ArtifactError(EvidenceError):
    """The content-addressed artifact store refused or failed an operation."""


class NamespaceError(ArtifactError):
    """An artifact namespace is not a valid name."""


class PayloadTooLargeError(ArtifactError):
    """A payload exceeds the configured size limit."""


class ArtifactMissingError(ArtifactError):
    """A referenced artifact is not present in the artifact store."""


class ArtifactCorruptError(ArtifactError):
    """A stored artifact's bytes do not hash to its digest."""


class ArtifactReadError(ArtifactError):
    """A payload could not be read, after a few tries: the object store was unreachable,
    timed out, answered 5xx or refused the credentials, or a file could not be opened.

    Unlike ``ArtifactMissingError`` and ``ArtifactCorruptError`` it says nothing about the
    evidence, so it is never recorded as a gap: ``export``, ``backup`` and ``restore``
    stop and leave nothing at their target, and ``compare`` gives no verdict.
    """


class BrowserError(EvidenceError):
    """Headless Chromium could not be found or started, crashed, or stopped answering.

    ``gone`` is True when the browser process is no longer usable (it must be restarted).
    """

    gone: bool = False


class MessageError(EvidenceError):
    """A message could not be decoded, or is not valid for the store."""


class NotFoundError(EvidenceError):
    """The store has no record of the attempt, URL or run asked for."""


class ProofError(EvidenceError):
    """A key, checkpoint or proof that cannot be read, or a proof the store cannot make."""


class RulesError(EvidenceError):
    """A rules file or rule definition that cannot be used; ``rule`` and ``field`` say where.

    Also raised when a rule id and version were recorded with a different definition, and
    when bytes handed to ``evaluate_page`` do not match their refs.
    """

    path: str | None = None
    rule: str | None = None
    field: str | None = None


class URLError(EvidenceError):
    """A URL cannot be normalized into a fetch key."""


class WriterError(EvidenceError):
    """The serialized writer could not accept or commit a message."""


class WriterClosedError(WriterError):
    """The writer is closed, or stopped after a failure it could not recover from."""


class CommitError(WriterError):
    """A batch did not commit. None of its messages were acknowledged; redeliver them."""


class ServiceError(WriterError):
    """The writer service refused the connection, or could not be reached in time.

    Carries ``code`` (the service's error code, when it sent one) and a ``hint``.
    """
