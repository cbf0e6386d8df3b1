"""Applying one validated message to the evidence tables, inside the writer's savepoint.

One function per message kind. Each checks what the database cannot (the run exists and is
open, artifacts are on disk, the attempt's fields agree with its outcome), then appends with
``INSERT ... ON CONFLICT(<named target>) DO NOTHING`` (never ``INSERT OR REPLACE``) and
moves the ``url_current`` projection forward only (``WHERE excluded.sequence >
url_current.sequence``). A problem with the message raises ``Rejected``; the writer rolls
back the savepoint and quarantines the message whole (or, on its optimistic path without a
savepoint per message, rolls back the whole attempt and applies the batch again one
savepoint per message). Only the writer calls this module.

The appliers are per table family: ``apply_sessions`` (sessions, runs, a session's
documents), ``apply_fetches`` (fetch attempts, renders), ``apply_frontier`` (discovery
edges, rule evaluations, the frontier, hosts); what they share (statements, the caches of
row ids, one batch's state) is ``apply_rows``. This module is what the writer calls:
``Applier`` and the fetch keys and artifacts of a message, known before its batch begins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._errors import URLError
from .._model.messages import (
    Discovery,
    FetchAttempt,
    FrontierUpdate,
    Message,
    Render,
    RuleEvaluated,
    SessionDocuments,
)
from .._model.refs import ArtifactRef
from .._model.urls import normalize_url
from . import apply_fetches, apply_frontier, apply_sessions
from .apply_rows import ApplyContext, Interner, Rejected

__all__ = ["Applier", "Interner", "Rejected", "artifact_refs", "fetch_keys"]


class Applier(ApplyContext):
    """Applies messages inside one batch transaction: each through its kind's applier."""

    __slots__ = ()

    def apply(self, message: Message, log_index: int, keys: dict[str, str]) -> None:
        """Append the evidence rows of one message (its ledger row is already inserted).

        ``keys`` maps the message's URLs to fetch keys computed ahead, off the writer's
        thread (``fetch_keys``); a URL missing from it is normalized here.
        """
        self.log_index = log_index
        self.keys = keys
        kind = type(message)
        if self._attempt_rows and kind is not FetchAttempt and kind is not Discovery:
            self._write_attempts()
        _HANDLERS[kind](self, message)


def fetch_keys(message: Message, memo: dict[str, str] | None = None) -> dict[str, str]:
    """The fetch keys of every URL in a message; URLs that do not normalize are left out
    (applying the message then rejects it with the normalizer's reason).

    ``memo`` (URL -> fetch key) is consulted and extended: normalization is a pure function
    of the URL, and a crawl meets the same links on page after page.
    """
    urls_of = _URLS_OF.get(type(message))
    if urls_of is None:
        return {}
    if memo is None:
        memo = {}
    keys = {}
    for url in urls_of(message):
        key = memo.get(url)
        if key is None:
            try:
                key = memo[url] = normalize_url(url)
            except URLError:
                continue
        keys[url] = key
    return keys


def artifact_refs(message: Message) -> list[ArtifactRef]:
    """The artifacts a message references, in the order applying it interns them."""
    refs_of = _ARTIFACTS_OF.get(type(message))
    if refs_of is None:
        return []
    return [ref for ref in refs_of(message) if ref is not None]


# Every kind whose handler interns artifacts (``Applier.artifact_id``), with its refs in the
# order the handler interns them: the fast path's ids are right only if this is complete
# (tests/test_writer_batches.py checks it against the handlers).
_ARTIFACTS_OF: dict[type, Callable[..., list[ArtifactRef | None]]] = {
    FetchAttempt: lambda m: [m.request_headers, m.response_headers, m.body, m.content,
                             m.surplus, _chain_of(m), m.frames, m.request_secrets],
    Discovery: lambda m: [m.source_artifact],
    Render: lambda m: [m.dom, m.screenshot, m.mhtml, m.behaviors],
}

def _chain_of(m: FetchAttempt) -> ArtifactRef | None:
    tls = m.connection.tls if m.connection is not None else None
    return tls.chain if tls is not None else None


_URLS_OF: dict[type, Callable[..., list[str]]] = {
    FetchAttempt: lambda m: [m.url],
    RuleEvaluated: lambda m: [m.url],
    Discovery: lambda m: [ref.url for ref in m.refs],
    FrontierUpdate: lambda m: [q.url for q in m.queued] + list(m.claimed) + [
        s.url for s in m.settled],
    SessionDocuments: lambda m: [d.url for d in m.documents],
}


_HANDLERS: dict[type, Callable[[ApplyContext, Any], None]] = {
    **apply_sessions.HANDLERS, **apply_fetches.HANDLERS, **apply_frontier.HANDLERS}
