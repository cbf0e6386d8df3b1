"""Applying what was fetched: a fetch attempt (its URL, its payloads interned, its
connection, DNS answer and TLS facts, its row in ``fetch_attempt``, and the ``url_current``
projection moved forward only) and a render (its source attempt, DOM, screenshot, MHTML and
behaviors log). Each checks what the database cannot: the run is open, the payloads are
in the artifact store, the attempt's fields agree with its outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._model.messages import FetchAttempt, Render, format_time
from .apply_rows import JSON, ApplyContext, Rejected, What, what_text

__all__ = ["HANDLERS"]


def _fetch_attempt(ctx: ApplyContext, m: FetchAttempt) -> None:
    what = ("attempt", m.attempt_id)
    ctx.open_run(m.run_id, what)
    requested = m.outcome not in ("refused_by_robots", "skipped")
    if m.outcome == "response" and m.http_status is None:
        raise Rejected(f"{what_text(what)}: outcome 'response' needs an http_status")
    if not requested and (m.http_status is not None or m.body is not None):
        raise Rejected(f"{what_text(what)}: outcome {m.outcome!r} was never requested, so it has "
                       "no status or body")
    if m.body_truncated and m.body is None:
        raise Rejected(f"{what_text(what)}: body_truncated is set but there is no body")
    if m.capture != "wire" and (m.content is not None or m.surplus is not None
                                or m.transfer_coding or m.content_coding
                                or m.content_truncated):
        raise Rejected(f"{what_text(what)}: content, codings and surplus describe a wire "
                       "capture: set capture to 'wire'")
    if m.body is None and (m.content is not None or m.transfer_coding or m.content_coding):
        raise Rejected(f"{what_text(what)}: content is derived from a body, and there is none")
    if (m.text_encoding is None) != (m.text_encoding_source is None):
        raise Rejected(f"{what_text(what)}: text_encoding and text_encoding_source go together")
    if m.protocol != "http/1.1" and m.capture != "wire":
        raise Rejected(f"{what_text(what)}: protocol {m.protocol!r} is recorded as its frames: "
                       "set capture to 'wire'")
    if m.frames is not None and m.protocol != "h2":
        raise Rejected(f"{what_text(what)}: frames are what an HTTP/2 stream read: set protocol "
                       "to 'h2'")
    if m.request_secrets is not None and m.request_headers is None:
        raise Rejected(f"{what_text(what)}: request_secrets opens a stored request, and there "
                       "is none")
    if not requested and m.connection is not None:
        raise Rejected(f"{what_text(what)}: outcome {m.outcome!r} was never requested, so it had "
                       "no connection")
    url_id = ctx.url_id(m.url, what)
    render_seq = None if m.render_id is None else ctx.render(m.render_id, m.run_id, what)[0]
    request_headers, response_headers, body = m.request_headers, m.response_headers, m.body
    content, surplus = m.content, m.surplus
    attempt_seq = ctx.add_attempt((
        m.attempt_id, m.run_id, url_id, m.url, m.sequence, m.method,
        format_time(m.started_at), m.elapsed_ms, m.outcome, m.http_status,
        None if request_headers is None else ctx.artifact_id(
            request_headers, (what, "request_headers")),
        None if response_headers is None else ctx.artifact_id(
            response_headers, (what, "response_headers")),
        None if body is None else ctx.artifact_id(body, (what, "body")),
        int(m.body_truncated), m.content_type, m.error, ctx.log_index, m.capture,
        None if content is None else ctx.artifact_id(content, (what, "content")),
        m.transfer_coding, m.content_coding, int(m.content_truncated),
        None if surplus is None else ctx.artifact_id(surplus, (what, "surplus")),
        m.text_encoding, m.text_encoding_source, render_seq, *_connection_row(ctx, m, what),
        m.protocol, None if m.frames is None else ctx.artifact_id(m.frames, (what, "frames")),
        None if m.request_secrets is None else ctx.artifact_id(
            m.request_secrets, (what, "request_secrets"))),
        what)
    ctx.interner.put("attempt", m.attempt_id, (attempt_seq, m.run_id))
    if render_seq is None:  # a browser's request is not the crawler's attempt of its URL
        ctx.project((m.run_id, url_id, m.sequence, attempt_seq))


def _connection_row(ctx: ApplyContext, m: FetchAttempt, what: What) -> tuple[object, ...]:
    """The connection columns of an attempt's row (all NULL: it had none)."""
    c = m.connection
    if c is None:
        return (None,) * 12
    resolution = None if c.dns is None else ctx.resolution_seq(c.dns, what)
    tls = c.tls
    if tls is None:
        return (c.remote_address, c.remote_port, c.local_address, c.local_port,
                int(c.reused), resolution, None, None, None, None, None, None)
    chain = None if tls.chain is None else ctx.artifact_id(tls.chain, (what, "tls chain"))
    return (c.remote_address, c.remote_port, c.local_address, c.local_port, int(c.reused),
            resolution, tls.version, tls.cipher, tls.sni, tls.alpn, chain, int(tls.verified))


def _render(ctx: ApplyContext, m: Render) -> None:
    what = ("render", m.render_id)
    ctx.open_run(m.run_id, what)
    row = ctx.one(
        "SELECT f.attempt_seq, f.url, f.render_seq, a.session_id = b.session_id "
        "FROM fetch_attempt f JOIN crawl_run a ON a.run_id = f.run_id "
        "JOIN crawl_run b ON b.run_id = ? WHERE f.attempt_id = ?",
        (m.run_id, m.source_attempt_id))
    if row is None:
        raise Rejected(f"{what_text(what)}: source attempt {m.source_attempt_id} is not recorded")
    source, url, of_render, same_session = row
    if of_render is not None or not same_session or url != m.url:
        raise Rejected(f"{what_text(what)}: source attempt {m.source_attempt_id} is not a "
                       f"crawler's attempt of {m.url} in this run's session")
    if (m.outcome == "rendered") != (m.dom is not None):
        raise Rejected(f"{what_text(what)}: a rendered page has a DOM, and only a rendered one")
    refs = [None if ref is None else ctx.artifact_id(ref, (what, name))
            for name, ref in (("dom", m.dom), ("screenshot", m.screenshot),
                              ("mhtml", m.mhtml), ("behaviors", m.behaviors))]
    ctx.cursor.execute(
        "INSERT INTO render (render_id, run_id, source_attempt_seq, url, started_at, "
        "elapsed_ms, outcome, error, browser, viewport_width, viewport_height, settle, "
        "final_url, title, dom_id, screenshot_id, screenshot_truncated, mhtml_id, requests, "
        "not_recorded, behaviors_id, log_index) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
        "?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (render_id) DO NOTHING",
        (m.render_id, m.run_id, source, m.url, format_time(m.started_at), m.elapsed_ms,
         m.outcome, m.error, m.browser, m.viewport_width, m.viewport_height, m.settle,
         m.final_url, m.title, refs[0], refs[1], int(m.screenshot_truncated), refs[2],
         m.requests, JSON.encode(m.not_recorded).decode(), refs[3], ctx.log_index))
    if not ctx.conn.changes():
        raise Rejected(f"{what_text(what)} is already recorded by another message", conflict=True)


# The applier of each kind of this family (``apply.Applier.apply`` dispatches on them).
HANDLERS: dict[type, Callable[[ApplyContext, Any], None]] = {
    FetchAttempt: _fetch_attempt,
    Render: _render,
}
