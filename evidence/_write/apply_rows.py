"""What every message kind's applier writes with: the statements per dialect (``RowInsert``,
``Statements``), the refusal (``Rejected``), the caches of row ids that survive only what
commits (``Interner``), and ``ApplyContext``, one batch's state inside its transaction
(interned URLs and artifacts, open runs, attempts, rows held to be written many per
statement) with the lookups the appliers share.

The appliers themselves are per table family (``apply_sessions``, ``apply_fetches``,
``apply_frontier``); ``apply.py`` is what the writer and verify call. Only the writer
(and verify's replay of the ledger into a scratch database) writes through these.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from .._errors import ArtifactCorruptError, ArtifactMissingError, URLError
from .._model.messages import DnsAnswer, format_time
from .._model.refs import ArtifactRef
from .._model.urls import NORMALIZER_VERSION, normalize_url
from .._store.backend import Connection, Dialect

if TYPE_CHECKING:
    from .._store.db import Store

__all__ = ["INTERNER_LIMIT", "JSON", "ApplyContext", "Interner", "Rejected", "RowInsert",
           "Statements", "What", "statements", "what_text"]

JSON = msgspec.json.Encoder(order="deterministic")  # the JSON columns' one encoding

_ATTEMPT_COLUMNS = (
    "attempt_id, run_id, url_id, url, sequence, method, started_at, elapsed_ms, outcome, "
    "http_status, request_headers_id, response_headers_id, body_id, body_truncated, "
    "content_type, error, log_index, capture, content_id, transfer_coding, content_coding, "
    "content_truncated, surplus_id, text_encoding, text_encoding_source, render_seq, "
    "remote_address, remote_port, local_address, local_port, connection_reused, "
    "resolution_seq, tls_version, tls_cipher, tls_sni, tls_alpn, tls_chain_id, tls_verified, "
    "protocol, frames_id, request_secrets_id")
_ATTEMPT_WIDTH = _ATTEMPT_COLUMNS.count(",") + 1


class RowInsert:
    """One INSERT for many rows: groups of ``WIDE`` rows through a multi-row ``VALUES``
    statement, the rest through statements of 16, 8, 4, 2 and 1 rows (the binary digits
    of what remains: at most 5 more executions; each statement text is prepared once).

    A statement execution has a fixed cost beyond its rows: reset, the VDBE set-up, an
    ephemeral index for each ``CHECK (x IN (...))`` of the table (discovery_edge and
    fetch_attempt have one), built once per execution, and in a crawl a hand-over of the
    GIL (apsw releases it for every step; the event loop holds it meanwhile). 32 rows per
    execution cut the cost of an edge by about a quarter (benchmarks.md, "Third round");
    the smaller groups do it for the few rows of a batch's ledger, edges and attempts and
    of a page's frontier update (benchmarks.md, "The commit thread on a crawl's
    messages"). Rows go in in order, each with the statement's conflict clause, so the
    result is that of inserting them one by one.
    """

    WIDE = 32

    def __init__(self, head: str, columns: int, tail: str, *, dialect: Dialect) -> None:
        one = dialect.values(columns)
        # A statement of each power of two up to WIDE rows: 1, 2, 4, 8, 16, 32.
        self._sized = {1 << k: f"{head} VALUES {', '.join([one] * (1 << k))} {tail}"
                       for k in range(self.WIDE.bit_length())}
        self.single, self.wide = self._sized[1], self._sized[self.WIDE]

    def write(self, cursor: Any, rows: Sequence[tuple[object, ...]]) -> None:
        wide = self.WIDE
        full = len(rows) - len(rows) % wide
        flat = itertools.chain.from_iterable
        if full:
            cursor.executemany(self.wide, [tuple(flat(rows[i:i + wide]))
                                           for i in range(0, full, wide)])
        start, left = full, len(rows) - full
        width = wide // 2
        while left:
            if left >= width:
                cursor.execute(self._sized[width], tuple(flat(rows[start:start + width])))
                start += width
                left -= width
            width //= 2


class Statements:
    """The write path's hot statements, spelled in one backend's dialect (built once per
    dialect, ``statements``: apsw caches prepared statements by their text).

    An INSERT ... ON CONFLICT DO NOTHING followed by changes() and last_insert_rowid() (two
    C calls) replaces RETURNING, which makes SQLite build an ephemeral table per execution.
    """

    def __init__(self, d: Dialect) -> None:
        p = d.param
        self.encode_list = d.encode_list
        returning = d.returning
        self.url_insert = (f"INSERT INTO url_identity (normalizer_version, fetch_key) VALUES "
                           f"{d.values(2)} ON CONFLICT (normalizer_version, fetch_key) DO NOTHING"
                           + (" RETURNING url_id" if returning else ""))
        self.url_select = (f"SELECT url_id FROM url_identity WHERE normalizer_version = {p} "
                           f"AND fetch_key = {p}")
        # Many keys at once: the IN list probes the unique index once per key (written as a
        # join with json_each, the planner put url_identity outside, searched by version
        # only: a scan).
        self.urls_select = (f"SELECT fetch_key, url_id FROM url_identity WHERE "
                            f"normalizer_version = {p} AND {d.in_list('fetch_key')}")
        self.attempt_insert = (f"INSERT INTO fetch_attempt ({_ATTEMPT_COLUMNS}) VALUES "
                               f"{d.values(_ATTEMPT_WIDTH)} ON CONFLICT (attempt_id) DO NOTHING"
                               + (" RETURNING attempt_seq" if returning else ""))
        # Rule 5: a late or redelivered attempt never moves the projection backward.
        self.current = RowInsert(
            "INSERT INTO url_current (run_id, url_id, sequence, attempt_seq)", 4,
            "ON CONFLICT (run_id, url_id) DO UPDATE SET sequence = excluded.sequence, "
            "attempt_seq = excluded.attempt_seq WHERE excluded.sequence > url_current.sequence",
            dialect=d)
        self.attempts = RowInsert(f"INSERT INTO fetch_attempt (attempt_seq, {_ATTEMPT_COLUMNS})",
                                  _ATTEMPT_WIDTH + 1, "ON CONFLICT (attempt_id) DO NOTHING",
                                  dialect=d)
        self.artifacts_select = (f"SELECT digest, artifact_id, size FROM artifact WHERE "
                                 f"namespace = {p} AND {d.in_list('digest')}")
        # No conflict clause: intern_artifacts inserts only payloads it has just found absent.
        self.artifacts = RowInsert("INSERT INTO artifact (artifact_id, namespace, digest, size)",
                                   4, "", dialect=d)
        # No conflict clause: intern_urls inserts only keys it has just found absent.
        self.urls = RowInsert("INSERT INTO url_identity (url_id, normalizer_version, fetch_key)",
                              3, "", dialect=d)
        edge_columns = ("run_id, source_attempt_seq, source_artifact_id, position, "
                        "observed_ref, target_url_id, edge_kind, tag, attr, rel, log_index, "
                        "render_seq")
        edge_conflict = ("ON CONFLICT (run_id, source_artifact_id, position, observed_ref) "
                         "DO NOTHING")
        self.edges = RowInsert(f"INSERT INTO discovery_edge ({edge_columns})", 12,
                               edge_conflict, dialect=d)
        # The deferred path numbers a batch's edges itself, as the rowid would (a server
        # database gives the number by a trigger otherwise: 6x the cost of an edge row).
        self.edges_numbered = RowInsert(
            f"INSERT INTO discovery_edge (edge_id, {edge_columns})", 13, edge_conflict,
            dialect=d)
        self.frontier_queue = RowInsert(
            "INSERT INTO frontier (session_id, url_id, url, state, depth, via, "
            "source_attempt_id, reason, updated_log_index)", 9,
            "ON CONFLICT (session_id, url_id) DO UPDATE SET state = 'queued', "
            "depth = excluded.depth, reason = '', updated_log_index = excluded.updated_log_index "
            "WHERE frontier.state = 'skipped' AND frontier.reason LIKE 'depth%' "
            "AND excluded.state = 'queued' AND excluded.depth < frontier.depth", dialect=d)
        # The ledger insert is also the dedup lookup (the writer's): nothing inserted, a
        # redelivery.
        self.ledger = RowInsert(
            "INSERT INTO ingest_ledger (log_index, message_id, kind, payload_hash, leaf_hash, "
            "payload, batch_seq, received_at, submitter)", 9, "ON CONFLICT (message_id) DO NOTHING",
            dialect=d)


@functools.cache
def statements(dialect: Dialect) -> Statements:
    return Statements(dialect)


class Rejected(Exception):
    """The message is not valid for the store. ``conflict``: it contradicts recorded evidence.

    ``duplicate``: it restates recorded evidence under a new message id; nothing is written.
    """

    def __init__(self, reason: str, *, conflict: bool = False, duplicate: bool = False) -> None:
        super().__init__(reason)
        self.conflict = conflict
        self.duplicate = duplicate


What = str | tuple[object, ...]


def what_text(what: What) -> str:
    """What a problem concerns, built only when there is a problem: the hot paths pass a
    tuple of parts (joined by spaces) instead of formatting a string per URL or artifact."""
    if isinstance(what, str):
        return what
    return " ".join(what_text(part) if isinstance(part, tuple) else str(part) for part in what)


INTERNER_LIMIT = 50_000  # entries the writer's caches of row ids hold (Interner)


class Interner:
    """Caches of row ids (urls, artifacts, runs, attempts) and of runs' sessions that
    survive only what commits.

    Entries a message adds are tentative until its savepoint is released, and a batch's
    until its COMMIT succeeds; a rollback at either level forgets them (each level keeps an
    undo list of the keys it added), so a cached id always names a committed row. Bounded:
    cleared when it grows past ``limit`` entries. A crawl adds about five a page (its new
    URLs, three payloads, the attempt): under tracemalloc they were among the largest
    growths of a crawl's heap (~0.4 KB a page), so at 500,000 the caches grew for the first
    ~100,000 pages; at 50,000 they are full within ~10,000 pages and then stay there, and a
    miss after a clear costs one indexed SELECT (docs/benchmarks.md, "Writes and memory
    over a crawl").
    """

    KINDS = ("url", "artifact", "run", "attempt", "session", "dns")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = INTERNER_LIMIT if limit is None else limit
        self.caches: dict[str, dict[Any, Any]] = {k: {} for k in self.KINDS}
        self._message: list[tuple[dict[Any, Any], object]] = []  # by the current message
        self._batch: list[tuple[dict[Any, Any], object]] = []  # added by released messages

    def put(self, kind: str, key: object, value: object) -> None:
        cache = self.caches[kind]
        if key not in cache:  # a key already cached names a row that is already there
            cache[key] = value
            self._message.append((cache, key))

    def message_done(self, keep: bool) -> None:
        if keep:
            self._batch.extend(self._message)
        else:
            self._forget(self._message)
        self._message.clear()

    def batch_done(self, committed: bool) -> None:
        if not committed:
            self._forget(self._message)
            self._forget(self._batch)
        elif sum(map(len, self.caches.values())) > self.limit:
            for cache in self.caches.values():
                cache.clear()
        self._message.clear()
        self._batch.clear()

    @staticmethod
    def _forget(added: list[tuple[dict[Any, Any], object]]) -> None:
        for cache, key in added:
            cache.pop(key, None)


class ApplyContext:
    """One batch's state while its messages are applied, inside its transaction (made per
    batch: the writer's connection can be replaced between batches): what the appliers of
    every kind share. ``apply.Applier`` adds the dispatch to them."""

    __slots__ = ("_artifacts", "_attempt_rows", "_attempts", "_edges", "_next_attempt_seq",
                 "_projection", "_runs", "_sessions", "_urls", "conn", "cursor", "interner",
                 "keys", "log_index", "new_refs", "sql", "store", "verify_artifacts")

    def __init__(self, conn: Connection, store: Store, interner: Interner, *,
                 verify_artifacts: bool = False, defer: bool = False) -> None:
        self.conn = conn
        self.sql = statements(store.backend.dialect)
        # Payloads this batch references for the first time: the writer has the artifact
        # store make them durable (``sync``) before the COMMIT that references them.
        self.new_refs: list[ArtifactRef] = []
        # One cursor for the hot INSERTs (each runs to completion in one step): a new cursor
        # per statement, which is what Connection.execute makes, costs about 0.5 us.
        self.cursor = conn.cursor()
        self.store = store
        self.interner = interner
        self.verify_artifacts = verify_artifacts
        self.log_index = 0
        self.keys: dict[str, str] = {}
        self._urls = interner.caches["url"]
        self._artifacts = interner.caches["artifact"]
        self._runs = interner.caches["run"]
        self._attempts = interner.caches["attempt"]
        self._sessions = interner.caches["session"]
        # With ``defer``, fetch attempts, discovery edges and url_current upserts are held
        # until ``flush``, then written in order, many rows per statement: the tables end
        # exactly as if each message had written its own. An attempt gets its attempt_seq
        # (its rowid) when it is applied: the one SQLite would give it, one more than the
        # largest. Held attempts are written before any message that could reference one
        # by a foreign key other than through a held edge or upsert. Without ``defer``
        # (None), each message writes its own rows.
        self._attempt_rows: list[tuple[object, ...]] | None = [] if defer else None
        self._next_attempt_seq: int | None = None
        self._edges: list[tuple[object, ...]] | None = [] if defer else None
        self._projection: list[tuple[object, ...]] | None = [] if defer else None

    def add_attempt(self, row: tuple[object, ...], what: What) -> int:
        """Append one fetch_attempt row (``_ATTEMPT_COLUMNS``); return its attempt_seq."""
        if self._attempt_rows is None:
            self.cursor.execute(self.sql.attempt_insert, row)
            if not self.conn.changes():
                raise Rejected(f"{what_text(what)} is already recorded by another message",
                               conflict=True)
            return self.conn.last_insert_rowid()  # attempt_seq is the rowid
        if self._next_attempt_seq is None:
            self._next_attempt_seq = self.next_id("attempt_seq", "fetch_attempt")
        attempt_seq = self._next_attempt_seq
        self._next_attempt_seq += 1
        self._attempt_rows.append((attempt_seq, *row))
        return attempt_seq

    def _write_attempts(self) -> None:
        rows = self._attempt_rows
        assert rows is not None
        before = self.conn.total_changes()
        self.sql.attempts.write(self.cursor, rows)
        if self.conn.total_changes() - before != len(rows):
            # Which one is known only to the isolated path, which this sends the batch to.
            raise Rejected("an attempt of this batch is already recorded", conflict=True)
        rows.clear()

    def project(self, row: tuple[object, ...]) -> None:
        """Advance url_current for one attempt: (run_id, url_id, sequence, attempt_seq)."""
        if self._projection is None:
            self.sql.current.write(self.cursor, [row])
        else:
            self._projection.append(row)

    def add_edges(self, rows: Sequence[tuple[object, ...]]) -> None:
        if self._edges is None:
            self.sql.edges.write(self.cursor, rows)
        else:
            self._edges.extend(rows)

    def flush(self) -> None:
        """Write the deferred rows (``defer``), in the order the messages made them.

        The projection is written one row per (run, URL): the one with the highest
        sequence, which is where upserting them one by one in order leaves url_current
        (a lower or equal sequence never moves it). PostgreSQL refuses an upsert that
        touches one row twice in one statement; this never asks it to.
        """
        if self._attempt_rows:
            self._write_attempts()
        if self._edges:
            self._write_edges()
        if self._projection:
            best: dict[tuple[object, object], tuple[object, ...]] = {}
            for row in self._projection:
                key = (row[0], row[1])
                kept = best.get(key)
                if kept is None or row[2] > kept[2]:  # type: ignore[operator]
                    best[key] = row
            self._projection[:] = best.values()
        if self._projection:
            self.sql.current.write(self.cursor, self._projection)
            self._projection.clear()

    def _write_edges(self) -> None:
        """The batch's edges, numbered from one more than the largest edge_id, in order: the
        numbers the rowid gives them one by one. A repeat of an edge of the batch (same run,
        source, node and reference) is left out, as the conflict clause would skip it; one
        already in the store would be skipped without taking its number: the batch then
        goes to the isolated path, where the database numbers them."""
        rows = self._edges
        assert rows is not None
        seen: set[tuple[object, ...]] = set()
        unique = []
        for row in rows:  # the first of each repeat, in order
            key = (row[0], row[2], row[3], row[4])
            if key not in seen:
                seen.add(key)
                unique.append(row)
        numbered = [(edge_id, *row) for edge_id, row in
                    enumerate(unique, self.next_id("edge_id", "discovery_edge"))]
        before = self.conn.total_changes()
        self.sql.edges_numbered.write(self.cursor, numbered)
        if self.conn.total_changes() - before != len(numbered):
            raise Rejected("an edge of this batch is already recorded")
        rows.clear()

    def one(self, sql: str, args: tuple[object, ...]) -> tuple[Any, ...] | None:
        for row in self.conn.execute(sql, args):
            return tuple(row)
        return None

    def url_id(self, url: str, what: What) -> int:
        """Intern a URL's fetch key under the current normalizer version."""
        key = self.keys.get(url)
        if key is None:
            try:
                key = normalize_url(url)
            except URLError as exc:
                raise Rejected(f"{what_text(what)}: {exc}") from exc
        url_id: int | None = self._urls.get(key)
        if url_id is not None:
            return url_id
        conn = self.conn
        self.cursor.execute(self.sql.url_insert, (NORMALIZER_VERSION, key))
        if conn.changes():
            url_id = conn.last_insert_rowid()
        else:  # known to the store, not (or no longer) to the cache
            url_id = conn.execute(self.sql.url_select,
                                  (NORMALIZER_VERSION, key)).fetchall()[0][0]
        self.interner.put("url", key, url_id)
        return url_id

    def next_id(self, column: str, table: str) -> int:
        """The id one more than the largest in ``table`` (what the store's own numbering
        gives the next row inserted without one: SQLite's rowid, PostgreSQL's trigger)."""
        last = self.conn.execute(f"SELECT max({column}) FROM {table}").fetchall()[0][0]
        return int(last or 0) + 1

    def intern_urls(self, keys: Iterable[str]) -> None:
        """Intern many fetch keys with a few statements instead of one or two per key.

        For a batch applied without savepoints, before its messages: keys the cache lacks
        are looked up at once, and those the store lacks are inserted at once, in the order
        given, with the ids SQLite's own rowid choice gives them one at a time (one more
        than the largest). Given the keys in the order the messages would intern them,
        every id is the one applying the messages alone would give.
        """
        cached = self._urls
        missing = list(dict.fromkeys(key for key in keys if key not in cached))
        if not missing:
            return
        put = self.interner.put
        found = dict(self.conn.execute(self.sql.urls_select,
                                       (NORMALIZER_VERSION, self.sql.encode_list(missing))))
        for key, url_id in found.items():
            put("url", key, url_id)
        new = [key for key in missing if key not in found]
        if not new:
            return
        rows = [(url_id, NORMALIZER_VERSION, key)
                for url_id, key in enumerate(new, self.next_id("url_id", "url_identity"))]
        self.sql.urls.write(self.cursor, rows)
        for url_id, _, key in rows:
            put("url", key, url_id)

    def intern_artifacts(self, refs: Iterable[ArtifactRef]) -> None:
        """Intern many artifacts with a few statements instead of two per new payload.

        For a batch applied without savepoints, before its messages, as ``intern_urls``:
        refs the cache lacks are looked up at once (one statement per namespace), and those
        the store lacks and the artifact store holds are inserted at once, in the order
        given, with the ids one at a time would give them (one more than the largest).
        Given the refs in the order the messages would intern them (``artifact_refs``),
        every id is the one applying the messages alone would give. A ref whose payload is
        missing is left to ``artifact_id``, which rejects its message; with
        ``verify_artifacts`` every ref is left to it (each payload is re-hashed there).
        """
        if self.verify_artifacts:
            return
        cached = self._artifacts
        missing = list(dict.fromkeys(
            ref for ref in refs if (ref.namespace, ref.digest) not in cached))
        if not missing:
            return
        put = self.interner.put
        found: dict[tuple[str, str], tuple[int, int]] = {}
        for namespace in dict.fromkeys(ref.namespace for ref in missing):
            digests = [ref.digest for ref in missing if ref.namespace == namespace]
            for digest, artifact_id, size in self.conn.execute(
                    self.sql.artifacts_select, (namespace, self.sql.encode_list(digests))):
                found[(namespace, digest)] = (artifact_id, size)
        for key, row in found.items():
            put("artifact", key, row)
        # One look per pack for the lot; a payload not there is left to artifact_id, which
        # rejects the message that names it.
        unknown = [ref for ref in missing if (ref.namespace, ref.digest) not in found]
        problems = self.store.artifacts.check_each(unknown)
        new: list[ArtifactRef] = []
        keys: set[tuple[str, str]] = set()
        for ref, problem in zip(unknown, problems, strict=True):
            key = (ref.namespace, ref.digest)
            if problem is not None or key in keys:  # a second size of one payload:
                continue                            # artifact_id's
            keys.add(key)
            new.append(ref)
        if not new:
            return
        rows = [(artifact_id, ref.namespace, ref.digest, ref.size)
                for artifact_id, ref in enumerate(new, self.next_id("artifact_id", "artifact"))]
        self.sql.artifacts.write(self.cursor, rows)
        self.new_refs.extend(new)
        for artifact_id, namespace, digest, size in rows:
            put("artifact", (namespace, digest), (artifact_id, size))

    def artifact_id(self, ref: ArtifactRef, what: What) -> int:
        """Intern an artifact row, after checking its payload is durably on disk.

        An artifact that already has a row is referenced by committed evidence, so its file
        is there (reclaim never deletes a referenced file): only a new one is stat'ed.
        """
        key = (ref.namespace, ref.digest)
        row = self._artifacts.get(key) or self.one(
            "SELECT artifact_id, size FROM artifact WHERE namespace = ? AND digest = ?", key)
        if row is not None and row[1] != ref.size:
            raise Rejected(f"{what_text(what)}: artifact {ref.digest} is recorded with size "
                           f"{row[1]}, the message says {ref.size}", conflict=True)
        if row is None or self.verify_artifacts:
            try:
                if self.verify_artifacts:
                    self.store.artifacts.verify(ref)
                else:
                    self.store.artifacts.check(ref)
            except (ArtifactMissingError, ArtifactCorruptError) as exc:
                raise Rejected(f"{what_text(what)}: {exc}") from exc
            # Any other ArtifactError is the artifact store failing to answer (an object
            # store unreachable, an I/O error), not the message's fault: it fails the
            # batch (the writer's CommitError; nothing written, redeliver), never rejects.
        if row is not None:
            self.interner.put("artifact", key, row)
            known: int = row[0]
            return known
        self.new_refs.append(ref)
        artifact_id = self.conn.execute(
            "INSERT INTO artifact (namespace, digest, size) VALUES (?, ?, ?) "
            "RETURNING artifact_id", (ref.namespace, ref.digest, ref.size)).fetchall()[0][0]
        self.interner.put("artifact", key, (artifact_id, ref.size))
        new: int = artifact_id
        return new

    def session_of(self, run_id: str) -> str | None:
        """The session of a recorded run (None if the run is not recorded); a run's session
        never changes, so it is cached."""
        session = self._sessions.get(run_id)
        if session is None:
            row = self.one("SELECT session_id FROM crawl_run WHERE run_id = ?", (run_id,))
            if row is None:
                return None
            session = row[0]
            self.interner.put("session", run_id, session)
        return str(session)

    def open_run(self, run_id: str, what: What) -> None:
        if run_id in self._runs:
            return
        if self.one("SELECT 1 FROM crawl_run WHERE run_id = ?", (run_id,)) is None:
            raise Rejected(f"{what_text(what)}: run {run_id} is not recorded (send run_started "
                           "first)")
        self.interner.put("run", run_id, True)

    def render(self, render_id: str, run_id: str, what: What) -> tuple[int, int, str]:
        """(render_seq, source attempt_seq, source attempt_id) of a render of ``run_id``."""
        row = self.one("SELECT r.render_seq, r.run_id, r.source_attempt_seq, f.attempt_id "
                       "FROM render r JOIN fetch_attempt f ON f.attempt_seq = "
                       "r.source_attempt_seq WHERE r.render_id = ?", (render_id,))
        if row is None:
            raise Rejected(f"{what_text(what)}: render {render_id} is not recorded (its render "
                           "message comes first in the group)")
        if row[1] != run_id:
            raise Rejected(f"{what_text(what)}: render {render_id} belongs to run {row[1]}, "
                           f"not {run_id}")
        found: tuple[int, int, str] = (row[0], row[2], row[3])
        return found

    def resolution_seq(self, answer: DnsAnswer, what: What) -> int:
        """The dns_resolution row of ``answer``, written by the first attempt that carries
        it; a later copy must say the same (another answer under its id is refused)."""
        row = (answer.host, answer.port, format_time(answer.resolved_at), answer.source,
               JSON.encode(answer.addresses).decode(), answer.ttl)
        known = self.interner.caches["dns"].get(answer.resolution_id)
        if known is None:
            self.conn.execute(
                "INSERT INTO dns_resolution (resolution_id, host, port, resolved_at, source, "
                "addresses, ttl) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (resolution_id) DO NOTHING", (answer.resolution_id, *row))
            found = self.one("SELECT resolution_seq, host, port, resolved_at, source, "
                             "addresses, ttl FROM dns_resolution WHERE resolution_id = ?",
                             (answer.resolution_id,))
            assert found is not None
            known = (found[0], tuple(found[1:]))
            self.interner.put("dns", answer.resolution_id, known)
        if known[1] != row:
            raise Rejected(f"{what_text(what)}: resolution {answer.resolution_id} is recorded "
                           "with another answer", conflict=True)
        seq: int = known[0]
        return seq

    def attempt_seq(self, attempt_id: str, run_id: str, what: What) -> int:
        row = self._attempts.get(attempt_id) or self.one(
            "SELECT attempt_seq, run_id FROM fetch_attempt WHERE attempt_id = ?", (attempt_id,))
        if row is None:
            raise Rejected(f"{what_text(what)}: attempt {attempt_id} is not recorded")
        if row[1] != run_id:
            raise Rejected(f"{what_text(what)}: attempt {attempt_id} belongs to run {row[1]}, "
                           f"not {run_id}")
        seq: int = row[0]
        return seq
