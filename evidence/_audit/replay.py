"""Forensic replay: the exact response head and body bytes of the attempt current for a URL.

Which attempt (the URL is compared by its fetch key, ``normalize_url``):

  - ``run_id`` only: that run's ``url_current`` (its highest-sequence attempt);
  - ``at`` (with or without ``run_id``): the attempt that started last at or before ``at``
    (ties: higher sequence, then later row);
  - neither: of each run's current attempt, the one that started last.

The bytes are returned as stored, each re-hashed against its BLAKE3 digest before it is
handed out, so a damaged payload is an ``ArtifactCorruptError``, never silently replayed:
the response head and the body as they came off the connection (``capture="wire"``:
status line and header block byte for byte, the body with its transfer coding), and, on
request (``content=True``), the content: the stored content artifact, or the body itself
when no coding was removed. For an attempt recorded before wire capture (``"rebuilt"``:
heads rebuilt from parsed headers, the body de-chunked) the content is derived on the
spot by removing the content codings its head names. An attempt that got no response
(timeout, network error, robots) is returned with ``response_headers`` and ``body`` None.

``connection`` says with whom and how the bytes were exchanged (issue 33; None for an
attempt recorded before that, or one that never connected): ``connection_facts``, which
``show`` uses too; its TLS facts name the ALPN protocol the server picked. ``protocol``
is the one spoken ("http/1.1" or "h2"); for h2 the head and body are derived from the
frames read on the request's stream (``frames_ref``, ``_model.http2``): the head is the
decoded one rendered HTTP/1-style (``HTTP/2 200``), the body the DATA payloads.
Through a proxy (issue 36) its ``proxy`` says which one (never its
credentials), what it was asked to connect to and what it answered: those facts live in
the attempt's ledger entry only (the message its Merkle leaf covers), where they are read.
"""

from __future__ import annotations

import datetime as _dt

import apsw
import msgspec

from .._errors import EvidenceError, NotFoundError
from .._model.http1 import derive_content
from .._model.messages import FetchAttempt, Proxied, decode_message, format_time
from .._model.refs import ArtifactRef
from .._model.urls import NORMALIZER_VERSION, normalize_url
from .._store.db import Store

__all__ = ["ConnectionFacts", "DnsFacts", "ProxyFacts", "ReplayedResponse", "TlsFacts",
           "connection_facts", "locate", "parse_time", "replay"]


class DnsFacts(msgspec.Struct, frozen=True, kw_only=True):
    resolution_id: str
    host: str
    port: int
    resolved_at: str
    source: str  # getaddrinfo, hosts-file, given
    addresses: list[str]  # in the resolver's order
    ttl: int | None  # None: the resolver gave none (getaddrinfo never does)


class TlsFacts(msgspec.Struct, frozen=True, kw_only=True):
    version: str
    cipher: str
    alpn: str | None
    sni: str | None
    chain_ref: ArtifactRef | None  # DER certificates, leaf first
    verified: bool


class ConnectionFacts(msgspec.Struct, frozen=True, kw_only=True):
    remote_address: str
    remote_port: int
    local_address: str
    local_port: int
    reused: bool  # an earlier request went over the same connection
    dns: DnsFacts | None  # None: the host was an address literal
    tls: TlsFacts | None
    proxy: ProxyFacts | None = None  # None: a direct connection


class ProxyFacts(msgspec.Struct, frozen=True, kw_only=True):
    scheme: str  # http (CONNECT), socks5, socks5h
    host: str  # the proxy as configured, without credentials
    port: int
    target: str  # what it was asked to connect to: the checked address, or a name (socks5h)
    target_port: int
    reply: str  # its answer to the handshake
    established: bool  # False: it refused the tunnel; the origin was never reached
    dns: DnsFacts | None  # the resolution of the proxy's own name

    @classmethod
    def of(cls, p: Proxied) -> ProxyFacts:
        d = p.dns
        return cls(scheme=p.scheme, host=p.host, port=p.port, target=p.target,
                   target_port=p.target_port, reply=p.reply, established=p.established,
                   dns=None if d is None else DnsFacts(
                       resolution_id=d.resolution_id, host=d.host, port=d.port,
                       resolved_at=format_time(d.resolved_at), source=d.source,
                       addresses=list(d.addresses), ttl=d.ttl))


_CONNECTION = """
SELECT f.remote_address, f.remote_port, f.local_address, f.local_port, f.connection_reused,
       d.resolution_id, d.host, d.port, d.resolved_at, d.source, d.addresses, d.ttl,
       f.tls_version, f.tls_cipher, f.tls_alpn, f.tls_sni, t.namespace, t.digest, t.size,
       f.tls_verified
FROM fetch_attempt f
LEFT JOIN dns_resolution d ON d.resolution_seq = f.resolution_seq
LEFT JOIN artifact t ON t.artifact_id = f.tls_chain_id
WHERE f.attempt_seq = ?
"""
_ENTRY = ("SELECT l.payload FROM fetch_attempt f JOIN ingest_ledger l "
          "ON l.log_index = f.log_index WHERE f.attempt_seq = ?")


def connection_facts(conn: apsw.Connection, attempt_seq: int) -> ConnectionFacts | None:
    """The connection an attempt went over, as recorded (None: it has none recorded)."""
    rows = conn.execute(_CONNECTION, (attempt_seq,)).fetchall()
    if not rows or rows[0][0] is None:
        return None
    (remote, remote_port, local, local_port, reused, r_id, host, port, at, source, addresses,
     ttl, version, cipher, alpn, sni, t_ns, t_digest, t_size, verified) = rows[0]
    dns = None if r_id is None else DnsFacts(
        resolution_id=r_id, host=host, port=port, resolved_at=at, source=source,
        addresses=msgspec.json.decode(addresses), ttl=ttl)
    tls = None if version is None else TlsFacts(
        version=version, cipher=cipher, alpn=alpn, sni=sni, verified=bool(verified),
        chain_ref=None if t_ns is None else ArtifactRef(t_ns, t_digest, t_size))
    return ConnectionFacts(remote_address=remote, remote_port=remote_port,
                           local_address=local, local_port=local_port, reused=bool(reused),
                           dns=dns, tls=tls, proxy=_proxy_facts(conn, attempt_seq))


def _proxy_facts(conn: apsw.Connection, attempt_seq: int) -> ProxyFacts | None:
    """The proxy an attempt went through, from its ledger entry (None: directly)."""
    rows = conn.execute(_ENTRY, (attempt_seq,)).fetchall()
    if not rows or b"proxy" not in rows[0][0]:  # most attempts: no decoding needed
        return None
    message = decode_message(rows[0][0])
    if not isinstance(message, FetchAttempt) or message.connection is None:
        return None
    proxied = message.connection.proxy
    return None if proxied is None else ProxyFacts.of(proxied)


class ReplayedResponse(msgspec.Struct, frozen=True, kw_only=True):
    attempt_id: str
    run_id: str
    url: str  # exactly as requested
    fetch_key: str
    sequence: int
    method: str
    started_at: str
    outcome: str
    http_status: int | None
    content_type: str | None
    body_truncated: bool
    log_index: int  # the ledger entry: prove it with 'evidence prove --attempt'
    response_headers_ref: ArtifactRef | None
    body_ref: ArtifactRef | None
    response_headers: bytes | None
    body: bytes | None
    capture: str = "rebuilt"  # "wire": head and body as they crossed the connection
    content_ref: ArtifactRef | None = None  # the content, where it differs from the body
    transfer_coding: str | None = None  # removed to get the content
    content_coding: str | None = None  # removed to get the content
    content_truncated: bool = False
    content: bytes | None = None  # only when asked for (``replay(..., content=True)``)
    connection: ConnectionFacts | None = None  # with whom and how (``connection_facts``)
    protocol: str = "http/1.1"  # "h2": the head and body are derived from ``frames_ref``
    frames_ref: ArtifactRef | None = None  # h2: the frames read on the request's stream

    def http_message(self) -> bytes:
        """Head then body, as received. Only if the stored head lacks its closing blank line
        (older producers) is one added between them, so the result parses as HTTP."""
        head = self.response_headers or b""
        if head and not head.endswith((b"\r\n\r\n", b"\n\n")):
            head += b"\r\n" if head.endswith(b"\n") else b"\r\n\r\n"
        return head + (self.body or b"")

    def metadata(self) -> dict[str, object]:
        """Everything but the bytes, for ``--json``."""
        data = msgspec.to_builtins(self)
        for name in ("response_headers", "body", "content"):
            data.pop(name, None)
        return data


def parse_time(value: str | _dt.datetime) -> _dt.datetime:
    """An ISO 8601 instant with a timezone (``2025-03-03T12:00:00Z``); naive times are refused."""
    if isinstance(value, _dt.datetime):
        moment = value
    else:
        try:
            moment = _dt.datetime.fromisoformat(value.strip().replace("z", "Z"))
        except ValueError:
            raise EvidenceError(f"not an ISO 8601 time: {value!r}",
                                hint="write it like 2025-03-03T12:00:00Z") from None
    if moment.tzinfo is None:
        raise EvidenceError(f"the time {value!s} has no timezone",
                            hint="add Z for UTC, or an offset such as +01:00")
    return moment


_ATTEMPT = """
SELECT f.attempt_id, f.run_id, f.url, f.sequence, f.method, f.started_at, f.outcome,
       f.http_status, f.content_type, f.body_truncated, f.log_index,
       h.namespace, h.digest, h.size, b.namespace, b.digest, b.size,
       f.capture, c.namespace, c.digest, c.size, f.transfer_coding, f.content_coding,
       f.content_truncated, f.protocol, fr.namespace, fr.digest, fr.size
FROM fetch_attempt f
LEFT JOIN artifact fr ON fr.artifact_id = f.frames_id
LEFT JOIN artifact h ON h.artifact_id = f.response_headers_id
LEFT JOIN artifact b ON b.artifact_id = f.body_id
LEFT JOIN artifact c ON c.artifact_id = f.content_id
WHERE f.attempt_seq = ?
"""
_REPLAY_LIMIT = 1 << 30  # content derived on the spot (older attempts): at most 1 GiB


def replay(store: Store, url: str, *, run_id: str | None = None,
           at: str | _dt.datetime | None = None, content: bool = False) -> ReplayedResponse:
    """The attempt current for ``url`` (see the module docstring), with its stored bytes;
    with ``content``, its decoded content too."""
    with store.snapshot() as conn:
        key, _, seq = locate(conn, url, run_id=run_id, at=at)
        row = conn.execute(_ATTEMPT, (seq,)).fetchall()[0]
        connection = connection_facts(conn, seq)
    (attempt_id, run, requested, sequence, method, started_at, outcome, status, content_type,
     truncated, log_index, h_ns, h_digest, h_size, b_ns, b_digest, b_size, capture, c_ns,
     c_digest, c_size, transfer_coding, content_coding, content_truncated, protocol, f_ns,
     f_digest, f_size) = row
    head_ref = None if h_ns is None else ArtifactRef(h_ns, h_digest, h_size)
    body_ref = None if b_ns is None else ArtifactRef(b_ns, b_digest, b_size)
    content_ref = None if c_ns is None else ArtifactRef(c_ns, c_digest, c_size)
    head = None if head_ref is None else store.artifacts.read(head_ref, verify=True)
    body = None if body_ref is None else store.artifacts.read(body_ref, verify=True)
    decoded = None
    if content and body is not None:
        if content_ref is not None:
            decoded = store.artifacts.read(content_ref, verify=True)
        elif capture == "wire":
            decoded = body  # no coding was removed: the body is the content
        else:  # recorded before wire capture: the body is de-chunked, still content-coded
            decoded = derive_content(head or b"", body, _REPLAY_LIMIT, dechunk=False).data
    return ReplayedResponse(
        attempt_id=attempt_id, run_id=run, url=requested, fetch_key=key, sequence=sequence,
        method=method, started_at=started_at, outcome=outcome, http_status=status,
        content_type=content_type, body_truncated=bool(truncated), log_index=log_index,
        response_headers_ref=head_ref, body_ref=body_ref, response_headers=head, body=body,
        capture=capture, content_ref=content_ref, transfer_coding=transfer_coding,
        content_coding=content_coding, content_truncated=bool(content_truncated),
        content=decoded, connection=connection, protocol=protocol,
        frames_ref=None if f_ns is None else ArtifactRef(f_ns, f_digest, f_size))


def locate(conn: apsw.Connection, url: str, *, run_id: str | None = None,
           at: str | _dt.datetime | None = None) -> tuple[str, int, int]:
    """(fetch key, url id, attempt_seq) of the attempt ``url`` stands for (see the module
    docstring), or NotFoundError saying what was not there."""
    key = normalize_url(url)
    when = None if at is None else format_time(parse_time(at))
    ids = conn.execute("SELECT url_id FROM url_identity WHERE normalizer_version = ? "
                       "AND fetch_key = ?", (NORMALIZER_VERSION, key)).fetchall()
    if run_id is not None and not conn.execute(
            "SELECT 1 FROM crawl_run WHERE run_id = ?", (run_id,)).fetchall():
        raise NotFoundError(f"no run {run_id!r} in the store",
                            hint="'evidence status' lists the runs", run_id=run_id)
    seq = None if not ids else _choose(conn, ids[0][0], run_id, when)
    if seq is None:
        scope = f" in run {run_id}" if run_id else ""
        since = f" started at or before {when}" if when else ""
        raise NotFoundError(f"no attempt of {key}{scope}{since}",
                            hint="check the URL, the run and the time", url=url)
    return key, ids[0][0], seq


def _choose(conn: apsw.Connection, url_id: int, run_id: str | None, when: str | None) -> int | None:
    if when is not None:
        sql = ("SELECT attempt_seq FROM fetch_attempt WHERE url_id = ? AND started_at <= ?"
               + (" AND run_id = ?" if run_id is not None else "")
               + " ORDER BY started_at DESC, sequence DESC, attempt_seq DESC LIMIT 1")
        args: tuple[object, ...] = (url_id, when) + ((run_id,) if run_id is not None else ())
    elif run_id is not None:
        sql = "SELECT attempt_seq FROM url_current WHERE url_id = ? AND run_id = ?"
        args = (url_id, run_id)
    else:
        sql = ("SELECT c.attempt_seq FROM url_current c JOIN fetch_attempt f "
               "ON f.attempt_seq = c.attempt_seq WHERE c.url_id = ? "
               "ORDER BY f.started_at DESC, f.attempt_seq DESC LIMIT 1")
        args = (url_id,)
    rows = conn.execute(sql, args).fetchall()
    return rows[0][0] if rows else None
