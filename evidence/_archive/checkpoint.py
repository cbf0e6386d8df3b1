"""Checkpoints in object storage: a store that outlives the machine it is written on.

A crawl on a machine whose disk is thrown away (a spot instance, a CI job) checkpoints its
store to ``s3://BUCKET/PREFIX`` (``crawl --checkpoint``, ``backup --out s3://``); a new
machine restores the newest complete checkpoint and resumes the session. Under the prefix::

    <prefix>/checkpoints/<id>/payloads[.NNNNN]      the payloads no earlier checkpoint
                                                    holds, one after another
    <prefix>/checkpoints/<id>/payloads.json         where each is: namespace, digest,
                                                    size, offset
    <prefix>/checkpoints/<id>/evidence.db[.NNNNN]   one consistent snapshot of the database
    <prefix>/checkpoints/<id>/CHECKPOINT.json       written last: the checkpoint's manifest

A checkpoint (``Checkpointer.take``) copies the database with SQLite's backup API inside one
read transaction (``copy_snapshot``: the writer is never blocked), then packs the payloads
its rows reference that the prefix does not hold yet, each read back from the store and
re-hashed, into one object (the first checkpoint of a process reads the payload indexes of
the complete checkpoints there; later ones take only rows newer than the last), then
uploads the database, then the manifest. Payloads are content-addressed and shared: each is
uploaded once across checkpoints, and a checkpoint costs a handful of requests however many
pages it covers (one object per payload cost a request each, and on this 2-core VM with
SeaweedFS beside the crawl it slowed a 1,000-page crawl 2.5 times). Every object is a
conditional create with its checksums (``remote.Remote``), so a checkpoint is immutable,
and one without its manifest (a process killed mid-upload) is not a checkpoint: readers
skip it, and its pack is never used. The payloads go up before the database that references
them, as a store's are durable before its rows (docs/design.md).

``restore_checkpoint`` builds a store directory from one (the newest complete, or a named
one): the database is checked against the manifest's SHA-256, ``integrity_check`` and the
Merkle tree (its size and root must be the manifest's); every referenced payload is found in
the packs of that checkpoint and the ones before it, and re-hashed into the new store's
packs. Anything wrong and nothing appears at the target. The store then resumes as after a
crash: claims in flight at the snapshot are requeued; what was committed after the
checkpoint is lost with the machine and fetched again (the loss window).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import secrets
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import anyio
import apsw
import msgspec

from .._errors import (
    ArtifactError,
    ArtifactMissingError,
    CorruptStoreError,
    EvidenceError,
    MigrationError,
    StoreError,
)
from .._model.refs import ArtifactRef
from .._store.backend import ArtifactBackend
from .._store.db import ARTIFACTS_DIR, DB_NAME, Store
from .._store.fsync import fsync_file
from .._store.location import is_server_database
from .._store.log import check_log
from .._store.packs import open_artifact_store
from .._store.sqlite import load_migrations, map_sqlite_errors
from .snapshot import Gap, Progress, Source, artifact_refs, building
from .transfer import INDEX, Remote, RemoteFile, no_archive

__all__ = ["CHECKPOINT", "Checkpoint", "Checkpointer", "RestoredCheckpoint", "backup_to_s3",
           "check_destination", "checkpoints", "latest", "read_checkpoint",
           "restore_checkpoint"]

log = logging.getLogger("evidence.checkpoint")

CHECKPOINT = "CHECKPOINT.json"
FORMAT_VERSION = 1
_DIR = "checkpoints/"
_PACK = "payloads"
_PACK_INDEX = "payloads.json"
PackEntry = tuple[str, str, int, int]  # namespace, digest, size, offset in the pack


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """``CHECKPOINT.json``: one complete checkpoint."""

    format_version: int
    checkpoint_id: str
    store_id: str
    created_at: str
    schema_version: int
    tree_size: int
    root: str
    open_sessions: list[str]
    frontier: dict[str, int]  # the open sessions' URLs by state: what a resume starts from
    artifacts: int  # payloads the snapshot references
    artifact_bytes: int
    uploaded: int  # of those, sent by this checkpoint (the others were there)
    uploaded_bytes: int
    database: RemoteFile
    payloads: RemoteFile | None  # this checkpoint's new payloads, one after another
    payload_index: RemoteFile | None  # JSON: [[namespace, digest, size, offset], ...]
    findings: list[str]  # empty unless verified and something did not check
    gaps: list[Gap]  # payloads the store could not give (missing or corrupt there)


def _pack(refs: list[ArtifactRef], artifacts: ArtifactBackend, tmp: Path,
          progress: Progress | None) -> tuple[Path, list[PackEntry], int, list[Gap]]:
    """The payloads ``refs`` name, each read and re-hashed from the store, one after
    another in the file ``tmp/payloads``: (the file, where each is, bytes, what failed)."""
    path, index, offset, gaps = tmp / _PACK, [], 0, []
    with open(path, "wb") as pack:
        for i, ref in enumerate(refs, 1):
            subject = f"{ref.namespace}/{ref.digest}"
            try:
                body = artifacts.read(ref, verify=True)
            except ArtifactMissingError as exc:
                gaps.append(Gap(kind="artifact_missing", subject=subject, detail=str(exc)))
                continue
            except ArtifactError as exc:
                gaps.append(Gap(kind="artifact_corrupt", subject=subject, detail=str(exc)))
                continue
            pack.write(body)
            index.append((ref.namespace, ref.digest, len(body), offset))
            offset += len(body)
            if progress:
                progress("payloads", i, len(refs))
    return path, index, offset, gaps


def _payload_places(remote: Remote, upto: str | None
                    ) -> dict[tuple[str, str], tuple[Checkpoint, int, int]]:
    """Where each payload of the prefix is: (namespace, digest) -> (the checkpoint whose
    pack holds it, offset, size), from every complete checkpoint up to ``upto``."""
    places: dict[tuple[str, str], tuple[Checkpoint, int, int]] = {}
    for checkpoint_id in checkpoints(remote):
        if upto is not None and checkpoint_id > upto:
            break
        found = read_checkpoint(remote, checkpoint_id)
        if found is None or found.payload_index is None:
            continue  # unfinished (its pack is not trusted), or nothing new in it
        body = remote.get_verified(found.payload_index, f"checkpoint {checkpoint_id}'s "
                                   "payload index")
        try:
            entries = msgspec.json.decode(body, type=list[PackEntry])
        except msgspec.DecodeError as exc:
            raise CorruptStoreError(f"{remote.url}: checkpoint {checkpoint_id}'s payload "
                                    f"index is unreadable ({exc})", hint="restore another "
                                    "checkpoint (--checkpoint ID)") from exc
        for namespace, digest, size, offset in entries:
            places.setdefault((namespace, digest), (found, offset, size))
    return places


def checkpoints(remote: Remote) -> list[str]:
    """The ids of the prefix's checkpoints, complete or not, oldest first."""
    start = remote.key(_DIR)
    return sorted(item[len(start):].rstrip("/") for item in
                  remote.client.list(start, delimiter="/") if isinstance(item, str))


def read_checkpoint(remote: Remote, checkpoint_id: str) -> Checkpoint | None:
    body = remote.get_bytes(f"{_DIR}{checkpoint_id}/{CHECKPOINT}")
    if body is None:
        return None
    try:
        found = msgspec.json.decode(body, type=Checkpoint)
    except msgspec.DecodeError as exc:
        raise CorruptStoreError(f"{remote.url}: checkpoint {checkpoint_id}'s {CHECKPOINT} is "
                                f"unreadable ({exc})", hint="restore another checkpoint "
                                "(--checkpoint ID)") from exc
    if found.format_version != FORMAT_VERSION:
        raise StoreError(f"{remote.url}: checkpoint format {found.format_version}, this "
                         f"program reads format {FORMAT_VERSION}", hint="use a matching evidence")
    return found


def latest(remote: Remote) -> Checkpoint | None:
    """The newest complete checkpoint (one with its manifest), or None."""
    for checkpoint_id in reversed(checkpoints(remote)):
        found = read_checkpoint(remote, checkpoint_id)
        if found is not None:
            return found
    return None


def _new_id() -> str:
    """Sortable by time (the newest is the last listed), unique across machines."""
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y%m%dT%H%M%S.%fZ") + "-" + secrets.token_hex(3)


class Checkpointer:
    """Checkpoints of one store to one prefix. ``take`` is thread-safe (one at a time).

    Opening checks the prefix: it must hold nothing, or checkpoints of this same store
    (never an export, never another store's checkpoints).
    """

    def __init__(self, store: Store, url: str, *,
                 environ: Mapping[str, str] | None = None) -> None:
        self.store = store
        # Read here, once: ``take`` runs on other threads, and the store's own connection
        # belongs to the thread that opened it (the writer's, during a crawl).
        self.store_id = store.store_id
        self.location = store.location
        self.remote = Remote(url, environ=environ)
        self.url = self.remote.url
        self._lock = threading.Lock()
        self._through: int | None = None  # artifact rows up to this id are in the prefix
        self._gaps: list[Gap] = []
        self.taken: list[Checkpoint] = []
        self.failures = 0
        try:
            self._check_prefix()
        except BaseException:
            self.remote.close()
            raise

    def _check_prefix(self) -> None:
        if not self.remote.location.prefix:
            raise StoreError(f"{self.url}: give a prefix for the checkpoints, not a whole "
                             "bucket", hint=f"e.g. {self.url.split('?')[0]}/crawls/NAME")
        if self.remote.get_bytes(INDEX) is not None:
            raise StoreError(f"{self.url} holds an export, not checkpoints",
                             hint="choose another prefix for the checkpoints")
        found = latest(self.remote)
        if found is not None and found.store_id != self.store_id:
            raise StoreError(f"{self.url} holds checkpoints of store {found.store_id}, not of "
                             f"this store ({self.store_id})",
                             hint="choose another prefix (one per store)")

    def close(self) -> None:
        self.remote.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def take(self, *, verify: bool = False, progress: Progress | None = None) -> Checkpoint:
        """One checkpoint, complete when this returns; raises (and leaves no manifest) on
        any failure. ``verify``: also run integrity_check and check_log on the snapshot,
        recording what they find (``backup --out s3://``)."""
        with self._lock, tempfile.TemporaryDirectory(prefix="evidence-checkpoint-") as tmp:
            checkpoint_id = _new_id()
            db = Path(tmp) / DB_NAME
            backend, artifacts = self.store.backend, self.store.artifacts
            backend.copy_snapshot(db, progress=progress)
            with map_sqlite_errors(db), contextlib.closing(apsw.Connection(str(db))) as conn:
                findings = _checks(conn) if verify else []
                size, root = _head(conn)
                newer = artifact_refs(conn, "artifact_id > :m", {"m": self._through or 0})
                through, count, total = conn.execute(
                    "SELECT coalesce(max(artifact_id), 0), count(*), coalesce(sum(size), 0) "
                    "FROM artifact").fetchall()[0]
                opened = [s for (s,) in conn.execute(
                    "SELECT session_id FROM crawl_session WHERE outcome IS NULL ORDER BY 1")]
                frontier = dict(conn.execute(
                    "SELECT state, count(*) FROM frontier WHERE session_id IN (SELECT "
                    "session_id FROM crawl_session WHERE outcome IS NULL) GROUP BY 1"))
                version = conn.execute("PRAGMA user_version").fetchall()[0][0]
                conn.execute("PRAGMA journal_mode = WAL").fetchall()  # as the store's own
            if self._through is None:  # this process's first: what the prefix holds
                held = set(_payload_places(self.remote, None))
                newer = [r for r in newer if (r.namespace, r.digest) not in held]
            pack, index, sent, gaps = _pack(newer, artifacts, Path(tmp), progress)
            payloads = payload_index = None
            if index:
                payloads = self.remote.put_file(f"{_DIR}{checkpoint_id}/{_PACK}", pack)
                payload_index = self.remote.put_bytes_entry(
                    f"{_DIR}{checkpoint_id}/{_PACK_INDEX}", msgspec.json.encode(index))
            database = self.remote.put_file(f"{_DIR}{checkpoint_id}/{DB_NAME}", db)
            self._gaps = sorted(set(self._gaps) | set(gaps))
            checkpoint = Checkpoint(
                format_version=FORMAT_VERSION, checkpoint_id=checkpoint_id,
                store_id=self.store_id, created_at=dt.datetime.now(dt.UTC).isoformat(),
                schema_version=version, tree_size=size, root=root.hex(),
                open_sessions=opened, frontier=frontier, artifacts=count, artifact_bytes=total,
                uploaded=len(index), uploaded_bytes=sent, database=database,
                payloads=payloads, payload_index=payload_index,
                findings=findings + [f"{g.kind}: {g.subject}: {g.detail}" for g in gaps],
                gaps=self._gaps)
            self.remote.put_bytes(f"{_DIR}{checkpoint_id}/{CHECKPOINT}",
                                  msgspec.json.format(msgspec.json.encode(checkpoint),
                                                      indent=2) + b"\n")
            self._through = through
            self.taken.append(checkpoint)
            return checkpoint

    def final(self) -> Checkpoint:
        """The checkpoint at the end of a run: the one whose failure is the run's, said with
        what is where (everything is committed locally; the newest checkpoint is older)."""
        try:
            return self.take()
        except (EvidenceError, OSError) as exc:
            raise StoreError(
                f"the run's final checkpoint to {self.url} failed: {exc} (everything is "
                f"committed in {self.location}; the newest checkpoint there is older)",
                hint=f"evidence backup {self.location} --out s3://BUCKET/NEW-PREFIX, or "
                "run the crawl again before this machine goes") from exc

    async def every(self, interval: float) -> None:
        """Take a checkpoint every ``interval`` seconds until cancelled, off the event
        loop; a failed one is logged and the next is tried on time (the crawl goes on)."""
        while True:
            await anyio.sleep(interval)
            try:
                checkpoint = await anyio.to_thread.run_sync(self.take)
            except (EvidenceError, OSError) as exc:  # the store, the network, the disk
                self.failures += 1
                log.warning("checkpoint to %s failed (%s); trying again in %g s", self.url,
                            exc, interval, extra={"event": "checkpoint.retry"})
            else:
                log.info("checkpoint %s: %d payloads uploaded (%d bytes), database %d bytes",
                         checkpoint.checkpoint_id, checkpoint.uploaded,
                         checkpoint.uploaded_bytes, checkpoint.database.bytes,
                         extra={"event": "checkpoint.done"})


def _checks(conn: apsw.Connection) -> list[str]:
    findings = [f"integrity_check: {r}" for (r,) in conn.execute("PRAGMA integrity_check")
                if r != "ok"]
    _size, _root, found = check_log(conn)
    return findings + [f"check_log: {f.detail}" for f in found]


def _head(conn: apsw.Connection) -> tuple[int, bytes]:
    from .._store.log import load_head

    head = load_head(conn)
    return head.tree.size, head.tree.root()


# --- restore -------------------------------------------------------------------------------

class RestoredCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    source: str
    checkpoint_id: str
    created_at: str
    store_id: str
    open_sessions: list[str]
    tree_size: int
    root: str
    artifacts: int
    artifact_bytes: int
    checks: list[str]
    findings: list[str]  # known gaps carried over from the checkpoint


def restore_checkpoint(url: str, store_path: os.PathLike[str] | str, *,
                       checkpoint_id: str | None = None, progress: Progress | None = None,
                       environ: Mapping[str, str] | None = None) -> RestoredCheckpoint:
    """Build a store directory at ``store_path`` (new or empty) from the newest complete
    checkpoint under ``url`` (or ``checkpoint_id``); nothing appears there unless every
    check passes."""
    if is_server_database(store_path):
        raise StoreError("a checkpoint restores into a store directory",
                         hint="restore into a new directory (evidence restore s3://... --store "
                         "DIR)")
    with Remote(url, environ=environ) as remote:
        found = (read_checkpoint(remote, checkpoint_id) if checkpoint_id is not None
                 else latest(remote))
        if found is None:
            ids = checkpoints(remote)
            if not ids and checkpoint_id is None:
                raise no_archive(remote)  # neither an export nor checkpoints
            what = (f"checkpoint {checkpoint_id} is not there, or not complete"
                    if checkpoint_id else f"no complete checkpoint ({len(ids)} without a "
                    f"{CHECKPOINT}: unfinished uploads)")
            raise StoreError(f"{remote.url}: {what}",
                             hint="check the prefix; a checkpoint is complete once its "
                             f"{CHECKPOINT} is written")
        newest = len(load_migrations())
        if found.schema_version > newest:
            raise MigrationError(f"{remote.url}: checkpoint {found.checkpoint_id} has schema "
                                 f"version {found.schema_version}, newer than this program "
                                 f"supports ({newest})",
                                 hint="upgrade evidence to restore this checkpoint")
        with building(store_path, "restoring") as tmp:
            db = tmp / DB_NAME
            remote.get_file(found.database, db, f"checkpoint {found.checkpoint_id}'s database")
            with map_sqlite_errors(db), contextlib.closing(apsw.Connection(str(db))) as conn:
                problems = _checks(conn)
                size, root, _ = check_log(conn)
                if (size, root.hex()) != (found.tree_size, found.root):
                    problems.append(f"the Merkle tree (size {size}, root {root.hex()[:16]}) "
                                    f"is not the checkpoint's (size {found.tree_size}, root "
                                    f"{found.root[:16]})")
                meta = dict(conn.execute("SELECT key, value FROM store_meta"))
                if meta.get("store_id") != found.store_id:
                    problems.append(f"the database is of store {meta.get('store_id')}, the "
                                    f"checkpoint of {found.store_id}")
                refs: list[ArtifactRef] = artifact_refs(conn)
            fsync_file(db)
            copied, gaps = _unpack(remote, found, refs, tmp, progress)
            known = {(g.kind, g.subject) for g in found.gaps}
            problems += [f"{g.kind}: {g.subject}: {g.detail}" for g in gaps
                         if (g.kind, g.subject) not in known]
            if problems:
                raise CorruptStoreError(
                    f"{remote.url}: checkpoint {found.checkpoint_id} does not restore to what "
                    "its manifest describes; nothing was written at the target:\n  "
                    + "\n  ".join(problems), hint="restore an earlier checkpoint "
                    "(--checkpoint ID)", problems=problems)
        return RestoredCheckpoint(
            path=str(Path(store_path)), source=remote.url, checkpoint_id=found.checkpoint_id,
            created_at=found.created_at, store_id=found.store_id,
            open_sessions=found.open_sessions, tree_size=size, root=root.hex(),
            artifacts=len(refs), artifact_bytes=copied,
            checks=[f"database size and SHA-256 ({found.database.bytes} bytes)",
                    "integrity_check", "check_log", "Merkle tree size and root",
                    f"{len(refs) - len(gaps)} payloads re-hashed"],
            findings=[f"known gap, {g.kind}: {g.subject}: {g.detail}" for g in found.gaps])


def _unpack(remote: Remote, found: Checkpoint, refs: list[ArtifactRef], tmp: Path,
            progress: Progress | None) -> tuple[int, list[Gap]]:
    """Every payload ``refs`` name, from the packs of ``found`` and the checkpoints before
    it, into the new store's packs, each re-hashed as it is put: (bytes, what failed)."""
    places = _payload_places(remote, found.checkpoint_id)
    wanted: dict[str, list[tuple[ArtifactRef, int, int]]] = {}
    gaps, packs = [], {}
    for ref in refs:
        place = places.get((ref.namespace, ref.digest))
        if place is None:
            gaps.append(Gap(kind="artifact_missing", subject=f"{ref.namespace}/{ref.digest}",
                            detail="in no checkpoint's payloads"))
            continue
        holder, offset, size = place
        packs[holder.checkpoint_id] = holder
        wanted.setdefault(holder.checkpoint_id, []).append((ref, offset, size))
    restored = open_artifact_store(tmp / ARTIFACTS_DIR, max_payload=2**62)
    copied, done = 0, 0
    try:
        with tempfile.TemporaryDirectory(prefix=".evidence-payloads-", dir=tmp.parent) as t:
            for checkpoint_id, entries in wanted.items():
                pack = Path(t) / checkpoint_id
                holder = packs[checkpoint_id]
                assert holder.payloads is not None
                remote.get_file(holder.payloads, pack, f"checkpoint {checkpoint_id}'s payloads")
                with open(pack, "rb") as handle:
                    for ref, offset, size in entries:
                        handle.seek(offset)
                        got = restored.put(ref.namespace, handle.read(size))
                        if got.digest != ref.digest:
                            gaps.append(Gap(kind="artifact_corrupt",
                                            subject=f"{ref.namespace}/{ref.digest}",
                                            detail=f"the packed bytes hash to {got.digest}"))
                        else:
                            copied += ref.size
                        done += 1
                        if progress:
                            progress("payloads", done, len(refs))
                pack.unlink()
        failed = {g.subject for g in gaps}
        restored.sync(r for r in refs if f"{r.namespace}/{r.digest}" not in failed)
    finally:
        restored.close()
    return copied, gaps


def backup_to_s3(source: Source, url: str, *, progress: Progress | None = None
                 ) -> Checkpoint:
    """``backup --out s3://``: one verified checkpoint under an empty prefix."""
    with contextlib.ExitStack() as stack:
        store = source if isinstance(source, Store) else stack.enter_context(
            Store.open(source, read_only=True))
        remote = stack.enter_context(Remote(url))
        remote.require_empty()
        checkpointer = stack.enter_context(Checkpointer(store, url))
        return checkpointer.take(verify=True, progress=progress)
    raise AssertionError("unreachable")


def check_destination(url: str, *, new_store: bool = False,
                      environ: Mapping[str, str] | None = None) -> None:
    """Refuse a checkpoint location that cannot work (no prefix, no credentials, no bucket,
    an export there; for a store not created yet, any store's checkpoints) before a crawl
    creates or opens its store."""
    with Remote(url, environ=environ) as remote:
        if not remote.location.prefix:
            raise StoreError(f"{remote.url}: give a prefix for the checkpoints, not a whole "
                             "bucket", hint=f"e.g. {remote.url.split('?')[0]}/crawls/NAME")
        if not remote.client.bucket_exists():
            raise StoreError(f"{remote.url}: the bucket {remote.location.bucket!r} does not "
                             f"exist at {remote.client.config.endpoint}",
                             hint="create the bucket first (its name is in the s3:// URL)")
        if remote.get_bytes(INDEX) is not None:
            raise StoreError(f"{remote.url} holds an export, not checkpoints",
                             hint="choose another prefix for the checkpoints")
        found = latest(remote) if new_store else None
        if found is not None:
            raise StoreError(f"{remote.url} holds checkpoints of store {found.store_id}; a new "
                             "store checkpoints to a prefix of its own",
                             hint=f"restore them first (evidence restore {remote.url} --store "
                             "DIR), or choose another prefix")
