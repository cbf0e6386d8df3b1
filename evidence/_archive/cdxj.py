"""CDXJ: the sorted index of a WARC file that replay tools binary-search by URL and time.

One line per indexed record (``response``, ``revisit``, ``resource`` and ``metadata``
records, as pywb and ``cdxj-indexer`` index by default):

    <SURT key> <14-digit timestamp> {"url": ..., "mime": ..., "status": ..., "digest": ...,
                                     "length": ..., "offset": ..., "filename": ...}

sorted as byte strings. ``url`` is the WARC-Target-URI, ``mime`` the media type of the HTTP
``Content-Type`` (of the record's own Content-Type for a resource), ``status`` the HTTP
status code (responses only), ``digest`` the WARC-Payload-Digest, ``length`` and
``offset`` the record's bytes in the (compressed) WARC file, ``filename`` its name in the
WACZ's ``archive/``. Fields without a value are left out. JSON is written as Python's
``json.dumps`` writes it (``", "`` and ``": "`` separators, non-ASCII escaped), which is
what ``cdxj-indexer`` writes: tests/test_wacz.py runs it over our WARC and compares.

The SURT key (Sort-friendly URI Reordering Transform, as the Internet Archive's Wayback
machine canonicalizes URLs): for http and https, the host lowercased without a leading
``www``/``wwwN.``, its labels reversed and joined by commas, the port unless it is the
scheme's default, ``)``, then the path with dot segments and repeated slashes removed, one
level of percent-decoding (repeated) and re-encoding of what is not printable ASCII,
lowercased, without a trailing slash; then ``?`` and the query, minimally escaped,
lowercased, with common session ids removed and its arguments sorted. The fragment and
any user information are dropped. Other schemes (``urn:``) keep ``scheme:`` and their
remainder, lowercased. tests/test_wacz.py checks this against the ``surt`` package on
generated URLs.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import socket
from urllib.parse import quote_from_bytes, unquote_to_bytes

__all__ = ["index_line", "surt_key", "timestamp14"]

_SAFE = b"!\"$&'()*+,-./:;<=>?@[\\]^_`{|}~"
_SCHEME = re.compile(rb"^([a-zA-Z][a-zA-Z0-9+\-.]*):")
# RFC 3986 appendix B: scheme, authority, path, query, fragment.
_PARTS = re.compile(rb"^(([^:/?#]+):)?(//([^/?#]*))?([^?#]*)(\?([^#]*))?(#(.*))?")
_WWW = re.compile(rb"^www\d*\.")
_DECIMAL_IP = re.compile(rb"^([1-9][0-9]*)(\.[0-9]+)?(\.[0-9]+)?(\.[0-9]+)?$")
_OCTAL_IP = re.compile(rb"^(0[0-7]*)(\.[0-7]+)?(\.[0-7]+)?(\.[0-7]+)?$")
_DEFAULT_PORT = {b"http": 80, b"https": 443}
_QUERY_SESSION_IDS = [re.compile(p, re.IGNORECASE) for p in (
    rb"^(.*)(?:jsessionid=[0-9a-zA-Z]{32})(?:&(.*))?$",
    rb"^(.*)(?:phpsessid=[0-9a-zA-Z]{32})(?:&(.*))?$",
    rb"^(.*)(?:sid=[0-9a-zA-Z]{32})(?:&(.*))?$",
    rb"^(.*)(?:ASPSESSIONID[a-zA-Z]{8}=[a-zA-Z]{24})(?:&(.*))?$",
    rb"^(.*)(?:cfid=[^&]+&cftoken=[^&]+)(?:&(.*))?$")]
_PATH_SESSION_IDS = [re.compile(p, re.IGNORECASE) for p in (
    rb"^(.*/)(\((?:[a-z]\([0-9a-z]{24}\))+\)/)([^?]+\.aspx.*)$",
    rb"^(.*/)(\([0-9a-z]{24}\)/)([^?]+\.aspx.*)$")]


def _unescape(data: bytes) -> bytes:
    """Percent-decode until nothing changes (``%2541`` is ``A``)."""
    while True:
        decoded = unquote_to_bytes(data)
        if decoded == data:
            return data
        data = decoded


def _escape(data: bytes) -> bytes:
    return quote_from_bytes(data, safe=_SAFE).encode("ascii") if data else data


def _dot_segments(path: bytes) -> bytes:
    kept: list[bytes] = []
    for segment in path.split(b"/")[1:]:
        if segment == b".":
            continue
        if segment == b"..":
            if kept:
                kept.pop()
            else:
                kept.append(segment)
            continue
        kept.append(segment)
    if not kept:
        return b"/"
    return b"/" + b"".join(s + b"/" for s in kept[:-1] if s) + kept[-1]


def _host(raw: bytes) -> bytes:
    host = _unescape(raw)
    try:
        host.decode("ascii")
    except UnicodeDecodeError:
        with contextlib.suppress(UnicodeError):  # kept as it is, as the surt package does
            host = host.decode("utf-8", "ignore").encode("idna")
    host = host.replace(b"..", b".").strip(b".")
    if host.isdigit():  # a 32-bit number is an IPv4 address
        host = str(ipaddress.IPv4Address(int(host) & 0xFFFFFFFF)).encode()
    elif _DECIMAL_IP.match(host) or _OCTAL_IP.match(host):
        try:  # the numeric forms inet_aton reads (a.b, octal parts), as a resolver would
            host = socket.inet_ntoa(socket.inet_aton(host.decode("ascii"))).encode()
        except OSError:
            host = _escape(host.lower())
    else:
        host = _escape(host.lower())
    host = host.lower()
    www = _WWW.match(host)
    return host[www.end():] if www else host


def _query(raw: bytes) -> bytes | None:
    query = _escape(_unescape(raw))
    for pattern in _QUERY_SESSION_IDS:
        match = pattern.match(query)
        if match:
            query = match.group(1) + (match.group(2) or b"")
    query = query.lower()
    if len(query) > 1:
        pairs = sorted(tuple(arg.split(b"=", 1)) for arg in query.split(b"&"))
        query = b"&".join(b"=".join(pair) for pair in pairs)
    return query or None


def surt_key(url: str) -> str:
    """The SURT key of ``url`` (see the module docstring)."""
    data = re.sub(rb"[\n\r\t]", b"", url.encode("utf-8").strip())
    if not data:
        return "-"
    if not _SCHEME.match(data):
        data = b"http://" + data
    data = re.sub(rb"^(https?://)+", lambda m: m.group(1), data)
    parts = _PARTS.match(data)
    assert parts is not None  # the pattern matches any string
    scheme = (parts.group(2) or b"").lower()
    authority, path = parts.group(4), parts.group(5)
    query = parts.group(7) or None
    host, port = None, None
    if authority:
        hostport = authority.rpartition(b"@")[2].rstrip(b":")
        name, colon, digits = hostport.rpartition(b":")
        if colon and digits.isdigit() and not hostport.endswith(b"]"):
            host, port = name, int(digits)
        else:
            host = hostport
        host = host.strip(b"[]") or None
    if host is None and scheme.startswith(b"http") and path:
        first, _, rest = path.lstrip(b"/").partition(b"/")
        host, path = first, b"/" + rest
    path = _unescape(path) if path else path
    if host:
        host = _host(host)
        path = _dot_segments(path or b"")
    path = _escape(path or b"")
    path = path.lower()
    for pattern in _PATH_SESSION_IDS:
        match = pattern.match(path)
        if match:
            path = match.group(1) + match.group(3)
    if len(path) > 1 and path.endswith(b"/"):
        path = path[:-1]
    query = _query(query) if query else None
    if port is not None and port == _DEFAULT_PORT.get(scheme):
        port = None
    if host:
        out = b",".join(reversed(host.split(b".")))
        if port is not None:
            out += b":%d" % port
        out += b")"
    else:
        out = scheme + b":"
    if path:
        out += path
    elif query is not None:
        out += b"/"
    if query is not None:
        out += b"?" + query
    return out.decode("utf-8", "surrogateescape")


def timestamp14(warc_date: str) -> str:
    """``2024-01-02T03:04:05.123456Z`` -> ``20240102030405`` (CDX timestamps are seconds)."""
    digits = re.sub(r"[^0-9]", "", warc_date)
    return (digits + "0" * 14)[:14]


def index_line(*, url: str, date: str, mime: str | None, status: int | None,
               digest: str | None, length: int, offset: int, filename: str) -> str:
    """One CDXJ line (without its newline) for a record at ``offset`` in ``filename``."""
    fields: dict[str, str] = {"url": url}
    if mime:
        fields["mime"] = mime
    if status is not None:
        fields["status"] = str(status)
    if digest:
        fields["digest"] = digest
    fields |= {"length": str(length), "offset": str(offset), "filename": filename}
    return f"{surt_key(url)} {timestamp14(date)} {json.dumps(fields)}"
