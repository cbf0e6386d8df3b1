"""Applying one validated message to the evidence tables, inside the writer's savepoint.

One function per message kind. Each checks what the database cannot (the run exists and is
open, artifacts are on disk, the attempt's fields agree with its outcome), then appends with
``INSERT ... ON CONFLICT(<named target>) DO NOTHING`` (never ``INSERT OR REPLACE``) and
moves the ``url_current`` projection forward only (``WHERE excluded.sequence >
url_current.sequence``). A problem with the message raises ``Rejected``; the writer rolls
back the savepoint and quarantines the message whole. Only the writer calls this module.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import apsw
import msgspec

from ._artifacts import ArtifactRef
from ._errors import ArtifactError, URLError
from ._messages import (
    Discovery,
    FetchAttempt,
    FrontierUpdate,
    HostUpdate,
    Message,
    RuleEvaluated,
    RunEnded,
    RunStarted,
    SessionDocuments,
    SessionEnded,
    SessionStarted,
    format_time,
)
from ._urls import NORMALIZER_VERSION, normalize_url

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["Interner", "Rejected", "apply", "fetch_keys"]

_json = msgspec.json.Encoder(order="deterministic")


class Rejected(Exception):
    """The message is not valid for the store. ``conflict``: it contradicts recorded evidence.

    ``duplicate``: it restates recorded evidence under a new message id; nothing is written.
    """

    def __init__(self, reason: str, *, conflict: bool = False, duplicate: bool = False) -> None:
        super().__init__(reason)
        self.conflict = conflict
        self.duplicate = duplicate


def apply(conn: apsw.Connection, store: Store, message: Message, log_index: int,
          interner: Interner, keys: dict[str, str], *, verify_artifacts: bool = False) -> None:
    """Append the evidence rows of one message (its ledger row is already inserted).

    ``keys`` maps the message's URLs to fetch keys computed ahead, off the writer's thread
    (``fetch_keys``); a URL missing from it is normalized here.
    """
    ctx = _Context(conn, store, log_index, interner, keys, verify_artifacts)
    _HANDLERS[type(message)](ctx, message)


def fetch_keys(message: Message) -> dict[str, str]:
    """The fetch keys of every URL in a message; URLs that do not normalize are left out
    (applying the message then rejects it with the normalizer's reason)."""
    urls: list[str] = []
    if isinstance(message, Discovery):
        urls = [ref.url for ref in message.refs]
    elif isinstance(message, FrontierUpdate):
        urls = [q.url for q in message.queued] + list(message.claimed) + [
            s.url for s in message.settled]
    elif isinstance(message, SessionDocuments):
        urls = [d.url for d in message.documents]
    elif isinstance(message, FetchAttempt | RuleEvaluated):
        urls = [message.url]
    keys = {}
    for url in urls:
        with contextlib.suppress(URLError):
            keys[url] = normalize_url(url)
    return keys


class Interner:
    """Caches of row ids (urls, artifacts, runs, attempts) that survive only what commits.

    Entries a message adds are tentative until its savepoint is released, and a batch's
    until its COMMIT succeeds; a rollback at either level forgets them, so a cached id
    always names a committed row. Bounded: cleared when it grows past ``limit`` entries.
    """

    KINDS = ("url", "artifact", "run", "attempt")

    def __init__(self, limit: int = 500_000) -> None:
        self.limit = limit
        self._committed: dict[str, dict] = {k: {} for k in self.KINDS}
        self._batch: dict[str, dict] = {k: {} for k in self.KINDS}
        self._message: dict[str, dict] = {k: {} for k in self.KINDS}

    def get(self, kind: str, key: object) -> object | None:
        for layer in (self._committed, self._batch, self._message):
            value = layer[kind].get(key)
            if value is not None:
                return value
        return None

    def put(self, kind: str, key: object, value: object) -> None:
        self._message[kind][key] = value

    def message_done(self, keep: bool) -> None:
        if keep:
            for kind, entries in self._message.items():
                self._batch[kind].update(entries)
        self._message = {k: {} for k in self.KINDS}

    def batch_done(self, committed: bool) -> None:
        if committed:
            if sum(map(len, self._committed.values())) > self.limit:
                self._committed = {k: {} for k in self.KINDS}
            for kind, entries in self._batch.items():
                self._committed[kind].update(entries)
        self._batch = {k: {} for k in self.KINDS}
        self._message = {k: {} for k in self.KINDS}


class _Context:
    __slots__ = ("conn", "interner", "keys", "log_index", "store", "verify_artifacts")

    def __init__(self, conn: apsw.Connection, store: Store, log_index: int,
                 interner: Interner, keys: dict[str, str], verify_artifacts: bool) -> None:
        self.conn = conn
        self.store = store
        self.log_index = log_index
        self.interner = interner
        self.keys = keys
        self.verify_artifacts = verify_artifacts

    def one(self, sql: str, args: tuple[object, ...]) -> tuple[object, ...] | None:
        for row in self.conn.execute(sql, args):
            return row
        return None

    def url_id(self, url: str, what: str) -> int:
        """Intern a URL's fetch key under the current normalizer version."""
        key = self.keys.get(url)
        if key is None:
            try:
                key = normalize_url(url)
            except URLError as exc:
                raise Rejected(f"{what}: {exc}") from exc
        cached = self.interner.get("url", key)
        if cached is not None:
            return cached  # type: ignore[return-value]
        row = self.one("SELECT url_id FROM url_identity WHERE normalizer_version = ? AND "
                       "fetch_key = ?", (NORMALIZER_VERSION, key))
        url_id = row[0] if row is not None else self.conn.execute(
            "INSERT INTO url_identity (normalizer_version, fetch_key) VALUES (?, ?) "
            "RETURNING url_id", (NORMALIZER_VERSION, key)).fetchall()[0][0]
        self.interner.put("url", key, url_id)
        return url_id  # type: ignore[return-value]

    def artifact_id(self, ref: ArtifactRef, what: str) -> int:
        """Intern an artifact row, after checking its payload is durably on disk.

        An artifact that already has a row is referenced by committed evidence, so its file
        is there (reclaim never deletes a referenced file): only a new one is stat'ed.
        """
        key = (ref.namespace, ref.digest)
        row = self.interner.get("artifact", key) or self.one(
            "SELECT artifact_id, size FROM artifact WHERE namespace = ? AND digest = ?", key)
        if row is not None and row[1] != ref.size:
            raise Rejected(f"{what}: artifact {ref.digest} is recorded with size "
                           f"{row[1]}, the message says {ref.size}", conflict=True)
        if row is None or self.verify_artifacts:
            try:
                if self.verify_artifacts:
                    self.store.artifacts.verify(ref)
                else:
                    self.store.artifacts.check(ref)
            except ArtifactError as exc:
                raise Rejected(f"{what}: {exc}") from exc
        artifact_id = row[0] if row is not None else self.conn.execute(
            "INSERT INTO artifact (namespace, digest, size) VALUES (?, ?, ?) "
            "RETURNING artifact_id", (ref.namespace, ref.digest, ref.size)).fetchall()[0][0]
        self.interner.put("artifact", key, (artifact_id, ref.size))
        return artifact_id  # type: ignore[return-value]

    def open_run(self, run_id: str, what: str) -> None:
        if self.interner.get("run", run_id):
            return
        if self.one("SELECT 1 FROM crawl_run WHERE run_id = ?", (run_id,)) is None:
            raise Rejected(f"{what}: run {run_id} is not recorded (send run_started first)")
        self.interner.put("run", run_id, True)

    def attempt_seq(self, attempt_id: str, run_id: str, what: str) -> int:
        row = self.interner.get("attempt", attempt_id) or self.one(
            "SELECT attempt_seq, run_id FROM fetch_attempt WHERE attempt_id = ?", (attempt_id,))
        if row is None:
            raise Rejected(f"{what}: attempt {attempt_id} is not recorded")
        if row[1] != run_id:
            raise Rejected(f"{what}: attempt {attempt_id} belongs to run {row[1]}, not {run_id}")
        return row[0]  # type: ignore[return-value]


def _session_started(ctx: _Context, m: SessionStarted) -> None:
    if m.baseline_session_id is not None and ctx.one(
            "SELECT 1 FROM crawl_session WHERE session_id = ?", (m.baseline_session_id,)) is None:
        raise Rejected(f"baseline session {m.baseline_session_id} is not recorded")
    ctx.conn.execute(
        "INSERT INTO crawl_session (session_id, started_at, mode, config, baseline_session_id) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id) DO NOTHING",
        (m.session_id, format_time(m.started_at), m.mode, _json.encode(m.config).decode(),
         m.baseline_session_id))
    if ctx.conn.changes() == 0:
        raise Rejected(f"session {m.session_id} was already started by another message",
                       conflict=True)


def _session_ended(ctx: _Context, m: SessionEnded) -> None:
    ctx.conn.execute(
        "UPDATE crawl_session SET ended_at = ?, outcome = ? "
        "WHERE session_id = ? AND ended_at IS NULL",
        (format_time(m.ended_at), m.outcome, m.session_id))
    if ctx.conn.changes() == 0:
        raise Rejected(f"session {m.session_id} is not recorded or has already ended")


def _run_started(ctx: _Context, m: RunStarted) -> None:
    row = ctx.one("SELECT ended_at FROM crawl_session WHERE session_id = ?", (m.session_id,))
    if row is None:
        raise Rejected(f"session {m.session_id} is not recorded (send session_started first)")
    if row[0] is not None:
        raise Rejected(f"session {m.session_id} has ended; a new run needs an open session")
    ctx.conn.execute(
        "INSERT INTO crawl_run (run_id, session_id, started_at, program, host, pid) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
        (m.run_id, m.session_id, format_time(m.started_at), m.program, m.host, m.pid))
    if ctx.conn.changes() == 0:
        raise Rejected(f"run {m.run_id} was already started by another message", conflict=True)


def _run_ended(ctx: _Context, m: RunEnded) -> None:
    ctx.conn.execute(
        "UPDATE crawl_run SET ended_at = ?, outcome = ?, reason = ? "
        "WHERE run_id = ? AND ended_at IS NULL",
        (format_time(m.ended_at), m.outcome, m.reason, m.run_id))
    if ctx.conn.changes() == 0:
        raise Rejected(f"run {m.run_id} is not recorded or has already ended")


def _fetch_attempt(ctx: _Context, m: FetchAttempt) -> None:
    what = f"attempt {m.attempt_id}"
    ctx.open_run(m.run_id, what)
    requested = m.outcome not in ("refused_by_robots", "skipped")
    if m.outcome == "response" and m.http_status is None:
        raise Rejected(f"{what}: outcome 'response' needs an http_status")
    if not requested and (m.http_status is not None or m.body is not None):
        raise Rejected(f"{what}: outcome {m.outcome!r} was never requested, so it has no "
                       "status or body")
    if m.body_truncated and m.body is None:
        raise Rejected(f"{what}: body_truncated is set but there is no body")
    url_id = ctx.url_id(m.url, what)
    refs = [None if ref is None else ctx.artifact_id(ref, f"{what} {name}")
            for name, ref in (("request_headers", m.request_headers),
                              ("response_headers", m.response_headers), ("body", m.body))]
    row = ctx.conn.execute(
        "INSERT INTO fetch_attempt (attempt_id, run_id, url_id, url, sequence, method, "
        "started_at, elapsed_ms, outcome, http_status, request_headers_id, "
        "response_headers_id, body_id, body_truncated, content_type, error, log_index) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (attempt_id) DO NOTHING RETURNING attempt_seq",
        (m.attempt_id, m.run_id, url_id, m.url, m.sequence, m.method,
         format_time(m.started_at), m.elapsed_ms, m.outcome, m.http_status, *refs,
         int(m.body_truncated), m.content_type, m.error, ctx.log_index)).fetchall()
    if not row:
        raise Rejected(f"{what} is already recorded by another message", conflict=True)
    ctx.interner.put("attempt", m.attempt_id, (row[0][0], m.run_id))
    # Rule 5: a late or redelivered attempt never moves the projection backward.
    ctx.conn.execute(
        "INSERT INTO url_current (run_id, url_id, sequence, attempt_seq) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (run_id, url_id) DO UPDATE SET sequence = excluded.sequence, "
        "attempt_seq = excluded.attempt_seq WHERE excluded.sequence > url_current.sequence",
        (m.run_id, url_id, m.sequence, row[0][0]))


def _discovery(ctx: _Context, m: Discovery) -> None:
    what = f"discovery {m.message_id}"
    ctx.open_run(m.run_id, what)
    source = ctx.attempt_seq(m.source_attempt_id, m.run_id, what)
    artifact = ctx.artifact_id(m.source_artifact, f"{what} source artifact")
    rows = [(m.run_id, source, artifact, ref.position, ref.observed,
             ctx.url_id(ref.url, f"{what} reference at position {ref.position}"),
             ref.edge_kind, ref.tag, ref.attr, ref.rel, ctx.log_index) for ref in m.refs]
    ctx.conn.executemany(
        "INSERT INTO discovery_edge (run_id, source_attempt_seq, source_artifact_id, position, "
        "observed_ref, target_url_id, edge_kind, tag, attr, rel, log_index) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (run_id, source_artifact_id, position, observed_ref) DO NOTHING", rows)


def _rule_evaluated(ctx: _Context, m: RuleEvaluated) -> None:
    what = f"rule evaluation {m.message_id}"
    ctx.open_run(m.run_id, what)
    url_id = ctx.url_id(m.url, what)
    attempt = None if m.attempt_id is None else ctx.attempt_seq(m.attempt_id, m.run_id, what)
    details = _json.encode(m.details).decode()
    row = ctx.conn.execute(
        "INSERT INTO rule_evaluation (run_id, url_id, rule_id, rule_version, input_hash, "
        "verdict, attempt_seq, evaluated_at, details, log_index) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT "
        "(run_id, url_id, rule_id, rule_version, input_hash) DO NOTHING RETURNING 1",
        (m.run_id, url_id, m.rule_id, m.rule_version, m.input_hash, m.verdict, attempt,
         format_time(m.evaluated_at), details, ctx.log_index)).fetchall()
    if row:
        return
    verdict, stored = ctx.one(
        "SELECT verdict, details FROM rule_evaluation WHERE run_id = ? AND url_id = ? AND "
        "rule_id = ? AND rule_version = ? AND input_hash = ?",
        (m.run_id, url_id, m.rule_id, m.rule_version, m.input_hash)) or (None, None)
    if (verdict, stored) == (m.verdict, details):
        raise Rejected(f"{what}: rule {m.rule_id} v{m.rule_version} on this input is already "
                       "recorded with the same verdict", duplicate=True)
    raise Rejected(f"{what}: rule {m.rule_id} v{m.rule_version} on input {m.input_hash} is "
                   f"recorded as {verdict!r}; this message says {m.verdict!r}", conflict=True)


def _frontier(ctx: _Context, m: FrontierUpdate) -> None:
    what = f"frontier update {m.message_id}"
    row = ctx.one("SELECT session_id FROM crawl_run WHERE run_id = ?", (m.run_id,))
    if row is None or row[0] != m.session_id:
        raise Rejected(f"{what}: run {m.run_id} is not a recorded run of session {m.session_id}")
    conn, index = ctx.conn, ctx.log_index
    for q in m.queued:
        url_id = ctx.url_id(q.url, f"{what} queued URL")
        state = "queued" if q.skip is None else "skipped"
        # A URL already in the frontier keeps its state, except one skipped only for its
        # depth, which is queued again when found at a depth that is allowed.
        conn.execute(
            "INSERT INTO frontier (session_id, url_id, url, state, depth, via, "
            "source_attempt_id, reason, updated_log_index) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (session_id, url_id) DO UPDATE SET state = 'queued', "
            "depth = excluded.depth, reason = '', updated_log_index = excluded.updated_log_index "
            "WHERE frontier.state = 'skipped' AND frontier.reason LIKE 'depth%' "
            "AND excluded.state = 'queued' AND excluded.depth < frontier.depth",
            (m.session_id, url_id, q.url, state, q.depth, q.via, q.source_attempt_id,
             q.skip or "", index))
    now = format_time(m.at)
    for url in m.claimed:
        conn.execute(
            "UPDATE frontier SET state = 'in_flight', attempts = attempts + 1, "
            "claimed_run_id = ?, claimed_at = ?, updated_log_index = ? "
            "WHERE session_id = ? AND url_id = ? AND state = 'queued'",
            (m.run_id, now, index, m.session_id, ctx.url_id(url, f"{what} claim")))
        if conn.changes() == 0:
            raise Rejected(f"{what}: {url} is not queued in session {m.session_id}",
                           conflict=True)
    for s in m.settled:
        conn.execute(
            "UPDATE frontier SET state = ?, reason = ?, not_before = ?, updated_log_index = ? "
            "WHERE session_id = ? AND url_id = ?",
            (s.state, s.reason, None if s.not_before is None else format_time(s.not_before),
             index, m.session_id, ctx.url_id(s.url, f"{what} settlement")))
        if conn.changes() == 0:
            raise Rejected(f"{what}: {s.url} is not in the frontier of session {m.session_id}")


def _host(ctx: _Context, m: HostUpdate) -> None:
    what = f"host update {m.message_id}"
    ctx.open_run(m.run_id, what)
    if m.robots_attempt_id is not None:
        ctx.attempt_seq(m.robots_attempt_id, m.run_id, what)
    ctx.conn.execute(
        "INSERT INTO host_state (host, robots_attempt_id, robots_expires_at, crawl_delay, "
        "backoff_until, reason, updated_log_index) VALUES (?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (host) DO UPDATE SET "
        "robots_attempt_id = coalesce(excluded.robots_attempt_id, robots_attempt_id), "
        "robots_expires_at = coalesce(excluded.robots_expires_at, robots_expires_at), "
        "crawl_delay = CASE WHEN excluded.robots_attempt_id IS NULL THEN crawl_delay "
        "ELSE excluded.crawl_delay END, "
        "backoff_until = excluded.backoff_until, reason = excluded.reason, "
        "updated_log_index = excluded.updated_log_index",
        (m.host, m.robots_attempt_id,
         None if m.robots_expires_at is None else format_time(m.robots_expires_at),
         m.crawl_delay, None if m.backoff_until is None else format_time(m.backoff_until),
         m.reason, ctx.log_index))


def _session_documents(ctx: _Context, m: SessionDocuments) -> None:
    what = f"session documents {m.message_id}"
    row = ctx.one("SELECT session_id FROM crawl_run WHERE run_id = ?", (m.run_id,))
    if row is None or row[0] != m.session_id:
        raise Rejected(f"{what}: run {m.run_id} is not a recorded run of session {m.session_id}")
    rows = []
    for d in m.documents:  # an attempt_id must exist: the foreign key checks it
        rows.append((m.session_id, ctx.url_id(d.url, what), d.url, d.change, d.http_status,
                     d.body_digest, d.attempt_id,
                     None if d.fetched_at is None else format_time(d.fetched_at),
                     ctx.log_index))
    ctx.conn.executemany(
        "INSERT INTO session_document (session_id, url_id, url, change, http_status, "
        "body_digest, attempt_id, fetched_at, log_index) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (session_id, url_id) DO NOTHING", rows)


_HANDLERS = {
    SessionStarted: _session_started,
    SessionEnded: _session_ended,
    RunStarted: _run_started,
    RunEnded: _run_ended,
    FetchAttempt: _fetch_attempt,
    Discovery: _discovery,
    RuleEvaluated: _rule_evaluated,
    FrontierUpdate: _frontier,
    HostUpdate: _host,
    SessionDocuments: _session_documents,
}
