"""Payloads for verify: each artifact row's payload present with its size (``full``:
re-hashed), each wire attempt's content derived again from its head and body (``full``),
and the payloads no row references (orphans), which ``reclaim_orphans`` deletes.

``reclaim_orphans`` deletes orphans older than a grace period. Why it cannot race a commit:
a row references an artifact only in a writer transaction that first checked the file is on
disk (``artifact_id`` in ``_write.apply_rows``, in ``BEGIN IMMEDIATE``). Reclaim unlinks a
file only while it holds the write lock itself (its own ``BEGIN IMMEDIATE``), after
re-reading under that lock that no row references it. SQLite admits one write transaction
at a time, so either the writer's check-insert-commit came first (reclaim's re-check sees
the row and keeps the file), or the unlink did (the writer's check finds the file missing
and refuses the message whole, design rule 6). No committed row can ever name a deleted
file.

Packs are compacted under the same rule: the pack holding orphans is first rewritten
without them into a new sealed pack (outside the lock: copying takes time), and the old
pack is removed only under the write lock, after the same re-check of every orphan it held
(and of puts again by other processes, which append touch records); if any was referenced
or put again meanwhile, the new pack is deleted instead and nothing changes. The writer's
check of a new reference looks at the pack file itself, so after the swap it finds the
payload in the new pack, or (an orphan removed) nowhere.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import apsw
import msgspec

from .._errors import ArtifactCorruptError, ArtifactError, ArtifactMissingError, MessageError
from .._model.http1 import derive_content
from .._model.messages import Discovery, FetchAttempt, Render, decode_message
from .._model.refs import ArtifactRef
from .._model.wire import wire_format
from .._store.backend import Removal
from .._store.db import Store
from .verify_findings import Findings

__all__ = ["ReclaimHooks", "ReclaimReport", "age_text", "check_artifacts", "check_contents",
           "check_page", "orphan_files", "reclaim_orphans"]

_PAGE = 1000
_JSON = msgspec.json.Encoder(order="deterministic")


def check_artifacts(store: Store, conn: apsw.Connection, found: Findings, max_id: int,
                     full: bool) -> int:
    """Each artifact row's file: present with its size (full: BLAKE3 re-hashed), read-only."""
    n, after = 0, 0
    while after < max_id:
        with store.errors():  # one short snapshot per page
            page = conn.execute(
                "SELECT artifact_id, namespace, digest, size FROM artifact "
                "WHERE artifact_id > ? AND artifact_id <= ? ORDER BY artifact_id LIMIT ?",
                (after, max_id, _PAGE)).fetchall()
        if not page:
            break
        check_page(store, page, found, full)
        n, after = n + len(page), page[-1][0]
    return n


def check_page(store: Store, page: list[tuple], found: Findings, full: bool) -> None:
    """``check_artifacts`` of some artifact rows (artifact_id, namespace, digest, size):
    what verify --quick hands over for the rows its merge with the packs did not settle."""
    checked = _checked_page(store, page, full)
    # Read-only is a property of the file that holds a payload: a pack is looked at
    # once for all of its payloads (``writable_each``), not once per payload.
    present = [ref for ref, error in checked if ref is not None and error is None]
    writable = iter(store.artifacts.writable_each(present))
    for (artifact_id, namespace, digest, size), (ref, error) in zip(page, checked,
                                                                    strict=True):
        if ref is not None and error is None and not next(writable):
            continue  # present, read-only: nothing to report, so no path to name
        where = {"table": "artifact", "row_id": artifact_id, "digest": digest}
        try:
            if ref is not None:
                where["path"] = store.artifacts.location(ref)
            if error is not None:
                raise error
        except ArtifactMissingError:
            found.add("artifact_missing", f"artifact {namespace}/{digest} ({size} bytes) "
                      "is referenced but not on disk", **where)
            continue
        except ArtifactCorruptError as exc:
            found.add("artifact_corrupt", str(exc), **where)
            continue
        except ArtifactError as exc:
            found.add("artifact_unreadable", str(exc), **where)
            continue
        if ref is not None:  # present, and writable
            found.add("artifact_writable", f"artifact {where['path']} is writable (the "
                      "store makes every payload read-only)", **where)


def _checked_page(store: Store, page: list[tuple], full: bool
                  ) -> list[tuple[ArtifactRef | None, ArtifactError | None]]:
    """(ref, what its check raised) of each artifact row of a page: quick, one
    ``check_each`` (a pack stat once, an object store's HEADs overlapped); full, each
    re-hashed. A row that is no valid reference has no ref, and its error."""
    refs: list[ArtifactRef | None] = []
    results: list[ArtifactError | None] = []
    for _id, namespace, digest, size in page:
        try:
            refs.append(ArtifactRef(namespace, digest, size))
            results.append(None)
        except ArtifactError as exc:
            refs.append(None)
            results.append(exc)
    valid = [ref for ref in refs if ref is not None]
    checked: list[ArtifactError | None] | None = None
    if not full:
        with contextlib.suppress(ArtifactError):  # one unreadable: each by itself, below
            checked = store.artifacts.check_each(valid)
    if checked is None:
        checked = []
        for ref in valid:
            try:
                (store.artifacts.verify if full else store.artifacts.check)(ref)
                checked.append(None)
            except ArtifactError as exc:
                checked.append(exc)
    each = iter(checked)
    return [(ref, error if ref is None else next(each))
            for ref, error in zip(refs, results, strict=True)]


# --- contents against the wire ---------------------------------------------------------

_CONTENT_SQL = """
SELECT f.attempt_seq, f.attempt_id, f.transfer_coding, f.content_coding, f.content_truncated,
       h.namespace, h.digest, h.size, b.namespace, b.digest, b.size,
       c.namespace, c.digest, c.size, f.protocol, fr.namespace, fr.digest, fr.size
FROM fetch_attempt f
JOIN artifact h ON h.artifact_id = f.response_headers_id
JOIN artifact b ON b.artifact_id = f.body_id
LEFT JOIN artifact c ON c.artifact_id = f.content_id
LEFT JOIN artifact fr ON fr.artifact_id = f.frames_id
WHERE f.capture = 'wire' AND f.attempt_seq > ? ORDER BY f.attempt_seq LIMIT ?
"""


def check_contents(store: Store, conn: apsw.Connection, found: Findings) -> int:
    """Derive each wire attempt's content again from its head and body; compare."""
    n = after = 0
    while True:
        with store.errors():  # each page its own short snapshot
            page = conn.execute(_CONTENT_SQL, (after, _PAGE)).fetchall()
        if not page:
            return n
        for (seq, attempt_id, transfer, coding, truncated, *refs) in page:
            n, after = n + 1, seq
            head_ref, body_ref = ArtifactRef(*refs[0:3]), ArtifactRef(*refs[3:6])
            content_ref = None if refs[6] is None else ArtifactRef(*refs[6:9])
            protocol, frames_ref = refs[9], None if refs[10] is None else ArtifactRef(*refs[10:13])
            try:  # a missing or damaged file is the artifact check's finding
                head, body = store.artifacts.read(head_ref), store.artifacts.read(body_ref)
                stored = body if content_ref is None else store.artifacts.read(content_ref)
                frames = None if frames_ref is None else store.artifacts.read(frames_ref)
            except ArtifactError:
                continue
            if frames is not None and not _frames_give(protocol, frames, head, body):
                found.add("content_mismatch", f"attempt {attempt_id}: its head and body are "
                          f"not what its stored {protocol} frames derive to",
                          table="fetch_attempt", row_id=seq, digest=frames_ref.digest)  # type: ignore[union-attr]
            limit = len(stored) if truncated else len(stored) + 1
            derived = derive_content(head, body, limit)
            same = derived.data == stored and (derived.transfer_coding, derived.content_coding) \
                == (transfer, coding)
            if not same:
                found.add("content_mismatch", f"attempt {attempt_id}: its content is not what "
                          "its stored head and body derive to (codings recorded "
                          f"{transfer}/{coding}, derived {derived.transfer_coding}/"
                          f"{derived.content_coding})", table="fetch_attempt", row_id=seq,
                          digest=(content_ref or body_ref).digest)


def _frames_give(protocol: str, frames: bytes, head: bytes, body: bytes) -> bool:
    """Whether the frames a capture read derive to its stored head and body (the body as
    stored: cut at the cap, so a prefix of the derived one)."""
    try:
        split = wire_format(protocol).split_response(frames, "GET")
    except (KeyError, ValueError):
        return False
    return split.head == head and split.body[:len(body)] == body


# --- orphans -------------------------------------------------------------------------

def _quarantined_refs(conn: apsw.Connection, after: int = 0) -> tuple[set[tuple[str, str]], int]:
    """Artifacts named by quarantined messages: kept, so an auditor can see what was refused."""
    refs: set[tuple[str, str]] = set()
    last = after
    for qid, payload in conn.execute(
            "SELECT quarantine_id, payload FROM quarantine WHERE quarantine_id > ?", (after,)):
        last = max(last, qid)
        try:
            message = decode_message(payload)
        except MessageError:  # undecodable payloads are quarantined for exactly that
            continue
        named: tuple[ArtifactRef | None, ...]
        if isinstance(message, FetchAttempt):
            named = (message.request_headers, message.response_headers, message.body,
                     message.content, message.surplus, message.frames,
                     message.request_secrets)
        elif isinstance(message, Discovery):
            named = (message.source_artifact,)
        elif isinstance(message, Render):
            named = (message.dom, message.screenshot, message.mhtml, message.behaviors)
        else:
            named = ()
        refs.update((r.namespace, r.digest) for r in named if r is not None)
    return refs, last


def orphan_files(store: Store, conn: apsw.Connection) -> list[tuple[ArtifactRef, float]]:
    return list(_orphans(store, conn))


def _referenced(conn: apsw.Connection, refs: list[ArtifactRef]) -> set[tuple[str, str]]:
    """Which of ``refs`` an artifact row names: one query for the lot (by its unique key)."""
    names = _JSON.encode([[ref.namespace, ref.digest] for ref in refs]).decode()
    return set(conn.execute(
        "SELECT namespace, digest FROM artifact WHERE (namespace, digest) IN "
        "(SELECT value ->> 0, value ->> 1 FROM json_each(?))", (names,)))


def _orphans(store: Store, conn: apsw.Connection) -> Iterator[tuple[ArtifactRef, float]]:
    """(ref, age in seconds) of each file no row and no quarantined message references."""
    with store.errors():
        quarantined, _ = _quarantined_refs(conn)
    held = (ref for ref in store.artifacts.iter_refs()
            if (ref.namespace, ref.digest) not in quarantined)
    while page := list(itertools.islice(held, _PAGE)):
        with store.errors():
            referenced = _referenced(conn, page)
        for ref in page:
            if (ref.namespace, ref.digest) in referenced:
                continue
            age = store.artifacts.age(ref)
            if age is not None:
                yield ref, age


def age_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


@dataclass(frozen=True, kw_only=True)
class ReclaimHooks:
    """Named points in ``reclaim_orphans``, for tests that interleave a commit."""

    before_lock: Callable[[ArtifactRef], None] | None = None  # candidate chosen, no lock yet
    while_locked: Callable[[ArtifactRef], None] | None = None  # lock held, re-checked, pre-unlink


class ReclaimReport(msgspec.Struct, kw_only=True):
    removed: list[str]  # where each removed payload was (its file; its pack and offset)
    bytes_freed: int
    kept_young: int  # orphans inside the grace period
    kept_referenced: int  # became referenced before they could be deleted
    skipped_busy: int  # the write lock could not be had within the busy timeout


def reclaim_orphans(store: Store, grace_seconds: float, *,
                    hooks: ReclaimHooks | None = None) -> ReclaimReport:
    """Remove orphaned payloads last put more than ``grace_seconds`` ago.

    The artifact store prepares each removal first (a pack is rewritten without its
    orphans; a file has nothing to prepare), then each is re-checked and committed under the
    store's write lock (see the module docstring for why that cannot race a commit), or
    abandoned, leaving everything as it was, if any of its payloads was referenced or put
    again meanwhile. Directories are left in place: removing one could race a put that has
    just created it.
    """
    if grace_seconds < 0:
        raise ValueError(f"grace_seconds must be >= 0, not {grace_seconds!r}")
    hooks = hooks or ReclaimHooks()
    report = ReclaimReport(removed=[], bytes_freed=0, kept_young=0, kept_referenced=0,
                           skipped_busy=0)
    with store.reader() as reader:
        candidates = []
        for ref, age in list(_orphans(store, reader)):
            if age < grace_seconds:
                report.kept_young += 1
            else:
                candidates.append(ref)
    if not candidates:
        return report
    removals = collections.deque(store.artifacts.plan_removal(candidates))
    try:
        with store.errors():
            # Its own connection: the store's write connection belongs to the writer.
            conn = store.backend.connect_writer()
            try:
                quarantined, last_q = _quarantined_refs(conn)
                while removals:
                    removal = removals.popleft()
                    for ref in removal.refs:
                        if hooks.before_lock:
                            hooks.before_lock(ref)
                    try:
                        # The write lock: no commit can interleave.
                        conn.execute(store.backend.dialect.begin_write)
                    except store.backend.BusyError:
                        report.skipped_busy += len(removal.refs)
                        removal.abort()
                        continue
                    try:
                        more, last_q = _quarantined_refs(conn, last_q)
                        quarantined |= more
                        _reclaim_one(store, conn, removal, quarantined, grace_seconds, hooks,
                                     report)
                    finally:
                        conn.execute("ROLLBACK")  # nothing was written; this releases the lock
            finally:
                conn.close()
    finally:
        for removal in removals:  # not reached: an error stopped the loop
            removal.abort()
    return report


def _reclaim_one(store: Store, conn: apsw.Connection, removal: Removal,
                 quarantined: set[tuple[str, str]], grace_seconds: float, hooks: ReclaimHooks,
                 report: ReclaimReport) -> None:
    """Under the write lock: re-check every payload of the removal, then commit it; if any
    is referenced or young again, abort it whole. Anything doubtful keeps the bytes."""
    refresh = getattr(store.artifacts, "refresh", None)
    if refresh is not None:
        refresh()  # puts again by other processes (touches) since the plan was made
    keep = False
    for ref in removal.refs:
        if (ref.namespace, ref.digest) in quarantined or _referenced(conn, [ref]):
            report.kept_referenced += 1
            keep = True
            continue
        age = store.artifacts.age(ref)
        if age is None:
            keep = True
        elif age < grace_seconds:  # put again since the scan
            report.kept_young += 1
            keep = True
    if keep:
        removal.abort()
        return
    for ref in removal.refs:
        if hooks.while_locked:
            hooks.while_locked(ref)
    where = [store.artifacts.location(ref) for ref in removal.refs]
    report.bytes_freed += removal.commit()
    report.removed.extend(where)
