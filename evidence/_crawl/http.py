"""The crawler's HTTP client (HTTP/1.1, and HTTP/2 where the server picks it): it writes
each request and reads each response itself, so what it stores is what crossed the
connection, and no second HTTP parser reads it.

    async with crawl_client(connections=8, timeout=30.0) as client:
        exchange = Exchange("GET")
        response = await client.send("GET", url, {"User-Agent": ua}, exchange)  # head read
        outcome, error, cut = await response.read_body(cap)  # body read, connection released
    exchange.sent, exchange.received      # bytes written, bytes read: exactly

An exchange is one request's bytes: the request as written (head and body in one write,
recorded once it was written), and every byte read for its response, in order: interim 1xx
heads, the final head, the body as framed (chunk framing and trailers included), and any
bytes that came in the same read after the body's end (``surplus``). Where the head and
body end is decided by ``_model.http1``, the same rules that split the stored bytes again
later (``split_response``), so the client and every reader of the evidence agree.

HTTP/2 (issue 33): TLS offers ALPN ``h2, http/1.1`` (``http1_only``: ``http/1.1`` alone),
and a server that picks h2 gets one connection per origin (``_H2Connection``, the ``h2``
package's state machine), each request on a stream of its own, as many at once as the
server's SETTINGS_MAX_CONCURRENT_STREAMS allows within the client's slots. Its exchange
(``Exchange.protocol`` "h2") records the frames written and read with its stream's id,
each as it crossed the connection, and each GOAWAY read while it was open; the head and
body are derived from them by ``_model.http2`` (``Exchange.split``), which also derives
the head the client acts on, so the client and every reader agree. The client sends
SETTINGS_HEADER_TABLE_SIZE 0 and keeps no HPACK table itself: each stored header block
decodes on its own (``_model.http2``), and a response block that does not is a
``RemoteProtocolError``. Requests to an origin whose protocol is not known yet connect one
at a time, so they share the one h2 connection; plain ``http:`` is always HTTP/1.1.

The client is deliberately small: over HTTP/1.1 one request at a time per connection (no
pipelining), no redirects followed, no retries (a retry would be a request the evidence does
not record: the crawler retries through its frontier, each attempt recorded), no cookies
or credentials of its own accord (a request depends only on its URL and the headers its
caller gives: the crawl's configured headers, its session's cookie jar and credentials
come from ``_crawl.secrets``; a ``Set-Cookie`` is kept as evidence in the response head),
none from a URL's userinfo.
With a network policy (``_crawl.netpolicy``; a crawl always has one) the client connects
only to addresses the policy allows: the host is resolved once, each address checked, and
the connection made to a checked address. TLS trusts the system's certificate authorities
(OpenSSL's default paths; ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` override them), and
verifies the host name.

Connections: at most ``connections`` open at once, kept alive between requests to the same
origin and reused most recently used first. A connection is reused only if its response
ended exactly where its framing says (no surplus, nothing missing), the response did not ask
to close (``Connection: close``, HTTP/1.0), and its body was not delimited by the close; an
idle connection is dropped after ``KEEPALIVE`` seconds, or when the server closed it or sent
bytes nobody asked for. Connections are ``_net`` streams under asyncio (a socket that stays
registered for reading; one timer per wait bounds each read and write). A response
abandoned half-way (a deadline, a cap, an error, a cancellation) closes its connection: its
unread bytes never become the next request's response.

Each connection also records with whom and how (issue 33), as a ``Peer`` the exchanges over
it carry (``Exchange.peer``, ``Exchange.reused``): the remote address and port actually
connected to and the local ones, as the socket reports them; the resolver's answer that
gave the remote address (``_crawl.netpolicy``: the one resolution the policy checked, never
a second one); for TLS the negotiated version, cipher and ALPN protocol, the SNI sent (none
for an address literal: TLS sends no SNI for one), the server's certificate chain as it
presented it (DER, leaf first), and the verification result. The client verifies every
chain it accepts (a handshake that fails verification is a ``ConnectError`` that names
why), so a recorded chain was verified against the trust store, host name included.

Through a proxy (``_crawl.proxy``; ``Client(proxies=...)`` says which host goes through
which), the connection is a tunnel the proxy opened to the origin, and the client speaks to
the origin inside it exactly as it would directly: the exchange's bytes are the origin's,
the tunnel's handshake is a fact of the ``Peer`` (``proxy``), and ``remote_address`` is the
proxy's address. A proxy that refuses the tunnel is a ``ProxyError`` whose ``peer`` says
what it answered.

Errors: a request that got no response head the client accepts raises ``FetchError``,
named as the step that failed (``ConnectError``, ``ConnectTimeout``, ``WriteError``,
``WriteTimeout``, ``ReadError``, ``ReadTimeout``, ``RemoteProtocolError`` for a malformed or
missing head, ``UnsupportedProtocol``, ``InvalidURL``, ``ProxyError``; ``NetworkPolicy``,
with ``refused`` set, for a connection the policy refused before anything was sent); a
failure while reading the body is the ``read_body`` outcome, with the bytes that came kept
in the exchange.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import select
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import quote, urlsplit

import anyio
import anyio.abc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from anyio.streams.tls import TLSAttribute, TLSStream
from hyperframe.frame import GoAwayFrame

from .._model import http2
from .._model.http1 import (
    ChunkedBody,
    Split,
    final_head,
    framing,
    head_length,
    head_problem,
    parse_head,
)
from .._model.messages import DnsAnswer, Outcome
from .._model.wire import wire_format
from .._net import Stream, acquire, connect_tcp
from .netpolicy import NetworkPolicy, Origin, Refused
from .proxy import ProxyFailed, Routes, Tunnel, open_tunnel

__all__ = ["Client", "Exchange", "FetchError", "H2Response", "Headers", "Peer", "Response",
           "crawl_client"]

KEEPALIVE = 5.0  # seconds an idle connection is kept
MAX_HEAD = 256 * 1024  # bytes of response heads (interim ones included) the client reads
MAX_INTERIM = 32  # interim (1xx) responses before the final one
READ_SIZE = 64 * 1024
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # an empty one says Content-Length: 0
_TARGET_OK = re.compile(r"[!$&'()*+,\-./0-9:;=?@A-Z_a-z~%]*")  # sent as it is
_TARGET_SAFE = "!$&'()*+,-./:;=?@_~%"  # kept by quote(): the rest is percent-encoded
_BAD_VALUE = re.compile(r"[\r\n\x00]")
_BLANK_LINE = re.compile(rb"\n\r?\n")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a field name (RFC 9110 section 5.1)
# HTTP/2: the stream window the client grants (a response of up to this many bytes needs
# no WINDOW_UPDATE: fewer frames of the client's in a stream's record), and the fields
# HTTP/2 forbids (RFC 9113 section 8.2.2: connection-specific; Host becomes :authority).
H2_WINDOW = 16 * 1024 * 1024
_H2_DROPPED = frozenset({"host", "connection", "keep-alive", "proxy-connection",
                         "transfer-encoding", "upgrade", "te"})


@dataclass(frozen=True)
class Peer:
    """With whom and how a connection was made (the module's doc): addresses as the socket
    reports them; the TLS fields are None on a plain connection."""

    remote_address: str
    remote_port: int
    local_address: str
    local_port: int
    dns: DnsAnswer | None = None  # the answer the remote address came from
    tls_version: str | None = None
    tls_cipher: str | None = None
    alpn: str | None = None
    sni: str | None = None
    chain: tuple[bytes, ...] = ()  # DER certificates, leaf first, as the server sent them
    verified: bool = False
    proxy: Tunnel | None = None  # the tunnel it went through (``_crawl.proxy``)


class Exchange:
    """The bytes one request wrote to its connection and read from it, in order, and the
    connection it went over (``peer``; ``reused``: an earlier request went over it)."""

    __slots__ = ("_split", "method", "peer", "protocol", "received", "reused", "sent")

    def __init__(self, method: str) -> None:
        self.method = method
        # "http/1.1": ``sent`` and ``received`` are the bytes of the connection; "h2": the
        # frames of the request's stream (``_model.http2``).
        self.protocol = "http/1.1"
        self.sent = bytearray()
        self.received = bytearray()
        self._split: Split | None = None
        self.peer: Peer | None = None
        self.reused = False

    def split(self) -> Split:
        """The response's head, body and surplus (computed once the exchange is over)."""
        if self._split is None:
            try:
                self._split = wire_format(self.protocol).split_response(self.received,
                                                                        self.method)
            except ValueError:  # frames stored as read, from which no head is derived
                self._split = Split(b"", b"", b"", self.protocol, False)
        return self._split

    def close(self) -> None:
        """Drop the bytes (they are stored by then)."""
        self.sent, self.received, self._split = bytearray(), bytearray(), None


class Headers:
    """A response's header fields by name: names compared case-insensitively, the values of
    a repeated field joined by ", ", decoded as ASCII if the whole head is ASCII, else as
    UTF-8 if it all decodes so, else as Latin-1 (as httpx reads them)."""

    __slots__ = ("_encoding", "raw")

    def __init__(self, fields: list[tuple[bytes, bytes]]) -> None:
        self.raw = fields  # (name, value) as sent, values stripped (``parse_head``)
        self._encoding: str | None = None

    @property
    def encoding(self) -> str:
        if self._encoding is None:
            self._encoding = "iso-8859-1"
            for encoding in ("ascii", "utf-8"):
                try:
                    for name, value in self.raw:
                        name.decode(encoding)
                        value.decode(encoding)
                except UnicodeDecodeError:
                    continue
                self._encoding = encoding
                break
        return self._encoding

    def get(self, name: str, default: str | None = None) -> str | None:
        wanted = name.lower().encode("latin-1")
        values = [v for n, v in self.raw if n.lower() == wanted]
        return b", ".join(values).decode(self.encoding) if values else default

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None


class FetchError(Exception):
    """No response head the client accepts: ``kind`` names the step that failed;
    ``refused``: the network policy refused the connection (nothing was sent); ``peer``:
    the connection as far as it went (a proxy that refused the tunnel), if any."""

    def __init__(self, kind: str, detail: str, *, timeout: bool = False,
                 refused: bool = False, peer: Peer | None = None) -> None:
        super().__init__(detail if refused else f"{kind}: {detail}")
        self.kind = kind
        self.timeout = timeout
        self.refused = refused
        self.peer = peer


class _Connection:
    __slots__ = ("alpn", "idle_since", "origin", "peer", "raw", "requests", "socket",
                 "stream")

    def __init__(self, origin: Origin, stream: anyio.abc.ByteStream,
                 dns: DnsAnswer | None = None, tunnel: Tunnel | None = None) -> None:
        self.origin, self.stream = origin, stream
        self.requests = 0  # requests written over it so far
        inner = stream.transport_stream if isinstance(stream, TLSStream) else stream
        # A _net.Stream bounds each of its waits itself (the client's timeout); anyio's
        # streams (under trio) are bounded by a cancel scope per call.
        self.raw: Stream | None = inner if isinstance(inner, Stream) else None
        self.socket: socket.socket | None = stream.extra(anyio.abc.SocketAttribute.raw_socket,
                                                         None)
        self.idle_since = 0.0
        self.peer = _peer(self.socket, stream, origin, dns, tunnel)
        tls = stream.extra(TLSAttribute.ssl_object, None)
        self.alpn: str | None = None if tls is None else tls.selected_alpn_protocol()

    def readable(self) -> bool:
        """Whether a read would not block (the server closed it, or sent bytes unasked)."""
        if self.raw is not None:
            return not self.raw.at_rest()
        return _readable(self.socket)

    def bounded(self, timeout: float) -> contextlib.AbstractContextManager[object]:
        """Where a read or write waits at most ``timeout`` seconds (TimeoutError)."""
        return contextlib.nullcontext() if self.raw is not None else anyio.fail_after(timeout)

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(OSError, anyio.BrokenResourceError):
                await self.stream.aclose()


def _peer(sock: socket.socket | None, stream: anyio.abc.ByteStream, origin: Origin,
          dns: DnsAnswer | None, tunnel: Tunnel | None = None) -> Peer | None:
    """What the socket and the TLS layer say of a connection just made (None if the socket
    cannot say whom it is connected to: then nothing is claimed)."""
    if sock is None:
        return None
    try:
        remote, local = sock.getpeername()[:2], sock.getsockname()[:2]
    except OSError:
        return None
    tls = stream.extra(TLSAttribute.ssl_object, None)
    if tls is None:
        return Peer(remote[0], remote[1], local[0], local[1], dns, proxy=tunnel)
    cipher = tls.cipher()
    sni: str | None = origin.host
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(origin.host)
        sni = None  # TLS never names an address literal (RFC 6066 section 3)
    return Peer(remote[0], remote[1], local[0], local[1], dns, tls_version=tls.version(),
                tls_cipher=cipher[0] if cipher else None, alpn=tls.selected_alpn_protocol(),
                sni=sni, chain=_chain(tls),
                verified=tls.context.verify_mode == ssl.CERT_REQUIRED, proxy=tunnel)


def _chain(tls: ssl.SSLObject) -> tuple[bytes, ...]:
    """The certificates the server presented, DER, leaf first: ``get_unverified_chain``
    (public since Python 3.13; the same method of the C object before), else the leaf."""
    chain = getattr(tls, "get_unverified_chain", None)
    if chain is None:
        chain = getattr(getattr(tls, "_sslobj", None), "get_unverified_chain", None)
    if chain is not None:
        certificates = chain() or []
        der = ssl._ssl.ENCODING_DER  # type: ignore[attr-defined]
        return tuple(c if isinstance(c, bytes) else c.public_bytes(der) for c in certificates)
    leaf = tls.getpeercert(binary_form=True)
    return (leaf,) if leaf else ()


def _readable(sock: socket.socket | None) -> bool:
    """Whether a read would not block; a socket that is gone counts as readable (EOF)."""
    fd = -1 if sock is None else sock.fileno()
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


@dataclass(frozen=True)
class _Prepared:
    """A request checked and laid out, before any protocol writes it."""

    origin: Origin
    method: str
    target: str  # the path and query, as sent
    authority: str  # the host and port (the port only if not the scheme's default)
    fields: list[tuple[str, str]]  # in the order sent: Host first, then defaults, caller's
    content: bytes | None


def _prepare(method: str, url: str, headers: Mapping[str, str],
             content: bytes | None) -> _Prepared:
    """Where to connect and what to send, checked (FetchError ``InvalidURL`` if it cannot
    be sent as it is)."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        port = parts.port
        host = parts.hostname or ""
    except ValueError as exc:
        raise FetchError("InvalidURL", f"{exc}: {url[:200]!r}") from None
    if scheme not in ("http", "https"):
        raise FetchError("UnsupportedProtocol", f"not an http or https URL: {url[:200]!r}")
    if not host:
        raise FetchError("InvalidURL", f"no host in {url[:200]!r}")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise FetchError("InvalidURL", f"host {host!r}: {exc}") from None
    default = 443 if scheme == "https" else 80
    port = default if port is None else port
    name = f"[{host}]" if ":" in host else host
    authority = name if port == default else f"{name}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not _TARGET_OK.fullmatch(target):
        target = quote(target, safe=_TARGET_SAFE)
    # Host first, then the defaults, then the caller's fields (a caller's field replaces a
    # default of the same name, case-insensitively, in its place).
    fields: dict[str, tuple[str, str]] = {}
    if not any(key.lower() == "host" for key in headers):
        fields["host"] = ("Host", authority)
    fields["accept"] = ("Accept", "*/*")
    fields["accept-encoding"] = ("Accept-Encoding", "gzip, deflate")
    fields["connection"] = ("Connection", "keep-alive")
    for key, value in headers.items():
        fields[key.lower()] = (key, value)
    if content is not None or method in _BODY_METHODS:
        fields.pop("transfer-encoding", None)
        fields["content-length"] = ("Content-Length", str(len(content or b"")))
    for key, value in fields.values():
        if not _TOKEN.fullmatch(key) or _BAD_VALUE.search(value):
            raise FetchError("InvalidURL", f"header {key[:80]!r} cannot be sent as it is")
        try:
            value.encode("latin-1")
        except UnicodeEncodeError as exc:
            raise FetchError("InvalidURL", f"a header that is not Latin-1: {exc}") from None
    return _Prepared(Origin(scheme, host, port), method, target, authority,
                     list(fields.values()), content)


def _request(method: str, url: str, headers: Mapping[str, str],
             content: bytes | None) -> tuple[Origin, bytes]:
    """Where to connect and the request's HTTP/1.1 bytes (head, then body)."""
    prepared = _prepare(method, url, headers, content)
    return prepared.origin, _http1(prepared)


def _http1(prepared: _Prepared) -> bytes:
    """The request's HTTP/1.1 bytes (head, then body)."""
    lines = [f"{prepared.method} {prepared.target} HTTP/1.1"]
    lines += [f"{key}: {value}" for key, value in prepared.fields]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (prepared.content or b"")


class Response:
    """A response whose head was read; ``read_body`` reads the rest and releases the
    connection (call it, or ``aclose``, exactly once)."""

    __slots__ = ("_chunks", "_client", "_connection", "_end", "_head_end", "_keep_alive",
                 "_kind", "_length", "exchange", "headers", "status_code")

    def __init__(self, client: Client, connection: _Connection, exchange: Exchange,
                 head_end: int, method: str) -> None:
        self._client, self._connection, self.exchange = client, connection, exchange
        whole = bytes(exchange.received[:head_end])  # interim 1xx heads included
        head = final_head(whole)
        status, fields = parse_head(head)
        problem = head_problem(whole, fields)
        if problem is not None:
            raise FetchError("RemoteProtocolError", problem)
        self.status_code: int = status or 0
        self.headers = Headers(fields)
        self._head_end = head_end
        self._kind, self._length = framing(status, fields, method)
        version = head[:head.find(b" ")]
        close = "close" in (self.headers.get("connection") or "").lower()
        self._keep_alive = (version == b"HTTP/1.1" and not close and self._kind != "close"
                            and self.status_code >= 200)  # never after 101 Switching Protocols
        self._end: int | None = None  # where the body ended, once it has
        # A chunked body is scanned as it comes, each byte once (a hostile server sending
        # a million one-byte chunks costs one pass, not one per read).
        self._chunks = ChunkedBody(head_end, strict=True) if self._kind == "chunked" else None

    async def read_body(self, cap: int) -> tuple[Outcome, str | None, bool]:
        """Read the body until its end or ``cap`` bytes past the head: (outcome, error,
        cut at the cap); outcome "response", "too_large", "timeout" or "network_error"."""
        try:
            return await self._read_body(cap)
        finally:
            await self.aclose()

    async def _read_body(self, cap: int) -> tuple[Outcome, str | None, bool]:
        received, start = self.exchange.received, self._head_end
        while True:
            try:
                self._end = self._body_end()
            except ValueError as exc:
                return "network_error", f"body read: RemoteProtocolError: {exc}", False
            if (self._end if self._end is not None else len(received)) - start > cap:
                return "too_large", f"body cut at the cap of {cap} bytes", True
            if self._end is not None:
                return "response", None, False
            try:
                more = await self._client._receive(self._connection, self.exchange)
            except FetchError as exc:
                return ("timeout" if exc.timeout else "network_error"), f"body read: {exc}", False
            if not more:
                if self._kind == "close":
                    self._end = len(received)
                    return "response", None, False
                came = len(received) - start
                expected = f" of {self._length}" if self._kind == "length" else ""
                return ("network_error", "body read: RemoteProtocolError: the server closed the "
                        f"connection before the body's end ({came}{expected} bytes came)", False)

    def _body_end(self) -> int | None:
        """Where the body ends in what was read so far, or None if it has not come yet (a
        "close" body ends only at the end of the stream); ValueError if a chunked body
        stops being chunked."""
        if self._chunks is not None:
            return self._chunks.end(self.exchange.received)
        if self._kind == "none":
            return self._head_end
        end = self._head_end + self._length
        if self._kind == "length" and len(self.exchange.received) >= end:
            return end
        return None

    async def aclose(self) -> None:
        """Release the connection: back to the pool if its response ended exactly, else
        closed."""
        connection, self._connection = self._connection, None  # type: ignore[assignment]
        if connection is None:
            return
        whole = self._end is not None and self._end == len(self.exchange.received)
        await self._client._release(connection, reuse=whole and self._keep_alive)


class _H2Stream:
    """One request's stream on an HTTP/2 connection, and what has come for it."""

    __slots__ = ("body", "ended", "error", "exchange", "final", "id", "reset")

    def __init__(self, stream_id: int, exchange: Exchange) -> None:
        self.id, self.exchange = stream_id, exchange
        self.final = False  # the final (non-1xx) response head came
        self.ended = False  # the server ended the stream (END_STREAM)
        self.reset: int | None = None  # the server reset it: the error code
        self.error: FetchError | None = None  # it cannot go on (the connection failed)
        self.body = 0  # DATA bytes received


class _H2Connection:
    """An HTTP/2 connection to one origin, shared by the requests to it, each on a stream
    of its own (at most as many at once as the server's SETTINGS_MAX_CONCURRENT_STREAMS;
    the client's slots bound them all). No task of its own reads it: a request waiting for
    its stream reads the connection for all of them (one at a time; the others wait for
    what it read), so nothing runs when no request waits. Every frame read or written with
    a stream's id is recorded in that stream's exchange, and each GOAWAY read in every open
    one (``_model.http2``)."""

    def __init__(self, client: Client, connection: _Connection) -> None:
        self.client, self.connection = client, connection
        self.origin = connection.origin
        config = h2.config.H2Configuration(client_side=True, header_encoding=None,
                                           normalize_outbound_headers=False,
                                           normalize_inbound_headers=False)
        self.h2 = h2.connection.H2Connection(config=config)
        codes = h2.settings.SettingCodes
        # A table size of 0: each header block stands alone (``_model.http2``).
        self.h2.local_settings = h2.settings.Settings(client=True, initial_values={
            codes.HEADER_TABLE_SIZE: 0, codes.ENABLE_PUSH: 0,
            codes.INITIAL_WINDOW_SIZE: H2_WINDOW, codes.MAX_HEADER_LIST_SIZE: MAX_HEAD})
        self.h2.encoder.header_table_size = 0
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(H2_WINDOW)
        self.streams: dict[int, _H2Stream] = {}
        self._pending = bytearray()  # bytes read that are not a whole frame yet
        self._preface = True  # the next write starts with the client's preface
        self._reading = False
        self._changed = anyio.Event()
        self._writing = anyio.Lock()
        self.failure: FetchError | None = None  # the connection is gone, and why
        self.closing = False  # the server sent GOAWAY: no new streams
        self.idle_since = time.monotonic()

    async def usable(self) -> bool:
        """Whether a new request may go over it. An idle one first reads what came while
        no request read it (frames of a stream it reset, SETTINGS, PING, a GOAWAY, the
        close): those are the connection's, never a request's."""
        if not self.streams and time.monotonic() - self.idle_since >= KEEPALIVE:
            return False
        for _ in range(64):  # bounded: a server streaming frames unasked is dropped
            if self.streams or self.failure is not None or self.closing \
                    or not self.connection.readable():
                break
            self._reading = True
            try:
                self._feed(await self._read())
                await self.flush()
            except FetchError:
                return False
            finally:
                self._reading = False
        else:
            return False
        return self.failure is None and not self.closing

    async def request(self, prepared: _Prepared, exchange: Exchange) -> H2Response:
        """Open a stream, write the request on it and read the response head."""
        exchange.protocol = http2.NAME
        await self._wait(lambda: self.h2.open_outbound_streams
                         < self.h2.remote_settings.max_concurrent_streams)
        if self.closing:
            raise FetchError("ConnectError", "the server is closing the connection (GOAWAY)")
        stream = _H2Stream(self.h2.get_next_available_stream_id(), exchange)
        self.streams[stream.id] = stream
        exchange.peer, exchange.reused = self.connection.peer, self.connection.requests > 0
        self.connection.requests += 1
        try:
            await self._write_request(stream, prepared)
            await self._wait(lambda: stream.final or stream.ended or stream.reset is not None
                             or stream.error is not None)
            if stream.error is not None:
                raise stream.error
            if not stream.final:
                raise FetchError("RemoteProtocolError", "the server reset the stream (error "
                                 f"code {stream.reset}) before a response" if stream.reset
                                 is not None else "the stream ended without a response")
            return H2Response(self, stream, prepared.method)
        except BaseException:
            await self.release(stream)
            raise

    async def _write_request(self, stream: _H2Stream, prepared: _Prepared) -> None:
        fields = [(b":method", prepared.method.encode()),
                  (b":scheme", prepared.origin.scheme.encode()),
                  (b":authority", prepared.authority.encode()),
                  (b":path", prepared.target.encode())]
        fields += [(key.lower().encode(), value.encode("latin-1"))
                   for key, value in prepared.fields if key.lower() not in _H2_DROPPED]
        body = prepared.content or b""
        try:
            self.h2.send_headers(stream.id, fields, end_stream=not body)
            while body:
                window = min(self.h2.local_flow_control_window(stream.id),
                             self.h2.max_outbound_frame_size)
                if window <= 0:
                    await self.flush()
                    await self._wait(lambda: self.h2.local_flow_control_window(stream.id) > 0
                                     or stream.reset is not None or stream.ended)
                    if stream.reset is not None or stream.ended:
                        break  # the server answered (or refused) before the whole body
                    continue
                self.h2.send_data(stream.id, body[:window], end_stream=len(body) <= window)
                body = body[window:]
        except h2.exceptions.H2Error as exc:
            raise FetchError("WriteError", f"HTTP/2: {exc}") from None
        await self.flush()

    async def flush(self) -> None:
        """Write what the protocol has to send, recording each stream's frames in its
        exchange once written."""
        async with self._writing:
            data = self.h2.data_to_send()
            if not data:
                return
            try:
                with self.connection.bounded(self.client.timeout):
                    await self.connection.stream.send(data)
            except TimeoutError:
                self._fail(FetchError("WriteTimeout", f"the request was not written in "
                                      f"{self.client.timeout:g} s", timeout=True))
                raise self.failure from None  # type: ignore[misc]
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                self._fail(FetchError("WriteError", str(exc) or type(exc).__name__))
                raise self.failure from None  # type: ignore[misc]
            start = len(_PREFACE) if self._preface else 0
            self._preface = False
            for item in http2.frames(data, start)[0]:
                stream = self.streams.get(item.frame.stream_id)
                if stream is not None:
                    stream.exchange.sent += item.raw

    async def _wait(self, done: Callable[[], bool]) -> None:
        """Read the connection (or wait for the request reading it) until ``done()``."""
        timeout = self.client.timeout
        while not done():
            if self.failure is not None:
                raise self.failure
            if self._reading:
                changed = self._changed
                try:
                    with anyio.fail_after(timeout):
                        await changed.wait()
                except TimeoutError:
                    raise FetchError("ReadTimeout", f"nothing came for {timeout:g} s",
                                     timeout=True) from None
                continue
            self._reading = True
            try:
                data = await self._read()
                self._feed(data)
                await self.flush()  # acknowledgements, window updates
            finally:
                self._reading = False
                self._changed.set()
                self._changed = anyio.Event()

    async def _read(self) -> bytes:
        try:
            with self.connection.bounded(self.client.timeout):
                return await self.connection.stream.receive(READ_SIZE)
        except anyio.EndOfStream:
            self._fail(FetchError("ReadError", "the server closed the connection"))
        except TimeoutError:
            raise FetchError("ReadTimeout", f"nothing came for {self.client.timeout:g} s",
                             timeout=True) from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._fail(FetchError("ReadError", str(exc) or type(exc).__name__))
        raise self.failure  # type: ignore[misc]

    def _feed(self, data: bytes) -> None:
        """Record and hand to the protocol the whole frames read so far."""
        self._pending += data
        try:
            parsed, end = http2.frames(self._pending)
        except ValueError as exc:
            self._fail(FetchError("RemoteProtocolError", str(exc)))
            raise self.failure from None  # type: ignore[misc]
        del self._pending[:end]
        for item in parsed:
            stream = self.streams.get(item.frame.stream_id)
            if stream is not None:
                stream.exchange.received += item.raw
            elif isinstance(item.frame, GoAwayFrame):
                for open_stream in self.streams.values():
                    open_stream.exchange.received += item.raw
            try:
                events = self.h2.receive_data(item.raw)
            except h2.exceptions.H2Error as exc:
                self._fail(FetchError("RemoteProtocolError", f"HTTP/2: {exc}"))
                raise self.failure from None  # type: ignore[misc]
            for event in events:
                self._event(event)

    def _event(self, event: h2.events.Event) -> None:
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.DataReceived):
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if stream is not None:
                stream.body += len(event.data)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            # The server's table size is what the client's encoder may use: it keeps none,
            # so each block it sends stands alone too (``_model.http2``).
            if self.h2.encoder.header_table_size != 0:
                self.h2.encoder.header_table_size = 0
        elif stream is None:
            if isinstance(event, h2.events.ConnectionTerminated):
                self.closing = True
                last = event.last_stream_id if event.last_stream_id is not None else 0
                for other in self.streams.values():
                    if other.id > last:  # never processed: it may be asked again
                        other.error = FetchError("ReadError", "the server sent GOAWAY (error "
                                                 f"code {event.error_code}) before "
                                                 "processing the request")
        elif isinstance(event, h2.events.ResponseReceived):
            stream.final = True
        elif isinstance(event, h2.events.StreamEnded):
            stream.ended = True
        elif isinstance(event, h2.events.StreamReset):
            stream.reset = int(event.error_code) if event.error_code is not None else 0

    def _fail(self, error: FetchError) -> None:
        if self.failure is None:
            self.failure = error
        for stream in self.streams.values():
            if stream.error is None:
                stream.error = error

    async def release(self, stream: _H2Stream) -> None:
        """The request is done with its stream: reset it if it is still open (its unread
        frames are the server's to stop sending), then forget it."""
        with anyio.CancelScope(shield=True):
            if not stream.ended and stream.reset is None and self.failure is None:
                with contextlib.suppress(h2.exceptions.H2Error, FetchError):
                    self.h2.reset_stream(stream.id, h2.errors.ErrorCodes.CANCEL)
                    await self.flush()
            self.streams.pop(stream.id, None)
            self.idle_since = time.monotonic()
            if not self.streams and (self.failure is not None or self.closing):
                await self.client._forget(self)

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            if self.failure is None:
                with contextlib.suppress(h2.exceptions.H2Error, FetchError):
                    self.h2.close_connection()
                    await self.flush()
            await self.connection.close()


_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class H2Response:
    """A response read over HTTP/2 whose head came; as ``Response``: ``read_body`` reads
    the rest and releases the stream (call it, or ``aclose``, exactly once)."""

    __slots__ = ("_connection", "_stream", "exchange", "headers", "status_code")

    def __init__(self, connection: _H2Connection, stream: _H2Stream, method: str) -> None:
        self._connection: _H2Connection | None = connection
        self._stream, self.exchange = stream, stream.exchange
        try:  # the head as every reader derives it from the frames (``_model.http2``)
            head = http2.split_response(stream.exchange.received).head
        except ValueError as exc:
            raise FetchError("RemoteProtocolError", str(exc)) from None
        status, fields = parse_head(final_head(head))
        self.status_code: int = status or 0
        self.headers = Headers(fields)

    async def read_body(self, cap: int) -> tuple[Outcome, str | None, bool]:
        """As ``Response.read_body``: the DATA of the stream, up to its end or ``cap``."""
        stream, connection = self._stream, self._connection
        assert connection is not None
        try:
            try:
                await connection._wait(lambda: stream.ended or stream.reset is not None
                                       or stream.error is not None or stream.body > cap)
            except FetchError as exc:
                return ("timeout" if exc.timeout else "network_error"), f"body read: {exc}", \
                    False
            if stream.body > cap:
                return "too_large", f"body cut at the cap of {cap} bytes", True
            if stream.error is not None:
                return "network_error", f"body read: {stream.error}", False
            if not stream.ended:
                return "network_error", ("body read: the server reset the stream (error "
                                         f"code {stream.reset})"), False
            return "response", None, False
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Release the stream (reset if the response did not end) and the request's slot."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            await connection.release(self._stream)
        finally:
            connection.client._slots.release()


class Client:
    """Keep-alive HTTP/1.1 connections and HTTP/2 ones (one per origin, its requests on
    streams), at most ``connections`` requests at once; use ``async with``.

    ``http1_only``: TLS offers ALPN ``http/1.1`` only, as before HTTP/2 (else ``h2,
    http/1.1``: the server picks; plain http is always HTTP/1.1)."""

    def __init__(self, *, connections: int, timeout: float,
                 ssl_context: ssl.SSLContext | None = None,
                 policy: NetworkPolicy | None = None, proxies: Routes | None = None,
                 http1_only: bool = False) -> None:
        if connections < 1:
            raise ValueError("a client needs at least one connection")
        self.timeout = timeout
        self._limit = connections
        self._slots = anyio.Semaphore(connections)
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._ssl = ssl_context
        self.http1_only = http1_only
        self._h2: dict[Origin, _H2Connection] = {}
        self._http1: set[Origin] = set()  # origins whose server chose HTTP/1.1
        self._opening: dict[Origin, anyio.Lock] = {}  # one connection at a time to learn
        self.policy = policy  # None: connect wherever a URL says (the caller names them all)
        self.proxies = proxies or Routes()  # which proxy each host goes through, if any

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        idle = [c for connections in self._idle.values() for c in connections]
        self._idle.clear()
        self._idle_count = 0
        for connection in idle:
            await connection.close()
        shared = list(self._h2.values())
        self._h2.clear()
        for h2_connection in shared:
            await h2_connection.close()

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"] if self.http1_only
                                       else [http2.NAME, "http/1.1"])
            self._ssl = context
        return self._ssl

    async def send(self, method: str, url: str, headers: Mapping[str, str],
                   exchange: Exchange, content: bytes | None = None
                   ) -> Response | H2Response:
        """Write the request and read the response's head (FetchError if none came that
        the client accepts); the body is read by ``read_body`` of the response."""
        prepared = _prepare(method, url, headers, content)
        origin = prepared.origin
        await acquire(self._slots)
        connection: _Connection | None = None
        try:
            if origin.scheme == "https" and not self.http1_only and origin not in self._http1:
                shared, connection = await self._shared(origin)
                if shared is not None:
                    return await shared.request(prepared, exchange)  # releases the slot
            if connection is None:
                connection = await self._connection(origin)
            exchange.peer, exchange.reused = connection.peer, connection.requests > 0
            connection.requests += 1
            data = _http1(prepared)
            try:
                with connection.bounded(self.timeout):
                    await connection.stream.send(data)
            except TimeoutError:
                raise FetchError("WriteTimeout", f"the request was not written in "
                                 f"{self.timeout:g} s", timeout=True) from None
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                raise FetchError("WriteError", str(exc) or type(exc).__name__) from None
            exchange.sent += data
            head_end = await self._read_head(connection, exchange)
            response = Response(self, connection, exchange, head_end, method)
        except BaseException as exc:
            if connection is not None:
                await connection.close()
            elif isinstance(exc, FetchError) and exc.peer is not None:
                exchange.peer = exc.peer  # a proxy's refusal: with whom it went that far
            self._slots.release()
            raise
        return response

    async def _shared(self, origin: Origin) -> tuple[_H2Connection | None, _Connection | None]:
        """The origin's HTTP/2 connection (made if none is open and the server picks h2),
        or a connection to use for HTTP/1.1 (None: take one from the pool). Connections to
        an origin whose protocol is not known yet are made one at a time, so its requests
        share one HTTP/2 connection."""
        lock = self._opening.setdefault(origin, anyio.Lock())
        async with lock:
            shared = self._h2.get(origin)
            if shared is not None:
                if await shared.usable():
                    return shared, None
                del self._h2[origin]
                if not shared.streams:
                    await shared.close()
            if origin in self._http1:
                return None, None
            connection = await self._connection(origin)
            if connection.alpn != http2.NAME:
                self._http1.add(origin)
                return None, connection
            shared = _H2Connection(self, connection)
            self._h2[origin] = shared
            return shared, None

    async def _forget(self, shared: _H2Connection) -> None:
        """An HTTP/2 connection that is done (failed, or the server is going away)."""
        if self._h2.get(shared.origin) is shared:
            del self._h2[shared.origin]
        await shared.close()

    async def _read_head(self, connection: _Connection, exchange: Exchange) -> int:
        received = exchange.received
        end = head_length(received) if b"\n" in received else None
        while end is None:
            if len(received) > MAX_HEAD:
                raise FetchError("RemoteProtocolError",
                                 f"no end of the response head in {MAX_HEAD} bytes")
            came = len(received)
            if not await self._receive(connection, exchange):
                raise FetchError("RemoteProtocolError", (
                    "the server closed the connection in the middle of the response head"
                    if received else "the server closed the connection without a response"))
            # A head ends at a blank line: look again only when one may have come (a
            # server trickling a long head is not scanned from its start at every byte).
            if _BLANK_LINE.search(received, max(0, came - 2)) is None:
                continue
            end = head_length(received)
            # Each head ends at one blank line: those before the final head's are 1xx heads
            # (bounded, so a server sending them without end is not read through forever).
            interim = len(_BLANK_LINE.findall(received, 0, end or len(received)))
            if interim - (end is not None) > MAX_INTERIM:
                raise FetchError("RemoteProtocolError",
                                 f"more than {MAX_INTERIM} interim (1xx) responses")
        return end  # checked by Response, which parses the head

    async def _receive(self, connection: _Connection, exchange: Exchange) -> bytes:
        """The next bytes from the connection, recorded; b"" at the end of the stream."""
        try:
            with connection.bounded(self.timeout):
                data = await connection.stream.receive(READ_SIZE)
        except anyio.EndOfStream:
            return b""
        except TimeoutError:
            raise FetchError("ReadTimeout", f"nothing came for {self.timeout:g} s",
                             timeout=True) from None
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise FetchError("ReadError", str(exc) or type(exc).__name__) from None
        exchange.received += data
        return data

    async def _connection(self, origin: Origin) -> _Connection:
        """An idle connection to ``origin`` still good to use, else a new one."""
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            self._idle_count -= 1
            if now - connection.idle_since < KEEPALIVE and not connection.readable():
                return connection
            await connection.close()
        in_use = self._limit - self._slots.value  # this request's slot included
        if in_use + self._idle_count > self._limit:  # full: close the longest idle one
            oldest = min((c for cs in self._idle.values() for c in cs),
                         key=lambda c: c.idle_since)
            self._idle[oldest.origin].remove(oldest)
            self._idle_count -= 1
            await oldest.close()
        return await self._connect(origin)

    async def _connect(self, origin: Origin) -> _Connection:
        where = f"{origin.host}:{origin.port}"
        tunnel: Tunnel | None = None
        try:
            with anyio.fail_after(self.timeout):
                stream, dns, tunnel = await self._open(origin)
        except Refused as exc:
            raise FetchError("NetworkPolicy", str(exc), refused=True) from None
        except ProxyFailed as exc:
            peer = None
            if exc.tunnel is not None and exc.remote is not None and exc.local is not None:
                peer = Peer(exc.remote[0], exc.remote[1], exc.local[0], exc.local[1],
                            exc.dns, proxy=exc.tunnel)
            raise FetchError("ProxyError", exc.detail, peer=peer) from None
        except TimeoutError:
            raise FetchError("ConnectTimeout", f"no connection to {where} in "
                             f"{self.timeout:g} s", timeout=True) from None
        except (OSError, anyio.BrokenResourceError) as exc:
            raise FetchError("ConnectError", f"{where}: {exc or type(exc).__name__}") from None
        return _Connection(origin, stream, dns, tunnel)

    async def _open(self, origin: Origin
                    ) -> tuple[anyio.abc.ByteStream, DnsAnswer | None, Tunnel | None]:
        """A connection to ``origin``: with a policy, to each address it allows in turn
        (the name is never resolved again between the check and the connection), and the
        resolver's answer those addresses came from; through the host's proxy, if it has
        one (``_crawl.proxy``: the tunnel's facts too)."""
        tls = self._tls() if origin.scheme == "https" else None
        proxy = self.proxies.for_host(origin.host)
        if proxy is not None:
            return await open_tunnel(proxy, origin, policy=self.policy, timeout=self.timeout,
                                     tls=tls)
        if self.policy is None:
            return await connect_tcp(origin.host, origin.port, timeout=self.timeout,
                                     ssl_context=tls, tls_hostname=origin.host), None, None
        addresses, dns = await self.policy.lookup(origin)
        for address in addresses[:-1]:
            with contextlib.suppress(OSError):
                return await connect_tcp(address, origin.port, timeout=self.timeout,
                                         ssl_context=tls, tls_hostname=origin.host), dns, None
        return await connect_tcp(addresses[-1], origin.port, timeout=self.timeout,
                                 ssl_context=tls, tls_hostname=origin.host), dns, None

    async def _release(self, connection: _Connection, *, reuse: bool) -> None:
        try:
            if reuse:
                connection.idle_since = time.monotonic()
                self._idle.setdefault(connection.origin, []).append(connection)
                self._idle_count += 1
            else:
                await connection.close()
        finally:
            self._slots.release()


def crawl_client(*, connections: int, timeout: float, policy: NetworkPolicy | None = None,
                 proxies: Routes | None = None, http1_only: bool = False) -> Client:
    """The crawler's client: ``connections`` kept alive at most, ``timeout`` seconds for
    connecting, writing a request, and each read; ``policy``: where it may connect
    (``_crawl.netpolicy``; a crawl always gives its own); ``proxies``: which proxy each
    host goes through (``_crawl.proxy``; none by default); ``http1_only``: never HTTP/2."""
    return Client(connections=connections, timeout=timeout, policy=policy, proxies=proxies,
                  http1_only=http1_only)
