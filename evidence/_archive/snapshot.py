"""What every archive starts from, and how it appears: the source, the build directory and
the payloads (``export``, ``backup``, ``restore`` and ``compare`` share these).

    source     ``open_source``: a ``Store``, a store directory or a PostgreSQL connection
               string, read-only, as (database backend, artifact store) for the length of
               a ``with`` block that closes what it opened; an archive and a store newer
               than this program are refused. The backend's ``copy_snapshot`` then takes
               the one consistent snapshot an archive is made from.
    build      ``building``: a hidden, flock'ed sibling directory, renamed onto the target
               only when complete; ``stale_builds``: the ones a killed process left.
    artifacts  ``artifact_refs``: the payloads a snapshot's rows reference, in row order;
               ``copy_artifacts``: each copied and re-hashed as it is written, a missing or
               corrupt one reported as a ``Gap`` (the manifest's list of what is lacking);
               ``payload_states``: whether each is held (``compare``).

Every exporter holds one snapshot, by the store's own two means: ``export``, ``backup``
and ``compare`` copy it into a private file (``copy_snapshot``: the store's WAL can grow
only while pages are copied, never while a dump is formatted); the WARC and WACZ exports
read inside one read transaction (``Store.snapshot``; on PostgreSQL, REPEATABLE READ),
streaming payloads as they go.

Invariants: a target directory is never half-written: it holds nothing, or a finished and
fsynced build. A payload the source cannot read (a closed or unreachable object store, a
timeout, a 5xx, credentials, a file's permissions) is never a gap: a gap says what the
store lacks, and a failure to read says nothing about the evidence. It is tried again a
few times (``READ_TRIES``), then ``ArtifactReadError`` ends the command and its build. The
bytes of a dump are ``export``'s (``_archive/export.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

import apsw
import msgspec

from .._errors import (
    ArtifactCorruptError,
    ArtifactError,
    ArtifactMissingError,
    ArtifactReadError,
    CorruptStoreError,
    StoreError,
)
from .._model.refs import ArtifactRef
from .._store.backend import ArtifactBackend, StoreBackend
from .._store.db import Store
from .._store.fsync import fsync_dir

__all__ = ["CORRUPT", "HELD", "MANIFEST", "MISSING", "READ_TRIES", "Gap", "PayloadSource",
           "Progress", "Source", "artifact_refs", "building", "chunks_of", "copy_artifacts",
           "from_source", "open_source", "payload_states", "reading", "stale_builds"]

log = logging.getLogger("evidence.archive")

MANIFEST = "manifest.json"  # an archive's manifest: a directory holding one is no store
Progress = Callable[[str, int, int], None]  # (phase, done, total)
Source = Store | str | os.PathLike[str]


class Gap(msgspec.Struct, frozen=True, kw_only=True, order=True):
    """Something the archive knows it lacks or cannot vouch for."""

    kind: str  # run_not_completed, session_open, artifact_missing, artifact_corrupt, log
    subject: str
    detail: str


class PayloadSource(Protocol):
    """What a copy or a check reads payloads from: a store's artifact backend, or an
    archive's payloads (``_archive/segments.py``: its segment files, or one file each)."""

    local: bool  # reads are this machine's files: no network latency to overlap

    def open(self, ref: ArtifactRef, *, verify: bool = False) -> BinaryIO: ...

    def check(self, ref: ArtifactRef) -> None: ...

    def verify(self, ref: ArtifactRef) -> None: ...

    def location(self, ref: ArtifactRef) -> str: ...


# --- the source: a store, read-only, never an archive ------------------------------

def open_source(source: Source) -> contextlib.AbstractContextManager[
        tuple[StoreBackend, ArtifactBackend]]:
    """(database backend, artifact store) of a Store, a store directory or a PostgreSQL
    connection string, open for the ``with`` block and closed when it ends; an archive is
    refused (``Store.backends``: where every location becomes a store)."""
    return Store.backends(source)


# --- a build directory that appears only complete -------------------------------------

_BUILD_KINDS = ("exporting", "restoring", "backup")


def _build_name(target: Path) -> re.Pattern[str]:
    kinds = "|".join(_BUILD_KINDS)
    return re.compile(rf"\.{re.escape(target.name)}\.({kinds})-[0-9a-f]{{8}}")


def stale_builds(target: os.PathLike[str] | str) -> list[Path]:
    """Hidden build directories next to ``target`` left by a killed export, restore or
    backup: ones no live build holds its lock on."""
    target = Path(target)
    pattern = _build_name(target)
    try:
        entries = list(target.parent.iterdir())
    except OSError:
        return []
    return sorted(p for p in entries if pattern.fullmatch(p.name) and p.is_dir()
                  and not _held(p))


def _held(directory: Path) -> bool:
    """Whether a live build holds ``directory``'s lock (the kernel drops it at death)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def building(target: os.PathLike[str] | str, what: str) -> Iterator[Path]:
    """Build in a hidden sibling directory; rename it onto ``target`` only when complete.

    ``target`` must not exist or be an empty directory (rename replaces an empty one).
    On any error the partial build is removed and ``target`` is left as it was. The build
    directory is flock'ed while it is built, so one left by a killed process is known for
    what it is: the next build to the same target removes it (saying so).

    A URL (``s3://...``, any ``scheme://``) is refused: it would become a local folder
    named after its scheme (``_archive/remote.py`` writes to object storage).
    """
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", os.fspath(target)):
        raise StoreError(f"{os.fspath(target)}: a URL, not a local directory",
                         hint="export_to / backup_to (evidence._archive.remote) write to "
                         "s3://; here give a path on this machine", path=os.fspath(target))
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise StoreError(f"{target} is a file; refusing to replace it",
                         hint="choose a new or empty directory", path=str(target))
    if target.exists() and any(target.iterdir()):
        raise StoreError(f"{target} is not empty; refusing to write into it",
                         hint="choose a new or empty directory", path=str(target))
    for stale in stale_builds(target):
        log.warning("removing %s: a partial build left by a killed export, restore or "
                    "backup", stale, extra={"event": "archive.partial_removed"})
        shutil.rmtree(stale, ignore_errors=True)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".{target.name}.{what}-{secrets.token_hex(4)}"
        tmp.mkdir()
        lock = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise StoreError(f"cannot create {target}: {exc}", path=str(target)) from exc
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield tmp
        fsync_dir(tmp)
        try:
            os.rename(tmp, target)
        except OSError as exc:
            raise StoreError(f"cannot move the finished {what} into place at {target}: {exc}",
                             hint="was something written there meanwhile?",
                             path=str(target)) from exc
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(lock)


# --- the payloads a snapshot references ------------------------------------------------

READ_TRIES = 3  # tries of one payload's read before the command fails (a failure is no gap)
READ_BACKOFF = 0.25  # seconds before the second try, doubling

T = TypeVar("T")


class _ReadFailed(Exception):
    """The source failed while a payload was read, even inside the destination's ``put``:
    kept apart from the destination's own errors, which are never retried."""

    def __init__(self, cause: ArtifactError | OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def from_source(read: Callable[[], T]) -> T:
    try:
        return read()
    except (ArtifactError, OSError) as exc:
        raise _ReadFailed(exc) from exc


_CHUNK = 1 << 20


def chunks_of(handle: BinaryIO) -> Iterator[bytes]:
    """A source payload's bytes as a destination's ``put`` streams them."""
    while chunk := from_source(lambda: handle.read(_CHUNK)):
        yield chunk


def reading(src: PayloadSource, ref: ArtifactRef, work: Callable[[], T],
             stop: threading.Event) -> T | ArtifactMissingError | ArtifactCorruptError:
    """``work()``, whose reads of ``ref`` from ``src`` raise ``_ReadFailed``; the verdict
    on a payload the store lacks (``ArtifactMissingError``, ``ArtifactCorruptError``) is
    returned. Any other read failure is tried again, ``READ_TRIES`` times in all, then
    raised as ``ArtifactReadError``; the destination's errors pass through untouched."""
    delay, tried = READ_BACKOFF, 0
    while True:
        tried += 1
        try:
            return work()
        except _ReadFailed as failed:
            cause = failed.cause
        if isinstance(cause, ArtifactMissingError | ArtifactCorruptError):
            return cause
        if tried >= READ_TRIES or stop.is_set():
            break
        log.warning("reading payload %s/%s failed (%s); trying again in %.2f s",
                    ref.namespace, ref.digest, cause, delay,
                    extra={"event": "archive.read_retry"})
        if stop.wait(delay):
            break
        delay *= 2
    where = ref.namespace + "/" + ref.digest
    with contextlib.suppress(Exception):
        where = src.location(ref)
    hint = getattr(cause, "hint", None) or (
        "check what the read needs (the object store's server and credentials, the disk, "
        "the file's permissions), then run the command again")
    at = "" if where in str(cause) else f" at {where}"
    raise ArtifactReadError(
        f"cannot read payload {ref.namespace}/{ref.digest}{at} ({tried} tries): {cause}",
        hint=hint, namespace=ref.namespace, digest=ref.digest, location=where) from cause


def _in_order(refs: list[ArtifactRef], one: Callable[[ArtifactRef], T],
              stop: threading.Event, workers: int) -> Iterator[tuple[ArtifactRef, T]]:
    """``one(ref)`` of each ref on a few threads, results in ``refs`` order. The first
    error stops the rest: none still queued starts, and retries end."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(one, ref) for ref in refs]
        try:
            for ref, future in zip(refs, futures, strict=True):
                yield ref, future.result()
        finally:
            stop.set()  # after an error, or a consumer that stopped early
            for future in futures:
                future.cancel()


def copy_artifacts(refs: list[ArtifactRef], src: PayloadSource, dst: ArtifactBackend,
                   progress: Progress | None = None, *, workers: int = 8
                   ) -> tuple[int, list[Gap]]:
    """Copy each ref, re-hashed as it is written (``put``); (bytes copied, what the source
    lacks: a payload missing, or whose bytes do not match its digest, as a ``Gap``).

    A payload the source cannot read raises ``ArtifactReadError`` (after ``READ_TRIES``
    tries), and a failure of ``dst`` is raised as it is: neither says anything about the
    evidence. Each put of a file store fsyncs its file and directories, and a few threads
    overlap those waits (the artifact store is thread-safe); a pack store's puts are
    appends, all synced at the end. Results come back in ``refs`` order. The caller
    closes ``dst``.
    """
    stop = threading.Event()

    def put(ref: ArtifactRef) -> ArtifactRef:
        handle = from_source(lambda: src.open(ref))
        with handle:
            return dst.put(ref.namespace, chunks_of(handle))

    def one(ref: ArtifactRef) -> Gap | None:
        if stop.is_set():
            return None  # an earlier error ends the copy: never looked at
        subject = f"{ref.namespace}/{ref.digest}"
        got = reading(src, ref, lambda: put(ref), stop)
        if isinstance(got, ArtifactMissingError):
            return Gap(kind="artifact_missing", subject=subject, detail=str(got))
        if isinstance(got, ArtifactCorruptError):
            return Gap(kind="artifact_corrupt", subject=subject, detail=str(got))
        if got.digest == ref.digest:
            return None
        if got not in wanted:  # the bytes on disk are not the ones referenced: no stray copy
            with contextlib.suppress(ArtifactError):
                dst.remove(got)
        return Gap(kind="artifact_corrupt", subject=subject,
                   detail=f"the file hashes to {got.digest}")

    wanted, copied, gaps = set(refs), 0, []
    for i, (ref, gap) in enumerate(_in_order(refs, one, stop, workers), 1):
        if gap is None:
            copied += ref.size
        else:
            gaps.append(gap)
        if progress:
            progress("artifacts", i, len(refs))
    # Packs: the copies are durable once synced (one fsync per pack); files already are.
    done = {g.subject for g in gaps}
    dst.sync(r for r in refs if f"{r.namespace}/{r.digest}" not in done)
    if isinstance(dst.root, Path):  # a directory: its temp directory, if left empty
        with contextlib.suppress(OSError):
            (dst.root / ".tmp").rmdir()
    return copied, gaps


HELD, MISSING, CORRUPT = "held", "missing", "corrupt"


def payload_states(refs: list[ArtifactRef], src: PayloadSource | None, *, full: bool,
                   progress: Progress | None = None, workers: int = 8
                   ) -> dict[ArtifactRef, str]:
    """Whether ``src`` holds each payload: ``held`` (there with its size; ``full``: its
    bytes re-hashed to its digest), ``missing`` or ``corrupt``. ``src`` None: an archive
    with no ``artifacts/``, holding none. A payload that cannot be read raises
    ``ArtifactReadError`` (after ``READ_TRIES`` tries): it is neither held nor lacking."""
    if src is None:
        return dict.fromkeys(refs, MISSING)
    stop = threading.Event()
    check = src.verify if full else src.check

    def one(ref: ArtifactRef) -> str:
        if stop.is_set():
            return ""  # an earlier error ends the check: never looked at
        got = reading(src, ref, lambda: from_source(lambda: check(ref)), stop)
        if isinstance(got, ArtifactMissingError):
            return MISSING
        return CORRUPT if isinstance(got, ArtifactCorruptError) else HELD

    states = {}
    for i, (ref, state) in enumerate(_in_order(refs, one, stop, workers), 1):
        states[ref] = state
        if progress:
            progress("payloads", i, len(refs))
    return states


def artifact_refs(conn: apsw.Connection, condition: str = "1",
                  params: dict[str, object] | None = None) -> list[ArtifactRef]:
    rows = conn.execute(f"SELECT namespace, digest, size FROM artifact WHERE {condition} "
                        "ORDER BY artifact_id", params or {}).fetchall()
    try:
        return [ArtifactRef(ns, digest, size) for ns, digest, size in rows]
    except ArtifactError as exc:
        raise CorruptStoreError(f"an artifact row is not a valid reference: {exc}") from exc
