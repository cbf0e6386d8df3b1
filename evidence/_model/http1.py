"""HTTP/1.1 messages as bytes: where a response's head and body end, and what its content is.

The crawler stores an exchange exactly as it crossed the connection
(``_crawl.exchange.Exchange``): the request as written, the response head and body as
read. This module reads those bytes back by one set of rules, whoever asks (the fetch
that stores them, rules, incremental sessions, replay):

- ``split_response(data, method)``: the response head (status line and header block, up
  to and including the blank line; interim 1xx responses before it belong to it), the
  message body as framed (RFC 9112 section 6.3: none for HEAD, 1xx, 204 and 304; chunked
  through its last chunk, trailers and final line; ``Content-Length`` bytes; else up to
  the end), and any bytes received after the body's end (``surplus``);
- ``parse_head(head)``: the status code and header fields, read as h11 reads them (a bare
  LF ends a line as CRLF does, an obs-fold line continues the field before it, values are
  stripped of surrounding spaces and tabs);
- ``derive_content(head, body, limit)``: the content, the body with its transfer coding
  (chunked) and then its content codings (gzip, x-gzip, deflate, in reverse order of
  application) removed, at most ``limit`` bytes. A coding that cannot be removed
  (unsupported, such as br, or damaged) stops the derivation: ``content_coding`` names only
  the codings that were removed, so a reader compares it with the header.

Everything here is a pure function of bytes: anyone holding the stored artifacts can
derive the same content again, and ``evidence verify --full`` does.
"""

from __future__ import annotations

import re
import zlib
from typing import NamedTuple

__all__ = ["ChunkedBody", "Content", "Split", "content_codings", "derive_content",
           "final_head", "framing", "head_length", "head_problem", "header", "parse_head",
           "split_response"]

_BLANK_LINE = re.compile(rb"\n\r?\n")  # the end of a header block, as h11 finds it
_CHUNK_SIZE = re.compile(rb"[\t ]*([0-9A-Fa-f]+)[\t ]*(?:;[^\n]*)?\r?\n")
_DECODABLE = ("gzip", "x-gzip", "deflate")


class Split(NamedTuple):
    """Where one response lies in the bytes read from its connection."""

    head: bytes  # status line and header block, as read (all of the data if no blank line)
    body: bytes  # the message body as it came, transfer coding included
    surplus: bytes  # bytes read after the body's end: not part of this response
    framing: str  # "none", "chunked", "length" or "close" (RFC 9112 section 6.3)
    complete: bool  # the head and the body as framed are whole


def _status(line: bytes | bytearray) -> int | None:
    parts = line.split(None, 2)
    if len(parts) > 1 and parts[1].isdigit() and len(parts[1]) == 3:
        return int(parts[1])
    return None


# The last head parsed and what it gave: a fetch parses its response's head three times
# (the client reading it, then the split and the content derived from the bytes as
# recorded, which must agree with the client by being read the same way), each from its
# own copy of the same bytes. One tuple, replaced whole: safe to read from any thread.
_LAST_HEAD: tuple[bytes, int | None, tuple[tuple[bytes, bytes], ...]] = (b"", None, ())


def parse_head(head: bytes) -> tuple[int | None, list[tuple[bytes, bytes]]]:
    """The status code and the header fields (name as sent, value stripped) of a head."""
    global _LAST_HEAD
    last = _LAST_HEAD
    if head == last[0]:  # a pure function of the bytes: the same bytes, the same answer
        return last[1], list(last[2])
    status, fields = _parse_head(head)
    _LAST_HEAD = (bytes(head), status, tuple(fields))
    return status, fields


def _parse_head(head: bytes) -> tuple[int | None, list[tuple[bytes, bytes]]]:
    lines = head.split(b"\n")
    status = _status(lines[0].rstrip(b"\r")) if lines else None
    fields: list[tuple[bytes, bytes]] = []
    for raw in lines[1:]:
        line = raw.rstrip(b"\r")
        if not line:
            break
        if line[:1] in (b" ", b"\t"):  # obs-fold: continues the previous field
            if fields:
                name, value = fields[-1]
                more = line.strip(b" \t")
                fields[-1] = (name, value + b" " + more if value and more else value + more)
            continue
        name, sep, value = line.partition(b":")
        if sep:
            fields.append((name.strip(b" \t"), value.strip(b" \t")))
    return status, fields


def header(fields: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """All values of a header field joined by ", " (names compared case-insensitively)."""
    values = [v for n, v in fields if n.lower() == name]
    return b", ".join(values) if values else None


_STATUS_LINE = re.compile(rb"HTTP/[0-9]\.[0-9] [0-9]{3}(?:[ \t][^\r\n]*)?\r?")
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def head_problem(head: bytes, fields: list[tuple[bytes, bytes]] | None = None) -> str | None:
    """Why a whole response head is not one a client can accept, or None. What is checked
    (as h11 checks it): each status line (``HTTP/x.y NNN reason``), each field name (a
    token right before its colon), and that all Content-Length values are one number.
    The head is evidence either way: the fetch stores it, and records the problem.
    ``fields``: the final head's, if the caller has parsed them already."""
    lines = head.split(b"\n")
    for index, raw in enumerate(lines):
        line = raw.rstrip(b"\r")
        if not line:  # the end of a head (an interim 1xx one, or the final one)
            continue
        if index == 0 or not lines[index - 1].rstrip(b"\r"):  # a status line
            if not _STATUS_LINE.fullmatch(raw):
                return f"not a status line: {bytes(line[:80])!r}"
            continue
        if line[:1] in (b" ", b"\t"):
            if index == 1:
                return "a folded line before any header field"
            continue
        name, sep, _ = line.partition(b":")
        if not sep or not _FIELD_NAME.fullmatch(name):
            return f"not a header field: {bytes(line[:80])!r}"
    if fields is None:
        _, fields = parse_head(final_head(head))
    length = header(fields, b"content-length")
    if length is not None:
        values = {v.strip() for v in length.split(b",")}
        if len(values) != 1 or not values.pop().isdigit():
            return f"Content-Length is not one number: {bytes(length[:80])!r}"
    return None


def head_length(data: bytes | bytearray) -> int | None:
    """How many bytes of ``data`` the response head takes, or None if it is not whole."""
    return _final_head_end(data)


def _final_head_end(data: bytes | bytearray) -> int | None:
    """The end of the final response's head: interim 1xx heads (not 101) are skipped."""
    pos = 0
    while True:
        match = _BLANK_LINE.search(data, pos)
        if match is None:
            return None
        status = _status(data[pos:data.find(b"\n", pos)].rstrip(b"\r"))
        if status is None or not (100 <= status < 200) or status == 101:
            return match.end()
        pos = match.end()


def framing(status: int | None, fields: list[tuple[bytes, bytes]],
             method: str) -> tuple[str, int]:
    """How the body of a response to ``method`` is framed (RFC 9112 section 6.3): ("none",
    0), ("chunked", 0), ("length", n) or ("close", 0): up to the end of the stream."""
    if method == "HEAD" or status is None or 100 <= status < 200 or status in (204, 304):
        return "none", 0
    coding = header(fields, b"transfer-encoding")
    if coding is not None:
        last = coding.split(b",")[-1].strip().lower()
        return ("chunked", 0) if last == b"chunked" else ("close", 0)
    length = header(fields, b"content-length")
    if length is not None:
        values = {v.strip() for v in length.split(b",")}
        if len(values) == 1 and (value := values.pop()).isdigit():
            return "length", int(value)
    return "close", 0


class ChunkedBody:
    """Where a chunked body that starts at ``start`` ends, found as its bytes come: each
    ``end(data)`` call (``data``: everything read so far) goes on from the first chunk
    that was not whole the last time, so a body of many small chunks is read once.

    ``strict`` (the client reading a response): a body that stops being chunked, or a
    chunk size or trailer line over ``MAX_LINE`` bytes, raises ValueError. Otherwise
    (stored bytes read again) such a body just has no end: None. ``out`` collects the chunk
    data, the part of a chunk cut short included."""

    MAX_LINE = 64 * 1024

    def __init__(self, start: int, *, strict: bool = False,
                 out: list[bytes | bytearray] | None = None) -> None:
        self.pos = start  # where the first chunk (or trailer line) not yet whole starts
        self._trailers = False
        self._strict = strict
        self._out = out

    def end(self, data: bytes | bytearray) -> int | None:
        pos = self.pos
        while True:
            newline = data.find(b"\n", pos, pos + self.MAX_LINE + 1 if self._strict
                                else len(data))
            if self._strict and newline < 0 and len(data) - pos > self.MAX_LINE:
                raise ValueError(f"a line of the chunked body over {self.MAX_LINE} bytes "
                                 f"at byte {pos}")
            if self._trailers:  # trailer fields, then the blank line
                if newline < 0:
                    return self._wait(pos)
                line, pos = data[pos:newline].rstrip(b"\r"), newline + 1
                if not line:
                    self.pos = pos
                    return pos
                continue
            match = _CHUNK_SIZE.match(data, pos, newline + 1) if newline >= 0 else None
            if match is None:
                if self._strict and newline >= 0:
                    raise ValueError(f"a chunk size line that is not one at byte {pos}")
                return self._wait(pos)
            size = int(match.group(1), 16)
            start = match.end()
            if size == 0:
                self._trailers = True
                pos = start
                continue
            if len(data) < start + size:
                if self._out is not None:
                    self._out.append(data[start:])
                return self._wait(pos)
            after = start + size
            if self._out is not None:
                self._out.append(data[start:after])
            if data.startswith(b"\r\n", after):
                following = after + 2
            elif data.startswith(b"\n", after):
                following = after + 1
            else:
                if self._strict and data[after:after + 2] not in (b"", b"\r"):
                    raise ValueError(f"chunk data not followed by a line end at byte {after}")
                return self._wait(pos)
            pos = following

    def _wait(self, pos: int) -> int | None:
        """Not whole yet: the next call goes on from ``pos``."""
        self.pos = pos
        return None


def _chunked_end(data: bytes | bytearray, pos: int,
                 out: list[bytes | bytearray] | None = None) -> int | None:
    """Where a chunked body starting at ``pos`` ends (after its trailers), or None if the
    data ends first or stops being chunked. ``out`` collects the chunk data."""
    return ChunkedBody(pos, out=out).end(data)


def split_response(data: bytes, method: str = "GET") -> Split:
    """Split the bytes read for one request into its response's head, body and surplus."""
    head_end = _final_head_end(data)
    if head_end is None:
        return Split(data, b"", b"", "none", False)
    head = data[:head_end]
    status, fields = parse_head(final_head(head))
    kind, length = framing(status, fields, method)
    if kind == "none":
        end: int | None = head_end
    elif kind == "length":
        end = head_end + length if len(data) >= head_end + length else None
    elif kind == "chunked":
        end = _chunked_end(data, head_end)
    else:
        end = len(data)
    if end is None:
        return Split(head, data[head_end:], b"", kind, False)
    return Split(head, data[head_end:end], data[end:], kind, True)


def final_head(head: bytes) -> bytes:
    """The final response's head out of a head that starts with interim 1xx responses."""
    start, pos = 0, 0
    while (match := _BLANK_LINE.search(head, pos)) is not None and match.end() < len(head):
        start = pos = match.end()
    return head[start:]


def content_codings(fields: list[tuple[bytes, bytes]]) -> list[str]:
    """The content codings a head names, in the order they were applied."""
    value = header(fields, b"content-encoding")
    if value is None:
        return []
    codings = [c.strip().lower().decode("latin-1") for c in value.split(b",")]
    return [c for c in codings if c and c != "identity"]


class Content(NamedTuple):
    """A body's content, and how it was derived from the body."""

    data: bytes
    transfer_coding: str | None  # "chunked" when framing was removed
    content_coding: str | None  # the content codings removed, as applied ("gzip")
    truncated: bool  # cut at the limit, or the body ended before the content did
    problem: str | None  # why a coding could not be removed, if one could not


def derive_content(head: bytes, body: bytes, limit: int, *, dechunk: bool = True) -> Content:
    """The body with its transfer coding and its content codings removed (at most
    ``limit`` bytes). A body cut short gives the content of its bytes, ``truncated``.
    ``dechunk=False``: the body has no transfer coding left (attempts recorded before
    wire capture stored it de-chunked, whatever their head says)."""
    status, fields = parse_head(final_head(head))
    kind, _ = framing(status, fields, "GET")
    data, transfer, truncated = body, None, False
    if kind == "chunked" and dechunk:
        parts: list[bytes | bytearray] = []
        truncated = _chunked_end(body, 0, parts) is None
        data, transfer = b"".join(parts), "chunked"
    removed: list[str] = []
    problem = None
    for coding in reversed(content_codings(fields)):
        if coding not in _DECODABLE:
            problem = f"content coding {coding!r} is not supported"
            break
        try:
            data, cut = _inflate(data, coding, limit)
        except zlib.error as exc:
            problem = f"the {coding} content does not decode: {exc}"
            break
        truncated = truncated or cut
        removed.append(coding)
    if len(data) > limit:
        data, truncated = data[:limit], True
    coding_text = ", ".join(reversed(removed)) or None
    return Content(data, transfer, coding_text, truncated, problem)


# Output is taken from the inflater this many bytes at a time: a bomb is never inflated
# past the limit to be measured, and the content is joined once (never copied whole again).
_INFLATE_STEP = 256 * 1024


def _inflate(data: bytes, coding: str, limit: int) -> tuple[bytes, bool]:
    """One content coding removed; (content, whether it is incomplete or over ``limit``).
    At most ``limit + 1`` bytes are ever inflated, ``_INFLATE_STEP`` at a time."""
    wbits = 16 + zlib.MAX_WBITS if coding != "deflate" else zlib.MAX_WBITS
    if coding == "deflate" and data[:1] and (data[0] & 0x0F) != 8:
        wbits = -zlib.MAX_WBITS  # raw deflate without the zlib wrapper, as browsers accept
    out: list[bytes] = []
    size = 0
    rest = data
    while rest:  # gzip: concatenated members are one content
        inflater = zlib.decompressobj(wbits)
        member = len(out)  # where this member's output starts
        try:
            while True:  # a step at a time, up to one byte past the limit
                step = min(_INFLATE_STEP, limit + 1 - size)  # >= 1: 0 would mean no limit
                chunk = inflater.decompress(rest, step)
                out.append(chunk)
                size += len(chunk)
                rest = inflater.unconsumed_tail
                if size > limit or inflater.eof or (not rest and len(chunk) < step):
                    break
        except zlib.error:
            if member:  # bytes after a complete member that are no member: ignored, as browsers do
                del out[member:]
                break
            raise
        if size > limit:
            out[-1] = out[-1][:len(out[-1]) - (size - limit)]
            return b"".join(out), True
        if not inflater.eof:
            return b"".join(out), True
        rest = inflater.unused_data if coding != "deflate" else b""
    return b"".join(out), False
