"""One HTTP request, its bytes stored durably, described as a ``FetchAttempt``.

Order matters (design rule 6): every payload is put in the artifact store (fsync'd)
*before* the attempt message that references it exists. What is stored is what crossed the
connection, as the crawler's own HTTP/1.1 client wrote and read them (``_crawl.http``):

- the request exactly as written (request line, header block), each secret value in it
  (a credential, a user's cookie: ``_crawl.secrets``) replaced by a salted commitment; the
  exact bytes and the salts in the ``secrets`` namespace (``request_secrets``);
- the response's status line and header block exactly as read;
- the message body exactly as read: chunk framing, extensions and trailers included, a
  gzip body gzipped; cut at ``max_body_bytes`` (``too_large``, ``body_truncated``);
- bytes read after the body's end, if any (``surplus``; the connection is then closed);
- the content (``_model.http1.derive_content``: transfer coding, then content codings removed)
  as its own artifact where its bytes differ from the body's, with the codings removed:
  derived up to ``max_content_bytes`` (``content_truncated`` past it), never further, so a
  megabyte of gzip that would inflate to a gigabyte costs at most the cap in memory. A
  body with no coding to remove is its own content, whatever its size (nothing is derived).

- with whom and how (``connection``): the addresses actually connected to, the resolver's
  answer they came from, and for TLS the negotiated parameters and the server's certificate
  chain, stored as one payload (its DER certificates, leaf first) in the ``certs``
  namespace: content-addressed, so a chain seen on a thousand connections is stored once.
  Through a proxy (``_crawl.proxy``), the connection is the proxy's, and the tunnel's
  facts (the proxy without its credentials, the target it was asked for, its answer) are
  part of it; the bytes stored are those exchanged with the origin inside the tunnel. A
  proxy that refused the tunnel leaves an attempt ``network_error`` (``ProxyError: ...``)
  whose connection says which proxy refused and what it answered.

A timeout, a connection cut short or a malformed response keeps what came: the attempt
records the error and references the bytes read before it (``body_truncated``). A
connection the crawl's network policy refuses (``_crawl.netpolicy``) is an attempt
``skipped``, never requested, whose error is the reason (``network: ...``).
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import email.utils
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from .._errors import EvidenceError
from .._model.http1 import Split, derive_content, head_length
from .._model.messages import Connection, FetchAttempt, Outcome, Tls, new_id, utc_now
from .._model.refs import ArtifactRef
from .._model.text import Sniffed, charset_param, is_html, sniff
from .._store.backend import ArtifactBackend
from .http import Client, Exchange, FetchError, H2Response, Headers, Peer, Response
from .secrets import SECRETS_NS, redact

__all__ = ["FetchResult", "fetch", "parse_retry_after"]

T = TypeVar("T")

HEADERS_NS = "headers"
BODY_NS = "body"
CONTENT_NS = "content"
CERTS_NS = "certs"
FRAMES_NS = "frames"  # an HTTP/2 stream's frames, as read (``_model.http2``)


@dataclass(frozen=True)
class FetchResult:
    attempt: FetchAttempt
    status: int | None
    headers: Headers | None
    body: bytes  # the content: the body decoded (transfer and content codings removed);
    # b"" when it is over fetch's ``keep_content`` (it is stored: the attempt names it)
    elapsed: float
    head: bytes = b""  # the stored response head, as read
    raw_body: bytes = b""  # the stored body, as read (transfer coding included)
    parsed: Any = None  # what fetch's ``parse`` made of a 2xx content, or None


# Storing and parsing an exchange is CPU work: a large one goes to a worker thread, so one
# slow page never stalls the others on the event loop. A small one (most pages) is done in
# place: with packs a put is an append (no fsync), lexbor parses a 4 KiB page in ~50 us, and
# the hop to a thread and back cost more than the work (thread wake-ups, GIL hand-overs:
# 25% of a crawl's CPU in issue 15's profile). A put to an object store is a request, which
# may wait out an outage for a minute (``_store/s3client.py``): always on a thread, so the
# loop goes on (heartbeats, progress, signals) while the page waits.
INLINE_BYTES = 64 * 1024

# What a page derives from its bytes (its content decoded, then parsed) takes memory its
# wire bytes do not bound: up to about twice ``max_content_bytes`` while the content is
# decoded, and the parser's tree (tens of bytes per byte parsed). A large exchange's is
# derived on one of DERIVING threads of their own, whatever the crawl's --workers: at
# most that many pages derive at once, and the memory they free stays with those threads'
# malloc arenas, where the next derivation reuses it (issue 30, 16 bombs at --workers 16:
# derived on whichever worker thread stored the page, two at a time at most, they peaked
# at 389 MiB of RSS; on two threads of their own, at 248 MiB). Their puts (network I/O to
# an object store) stay on the worker threads. Work done in place on the event loop (a
# small exchange) is one page at a time already.
DERIVING = 2
_derivers: concurrent.futures.ThreadPoolExecutor


def _new_derivers() -> None:
    global _derivers
    _derivers = concurrent.futures.ThreadPoolExecutor(DERIVING, thread_name_prefix="derive")


_new_derivers()
os.register_at_fork(after_in_child=_new_derivers)  # a forked child has none of the threads


def _derived(work: Callable[[], T], size: int) -> T:
    """``work()``, on a derive thread for a large exchange (called from a worker thread)."""
    return work() if size <= INLINE_BYTES else _derivers.submit(work).result()


async def _off_the_loop(work: Callable[[], T], size: int, artifacts: ArtifactBackend) -> T:
    if size <= INLINE_BYTES and artifacts.local:
        await anyio.lowlevel.checkpoint()  # others run first, as they would with a thread
        return work()
    return await anyio.to_thread.run_sync(work)


def _put_each(artifacts: ArtifactBackend, items: list[tuple[str, bytes]]) -> list[ArtifactRef]:
    """An exchange's payloads (request, response head, body...), in one write to a pack;
    written before the attempt that names them is made (a worker process hands it on)."""
    with artifacts.batch():
        return [artifacts.put(namespace, data) for namespace, data in items]


@dataclass(frozen=True)
class _Wire:
    """What one exchange stored: the payloads to put, and the attempt fields they fill."""

    items: list[tuple[str, bytes]]  # (namespace, bytes), in the order of ``fields``
    fields: list[str]  # the FetchAttempt field each item's ref goes to
    extra: dict[str, Any]  # other FetchAttempt fields (codings, encoding, truncation)
    split: Split
    body: bytes  # the body as stored (cut at the cap)
    content: bytes
    sniffed: Sniffed | None = None  # the encoding an HTML content is read in, and why


def _wire(exchange: Exchange, cap: int, *, content_type: str | None,
          content_cap: int | None = None, secrets: Sequence[str] = (),
          body_secrets: Sequence[str] = ()) -> _Wire:
    """The exchange's bytes as payloads: request (its ``secrets`` sealed, the opening
    apart), head, body (cut at ``cap``), surplus, and the content derived from them where
    it differs from the body (at most ``content_cap`` bytes of it, default ``cap``)."""
    split = exchange.split()
    items: list[tuple[str, bytes]] = []
    fields: list[str] = []
    if exchange.sent:
        stored, opening = redact(bytes(exchange.sent), secrets, body_secrets)
        items.append((HEADERS_NS, stored))
        fields.append("request_headers")
        if opening is not None:
            items.append((SECRETS_NS, opening))
            fields.append("request_secrets")
    extra: dict[str, Any] = {"capture": "wire"}
    body = content = b""
    sniffed: Sniffed | None = None
    if exchange.protocol != "http/1.1":
        extra["protocol"] = exchange.protocol
        if exchange.received:  # the frames as read: the head and body derive from them
            items.append((FRAMES_NS, bytes(exchange.received)))
            fields.append("frames")
    if exchange.received and split.head:
        items.append((HEADERS_NS, split.head))
        fields.append("response_headers")
    if head_length(split.head) is not None:  # a whole head: the rest is the body
        body = split.body[:cap]
        derived = derive_content(split.head, body, cap if content_cap is None else content_cap)
        content = derived.data
        cut = derived.truncated
        if derived.transfer_coding is None and derived.content_coding is None:
            # Nothing was removed (none to remove, or one that cannot be): the body is the
            # content, as it was, whatever the content cap.
            content, cut = body, False
        items.append((BODY_NS, body))
        fields.append("body")
        if content != body:
            items.append((CONTENT_NS, content))
            fields.append("content")
        extra.update(transfer_coding=derived.transfer_coding,
                     content_coding=derived.content_coding,
                     content_truncated=cut or len(split.body) > cap
                     or not split.complete, content_problem=derived.problem)
        if split.surplus:
            items.append((BODY_NS, split.surplus))
            fields.append("surplus")
        if content and is_html(content_type):
            sniffed = sniff(content, charset_param(content_type))
            extra.update(text_encoding=sniffed.encoding, text_encoding_source=sniffed.source)
    if exchange.peer is not None and exchange.peer.chain:
        items.append((CERTS_NS, b"".join(exchange.peer.chain)))
        fields.append("chain")
    return _Wire(items, fields, extra, split, body, content, sniffed)


def _connection(peer: Peer | None, reused: bool, named: dict[str, Any]) -> dict[str, Any]:
    """The attempt's ``connection`` field (none if it never had one), taking the stored
    chain's ref out of ``named``."""
    chain = named.pop("chain", None)
    if peer is None:
        return {}
    tls = None
    if peer.tls_version is not None:
        tls = Tls(version=peer.tls_version, cipher=peer.tls_cipher or "", sni=peer.sni,
                  alpn=peer.alpn, chain=chain, verified=peer.verified)
    return {"connection": Connection(
        remote_address=peer.remote_address, remote_port=peer.remote_port,
        local_address=peer.local_address, local_port=peer.local_port, dns=peer.dns, tls=tls,
        reused=reused, proxy=None if peer.proxy is None else peer.proxy.record())}


async def fetch(client: Client, artifacts: ArtifactBackend, *, url: str,
                run_id: str, sequence: int, user_agent: str, max_body_bytes: int,
                max_content_bytes: int | None = None, keep_content: int | None = None,
                extra_headers: dict[str, str] | None = None,
                parse: Callable[[str, bytes, Sniffed | None], Any] | None = None,
                deadline: float | None = None, method: str = "GET",
                content: bytes | None = None, render_id: str | None = None,
                secrets: Sequence[str] = (), body_secrets: Sequence[str] = ()) -> FetchResult:
    """Request ``url`` once (no redirects followed), store what was exchanged, describe it.

    ``max_content_bytes``: the most content derived from the body (decompressed), default
    ``max_body_bytes``; past it the content is cut and ``content_truncated``.
    ``keep_content``: ``FetchResult.body`` holds a content of at most this many bytes, else
    b"" (None: any): a crawl holds no larger content than it reads, once it is stored.
    ``parse(content_type, content, sniffed)``, if given, runs on a 2xx response's non-empty
    content in the worker thread that stores the payloads (``sniffed``: the encoding an HTML
    content was read in, recorded in the attempt, or None); its result is
    ``FetchResult.parsed``.
    ``deadline``: seconds the whole exchange may take (None: no limit but the client's).
    ``method``, ``content`` (a request body) and ``render_id`` are for requests a browser
    made while rendering a page (``_crawl.renderproxy``): the attempt names its render.
    ``secrets``: values among ``extra_headers`` that are sealed in the stored request
    (``_crawl.secrets``): the attempt's ``request_secrets`` holds the opening;
    ``body_secrets``: values sealed wherever ``content`` carries them (a login form's).
    """
    started_at = utc_now()
    t0 = time.monotonic()
    headers = {"User-Agent": user_agent, "Accept-Encoding": "gzip, deflate",
               **(extra_headers or {})}
    common: dict[str, Any] = {
        "message_id": new_id("m-"), "attempt_id": new_id("a-"), "run_id": run_id, "url": url,
        "sequence": sequence, "started_at": started_at}
    if method != "GET":
        common["method"] = method
    if render_id is not None:
        common["render_id"] = render_id
    if not isinstance(client, Client):
        raise EvidenceError("this HTTP client does not record what crosses its connections",
                            hint="make the client with evidence._crawl.http.crawl_client()")
    response: Response | H2Response | None = None
    outcome: Outcome = "response"
    error: str | None = None
    cut = False
    exchange = Exchange(method)
    # The total deadline (connect, head, body): the client's timeout bounds each read
    # only, so a server sending a byte a second never trips it. Past the deadline the
    # attempt is a timeout that keeps what came.
    with anyio.move_on_after(math.inf if deadline is None else deadline) as scope:
        try:
            response = await client.send(method, url, headers, exchange, content)
        except FetchError as exc:  # refused by the network policy: never requested
            outcome = "skipped" if exc.refused else "timeout" if exc.timeout else "network_error"
            error = str(exc)
        if response is not None:
            outcome, error, cut = await response.read_body(max_body_bytes)
    if scope.cancelled_caught:
        if response is None:
            came = "no response head had come"
        else:
            came = f"{len(exchange.split().body)} bytes of the body had come"
        outcome, error, cut = "timeout", \
            f"deadline: the fetch took longer than {deadline:g} s; {came}", False
    if response is None:
        return await _failed(artifacts, common, outcome, error or "", exchange, t0,
                             max_body_bytes, max_content_bytes, secrets, body_secrets)
    elapsed = time.monotonic() - t0  # the exchange only: storing it is not response time
    content_type = response.headers.get("content-type")
    ok = 200 <= response.status_code < 300 and parse is not None

    size = len(exchange.received)

    def store() -> tuple[_Wire, list[ArtifactRef], Any]:
        # One trip to a worker thread: splitting, decoding and parsing are CPU work that
        # must stay off the event loop, and the puts fsync.
        wire = _derived(lambda: _wire(exchange, max_body_bytes, content_type=content_type,
                                      content_cap=max_content_bytes, secrets=secrets,
                                      body_secrets=body_secrets), size)
        exchange.close()
        refs = _put_each(artifacts, wire.items)
        usable = wire.extra.get("content_problem") is None
        parsed = None
        if ok and usable and wire.content:
            parsed = _derived(lambda: parse(content_type or "",  # type: ignore[misc]
                                            wire.content, wire.sniffed), size)
        return wire, refs, parsed

    wire, refs, parsed = await _off_the_loop(store, size, artifacts)
    if cut and wire.split.complete and len(wire.split.body) <= max_body_bytes:
        # The last read brought the body's end and bytes after it past the cap: whole.
        outcome, error, cut = "response", None, False
    extra = dict(wire.extra)
    problem = extra.pop("content_problem", None)
    if problem is not None and error is None:
        error = f"content: {problem}"
    named: dict[str, Any] = dict(zip(wire.fields, refs, strict=True))
    peer = _connection(exchange.peer, exchange.reused, named)
    attempt = FetchAttempt(
        **common, elapsed_ms=round(elapsed * 1000, 3), outcome=outcome,
        http_status=response.status_code, **named,
        body_truncated=cut or outcome != "response", content_type=content_type,
        error=error, **extra, **peer)
    kept = wire.content if keep_content is None or len(wire.content) <= keep_content else b""
    return FetchResult(attempt, response.status_code, response.headers, kept, elapsed,
                       wire.split.head, wire.body, parsed)


async def _failed(artifacts: ArtifactBackend, common: dict[str, Any], outcome: Outcome,
                  error: str, exchange: Exchange, t0: float, cap: int,
                  content_cap: int | None = None, secrets: Sequence[str] = (),
                  body_secrets: Sequence[str] = ()) -> FetchResult:
    """No response the client accepted: whatever was written and read is still stored."""
    elapsed = time.monotonic() - t0

    def store() -> tuple[_Wire, list[ArtifactRef]]:
        wire = _wire(exchange, cap, content_type=None, content_cap=content_cap,
                     secrets=secrets, body_secrets=body_secrets)
        exchange.close()
        return wire, _put_each(artifacts, wire.items)  # before the attempt names them

    wire, refs = await _off_the_loop(store, len(exchange.received), artifacts)
    named: dict[str, Any] = dict(zip(wire.fields, refs, strict=True))
    peer = _connection(exchange.peer, exchange.reused, named)
    extra = {k: v for k, v in wire.extra.items() if k != "content_problem"}
    if named.get("body") is None:  # no whole head: nothing was derived from it
        extra = {k: v for k, v in wire.extra.items() if k in ("capture", "protocol")}
    attempt = FetchAttempt(**common, elapsed_ms=round(elapsed * 1000, 3), outcome=outcome,
                           error=error[:2000], body_truncated="body" in named,
                           **named, **extra, **peer)
    return FetchResult(attempt, None, None, b"", elapsed, wire.split.head, wire.body)


def parse_retry_after(value: str | None, now: dt.datetime) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (when - now).total_seconds())
