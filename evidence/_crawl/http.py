"""The crawler's HTTP/1.1 client: it writes each request and reads each response itself,
so what it stores is what crossed the connection, and no second HTTP parser reads it.

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

The client is deliberately small: HTTP/1.1 only, one request at a time per connection (no
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

Errors: a request that got no response head the client accepts raises ``FetchError``,
named as the step that failed (``ConnectError``, ``ConnectTimeout``, ``WriteError``,
``WriteTimeout``, ``ReadError``, ``ReadTimeout``, ``RemoteProtocolError`` for a malformed or
missing head, ``UnsupportedProtocol``, ``InvalidURL``; ``NetworkPolicy``, with ``refused``
set, for a connection the policy refused before anything was sent); a failure while
reading the body is the ``read_body`` outcome, with the bytes that came kept in the
exchange.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import select
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import quote, urlsplit

import anyio
import anyio.abc
from anyio.streams.tls import TLSAttribute, TLSStream

from .._model.http1 import (
    ChunkedBody,
    Split,
    final_head,
    framing,
    head_length,
    head_problem,
    parse_head,
    split_response,
)
from .._model.messages import DnsAnswer, Outcome
from .._net import Stream, acquire, connect_tcp
from .netpolicy import NetworkPolicy, Origin, Refused

__all__ = ["Client", "Exchange", "FetchError", "Headers", "Peer", "Response", "crawl_client"]

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


class Exchange:
    """The bytes one request wrote to its connection and read from it, in order, and the
    connection it went over (``peer``; ``reused``: an earlier request went over it)."""

    __slots__ = ("_split", "method", "peer", "received", "reused", "sent")

    def __init__(self, method: str) -> None:
        self.method = method
        self.sent = bytearray()
        self.received = bytearray()
        self._split: Split | None = None
        self.peer: Peer | None = None
        self.reused = False

    def split(self) -> Split:
        """The response's head, body and surplus (computed once the exchange is over)."""
        if self._split is None:
            self._split = split_response(bytes(self.received), self.method)
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
    ``refused``: the network policy refused the connection (nothing was sent)."""

    def __init__(self, kind: str, detail: str, *, timeout: bool = False,
                 refused: bool = False) -> None:
        super().__init__(detail if refused else f"{kind}: {detail}")
        self.kind = kind
        self.timeout = timeout
        self.refused = refused


class _Connection:
    __slots__ = ("idle_since", "origin", "peer", "raw", "requests", "socket", "stream")

    def __init__(self, origin: Origin, stream: anyio.abc.ByteStream,
                 dns: DnsAnswer | None = None) -> None:
        self.origin, self.stream = origin, stream
        self.requests = 0  # requests written over it so far
        inner = stream.transport_stream if isinstance(stream, TLSStream) else stream
        # A _net.Stream bounds each of its waits itself (the client's timeout); anyio's
        # streams (under trio) are bounded by a cancel scope per call.
        self.raw: Stream | None = inner if isinstance(inner, Stream) else None
        self.socket: socket.socket | None = stream.extra(anyio.abc.SocketAttribute.raw_socket,
                                                         None)
        self.idle_since = 0.0
        self.peer = _peer(self.socket, stream, origin, dns)

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
          dns: DnsAnswer | None) -> Peer | None:
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
        return Peer(remote[0], remote[1], local[0], local[1], dns)
    cipher = tls.cipher()
    sni: str | None = origin.host
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(origin.host)
        sni = None  # TLS never names an address literal (RFC 6066 section 3)
    return Peer(remote[0], remote[1], local[0], local[1], dns, tls_version=tls.version(),
                tls_cipher=cipher[0] if cipher else None, alpn=tls.selected_alpn_protocol(),
                sni=sni, chain=_chain(tls),
                verified=tls.context.verify_mode == ssl.CERT_REQUIRED)


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


def _request(method: str, url: str, headers: Mapping[str, str],
             content: bytes | None) -> tuple[Origin, bytes]:
    """Where to connect and the request's bytes (head, then body)."""
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
    lines = [f"{method} {target} HTTP/1.1"]
    for key, value in fields.values():
        if not _TOKEN.fullmatch(key) or _BAD_VALUE.search(value):
            raise FetchError("InvalidURL", f"header {key[:80]!r} cannot be sent as it is")
        lines.append(f"{key}: {value}")
    try:
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise FetchError("InvalidURL", f"a header that is not Latin-1: {exc}") from None
    return Origin(scheme, host, port), head + (content or b"")


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


class Client:
    """Keep-alive HTTP/1.1 connections, at most ``connections`` open; use ``async with``."""

    def __init__(self, *, connections: int, timeout: float,
                 ssl_context: ssl.SSLContext | None = None,
                 policy: NetworkPolicy | None = None) -> None:
        if connections < 1:
            raise ValueError("a client needs at least one connection")
        self.timeout = timeout
        self._limit = connections
        self._slots = anyio.Semaphore(connections)
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._ssl = ssl_context
        self.policy = policy  # None: connect wherever a URL says (the caller names them all)

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

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            context = ssl.create_default_context()
            context.set_alpn_protocols(["http/1.1"])
            self._ssl = context
        return self._ssl

    async def send(self, method: str, url: str, headers: Mapping[str, str],
                   exchange: Exchange, content: bytes | None = None) -> Response:
        """Write the request and read the response's head (FetchError if none came that
        the client accepts); the body is read by ``Response.read_body``."""
        origin, data = _request(method, url, headers, content)
        await acquire(self._slots)
        connection: _Connection | None = None
        try:
            connection = await self._connection(origin)
            exchange.peer, exchange.reused = connection.peer, connection.requests > 0
            connection.requests += 1
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
        except BaseException:
            if connection is not None:
                await connection.close()
            self._slots.release()
            raise
        return response

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
        try:
            with anyio.fail_after(self.timeout):
                stream, dns = await self._open(origin)
        except Refused as exc:
            raise FetchError("NetworkPolicy", str(exc), refused=True) from None
        except TimeoutError:
            raise FetchError("ConnectTimeout", f"no connection to {where} in "
                             f"{self.timeout:g} s", timeout=True) from None
        except (OSError, anyio.BrokenResourceError) as exc:
            raise FetchError("ConnectError", f"{where}: {exc or type(exc).__name__}") from None
        return _Connection(origin, stream, dns)

    async def _open(self, origin: Origin) -> tuple[anyio.abc.ByteStream, DnsAnswer | None]:
        """A connection to ``origin``: with a policy, to each address it allows in turn
        (the name is never resolved again between the check and the connection), and the
        resolver's answer those addresses came from."""
        tls = self._tls() if origin.scheme == "https" else None
        if self.policy is None:
            return await connect_tcp(origin.host, origin.port, timeout=self.timeout,
                                     ssl_context=tls, tls_hostname=origin.host), None
        addresses, dns = await self.policy.lookup(origin)
        for address in addresses[:-1]:
            with contextlib.suppress(OSError):
                return await connect_tcp(address, origin.port, timeout=self.timeout,
                                         ssl_context=tls, tls_hostname=origin.host), dns
        return await connect_tcp(addresses[-1], origin.port, timeout=self.timeout,
                                 ssl_context=tls, tls_hostname=origin.host), dns

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


def crawl_client(*, connections: int, timeout: float,
                 policy: NetworkPolicy | None = None) -> Client:
    """The crawler's client: ``connections`` kept alive at most, ``timeout`` seconds for
    connecting, writing a request, and each read; ``policy``: where it may connect
    (``_crawl.netpolicy``; a crawl always gives its own)."""
    return Client(connections=connections, timeout=timeout, policy=policy)
