"""The store's log, rebuilt from an archive's dump: the Merkle tree of accepted messages,
the commit-log hash chain, commit times and quarantine records.

What evidence's own ``verify`` checks of the log, redone from the tables alone:

- every ledger entry's leaf, SHA-256(0x00 || entry), where the entry is the payload or,
  for a message a worker host submitted, the msgpack array ["evidence/submitted-by",
  submitter, payload]; its BLAKE3 payload hash; contiguous indexes;
- every commit-log row: it starts where the previous batch ended, its tree size and root
  are the ones the ledger gives, its entries were received at its commit time and name it;
- the hash chain, which starts from the store's identity, SHA-256("evidence store id\\n" ||
  store_id) (32 zero bytes for a store whose first batch predates that), each link
  SHA-256(prev || u64 batch || u64 first index || u64 tree size || root || committed_at
  [|| "quarantined" || u64 length || the batch's record of what it quarantined]);
- commit times that never go back by more than five minutes (TIME_TOLERANCE);
- every quarantine record a batch counted, rebuilt from the chain (its content hash, its
  deliveries, its first and last receipt) against the table, and the table's rows against
  their payload hash; rows in the layout from before counted records (``deliveries``
  empty) as many as the store recorded (``store_meta.legacy_quarantine``) and older than
  every counted record.

Each batch's chain hash is also recomputed from the recomputed roots and the recomputed
previous link, never read from the table: that is what a checkpoint's ``chain`` line signs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import sqlite3
from dataclasses import dataclass

import blake3

from .merkle import RootsAt
from .msgpack import pack, unpack
from .verdict import Verdict

TIME_TOLERANCE = 300.0  # seconds a commit time may lie before an earlier one's
_ZEROS = bytes(32)  # the chain's start for stores from before it bound their identity


@dataclass(frozen=True)
class Head:
    batch_seq: int
    tree_size: int
    root: bytes
    chain: bytes  # recomputed from the identity through this batch


@dataclass
class Log:
    """What the rebuild found: roots[k] is the root of the first k entries."""

    store_id: str | None
    roots: list[bytes]
    heads: dict[int, Head]
    legacy: tuple[int, bytes]  # pre-006 quarantine rows: how many, SHA-256 over them


def identity(store_id: str) -> bytes:
    return hashlib.sha256(b"evidence store id\n" + store_id.encode()).digest()


def link(prev: bytes, seq: int, first: int, size: int, root: bytes, committed_at: str,
         quarantined: bytes | None) -> bytes:
    h = hashlib.sha256(prev)
    for number in (seq, first, size):
        h.update(number.to_bytes(8, "big"))
    h.update(root + committed_at.encode())
    if quarantined is not None:
        h.update(b"quarantined" + len(quarantined).to_bytes(8, "big") + quarantined)
    return h.digest()


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def rebuild(db: sqlite3.Connection, verdict: Verdict) -> Log:
    meta = dict(db.execute("SELECT key, value FROM store_meta"))
    store_id = meta.get("store_id")
    roots = _leaves(db, verdict)
    heads = _chain(db, verdict, roots, store_id or "")
    _times(db, verdict)
    legacy = _quarantine(db, verdict, meta)
    return Log(store_id, roots, heads, legacy)


def _leaves(db: sqlite3.Connection, verdict: Verdict) -> list[bytes]:
    tree = RootsAt()
    roots = [tree.root()]
    by = "submitter" if "submitter" in _columns(db, "ingest_ledger") else "NULL"
    for index, payload, leaf, payload_hash, submitter in db.execute(
            f"SELECT log_index, payload, leaf_hash, payload_hash, {by} FROM ingest_ledger "
            "ORDER BY log_index"):
        if index != tree.size:
            verdict.problem(f"ledger entry {tree.size} is missing (next is {index})")
            break
        entry = payload if submitter is None else pack(
            ["evidence/submitted-by", submitter, bytes(payload)])
        computed = hashlib.sha256(b"\x00" + entry).digest()
        if computed != leaf:
            verdict.problem(f"ledger entry {index}: its bytes"
                            f"{' and submitter' if submitter is not None else ''} do not hash "
                            "to its leaf hash")
        if blake3.blake3(payload).hexdigest() != payload_hash:
            verdict.problem(f"ledger entry {index}: its bytes do not have its BLAKE3 hash")
        tree.append(computed)
        roots.append(tree.root())
    return roots


def _chain(db: sqlite3.Connection, verdict: Verdict, roots: list[bytes],
           store_id: str) -> dict[int, Head]:
    quarantined = "quarantined" if "quarantined" in _columns(db, "commit_log") else "NULL"
    rows = db.execute(
        "SELECT batch_seq, committed_at, first_index, tree_size, root, prev_hash, entry_hash, "
        f"{quarantined} FROM commit_log ORDER BY batch_seq").fetchall()
    genesis = identity(store_id)
    stored_prev = rechained = genesis
    if rows and rows[0][5] == _ZEROS:
        stored_prev = rechained = _ZEROS
        verdict.notes.append("the hash chain starts from zeros: the store's first batch "
                             "predates chains bound to the store's identity, so its id is "
                             "not bound")
    elif rows and rows[0][5] != genesis:
        verdict.problem("batch 1 does not start from this store's identity: store_meta's "
                        "store_id was changed, or the log comes from another store")
        stored_prev = rows[0][5]
    received = _received(db)
    heads: dict[int, Head] = {}
    expected, size_before = 1, 0
    for seq, committed_at, first, size, root, prev, chain, record in rows:
        if seq != expected:
            verdict.problem(f"the commit log jumps to batch {seq} (expected {expected})")
        expected = seq + 1
        if first != size_before:
            verdict.problem(f"batch {seq} starts at entry {first}, the log was at "
                            f"{size_before}")
        if not 0 <= size < len(roots) or roots[size] != root:
            verdict.problem(f"batch {seq} records root {bytes(root).hex()[:16]}... at size "
                            f"{size}; the ledger gives another")
        for index in range(first, min(size, len(roots) - 1)):
            batch, at = received.get(index, (seq, committed_at))
            if batch != seq:
                verdict.problem(f"ledger entry {index} says batch {batch}, the log says {seq}")
            elif at != committed_at:
                verdict.problem(f"ledger entry {index} says it was received at {at!r}, its "
                                f"batch {seq} was committed at {committed_at!r}")
        record = None if record is None else bytes(record)
        if prev != stored_prev or chain != link(stored_prev, seq, first, size, root,
                                                committed_at, record):
            verdict.problem(f"batch {seq}: the hash chain is broken")
        stored_prev = chain
        mine = roots[size] if 0 <= size < len(roots) else b""
        rechained = link(rechained, seq, first, size, mine, committed_at, record)
        heads[seq] = Head(seq, size, mine, rechained)
        size_before = size
    if len(roots) - 1 > size_before:
        verdict.problem(f"ledger entry {size_before} is beyond the last committed tree size")
    return heads


def _received(db: sqlite3.Connection) -> dict[int, tuple[int, str]]:
    """log index -> (the batch it names, when it says it was received)."""
    return {index: (batch, at) for index, batch, at in db.execute(
        "SELECT log_index, batch_seq, received_at FROM ingest_ledger")}


def _times(db: sqlite3.Connection, verdict: Verdict) -> None:
    latest: tuple[int, dt.datetime] | None = None
    for seq, committed_at in db.execute(
            "SELECT batch_seq, committed_at FROM commit_log ORDER BY batch_seq"):
        try:
            moment = dt.datetime.fromisoformat(committed_at)
        except (TypeError, ValueError):
            verdict.problem(f"batch {seq}: commit time {committed_at!r} is not a time")
            continue
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        if latest is not None and (latest[1] - moment).total_seconds() > TIME_TOLERANCE:
            verdict.problem(f"batch {seq} was committed at {committed_at}, "
                            f"{(latest[1] - moment).total_seconds():.0f} s before batch "
                            f"{latest[0]}: commit times go back more than the "
                            f"{TIME_TOLERANCE:g} s a clock step explains")
        if latest is None or moment > latest[1]:
            latest = (seq, moment)


def _record_hash(message_id: str | None, kind: str | None, code: str, reason: str,
                 payload_hash: str) -> bytes:
    return hashlib.sha256(pack([message_id, kind, code, reason, payload_hash])).digest()


def _quarantine(db: sqlite3.Connection, verdict: Verdict, meta: dict) -> tuple[int, bytes]:
    columns = _columns(db, "quarantine")
    counted = "deliveries" in columns
    chain = _counted(db, verdict) if counted and "quarantined" in _columns(
        db, "commit_log") else {}
    legacy, digest, first_counted = 0, hashlib.sha256(), None
    extra = ", deliveries, last_received_at" if counted else ", NULL, NULL"
    for qid, received_at, message_id, kind, code, reason, stored, payload, deliveries, last \
            in db.execute("SELECT quarantine_id, received_at, message_id, kind, reason_code, "
                          f"reason, payload_hash, payload{extra} FROM quarantine "
                          "ORDER BY quarantine_id"):
        if blake3.blake3(payload).hexdigest() != stored:
            verdict.problem(f"quarantine row {qid}: its payload does not hash to its "
                            "recorded payload_hash")
        if deliveries is None:
            legacy += 1
            digest.update(pack([qid, received_at, message_id, kind, code, reason, stored]))
            if first_counted is not None:
                verdict.problem(f"quarantine row {qid} is in the pre-006 layout but newer "
                                "than a counted record: written by hand")
            continue
        first_counted = qid if first_counted is None else first_counted
        seen = chain.pop(qid, None)
        if seen is None:
            verdict.problem(f"quarantine row {qid} is in no batch's record of what it "
                            "quarantined: no delivery wrote it")
            continue
        want, total, first, latest = seen
        if want != _record_hash(message_id, kind, code, reason, stored):
            verdict.problem(f"quarantine row {qid}: its message id, kind, reason or payload "
                            "hash is not what the commit log recorded")
        for name, have, expected in (("deliveries", deliveries, total),
                                     ("received_at", received_at, first),
                                     ("last_received_at", last, latest)):
            if have != expected:
                verdict.problem(f"quarantine row {qid}: {name} is {have!r}, the commit log "
                                f"says {expected!r}")
    for qid, (_, total, first, _) in sorted(chain.items()):
        verdict.problem(f"quarantine record {qid} ({total} deliveries, first at {first}) is "
                        "recorded by the commit log but not in the table")
    recorded = meta.get("legacy_quarantine")
    if recorded is not None and recorded != str(legacy):
        verdict.problem(f"{legacy} quarantine row(s) in the pre-006 layout, the store "
                        f"recorded {recorded} when that layout was closed")
    verdict.facts["quarantine_records"] = db.execute(
        "SELECT count(*) FROM quarantine").fetchone()[0]
    return legacy, digest.digest()


def _counted(db: sqlite3.Connection, verdict: Verdict) -> dict[int, tuple]:
    """quarantine_id -> (record hash, deliveries, first and last batch's commit time)."""
    seen: dict[int, tuple] = {}
    for seq, committed_at, blob in db.execute(
            "SELECT batch_seq, committed_at, quarantined FROM commit_log "
            "WHERE quarantined IS NOT NULL ORDER BY batch_seq"):
        try:
            entries = unpack(bytes(blob))
            entries = [(int(q), bytes(h), int(n)) for q, h, n in entries]
        except (ValueError, TypeError) as exc:
            verdict.problem(f"batch {seq}: its record of what it quarantined does not decode "
                            f"({exc})")
            continue
        for qid, digest, added in entries:
            if qid in seen:
                old, total, first, _ = seen[qid]
                if old != digest:
                    verdict.problem(f"quarantine record {qid}: batch {seq} records other "
                                    "content for it than an earlier batch")
                seen[qid] = (old, total + added, first, committed_at)
            else:
                seen[qid] = (digest, added, committed_at, committed_at)
    return seen
