"""Everything the store holds about one page, read in one snapshot: ``evidence show``.

A reviewer asks for a URL and gets its attempts (every run, oldest first), the renders of
those attempts, the links it had and that led to it, and its rule verdicts; the attempt the
page stands for is the one ``replay`` would pick (the current attempt of the latest run
that has one, or of ``run_id``, or the latest started at or before ``at``). ``extract``
then gives back that attempt's recorded bytes and its latest render's: the request head,
the response head, the body as received, the decoded content, the server's TLS certificate
chain (DER certificates, leaf first), the rendered DOM, the screenshot and the behaviours'
action log, each read back from the artifact store and re-hashed as it is read. Each
attempt comes with the connection it went over (``_audit.replay.connection_facts``).
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Literal

import msgspec

from .._errors import NotFoundError
from .._model.refs import ArtifactRef
from .._store.db import Store
from .replay import ConnectionFacts, connection_facts, locate

__all__ = ["PART_NAMES", "AttemptFacts", "PageEvidence", "RenderFacts", "Verdict",
           "extract", "page_evidence"]

Part = Literal["request", "headers", "body", "content", "certs", "dom", "screenshot",
               "behaviors"]
PART_NAMES: tuple[Part, ...] = ("request", "headers", "body", "content", "certs", "dom",
                                "screenshot", "behaviors")


class AttemptFacts(msgspec.Struct, frozen=True, kw_only=True):
    attempt_id: str
    run_id: str
    url: str  # exactly as requested
    sequence: int
    method: str
    started_at: str
    elapsed_ms: float
    outcome: str
    http_status: int | None
    content_type: str | None
    error: str | None
    body_bytes: int | None
    body_truncated: bool
    text_encoding: str | None
    capture: str
    log_index: int
    chosen: bool  # the attempt the page stands for (what extract reads)
    connection: ConnectionFacts | None = None  # with whom and how (none recorded: None)


class RenderFacts(msgspec.Struct, frozen=True, kw_only=True):
    render_id: str
    attempt_id: str
    started_at: str
    outcome: str
    title: str
    final_url: str | None
    requests: int  # the browser's own requests, recorded as attempts
    dom_bytes: int | None
    screenshot_bytes: int | None
    log_index: int
    behavior_actions: int | None = None  # actions its behaviours took (None: none ran)


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    rule_id: str
    rule_version: str
    verdict: str
    evaluated_at: str


class PageEvidence(msgspec.Struct, frozen=True, kw_only=True):
    fetch_key: str
    attempts: list[AttemptFacts]
    renders: list[RenderFacts]
    links_out: int  # references found in the chosen attempt
    links_in: int  # references to this page, in every run
    verdicts: list[Verdict]
    parts: dict[str, ArtifactRef]  # what extract can give for the chosen attempt


_ATTEMPTS = """
SELECT f.attempt_seq, f.attempt_id, f.run_id, f.url, f.sequence, f.method, f.started_at,
       f.elapsed_ms, f.outcome, f.http_status, f.content_type, f.error, b.size,
       f.body_truncated, f.text_encoding, f.capture, f.log_index
FROM fetch_attempt f LEFT JOIN artifact b ON b.artifact_id = f.body_id
WHERE f.url_id = ? ORDER BY f.started_at, f.attempt_seq
"""
_RENDERS = """
SELECT r.render_id, f.attempt_id, r.started_at, r.outcome, r.title, r.final_url,
       r.requests, d.size, s.size, r.log_index, b.namespace, b.digest, b.size
FROM render r JOIN fetch_attempt f ON f.attempt_seq = r.source_attempt_seq
LEFT JOIN artifact d ON d.artifact_id = r.dom_id
LEFT JOIN artifact s ON s.artifact_id = r.screenshot_id
LEFT JOIN artifact b ON b.artifact_id = r.behaviors_id
WHERE f.url_id = ? ORDER BY r.started_at, r.render_seq
"""
# The artifact of each part of the chosen attempt (and of its latest rendered render).
_PARTS = """
SELECT 'request', q.namespace, q.digest, q.size FROM fetch_attempt f
  JOIN artifact q ON q.artifact_id = f.request_headers_id WHERE f.attempt_seq = :seq
UNION ALL SELECT 'headers', h.namespace, h.digest, h.size FROM fetch_attempt f
  JOIN artifact h ON h.artifact_id = f.response_headers_id WHERE f.attempt_seq = :seq
UNION ALL SELECT 'body', b.namespace, b.digest, b.size FROM fetch_attempt f
  JOIN artifact b ON b.artifact_id = f.body_id WHERE f.attempt_seq = :seq
UNION ALL SELECT 'content', c.namespace, c.digest, c.size FROM fetch_attempt f
  JOIN artifact c ON c.artifact_id = coalesce(f.content_id, f.body_id)
  WHERE f.attempt_seq = :seq AND (f.content_id IS NOT NULL OR f.capture = 'wire')
UNION ALL SELECT 'certs', t.namespace, t.digest, t.size FROM fetch_attempt f
  JOIN artifact t ON t.artifact_id = f.tls_chain_id WHERE f.attempt_seq = :seq
UNION ALL SELECT * FROM (SELECT 'dom', d.namespace, d.digest, d.size FROM render r
  JOIN artifact d ON d.artifact_id = r.dom_id WHERE r.source_attempt_seq = :seq
  ORDER BY r.render_seq DESC LIMIT 1)
UNION ALL SELECT * FROM (SELECT 'screenshot', s.namespace, s.digest, s.size FROM render r
  JOIN artifact s ON s.artifact_id = r.screenshot_id WHERE r.source_attempt_seq = :seq
  ORDER BY r.render_seq DESC LIMIT 1)
UNION ALL SELECT * FROM (SELECT 'behaviors', b.namespace, b.digest, b.size FROM render r
  JOIN artifact b ON b.artifact_id = r.behaviors_id WHERE r.source_attempt_seq = :seq
  ORDER BY r.render_seq DESC LIMIT 1)
"""


def page_evidence(store: Store, url: str, *, run_id: str | None = None,
                  at: str | _dt.datetime | None = None) -> PageEvidence:
    """What the store holds about ``url`` (see the module docstring)."""
    with store.snapshot() as conn:
        key, url_id, seq = locate(conn, url, run_id=run_id, at=at)
        attempts = [AttemptFacts(
            attempt_id=a, run_id=r, url=u, sequence=n, method=m, started_at=t,
            elapsed_ms=e, outcome=o, http_status=h, content_type=ct, error=err,
            body_bytes=size, body_truncated=bool(trunc), text_encoding=enc, capture=cap,
            log_index=li, chosen=s == seq, connection=connection_facts(conn, s))
            for s, a, r, u, n, m, t, e, o, h, ct, err, size, trunc, enc, cap, li
            in conn.execute(_ATTEMPTS, (url_id,)).fetchall()]
        renders = [RenderFacts(render_id=r, attempt_id=a, started_at=t, outcome=o, title=ti,
                               final_url=fu, requests=n, dom_bytes=d, screenshot_bytes=s,
                               log_index=li,
                               behavior_actions=_actions(store, bns, bdigest, bsize))
                   for r, a, t, o, ti, fu, n, d, s, li, bns, bdigest, bsize
                   in conn.execute(_RENDERS, (url_id,)).fetchall()]
        links_out = conn.execute("SELECT count(*) FROM discovery_edge "
                                 "WHERE source_attempt_seq = ?", (seq,)).fetchall()[0][0]
        links_in = conn.execute("SELECT count(*) FROM discovery_edge "
                                "WHERE target_url_id = ?", (url_id,)).fetchall()[0][0]
        verdicts = [Verdict(run_id=r, rule_id=i, rule_version=v, verdict=x, evaluated_at=t)
                    for r, i, v, x, t in conn.execute(
                        "SELECT run_id, rule_id, rule_version, verdict, evaluated_at FROM "
                        "rule_evaluation WHERE url_id = ? ORDER BY evaluated_at, "
                        "evaluation_id", (url_id,))]
        parts = {part: ArtifactRef(ns, digest, size)
                 for part, ns, digest, size in conn.execute(_PARTS, {"seq": seq})}
    return PageEvidence(fetch_key=key, attempts=attempts, renders=renders,
                        links_out=links_out, links_in=links_in, verdicts=verdicts,
                        parts=parts)


def _actions(store: Store, namespace: str | None, digest: str | None,
             size: int | None) -> int | None:
    """How many actions a render's behaviour log records (None: no behaviours ran)."""
    if namespace is None or digest is None or size is None:
        return None
    log = json.loads(store.artifacts.read(ArtifactRef(namespace, digest, size), verify=True))
    return len(log.get("actions", []))


def extract(store: Store, page: PageEvidence, part: Part) -> bytes:
    """One recorded part of the attempt ``page`` stands for, re-hashed as it is read (the
    parts were found in the same snapshot as the rest of ``page``).

    ``content`` is the body with its transfer and content codings removed, as stored at
    capture; a part the attempt does not have (no render, no response) is NotFoundError.
    """
    if part not in PART_NAMES:
        raise NotFoundError(f"no part {part!r}", hint="one of " + ", ".join(PART_NAMES))
    if part not in page.parts:
        raise NotFoundError(f"the attempt of {page.fetch_key} has no {part} recorded",
                            hint="'evidence show STORE URL' lists what it has",
                            url=page.fetch_key)
    return store.artifacts.read(page.parts[part], verify=True)
