"""The quick tier of verify (``verify(store, quick=True)``, ``evidence verify --quick``):
what an operator runs after a crash, a deploy or a power cut, and nightly on a store too
large for the row check, at a few times the cost of SQLite's own ``PRAGMA quick_check``.

The default verify decodes every ledger entry strictly and compares every row it wrote,
field by field, and replays the frontier: that is the audit, and it costs what decoding
and comparing every row costs. This tier keeps the checks whose cost is the size of the
ledger's bytes, not the number of fields, and each finds exactly what the default finds
for what it covers:

  - the log, every leaf hashed (``check_log_bulk``): in the same pass over the ledger,
    each entry's kind and number of items are read from its payload by a decoder that
    looks at nothing else (``_Shape``: under 1 us an entry, where the strict one takes 17);
  - the rows: each table written from the ledger holds as many rows as the entries of its
    kind say, and its last row (by key: the writer writes in log order) names the last of
    them. Where a table's figures disagree, its rows are grouped by log_index and each
    entry whose rows differ in number is checked with the default's own code
    (``verify_rows.check_entry``), which names the row missing or added, or finds that
    the writer stored a link or a document once for two entries (ON CONFLICT DO NOTHING),
    which is no finding. Sessions and runs (a few entries) are compared field by field,
    as the default does;
  - the payloads: the artifact rows against the listing of every pack's index
    (``PackIndex.listing``: each pack looked at once, present, read-only, the size it was
    sealed at) instead of one lookup per payload; a row the listing does not settle is
    checked as the default checks it (``verify_artifacts.check_page``). Payloads held
    elsewhere (one file each, S3) are checked as the default checks them.

What it leaves to the default (``NOT_CHECKED``, in the report, the JSON and --help): rows
against their entries field by field, the entries' strict decoding and their message id,
kind and payload hash columns, the replayed frontier and host state, ``url_current``, the
interned rows referenced by some row, the foreign keys, and the orphan listing.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any

import apsw
import msgspec

from .._store.db import Store
from .._store.packindex import PackIndex
from .verify_artifacts import check_artifacts, check_page
from .verify_findings import Findings
from .verify_rows import check_entry, check_sessions_runs, rows_at

__all__ = ["NOT_CHECKED", "LedgerShape", "check_counts", "check_payloads"]

# What the quick tier does not check, as the report says it (the default does each).
NOT_CHECKED = (
    "rows against their ledger entries field by field (counted only; sessions and runs "
    "are compared)",
    "strict decoding of each entry, its message_id, kind and payload_hash columns",
    "frontier and host_state replayed",
    "url_current rebuilt",
    "url_identity, artifact and dns_resolution rows referenced by some row",
    "foreign_key_check",
    "orphaned payloads listed",
)

# ledger kind -> the table whose rows carry its log_index, and whether an entry writes
# one row (else as many as its list field holds, fewer when the writer stored one twice)
_COUNTED = {"fetch_attempt": ("fetch_attempt", None), "render": ("render", None),
            "rule_evaluated": ("rule_evaluation", None),
            "discovery": ("discovery_edge", "refs"),
            "session_documents": ("session_document", "documents")}
_KEYS = {"fetch_attempt": "attempt_seq", "render": "render_seq",
         "rule_evaluation": "evaluation_id", "discovery_edge": "edge_id",
         "session_document": None}
_FACTS = frozenset({"session_started", "session_ended", "run_started", "run_ended"})
_STATE = frozenset({"frontier", "host"})  # no row of an evidence table: the replay's


class _Shape(msgspec.Struct):
    """What the quick tier reads of a payload: its kind, and the list that says how many
    rows it wrote (kept as its raw bytes: only the array's header is read). Every other
    field is skipped unparsed."""

    kind: str
    refs: msgspec.Raw = msgspec.Raw(b"")
    documents: msgspec.Raw = msgspec.Raw(b"")


_SHAPE = msgspec.msgpack.Decoder(_Shape)


def _items(raw: msgspec.Raw) -> int:
    """The number of elements of a msgpack array from its header; -1: not an array."""
    head = memoryview(raw)
    if not head:
        return -1
    first = head[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    if first == 0xDC and len(head) >= 3:
        return int.from_bytes(head[1:3], "big")
    if first == 0xDD and len(head) >= 5:
        return int.from_bytes(head[1:5], "big")
    return -1


class LedgerShape:
    """``check_log_bulk``'s ``each_chunk``: each entry's kind from its payload (never from
    the ``kind`` column, which no hash covers), and for each table the figures its rows
    must have."""

    def __init__(self) -> None:
        # table -> [its rows, the last entry that wrote one]
        self.want: dict[str, list[int]] = {table: [0, -1] for table, _ in _COUNTED.values()}
        self.facts: list[int] = []  # the session and run entries' indexes
        self.strict: list[int] = []  # entries only the strict decoder can say more of
        self.entries = 0

    def __call__(self, start: int, payloads: Sequence[bytes]) -> None:
        shapes: list[_Shape | None]
        try:
            shapes = list(map(_SHAPE.decode, payloads))
        except msgspec.DecodeError:
            shapes = [_shape(payload) for payload in payloads]
        for kind, indexes in _by_kind(shapes, start).items():
            counted = _COUNTED.get(kind)
            if counted is None:
                if kind in _FACTS:
                    self.facts += indexes
                elif kind not in _STATE:  # not a message ("": not even read as one):
                    self.strict += indexes  # the strict decoder says what it is
                continue
            table, field = counted
            if field is None:
                figures = self.want[table]
                figures[0] += len(indexes)
                figures[1] = indexes[-1]
                continue
            items = _lengths([getattr(shapes[i - start], field) for i in indexes])
            if min(items, default=0) < 0:  # not an array: the strict decoder says what
                self.strict += [i for i, n in zip(indexes, items, strict=True) if n < 0]
            self._add(table, indexes, items)
        self.entries = start + len(shapes)

    def _add(self, table: str, indexes: list[int], counts: list[int]) -> None:
        """Add entries (their indexes, how many rows each wrote) to ``table``'s figures."""
        figures = self.want[table]
        figures[0] += sum(n for n in counts if n > 0)
        for index, n in zip(reversed(indexes), reversed(counts), strict=True):
            if n > 0:  # the last entry that wrote a row (most often the last one)
                figures[1] = max(figures[1], index)
                break


def _by_kind(shapes: list[_Shape | None], start: int) -> dict[str, list[int]]:
    """The indexes of a chunk's entries by kind ("" for an entry the quick decoder cannot
    read): a stable sort of the positions by kind and a groupby, both in C, where a loop
    over the entries cost 1 us each."""
    kinds = ["" if shape is None else shape.kind for shape in shapes]
    order = sorted(range(len(kinds)), key=kinds.__getitem__)
    return {kind: [start + i for i in group] for kind, group in
            itertools.groupby(order, key=kinds.__getitem__)}


def _lengths(raws: list[msgspec.Raw]) -> list[int]:
    """``_items`` of each: at once when every one is a small array (a fixarray's header
    byte holds its length), as a page's links and a session's chunk of documents are."""
    try:
        views: Any = map(memoryview, raws)  # (a Raw is a buffer)
        heads: list[int] = list(map(operator.itemgetter(0), views))
    except IndexError:  # an empty one: no array at all
        return [_items(raw) for raw in raws]
    if all(0x90 <= head <= 0x9F for head in heads):
        return [head & 0x0F for head in heads]
    return [_items(raw) for raw in raws]


def _shape(payload: bytes) -> _Shape | None:
    try:
        return _SHAPE.decode(payload)
    except msgspec.DecodeError:
        return None


def check_counts(conn: apsw.Connection, found: Findings, shape: LedgerShape) -> int:
    """Each table's rows against the entries of its kind (how many; the entry of the last
    one written); sessions and runs field by field; what only the strict decoder can say
    of an entry, said. Returns the rows counted."""
    n = 0
    tables = {name for (name,) in conn.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table'")}
    for kind, (table, field) in _COUNTED.items():
        if table not in tables:  # a store opened read-only may predate it (render: 007)
            continue
        have = [conn.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0],
                _last_entry(conn, table)]
        n += have[0]
        if have != shape.want[table]:
            _locate(conn, found, kind, table, field, shape.entries)
    for index in sorted(shape.strict):
        check_entry(found, conn, "", index, _payload(conn, index), [])
    facts = [(index, _payload(conn, index)) for index in sorted(shape.facts)]  # log order
    check_sessions_runs(found, conn, [(i, p) for i, p in facts if p is not None])
    return n + sum(conn.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
                   for table in ("crawl_session", "crawl_run"))


def _last_entry(conn: apsw.Connection, table: str) -> int:
    """The log index of the row written last (the writer writes in log order), -1 if none:
    by its key, the last row of the table's B-tree; a table without one, the highest."""
    key = _KEYS[table]
    sql = (f"SELECT max(log_index) FROM {table}" if key is None else
           f"SELECT log_index FROM {table} ORDER BY {key} DESC LIMIT 1")
    rows = conn.execute(sql).fetchall()
    return -1 if not rows or rows[0][0] is None else rows[0][0]


def _locate(conn: apsw.Connection, found: Findings, kind: str, table: str,
            field: str | None, size: int) -> None:
    """The entries of ``kind`` whose rows in ``table`` differ in number from what each
    says, each checked as the default checks it: the rows grouped by log_index, the
    entries of the kind read again (a second pass, only for a table that disagreed)."""
    key = _KEYS[table]
    span = "0, 0" if key is None else f"min({key}), max({key})"
    have: dict[int, tuple[int, int, int]] = {
        index: (count, first, last) for index, count, first, last in conn.execute(
            f"SELECT log_index, count(*), {span} FROM {table} GROUP BY log_index")}
    want: dict[int, int] = {}
    for index, payload in conn.execute("SELECT log_index, payload FROM ingest_ledger"):
        shape = _shape(payload)
        if shape is not None and shape.kind == kind:  # (None: the strict decoder's)
            want[index] = 1 if field is None else _items(getattr(shape, field))
    for index in sorted(have.keys() | want.keys()):
        count, first, last = have.get(index, (0, 0, 0))
        if count == want.get(index, 0):
            continue
        rows = rows_at(conn, kind, index, first, last) if count else []
        payload = _payload(conn, index)
        what = ("beyond the end of the ledger" if index >= size else "no ledger entry")
        check_entry(found, conn, kind, index, payload, rows, what)


def _payload(conn: apsw.Connection, index: int) -> bytes | None:
    rows = conn.execute("SELECT payload FROM ingest_ledger WHERE log_index = ?",
                        (index,)).fetchall()
    return rows[0][0] if rows else None


# A row's key as a pack index sorts it (``packdigests.sealed_key``): its namespace,
# zero-padded to 32 bytes, then its digest's bytes (NULL for a digest that is not hex).
_SEALED_KEY = ("CAST(CAST(namespace AS BLOB) || zeroblob(32 - length(namespace)) || "
               "unhex(digest) AS BLOB)")


def check_payloads(store: Store, conn: apsw.Connection, found: Findings, max_id: int) -> int:
    """Every artifact row's payload present with its size: the rows against the packs'
    listing at once (each pack looked at once, ``PackIndex.listing``), or, for payloads
    kept otherwise, each checked as the default checks it. A row the listing does not
    settle (absent, of another size, listed with two sizes: which one a read finds is
    the lookup's) is checked as the default checks it. Returns the rows checked."""
    artifacts: Any = store.artifacts
    listing = artifacts.listing() if isinstance(artifacts, PackIndex) else None
    if listing is None:
        return check_artifacts(store, conn, found, max_id, False)
    stored, differ = listing
    with store.errors():
        rows = dict(conn.execute(f"SELECT {_SEALED_KEY}, size FROM artifact "
                                 "WHERE artifact_id <= ?", (max_id,)).fetchall())
    if rows.items() <= stored.items() and not differ:
        return len(rows)
    unsettled = {key for key, size in rows.items() if stored.get(key) != size} | differ
    with store.errors():
        page = [row[1:] for row in conn.execute(
            f"SELECT {_SEALED_KEY}, artifact_id, namespace, digest, size FROM artifact "
            "WHERE artifact_id <= ? ORDER BY artifact_id", (max_id,)) if row[0] in unsettled]
    for at in range(0, len(page), 1000):
        check_page(store, page[at:at + 1000], found, False)
    return len(rows)
