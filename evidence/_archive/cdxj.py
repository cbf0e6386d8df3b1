"""CDXJ: the sorted index of a WARC file that replay tools binary-search by URL and time.

One line per indexed record (``response``, ``revisit``, ``resource`` and ``metadata``
records, as pywb and ``cdxj-indexer`` index by default):

    <SURT key> <14-digit timestamp> {"url": ..., "mime": ..., "status": ..., "digest": ...,
                                     "length": ..., "offset": ..., "filename": ...}

sorted as byte strings. ``url`` is the WARC-Target-URI, ``mime`` the media type of the HTTP
``Content-Type`` (of the record's own Content-Type for a resource), ``status`` the HTTP
status code (responses only), ``digest`` the WARC-Payload-Digest, ``length`` and
``offset`` the record's bytes in the (compressed) WARC file, ``filename`` its name in the
WACZ's ``archive/``, ``recordDigest`` the SHA-256 of those bytes (``sha256:<hex>``, so a
reader can check the one record it fetched by range, as py-wacz writes it). Fields without
a value are left out. JSON is written as Python's
``json.dumps`` writes it (``", "`` and ``": "`` separators, non-ASCII escaped), which is
what ``cdxj-indexer`` writes: tests/test_wacz.py runs it (``--post-append
--digest-records``, as py-wacz runs it) over our WARC and compares.

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

import base64
import contextlib
import hashlib
import ipaddress
import json
import re
import socket
import zlib
from typing import NamedTuple
from urllib.parse import quote_from_bytes, unquote_plus, unquote_to_bytes, urlencode

from .._model.http1 import header, parse_head

__all__ = ["INDEX_LINES", "MethodQuery", "compressed_index", "index_line", "method_query",
           "surt_key", "timestamp14"]

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
               digest: str | None, length: int, offset: int, filename: str,
               record_digest: str | None = None, method: MethodQuery | None = None) -> str:
    """One CDXJ line (without its newline) for a record at ``offset`` in ``filename``;
    ``record_digest``: the SHA-256 of the record's bytes there; ``method``: the request
    was not a GET or HEAD, so the key is the post-append form."""
    fields: dict[str, str | None] = {"url": url}
    if mime:
        fields["mime"] = mime
    if status is not None:
        fields["status"] = str(status)
    if digest:
        fields["digest"] = digest
    fields |= {"length": str(length), "offset": str(offset), "filename": filename}
    if record_digest:
        fields["recordDigest"] = record_digest
    key = surt_key(url)
    if method is not None:
        key = surt_key(url + ("&" if "?" in url else "?") + method.suffix)
        fields |= {"requestBody": method.body, "method": method.method}
    return f"{key} {timestamp14(date)} {json.dumps(fields)}"


# -- Requests with a body: the post-append key ----------------------------------------------
#
# A POST to /api is not the same capture as a GET of /api, nor as a POST of another body.
# Replay tools (pywb, ReplayWeb.page) look such a request up by its URL with the method and
# a canonical form of the body appended as query arguments, and the indexers that serve
# them (``cdxj-indexer --post-append``, py-wacz) key the captures the same way:
#
#     <url>?__wb_method=POST&<body as query>       (``&`` if the URL has a query already)
#
# For POST and PUT the body is read as its Content-Type says: a form as its (decoded)
# arguments, multipart form data as its fields urlencoded, JSON (and text/plain that
# parses as JSON) as its leaf values by key (a repeated key numbered ``key.2_``, ...),
# anything else as ``__wb_post_data=<base64>``; at most 4,096 characters, with the body
# read up to its Content-Length (8,192 bytes when it has none). Other methods (DELETE,
# PATCH, OPTIONS, ...) append only ``__wb_method=<METHOD>``: that is what the replay
# tools look them up by (they read no body for them), so the key is one they find.
# The URL with that suffix goes through the SURT key as any URL does (lowercased, its
# arguments sorted). The line also names the ``method`` and its ``requestBody`` (the
# appended form of the body), as the indexers write them.
#
# Two differences from cdxj-indexer. It keys only POST and PUT this way (a captured DELETE
# is then keyed as a GET of its URL, and a replayed DELETE, looked up with
# ``__wb_method=delete``, is not found). And it decodes Flash's AMF bodies, which are kept
# here as binary (``__wb_post_data``): an AMF POST is keyed otherwise than pywb would
# look it up, a gap left open (Flash has not run in a browser since 2021).

_MAX_QUERY = 4096
_NO_LENGTH_READ = 8192


class MethodQuery(NamedTuple):
    method: str  # as in the request line, uppercased
    suffix: str  # appended to the URL for its key: __wb_method=POST&...
    body: str | None  # the body's query form ("" when it has none); None: unreadable length


def method_query(request: bytes) -> MethodQuery | None:
    """The post-append form of a request as written (request line, head, body), or None
    for a GET or HEAD (keyed by their URL alone)."""
    first = request.split(b"\n", 1)[0].split(b" ", 1)[0].decode("latin-1").upper()
    if not first or first in ("GET", "HEAD"):
        return None
    if first not in ("POST", "PUT"):
        return MethodQuery(first, f"__wb_method={first}", "")
    _status, fields = parse_head(request)
    kind = (_first(fields, b"content-type") or b"").decode("latin-1")
    length_text = _first(fields, b"content-length")
    body = _body(request)
    if length_text is None:
        length = _NO_LENGTH_READ
    else:
        try:
            length = int(length_text)
        except ValueError:
            return MethodQuery(first, f"__wb_method={first}", None)
    query = _body_query(kind, body[:max(length, 0)])
    suffix = f"__wb_method={first}" + (f"&{query}" if query else "")
    return MethodQuery(first, suffix, query)


def _first(fields: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of a field (what a WARC reader's get_header answers)."""
    return next((v for n, v in fields if n.lower() == name), None)


def _body(request: bytes) -> bytes:
    for end in (b"\r\n\r\n", b"\n\n"):
        at = request.find(end)
        if at >= 0:
            return request[at + len(end):]
    return b""


def _binary(data: bytes) -> str:
    return "__wb_post_data=" + base64.b64encode(data).decode("ascii")


def _body_query(kind: str, data: bytes) -> str:
    if kind.startswith("application/x-www-form-urlencoded"):
        try:
            query = unquote_plus(data.decode("utf-8"))
        except UnicodeDecodeError:
            query = _binary(data)
    elif kind.startswith("multipart/"):
        query = _multipart_query(kind, data)
    elif kind.startswith("application/json"):
        try:
            query = _json_query(data)
        except ValueError:
            query = ""
    elif kind.startswith("text/plain"):
        try:
            query = _json_query(data)
        except ValueError:
            query = _binary(data)
    else:
        query = _binary(data)
    return query[:_MAX_QUERY]


def _json_query(data: bytes) -> str:
    """Every leaf value under its nearest key, in document order, as a query string."""
    values: dict[str, str] = {}
    repeats: dict[str, int] = {}

    def name_for(key: str) -> str:
        if key not in values:
            return key
        repeats[key] = repeats.get(key, 1) + 1
        return f"{key}.{repeats[key]}_"

    def walk(node: object, key: str = "") -> None:
        if isinstance(node, dict):
            for name, value in node.items():
                walk(value, name)
        elif isinstance(node, list):
            for value in node:
                walk(value, key)
        elif key:
            values[name_for(key)] = str(node)  # Python's spelling: True, None, 1.5

    try:
        walk(json.loads(data))
    except json.JSONDecodeError:
        if b"\n" not in data:
            raise
        for line in data.split(b"\n"):  # JSON lines
            walk(json.loads(line))
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(str(exc)) from None
    return urlencode(values)


def _multipart_query(kind: str, data: bytes) -> str:
    """The fields of multipart form data, urlencoded (a file's bytes percent-encoded)."""
    if "boundary=" not in kind:
        return _binary(data)
    boundary = kind.split("boundary=")[1].encode("latin-1")
    delimiter = b"--" + boundary
    values: list[tuple[str, str | bytes]] = []
    parts = data.split(delimiter)
    if len(parts) < 3 or not parts[-1].startswith(b"--"):
        return _binary(data)
    for part in parts[1:-1]:
        if not part.startswith(b"\r\n") or not part.endswith(b"\r\n"):
            return _binary(data)
        head, sep, content = part[2:-2].partition(b"\r\n\r\n")
        if not sep:
            return _binary(data)
        _status, fields = parse_head(b"\r\n" + head + b"\r\n\r\n")
        disposition = (header(fields, b"content-disposition") or b"").decode("utf-8", "replace")
        name = _disposition_param(disposition, "name")
        filename = _disposition_param(disposition, "filename")
        if name is None:
            return _binary(data)
        values.append((name, content if filename is not None
                       else content.decode("utf-8", "replace")))
    return urlencode(values, True)


def _disposition_param(disposition: str, param: str) -> str | None:
    match = re.search(rf'(?:^|;)\s*{param}="((?:[^"\\]|\\.)*)"|(?:^|;)\s*{param}=([^;\s]*)',
                      disposition)
    if match is None:
        return None
    quoted, bare = match.groups()
    return re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare


# -- The compressed index: index.cdx.gz and index.idx ---------------------------------------
#
# ReplayWeb.page reads a plain index.cdx whole before it replays anything; a compressed
# index it reads in parts. ``index.cdx.gz`` is the sorted CDXJ lines in gzip members of
# ``INDEX_LINES`` lines each (each member a whole gzip stream, so one can be read alone by
# its offset and length), and ``index.idx`` says where each member starts:
#
#     !meta 0 {"format": "cdxj-gzip-1.0", "filename": "index.cdx.gz"}
#     <key> <timestamp> {"offset": ..., "length": ..., "digest": "sha256:<hex>"}
#
# one line per member, naming its first line's key and time, the member's bytes in the
# .cdx.gz and their SHA-256: the ``cdxj-gzip-1.0`` format of the WACZ specification, as
# ``cdxj-indexer --compress --digest-records`` and py-wacz write it. A reader binary-
# searches the .idx for a URL and inflates one member. The members are zlib's gzip at its
# default level with no name and no time, so the same lines give the same bytes.

INDEX_LINES = 1024


def compressed_index(lines: list[str], filename: str = "index.cdx.gz",
                     per_member: int = INDEX_LINES) -> tuple[bytes, bytes]:
    """The (.cdx.gz, .idx) pair for sorted CDXJ ``lines`` (each without its newline)."""
    members: list[bytes] = []
    idx = [f"!meta 0 {json.dumps({'format': 'cdxj-gzip-1.0', 'filename': filename})}\n"]
    offset = 0
    for start in range(0, len(lines), per_member):
        block = lines[start:start + per_member]
        packer = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
        member = packer.compress("".join(f"{line}\n" for line in block).encode("utf-8"))
        member += packer.flush()
        key, stamp = block[0].split(" ", 2)[:2]
        entry = {"offset": offset, "length": len(member),
                 "digest": "sha256:" + hashlib.sha256(member).hexdigest()}
        idx.append(f"{key} {stamp} {json.dumps(entry)}\n")
        members.append(member)
        offset += len(member)
    return b"".join(members), "".join(idx).encode("utf-8")
