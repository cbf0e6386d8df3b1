"""A small S3 client of our own: Signature Version 4 over ``http.client``, path-style.

Why not boto3 or obstore: the artifact store's guarantees rest on two request headers, and
this module sends them exactly and visibly. A put is ``PUT`` with ``If-None-Match: *`` (a
conditional create: the server refuses it with 412 if the key exists) and with both
``Content-MD5`` and ``x-amz-checksum-sha256`` (the server recomputes them from the body it
received and refuses a mismatch with 400 ``BadDigest`` / ``InvalidDigest``), and the body's
SHA-256 is signed (``x-amz-content-sha256``). SigV4 is one HMAC chain; the transport is the
standard library's ``http.client`` with a small pool of keep-alive connections, which costs
a third of the CPU per request that httpx does (0.26 against 0.73 ms for a HEAD, measured
here; docs/benchmarks.md, "Scale-out"). tests/test_s3.py proves against a real server that
both headers are enforced.

Only what the artifact store needs: put (conditional), head, get (whole or a byte range),
list (v2, paged), delete. Every method is synchronous and thread-safe (a connection is
used by one thread at a time, then pooled): the crawler puts from worker threads and the
writer checks references on its commit thread (``backend.py``).

Failures that may pass are retried here (``_send``): a connection that could not be made
or broke mid-request, a timeout, 5xx, 408, 429 and ``SlowDown``. An object store that is
down for a while (a restart, a failover, a network cut) is an outage to ride through, not an
error: each request keeps trying, with exponential backoff (``S3Config.backoff`` doubling to
``backoff_max``) and jitter, until the outage (from its first failed request) has lasted
``S3Config.outage_deadline`` seconds (default 60; ``EVIDENCE_S3_OUTAGE_DEADLINE``, read by
``s3location.S3Location.config``), then raises an ``S3Error`` naming the endpoint and how long it
tried; past it, each request tries once until one gets an answer. Meanwhile whoever waits on the
request waits: a crawl's pages wait on their puts, the writer on its reference checks, so
the crawl pauses and nothing is acknowledged before its payloads are stored. Retrying is
safe for every request we send: GET, HEAD, LIST and DELETE are idempotent, and a retried
conditional create either creates the object or answers 412 because an earlier try whose
answer was lost (or a racing put of the same digest) did, which the caller resolves by
reading what is there. What retrying cannot fix is an ``S3Error`` at once: 403
(credentials), 404 ``NoSuchBucket``, a checksum the server refused (``BadDigest``), a
certificate that does not verify.

An outage is said once, not per retry: a warning when requests have failed for a second
(``unreachable since ..., retrying until ...``) and a line when the last of them got through
(``outage``, for a progress line, tells whether one is under way). A connection that failed
is closed, never pooled again, and the idle pool is emptied with it (after a restart every
kept-alive connection is dead), so no request after an outage reads the rest of an answer
meant for one before it. The credentials never appear in an error, a log line or a
``repr``.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import hashlib
import hmac
import http.client
import logging
import random
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from xml.etree import ElementTree

from .._errors import ArtifactError

__all__ = ["DEFAULT_OUTAGE_DEADLINE", "HeadResult", "ListedObject", "Outage", "S3Client",
           "S3Config", "S3Error", "sign_v4"]

log = logging.getLogger("evidence.s3")

_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_UNRESERVED = "-_.~"  # RFC 3986 unreserved, besides letters and digits (never encoded)
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_RETRY_CODES = frozenset({"SlowDown", "InternalError", "RequestTimeout", "ServiceUnavailable"})
DEFAULT_OUTAGE_DEADLINE = 60.0  # seconds an outage of the store is retried through
_SAY_AFTER = 1.0  # seconds of failing before an outage is logged (a lone 503 is not one)
_POOL_SIZE = 64  # idle connections kept (a crawl's worker threads, the writer's)
_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class S3Error(ArtifactError):
    """An S3 request failed: ``status`` (None: no answer) and the server's ``code``."""

    status: int | None = None
    code: str = ""


@dataclass(frozen=True, kw_only=True)
class S3Config:
    """Where the objects are and how to reach them. ``repr`` leaves the secrets out."""

    endpoint: str  # scheme://host[:port], no path
    bucket: str
    region: str = "us-east-1"
    access_key: str = field(default="", repr=False)
    secret_key: str = field(default="", repr=False)
    session_token: str = field(default="", repr=False)
    timeout: float = 30.0  # seconds one read may wait (connect, a response chunk)
    # Seconds an outage is retried through, from its first failed request (0: one try); a
    # try begun before the deadline may take ``timeout`` more.
    outage_deadline: float = DEFAULT_OUTAGE_DEADLINE
    attempts: int | None = None  # at most this many tries of one request (None: no cap)
    backoff: float = 0.05  # seconds before the first retry, doubling, with jitter
    backoff_max: float = 2.0
    ca_file: str | None = None  # trust this CA for an https endpoint (else the system's)


@dataclass(frozen=True)
class Outage:
    """The object store has been failing requests since ``since`` (seconds since the
    epoch); the request that found it so gives up at ``until`` if it does not come back."""

    endpoint: str
    since: float
    until: float
    error: str  # the first failure, as it was seen

    def describe(self) -> str:
        return (f"object store {self.endpoint} unreachable since {_clock(self.since)}, "
                f"retrying until {_clock(self.until)}")


@dataclass
class _Failing:
    """Requests of one client now retrying, and the outage they are in."""

    requests: int = 0
    outage: Outage | None = None
    said: bool = False  # the outage was logged (it lasted ``_SAY_AFTER``)
    started: float = 0.0  # time.monotonic() of the first failure
    # Set (and replaced) when any request gets an answer: those waiting to retry a store
    # they could not reach try again now, not at the end of a backoff of up to 2 s.
    reached: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class _Response:
    status_code: int
    headers: dict[str, str]  # names in lower case
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


@dataclass(frozen=True)
class HeadResult:
    size: int
    etag: str  # without its quotes
    last_modified: float  # seconds since the epoch
    checksum_sha256: str | None  # base64, when the server stored one and was asked


@dataclass(frozen=True)
class ListedObject:
    key: str
    size: int
    last_modified: float


def _quote(text: str, *, keep_slash: bool) -> str:
    return urllib.parse.quote(text, safe=_UNRESERVED + ("/" if keep_slash else ""))


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def sign_v4(*, method: str, host: str, path: str, query: Mapping[str, str],
            headers: Mapping[str, str], payload_sha256: str, access_key: str, secret_key: str,
            region: str, now: dt.datetime, service: str = "s3") -> str:
    """The ``Authorization`` header of AWS Signature Version 4 for one request.

    ``headers`` are every header to sign except ``host`` (given apart); they must already
    hold ``x-amz-date`` and ``x-amz-content-sha256``. ``path`` is the decoded path.
    """
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    signed = {"host": host, **{k.lower(): str(v).strip() for k, v in headers.items()}}
    names = sorted(signed)
    canonical = "\n".join([
        method,
        _quote(path, keep_slash=True),
        "&".join(f"{_quote(k, keep_slash=False)}={_quote(v, keep_slash=False)}"
                 for k, v in sorted(query.items())),
        "".join(f"{name}:{' '.join(signed[name].split())}\n" for name in names),
        ";".join(names),
        payload_sha256,
    ])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode("utf-8")).hexdigest()])
    key = _hmac(("AWS4" + secret_key).encode("utf-8"), day)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
    return (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}")


class _Retryable(Exception):
    def __init__(self, what: str, status: int | None = None) -> None:
        super().__init__(what)
        self.status = status


class S3Client:
    """Signed requests to one bucket. Thread-safe; ``close`` when done."""

    def __init__(self, config: S3Config) -> None:
        if not config.endpoint.startswith(("http://", "https://")):
            raise S3Error(f"S3 endpoint {config.endpoint!r} is not an http(s) URL",
                          hint="give it as http://HOST:PORT or https://HOST")
        if not 0 <= config.outage_deadline < float("inf"):
            raise S3Error(f"the S3 outage deadline must be 0 seconds or more, not "
                          f"{config.outage_deadline!r}", hint="give a number of seconds")
        if config.attempts is not None and config.attempts < 1:
            raise S3Error(f"S3 attempts must be 1 or more, not {config.attempts!r}")
        self.config = config
        parts = urllib.parse.urlsplit(config.endpoint)
        self._host = parts.netloc
        self._address = (parts.hostname or "", parts.port or (443 if parts.scheme == "https"
                                                                else 80))
        self._tls: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._tls = ssl.create_default_context(cafile=config.ca_file)
        self._idle: collections.deque[http.client.HTTPConnection] = collections.deque()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.requests = 0  # sent, retries included (for the benchmarks)
        self.retries = 0
        self.outages = 0  # outages logged (each lasted a second or more)
        self._failing = _Failing()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            self._failing.reached.set()  # retries waiting end now (the client is closed)
        self._drop_idle()

    def outage(self) -> Outage | None:
        """The outage under way, once it has lasted a second (else None)."""
        with self._lock:
            return self._failing.outage if self._failing.said else None

    # --- connections: one thread's at a time, kept alive between requests ----------------

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection (True: reused) or a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        host, port = self._address
        if self._tls is not None:
            return http.client.HTTPSConnection(host, port, timeout=self.config.timeout,
                                               context=self._tls), False
        return http.client.HTTPConnection(host, port, timeout=self.config.timeout), False

    def _release(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed.is_set() and len(self._idle) < _POOL_SIZE:
                self._idle.append(conn)
                return
        conn.close()

    def _drop_idle(self) -> None:
        """Close every pooled connection: a failure says the server went away (or was
        restarted), and each of them is then dead or about to be."""
        with self._lock:
            idle, self._idle = list(self._idle), collections.deque()
        for conn in idle:
            conn.close()

    def __repr__(self) -> str:
        return f"S3Client({self.config.endpoint!r}, bucket={self.config.bucket!r})"

    # --- requests ----------------------------------------------------------------------

    def put_if_absent(self, key: str, body: bytes, *, sha256: bytes, md5: bytes) -> bool:
        """Create ``key`` with ``body`` unless it exists: True if this call created it,
        False if the key was there already (412). The server checks both digests."""
        headers = {
            "if-none-match": "*",
            "content-md5": base64.b64encode(md5).decode("ascii"),
            "x-amz-checksum-sha256": base64.b64encode(sha256).decode("ascii"),
            "x-amz-sdk-checksum-algorithm": "SHA256",
            "content-type": "application/octet-stream",
        }
        response = self._send("PUT", key, headers=headers, body=body,
                              payload_sha256=sha256.hex(), ok=(200, 412))
        return response.status_code == 200

    def replace(self, key: str, body: bytes, *, sha256: bytes, md5: bytes,
                if_match: str) -> None:
        """Overwrite ``key`` only while it is the object whose ETag is ``if_match`` (the
        repair of a damaged object; a concurrent repair wins and this one is dropped)."""
        headers = {
            "if-match": f'"{if_match}"',
            "content-md5": base64.b64encode(md5).decode("ascii"),
            "x-amz-checksum-sha256": base64.b64encode(sha256).decode("ascii"),
            "x-amz-sdk-checksum-algorithm": "SHA256",
            "content-type": "application/octet-stream",
        }
        self._send("PUT", key, headers=headers, body=body, payload_sha256=sha256.hex(),
                   ok=(200, 412))

    def touch(self, key: str, *, if_match: str) -> None:
        """Refresh the object's Last-Modified: a server-side copy onto itself (the same
        bytes), only while it is the object whose ETag is ``if_match``."""
        source = _quote(f"/{self.config.bucket}/{key}", keep_slash=True)
        self._send("PUT", key, headers={"x-amz-copy-source": source,
                                        "x-amz-copy-source-if-match": f'"{if_match}"',
                                        "x-amz-metadata-directive": "REPLACE"},
                   ok=(200, 412))

    def head(self, key: str, *, checksum: bool = False) -> HeadResult | None:
        """The object's size, ETag and time, or None if there is none."""
        headers = {"x-amz-checksum-mode": "ENABLED"} if checksum else {}
        response = self._send("HEAD", key, headers=headers, ok=(200, 404))
        if response.status_code == 404:
            return None
        return HeadResult(
            size=int(response.headers.get("content-length", "0")),
            etag=response.headers.get("etag", "").strip('"'),
            last_modified=_http_time(response.headers.get("last-modified")),
            checksum_sha256=response.headers.get("x-amz-checksum-sha256"))

    def get(self, key: str, *, start: int | None = None, end: int | None = None
            ) -> bytes | None:
        """The object's bytes (``start``..``end`` inclusive, a range), or None if absent."""
        headers = {} if start is None else {
            "range": f"bytes={start}-{'' if end is None else end}"}
        response = self._send("GET", key, headers=headers, ok=(200, 206, 404))
        if response.status_code == 404:
            return None
        return response.content

    def delete(self, key: str) -> None:
        """Delete ``key`` (S3 answers 204 whether or not it existed)."""
        self._send("DELETE", key, ok=(200, 204, 404))

    def list(self, prefix: str, *, delimiter: str | None = None, start_after: str = ""
             ) -> Iterator[ListedObject | str]:
        """Keys under ``prefix`` in the server's (byte) order, page by page; with a
        ``delimiter``, each common prefix (a ``str``) once, between the objects."""
        token = ""
        while True:
            query = {"list-type": "2", "prefix": prefix, "max-keys": "1000"}
            if delimiter:
                query["delimiter"] = delimiter
            if token:
                query["continuation-token"] = token
            elif start_after:
                query["start-after"] = start_after
            response = self._send("GET", "", query=query, ok=(200,))
            root = _xml(response)
            for node in root.findall(f"{_S3_NS}CommonPrefixes"):
                yield _text(node, "Prefix")
            for node in root.findall(f"{_S3_NS}Contents"):
                yield ListedObject(key=_text(node, "Key"), size=int(_text(node, "Size")),
                                   last_modified=_iso_time(_text(node, "LastModified")))
            if _text(root, "IsTruncated") != "true":
                return
            token = _text(root, "NextContinuationToken")
            if not token:
                raise S3Error("the server said the listing goes on but gave no "
                              "continuation token", hint="check the S3 server")

    def bucket_exists(self) -> bool:
        response = self._send("HEAD", None, ok=(200, 404))
        return response.status_code == 200

    # --- the one place requests are made -------------------------------------------------

    def _send(self, method: str, key: str | None, *, headers: Mapping[str, str] | None = None,
              query: Mapping[str, str] | None = None, body: bytes = b"",
              payload_sha256: str | None = None, ok: tuple[int, ...]) -> _Response:
        """Sign and send; retry what may pass until the outage deadline; raise ``S3Error``
        otherwise (module docstring)."""
        config = self.config
        path = f"/{config.bucket}" if key is None else f"/{config.bucket}/{key}"
        if key == "":
            path = f"/{config.bucket}"
        query = dict(query or {})
        payload_sha256 = payload_sha256 or (hashlib.sha256(body).hexdigest() if body
                                            else _EMPTY_SHA256)
        delay = config.backoff
        attempt = 0
        give_up = 0.0  # time.monotonic() past which this request stops retrying
        failing = False  # this request is counted in ``_failing``
        try:
            while True:
                attempt += 1
                if self._closed.is_set():
                    raise S3Error(f"the S3 client for {config.endpoint} was closed")
                try:
                    response = self._once(method, path, query, dict(headers or {}), body,
                                          payload_sha256, ok)
                except _Retryable as exc:
                    now = time.monotonic()
                    if not failing:
                        failing = True
                        give_up = self._failed_first(exc, now)
                    if now >= give_up or (config.attempts is not None
                                          and attempt >= config.attempts):
                        raise self._gave_up(method, path, exc, attempt, now) from exc
                    self._still_failing()
                    self.retries += 1
                    wait = min(delay * random.uniform(0.5, 1.0), give_up - now)
                    log.debug("S3 %s %s: %s; retrying in %.2f s (try %d)", method, path, exc,
                              wait, attempt + 1, extra={"event": "s3.retry"})
                    self._pause(wait, unreachable=exc.status is None)
                    delay = min(delay * 2, config.backoff_max)
                    continue
                except S3Error:  # an answer, if not the one hoped for: the store is back
                    self._answered(failing)
                    failing = False
                    raise
                self._answered(failing)
                failing = False
                return response
        finally:
            if failing:  # gave up, closed, or interrupted: no longer one of the failing
                self._stopped_failing()

    def _pause(self, seconds: float, *, unreachable: bool) -> None:
        """Wait before a retry. One that could not reach the store at all retries as soon
        as another request gets an answer (it is back); one answered 5xx or SlowDown
        waits its backoff out (the store asked for less load). ``close`` ends either."""
        if not unreachable:
            self._closed.wait(seconds)
            return
        with self._lock:
            reached = self._failing.reached
        if self._closed.is_set():
            return
        reached.wait(seconds)

    # --- the outage record: said once when it has lasted, and once when it ends -----------

    def _failed_first(self, exc: _Retryable, now: float) -> float:
        """This request joins the outage (the first failure starts it); it retries until
        the outage has lasted the deadline, whenever this request began: so once an outage
        has outlasted it, each request tries once and fails (``verify`` of a store that
        stays down does not wait a deadline per object)."""
        with self._lock:
            failing = self._failing
            failing.requests += 1
            if failing.outage is None:
                wall = time.time()
                failing.outage = Outage(endpoint=self.config.endpoint, since=wall,
                                        until=wall + self.config.outage_deadline,
                                        error=str(exc))
                failing.started = now
            return failing.started + self.config.outage_deadline

    def _still_failing(self) -> None:
        with self._lock:
            failing = self._failing
            if (failing.outage is None or failing.said
                    or time.monotonic() - failing.started < _SAY_AFTER):
                return
            failing.said = True
            self.outages += 1
            outage = failing.outage
        log.warning("%s (%s); requests wait meanwhile (S3 outage deadline %g s)",
                    outage.describe(), outage.error, self.config.outage_deadline,
                    extra={"event": "s3.outage"})

    def _answered(self, was_failing: bool) -> None:
        """Any answer (a success, or an error retrying cannot fix): the store is reachable.
        Requests waiting to retry try now, and the outage is over once none is left."""
        if not was_failing and self._failing.outage is None:  # the usual case: no lock
            return
        reached: threading.Event | None = None
        with self._lock:
            failing = self._failing
            if was_failing:
                failing.requests -= 1
            if failing.requests:  # they end it, each with its own answer
                reached, failing.reached = failing.reached, threading.Event()
            else:
                self._failing = _Failing()
        if reached is not None:
            reached.set()
        elif (outage := failing.outage) is not None and failing.said:
            log.warning("object store %s reachable again after %.1f s of outage",
                        outage.endpoint, time.time() - outage.since,
                        extra={"event": "s3.reachable"})

    def _stopped_failing(self) -> None:
        """A request gave up (or the client was closed): the outage goes on until an
        answer comes; past its deadline, each request tries once."""
        with self._lock:
            self._failing.requests -= 1

    def _gave_up(self, method: str, path: str, exc: _Retryable, attempt: int,
                 now: float) -> S3Error:
        config = self.config
        with self._lock:
            started = self._failing.started
        what = f"S3 {method} {path} at {config.endpoint} failed after {attempt} " \
               f"{'try' if attempt == 1 else 'tries'}"
        if now - started >= config.outage_deadline:
            what += (f"; the object store has failed requests for {now - started:.1f} s, "
                     f"past its outage deadline (EVIDENCE_S3_OUTAGE_DEADLINE) of "
                     f"{config.outage_deadline:g} s")
        return S3Error(
            f"{what}; last: {exc}",
            hint="check that the object store is up and reachable from here; to wait "
            "longer for it, set EVIDENCE_S3_OUTAGE_DEADLINE (seconds; crawl: "
            "--s3-outage-deadline). A crawl can be resumed once it is back",
            status=exc.status)

    def _once(self, method: str, path: str, query: dict[str, str], headers: dict[str, str],
              body: bytes, payload_sha256: str, ok: tuple[int, ...]) -> _Response:
        config = self.config
        now = dt.datetime.now(dt.UTC)
        headers["x-amz-date"] = now.strftime("%Y%m%dT%H%M%SZ")
        headers["x-amz-content-sha256"] = payload_sha256
        if config.session_token:
            headers["x-amz-security-token"] = config.session_token
        if body or method == "PUT":
            headers["content-length"] = str(len(body))
        headers["authorization"] = sign_v4(
            method=method, host=self._host, path=path, query=query, headers=headers,
            payload_sha256=payload_sha256, access_key=config.access_key,
            secret_key=config.secret_key, region=config.region, now=now)
        url = _quote(path, keep_slash=True)
        if query:
            url += "?" + "&".join(f"{_quote(k, keep_slash=False)}={_quote(v, keep_slash=False)}"
                                  for k, v in sorted(query.items()))
        headers["host"] = self._host
        response = self._exchange(method, url, headers, body)
        status = response.status_code
        if status in ok:
            return response
        code, message = _error_of(response)
        if status in _RETRY_STATUS or code in _RETRY_CODES:
            raise _Retryable(f"HTTP {status} {code} {message}".strip(), status)
        raise S3Error(
            f"S3 {method} {path} at {config.endpoint}: HTTP {status} {code}: {message}".rstrip(),
            hint=_hint(status, code), status=status, code=code)


    def _exchange(self, method: str, url: str, headers: dict[str, str],
                  body: bytes) -> _Response:
        """One request and its whole answer. A kept-alive connection the server closed
        while idle fails before any answer: that one is tried once more on a new
        connection, silently; any other failure is ``_Retryable``. A connection that
        failed is closed, and the idle ones with it (``_drop_idle``)."""
        while True:
            conn, reused = self._connection()
            self.requests += 1
            try:
                conn.request(method, url, body=body if body or method == "PUT" else None,
                             headers=headers)
                answer = conn.getresponse()
                content = answer.read()
            except ssl.SSLCertVerificationError as exc:  # no retry makes it trusted
                conn.close()
                raise S3Error(f"S3 {method} at {self.config.endpoint}: the server's "
                              f"certificate does not verify: {exc.verify_message}",
                              hint="give its CA with ?ca=FILE in the s3:// URL or "
                              "AWS_CA_BUNDLE") from exc
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._drop_idle()
                if reused and isinstance(exc, http.client.RemoteDisconnected | BrokenPipeError
                                         | ConnectionResetError):
                    continue  # the idle connection had been closed by the server
                # Not connected, cut mid-request, timed out: the outcome of a PUT is
                # unknown, and retrying it is safe (module docstring).
                what = "timed out" if isinstance(exc, socket.timeout | TimeoutError) else (
                    str(exc) or "no answer")
                raise _Retryable(f"{type(exc).__name__}: {what}") from exc
            except BaseException:
                conn.close()  # half a request or an answer: never pooled
                raise
            response = _Response(answer.status,
                                 {k.lower(): v for k, v in answer.getheaders()}, content)
            if answer.will_close:
                conn.close()
            else:
                self._release(conn)
            return response


def _hint(status: int, code: str) -> str:
    if status == 403 or code in ("InvalidAccessKeyId", "SignatureDoesNotMatch",
                                 "AccessDenied"):
        return ("check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and the "
                "region (AWS_REGION)")
    if code == "NoSuchBucket":
        return "create the bucket first, or check its name in the s3:// URL"
    if code in ("BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch"):
        return "the bytes were changed on the way to the server; retry, and check the network"
    return "check the object store's logs"


def _error_of(response: _Response) -> tuple[str, str]:
    """(code, message) of an S3 error answer; a HEAD has no body, so only its status."""
    if not response.content:
        return "", ""
    try:
        root = ElementTree.fromstring(response.content)
    except ElementTree.ParseError:
        return "", response.text[:200]
    return (root.findtext("Code") or "").strip(), (root.findtext("Message") or "").strip()


def _xml(response: _Response) -> ElementTree.Element:
    try:
        return ElementTree.fromstring(response.content)
    except ElementTree.ParseError as exc:
        raise S3Error(f"the S3 server sent a listing that is not XML: {exc}",
                      hint="check that the endpoint is an S3 server") from exc


def _text(node: ElementTree.Element, name: str) -> str:
    found = node.find(f"{_S3_NS}{name}")
    if found is None:
        found = node.find(name)  # a server that leaves out the namespace
    return (found.text or "") if found is not None else ""


def _clock(epoch: float) -> str:
    """A time of day for a log line (the log's own stamps are local time too)."""
    return dt.datetime.fromtimestamp(epoch).strftime("%H:%M:%S")


def _http_time(text: str | None) -> float:
    if not text:
        return 0.0
    try:
        return parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError):
        return 0.0


def _iso_time(text: str) -> float:
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
