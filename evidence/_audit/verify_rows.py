"""Every evidence row against the ledger entry that wrote it, for verify.

Each ledger entry is decoded (its payload hash, message id and kind checked) and the rows
it produced are re-derived from the message and compared field by field: an attempt, its
links, its rule verdicts, a render, a session's documents, sessions and runs. A row edited
or deleted with the append-only triggers dropped is named and located here (rows are not
hashed; only ledger payloads are). The same pass applies frontier and host entries to the
replayed working state (``verify_state``).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterator, Mapping

import apsw
import msgspec

from .._errors import MessageError, URLError
from .._model.messages import (
    Discovery,
    DocumentRecord,
    FetchAttempt,
    Message,
    ObservedRef,
    Render,
    RuleEvaluated,
    RunEnded,
    RunStarted,
    SessionDocuments,
    SessionEnded,
    SessionStarted,
    decode_message,
    format_time,
    payload_hash,
)
from .._model.refs import ArtifactRef
from .._model.urls import NORMALIZER_VERSION, key_and_host
from .verify_findings import Findings
from .verify_state import WorkingState

__all__ = ["check_entry", "check_rows", "check_sessions_runs", "rows_at"]

_JSON = msgspec.json.Encoder(order="deterministic")  # as _apply stores config and details


# --- rows against the ledger -----------------------------------------------------------
#
# Every evidence row was written by exactly one ledger entry, from its decoded message. So
# each row can be re-derived from the ledger and compared field by field: this locates a
# row edited or deleted with the append-only triggers dropped, which no hash would (rows
# are not hashed; only ledger payloads are). Tables with a log_index column are merged with
# the ledger in log order; sessions and runs are keyed by their ids.

_LEDGER_SQL = ("SELECT log_index, message_id, kind, payload_hash, payload FROM ingest_ledger "
               "ORDER BY log_index")
_ATTEMPT_SQL = """
SELECT f.log_index, f.attempt_seq, f.attempt_id, f.run_id, f.url, f.sequence, f.method,
       f.started_at, f.elapsed_ms, f.outcome, f.http_status,
       f.request_headers_id, q.namespace, q.digest, q.size,
       f.response_headers_id, h.namespace, h.digest, h.size,
       f.body_id, b.namespace, b.digest, b.size,
       f.body_truncated, f.content_type, f.error, u.normalizer_version, u.fetch_key,
       f.capture, f.content_id, c.namespace, c.digest, c.size, f.transfer_coding,
       f.content_coding, f.content_truncated, f.surplus_id, s.namespace, s.digest, s.size,
       f.text_encoding, f.text_encoding_source, rr.render_id,
       f.remote_address, f.remote_port, f.local_address, f.local_port, f.connection_reused,
       f.resolution_seq, d.resolution_id, d.host, d.port, d.resolved_at, d.source,
       d.addresses, d.ttl, f.tls_version, f.tls_cipher, f.tls_sni, f.tls_alpn,
       f.tls_chain_id, t.namespace, t.digest, t.size, f.tls_verified,
       f.protocol, f.frames_id, fr.namespace, fr.digest, fr.size,
       f.request_secrets_id, o.namespace, o.digest, o.size
FROM fetch_attempt f
LEFT JOIN artifact fr ON fr.artifact_id = f.frames_id
LEFT JOIN artifact o ON o.artifact_id = f.request_secrets_id
LEFT JOIN render rr ON rr.render_seq = f.render_seq
LEFT JOIN dns_resolution d ON d.resolution_seq = f.resolution_seq
LEFT JOIN artifact t ON t.artifact_id = f.tls_chain_id
LEFT JOIN artifact q ON q.artifact_id = f.request_headers_id
LEFT JOIN artifact h ON h.artifact_id = f.response_headers_id
LEFT JOIN artifact b ON b.artifact_id = f.body_id
LEFT JOIN artifact c ON c.artifact_id = f.content_id
LEFT JOIN artifact s ON s.artifact_id = f.surplus_id
LEFT JOIN url_identity u ON u.url_id = f.url_id
ORDER BY f.log_index, f.attempt_seq
"""
_EDGE_SQL = """
SELECT e.log_index, e.edge_id, e.run_id, a.attempt_id, e.source_attempt_seq,
       e.source_artifact_id, s.namespace, s.digest, s.size, e.position, e.observed_ref,
       u.normalizer_version, u.fetch_key, e.edge_kind, e.tag, e.attr, e.rel, rr.render_id
FROM discovery_edge e
LEFT JOIN render rr ON rr.render_seq = e.render_seq
LEFT JOIN fetch_attempt a ON a.attempt_seq = e.source_attempt_seq
LEFT JOIN artifact s ON s.artifact_id = e.source_artifact_id
LEFT JOIN url_identity u ON u.url_id = e.target_url_id
ORDER BY e.log_index, e.edge_id
"""
# The writer appends edges in log order: edge_id order is (log_index, edge_id) order when
# log_index never decreases along it, and then SQLite need not sort the edges (0.7 s of
# CPU for 400,000 of them, where looking at their log_index column costs 0.3).
_EDGE_SQL_BY_ID = _EDGE_SQL.replace("ORDER BY e.log_index, e.edge_id", "ORDER BY e.edge_id")
_EDGE_ORDER_SQL = "SELECT log_index FROM discovery_edge ORDER BY edge_id"
_RULE_SQL = """
SELECT r.log_index, r.evaluation_id, r.run_id, u.normalizer_version, u.fetch_key, r.rule_id,
       r.rule_version, r.input_hash, r.verdict, r.attempt_seq, a.attempt_id, r.evaluated_at,
       r.details
FROM rule_evaluation r
LEFT JOIN url_identity u ON u.url_id = r.url_id
LEFT JOIN fetch_attempt a ON a.attempt_seq = r.attempt_seq
ORDER BY r.log_index, r.evaluation_id
"""
_DOCUMENT_SQL = """
SELECT d.log_index, d.session_id || '/' || d.url_id, d.session_id, u.normalizer_version,
       u.fetch_key, d.url, d.change, d.http_status, d.body_digest, d.attempt_id, d.fetched_at
FROM session_document d
LEFT JOIN url_identity u ON u.url_id = d.url_id
ORDER BY d.log_index, d.session_id, d.url_id
"""
_RENDER_SQL = """
SELECT r.log_index, r.render_seq, r.render_id, r.run_id, f.attempt_id, r.url, r.started_at,
       r.elapsed_ms, r.outcome, r.error, r.browser, r.viewport_width, r.viewport_height,
       r.settle, r.final_url, r.title, r.dom_id, d.namespace, d.digest, d.size,
       r.screenshot_id, s.namespace, s.digest, s.size, r.screenshot_truncated,
       r.mhtml_id, h.namespace, h.digest, h.size, r.requests, r.not_recorded,
       (SELECT count(*) FROM fetch_attempt a WHERE a.render_seq = r.render_seq),
       r.behaviors_id, b.namespace, b.digest, b.size
FROM render r
LEFT JOIN fetch_attempt f ON f.attempt_seq = r.source_attempt_seq
LEFT JOIN artifact d ON d.artifact_id = r.dom_id
LEFT JOIN artifact s ON s.artifact_id = r.screenshot_id
LEFT JOIN artifact h ON h.artifact_id = r.mhtml_id
LEFT JOIN artifact b ON b.artifact_id = r.behaviors_id
ORDER BY r.log_index, r.render_seq
"""
# ledger kind -> the table whose rows carry its log_index
_LOGGED_TABLES = {"fetch_attempt": "fetch_attempt", "discovery": "discovery_edge",
                  "rule_evaluated": "rule_evaluation", "render": "render",
                  "session_documents": "session_document"}


_PAST_THE_END = float("inf")


class _Cursor:
    """Rows ordered by log_index, taken up to each ledger index in turn (a merge join).

    ``head`` is the log_index of the next row (infinite when none is left): most ledger
    entries wrote no row of most tables, and comparing ``head`` first skips them without
    a call."""

    def __init__(self, rows: Iterator[tuple]) -> None:
        self._rows = rows
        self._next = next(rows, None)
        self.head = _PAST_THE_END if self._next is None else self._next[0]

    def take(self, index: int) -> tuple[list[tuple], list[tuple]]:
        """(rows with a smaller log_index, rows with exactly ``index``)."""
        before: list[tuple] = []
        at: list[tuple] = []
        row, rows = self._next, self._rows
        while row is not None and row[0] < index:  # the rows come in log_index order
            before.append(row)
            row = next(rows, None)
        while row is not None and row[0] == index:
            at.append(row)
            row = next(rows, None)
        self._next = row
        self.head = _PAST_THE_END if row is None else row[0]
        return before, at

    def rest(self) -> list[tuple]:
        rest = [] if self._next is None else [self._next, *self._rows]
        self._next = None
        self.head = _PAST_THE_END
        return rest


def check_rows(conn: apsw.Connection, found: Findings, state: WorkingState | None) -> int:
    cursors = {"fetch_attempt": _Cursor(conn.execute(_ATTEMPT_SQL)),
               "discovery": _Cursor(conn.execute(_edges_sql(conn))),
               "rule_evaluated": _Cursor(conn.execute(_RULE_SQL)),
               "render": _Cursor(conn.execute(_RENDER_SQL))}
    if conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'session_document'").fetchall():
        cursors["session_documents"] = _Cursor(conn.execute(_DOCUMENT_SQL))
    sessions: dict[str, dict[str, tuple[object, int]]] = {}
    runs: dict[str, dict[str, tuple[object, int]]] = {}
    n = 0
    for index, message_id, kind, stored_hash, payload in conn.execute(_LEDGER_SQL):
        n += 1
        message = _decode_entry(found, index, message_id, kind, stored_hash, payload)
        tag = None if message is None else type(message).__struct_config__.tag
        rows: list[tuple] = []
        for cursor_kind, cursor in cursors.items():
            if cursor.head > index:
                continue  # no row of this table at or before this entry
            before, at = cursor.take(index)
            for row in before:
                _unlogged(found, cursor_kind, row, "no ledger entry")
            if cursor_kind == tag:
                rows = at
            elif message is not None:
                for row in at:
                    _unlogged(found, cursor_kind, row, f"a {tag} entry")
        if message is not None and not _check_written(found, conn, message, index, rows):
            _expect_fact(sessions, runs, message, index)
        if state is not None and message is not None:
            refused = state.apply(message, index)
            if refused is not None:
                found.add("state_replay", f"ledger entry {index} ({tag}) cannot be applied "
                          f"again to the working state it was applied to: {refused}",
                          table="ingest_ledger", log_index=index)
    for cursor_kind, cursor in cursors.items():
        for row in cursor.rest():
            _unlogged(found, cursor_kind, row, "beyond the end of the ledger")
    _check_facts(found, conn, "crawl_session", "session_id", sessions, _SESSION_COLUMNS)
    _check_facts(found, conn, "crawl_run", "run_id", runs, _RUN_COLUMNS)
    return n


_SESSION_COLUMNS = ("session_id", "started_at", "mode", "config", "baseline_session_id",
                    "ended_at", "outcome")
_RUN_COLUMNS = ("run_id", "session_id", "started_at", "program", "host", "pid", "ended_at",
                "outcome", "reason")


def _check_written(found: Findings, conn: apsw.Connection, message: Message, index: int,
                   rows: list[tuple]) -> bool:
    """The rows of a message that writes rows of a logged table, against it (False: a
    message of another kind, nothing checked)."""
    if isinstance(message, FetchAttempt):
        _check_attempt(found, message, index, rows)
    elif isinstance(message, Discovery):
        _check_discovery(found, conn, message, index, rows)
    elif isinstance(message, RuleEvaluated):
        _check_rule(found, message, index, rows)
    elif isinstance(message, SessionDocuments):
        _check_documents(found, conn, message, index, rows)
    elif isinstance(message, Render):
        _check_render(found, message, index, rows)
    else:
        return False
    return True


def _edges_sql(conn: apsw.Connection) -> str:
    """The edges' query: in edge_id order if that is log order already (see above)."""
    indices = conn.execute(_EDGE_ORDER_SQL).fetchall()
    try:
        return _EDGE_SQL_BY_ID if indices == sorted(indices) else _EDGE_SQL
    except TypeError:  # a value of another type (a damaged page): the sorting query
        return _EDGE_SQL


def _decode_entry(found: Findings, index: int, message_id: str, kind: str, stored_hash: str,
                  payload: bytes) -> Message | None:
    where = {"table": "ingest_ledger", "log_index": index}
    if payload_hash(payload) != stored_hash:
        found.add("ledger_entry", f"ledger entry {index}: payload does not hash to its "
                  "payload_hash", **where)
    try:
        message = decode_message(payload)
    except MessageError as exc:
        found.add("ledger_entry", f"ledger entry {index} does not decode: {exc}", **where)
        return None
    tag = type(message).__struct_config__.tag
    if message.message_id != message_id:
        found.add("ledger_entry", f"ledger entry {index}: message_id column is {message_id!r}, "
                  f"its payload says {message.message_id!r}", **where)
    if tag != kind:
        found.add("ledger_entry", f"ledger entry {index}: kind column is {kind!r}, its payload "
                  f"is a {tag}", **where)
    return message


def _unlogged(found: Findings, kind: str, row: tuple, what: str) -> None:
    table = _LOGGED_TABLES[kind]
    found.add("row_unlogged", f"{table} row {row[1]} claims log index {row[0]}, which is "
              f"{what}: no accepted message wrote this row", table=table, row_id=row[1],
              log_index=row[0])


def _compare(found: Findings, table: str, row_id: object, label: str,
             expected: Mapping[str, object], actual: Mapping[str, object],
             log_index: int | dict[str, int]) -> None:
    if expected == actual:  # the common case, compared in C: nothing to locate
        return
    for field, want in expected.items():
        have = actual[field]
        if have != want:
            index = log_index if isinstance(log_index, int) else log_index[field]
            found.add("row_mismatch", f"{table} row {row_id} ({label}): {field} is {have!r}, "
                      f"its ledger entry (log index {index}) says {want!r}",
                      table=table, row_id=row_id, log_index=index)


def _ref_text(ref: ArtifactRef | None) -> str | None:
    return None if ref is None else f"{ref.namespace}/{ref.digest} ({ref.size} bytes)"


def _refs_agree(refs: tuple[ArtifactRef | None, ...], columns: tuple[tuple, ...]) -> bool:
    """Whether each row's artifact (its id and three columns) is the message's: exactly
    when ``_row_ref`` would spell the ``_ref_text`` of each (a size is an integer: its
    column's affinity makes an integral REAL one). One call for all of an attempt's."""
    for ref, (artifact_id, namespace, digest, size) in zip(refs, columns, strict=True):
        if ref is None:
            if artifact_id is not None:
                return False
        elif (artifact_id is None or size.__class__ is not int or ref.size != size
              or ref.digest != digest or ref.namespace != namespace):
            return False
    return True


def _row_ref(artifact_id: int | None, namespace: str | None, digest: str | None,
             size: int | None) -> str | None:
    if artifact_id is None:
        return None
    if namespace is None:
        return f"artifact row {artifact_id} (missing)"
    return f"{namespace}/{digest} ({size} bytes)"


@functools.lru_cache(maxsize=65536)  # link targets repeat (navigation): most are hits
def _fetch_key(url: str) -> str:
    """``normalize_url``, through ``key_and_host``'s fast paths: a fetch key, or one with a
    plain fragment (an in-page link: a tenth of a crawl's links), is known without the
    full parse (tests/test_urls.py checks that it answers as ``normalize_url``)."""
    try:
        return key_and_host(url)[0]
    except URLError:
        return "<not normalizable>"


def _row_key(url: str, version: int | None, key: str | None) -> str | None:
    """The row's fetch key, or the expected one if it was made by another normalizer version."""
    if version is not None and version != NORMALIZER_VERSION:
        return _fetch_key(url)  # cannot recompute an old version's key: nothing to compare
    return key


# An attempt's fields in the order findings name them, and those that hold an artifact
# (compared as its three columns, spelled as ``_ref_text`` in a finding).
_ATTEMPT_FIELDS = (
    "attempt_id", "run_id", "url", "sequence", "method", "started_at", "elapsed_ms", "outcome",
    "http_status", "request_headers", "response_headers", "body", "body_truncated",
    "content_type", "error", "fetch_key", "capture", "content", "transfer_coding",
    "content_coding", "content_truncated", "surplus", "text_encoding", "text_encoding_source",
    "render_id", "protocol", "frames", "request_secrets")
_ATTEMPT_ARTIFACTS = frozenset({"request_headers", "response_headers", "body", "content",
                                "surplus", "frames", "request_secrets"})
_ATTEMPT_SCALARS = operator.itemgetter(*(i for i, name in enumerate(_ATTEMPT_FIELDS)
                                         if name not in _ATTEMPT_ARTIFACTS))
_ATTEMPT_REFS = operator.itemgetter(*(i for i, name in enumerate(_ATTEMPT_FIELDS)
                                      if name in _ATTEMPT_ARTIFACTS))


def _check_attempt(found: Findings, m: FetchAttempt, index: int, rows: list[tuple]) -> None:
    if not rows:
        found.add("row_missing", f"the fetch_attempt row of attempt {m.attempt_id} (log index "
                  f"{index}) is missing", table="fetch_attempt", log_index=index)
        return
    for extra in rows[1:]:
        _unlogged(found, "fetch_attempt", extra, "already the entry of another row")
    (_, seq, attempt_id, run_id, url, sequence, method, started_at, elapsed_ms, outcome, status,
     q_id, q_ns, q_digest, q_size, h_id, h_ns, h_digest, h_size, b_id, b_ns, b_digest, b_size,
     truncated, content_type, error, version, key, capture, c_id, c_ns, c_digest, c_size,
     transfer_coding, content_coding, content_truncated, s_id, s_ns, s_digest, s_size,
     text_encoding, text_source, render_id, *connection, protocol, f_id, f_ns, f_digest,
     f_size, o_id, o_ns, o_digest, o_size) = rows[0]
    want = (m.attempt_id, m.run_id, m.url, m.sequence, m.method, format_time(m.started_at),
            m.elapsed_ms, m.outcome, m.http_status, m.request_headers, m.response_headers,
            m.body, int(m.body_truncated), m.content_type, m.error, _fetch_key(m.url),
            m.capture, m.content, m.transfer_coding, m.content_coding,
            int(m.content_truncated), m.surplus, m.text_encoding, m.text_encoding_source,
            m.render_id, m.protocol, m.frames, m.request_secrets)
    have = (attempt_id, run_id, url, sequence, method, started_at, elapsed_ms, outcome, status,
            (q_id, q_ns, q_digest, q_size), (h_id, h_ns, h_digest, h_size),
            (b_id, b_ns, b_digest, b_size), truncated, content_type, error,
            _row_key(m.url, version, key), capture, (c_id, c_ns, c_digest, c_size),
            transfer_coding, content_coding, content_truncated, (s_id, s_ns, s_digest, s_size),
            text_encoding, text_source, render_id, protocol, (f_id, f_ns, f_digest, f_size),
            (o_id, o_ns, o_digest, o_size))
    # Columns first (most attempts agree), each artifact as its id and three columns: the
    # texts and the fields are spelled only for an attempt that differs. An attempt with no
    # connection agrees with a row whose connection columns are all NULL.
    if (_ATTEMPT_SCALARS(want) == _ATTEMPT_SCALARS(have)
            and _refs_agree(_ATTEMPT_REFS(want), _ATTEMPT_REFS(have))
            and (connection == _NO_CONNECTION if m.connection is None else
                 _connection_actual(connection) == _connection_expected(m))):
        return
    expected: dict[str, object] = {
        name: _ref_text(value) if name in _ATTEMPT_ARTIFACTS else value  # type: ignore[arg-type]
        for name, value in zip(_ATTEMPT_FIELDS, want, strict=True)}
    actual: dict[str, object] = {
        name: _row_ref(*value) if name in _ATTEMPT_ARTIFACTS else value
        for name, value in zip(_ATTEMPT_FIELDS, have, strict=True)}
    expected.update(zip(_CONNECTION_FIELDS, _connection_expected(m), strict=True))
    actual.update(zip(_CONNECTION_FIELDS, _connection_actual(connection), strict=True))
    _compare(found, "fetch_attempt", seq, f"attempt {m.attempt_id}", expected, actual, index)


_CONNECTION_FIELDS = ("remote_address", "remote_port", "local_address", "local_port",
                      "connection_reused", "dns_resolution", "tls_version", "tls_cipher",
                      "tls_sni", "tls_alpn", "tls_chain", "tls_verified")
_NO_CONNECTION = [None] * 22  # the row's connection columns (_ATTEMPT_SQL), all NULL


def _connection_expected(m: FetchAttempt) -> tuple:
    """The connection columns an attempt's message gives (``_apply._connection_row``), its
    resolution's row included: an edited answer shows at every attempt that used it; in
    the order of ``_CONNECTION_FIELDS``."""
    c = m.connection
    if c is None:
        return (None,) * len(_CONNECTION_FIELDS)
    d, t = c.dns, c.tls
    return (
        c.remote_address, c.remote_port, c.local_address, c.local_port, int(c.reused),
        None if d is None else (
            d.resolution_id, d.host, d.port, format_time(d.resolved_at), d.source,
            _JSON.encode(d.addresses).decode(), d.ttl),
        t and t.version, t and t.cipher, t and t.sni, t and t.alpn,
        None if t is None else _ref_text(t.chain), None if t is None else int(t.verified))


def _connection_actual(row: list) -> tuple:
    """What the row's connection columns say, as ``_connection_expected`` spells it."""
    (remote, remote_port, local, local_port, reused, r_seq, r_id, r_host, r_port, r_at,
     r_source, r_addresses, r_ttl, version, cipher, sni, alpn, t_id, t_ns, t_digest, t_size,
     verified) = row
    resolution: object = None
    if r_seq is not None:
        resolution = (f"dns_resolution row {r_seq} (missing)" if r_id is None else
                      (r_id, r_host, r_port, r_at, r_source, r_addresses, r_ttl))
    return (remote, remote_port, local, local_port, reused, resolution, version, cipher, sni,
            alpn, _row_ref(t_id, t_ns, t_digest, t_size), verified)


_EDGE_FIELDS = ("run_id", "source_attempt_id", "source_artifact", "target_fetch_key",
                "edge_kind", "tag", "attr", "rel", "render_id")


def _check_discovery(found: Findings, conn: apsw.Connection, m: Discovery, index: int,
                     rows: list[tuple]) -> None:
    wanted: dict[tuple[int, str], ObservedRef] = {}
    for observed_ref in m.refs:  # ON CONFLICT DO NOTHING: the first equal anchor is kept
        wanted.setdefault((observed_ref.position, observed_ref.observed), observed_ref)
    seen: set[tuple[int, str]] = set()
    source = m.source_artifact
    # Tuples first (most edges of most pages agree), the source artifact as its three
    # columns: its text and the fields are spelled only for an edge that differs.
    common = (m.run_id, m.source_attempt_id, source.namespace, source.digest, source.size,
              m.render_id)
    for row in rows:
        (_, edge_id, run_id, attempt_id, _seq, s_id, s_ns, s_digest, s_size, position,
         observed, version, key, edge_kind, tag, attr, rel, render_id) = row
        ref = wanted.get((position, observed))
        if ref is None or (position, observed) in seen:
            found.add("row_unlogged", f"discovery_edge row {edge_id} (position {position}, "
                      f"{observed!r}) is not among the references of its ledger entry (log "
                      f"index {index})", table="discovery_edge", row_id=edge_id, log_index=index)
            continue
        seen.add((position, observed))
        if (s_id is not None and s_size.__class__ is int  # 1.0 == 1, but not as text
                and (run_id, attempt_id, s_ns, s_digest, s_size, render_id) == common
                and ref.edge_kind == edge_kind and ref.tag == tag and ref.attr == attr
                and ref.rel == rel
                and ((version is not None and version != NORMALIZER_VERSION)  # see _row_key
                     or key == _fetch_key(ref.url))):
            continue
        expected = (m.run_id, m.source_attempt_id, _ref_text(source), _fetch_key(ref.url),
                    ref.edge_kind, ref.tag, ref.attr, ref.rel, m.render_id)
        actual = (run_id, attempt_id, _row_ref(s_id, s_ns, s_digest, s_size),
                  _row_key(ref.url, version, key), edge_kind, tag, attr, rel, render_id)
        if expected != actual:
            _compare(found, "discovery_edge", edge_id, f"discovery {m.message_id}",
                     dict(zip(_EDGE_FIELDS, expected, strict=True)),
                     dict(zip(_EDGE_FIELDS, actual, strict=True)), index)
    missing = [anchor for anchor in wanted if anchor not in seen]
    if not missing:
        return
    source = conn.execute("SELECT artifact_id FROM artifact WHERE namespace = ? AND digest = ?",
                          (m.source_artifact.namespace, m.source_artifact.digest)).fetchall()
    for position, observed in missing:
        owner = [] if not source else conn.execute(
            "SELECT log_index FROM discovery_edge WHERE run_id = ? AND source_artifact_id = ? "
            "AND position = ? AND observed_ref = ?",
            (m.run_id, source[0][0], position, observed)).fetchall()
        if owner and owner[0][0] < index:
            continue  # an earlier message recorded the same edge first (redelivered page)
        found.add("row_missing", f"the discovery_edge of discovery {m.message_id} at position "
                  f"{position} ({observed!r}, log index {index}) is missing",
                  table="discovery_edge", log_index=index)


def _check_render(found: Findings, m: Render, index: int, rows: list[tuple]) -> None:
    if not rows:
        found.add("row_missing", f"the render row of render {m.render_id} (log index "
                  f"{index}) is missing", table="render", log_index=index)
        return
    for extra in rows[1:]:
        _unlogged(found, "render", extra, "already the entry of another row")
    (_, seq, render_id, run_id, source, url, started_at, elapsed_ms, outcome, error, browser,
     width, height, settle, final_url, title, d_id, d_ns, d_digest, d_size, s_id, s_ns,
     s_digest, s_size, shot_cut, h_id, h_ns, h_digest, h_size, requests, not_recorded,
     made, b_id, b_ns, b_digest, b_size) = rows[0]
    expected = {
        "render_id": m.render_id, "run_id": m.run_id, "source_attempt_id": m.source_attempt_id,
        "url": m.url, "started_at": format_time(m.started_at), "elapsed_ms": m.elapsed_ms,
        "outcome": m.outcome, "error": m.error, "browser": m.browser,
        "viewport_width": m.viewport_width, "viewport_height": m.viewport_height,
        "settle": m.settle, "final_url": m.final_url, "title": m.title,
        "dom": _ref_text(m.dom), "screenshot": _ref_text(m.screenshot),
        "screenshot_truncated": int(m.screenshot_truncated), "mhtml": _ref_text(m.mhtml),
        "requests": m.requests, "not_recorded": _JSON.encode(m.not_recorded).decode(),
        "requests made": m.requests, "behaviors": _ref_text(m.behaviors)}
    actual = {
        "render_id": render_id, "run_id": run_id, "source_attempt_id": source, "url": url,
        "started_at": started_at, "elapsed_ms": elapsed_ms, "outcome": outcome,
        "error": error, "browser": browser, "viewport_width": width,
        "viewport_height": height, "settle": settle, "final_url": final_url, "title": title,
        "dom": _row_ref(d_id, d_ns, d_digest, d_size),
        "screenshot": _row_ref(s_id, s_ns, s_digest, s_size),
        "screenshot_truncated": shot_cut, "mhtml": _row_ref(h_id, h_ns, h_digest, h_size),
        "requests": requests, "not_recorded": not_recorded, "requests made": made,
        "behaviors": _row_ref(b_id, b_ns, b_digest, b_size)}
    _compare(found, "render", seq, f"render {m.render_id}", expected, actual, index)


def _check_rule(found: Findings, m: RuleEvaluated, index: int, rows: list[tuple]) -> None:
    if not rows:
        found.add("row_missing", f"the rule_evaluation row of {m.message_id} (rule {m.rule_id} "
                  f"v{m.rule_version}, log index {index}) is missing", table="rule_evaluation",
                  log_index=index)
        return
    for extra in rows[1:]:
        _unlogged(found, "rule_evaluated", extra, "already the entry of another row")
    (_, evaluation_id, run_id, version, key, rule_id, rule_version, input_hash, verdict,
     attempt_seq, attempt_id, evaluated_at, details) = rows[0]
    expected = {"run_id": m.run_id, "fetch_key": _fetch_key(m.url), "rule_id": m.rule_id,
                "rule_version": m.rule_version, "input_hash": m.input_hash,
                "verdict": m.verdict, "attempt_id": m.attempt_id,
                "evaluated_at": format_time(m.evaluated_at),
                "details": _JSON.encode(m.details).decode()}
    actual = {"run_id": run_id, "fetch_key": _row_key(m.url, version, key), "rule_id": rule_id,
              "rule_version": rule_version, "input_hash": input_hash, "verdict": verdict,
              "attempt_id": attempt_id if attempt_seq is None or attempt_id is not None
              else f"attempt row {attempt_seq} (missing)",
              "evaluated_at": evaluated_at, "details": details}
    _compare(found, "rule_evaluation", evaluation_id, f"rule {m.rule_id} v{m.rule_version}",
             expected, actual, index)


def _check_documents(found: Findings, conn: apsw.Connection, m: SessionDocuments,
                     index: int, rows: list[tuple]) -> None:
    """session_document rows (a completed session's record, the next one's baseline)."""
    wanted: dict[str, DocumentRecord] = {}
    for doc in m.documents:  # ON CONFLICT DO NOTHING: the first of two equal keys is kept
        wanted.setdefault(_fetch_key(doc.url), doc)
    seen: set[str] = set()
    for row in rows:
        (_, row_id, session_id, version, key, url, change, status, digest, attempt_id,
         fetched_at) = row
        own = key if version in (None, NORMALIZER_VERSION) else _fetch_key(url)
        recorded = wanted.get(own)
        if recorded is None or own in seen:
            found.add("row_unlogged", f"session_document row {row_id} ({url!r}) is not among "
                      f"the documents of its ledger entry (log index {index})",
                      table="session_document", row_id=row_id, log_index=index)
            continue
        seen.add(own)
        expected = {"session_id": m.session_id, "url": recorded.url,
                    "change": recorded.change, "http_status": recorded.http_status,
                    "body_digest": recorded.body_digest, "attempt_id": recorded.attempt_id,
                    "fetched_at": None if recorded.fetched_at is None
                    else format_time(recorded.fetched_at), "fetch_key": own}
        actual = {"session_id": session_id, "url": url, "change": change,
                  "http_status": status, "body_digest": digest, "attempt_id": attempt_id,
                  "fetched_at": fetched_at, "fetch_key": key if key is not None else None}
        _compare(found, "session_document", row_id, f"session {m.session_id} document",
                 expected, actual, index)
    for key in wanted.keys() - seen:
        owner = conn.execute(
            "SELECT d.log_index FROM session_document d JOIN url_identity u "
            "ON u.url_id = d.url_id WHERE d.session_id = ? AND u.normalizer_version = ? "
            "AND u.fetch_key = ?", (m.session_id, NORMALIZER_VERSION, key)).fetchall()
        if owner and owner[0][0] < index:
            continue  # an earlier message recorded the same document first
        found.add("row_missing", f"the session_document of session {m.session_id} for "
                  f"{wanted[key].url!r} (log index {index}) is missing",
                  table="session_document", log_index=index)


def _expect_fact(sessions: dict[str, dict[str, tuple[object, int]]],
                 runs: dict[str, dict[str, tuple[object, int]]], m: Message, i: int) -> None:
    """Sessions and runs: the row each started/ended message implies (ends start as NULL)."""
    if isinstance(m, SessionStarted):
        sessions[m.session_id] = {
            "session_id": (m.session_id, i), "started_at": (format_time(m.started_at), i),
            "mode": (m.mode, i), "config": (_JSON.encode(m.config).decode(), i),
            "baseline_session_id": (m.baseline_session_id, i), "ended_at": (None, i),
            "outcome": (None, i)}
    elif isinstance(m, SessionEnded):
        fields = sessions.setdefault(m.session_id, {})
        fields.update(ended_at=(format_time(m.ended_at), i), outcome=(m.outcome, i))
    elif isinstance(m, RunStarted):
        runs[m.run_id] = {
            "run_id": (m.run_id, i), "session_id": (m.session_id, i),
            "started_at": (format_time(m.started_at), i), "program": (m.program, i),
            "host": (m.host, i), "pid": (m.pid, i), "ended_at": (None, i),
            "outcome": (None, i), "reason": (None, i)}
    elif isinstance(m, RunEnded):
        fields = runs.setdefault(m.run_id, {})
        fields.update(ended_at=(format_time(m.ended_at), i), outcome=(m.outcome, i),
                      reason=(m.reason, i))


def _check_facts(found: Findings, conn: apsw.Connection, table: str, key: str,
                 expected: dict[str, dict[str, tuple[object, int]]],
                 columns: tuple[str, ...]) -> None:
    rows = {row[0]: dict(zip(columns, row, strict=True)) for row in conn.execute(
        f"SELECT {', '.join(columns)} FROM {table}")}
    for ident, fields in expected.items():
        indices = {f: i for f, (_, i) in fields.items()}
        first = min(indices.values())
        if ident not in rows:
            found.add("row_missing", f"the {table} row of {key} {ident} (log index {first}) "
                      "is missing", table=table, row_id=ident, log_index=first)
            continue
        want = {f: v for f, (v, _) in fields.items()}
        _compare(found, table, ident, f"{key} {ident}", want, rows[ident], indices)
    for ident in rows.keys() - expected.keys():
        found.add("row_unlogged", f"{table} row {ident} has no ledger entry: no accepted "
                  "message wrote it", table=table, row_id=ident)




# --- one entry at a time (verify --quick) ------------------------------------------------
#
# The quick tier counts each table's rows against the ledger without decoding it
# (``verify_quick``); where a count disagrees, the entries whose rows disagree are checked
# here, with the checks above: the same findings as ``check_rows`` gives for them.

# ledger kind -> (the query of its table's rows, the alias of that table, a key that
# orders its rows as they were written, or None for a table without one)
_ROWS_OF = {"fetch_attempt": (_ATTEMPT_SQL, "f", "attempt_seq"),
            "discovery": (_EDGE_SQL, "e", "edge_id"),
            "rule_evaluated": (_RULE_SQL, "r", "evaluation_id"),
            "render": (_RENDER_SQL, "r", "render_seq"),
            "session_documents": (_DOCUMENT_SQL, "d", None)}


def rows_at(conn: apsw.Connection, kind: str, index: int, first: int, last: int
            ) -> list[tuple]:
    """The rows of ``kind``'s table that name ledger entry ``index``, as ``check_rows``
    reads them; ``first`` and ``last`` bound their keys (a range scan, where the
    log_index column has no index)."""
    sql, alias, key = _ROWS_OF[kind]
    where = f"{alias}.log_index = ?" + ("" if key is None else
                                        f" AND {alias}.{key} BETWEEN ? AND ?")
    args = (index,) if key is None else (index, first, last)
    return conn.execute(sql.replace("\nORDER BY", f"\nWHERE {where}\nORDER BY"),
                        args).fetchall()


def check_entry(found: Findings, conn: apsw.Connection, kind: str, index: int,
                payload: bytes | None, rows: list[tuple], what: str = "no ledger entry"
                ) -> None:
    """The rows of ``kind``'s table naming entry ``index`` against that entry (its
    payload; None: there is none, ``what`` says why), as ``check_rows`` checks them."""
    if payload is None:
        for row in rows:
            _unlogged(found, kind, row, what)
        return
    try:
        message = decode_message(payload)
    except MessageError as exc:
        found.add("ledger_entry", f"ledger entry {index} does not decode: {exc}",
                  table="ingest_ledger", log_index=index)
        return
    tag = type(message).__struct_config__.tag
    if tag != kind:
        for row in rows:
            _unlogged(found, kind, row, f"a {tag} entry")
    else:
        _check_written(found, conn, message, index, rows)


def check_sessions_runs(found: Findings, conn: apsw.Connection,
                        entries: list[tuple[int, bytes]]) -> int:
    """``crawl_session`` and ``crawl_run`` rebuilt from their entries (index, payload) and
    compared field by field, as ``check_rows`` does (a crawl has a few)."""
    sessions: dict[str, dict[str, tuple[object, int]]] = {}
    runs: dict[str, dict[str, tuple[object, int]]] = {}
    for index, payload in entries:
        try:
            _expect_fact(sessions, runs, decode_message(payload), index)
        except MessageError as exc:
            found.add("ledger_entry", f"ledger entry {index} does not decode: {exc}",
                      table="ingest_ledger", log_index=index)
    _check_facts(found, conn, "crawl_session", "session_id", sessions, _SESSION_COLUMNS)
    _check_facts(found, conn, "crawl_run", "run_id", runs, _RUN_COLUMNS)
    return len(sessions) + len(runs)
