"""What every archive starts from, and how it appears: the source, the build directory and
the payloads (``export``, ``backup``, ``restore`` and ``compare`` share these).

    source     ``open_source``: a ``Store``, a store directory or a PostgreSQL connection
               string, read-only, as (database backend, artifact store); an archive and a
               store newer than this program are refused. The backend's ``copy_snapshot``
               then takes the one consistent snapshot an archive is made from.
    build      ``building``: a hidden, flock'ed sibling directory, renamed onto the target
               only when complete; ``stale_builds``: the ones a killed process left.
    artifacts  ``artifact_refs``: the payloads a snapshot's rows reference, in row order;
               ``copy_artifacts``: each copied and re-hashed as it is written, a missing or
               corrupt one reported as a ``Gap`` (the manifest's list of what is lacking).

Invariant: a target directory is never half-written: it holds nothing, or a finished and
fsynced build. The bytes of a dump are ``export``'s (``_archive/export.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import apsw
import msgspec

from .._errors import (
    ArtifactError,
    ArtifactMissingError,
    CorruptStoreError,
    MigrationError,
    StoreError,
)
from .._model.refs import ArtifactRef
from .._store import artifactspec
from .._store.backend import ArtifactBackend, StoreBackend
from .._store.db import ARTIFACTS_DIR, DB_NAME, Store
from .._store.fsync import fsync_dir
from .._store.location import is_postgres_location
from .._store.sqlite import SQLiteBackend, load_migrations

__all__ = ["MANIFEST", "Gap", "Progress", "Source", "artifact_refs", "building",
           "copy_artifacts", "open_source", "stale_builds"]

log = logging.getLogger("evidence.archive")

MANIFEST = "manifest.json"  # an archive's manifest: a directory holding one is no store
Progress = Callable[[str, int, int], None]  # (phase, done, total)
Source = Store | str | os.PathLike[str]


class Gap(msgspec.Struct, frozen=True, kw_only=True, order=True):
    """Something the archive knows it lacks or cannot vouch for."""

    kind: str  # run_not_completed, session_open, artifact_missing, artifact_corrupt, log
    subject: str
    detail: str


# --- the source: a store, read-only, never an archive ------------------------------

def open_source(source: Source) -> tuple[StoreBackend, ArtifactBackend]:
    """(database backend, artifact store) of a Store or a store directory."""
    if isinstance(source, Store):
        return source.backend, source.artifacts
    if is_postgres_location(source):  # the version is checked at open
        with Store.open(source, read_only=True) as store:
            return store.backend, store.artifacts
    root = Path(source)
    if not (root / DB_NAME).is_file():
        if (root / MANIFEST).is_file():
            raise StoreError(f"{root} is an archive, not a store", path=str(root),
                             hint=f"restore it first: evidence restore {root} --store NEW")
        raise StoreError(f"{root}: no evidence store here ({DB_NAME} not found)",
                         hint="pass a store directory (or a backup of one)", path=str(root))
    backend = SQLiteBackend(root / DB_NAME)
    _check_schema_version(backend)
    with backend.snapshot() as conn:
        spec = artifactspec.recorded(conn)
    return backend, artifactspec.open_artifacts(spec, local=root / ARTIFACTS_DIR,
                                                create=False, read_only=True)


def _check_schema_version(backend: StoreBackend) -> None:
    """Refuse a store written by a newer program, as opening it for status or verify does:
    its dump could not be restored by this one, and its rows may mean other things."""
    newest = len(load_migrations())
    with backend.snapshot() as conn:  # read-only: works on read-only media
        version = conn.execute("PRAGMA user_version").fetchall()[0][0]
    if version > newest:
        raise MigrationError(f"the store has schema version {version}, newer than this "
                             f"program supports ({newest})", schema_version=version,
                             hint="upgrade evidence to export this store")


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
    """
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

def copy_artifacts(refs: list[ArtifactRef], src: ArtifactBackend, dst: ArtifactBackend,
                   progress: Progress | None = None, *, workers: int = 8
                   ) -> tuple[int, list[Gap]]:
    """Copy each ref, re-hashed as it is written (``put``); (bytes copied, what failed).

    Each put of a file store fsyncs its file and directories, and a few threads overlap
    those waits (the artifact store is thread-safe); a pack store's puts are appends, all
    synced at the end. Results come back in ``refs`` order. The caller closes ``dst``.
    """
    def one(ref: ArtifactRef) -> Gap | None:
        subject = f"{ref.namespace}/{ref.digest}"
        try:
            with src.open(ref) as handle:
                got = dst.put(ref.namespace, handle)
        except ArtifactMissingError as exc:
            return Gap(kind="artifact_missing", subject=subject, detail=str(exc))
        except ArtifactError as exc:
            return Gap(kind="artifact_corrupt", subject=subject, detail=str(exc))
        if got.digest == ref.digest:
            return None
        if got not in wanted:  # the bytes on disk are not the ones referenced: no stray copy
            with contextlib.suppress(ArtifactError):
                dst.remove(got)
        return Gap(kind="artifact_corrupt", subject=subject,
                   detail=f"the file hashes to {got.digest}")

    wanted, copied, gaps = set(refs), 0, []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for i, (ref, gap) in enumerate(zip(refs, pool.map(one, refs), strict=True), 1):
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


def artifact_refs(conn: apsw.Connection, condition: str = "1",
                  params: dict[str, object] | None = None) -> list[ArtifactRef]:
    rows = conn.execute(f"SELECT namespace, digest, size FROM artifact WHERE {condition} "
                        "ORDER BY artifact_id", params or {}).fetchall()
    try:
        return [ArtifactRef(ns, digest, size) for ns, digest, size in rows]
    except ArtifactError as exc:
        raise CorruptStoreError(f"an artifact row is not a valid reference: {exc}") from exc
