"""Applying the messages of the session and run tables: a session begins, a run begins in
an open session and ends, a session ends, and a completed session's record of every
document (``session_document``). Each checks the order the tables need (a run in an open
session, nothing ended twice) and refuses (``Rejected``) what contradicts it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._model.messages import (
    RunEnded,
    RunStarted,
    SessionDocuments,
    SessionEnded,
    SessionStarted,
    format_time,
)
from .apply_rows import JSON, ApplyContext, Rejected

__all__ = ["HANDLERS"]


def _session_started(ctx: ApplyContext, m: SessionStarted) -> None:
    if m.baseline_session_id is not None and ctx.one(
            "SELECT 1 FROM crawl_session WHERE session_id = ?", (m.baseline_session_id,)) is None:
        raise Rejected(f"baseline session {m.baseline_session_id} is not recorded")
    ctx.conn.execute(
        "INSERT INTO crawl_session (session_id, started_at, mode, config, baseline_session_id) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id) DO NOTHING",
        (m.session_id, format_time(m.started_at), m.mode, JSON.encode(m.config).decode(),
         m.baseline_session_id))
    if ctx.conn.changes() == 0:
        raise Rejected(f"session {m.session_id} was already started by another message",
                       conflict=True)


def _session_ended(ctx: ApplyContext, m: SessionEnded) -> None:
    ctx.conn.execute(
        "UPDATE crawl_session SET ended_at = ?, outcome = ? "
        "WHERE session_id = ? AND ended_at IS NULL",
        (format_time(m.ended_at), m.outcome, m.session_id))
    if ctx.conn.changes() == 0:
        raise Rejected(f"session {m.session_id} is not recorded or has already ended")


def _run_started(ctx: ApplyContext, m: RunStarted) -> None:
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


def _run_ended(ctx: ApplyContext, m: RunEnded) -> None:
    ctx.conn.execute(
        "UPDATE crawl_run SET ended_at = ?, outcome = ?, reason = ? "
        "WHERE run_id = ? AND ended_at IS NULL",
        (format_time(m.ended_at), m.outcome, m.reason, m.run_id))
    if ctx.conn.changes() == 0:
        raise Rejected(f"run {m.run_id} is not recorded or has already ended")


def _session_documents(ctx: ApplyContext, m: SessionDocuments) -> None:
    what = f"session documents {m.message_id}"
    if ctx.session_of(m.run_id) != m.session_id:
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


# The applier of each kind of this family (``apply.Applier.apply`` dispatches on them).
HANDLERS: dict[type, Callable[[ApplyContext, Any], None]] = {
    SessionStarted: _session_started,
    SessionEnded: _session_ended,
    RunStarted: _run_started,
    RunEnded: _run_ended,
    SessionDocuments: _session_documents,
}
