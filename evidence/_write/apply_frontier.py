"""Applying what a page leads to and what the crawl decided: discovery edges (``edge``),
rule evaluations, frontier updates (queued, claimed and settled URLs, sequence-guarded so
the projection only moves forward) and host state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._model.messages import Discovery, FrontierUpdate, HostUpdate, RuleEvaluated, format_time
from .apply_rows import JSON, ApplyContext, Rejected, what_text

__all__ = ["HANDLERS"]


def _discovery(ctx: ApplyContext, m: Discovery) -> None:
    what = ("discovery", m.message_id)
    run_id, index = m.run_id, ctx.log_index
    ctx.open_run(run_id, what)
    render_seq = None
    if m.render_id is None:
        source = ctx.attempt_seq(m.source_attempt_id, run_id, what)
    else:  # links of a rendered DOM: the source is the render's source, of any run
        render_seq, source, source_id = ctx.render(m.render_id, run_id, what)
        if source_id != m.source_attempt_id:
            raise Rejected(f"{what_text(what)}: render {m.render_id} rendered attempt "
                           f"{source_id}, not {m.source_attempt_id}")
    artifact = ctx.artifact_id(m.source_artifact, (what, "source artifact"))
    keys, cached = ctx.keys, ctx._urls
    rows = []
    for ref in m.refs:  # most links point at URLs already interned: look them up inline
        key = keys.get(ref.url)
        target = None if key is None else cached.get(key)
        if target is None:
            target = ctx.url_id(ref.url, (what, "reference at position", ref.position))
        rows.append((run_id, source, artifact, ref.position, ref.observed, target,
                     ref.edge_kind, ref.tag, ref.attr, ref.rel, index, render_seq))
    ctx.add_edges(rows)


def _rule_evaluated(ctx: ApplyContext, m: RuleEvaluated) -> None:
    what = f"rule evaluation {m.message_id}"
    ctx.open_run(m.run_id, what)
    url_id = ctx.url_id(m.url, what)
    attempt = None if m.attempt_id is None else ctx.attempt_seq(m.attempt_id, m.run_id, what)
    details = JSON.encode(m.details).decode()
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


def _frontier(ctx: ApplyContext, m: FrontierUpdate) -> None:
    what = f"frontier update {m.message_id}"
    if ctx.session_of(m.run_id) != m.session_id:
        raise Rejected(f"{what}: run {m.run_id} is not a recorded run of session {m.session_id}")
    conn, index = ctx.conn, ctx.log_index
    rows = []
    for q in m.queued:
        url_id = ctx.url_id(q.url, f"{what} queued URL")
        rows.append((m.session_id, url_id, q.url, "queued" if q.skip is None else "skipped",
                     q.depth, q.via, q.source_attempt_id, q.skip or "", index))
    # A URL already in the frontier keeps its state, except one skipped only for its
    # depth, which is queued again when found at a depth that is allowed. Many rows per
    # statement, in order; a URL twice in one update starts another statement (PostgreSQL
    # refuses an upsert that touches one row twice in one statement).
    for run in _distinct_runs(rows, 1):
        ctx.sql.frontier_queue.write(ctx.cursor, run)
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


def _distinct_runs(rows: Sequence[tuple[object, ...]], column: int
                   ) -> Iterable[list[tuple[object, ...]]]:
    """``rows`` in order, cut into runs in which no value of ``column`` repeats."""
    run: list[tuple[object, ...]] = []
    seen: set[object] = set()
    for row in rows:
        if row[column] in seen:
            yield run
            run, seen = [], set()
        seen.add(row[column])
        run.append(row)
    if run:
        yield run


def _host(ctx: ApplyContext, m: HostUpdate) -> None:
    what = f"host update {m.message_id}"
    ctx.open_run(m.run_id, what)
    if m.robots_attempt_id is not None:
        ctx.attempt_seq(m.robots_attempt_id, m.run_id, what)
    ctx.conn.execute(
        "INSERT INTO host_state (host, robots_attempt_id, robots_expires_at, crawl_delay, "
        "backoff_until, reason, updated_log_index) VALUES (?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (host) DO UPDATE SET "  # qualified: PostgreSQL needs it, SQLite takes it
        "robots_attempt_id = coalesce(excluded.robots_attempt_id, "
        "host_state.robots_attempt_id), "
        "robots_expires_at = coalesce(excluded.robots_expires_at, "
        "host_state.robots_expires_at), "
        "crawl_delay = CASE WHEN excluded.robots_attempt_id IS NULL THEN "
        "host_state.crawl_delay ELSE excluded.crawl_delay END, "
        "backoff_until = excluded.backoff_until, reason = excluded.reason, "
        "updated_log_index = excluded.updated_log_index",
        (m.host, m.robots_attempt_id,
         None if m.robots_expires_at is None else format_time(m.robots_expires_at),
         m.crawl_delay, None if m.backoff_until is None else format_time(m.backoff_until),
         m.reason, ctx.log_index))


# The applier of each kind of this family (``apply.Applier.apply`` dispatches on them).
HANDLERS: dict[type, Callable[[ApplyContext, Any], None]] = {
    Discovery: _discovery,
    RuleEvaluated: _rule_evaluated,
    FrontierUpdate: _frontier,
    HostUpdate: _host,
}
