"""HTTP/2 in the crawler's HTTP client (``_crawl.http``; issue 33): one connection per
origin whose server picked h2 in ALPN, shared by the requests to it, each on a stream of
its own (``_H2Connection``, the ``h2`` package's state machine), and the response read on
a stream (``H2Response``). Each request's exchange (``Exchange.protocol`` "h2") records the
frames written and read with its stream's id, each as it crossed the connection, and each
GOAWAY read while it was open; the head and body are derived from them by
``_model.http2``. The client sends SETTINGS_HEADER_TABLE_SIZE 0 and keeps no HPACK table
itself: each stored header block decodes on its own.

Separate from the HTTP/1.1 exchange (``_crawl.http``) because it is a protocol of its own:
frames and streams multiplexed over one connection that no task of its own reads. What it
needs of the client is its ``Owner``: the timeout, the request slots, and being told when
a connection is done.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Protocol

import anyio
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

from .._model import http2
from .._model.http1 import final_head, parse_head
from .._model.messages import Outcome
from .connection import KEEPALIVE, MAX_HEAD, READ_SIZE, _Connection
from .exchange import Exchange, FetchError, Headers, _Prepared

__all__ = ["H2Response"]

# HTTP/2: the stream window the client grants (a response of up to this many bytes needs
# no WINDOW_UPDATE: fewer frames of the client's in a stream's record), and the fields
# HTTP/2 forbids (RFC 9113 section 8.2.2: connection-specific; Host becomes :authority).
H2_WINDOW = 16 * 1024 * 1024
_H2_DROPPED = frozenset({"host", "connection", "keep-alive", "proxy-connection",
                         "transfer-encoding", "upgrade", "te"})


class Owner(Protocol):
    """What an HTTP/2 connection needs of the client that owns it (``_crawl.http.Client``)."""

    timeout: float
    _slots: anyio.Semaphore

    async def _forget(self, shared: _H2Connection) -> None: ...


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

    def __init__(self, client: Owner, connection: _Connection) -> None:
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
