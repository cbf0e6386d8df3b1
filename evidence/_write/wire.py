"""The wire protocol between the writer service and its clients: frames and the handshake.

A connection carries *frames*: a 4-byte big-endian unsigned length, then that many bytes of
msgpack encoding one tagged map (the tag field is ``type``). The client speaks first:

    client                                  service
    hello {versions, token, client}   -->
                                      <--   welcome {version, limits, store_id}
                                            (or error {code} and the connection closed)
    submit {id, messages: [msgpack]}  -->
    ping {id} / stats {id}            -->
                                      <--   ack {id, acks} / error {id, code, retryable}
                                      <--   pong {id} / stats_result {id, statistics}

Requests are pipelined; answers carry the request's client-chosen ``id`` and may arrive in
any order. An error frame without an id concerns the connection, which the service closes
after it. The service is strict (unknown frame types and fields are refused); the client is
lenient with what the service sends, so a newer service may add fields.

This module is shared by ``_write.service`` and ``client``; it owns no sockets, only bytes.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import stat
import struct
from pathlib import Path
from typing import Annotated, Protocol

import anyio
import anyio.abc
import msgspec

from .._errors import ServiceError
from .._model.acks import Ack, WriterStatistics

#: What a send or a receive raises when the peer is gone (killed, cut off, closed): over TLS
#: a write to a peer that went away can also find the end of the stream.
PEER_GONE = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)


def gone_in_words(exc: BaseException) -> str:
    """How a channel ended, for a log line: the exception's type and text, or its cause's
    where it has none (a TLS stream whose peer vanished raises an empty
    BrokenResourceError)."""
    text = str(exc)
    cause = exc.__cause__ or exc.__context__
    if not text and cause is not None:
        text = gone_in_words(cause)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

__all__ = [
    "HEADER",
    "PEER_GONE",
    "PROTOCOL_VERSION",
    "AckFrame",
    "ErrorFrame",
    "FrameReader",
    "Hello",
    "Ping",
    "Pong",
    "ProtocolError",
    "ServiceError",
    "ServiceStatistics",
    "StatsRequest",
    "StatsResult",
    "Submit",
    "TruncatedFrame",
    "Welcome",
    "decode_client_frame",
    "decode_server_frame",
    "encode_frame",
    "gone_in_words",
    "parse_loopback",
    "read_token",
    "tokens_match",
]

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")
_CHUNK = 64 * 1024

RequestId = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


# Its home is _errors.py (under WriterError, in the tree there and in docs/errors.md); it
# lives here until that file is edited, and evidence.client re-exports it either way.
class ProtocolError(Exception):
    """A peer broke the protocol; becomes an error frame (never leaves this package)."""

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable

    def frame(self, request_id: int | None = None) -> ErrorFrame:
        return ErrorFrame(code=self.code, message=str(self), id=request_id,
                          retryable=self.retryable)


class TruncatedFrame(ProtocolError):
    def __init__(self, wanted: int, got: int) -> None:
        super().__init__("truncated_frame", f"the connection ended {got} bytes into a "
                         f"{wanted}-byte frame")


# --- frames a client sends (decoded strictly by the service) --------------------------

_STRICT = {"tag_field": "type", "forbid_unknown_fields": True, "frozen": True}


class Hello(msgspec.Struct, tag="hello", omit_defaults=True, **_STRICT):
    versions: Annotated[list[int], msgspec.Meta(max_length=16)]
    token: Annotated[str, msgspec.Meta(max_length=4096)] = ""
    client: Annotated[str, msgspec.Meta(max_length=256)] = ""
    # "worker": after the welcome, the connection is a crawl coordinator's channel to a
    # worker host (``_crawl/workers.py``), not a submitter's. Omitted when empty, so a
    # hello without it is the same bytes as before.
    role: Annotated[str, msgspec.Meta(max_length=32)] = ""


class Submit(msgspec.Struct, tag="submit", **_STRICT):
    """One message (``len(messages) == 1``) or a group committed in one transaction."""

    id: RequestId
    messages: list[msgspec.Raw]  # each one message in its msgpack encoding


class Ping(msgspec.Struct, tag="ping", **_STRICT):
    id: RequestId


class StatsRequest(msgspec.Struct, tag="stats", **_STRICT):
    id: RequestId


ClientFrame = Hello | Submit | Ping | StatsRequest

# --- frames the service sends (decoded leniently by the client) -----------------------

_LENIENT = {"tag_field": "type", "frozen": True}


class Welcome(msgspec.Struct, tag="welcome", kw_only=True, **_LENIENT):
    version: int
    server: str
    store_id: str
    max_frame_bytes: int
    max_in_flight: int  # requests this connection may have unanswered before reads pause


class AckFrame(msgspec.Struct, tag="ack", **_LENIENT):
    id: int
    acks: list[Ack]


class ErrorFrame(msgspec.Struct, tag="error", kw_only=True, **_LENIENT):
    """``id`` set: that request failed. No ``id``: the connection ends after this frame."""

    code: str
    message: str
    id: int | None = None
    hint: str | None = None
    retryable: bool = False  # the same request (or a reconnect) may succeed later


class Pong(msgspec.Struct, tag="pong", **_LENIENT):
    id: int


class ServiceStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """The service's health: its writer's metrics and its connections'."""

    writer: WriterStatistics
    uptime: float
    connected_clients: int
    connections_total: int
    requests_in_flight: int  # read from a socket, not yet answered
    pending_bytes: int  # bytes read from clients and not yet committed (or discarded)
    frames_received: int
    messages_received: int
    acks_sent: int
    backpressure_waits: int  # reads that waited for in-flight room (socket reads paused)
    send_blocked_connections: int  # connections whose answers are waiting on the socket
    slow_disconnects: int  # connections dropped because they did not read their answers
    protocol_errors: dict[str, int]  # by error code


class StatsResult(msgspec.Struct, tag="stats_result", kw_only=True, **_LENIENT):
    id: int
    statistics: ServiceStatistics
    metrics: str  # the same figures in the Prometheus text format


ServerFrame = Welcome | AckFrame | ErrorFrame | Pong | StatsResult

_encoder = msgspec.msgpack.Encoder()
_client_decoder = msgspec.msgpack.Decoder(ClientFrame)
_server_decoder = msgspec.msgpack.Decoder(ServerFrame)


def encode_frame(frame: msgspec.Struct) -> bytes:
    """Length prefix and msgpack body, in one buffer."""
    buffer = bytearray(HEADER.size)
    _encoder.encode_into(frame, buffer, HEADER.size)
    HEADER.pack_into(buffer, 0, len(buffer) - HEADER.size)
    return bytes(buffer)


def decode_client_frame(body: bytes) -> ClientFrame:
    try:
        return _client_decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise ProtocolError("malformed_frame", f"not a valid frame: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProtocolError("malformed_frame", f"not msgpack: {exc}") from None


def decode_server_frame(body: bytes) -> ServerFrame:
    try:
        return _server_decoder.decode(body)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise ProtocolError("malformed_frame", f"the service sent an invalid frame: {exc}",
                            retryable=True) from None


class ByteSource(Protocol):
    """What a FrameReader reads from: an anyio byte stream, or the service's metered one."""

    async def receive(self, max_bytes: int = ...) -> bytes: ...


class FrameReader:
    """Reads frames from a byte stream in 64 KiB chunks (many small frames per read).

    ``read_header`` and ``read_body`` are separate so the service can check a frame's size
    and reserve room for it before reading its body. Memory held: one chunk plus one frame.
    """

    def __init__(self, stream: ByteSource, initial: bytes = b"") -> None:
        self._stream = stream
        self._buffer = bytearray(initial)  # bytes already read from the stream by another

    async def _fill(self, wanted: int) -> None:
        while len(self._buffer) < wanted:
            self._buffer += await self._stream.receive(max(_CHUNK, wanted - len(self._buffer)))

    def buffered(self) -> int:
        """Bytes read from the stream and not yet returned."""
        return len(self._buffer)

    def take_buffered(self) -> bytes:
        """Hand over what was read and not returned (the stream changes readers)."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def frame_ready(self) -> bool:
        """Whether a whole frame is buffered (reading it will not wait on the stream)."""
        if len(self._buffer) < HEADER.size:
            return False
        size: int = HEADER.unpack_from(self._buffer)[0]
        return len(self._buffer) >= HEADER.size + size

    async def read_header(self) -> int | None:
        """The next frame's body length, or None at a clean end of stream."""
        try:
            await self._fill(HEADER.size)
        except anyio.EndOfStream:
            if not self._buffer:
                return None
            raise TruncatedFrame(HEADER.size, len(self._buffer)) from None
        size: int = HEADER.unpack_from(self._buffer)[0]
        del self._buffer[:HEADER.size]  # O(1): CPython trims a bytearray's front in place
        return size

    async def read_body(self, size: int) -> bytes:
        try:
            await self._fill(size)
        except anyio.EndOfStream:
            raise TruncatedFrame(size, len(self._buffer)) from None
        body = bytes(self._buffer[:size])
        del self._buffer[:size]
        return body


# --- addresses and tokens -------------------------------------------------------------

def parse_loopback(text: str, *, what: str = "--listen") -> tuple[str, int]:
    """``127.0.0.1:PORT``, ``[::1]:PORT`` or ``localhost:PORT``; anything else is refused.

    Only IP literals (and ``localhost``, taken as 127.0.0.1) are accepted, so no name is
    ever resolved and no address off this machine can be bound or dialled.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ServiceError(f"{what} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:7400",
                           hint="give a loopback address and a port (0 picks a free one)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ServiceError(f"{what} {text!r}: {host!r} is not an IP address",
                           hint="use 127.0.0.1 or ::1") from None
    if not address.is_loopback:
        raise ServiceError(
            f"{what} {text!r}: {host} is not a loopback address; the service only listens "
            "on this machine", hint="use 127.0.0.1 or ::1 (tunnel with ssh for remote hosts)")
    return str(address), int(port_text)


def read_token(path: os.PathLike[str] | str) -> str:
    """The shared secret in ``path`` (surrounding whitespace ignored). Refuses a file that
    others can read, as ssh refuses such a key."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ServiceError(f"{path}: cannot read the token file ({exc.strerror})",
                           path=str(path), hint="give the file holding the token (mode 600); "
                           "make one: python -c 'import secrets; "
                           "print(secrets.token_urlsafe(32))' > FILE") from None
    if stat.S_IMODE(mode) & 0o077:
        raise ServiceError(f"{path}: the token file is readable by other users "
                           f"(mode {stat.S_IMODE(mode):o})", path=str(path),
                           hint=f"chmod 600 {path}")
    if len(token) < 16:
        raise ServiceError(f"{path}: the token is shorter than 16 characters", path=str(path),
                           hint="generate one: python -c 'import secrets; "
                           "print(secrets.token_urlsafe(32))' > FILE")
    return token


def tokens_match(expected: str, given: str) -> bool:
    """Constant-time comparison (an attacker learns nothing from the reply's timing)."""
    return hmac.compare_digest(expected.encode(), given.encode())
