"""Incremental sessions: baselines, conditional requests, recrawl eligibility, the record.

A session that starts after a completed one is *incremental*: the completed session's
record of every document (``session_document``) is its baseline. For a URL in the
baseline the crawler sends the stored validators (ETag as If-None-Match, Last-Modified as
If-Modified-Since), or skips the request entirely while the document is not yet due. Only
when the session completes is its own record written: each document classified as
``new``, ``changed`` or ``unchanged`` (a 304, a skip as not due, or the same status and
body checksum), and each baseline document this session never reached as ``orphaned``.
A run that stopped early writes no record, so orphans are never inferred from a partial
crawl.

A record's ``attempt_id`` is the attempt the document's validators come from: the 200
that fetched it, the 304 that confirmed it, or (not due) the baseline's own attempt.
``fetched_at`` is when the server last confirmed the content.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass

import apsw
import msgspec

from .._errors import EvidenceError
from .._model.http1 import parse_head
from .._model.messages import (
    Discovery,
    DocumentChange,
    DocumentRecord,
    decode_message,
    parse_time_text,
)
from .._model.refs import ArtifactRef
from .._model.urls import NORMALIZER_VERSION, normalize_url
from .._store.backend import ArtifactBackend

__all__ = ["Baseline", "DueRule", "SessionDiff", "diff_sessions", "parse_frequency",
           "session_records"]

_FREQUENCIES = {
    "always": dt.timedelta(0), "hourly": dt.timedelta(hours=1), "daily": dt.timedelta(days=1),
    "weekly": dt.timedelta(days=7), "monthly": dt.timedelta(days=30),
    "yearly": dt.timedelta(days=365), "never": dt.timedelta.max,
}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_frequency(text: str) -> dt.timedelta:
    """``daily``, ``weekly``, ... (sitemap changefreq words) or a duration: 90m, 12h, 3d."""
    word = text.strip().lower()
    if word in _FREQUENCIES:
        return _FREQUENCIES[word]
    match = _DURATION.match(word)
    if not match:
        raise EvidenceError(f"not a recrawl frequency: {text!r}",
                            hint="use always, hourly, daily, weekly, monthly, yearly, never, "
                            "or a duration such as 90m, 12h, 3d, 2w")
    return dt.timedelta(seconds=float(match[1]) * _UNITS[match[2]])


@dataclass(frozen=True)
class DueRule:
    """A minimum recrawl interval for URLs matching a pattern, or of a content type."""

    pattern: re.Pattern[str] | None
    content_type: str | None
    every: dt.timedelta
    source: str  # as configured, for the recorded reason

    @classmethod
    def parse(cls, key: str, value: str) -> DueRule:
        every = parse_frequency(value)
        if key.startswith("type:"):
            return cls(None, key[5:].strip().lower(), every, f"{key} = {value}")
        try:
            return cls(re.compile(key), None, every, f"{key} = {value}")
        except re.error as exc:
            raise EvidenceError(f"recrawl pattern {key!r} is not a regular expression: {exc}",
                                hint="keys are Python regular expressions or type:<media type>"
                                ) from exc

    def matches(self, key: str, content_type: str | None) -> bool:
        if self.pattern is not None:
            return bool(self.pattern.search(key))
        return (content_type or "").lower().startswith(self.content_type or "\x00")


@dataclass(frozen=True)
class BaselineDoc:
    http_status: int | None
    body_digest: str | None
    attempt_id: str | None
    fetched_at: dt.datetime | None
    etag: str | None
    last_modified: str | None
    content_type: str | None
    body: ArtifactRef | None  # the stored body the document stands for


class Baseline:
    """Read access to one baseline session's record, for the crawler's workers."""

    def __init__(self, conn: apsw.Connection, artifacts: ArtifactBackend, session_id: str,
                 rules: list[DueRule]) -> None:
        self.conn = conn
        self.artifacts = artifacts
        self.session_id = session_id
        self.rules = rules

    def lookup(self, url: str, key: str | None = None) -> BaselineDoc | None:
        """The baseline's document of ``url`` (fetch key ``key``, if known), or None."""
        rows = self.conn.execute(
            "SELECT d.http_status, d.body_digest, d.attempt_id, d.fetched_at, h.namespace, "
            "h.digest, h.size, f.content_type, b.namespace, b.digest, b.size "
            "FROM session_document d JOIN url_identity u ON u.url_id = d.url_id "
            "LEFT JOIN fetch_attempt f ON f.attempt_id = d.attempt_id "
            "LEFT JOIN artifact h ON h.artifact_id = f.response_headers_id "
            "LEFT JOIN artifact b ON b.artifact_id = (SELECT a.artifact_id FROM artifact a "
            "  WHERE a.namespace IN ('content', 'body') AND a.digest = d.body_digest "
            "  ORDER BY a.namespace = 'content' DESC LIMIT 1) "
            "WHERE d.session_id = ? AND u.normalizer_version = ? AND u.fetch_key = ? "
            "AND d.change != 'orphaned'",
            (self.session_id, NORMALIZER_VERSION, key or normalize_url(url))).fetchall()
        if not rows:
            return None
        status, digest, attempt_id, fetched, hns, hdigest, hsize, ctype, bns, bd, bs = rows[0]
        etag = last_modified = None
        if hns is not None:
            head = self.artifacts.read(ArtifactRef(namespace=hns, digest=hdigest, size=hsize))
            etag, last_modified = _validators(head)
        body = None if bns is None else ArtifactRef(namespace=bns, digest=bd, size=bs)
        return BaselineDoc(status, digest, attempt_id, parse_time_text(fetched), etag,
                           last_modified, ctype, body)

    def discoveries_of(self, attempt_id: str) -> list[Discovery]:
        """The discoveries recorded from an attempt (its body's links, its redirect, its
        rendered DOM's links): what an unchanged page still leads to. Read back from the
        ledger, so each reference is as it was found: the URL as the page wrote it, not
        its fetch key, and the artifact it was found in."""
        rows = self.conn.execute(
            "SELECT payload FROM ingest_ledger WHERE log_index IN (SELECT e.log_index "
            "FROM discovery_edge e JOIN fetch_attempt f ON f.attempt_seq = "
            "e.source_attempt_seq WHERE f.attempt_id = ?) ORDER BY log_index",
            (attempt_id,))
        found = [decode_message(payload) for (payload,) in rows]
        return [m for m in found if isinstance(m, Discovery)]

    def not_due(self, url: str, doc: BaselineDoc, sitemap_hint: str | None,
                now: dt.datetime, key: str | None = None) -> str | None:
        """The reason a document need not be fetched yet, or None when it is due.

        Sitemap hints come first (lastmod, then changefreq), then the configured minimum
        frequencies by URL pattern or content type.
        """
        if doc.fetched_at is None or doc.http_status is None or doc.http_status >= 400:
            return None
        hints = dict(part.split("=", 1) for part in (sitemap_hint or "").split() if "=" in part)
        if "lastmod" in hints:
            lastmod = _sitemap_time(hints["lastmod"])
            if lastmod is not None:
                if lastmod <= doc.fetched_at:
                    return (f"not due: sitemap lastmod {hints['lastmod']} is not after the "
                            f"last fetch {doc.fetched_at.isoformat()}")
                return None
        if "changefreq" in hints and hints["changefreq"].lower() in _FREQUENCIES:
            every = _FREQUENCIES[hints["changefreq"].lower()]
            if every == dt.timedelta.max or now - doc.fetched_at < every:
                return f"not due: sitemap changefreq {hints['changefreq']}"
            return None
        key = key or normalize_url(url)
        for rule in self.rules:
            if rule.matches(key, doc.content_type):
                if rule.every == dt.timedelta.max or now - doc.fetched_at < rule.every:
                    return f"not due: recrawl {rule.source}"
                return None
        return None


def sitemap_hint(conn: apsw.Connection, session_id: str, url: str,
                 key: str | None = None) -> str | None:
    """The lastmod/changefreq this session's sitemaps gave for a URL (``rel`` of the edge)."""
    rows = conn.execute(
        "SELECT e.rel FROM discovery_edge e JOIN url_identity u ON u.url_id = e.target_url_id "
        "JOIN crawl_run r ON r.run_id = e.run_id WHERE r.session_id = ? "
        "AND e.edge_kind = 'sitemap' AND u.normalizer_version = ? AND u.fetch_key = ? "
        "ORDER BY e.edge_id DESC LIMIT 1",
        (session_id, NORMALIZER_VERSION, key or normalize_url(url))).fetchall()
    return rows[0][0] if rows else None


def session_records(conn: apsw.Connection, session_id: str,
                    baseline_id: str | None) -> Iterator[DocumentRecord]:
    """Every document of a session whose frontier is exhausted, then the orphans."""
    baseline = {} if baseline_id is None else {
        url_id: (status, digest, attempt_id, fetched) for url_id, status, digest, attempt_id,
        fetched in conn.execute(
            "SELECT url_id, http_status, body_digest, attempt_id, fetched_at "
            "FROM session_document WHERE session_id = ? AND change != 'orphaned'",
            (baseline_id,))}
    reached: set[int] = set()
    rows = conn.execute(
        "SELECT fr.url_id, fr.url, f.attempt_id, f.http_status, f.outcome, f.error, "
        "f.started_at, b.digest FROM frontier fr "
        "JOIN fetch_attempt f ON f.attempt_seq = (SELECT max(a.attempt_seq) "
        "  FROM fetch_attempt a JOIN crawl_run r ON r.run_id = a.run_id "
        "  WHERE r.session_id = fr.session_id AND a.url_id = fr.url_id) "
        "LEFT JOIN artifact b ON b.artifact_id = coalesce(f.content_id, f.body_id) "
        "WHERE fr.session_id = ? AND fr.state = 'done' ORDER BY fr.frontier_id",
        (session_id,))
    for url_id, url, attempt_id, status, outcome, error, started, digest in rows:
        before = baseline.get(url_id)
        confirmed = status == 304 or (outcome == "skipped" and (error or "").startswith(
            "not due"))
        if confirmed and before is not None:
            reached.add(url_id)
            b_status, b_digest, b_attempt, b_fetched = before
            not_due = status != 304
            yield DocumentRecord(
                url=url, change="unchanged", http_status=b_status, body_digest=b_digest,
                attempt_id=b_attempt if not_due else attempt_id,
                fetched_at=parse_time_text(b_fetched) if not_due else parse_time_text(started))
            continue
        if status is None:
            continue  # no answer from the server: not a document of this session
        reached.add(url_id)
        change: DocumentChange
        if before is None:
            change = "new"
        else:
            change = "unchanged" if (before[0], before[1]) == (status, digest) else "changed"
        yield DocumentRecord(url=url, change=change, http_status=status, body_digest=digest,
                             attempt_id=attempt_id, fetched_at=parse_time_text(started))
    for url_id, (_status, digest, _attempt, _fetched) in baseline.items():
        if url_id in reached:
            continue
        url = conn.execute("SELECT url FROM session_document WHERE session_id = ? AND "
                           "url_id = ?", (baseline_id, url_id)).fetchall()[0][0]
        yield DocumentRecord(url=url, change="orphaned", http_status=None, body_digest=digest)


class SessionDiff(msgspec.Struct, frozen=True, kw_only=True):
    session_a: str
    session_b: str
    counts: dict[str, int]
    added: list[str]
    changed: list[str]
    unchanged: list[str]
    orphaned: list[str]


def diff_sessions(conn: apsw.Connection, a: str, b: str) -> SessionDiff:
    """Compare two completed sessions' records: added, changed, unchanged, orphaned (in A,
    not reached by B). When B's baseline is A this is B's own classification."""
    for sid in (a, b):
        if not conn.execute("SELECT 1 FROM session_document WHERE session_id = ? LIMIT 1",
                            (sid,)).fetchall():
            raise EvidenceError(f"session {sid} has no record of documents",
                                hint="only completed sessions have one (evidence status "
                                "lists sessions and their outcomes)")

    def docs(sid: str) -> dict[int, tuple[str, int | None, str | None]]:
        return {u: (url, s, d) for u, url, s, d in conn.execute(
            "SELECT url_id, url, http_status, body_digest FROM session_document "
            "WHERE session_id = ? AND change != 'orphaned'", (sid,))}

    old, new = docs(a), docs(b)
    out: dict[str, list[str]] = {"added": [], "changed": [], "unchanged": [], "orphaned": []}
    for url_id, (url, status, digest) in new.items():
        if url_id not in old:
            out["added"].append(url)
        elif old[url_id][1:] == (status, digest):
            out["unchanged"].append(url)
        else:
            out["changed"].append(url)
    out["orphaned"] = [url for url_id, (url, _s, _d) in old.items() if url_id not in new]
    lists = {k: sorted(v) for k, v in out.items()}
    return SessionDiff(session_a=a, session_b=b, counts={k: len(v) for k, v in lists.items()},
                       **lists)


def _validators(head: bytes) -> tuple[str | None, str | None]:
    etag = last_modified = None
    for name, value in parse_head(head)[1]:  # as read: bare LF and obs-fold included
        name = name.lower()
        if name == b"etag":
            etag = value.decode("latin-1")
        elif name == b"last-modified":
            last_modified = value.decode("latin-1")
    return etag, last_modified



def _sitemap_time(text: str) -> dt.datetime | None:
    """W3C datetime as sitemaps use it: a date, or a date and time with a zone."""
    try:
        moment = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
