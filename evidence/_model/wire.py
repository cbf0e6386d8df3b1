"""The protocol seam of wire capture: what differs between HTTP/1.1 and HTTP/2 for every
reader of a stored exchange, behind one small interface.

A wire capture stores what crossed the connection. Which bytes those are, and how a head
and body are read back from them, depends on the protocol the attempt records
(``FetchAttempt.protocol``); everything after that (content codings, rules, indexes,
replay) reads an HTTP/1-style head and a body, whatever the protocol. So each protocol
says, in one ``WireFormat``:

- ``split_response(received, method)``: the response's head, body and surplus in what was
  read (HTTP/1.1: the bytes of the connection, framed by ``_model.http1``; h2: the frames
  of the request's stream, ``_model.http2``), as the client reads them and every later
  reader reads the stored bytes again;
- ``request_message(sent)``: the request as an HTTP/1-style message (head and body), for
  WARC request records and ``replay``: HTTP/1.1's stored request is one already; h2's is
  derived from its frames;
- ``received``: the attempt field holding what was read as it came, when the head and body
  are derived from it (h2: ``frames``), or None (HTTP/1.1: the head, body and surplus
  artifacts are the bytes read, split);
- ``warc_protocol``: the ``WARC-Protocol`` field of its WARC records (None: none written,
  as for every HTTP/1.1 record written before HTTP/2);
- ``warc_message(message)``: a response head or request message as its WARC record holds
  it: HTTP/1.1's as stored; h2's with HTTP/1.1 start lines, which pywb and warcio read
  (the record's ``WARC-Protocol`` says what was spoken).

The fetch (``_crawl.fetch``), the client's ``Exchange``, the WARC export and replay ask
``wire_format(attempt.protocol)`` and nothing else; a third protocol is a module beside
``http1.py`` and ``http2.py``, an entry in ``FORMATS``, the client's connection for it
beside ``_crawl.h2connection`` (ALPN's choice in ``_crawl.http``), and its name in
``messages.Protocol`` (with the migration that admits it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import http1, http2
from .http1 import Split

__all__ = ["FORMATS", "WireFormat", "wire_format"]


@dataclass(frozen=True)
class WireFormat:
    """How one protocol's stored exchange is read (the module's doc)."""

    name: str  # as an attempt records it, and as ALPN names it
    split_response: Callable[[bytes | bytearray, str], Split]
    request_message: Callable[[bytes], bytes]
    received: str | None
    warc_protocol: str | None
    warc_message: Callable[[bytes], bytes]  # a head or request as a WARC record holds it


def _h1_split(received: bytes | bytearray, method: str) -> Split:
    return http1.split_response(bytes(received), method)


def _h2_split(received: bytes | bytearray, method: str) -> Split:
    return http2.split_response(received)


def _as_sent(sent: bytes) -> bytes:
    return sent


FORMATS: dict[str, WireFormat] = {
    "http/1.1": WireFormat("http/1.1", _h1_split, _as_sent, None, None, _as_sent),
    http2.NAME: WireFormat(http2.NAME, _h2_split, http2.request_message, "frames", http2.NAME,
                           http2.as_http11),
}


def wire_format(protocol: str | None) -> WireFormat:
    """The format of an attempt's protocol (None: recorded before protocols were, so
    HTTP/1.1); KeyError for a protocol this program does not read."""
    return FORMATS[protocol or "http/1.1"]
