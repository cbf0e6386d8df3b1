"""The segment object of an S3 store (layout 2): many payloads in one immutable object.

A crawl into an object store that puts one object per payload pays one signed request, and
the server's work for it, per payload: three a page. A segment holds every payload one
group commit makes durable, so a batch of pages costs one ``PUT``. Its bytes::

    payload 0 | payload 1 | ... | index | trailer

The payloads are back to back, as they were put. The index is one ASCII line per payload,
``<namespace> <digest> <offset> <size>\\n``, sorted by (namespace, digest). The trailer is
the last 64 bytes: ``EVSEG1 <index offset, 16 hex> <index length, 16 hex> <index BLAKE3,
first 16 hex>`` padded with spaces to 63 bytes, then ``\\n``. A reader finds the trailer
from the object's size (a listing gives it), reads the index by range, and then any
payload by range: a segment is never read whole to find one payload.

The object's key is ``<prefix>/SEGMENTS/<BLAKE3 of the whole object>``: content-addressed,
so a retried ``PUT`` (its answer lost) names the same object, and the conditional create
answers 412 on what is already the same bytes. The index's own digest in the trailer lets
a reader refuse an index damaged in the bucket rather than trust offsets from it; damage
to a payload's bytes is what ``verify --full`` finds (each payload is re-hashed against
its digest).

Only the format is here, and the in-memory description of a segment (``Segment``);
the S3 store decides when segments are written (``s3puts.py``), read (``s3index.py``)
and rewritten (``s3reclaim.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import blake3

from .._model.refs import DIGEST_RE, NAMESPACE_RE

__all__ = ["SEGMENTS", "TRAILER_SIZE", "Entry", "Segment", "SegmentFormatError",
           "build_segment", "parse_index", "parse_trailer"]

SEGMENTS = "SEGMENTS/"  # upper case: never a namespace
TRAILER_SIZE = 64
_MAGIC = b"EVSEG1"
_TRAILER_RE = re.compile(rb"EVSEG1 ([0-9a-f]{16}) ([0-9a-f]{16}) ([0-9a-f]{16}) *\n")
_KEY_RE = re.compile(r"[0-9a-f]{64}")


class SegmentFormatError(ValueError):
    """A segment's trailer or index is not what this module writes (damaged, or not ours)."""


@dataclass(frozen=True)
class Entry:
    """Where one payload is in its segment."""

    namespace: str
    digest: str
    offset: int
    size: int


@dataclass
class Segment:
    """A segment this process knows: its object key, its size, when it was stored
    (seconds since the epoch: its Last-Modified, or when this process's put was answered)
    and its entries by (namespace, digest)."""

    key: str
    size: int
    modified: float
    entries: dict[tuple[str, str], Entry] = field(default_factory=dict)


def is_segment_name(name: str) -> bool:
    """A name under ``SEGMENTS/`` that this module wrote (a BLAKE3 hex digest)."""
    return bool(_KEY_RE.fullmatch(name))


def build_segment(items: Iterable[tuple[str, str, bytes]]) -> tuple[bytes, list[Entry], str]:
    """The segment holding ``items`` ((namespace, digest, payload), each key once): its
    bytes, its entries and its name (the BLAKE3 hex digest of the bytes)."""
    parts: list[bytes] = []
    entries: list[Entry] = []
    offset = 0
    for namespace, digest, payload in items:
        parts.append(payload)
        entries.append(Entry(namespace, digest, offset, len(payload)))
        offset += len(payload)
    entries.sort(key=lambda e: (e.namespace, e.digest))
    index = "".join(f"{e.namespace} {e.digest} {e.offset} {e.size}\n"
                    for e in entries).encode("ascii")
    check = blake3.blake3(index).hexdigest()[:16]
    trailer = f"{_MAGIC.decode()} {offset:016x} {len(index):016x} {check}".encode("ascii")
    parts += [index, trailer.ljust(TRAILER_SIZE - 1) + b"\n"]
    body = b"".join(parts)
    return body, entries, blake3.blake3(body).hexdigest()


def parse_trailer(trailer: bytes, size: int) -> tuple[int, int, str]:
    """(index offset, index length, index check) from the last 64 bytes of a segment of
    ``size`` bytes; SegmentFormatError if they cannot be a trailer of it."""
    match = _TRAILER_RE.fullmatch(trailer)
    if match is None:
        raise SegmentFormatError("no segment trailer at the end of the object")
    start, length = int(match[1], 16), int(match[2], 16)
    if start + length + TRAILER_SIZE != size:
        raise SegmentFormatError(f"the trailer's index ({start}+{length}) does not end where "
                                 f"the trailer begins ({size - TRAILER_SIZE})")
    return start, length, match[3].decode("ascii")


def parse_index(index: bytes, check: str, data_size: int) -> dict[tuple[str, str], Entry]:
    """The entries of an index whose BLAKE3 begins with ``check``, each inside the first
    ``data_size`` bytes; SegmentFormatError at the first thing out of place."""
    if blake3.blake3(index).hexdigest()[:16] != check:
        raise SegmentFormatError("the segment's index does not match its trailer's digest")
    entries: dict[tuple[str, str], Entry] = {}
    for line in index.decode("ascii", "replace").splitlines():
        fields = line.split(" ")
        if (len(fields) != 4 or not NAMESPACE_RE.fullmatch(fields[0])
                or not DIGEST_RE.fullmatch(fields[1])
                or not fields[2].isdigit() or not fields[3].isdigit()):
            raise SegmentFormatError(f"a segment index line is malformed: {line[:120]!r}")
        entry = Entry(fields[0], fields[1], int(fields[2]), int(fields[3]))
        if entry.offset + entry.size > data_size:
            raise SegmentFormatError(f"{entry.digest}: its bytes run past the segment's "
                                     "payloads")
        entries[(entry.namespace, entry.digest)] = entry
    return entries
