"""Quarantine records: one per refused content, counted, and bound into the commit log.

A message the writer refuses (``rejected``) or that contradicts the ledger (``conflict``)
is kept whole in ``quarantine``. One *record* is one content refused for one reason
(payload hash, reason code, reason): the first delivery writes it, every later one adds
to ``deliveries`` and moves ``last_received_at`` (migration 006; rows from before it are
one per delivery, ``deliveries`` NULL, and stay as they were).

Quarantined messages are not leaves of the Merkle tree: the tree is the record of what
was accepted, and the same accepted messages must give the same roots everywhere. What
proves a record is the commit log. A batch that quarantined anything records, in its
``commit_log.quarantined``, each record it wrote or counted: its id, a hash of what it
holds, and how many deliveries the batch added; the row's chain hash covers that. So
``check_records`` can rebuild every counted record's deliveries, first and last receipt
(the commit times of the batches that counted it) and content from the chain, and find a
record edited, deleted or inserted by hand. Someone who also rewrites the chain after
the edit (anyone who can write the database can recompute it) is caught by a signed
checkpoint from before the edit, which binds the chain's head (``_audit.checkpoints``); an
inclusion proof exists for accepted messages only (docs/verify.md, "What proves a
quarantine record"). Rows from before migration 006 are a closed set (migration 010):
``legacy_rows`` is what a checkpoint binds of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import apsw
import msgspec

from .._errors import MessageError
from .._model.messages import decode_message, payload_hash

__all__ = ["BatchRecords", "check_records", "legacy_rows", "record", "record_hash"]

_ENCODE = msgspec.msgpack.Encoder()
_DECODE = msgspec.msgpack.Decoder(list[tuple[int, bytes, int]])

_UPSERT = (
    "INSERT INTO quarantine (received_at, message_id, kind, reason_code, reason, "
    "payload_hash, payload, deliveries, last_received_at) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?) "
    "ON CONFLICT (payload_hash, reason_code, reason) WHERE deliveries IS NOT NULL "
    "DO UPDATE SET deliveries = quarantine.deliveries + 1, "  # qualified: PostgreSQL needs it
    "last_received_at = excluded.received_at "
    "RETURNING quarantine_id")


def record_hash(message_id: str | None, kind: str | None, reason_code: str, reason: str,
                payload_hash_hex: str) -> bytes:
    """SHA-256 of what a record holds (the payload through its hash), unambiguously."""
    return hashlib.sha256(_ENCODE.encode(
        [message_id, kind, reason_code, reason, payload_hash_hex])).digest()


@dataclass
class BatchRecords:
    """The records one batch wrote or counted: quarantine_id -> [record hash, deliveries]."""

    touched: dict[int, list] = field(default_factory=dict)

    def encode(self) -> bytes | None:
        """``commit_log.quarantined``: None when the batch quarantined nothing."""
        if not self.touched:
            return None
        return _ENCODE.encode([(qid, h, n) for qid, (h, n) in sorted(self.touched.items())])


def record(conn: apsw.Connection, records: BatchRecords, *, message_id: str | None,
           kind: str | None, reason_code: str, reason: str, payload_hash_hex: str,
           payload: bytes, received_at: str) -> int:
    """Write a new record or count one more delivery of an existing one; note it in the
    batch's ``records``; return its quarantine_id."""
    [(qid,)] = conn.execute(_UPSERT, (received_at, message_id, kind, reason_code, reason,
                                      payload_hash_hex, payload, received_at)).fetchall()
    entry = records.touched.setdefault(
        qid, [record_hash(message_id, kind, reason_code, reason, payload_hash_hex), 0])
    entry[1] += 1
    return qid


Add = Callable[..., None]  # Findings.add(kind, message, **where)


def check_records(conn: apsw.Connection, add: Add) -> int:
    """Every quarantine row against its payload, and every counted record against the
    commit log; returns the number of rows checked."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(quarantine)")}
    counted = "deliveries" in columns
    chain = _chain(conn, add) if counted else {}
    n = 0
    extra = ", deliveries, last_received_at" if counted else ", NULL, NULL"
    for (qid, received_at, message_id, kind, code, reason, stored_hash, payload, deliveries,
         last) in conn.execute(
            "SELECT quarantine_id, received_at, message_id, kind, reason_code, reason, "
            f"payload_hash, payload{extra} FROM quarantine ORDER BY quarantine_id"):
        n += 1
        where = {"table": "quarantine", "row_id": qid}
        if payload_hash(payload) != stored_hash:
            add("quarantine_hash", f"quarantine row {qid}: payload does not hash to its "
                "recorded payload_hash", **where)
        _check_columns(add, qid, message_id, kind, payload, where)
        if deliveries is None:
            continue  # a row from before records were counted: one row per delivery
        seen = chain.pop(qid, None)
        if seen is None:
            add("quarantine_unlogged", f"quarantine row {qid} is in no batch's record of "
                "what it quarantined: no delivery wrote it", **where)
            continue
        digest, total, first, latest = seen
        if digest != record_hash(message_id, kind, code, reason, stored_hash):
            add("quarantine_mismatch", f"quarantine row {qid}: its message id, kind, reason "
                "or payload hash is not what the commit log recorded", **where)
        for name, have, want in (("deliveries", deliveries, total),
                                 ("received_at", received_at, first),
                                 ("last_received_at", last, latest)):
            if have != want:
                add("quarantine_mismatch", f"quarantine row {qid}: {name} is {have!r}, the "
                    f"commit log says {want!r}", **where)
    for qid, (_, total, first, _) in sorted(chain.items()):
        add("quarantine_missing", f"quarantine record {qid} ({total} deliveries, first at "
            f"{first}) is recorded by the commit log but not in the table",
            table="quarantine", row_id=qid)
    return n


def _chain(conn: apsw.Connection, add: Add) -> dict[int, tuple[bytes, int, str, str]]:
    """quarantine_id -> (record hash, deliveries, first and last batch's commit time)."""
    seen: dict[int, tuple[bytes, int, str, str]] = {}
    for batch_seq, committed_at, blob in conn.execute(
            "SELECT batch_seq, committed_at, quarantined FROM commit_log "
            "WHERE quarantined IS NOT NULL ORDER BY batch_seq"):
        try:
            entries = _DECODE.decode(blob)
        except msgspec.DecodeError as exc:
            add("log_batch", f"batch {batch_seq}: its record of what it quarantined does not "
                f"decode ({exc})", table="commit_log", batch_seq=batch_seq)
            continue
        for qid, digest, added in entries:
            if qid in seen:
                old, total, first, _ = seen[qid]
                if old != digest:
                    add("quarantine_mismatch", f"quarantine record {qid}: batch {batch_seq} "
                        "records other content for it than an earlier batch",
                        table="commit_log", batch_seq=batch_seq)
                seen[qid] = (old, total + added, first, committed_at)
            else:
                seen[qid] = (digest, added, committed_at, committed_at)
    return seen


def _check_columns(add: Add, qid: int, message_id: str | None, kind: str | None,
                   payload: bytes, where: dict[str, object]) -> None:
    """A quarantined payload that decodes must agree with its message_id and kind columns
    (one that does not decode was quarantined for exactly that)."""
    try:
        message = decode_message(payload)
    except MessageError:
        return
    tag = type(message).__struct_config__.tag
    if (message.message_id, tag) != (message_id, kind):
        add("quarantine_mismatch", f"quarantine row {qid}: message_id {message_id!r} and kind "
            f"{kind!r} are not its payload's ({message.message_id!r}, {tag!r})", **where)


def legacy_rows(conn: apsw.Connection) -> tuple[int, bytes]:
    """(how many, SHA-256 of what they hold) of the rows in the pre-006 layout (``deliveries``
    NULL), in quarantine_id order: a closed set since migration 010, which a signed
    checkpoint binds as it is."""
    from .log import has_column

    where = "deliveries IS NULL" if has_column(conn, "quarantine", "deliveries") else "1 = 1"
    h, n = hashlib.sha256(), 0
    for qid, received_at, message_id, kind, code, reason, stored_hash in conn.execute(
            "SELECT quarantine_id, received_at, message_id, kind, reason_code, reason, "
            f"payload_hash FROM quarantine WHERE {where} ORDER BY quarantine_id"):
        h.update(_ENCODE.encode([qid, received_at, message_id, kind, code, reason,
                                 stored_hash]))
        n += 1
    return n, h.digest()
