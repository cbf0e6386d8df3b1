"""The artifact pack format: one segment file of payload records, sealed by an index.

This module owns the bytes of a pack segment and nothing else (no locking, no store): how
a record, the file header, the sealed index and its trailer are encoded, and how a segment
is scanned. ``docs/store.md`` ("Artifact packs") describes the same format for a reader
who does not have this program; the two must agree.

A segment, in order::

    file header      64 bytes   magic "EVIDPACK", format 1, pack id, creation time, CRC
    records          each a 96-byte header, then its payload (``length`` bytes)
    (garbage)        only in a pack sealed after a crash: bytes of records never completed
    index            sealed packs only: one 96-byte entry per record, sorted
    trailer          sealed packs only: the last 64 bytes: index offset, entry count,
                     BLAKE3 of the index, CRC

All integers are little-endian, unsigned. CRCs are CRC-32 (ISO-HDLC, ``zlib.crc32``) of
the bytes before them in the same structure. A record's payload is checked by its BLAKE3
digest, which is in its header: a torn record fails its header CRC or its digest, so a
scan stops at the first record that is not whole (the *valid end*), and everything after
it is ignored. Sealing appends the index and trailer after the file's last byte, so a
sealed segment never changes again and can be read by range (offset, length): the
trailer, then the index, then one record.

Record kinds: ``PAYLOAD`` (stored bytes), ``TOUCH`` (no payload: the same content was put
again at ``time``, which keeps it young for reclaim's grace period), ``VOID`` (bytes to
skip: a streamed put that was refused half-way).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import blake3

from .._model.refs import NAMESPACE_RE

__all__ = [
    "ENTRY_SIZE", "FILE_HEADER_SIZE", "PAYLOAD", "RECORD_SIZE", "TOUCH", "TRAILER_SIZE",
    "VOID", "Entry", "Scan", "encode_file_header", "encode_record", "encode_seal",
    "parse_file_header", "parse_record", "read_seal", "read_seal_index", "scan",
]

FORMAT = 1
FILE_MAGIC = b"EVIDPACK"
RECORD_MAGIC = b"EVR1"
TRAILER_MAGIC = b"EVIDPEND"

VOID, PAYLOAD, TOUCH = 0, 1, 2
_KINDS = frozenset({VOID, PAYLOAD, TOUCH})

# magic, format, reserved, pack id, created (unix ms), reserved, CRC of the 60 bytes before
_FILE_HEADER = struct.Struct("<8sII16sQ20sI")
# magic, kind, namespace length, reserved, payload length, time (unix ms), BLAKE3 digest,
# namespace (zero-padded), reserved, CRC of the 92 bytes before
_RECORD = struct.Struct("<4sBBHQQ32s32sII")
_RECORD_BODY = struct.Struct("<4sBBHQQ32s32sI")  # the 92 bytes the CRC covers
_CRC = struct.Struct("<I")
# kind, 7 reserved, namespace (zero-padded), digest, record offset, payload length, time
_ENTRY = struct.Struct("<B7x32s32sQQQ")
# magic, index offset, entry count, BLAKE3 of the index, reserved, CRC of the 60 before
_TRAILER = struct.Struct("<8sQQ32sII")

FILE_HEADER_SIZE = _FILE_HEADER.size  # 64
RECORD_SIZE = _RECORD.size  # 96
ENTRY_SIZE = _ENTRY.size  # 96
TRAILER_SIZE = _TRAILER.size  # 64
_ZERO32 = bytes(32)

ReadAt = Callable[[int, int], bytes]  # (offset, length) -> bytes (short at the end)


class Entry(NamedTuple):
    """One record: where it is (``offset`` of its header) and what it holds (a named
    tuple: one is made per put, and a tuple is made in a third of a frozen dataclass's
    time)."""

    kind: int
    namespace: str
    digest: bytes  # 32 bytes
    offset: int
    length: int  # of the payload; 0 for a touch
    time: int  # unix milliseconds of the put (or of the put again, for a touch)

    @property
    def end(self) -> int:
        return self.offset + RECORD_SIZE + self.length


def encode_file_header(pack_id: bytes, created_ms: int) -> bytes:
    body = _FILE_HEADER.pack(FILE_MAGIC, FORMAT, 0, pack_id, created_ms, bytes(20), 0)[:60]
    return body + struct.pack("<I", zlib.crc32(body))


def parse_file_header(data: bytes) -> tuple[bytes, int] | None:
    """(pack id, creation ms) of a valid file header, else None."""
    if len(data) < FILE_HEADER_SIZE:
        return None
    magic, fmt, _, pack_id, created, _, crc = _FILE_HEADER.unpack_from(data)
    if magic != FILE_MAGIC or fmt != FORMAT or crc != zlib.crc32(data[:60]):
        return None
    return pack_id, created


def encode_record(kind: int, namespace: str, digest: bytes, length: int, time_ms: int) -> bytes:
    ns = namespace.encode("ascii")
    body = _RECORD_BODY.pack(RECORD_MAGIC, kind, len(ns), 0, length, time_ms, digest, ns, 0)
    return body + _CRC.pack(zlib.crc32(body))


def parse_record(data: bytes, offset: int) -> Entry | None:
    """The record whose header is ``data`` (at ``offset``), or None if it is not a whole,
    valid header (a torn tail, garbage, the index of a sealed pack)."""
    if len(data) < RECORD_SIZE:
        return None
    magic, kind, ns_len, _, length, time_ms, digest, ns, _, crc = _RECORD.unpack_from(data)
    if magic != RECORD_MAGIC or crc != zlib.crc32(data[:92]) or kind not in _KINDS:
        return None
    namespace = ns[:ns_len].decode("ascii", "replace") if kind != VOID else ""
    if kind != VOID and (not 1 <= ns_len <= 32 or not NAMESPACE_RE.fullmatch(namespace)
                         or ns[ns_len:].strip(b"\0")):
        return None
    if kind == TOUCH and length:
        return None
    return Entry(kind, namespace, digest, offset, length, time_ms)


@dataclass
class Scan:
    entries: list[Entry]
    valid_end: int  # where the first record that is not whole begins (or the data ends)
    complete: bool  # the data ended exactly at a record boundary


def scan(read_at: ReadAt, start: int, end: int, *, verify: bool = False,
         hasher: Callable[[], blake3.blake3] = blake3.blake3) -> Scan:
    """Read record headers from ``start`` up to ``end`` (the file size); stop at the first
    that is not whole. With ``verify``, each payload is read and must hash to its digest
    (how a pack left unsealed by a crash is recovered: a torn or lost record fails here)."""
    entries: list[Entry] = []
    pos = start
    while pos + RECORD_SIZE <= end:
        entry = parse_record(read_at(pos, RECORD_SIZE), pos)
        if entry is None or entry.end > end:
            break
        if verify and entry.kind == PAYLOAD and not _payload_matches(read_at, entry, hasher):
            break
        if verify and entry.kind == VOID and entry.digest != _ZERO32:
            break
        entries.append(entry)
        pos = entry.end
    return Scan(entries, pos, pos == end)


def _payload_matches(read_at: ReadAt, entry: Entry,
                     hasher: Callable[[], blake3.blake3]) -> bool:
    h = hasher()
    pos, left = entry.offset + RECORD_SIZE, entry.length
    while left:
        chunk = read_at(pos, min(left, 1 << 20))
        if not chunk:
            return False
        h.update(chunk)
        pos, left = pos + len(chunk), left - len(chunk)
    return h.digest() == entry.digest


def encode_seal(entries: list[Entry], index_offset: int) -> bytes:
    """The index of ``entries`` (sorted) and the trailer, to be written at ``index_offset``
    (the file's size): what seals a pack."""
    ordered = sorted((e for e in entries if e.kind != VOID),
                     key=lambda e: (e.namespace, e.digest, e.kind, e.offset))
    index = b"".join(_ENTRY.pack(e.kind, e.namespace.encode("ascii"), e.digest, e.offset,
                                 e.length, e.time) for e in ordered)
    body = _TRAILER.pack(TRAILER_MAGIC, index_offset, len(ordered),
                         blake3.blake3(index).digest(), 0, 0)[:60]
    return index + body + struct.pack("<I", zlib.crc32(body))


def read_seal(read_at: ReadAt, size: int) -> list[Entry] | None:
    """The entries of a sealed pack of ``size`` bytes, or None if it is not (validly)
    sealed: no trailer, a torn one, or an index that does not hash to what it says."""
    found = read_seal_index(read_at, size)
    return None if found is None else list(_entries(found[1], found[0]))


def read_seal_index(read_at: ReadAt, size: int) -> tuple[int, bytes] | None:
    """(offset, bytes) of a sealed pack's index, checked against its trailer (its BLAKE3),
    or None if the pack is not (validly) sealed (``read_seal``, before any entry is
    decoded: what the sealed digests of ``_store/packdigests.py`` are built from)."""
    if size < FILE_HEADER_SIZE + TRAILER_SIZE:
        return None
    tail = read_at(size - TRAILER_SIZE, TRAILER_SIZE)
    if len(tail) != TRAILER_SIZE:
        return None
    magic, index_offset, count, index_hash, _, crc = _TRAILER.unpack(tail)
    if magic != TRAILER_MAGIC or crc != zlib.crc32(tail[:60]):
        return None
    if index_offset < FILE_HEADER_SIZE or index_offset + count * ENTRY_SIZE + TRAILER_SIZE != size:
        return None
    index = read_at(index_offset, count * ENTRY_SIZE)
    if len(index) != count * ENTRY_SIZE or blake3.blake3(index).digest() != index_hash:
        return None
    return index_offset, index


def _entries(index: bytes, limit: int) -> Iterator[Entry]:
    for kind, ns, digest, offset, length, time_ms in _ENTRY.iter_unpack(index):
        namespace = ns.rstrip(b"\0").decode("ascii", "replace")
        entry = Entry(kind, namespace, digest, offset, length, time_ms)
        if kind in (PAYLOAD, TOUCH) and entry.end <= limit:
            yield entry
