"""Enough MessagePack to read a ledger entry: evidence's messages are canonical msgpack
maps. Written to the format's specification (msgpack.org, spec.md). Times are the
specification's timestamp extension (type -1), returned as ISO 8601 UTC text; any other
extension is returned as ``{"ext": type, "data": bytes}``."""

from __future__ import annotations

import datetime as dt
import struct
from typing import Any


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("msgpack data ends early")
        piece = self.data[self.pos:self.pos + n]
        self.pos += n
        return piece

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")


def unpack(data: bytes) -> Any:
    """The one value ``data`` holds; ``ValueError`` if it is not exactly one value."""
    reader = _Reader(data)
    value = _value(reader, 0)
    if reader.pos != len(data):
        raise ValueError("bytes after the msgpack value")
    return value


def _value(r: _Reader, depth: int) -> Any:
    if depth > 64:
        raise ValueError("msgpack nested too deep")
    b = r.uint(1)
    if b <= 0x7F:
        return b
    if b >= 0xE0:
        return b - 0x100
    if 0x80 <= b <= 0x8F:
        return _map(r, b & 0x0F, depth)
    if 0x90 <= b <= 0x9F:
        return [_value(r, depth + 1) for _ in range(b & 0x0F)]
    if 0xA0 <= b <= 0xBF:
        return r.take(b & 0x1F).decode("utf-8")
    fixed = {0xC0: None, 0xC2: False, 0xC3: True}
    if b in fixed:
        return fixed[b]
    sizes = {0xC4: 1, 0xC5: 2, 0xC6: 4}  # bin
    if b in sizes:
        return r.take(r.uint(sizes[b]))
    if b == 0xCA:
        return struct.unpack(">f", r.take(4))[0]
    if b == 0xCB:
        return struct.unpack(">d", r.take(8))[0]
    unsigned = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
    if b in unsigned:
        return r.uint(unsigned[b])
    signed = {0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8}
    if b in signed:
        return int.from_bytes(r.take(signed[b]), "big", signed=True)
    strings = {0xD9: 1, 0xDA: 2, 0xDB: 4}
    if b in strings:
        return r.take(r.uint(strings[b])).decode("utf-8")
    arrays = {0xDC: 2, 0xDD: 4}
    if b in arrays:
        return [_value(r, depth + 1) for _ in range(r.uint(arrays[b]))]
    maps = {0xDE: 2, 0xDF: 4}
    if b in maps:
        return _map(r, r.uint(maps[b]), depth)
    fixext = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
    if b in fixext:
        kind = int.from_bytes(r.take(1), "big", signed=True)
        return _ext(kind, r.take(fixext[b]))
    ext = {0xC7: 1, 0xC8: 2, 0xC9: 4}
    if b in ext:
        size = r.uint(ext[b])
        kind = int.from_bytes(r.take(1), "big", signed=True)
        return _ext(kind, r.take(size))
    raise ValueError(f"0x{b:02x} is not a msgpack type byte")


def _ext(kind: int, data: bytes) -> Any:
    if kind != -1:
        return {"ext": kind, "data": data}
    if len(data) == 4:
        seconds, nanos = int.from_bytes(data, "big"), 0
    elif len(data) == 8:
        value = int.from_bytes(data, "big")
        seconds, nanos = value & 0x3FFFFFFFF, value >> 34
    elif len(data) == 12:
        nanos = int.from_bytes(data[:4], "big")
        seconds = int.from_bytes(data[4:], "big", signed=True)
    else:
        raise ValueError("a msgpack timestamp of a length the specification does not have")
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds,
                                                                    microseconds=nanos // 1000)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _map(r: _Reader, n: int, depth: int) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for _ in range(n):
        key = _value(r, depth + 1)
        if isinstance(key, list | dict):
            raise ValueError("a msgpack map key that is a container")
        out[key] = _value(r, depth + 1)
    return out


def pack(value: Any) -> bytes:
    """The canonical (shortest-form) msgpack of None, an int, a str, bytes or a list of
    them: what evidence hashes for a submitter's ledger entry, a quarantine record and a
    pre-006 quarantine row."""
    if value is None:
        return b"\xc0"
    if isinstance(value, bool):
        return b"\xc3" if value else b"\xc2"
    if isinstance(value, int):
        return _pack_int(value)
    if isinstance(value, str):
        data = value.encode("utf-8")
        n = len(data)
        head = (bytes([0xA0 | n]) if n < 32 else b"\xd9" + n.to_bytes(1, "big") if n < 1 << 8
                else b"\xda" + n.to_bytes(2, "big") if n < 1 << 16
                else b"\xdb" + n.to_bytes(4, "big"))
        return head + data
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        n = len(data)
        head = (b"\xc4" + n.to_bytes(1, "big") if n < 1 << 8 else
                b"\xc5" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xc6" + n.to_bytes(4, "big"))
        return head + data
    if isinstance(value, list | tuple):
        n = len(value)
        head = (bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16
                else b"\xdd" + n.to_bytes(4, "big"))
        return head + b"".join(pack(v) for v in value)
    raise TypeError(f"cannot pack {type(value).__name__}")


def _pack_int(n: int) -> bytes:
    if 0 <= n < 128:
        return bytes([n])
    if -32 <= n < 0:
        return struct.pack(">b", n)
    if n >= 0:
        for code, fmt, limit in ((0xCC, ">B", 1 << 8), (0xCD, ">H", 1 << 16),
                                 (0xCE, ">I", 1 << 32), (0xCF, ">Q", 1 << 64)):
            if n < limit:
                return bytes([code]) + struct.pack(fmt, n)
    for code, fmt, bits in ((0xD0, ">b", 7), (0xD1, ">h", 15), (0xD2, ">i", 31),
                            (0xD3, ">q", 63)):
        if n >= -(1 << bits):
            return bytes([code]) + struct.pack(fmt, n)
    raise ValueError("integer out of msgpack's range")
