"""HTTP/2 exchanges as stored frames: what a request and its response were, read back from
the frames of their stream, by one set of rules, whoever asks.

An h2 exchange is stored as the frames of its stream exactly as they crossed the
connection (RFC 9113 section 4: a 9-byte header, then the payload, padding included):
``sent``, the frames the client wrote with the stream's id (HEADERS, CONTINUATION, DATA,
and any WINDOW_UPDATE or RST_STREAM it sent for the stream), and ``received``, the frames
read with the stream's id, in the order read, and each GOAWAY frame read while the stream
was open (it says whether the server processed the stream). The connection's other frames
(SETTINGS, PING, connection WINDOW_UPDATE) are about the connection, not one exchange:
they are not stored (their effect is on flow and limits, never on a message's bytes).

HPACK makes a header block depend on the connection's earlier blocks (its dynamic table).
The crawler's client makes every block stand alone: it sends SETTINGS_HEADER_TABLE_SIZE 0,
so the server's encoder keeps no dynamic table (it signals the size update at the start
of its next block, which a fresh decoder reads), and its own encoder keeps none either.
So a stored exchange decodes on its own, by a fresh decoder: ``decode_block`` refuses a
block that refers to an entry an earlier block added (the client derives each response
head this way as it comes, and fails the attempt if one does not stand alone).

- ``split_response(frames)``: the response head, rendered as an HTTP/1-style head
  (``render_head``: ``HTTP/2 200``, then each decoded field as ``name: value``, in the order
  sent, then a blank line; interim 1xx heads before it, as in HTTP/1.1), the body (the
  DATA payloads, padding removed: HTTP/2 has no transfer coding), and whether the stream
  ended (END_STREAM) or was reset;
- ``request_message(frames)``: the request as an HTTP/1-style message (``GET /path
  HTTP/2``, ``host`` from ``:authority``, the fields, a blank line, the body), which is what
  WARC request records and ``replay`` show;
- ``as_http11(message)``: the same with HTTP/1.1 start lines (``HTTP/1.1 200 OK``), for
  the WARC records of an h2 exchange (which say ``WARC-Protocol: h2``: pywb reads only
  HTTP/1.x heads);
- the content is derived from the head and body as for HTTP/1.1 (``_model.http1.
  derive_content``: HTTP/2 forbids Transfer-Encoding, so only content codings apply).

Everything here is a pure function of bytes, as in ``_model.http1``.
"""

from __future__ import annotations

import http
from typing import NamedTuple

import hpack
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    ExtensionFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    RstStreamFrame,
)

from .http1 import Split

__all__ = ["FRAME_HEADER", "NAME", "Frame", "RawFrame", "as_http11", "decode_block", "frames",
           "render_head", "request_message", "split_response"]

NAME = "h2"  # the protocol, as ALPN names it and an attempt records it
FRAME_HEADER = 9
END_STREAM = 0x1
END_HEADERS = 0x4
MAX_BLOCK = 256 * 1024  # bytes of one header block, decoded (the client's MAX_HEAD)


class RawFrame(NamedTuple):
    """One frame as it came: its bytes (header included) and what they say."""

    raw: bytes
    frame: Frame


def frames(data: bytes | bytearray, start: int = 0) -> tuple[list[RawFrame], int]:
    """The whole frames in ``data`` from ``start``, parsed, and where the first one not
    whole starts (``len(data)`` if none). ValueError for a frame that does not parse."""
    out: list[RawFrame] = []
    pos = start
    view = memoryview(data)
    while len(data) - pos >= FRAME_HEADER:
        try:
            frame, length = Frame.parse_frame_header(view[pos:pos + FRAME_HEADER])
        except Exception as exc:  # hyperframe's errors share no base class
            raise ValueError(f"not an HTTP/2 frame at byte {pos}: {exc}") from None
        end = pos + FRAME_HEADER + length
        if len(data) < end:
            break
        if not isinstance(frame, ExtensionFrame):
            try:
                frame.parse_body(view[pos + FRAME_HEADER:end])
            except Exception as exc:
                raise ValueError(f"a {type(frame).__name__} that does not parse at byte "
                                 f"{pos}: {exc}") from None
        out.append(RawFrame(bytes(view[pos:end]), frame))
        pos = end
    return out, pos


def decode_block(block: bytes) -> list[tuple[bytes, bytes]]:
    """A header block's fields, decoded by a fresh HPACK decoder: ValueError if the block
    refers to an entry an earlier block added, or does not decode."""
    decoder = hpack.Decoder(max_header_list_size=MAX_BLOCK)
    # A fresh decoder's dynamic table holds only what this block adds (entries are added
    # at its front): a reference to an entry an earlier block added is past its end and
    # fails, so a block it decodes decodes to what the connection's decoder read.
    try:
        fields = decoder.decode(block, raw=True)
    except hpack.HPACKError as exc:
        raise ValueError(f"a header block that does not decode on its own: "
                         f"{type(exc).__name__}: {exc}") from None
    return [(bytes(name), bytes(value)) for name, value in fields]


def render_head(status: bytes, fields: list[tuple[bytes, bytes]]) -> bytes:
    """A decoded response head as an HTTP/1-style head: ``HTTP/2 NNN``, then the fields."""
    lines = [b"HTTP/2 " + status]
    lines += [name + b": " + value for name, value in fields]
    return b"\r\n".join(lines) + b"\r\n\r\n"


class _Message(NamedTuple):
    blocks: list[list[tuple[bytes, bytes]]]  # each header block, decoded
    body: bytes
    ended: bool  # END_STREAM came
    reset: int | None  # the RST_STREAM error code, if one came


def _message(data: bytes | bytearray) -> _Message:
    """The header blocks and DATA payloads of one direction of a stream."""
    parsed, end = frames(data)
    if end != len(data):
        raise ValueError(f"{len(data) - end} bytes after the last whole frame")
    blocks: list[list[tuple[bytes, bytes]]] = []
    body: list[bytes] = []
    pending: list[bytes] | None = None  # a header block waiting for its CONTINUATIONs
    ended, reset, stream_end = False, None, False
    for item in parsed:
        frame = item.frame
        if pending is not None:
            if not isinstance(frame, ContinuationFrame):
                raise ValueError("a header block not continued by CONTINUATION frames")
            pending.append(frame.data)
            if "END_HEADERS" in frame.flags:
                blocks.append(decode_block(b"".join(pending)))
                pending = None
                ended = ended or bool(stream_end)
            continue
        if isinstance(frame, HeadersFrame):
            stream_end = "END_STREAM" in frame.flags
            if "END_HEADERS" in frame.flags:
                blocks.append(decode_block(frame.data))
                ended = ended or stream_end
            else:
                pending = [frame.data]
        elif isinstance(frame, DataFrame):
            body.append(frame.data)
            ended = ended or "END_STREAM" in frame.flags
        elif isinstance(frame, RstStreamFrame):
            reset = frame.error_code
        elif isinstance(frame, ContinuationFrame):
            raise ValueError("a CONTINUATION frame with no header block before it")
        # WINDOW_UPDATE, PRIORITY, GOAWAY: about flow and the connection, not the message
    return _Message(blocks, b"".join(body), ended and pending is None, reset)


def _pseudo(fields: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in fields:
        if key == name:
            return value
    return None


def _regular(fields: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(name, value) for name, value in fields if not name.startswith(b":")]


def split_response(data: bytes | bytearray) -> Split:
    """The response in a stream's received frames: its head (HTTP/1-style, interim heads
    first), its body (DATA payloads), no surplus; ``framing`` "h2"; ``complete``: the
    stream ended (END_STREAM) with a final head and no reset. ValueError for frames that
    do not parse or a header block that does not decode on its own."""
    message = _message(data)
    heads: list[bytes] = []
    final = False
    for block in message.blocks:
        status = _pseudo(block, b":status")
        if status is None:  # trailers (a block after the final head): kept in the frames
            if final:
                continue
            raise ValueError("a response header block without :status")
        if final:
            raise ValueError("a second final response head")
        heads.append(render_head(status, _regular(block)))
        final = not status.startswith(b"1")
    head = b"".join(heads)
    complete = final and message.ended and message.reset is None
    return Split(head, message.body if final else b"", b"", "h2", complete)


def request_message(data: bytes | bytearray) -> bytes:
    """The request in a stream's sent frames, as an HTTP/1-style message: the request line
    (method, path, ``HTTP/2``), ``host`` (the ``:authority``), the other fields in the order
    sent, a blank line, the body."""
    message = _message(data)
    if not message.blocks:
        raise ValueError("no request header block in the frames")
    block = message.blocks[0]
    method = _pseudo(block, b":method") or b""
    path = _pseudo(block, b":path") or b"*"
    authority = _pseudo(block, b":authority")
    lines = [method + b" " + path + b" HTTP/2"]
    regular = _regular(block)
    if authority is not None and not any(name == b"host" for name, _ in regular):
        lines.append(b"host: " + authority)
    lines += [name + b": " + value for name, value in regular]
    return b"\r\n".join(lines) + b"\r\n\r\n" + message.body


_REASONS = {code.value: code.phrase.encode() for code in http.HTTPStatus}


def as_http11(message: bytes) -> bytes:
    """A head (or a request message) rendered from frames, with HTTP/1.1 start lines: each
    ``HTTP/2 NNN`` status line becomes ``HTTP/1.1 NNN Reason``, a request line's ``HTTP/2``
    becomes ``HTTP/1.1``; the fields and body are unchanged. For readers that take only
    HTTP/1.x messages (pywb, in a WARC record that says ``WARC-Protocol: h2``)."""
    end = message.find(b"\r\n\r\n")
    head, rest = (message, b"") if end < 0 else (message[:end + 4], message[end + 4:])
    lines = head.split(b"\r\n")
    if lines and lines[0].endswith(b" HTTP/2") and not lines[0].startswith(b"HTTP/"):
        lines[0] = lines[0][:-len(b"HTTP/2")] + b"HTTP/1.1"
        return b"\r\n".join(lines) + rest
    for index, line in enumerate(lines):
        if line.startswith(b"HTTP/2 ") and (index == 0 or not lines[index - 1]):
            status = line[7:10]
            reason = _REASONS.get(int(status), b"") if status.isdigit() else b""
            lines[index] = b"HTTP/1.1 " + status + b" " + reason
    return b"\r\n".join(lines) + rest


def goaway_code(data: bytes | bytearray) -> int | None:
    """The error code of the last GOAWAY among a stream's received frames, if any."""
    code = None
    for item in frames(data)[0]:
        if isinstance(item.frame, GoAwayFrame):
            code = item.frame.error_code
    return code
