"""Rendering inside a crawl (``evidence crawl --render``): which pages are rendered, and
the stored capture a render starts from.

A page to render is fetched as usual; its worker commits the attempt, its links and its
rule verdicts but leaves the URL in flight, and hands the attempt back
(``PageEffects.render``). The crawl process then renders it (one browser for the run,
``_crawl.render.Renderer``), and ``_crawl.pages.PageWorker.rendered`` commits one writer
group:

    render, the browser's requests (fetch attempts naming the render), the links of the
    rendered DOM (a discovery naming the render), verdicts of rules that read the
    rendered DOM, and the frontier: the DOM's new URLs queued, the page settled done.

So a page is done only once its render is recorded. A crash between the two leaves the
URL in flight; the next run claims it again (the claim counts against
``--max-attempts``) and, finding the capture already stored and not yet rendered
(``unrendered_capture``), renders it without fetching it again: the render arrives late,
in a later run, and refers to the capture of the earlier one. A render that fails
(timeout, crash, error) is recorded with its reason and the URL is retried like a page
that failed, up to ``--max-attempts`` claims; then it is failed with the reason.

Which pages: with ``render`` on, every 2xx HTML page whose capture is whole (a body cut
at the size cap is not rendered), restricted to fetch keys matching one of
``render_only`` when that is given.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import TYPE_CHECKING

import apsw

from .._model.messages import FetchAttempt
from .._model.refs import ArtifactRef
from .._model.text import is_html
from .._model.urls import NORMALIZER_VERSION, normalize_url
from .._store.backend import ArtifactBackend
from .frontier import CrawlConfig

if TYPE_CHECKING:
    from .renderproxy import SourceCapture

__all__ = ["RenderScope", "source_capture", "unrendered_capture"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)  # a stored capture's message fields unused here


class RenderScope:
    """Which captures of a crawl are rendered (``render``, ``render_only``)."""

    def __init__(self, config: CrawlConfig) -> None:
        self.enabled = config.render or bool(config.render_only)
        self.only = [re.compile(p) for p in config.render_only]

    def wants(self, attempt: FetchAttempt) -> bool:
        if not self.enabled or attempt.render_id is not None:
            return False
        status = attempt.http_status
        if status is None or not 200 <= status < 300 or attempt.outcome != "response":
            return False
        if attempt.capture != "wire" or attempt.body is None or attempt.body_truncated:
            return False
        if not is_html(attempt.content_type):
            return False
        return not self.only or any(p.search(normalize_url(attempt.url)) for p in self.only)


_UNRENDERED = """
SELECT f.attempt_id, f.url, f.outcome, f.http_status, f.capture, f.body_truncated,
       f.content_type, h.namespace, h.digest, h.size, b.namespace, b.digest, b.size,
       EXISTS (SELECT 1 FROM render r WHERE r.source_attempt_seq = f.attempt_seq
               AND r.outcome = 'rendered')
FROM fetch_attempt f
JOIN crawl_run c ON c.run_id = f.run_id
JOIN url_identity u ON u.url_id = f.url_id
LEFT JOIN artifact h ON h.artifact_id = f.response_headers_id
LEFT JOIN artifact b ON b.artifact_id = f.body_id
WHERE c.session_id = ? AND u.normalizer_version = ? AND u.fetch_key = ?
  AND f.render_seq IS NULL
ORDER BY f.attempt_seq DESC LIMIT 1
"""


def unrendered_capture(conn: apsw.Connection, scope: RenderScope, session_id: str,
                       url: str, key: str | None = None) -> FetchAttempt | None:
    """The session's last capture of ``url`` if it is one to render and has no render
    yet (a run ended between the two), as an attempt carrying what a render needs."""
    rows = conn.execute(_UNRENDERED, (session_id, NORMALIZER_VERSION,
                                      key or normalize_url(url))).fetchall()
    if not rows:
        return None
    (attempt_id, attempt_url, outcome, status, capture, truncated, content_type,
     h_ns, h_digest, h_size, b_ns, b_digest, b_size, rendered) = rows[0]
    if rendered or h_ns is None or b_ns is None:
        return None
    attempt = FetchAttempt(
        message_id="m-stored", attempt_id=attempt_id, run_id="r-stored", url=attempt_url,
        sequence=0, started_at=_EPOCH, elapsed_ms=0.0, outcome=outcome, http_status=status,
        capture=capture, body_truncated=bool(truncated), content_type=content_type,
        response_headers=ArtifactRef(h_ns, h_digest, h_size),
        body=ArtifactRef(b_ns, b_digest, b_size))
    return attempt if scope.wants(attempt) else None


def source_capture(artifacts: ArtifactBackend, attempt: FetchAttempt) -> SourceCapture:
    """The stored response head and body of ``attempt``, checked against their digests."""
    from .renderproxy import SourceCapture  # here: only a crawl that renders loads it

    assert attempt.response_headers is not None and attempt.body is not None
    return SourceCapture(url=attempt.url, attempt_id=attempt.attempt_id,
                         head=artifacts.read(attempt.response_headers, verify=True),
                         body=artifacts.read(attempt.body, verify=True))
