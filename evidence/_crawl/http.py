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

The client in parts: this module is the pool of connections and the HTTP/1.1 exchange
(``Client``, ``Response``); ``_crawl.exchange`` lays a request out and holds what it
exchanged (``Exchange``, ``Headers``, ``FetchError``); ``_crawl.connection`` is one
connection and its ``Peer``; ``_crawl.h2connection`` is HTTP/2 over one connection.
"""


from __future__ import annotations

import contextlib
import re
import ssl
import time
from collections.abc import Mapping
from types import TracebackType

import anyio
import anyio.abc

from .._model import http2
from .._model.http1 import (
    ChunkedBody,
    final_head,
    framing,
    head_length,
    head_problem,
    parse_head,
)
from .._model.messages import DnsAnswer, Outcome
from .._net import acquire, connect_tcp
from .connection import KEEPALIVE, MAX_HEAD, READ_SIZE, Peer, _Connection
from .exchange import Exchange, FetchError, Headers, _http1, _prepare
from .h2connection import H2Response, _H2Connection
from .netpolicy import NetworkPolicy, Origin, Refused
from .proxy import ProxyFailed, Routes, Tunnel, open_tunnel

__all__ = ["Client", "Exchange", "FetchError", "H2Response", "Headers", "Peer", "Response",
           "crawl_client"]

MAX_INTERIM = 32  # interim (1xx) responses before the final one
_BLANK_LINE = re.compile(rb"\n\r?\n")


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
