"""One HTTP request, its payloads stored durably, described as a ``FetchAttempt``.

Order matters (DESIGN.md data flow): the request headers, response headers and body are
put in the artifact store (fsync'd) *before* the attempt message that references them
exists. Stored bytes are what crossed the wire: the request head as sent, the response
head as received (status line and raw header lines), and the body undecoded (a gzip body
is stored gzipped; parsing decodes a bounded copy). A body over the cap is cut at the cap
and recorded as truncated, never silently.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import functools
import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from ._artifacts import ArtifactRef, ArtifactStore
from ._messages import FetchAttempt, new_id, utc_now

__all__ = ["FetchResult", "fetch", "parse_retry_after"]

HEADERS_NS = "headers"
BODY_NS = "body"
_DECODE_LIMIT = 8 * 1024 * 1024  # decompressed bytes handed to the link extractor


@dataclass(frozen=True)
class FetchResult:
    attempt: FetchAttempt
    status: int | None
    headers: httpx.Headers | None
    body: bytes  # the stored body, decoded for parsing (bounded), or b""
    elapsed: float
    head: bytes = b""  # the stored response head, as recorded
    raw_body: bytes = b""  # the stored body, as received
    parsed: Any = None  # what fetch's ``parse`` made of a 2xx body, or None


def _request_head(request: httpx.Request) -> bytes:
    target = request.url.raw_path.decode("ascii", "replace")
    lines = [f"{request.method} {target} HTTP/1.1".encode()]
    lines += [name + b": " + value for name, value in request.headers.raw]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _response_head(response: httpx.Response) -> bytes:
    reason = response.reason_phrase or ""
    lines = [f"{response.http_version} {response.status_code} {reason}".encode()]
    lines += [name + b": " + value for name, value in response.headers.raw]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _decoded(body: bytes, encoding: str) -> bytes:
    """A bounded decoded copy for parsing; the stored body stays as received."""
    encoding = encoding.strip().lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        wbits = 16 + zlib.MAX_WBITS if "gzip" in encoding else zlib.MAX_WBITS
        try:
            return zlib.decompressobj(wbits).decompress(body, _DECODE_LIMIT)
        except zlib.error:
            return b""
    return body


async def _put_all(artifacts: ArtifactStore,
                   items: list[tuple[str, bytes]]) -> list[ArtifactRef]:
    """Store several payloads in one trip to a worker thread (each put fsyncs)."""
    return await anyio.to_thread.run_sync(_put_each, artifacts, items)


def _put_each(artifacts: ArtifactStore, items: list[tuple[str, bytes]]) -> list[ArtifactRef]:
    return [artifacts.put(namespace, data) for namespace, data in items]


async def _store_and_parse(artifacts: ArtifactStore, items: list[tuple[str, bytes]],
                           body: bytes, encoding: str,
                           parse: Callable[[bytes], Any] | None) -> tuple[list, bytes, Any]:
    """Store the payloads, decode the body and parse it, in one trip to a worker thread.

    One trip instead of two per page (a thread hop costs the event loop a wakeup and the
    GIL a handoff); decoding and parsing are CPU work that must stay off the loop anyway.
    """
    def work() -> tuple[list, bytes, Any]:
        refs = _put_each(artifacts, items)
        decoded = _decoded(body, encoding)
        return refs, decoded, (parse(decoded) if parse is not None and decoded else None)

    return await anyio.to_thread.run_sync(work)


async def fetch(client: httpx.AsyncClient, artifacts: ArtifactStore, *, url: str,
                run_id: str, sequence: int, user_agent: str, max_body_bytes: int,
                extra_headers: dict[str, str] | None = None,
                parse: Callable[[str, bytes], Any] | None = None,
                deadline: float | None = None) -> FetchResult:
    """Request ``url`` once (no redirects followed), store what was exchanged, describe it.

    ``parse(content_type, decoded_body)``, if given, runs on a 2xx response's non-empty
    body in the worker thread that stores the payloads; its result is ``FetchResult.parsed``.
    ``deadline``: seconds the whole exchange may take (None: no limit but the client's).
    """
    started_at = utc_now()
    t0 = time.monotonic()
    headers = {"User-Agent": user_agent, "Accept-Encoding": "gzip, deflate",
               **(extra_headers or {})}
    common = {"message_id": new_id("m-"), "attempt_id": new_id("a-"), "run_id": run_id,
              "url": url, "sequence": sequence, "started_at": started_at}
    request = client.build_request("GET", url, headers=headers)
    request_head = _request_head(request)
    response = None
    chunks: list[bytes] = []
    size = 0
    truncated = False
    outcome = "response"
    error = None
    # The total deadline (connect, head, body): the client's timeout bounds each read only,
    # so a server sending a byte a second never trips it. Past the deadline the attempt is
    # a timeout that keeps what came.
    with anyio.move_on_after(math.inf if deadline is None else deadline) as exchange:
        try:
            response = await client.send(request, stream=True, follow_redirects=False)
        except httpx.TimeoutException as exc:
            outcome, error = "timeout", f"{type(exc).__name__}: {exc}"
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            outcome, error = "network_error", f"{type(exc).__name__}: {exc}"
        if response is not None:
            try:
                async for chunk in response.aiter_raw():
                    if size + len(chunk) > max_body_bytes:
                        chunks.append(chunk[: max_body_bytes - size])
                        size = max_body_bytes
                        truncated = True
                        break
                    chunks.append(chunk)
                    size += len(chunk)
            except httpx.TimeoutException as exc:
                outcome, error = "timeout", f"body read: {type(exc).__name__}: {exc}"
            except httpx.TransportError as exc:
                outcome, error = "network_error", f"body read: {type(exc).__name__}: {exc}"
            finally:
                with anyio.CancelScope(shield=True):  # closed even past the deadline
                    await response.aclose()
    if exchange.cancelled_caught:
        outcome, error = "timeout", f"deadline: the fetch took longer than {deadline:g} s; " + (
            f"{size} bytes of the body had come" if response is not None
            else "no response head had come")
    if response is None:
        return await _failed(artifacts, common, outcome, error or "", request_head, t0)
    elapsed = time.monotonic() - t0  # the exchange only: storing it is not response time
    if truncated:
        outcome, error = "too_large", f"body cut at the cap of {max_body_bytes} bytes"
    body = b"".join(chunks)
    head = _response_head(response)
    content_type = response.headers.get("content-type")
    by_type = None
    if parse is not None and 200 <= response.status_code < 300:
        by_type = functools.partial(parse, content_type or "")
    # Every payload is durable before the attempt that references them exists.
    (request_ref, response_ref, body_ref), decoded, parsed = await _store_and_parse(
        artifacts, [(HEADERS_NS, request_head), (HEADERS_NS, head), (BODY_NS, body)],
        body, response.headers.get("content-encoding", ""), by_type)
    attempt = FetchAttempt(
        **common, elapsed_ms=round(elapsed * 1000, 3), outcome=outcome,
        http_status=response.status_code, request_headers=request_ref,
        response_headers=response_ref, body=body_ref,
        body_truncated=truncated or outcome != "response",
        content_type=content_type, error=error)
    return FetchResult(attempt, response.status_code, response.headers, decoded, elapsed,
                       head, body, parsed)


async def _failed(artifacts: ArtifactStore, common: dict, outcome: str, error: str,
                  request_head: bytes, t0: float) -> FetchResult:
    elapsed = time.monotonic() - t0
    [request_ref] = await _put_all(artifacts, [(HEADERS_NS, request_head)])  # before use
    attempt = FetchAttempt(**common, elapsed_ms=round(elapsed * 1000, 3), outcome=outcome,
                           request_headers=request_ref, error=error[:2000])
    return FetchResult(attempt, None, None, b"", elapsed)


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
