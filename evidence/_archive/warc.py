"""WARC/1.1 export: every attempt that got a response, as a request and a response record.

The file starts with a ``warcinfo`` record; then, per attempt in store order (attempt_seq),
a ``response`` record and a ``request`` record pointing at it with ``WARC-Concurrent-To``.
The record blocks are ``application/http`` messages built from the stored artifacts,
byte for byte:

    response block = response head artifact + body artifact
    request block  = request artifact (the request as written: head, and body if any)
    revisit block  = response head artifact (its payload is in the record it refers to)

For an attempt captured from the wire (``capture="wire"``) these are the bytes that crossed
the connection: the request as written, the response head as read, and the message body
as read, chunk framing and content coding included, so a reader that de-chunks and
decompresses by the headers gets the content (``Evidence-Content-BLAKE3`` names the
crawler's own copy of it). Attempts recorded before wire capture have heads rebuilt from
parsed headers and a de-chunked body; for a head stored without its first line (an older
producer) the line is rebuilt from the attempt (method and URL; status code and its
standard reason phrase, as HTTP/1.1) and the record says so in ``Evidence-Reconstructed``.
No other byte is added or changed (a request with a body ends with its body, never with
a blank line after it).

A payload is written once per file (``Revisits``): a response whose body artifact was
already written is a ``revisit`` record (identical-payload-digest profile), and a 304 of
an incremental session one that names the last 2xx capture of its URL (server-not-modified
profile); both hold the response head and the original's ``WARC-Payload-Digest``.

Digests: ``WARC-Block-Digest`` and ``WARC-Payload-Digest`` are SHA-256 in base32
(``sha256:<52 chars + padding>``); SHA-1, the older convention, is not collision-resistant.
The payload digest is over the body artifact as it is in the block, transfer coding
included: that is how warcio computes and checks it (its checker digests the record's
bytes after the HTTP head, before any de-chunking), and how most crawlers write it.
Each body is also re-hashed with BLAKE3 against its artifact digest while it is exported,
so a damaged payload stops the export instead of being sealed into an archive with fresh
digests.

With whom and how (issue 33): an attempt with a recorded connection gets
``WARC-IP-Address`` (the remote address actually connected to) on its response and request
records, and a ``metadata`` record (``application/warc-fields``, ``WARC-Concurrent-To`` its
response, as Heritrix writes one per fetch) with the remote and local addresses, and for
TLS the version, cipher, ALPN protocol, SNI, whether the chain was verified and the chain
itself (one ``tlsCertificate`` field per certificate, base64 DER, leaf first). The DNS
answer it used is a ``metadata`` record of its own for ``dns:HOST`` (the addresses in the
resolver's order, when, the resolver's source, the TTL if it gave one), written once per
resolution, before the first response that used it, and named by the attempts' records
(``dnsRecord``). Being ``application/warc-fields``, neither is indexed for replay (the
rule ``cdxj-indexer`` and pywb follow). Through a proxy (issue 36) the address contacted,
``WARC-IP-Address`` and ``remoteAddress``, is the proxy's, and the metadata record names
the proxy (``proxyScheme``, ``proxyHost``, ``proxyPort``: never its credentials), what it
was asked to connect to (``proxyTarget``, ``proxyTargetPort``) and its answer
(``proxyReply``); the records' bytes are those exchanged with the origin in the tunnel.

The export is deterministic: record ids are UUIDv5 of (store id, attempt id, record type),
dates come from the store (``WARC-Date`` is the attempt's ``started_at``, to the
microsecond as WARC/1.1 allows), and a ``.gz`` output is one gzip member per record with no
timestamp. The same store gives the same bytes. Rows are read in short pages (the
evidence tables are append-only, so paging up to the max id read at the start is one
consistent set) to keep the WAL from growing during a long export.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import http
import os
import re
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple
from urllib.parse import urlsplit

import apsw
import blake3
import msgspec

from .._audit.replay import ConnectionFacts, DnsFacts, connection_facts
from .._errors import ArtifactCorruptError, EvidenceError, NotFoundError
from .._model.refs import ArtifactRef
from .._model.wire import wire_format
from .._store.artifactbase import CHUNK_SIZE
from .._store.db import Store
from .._store.fsync import fsync_dir

# What the WACZ package (wacz.py) builds its own records with, besides the WARC export.
__all__ = ["BodyStream", "HashingWriter", "Revisits", "WarcExport", "WarcRecord",
           "attempt_pages", "attempt_records", "connection_records", "der_certificates",
           "export_warc", "first_value", "header_value", "record_uri", "software_version",
           "warcinfo_record", "write_record"]

_NAMESPACE = uuid.UUID("6f1c8d52-3c39-4f0e-9d7a-0f4d8b1e2a61")  # this package's UUIDv5 space
_CRLF = b"\r\n"
_PAGE = 500
_REQUEST_LINE = re.compile(rb"[A-Z]{1,16} \S+ HTTP/\d(\.\d)?\r?\n")
_STATUS_LINE = re.compile(rb"HTTP/\d(\.\d)? \d{3}")

_ATTEMPTS = """
SELECT f.attempt_seq, f.attempt_id, f.run_id, f.url, f.method, f.started_at, f.http_status,
       f.body_truncated, f.log_index,
       q.namespace, q.digest, q.size, h.namespace, h.digest, h.size, b.namespace, b.digest, b.size,
       c.digest, f.protocol, fr.digest
FROM fetch_attempt f
LEFT JOIN artifact fr ON fr.artifact_id = f.frames_id
LEFT JOIN artifact q ON q.artifact_id = f.request_headers_id
LEFT JOIN artifact h ON h.artifact_id = f.response_headers_id
LEFT JOIN artifact b ON b.artifact_id = f.body_id
LEFT JOIN artifact c ON c.artifact_id = f.content_id
WHERE f.attempt_seq > ? AND f.attempt_seq <= ? AND f.http_status IS NOT NULL
  AND (CAST(? AS TEXT) IS NULL OR f.run_id = ?)
ORDER BY f.attempt_seq LIMIT ?
"""


class WarcExport(msgspec.Struct, kw_only=True):
    path: str
    records: int
    responses: int
    skipped: int  # attempts without a response (timeouts, errors, robots): no record
    revisits: int = 0  # of the responses, those written as revisit records
    bytes: int
    sha256: str  # of the whole file, to note beside it


def export_warc(store: Store, out_path: str | os.PathLike[str], *,
                run_id: str | None = None, compress: bool | None = None) -> WarcExport:
    """Write the store's (or one run's) responses to a new WARC/1.1 file at ``out_path``.

    ``compress`` defaults to whether the name ends in ``.gz``. An existing file is never
    overwritten; the file appears complete or not at all (temp file, fsync, rename).
    """
    out = Path(out_path)
    if out.exists():
        raise EvidenceError(f"{out} already exists; an export never overwrites a file",
                            hint="remove it or choose another name", path=str(out))
    compress = out.name.endswith(".gz") if compress is None else compress
    with store.snapshot() as conn:
        store_id = first_value(conn, "SELECT value FROM store_meta WHERE key = 'store_id'", ())
        last_seq = first_value(conn, "SELECT coalesce(max(attempt_seq), 0) FROM fetch_attempt", ())
        head = conn.execute("SELECT committed_at, tree_size FROM commit_log "
                            "ORDER BY batch_seq DESC LIMIT 1").fetchall()
        date, tree_size = head[0] if head else ("1970-01-01T00:00:00.000000Z", 0)
        total = first_value(conn, "SELECT count(*) FROM fetch_attempt WHERE attempt_seq <= ? AND "
                     "(CAST(? AS TEXT) IS NULL OR run_id = ?)", (last_seq, run_id, run_id))
        if run_id is not None and not first_value(conn, "SELECT 1 FROM crawl_run WHERE run_id = ?",
                                           (run_id,)):
            raise NotFoundError(f"no run {run_id!r} in the store",
                                hint="'evidence status' lists the runs", run_id=run_id)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        digest = hashlib.sha256()
        records = responses = 0
        revisits = Revisits()
        try:
            with open(tmp, "xb") as raw:
                sink = HashingWriter(raw, digest)
                info_id = record_uri(store_id, run_id or "*", str(tree_size), "warcinfo")
                write_record(sink, compress, warcinfo_record(store_id, run_id, info_id, date))
                records += 1
                resolutions: set[str] = set()
                for row in attempt_pages(store, conn, last_seq, run_id):
                    made = attempt_records(store, store_id, row, revisits)
                    response = made[0]
                    before, after = connection_records(store, conn, store_id, row, made,
                                                       resolutions)
                    for record in (*before, *made, *after):
                        write_record(sink, compress, record)
                        records += 1
                    revisits.written(row, response)
                    responses += 1
                raw.flush()
                os.fsync(raw.fileno())
            os.rename(tmp, out)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    fsync_dir(out.parent)
    return WarcExport(path=str(out), records=records, responses=responses,
                      skipped=total - responses, revisits=revisits.count,
                      bytes=out.stat().st_size, sha256=digest.hexdigest())


def first_value(conn: apsw.Connection, sql: str, args: tuple[object, ...]) -> Any:
    rows = conn.execute(sql, args).fetchall()
    return rows[0][0] if rows else None


def attempt_pages(store: Store, conn: apsw.Connection, last_seq: int,
           run_id: str | None) -> Iterator[tuple]:
    after = 0
    while True:
        with store.errors():  # each page is its own short snapshot
            page = conn.execute(_ATTEMPTS, (after, last_seq, run_id, run_id, _PAGE)).fetchall()
        if not page:
            return
        yield from page
        after = page[-1][0]


def record_uri(*parts: str) -> str:
    return f"<urn:uuid:{uuid.uuid5(_NAMESPACE, '/'.join(parts))}>"


def _b32(digest: bytes) -> str:
    return "sha256:" + base64.b32encode(digest).decode()


def header_value(text: str) -> str:
    """WARC header values are one line: percent-encode anything but visible ASCII."""
    return "".join(c if "!" <= c <= "~" else "".join(f"%{b:02X}" for b in c.encode())
                   for c in text)


def software_version() -> str:
    try:
        return metadata.version("evidence")
    except metadata.PackageNotFoundError:
        return "unknown"


def warcinfo_record(store_id: str, run_id: str | None, record_id: str, date: str) -> WarcRecord:
    fields = [("software", f"evidence/{software_version()}"), ("format", "WARC File Format 1.1"),
              ("conformsTo", "https://iipc.github.io/warc-specifications/specifications/"
               "warc-format/warc-1.1/"), ("isPartOf", f"evidence/{store_id}")]
    if run_id is not None:
        fields.append(("description", f"run {run_id}"))
    block = b"".join(f"{k}: {v}".encode() + _CRLF for k, v in fields)
    return WarcRecord([("WARC-Type", "warcinfo"), ("WARC-Record-ID", record_id),
                    ("WARC-Date", date), ("Content-Type", "application/warc-fields")], block)


class WarcRecord:
    """Header fields (digests and Content-Length are added), a head, and an optional body."""

    def __init__(self, fields: list[tuple[str, str]], head: bytes,
                 body: BodyStream | None = None, *, payload_digest: bool = False,
                 refers_to: Original | None = None) -> None:
        self.fields = fields
        self.head = head
        self.body = body
        self.payload_digest = payload_digest
        self.refers_to = refers_to  # a revisit's original
        self.payload: str | None = None

    def _header(self) -> bytes:
        block = hashlib.sha256(self.head)
        payload = hashlib.sha256()
        if self.body is not None:
            for chunk in self.body.chunks():  # first pass: digests
                block.update(chunk)
                payload.update(chunk)
        fields = [*self.fields, ("WARC-Block-Digest", _b32(block.digest()))]
        self.payload = None  # the WARC-Payload-Digest value, once written (CDXJ reads it)
        if self.refers_to is not None:
            self.payload = self.refers_to.payload
            fields.append(("WARC-Payload-Digest", self.payload))
        elif self.payload_digest:
            self.payload = _b32(payload.digest())
            fields.append(("WARC-Payload-Digest", self.payload))
        length = len(self.head) + (self.body.ref.size if self.body is not None else 0)
        fields.append(("Content-Length", str(length)))
        return b"WARC/1.1\r\n" + b"".join(f"{k}: {v}".encode() + _CRLF for k, v in fields) + _CRLF

    def chunks(self) -> Iterator[bytes]:
        yield self._header()
        yield self.head
        if self.body is not None:
            yield from self.body.chunks()  # second pass: the bytes, checked again
        yield _CRLF + _CRLF


class BodyStream:
    """A body artifact streamed from disk; checked against its BLAKE3 digest on every pass."""

    def __init__(self, store: Store, ref: ArtifactRef) -> None:
        self.store = store
        self.ref = ref

    def chunks(self) -> Iterator[bytes]:
        hasher, size = blake3.blake3(), 0
        with self.store.artifacts.open(self.ref) as f:
            while chunk := f.read(CHUNK_SIZE):
                hasher.update(chunk)
                size += len(chunk)
                yield chunk
        if hasher.hexdigest() != self.ref.digest or size != self.ref.size:
            raise ArtifactCorruptError(
                f"artifact {self.ref.namespace}/{self.ref.digest} is corrupt; the export "
                "stopped rather than archive it", digest=self.ref.digest,
                hint="run 'evidence verify --full' and restore the payload from a backup")


def attempt_records(store: Store, store_id: str, row: tuple,
                    revisits: Revisits | None = None) -> list[WarcRecord]:
    """A response (or revisit) and a request record; the same attempt in the same export
    always gives the same bytes."""
    (_seq, attempt_id, run_id, url, method, started_at, status, truncated, log_index,
     q_ns, q_digest, q_size, h_ns, h_digest, h_size, b_ns, b_digest, b_size, c_digest,
     protocol, frames_digest) = row
    wire = wire_format(protocol)
    original = revisits.original(row) if revisits is not None else None
    response_id = record_uri(store_id, attempt_id,
                             "response" if original is None else "revisit")
    common = [("WARC-Date", started_at), ("WARC-Target-URI", header_value(url))]
    if wire.warc_protocol is not None:
        common.append(("WARC-Protocol", wire.warc_protocol))
    evidence = [("Evidence-Attempt-ID", header_value(attempt_id)),
                ("Evidence-Run-ID", header_value(run_id)),
                ("Evidence-Log-Index", str(log_index))]

    head = b"" if h_ns is None else store.artifacts.read(ArtifactRef(h_ns, h_digest, h_size),
                                                         verify=True)
    fields = [("WARC-Type", "response" if original is None else "revisit"),
              ("WARC-Record-ID", response_id), *common]
    if original is not None:
        fields += [("WARC-Profile", original.profile), ("WARC-Refers-To", original.record_id),
                   ("WARC-Refers-To-Target-URI", original.target_uri),
                   ("WARC-Refers-To-Date", original.date)]
    fields.append(("Content-Type", "application/http;msgtype=response"))
    head = wire.warc_message(head)
    if not _STATUS_LINE.match(head):
        head = f"HTTP/1.1 {status} {_reason(status)}".encode() + _CRLF + head
        fields.append(("Evidence-Reconstructed", "status-line"))
    if truncated:
        fields.append(("WARC-Truncated", "length"))
    body = None
    if b_ns is not None:
        if original is None:
            body = BodyStream(store, ArtifactRef(b_ns, b_digest, b_size))
        fields.append(("Evidence-Body-BLAKE3", b_digest))
    if c_digest is not None:
        fields.append(("Evidence-Content-BLAKE3", c_digest))
    if frames_digest is not None:
        fields.append(("Evidence-Frames-BLAKE3", frames_digest))
    if original is None:
        response = WarcRecord([*fields, *evidence], _terminated(head), body,
                              payload_digest=True)
    else:
        response = WarcRecord([*fields, *evidence], _terminated(head),
                              refers_to=original)

    request = b"" if q_ns is None else store.artifacts.read(ArtifactRef(q_ns, q_digest, q_size),
                                                            verify=True)
    fields = [("WARC-Type", "request"),
              ("WARC-Record-ID", record_uri(store_id, attempt_id, "request")), *common,
              ("WARC-Concurrent-To", response_id),
              ("Content-Type", "application/http;msgtype=request")]
    if wire.received is not None and q_ns is not None:  # stored as frames: its message
        try:
            request = wire.warc_message(wire.request_message(request))
        except ValueError as exc:
            raise ArtifactCorruptError(
                f"the request frames {q_ns}/{q_digest} of attempt {attempt_id} do not "
                f"decode: {exc}", digest=q_digest,
                hint="run 'evidence verify --full' and restore the payload from a backup"
            ) from None
        fields.append(("Evidence-Frames-BLAKE3", q_digest))
    if not _REQUEST_LINE.match(request):
        request = f"{method} {_target(url)} HTTP/1.1".encode() + _CRLF + request
        fields.append(("Evidence-Reconstructed", "request-line"))
    return [response, WarcRecord([*fields, *evidence], _request_block(request))]


IDENTICAL_PAYLOAD = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
SERVER_NOT_MODIFIED = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"


class Original(NamedTuple):
    """A response record already written whole, that a revisit record refers to."""

    profile: str
    record_id: str
    target_uri: str
    date: str
    payload: str  # its WARC-Payload-Digest


class Revisits:
    """What an export has written whole, so that a payload is written once.

    A response whose body is the same artifact as one already written (the same BLAKE3
    digest, so the same bytes and the same WARC-Payload-Digest: the same page under
    another URL, or unchanged in a later run) becomes a ``revisit`` record with the
    identical-payload-digest profile; a 304 to a conditional request (an unchanged page
    of an incremental session) becomes one with the server-not-modified profile, naming
    the record that holds the payload of the last 2xx response of its URL. Either way the
    record holds the response head as received and names its original
    (``WARC-Refers-To``, ``-Target-URI``, ``-Date``) and the original's payload digest.
    Only whole bodies (not cut at the cap) and non-empty ones are shared; a 304 with no
    earlier response of its URL in the export, or whose URL's last 2xx body was empty or
    cut, stays a response record. The choice
    depends only on the attempts before it in store order, so an export is still
    deterministic.
    """

    def __init__(self) -> None:
        self._payloads: dict[str, Original] = {}
        self._urls: dict[str, Original] = {}
        self.count = 0

    def original(self, row: tuple) -> Original | None:
        """The record an attempt's response repeats (and in which profile), or None."""
        url, status, truncated, b_digest, b_size = row[3], row[6], row[7], row[16], row[17]
        if status == 304 and not b_size:
            found = self._urls.get(url)
            return found._replace(profile=SERVER_NOT_MODIFIED) if found else None
        if truncated or not b_size:
            return None
        return self._payloads.get(b_digest)

    def written(self, row: tuple, record: WarcRecord) -> None:
        """Note a response (or revisit) record of ``row`` just written."""
        url, date, status, truncated, b_digest, b_size = (row[3], row[5], row[6], row[7],
                                                          row[16], row[17])
        original = record.refers_to
        if original is not None:
            self.count += 1
        elif truncated or not b_size or record.payload is None:
            if 200 <= status <= 299:  # its URL's last 2xx is not whole: no 304 names it
                self._urls.pop(url, None)
            return
        else:
            original = Original(IDENTICAL_PAYLOAD, dict(record.fields)["WARC-Record-ID"],
                                header_value(url), date, record.payload)
            self._payloads.setdefault(b_digest, original)
        if 200 <= status <= 299:
            self._urls[url] = original._replace(profile=IDENTICAL_PAYLOAD)


def connection_records(store: Store, conn: apsw.Connection, store_id: str, row: tuple,
                       made: list[WarcRecord], resolutions: set[str]
                       ) -> tuple[list[WarcRecord], list[WarcRecord]]:
    """An attempt's connection in the WARC (the module's doc): ``WARC-IP-Address`` added to
    its records (``made``), and the metadata records to write before them (the DNS answer,
    if ``resolutions`` does not hold it yet: it is added) and after them."""
    facts = connection_facts(conn, row[0])
    if facts is None:
        return [], []
    for record in made:
        at = next(i for i, (name, _) in enumerate(record.fields) if name == "WARC-Target-URI")
        record.fields.insert(at + 1, ("WARC-IP-Address", facts.remote_address))
    before = []
    dns_id = None
    if facts.dns is not None:
        dns_id = record_uri(store_id, facts.dns.resolution_id, "dns")
        if facts.dns.resolution_id not in resolutions:
            resolutions.add(facts.dns.resolution_id)
            before.append(_dns_record(facts.dns, dns_id))
    (_seq, attempt_id, run_id, url, _method, started_at, *_rest) = row
    fields = [("WARC-Type", "metadata"),
              ("WARC-Record-ID", record_uri(store_id, attempt_id, "metadata")),
              ("WARC-Date", started_at), ("WARC-Target-URI", header_value(url)),
              ("WARC-Concurrent-To", record_uri(store_id, attempt_id, "response")),
              ("Content-Type", "application/warc-fields"),
              ("Evidence-Attempt-ID", header_value(attempt_id)),
              ("Evidence-Run-ID", header_value(run_id))]
    block = _fields_block(_connection_fields(store, facts, dns_id))
    return before, [WarcRecord(fields, block)]


def _connection_fields(store: Store, c: ConnectionFacts,
                       dns_id: str | None) -> list[tuple[str, str]]:
    fields = [("remoteAddress", c.remote_address), ("remotePort", str(c.remote_port)),
              ("localAddress", c.local_address), ("localPort", str(c.local_port)),
              ("connectionReused", "true" if c.reused else "false")]
    if dns_id is not None:
        fields.append(("dnsRecord", dns_id))
    p = c.proxy
    if p is not None:
        fields += [("proxyScheme", p.scheme), ("proxyHost", p.host),
                   ("proxyPort", str(p.port)), ("proxyTarget", p.target),
                   ("proxyTargetPort", str(p.target_port)), ("proxyReply", p.reply)]
    t = c.tls
    if t is None:
        return fields
    fields += [("tlsVersion", t.version), ("tlsCipher", t.cipher),
               ("tlsAlpn", t.alpn or ""), ("tlsSni", t.sni or ""),
               ("tlsVerified", "true" if t.verified else "false")]
    if t.chain_ref is not None:
        chain = store.artifacts.read(t.chain_ref, verify=True)
        fields.append(("tlsChainBLAKE3", t.chain_ref.digest))
        fields += [("tlsCertificate", base64.b64encode(der).decode())
                   for der in der_certificates(chain)]
    return fields


def _dns_record(d: DnsFacts, record_id: str) -> WarcRecord:
    fields = [("host", d.host), *(("address", a) for a in d.addresses),
              ("resolvedAt", d.resolved_at), ("resolverSource", d.source)]
    if d.ttl is not None:
        fields.append(("ttl", str(d.ttl)))
    return WarcRecord([("WARC-Type", "metadata"), ("WARC-Record-ID", record_id),
                       ("WARC-Date", d.resolved_at),
                       ("WARC-Target-URI", header_value(f"dns:{d.host}")),
                       ("Content-Type", "application/warc-fields"),
                       ("Evidence-Resolution-ID", header_value(d.resolution_id))],
                      _fields_block(fields))


def _fields_block(fields: list[tuple[str, str]]) -> bytes:
    return b"".join(f"{k}: {header_value(v)}".encode() + _CRLF for k, v in fields)


def der_certificates(chain: bytes) -> list[bytes]:
    """A stored chain split into its DER certificates (each a SEQUENCE that says its own
    length); ValueError if it is not such a sequence of them."""
    out, at = [], 0
    while at < len(chain):
        if chain[at] != 0x30 or at + 2 > len(chain):
            raise ValueError(f"no DER SEQUENCE at byte {at} of the chain")
        first = chain[at + 1]
        if first < 0x80:
            length, start = first, at + 2
        else:
            count = first & 0x7F
            start = at + 2 + count
            if count == 0 or count > 4 or start > len(chain):
                raise ValueError(f"a bad DER length at byte {at + 1} of the chain")
            length = int.from_bytes(chain[at + 2:start], "big")
        end = start + length
        if end > len(chain):
            raise ValueError(f"a certificate at byte {at} runs past the chain's end")
        out.append(chain[at:end])
        at = end
    return out


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


def _target(url: str) -> str:
    parts = urlsplit(url)
    target = parts.path or "/"
    return header_value(target + (f"?{parts.query}" if parts.query else ""))


def _request_block(request: bytes) -> bytes:
    """A request as written is complete once its head has ended: what follows the blank
    line is its body, kept as sent (nothing appended). Only a head stored without its
    blank line (an older producer) gets one."""
    if b"\r\n\r\n" in request or b"\n\n" in request:
        return request
    return _terminated(request)


def _terminated(head: bytes) -> bytes:
    """A head ends in its blank line; add it only if the stored head lacks it."""
    if head.endswith((b"\r\n\r\n", b"\n\n")):
        return head
    return head + (_CRLF if head.endswith(b"\n") else _CRLF + _CRLF)


class HashingWriter:
    """The output file, hashed as it is written (a file-like sink for GzipFile too)."""

    def __init__(self, raw: BinaryIO | HashingWriter, digest: hashlib._Hash) -> None:
        self.raw = raw
        self.digest = digest

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()


def write_record(sink: HashingWriter, compress: bool, record: WarcRecord) -> None:
    """One record; compressed, it is its own gzip member (no name, no time: reproducible)."""
    if not compress:
        for chunk in record.chunks():
            sink.write(chunk)
        return
    with gzip.GzipFile(filename="", mode="wb", fileobj=sink, mtime=0,
                       compresslevel=6) as gz:
        for chunk in record.chunks():
            gz.write(chunk)
