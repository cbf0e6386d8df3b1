"""WACZ 1.1.1 export: a store as one file that ReplayWeb.page, pywb and Browsertrix open.

    export_wacz(store, "site.wacz", key="wacz.key")

A WACZ is a ZIP (every entry stored, not deflated) holding, in this order:

    archive/data.warc.gz      every attempt that got a response (``_archive.warc``: response and
                              request records, the bytes that crossed the connection; a
                              payload already written is a revisit record), then
                              each rendered page's screenshot, DOM and MHTML as ``resource``
                              records: ``urn:fullPage:<url>`` (image/png, the Browsertrix
                              convention for a full-page screenshot), ``urn:dom:<url>``
                              (text/html), ``urn:mhtml:<url>`` (multipart/related) and
                              ``urn:behaviors:<url>`` (application/json: the behaviours'
                              action log)
    indexes/index.cdx.gz      the CDXJ index of that WARC (``_archive.cdxj``), sorted, in
                              gzip members of 1,024 lines (a request that was not a GET
                              keyed in the post-append form, ``__wb_method=post&...``)
    indexes/index.idx         where each member starts and its first key: a replay tool
                              reads it, then only the member a URL falls in
    pages/pages.jsonl         every captured page: each run's current attempt of a URL
                              that got a 2xx HTML response, with its title (the rendered
                              title when the page was rendered, else the document's
                              <title>) and capture time
    datapackage.json          every file above with its SHA-256 and size (a Frictionless
                              data package, ``wacz_version`` 1.1.1)
    datapackage-digest.json   the SHA-256 of datapackage.json, and when a key is given, its
                              signature (WACZ signing and verification 0.1.0), in one of
                              the two forms below

The two signature forms, each in the encoding of the reader that checks it:

- **anonymous** (a key and nothing else): ECDSA P-384 over SHA-256 of the hash text, the
  signature as r||s (IEEE P1363, what Web Crypto verifies), the public key as base64 DER
  SubjectPublicKeyInfo (``publicKey``). ReplayWeb.page checks this form, and only with a
  P-384 key (it imports the key as P-384: a P-256 key shows as "not available"), so any
  other key is refused here rather than written into a signature nobody can check.
  authsign does not check this form at all. Anyone can make a key: what this form proves
  is "whoever holds this key signed it", so a verifier pins the key (``evidence verify
  X.wacz --public-key KEY.pub``).
- **domain** (a key and the certificate chain for it, ``cert_chain``): ``domain`` (the
  leaf certificate's subject), ``domainCert`` (the chain as PEM, leaf first) and the
  signature as DER, base64 (what authsign writes and checks). The key is ECDSA P-256 or
  P-384 and must be the leaf certificate's. ``created`` is then the signing time, not the
  store's (authsign accepts a signature only within the certificate's first days and
  minutes before its timestamp), so two domain-signed exports differ. The RFC 3161
  timestamp of the signature (``timeSignature``, ``timestampCert``), which authsign
  requires, comes from a ``Timestamper`` (``WaczSigner.timestamper``): the seam where a
  TSA client plugs in; without one the form has no timestamp and authsign refuses it.

Two anonymous or unsigned exports of the same store are the same bytes: records and pages
in store order, every time taken from the store (``created`` is the time of the store's
last commit), ZIP entry times from it too, gzip members without names or times, and the
signature deterministic (RFC 6979). A payload that does not match its digest stops the
export (nothing is left). ``_archive.waczcheck`` verifies a WACZ, ours or anyone's.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import itertools
import json
import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID
from selectolax.lexbor import LexborHTMLParser

from .._errors import EvidenceError, ProofError
from .._model.http1 import parse_head
from .._model.refs import ArtifactRef
from .._model.text import decode_document, is_html
from .._store.db import Store
from .._store.fsync import fsync_dir, fsync_file
from . import warc as _warc
from .carried import Carried, reached_by
from .cdxj import compressed_index, index_line, method_query

__all__ = ["TimeSignature", "Timestamper", "WaczExport", "WaczSigner", "chain_problem",
           "export_wacz", "load_certificate_chain", "load_signing_key", "new_signing_key",
           "subject_name", "tsa_timestamper"]

WACZ_VERSION = "1.1.1"
WARC_NAME = "data.warc.gz"
INDEX_NAME = "indexes/index.cdx.gz"
INDEX_IDX_NAME = "indexes/index.idx"
_MAX_TITLE = 1000

_RENDERS = """
SELECT r.render_id, r.url, r.started_at, r.log_index, f.attempt_id,
       d.namespace, d.digest, d.size, s.namespace, s.digest, s.size,
       m.namespace, m.digest, m.size, b.namespace, b.digest, b.size
FROM render r JOIN fetch_attempt f ON f.attempt_seq = r.source_attempt_seq
LEFT JOIN artifact d ON d.artifact_id = r.dom_id
LEFT JOIN artifact s ON s.artifact_id = r.screenshot_id
LEFT JOIN artifact m ON m.artifact_id = r.mhtml_id
LEFT JOIN artifact b ON b.artifact_id = r.behaviors_id
WHERE r.outcome = 'rendered' ORDER BY r.render_seq
"""
_PAGES = """
SELECT f.attempt_id, f.url, f.started_at, f.content_type, a.namespace, a.digest, a.size,
       (SELECT r.title FROM render r WHERE r.source_attempt_seq = f.attempt_seq
        AND r.outcome = 'rendered' ORDER BY r.render_seq DESC LIMIT 1)
FROM url_current c JOIN fetch_attempt f ON f.attempt_seq = c.attempt_seq
LEFT JOIN artifact a ON a.artifact_id = coalesce(f.content_id, f.body_id)
WHERE f.http_status BETWEEN 200 AND 299
ORDER BY f.attempt_seq
"""


class WaczExport(msgspec.Struct, kw_only=True):
    path: str
    records: int  # WARC records
    indexed: int  # CDXJ lines
    revisits: int  # responses written as revisit records (their payload written before)
    pages: int
    renders: int
    signed: bool
    public_key: str | None  # base64 DER SubjectPublicKeyInfo of the signing key
    form: str | None = None  # "anonymous", "domain", or None (unsigned)
    domain: str | None = None  # the domain form's signer
    bytes: int
    sha256: str


def new_signing_key(path: str | os.PathLike[str]) -> ec.EllipticCurvePrivateKey:
    """Make an ECDSA P-384 key: PATH (PKCS#8 PEM, mode 0600) and PATH.pub (PEM). Never
    overwrites a file."""
    key = ec.generate_private_key(ec.SECP384R1())
    target = Path(path)
    public = target.with_name(target.name + ".pub")
    for file in (target, public):
        if file.exists():
            raise ProofError(f"{file} already exists; a key file is never overwritten",
                             hint="choose another name, or sign with --key", path=str(file))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return key


def load_signing_key(path: str | os.PathLike[str], *,
                     domain: bool = False) -> ec.EllipticCurvePrivateKey:
    """An ECDSA private key from a PEM file: P-384 for the anonymous form (the one curve
    ReplayWeb.page checks it with), P-256 or P-384 with a certificate (``domain``)."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as exc:
        raise ProofError(f"cannot read key {path}: {exc.strerror}", path=str(path),
                         hint="give the PEM file written by --new-key") from None
    except (ValueError, TypeError) as exc:
        raise ProofError(f"{path} is not an unencrypted PEM private key ({exc})",
                         path=str(path), hint="give the PEM file written by --new-key") from None
    curves = ("secp256r1", "secp384r1") if domain else ("secp384r1",)
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in curves:
        return key
    what = (f"an ECDSA {_CURVE_NAMES.get(key.curve.name, key.curve.name)} key"
            if isinstance(key, ec.EllipticCurvePrivateKey) else f"a {_key_kind(key)} key")
    if domain:
        raise ProofError(f"{path} is {what}: a domain signature is ECDSA P-256 or P-384 "
                         "(authsign and ReplayWeb.page check no other)", path=str(path),
                         hint="get the certificate for an ECDSA P-256 or P-384 key")
    raise ProofError(f"{path} is {what}: an anonymous WACZ signature is checked by "
                     "ReplayWeb.page with ECDSA P-384 only (a P-256 signature shows there as "
                     "'not available'), so no other key signs one", path=str(path),
                     hint="make a P-384 key: evidence export STORE --format wacz --new-key "
                     "FILE (or sign with a certificate: --cert CHAIN.pem)")


_CURVE_NAMES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}


def _key_kind(key: object) -> str:
    name = type(key).__name__.removeprefix("_")
    for kind in ("RSA", "Ed25519", "Ed448", "DSA", "DH", "X25519", "X448"):
        if name.startswith(kind):
            return kind
    return name


class TimeSignature(msgspec.Struct, frozen=True, kw_only=True):
    """An RFC 3161 timestamp of the signature text: the TimeStampResp, DER in base64
    (authsign's ``timeSignature``), and the TSA's certificate chain as PEM, leaf first."""

    time_signature: str
    timestamp_cert: str


# What a TSA client provides (``--tsa``): a timestamp over the signature's base64 text.
Timestamper = Callable[[str], TimeSignature]


def tsa_timestamper(url: str, tsa_cert: Sequence[x509.Certificate] = ()) -> Timestamper:
    """The domain form's timestamper (``export --format wacz --tsa URL``): an RFC 3161
    token from the TSA at ``url`` over the signature's base64 text, as authsign stamps it
    (SHA-256 of its ASCII bytes), checked as ``checkpoint --tsa`` checks one
    (``_audit.timestamp.request_timestamp``). ``timestampCert`` is ``tsa_cert`` (the TSA's
    certificate, then its chain up to its root: authsign requires the chain to end at a
    root it trusts), else the certificates the token embeds."""
    from .._audit.timestamp import request_timestamp

    def stamp(signature: str) -> TimeSignature:
        token = request_timestamp(signature.encode("ascii"), url, tsa_cert=list(tsa_cert))
        chain = list(tsa_cert) or _embedded(token.der)
        return TimeSignature(
            time_signature=base64.b64encode(token.der).decode(),
            timestamp_cert="".join(c.public_bytes(serialization.Encoding.PEM).decode()
                                   for c in chain))

    return stamp


def _embedded(der: bytes) -> list[x509.Certificate]:
    from rfc3161_client import decode_timestamp_response

    return [x509.load_der_x509_certificate(c)
            for c in decode_timestamp_response(der).signed_data.certificates]


@dataclass(frozen=True)
class WaczSigner:
    """How a WACZ is signed: a key alone (anonymous form), or with the certificate chain
    for it (domain form, leaf first) and optionally a timestamper. ``signing_time`` (UTC)
    is the domain form's ``created``; None: now."""

    key: ec.EllipticCurvePrivateKey
    cert_chain: tuple[x509.Certificate, ...] = ()
    timestamper: Timestamper | None = None
    signing_time: dt.datetime | None = None

    def __post_init__(self) -> None:
        if not self.cert_chain:
            if self.key.curve.name != "secp384r1":
                raise ProofError("an anonymous WACZ signature needs an ECDSA P-384 key "
                                 "(ReplayWeb.page checks no other)",
                                 hint="make one with --new-key, or give --cert")
            if self.timestamper is not None:
                raise ProofError("a timestamp goes with a domain signature (a certificate)",
                                 hint="give --cert with the timestamp, or leave it out")
            return
        leaf = self.cert_chain[0]
        ours = self.key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        theirs = leaf.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        if ours != theirs:
            raise ProofError("the key is not the certificate's: the first certificate of "
                             "the chain must be for the signing key",
                             hint="give the key the certificate was issued for, and the "
                             "chain leaf first")
        if not subject_name(leaf):
            raise ProofError("the certificate names no domain (no common name or DNS name)",
                             hint="use the certificate issued for the domain that signs")

    @property
    def form(self) -> str:
        return "domain" if self.cert_chain else "anonymous"


def load_certificate_chain(path: str | os.PathLike[str]) -> tuple[x509.Certificate, ...]:
    """Certificates from a PEM file, leaf first; each must be signed by the next one."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ProofError(f"cannot read certificates {path}: {exc.strerror}", path=str(path),
                         hint="give the PEM file of the certificate chain, leaf first") from None
    try:
        chain = tuple(x509.load_pem_x509_certificates(data))
    except ValueError as exc:
        raise ProofError(f"{path} is not a PEM certificate chain ({exc})", path=str(path),
                         hint="give the PEM file of the certificate chain, leaf first"
                         ) from None
    problem = chain_problem(chain)
    if problem:
        raise ProofError(f"{path}: {problem}", path=str(path),
                         hint="give the chain leaf first, each certificate followed by its "
                         "issuer's")
    return chain


def subject_name(cert: x509.Certificate) -> str:
    """The domain a certificate is for: its common name, else its first DNS name (as
    authsign reads it)."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if names:
        return str(names[0].value)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return ""
    dns = san.value.get_values_for_type(x509.DNSName)
    return dns[0] if dns else ""


def chain_problem(chain: Sequence[x509.Certificate]) -> str | None:
    """Why ``chain`` (leaf first) is not a chain: empty, or a certificate its successor
    did not sign. None if it is one (whether its root is trusted is the reader's call)."""
    if not chain:
        return "no certificate"
    for cert, issuer in itertools.pairwise(chain):
        try:
            cert.verify_directly_issued_by(issuer)
        except (ValueError, TypeError, InvalidSignature) as exc:
            return (f"certificate {cert.subject.rfc4514_string()!r} is not signed by the "
                    f"next one, {issuer.subject.rfc4514_string()!r} ({exc or 'bad signature'})")
    return None


def export_wacz(store: Store, out_path: str | os.PathLike[str], *,
                key: ec.EllipticCurvePrivateKey | WaczSigner | None = None,
                checkpoint: Carried | None = None) -> WaczExport:
    """Write the store as a new WACZ file at ``out_path`` (see the module docstring).

    Unsigned when ``key`` is None (datapackage-digest.json then holds the hash only); a bare
    key signs in the anonymous form, a ``WaczSigner`` with a certificate chain in the domain
    form. An existing file is never overwritten; the file appears complete or not at all.
    ``checkpoint``: a signed checkpoint (and its timestamp) of the store, which its log must
    hold, carried as ``evidence/checkpoint`` (and ``.tsr``), package resources like the
    others, so their hashes are signed (``_archive.carried``).
    """
    signer = WaczSigner(key) if isinstance(key, ec.EllipticCurvePrivateKey) else key
    out = Path(out_path)
    if out.exists():
        raise EvidenceError(f"{out} already exists; an export never overwrites a file",
                            hint="remove it or choose another name", path=str(out))
    carried = {} if checkpoint is None else reached_by(store, checkpoint)
    warc_tmp = out.with_name(f".{out.name}.{os.getpid()}.warc.tmp")
    zip_tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        # One snapshot, held as the WARC export holds it (``Store.snapshot``: on PostgreSQL
        # a REPEATABLE READ transaction, where a plain BEGIN would read each statement's
        # own): the WARC, the index and the pages agree.
        with store.snapshot() as conn:
            created, store_id, records, lines, renders, revisits = _write_warc(
                store, conn, warc_tmp)
            pages = _pages(store, conn)
        lines.sort()
        if signer is not None and signer.cert_chain:  # authsign: created = signing time
            created = _signing_time(signer)
        index, index_idx = compressed_index(lines, Path(INDEX_NAME).name)
        page_list = _page_list(pages)
        stamp = _zip_time(created)
        resources = [("archive/" + WARC_NAME, _file_digest(warc_tmp)),
                     (INDEX_NAME, _digest(index)),
                     (INDEX_IDX_NAME, _digest(index_idx)),
                     ("pages/pages.jsonl", _digest(page_list)),
                     *((name, _digest(data)) for name, data in carried.items())]
        package = {
            "profile": "data-package",
            "resources": [{"name": Path(path).name, "path": path, "hash": f"sha256:{sha}",
                           "bytes": size} for path, (sha, size) in resources],
            "wacz_version": WACZ_VERSION,
            "title": f"evidence store {store_id}",
            "software": f"evidence {_warc.software_version()}",
            "created": created,
        }
        package_bytes = json.dumps(package, indent=2).encode("utf-8")
        digest_doc, public_key = _digest_document(package_bytes, created, signer)
        with open(zip_tmp, "xb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as zf:
            _add_file(zf, "archive/" + WARC_NAME, warc_tmp, stamp)
            _add(zf, INDEX_NAME, index, stamp)
            _add(zf, INDEX_IDX_NAME, index_idx, stamp)
            # Deflated: ReplayWeb.page reads the page list whole before the first page
            # (every other entry is stored: the WARC and the index are read by range).
            _add(zf, "pages/pages.jsonl", page_list, stamp, deflate=True)
            for name, data in carried.items():
                _add(zf, name, data, stamp)
            _add(zf, "datapackage.json", package_bytes, stamp)
            _add(zf, "datapackage-digest.json", digest_doc, stamp)
        fsync_file(zip_tmp)
        os.rename(zip_tmp, out)
    except BaseException:
        for tmp in (zip_tmp,):
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(warc_tmp)
    fsync_dir(out.parent)
    sha, size = _file_digest(out)
    return WaczExport(path=str(out), records=records, indexed=len(lines), pages=len(pages),
                      renders=renders, revisits=revisits, signed=signer is not None,
                      public_key=public_key, form=None if signer is None else signer.form,
                      domain=subject_name(signer.cert_chain[0]) if signer and signer.cert_chain
                      else None, bytes=size, sha256=sha)


def _write_warc(store: Store, conn,
                path: Path) -> tuple[str, str, int, list[str], int, int]:
    """The WARC (one gzip member per record), and a CDXJ line per indexed record: a
    response or revisit keyed by its URL, with the method and body appended when its
    request was not a GET or HEAD (``cdxj.method_query``), and each resource record."""
    store_id = _warc.first_value(conn, "SELECT value FROM store_meta WHERE key = 'store_id'", ())
    last_seq = _warc.first_value(
        conn, "SELECT coalesce(max(attempt_seq), 0) FROM fetch_attempt", ())
    head = conn.execute("SELECT committed_at, tree_size FROM commit_log "
                        "ORDER BY batch_seq DESC LIMIT 1").fetchall()
    created, tree_size = head[0] if head else ("1980-01-01T00:00:00.000000Z", 0)
    lines: list[str] = []
    records = renders = 0
    with open(path, "xb") as raw:
        sink = _warc.HashingWriter(raw, hashlib.sha256())

        def write(record: _warc.WarcRecord, index: bool, url: str, date: str,
                  mime: str | None, status: int | None, request: bytes = b"") -> None:
            nonlocal records
            offset = raw.tell()
            record_hash = hashlib.sha256()
            _warc.write_record(_warc.HashingWriter(sink, record_hash), True, record)
            records += 1
            if index:
                lines.append(index_line(url=url, date=date, mime=mime, status=status,
                                        digest=record.payload, length=raw.tell() - offset,
                                        offset=offset, filename=WARC_NAME,
                                        record_digest=f"sha256:{record_hash.hexdigest()}",
                                        method=method_query(request)))

        info_id = _warc.record_uri(store_id, "*", str(tree_size), "warcinfo")
        write(_warc.warcinfo_record(store_id, None, info_id, created), False, "", "", None, None)
        revisits = _warc.Revisits()
        resolutions: set[str] = set()
        for row in _warc.attempt_pages(store, conn, last_seq, None):
            made = _warc.attempt_records(store, store_id, row, revisits)
            response, request = made
            before, after = _warc.connection_records(store, conn, store_id, row, made,
                                                     resolutions)
            for record in before:  # the DNS answer (metadata records are not indexed)
                write(record, False, "", "", None, None)
            status, mime = _status_and_mime(response.head)
            if response.refers_to is not None:
                mime = "warc/revisit"  # what the indexers write, and replay tools look for
            write(response, True, _warc.header_value(row[3]), row[5], mime, status,
                  request.head)
            write(request, False, "", "", None, None)
            revisits.written(row, response)
            for record in after:  # the connection and TLS facts
                write(record, False, "", "", None, None)
        for row in conn.execute(_RENDERS).fetchall():
            renders += 1
            for record, url, mime in _render_records(store, store_id, row):
                write(record, True, url, row[2], mime, None)
        raw.flush()
        os.fsync(raw.fileno())
    return created, store_id, records, lines, renders, revisits.count


def _render_records(store: Store, store_id: str,
                    row: tuple) -> list[tuple[_warc.WarcRecord, str, str]]:
    (render_id, url, started_at, log_index, source_id, *refs) = row
    made = []
    for prefix, mime, (ns, digest, size) in (
            ("urn:fullPage:", "image/png", refs[3:6]),
            ("urn:dom:", "text/html; charset=utf-8", refs[0:3]),
            ("urn:mhtml:", "multipart/related", refs[6:9]),
            ("urn:behaviors:", "application/json", refs[9:12])):
        if ns is None:
            continue
        target = prefix + url
        fields = [("WARC-Type", "resource"),
                  ("WARC-Record-ID", _warc.record_uri(store_id, render_id, prefix)),
                  ("WARC-Date", started_at), ("WARC-Target-URI", _warc.header_value(target)),
                  ("Content-Type", mime),
                  ("Evidence-Render-ID", _warc.header_value(render_id)),
                  ("Evidence-Source-Attempt-ID", _warc.header_value(source_id)),
                  ("Evidence-Log-Index", str(log_index)),
                  ("Evidence-Body-BLAKE3", digest)]
        body = _warc.BodyStream(store, ArtifactRef(ns, digest, size))
        made.append((_warc.WarcRecord(fields, b"", body, payload_digest=True),
                     _warc.header_value(target), mime.split(";")[0]))
    return made


def _status_and_mime(block_head: bytes) -> tuple[int | None, str | None]:
    """Status and media type of the first HTTP head in a record (as WARC readers see it)."""
    end = block_head.find(b"\n\r\n")
    first = block_head if end < 0 else block_head[:end + 3]
    status, fields = parse_head(first)
    kind = next((v for n, v in fields if n.lower() == b"content-type"), None)
    mime = None
    if kind is not None:
        text = kind.decode("latin-1")
        mime = text.replace(";", " ").split(maxsplit=1)[0].strip() if text.strip() else None
    return status, mime


def _pages(store: Store, conn) -> list[dict[str, str]]:
    pages = []
    for attempt_id, url, started_at, content_type, ns, digest, size, rendered in conn.execute(
            _PAGES).fetchall():
        if not is_html(content_type):
            continue
        title = rendered
        if title is None and ns is not None:
            title = _title(store.artifacts.read(ArtifactRef(ns, digest, size), verify=True),
                           content_type)
        page = {"id": attempt_id, "url": url, "ts": started_at}
        if title:
            page["title"] = " ".join(title.split())[:_MAX_TITLE]
        pages.append(page)
    return pages


def _title(content: bytes, content_type: str | None) -> str | None:
    text, _ = decode_document(content, content_type)
    node = LexborHTMLParser(text).css_first("title")
    return node.text() if node is not None else None


def _page_list(pages: list[dict[str, str]]) -> bytes:
    header = {"format": "json-pages-1.0", "id": "pages", "title": "All Pages"}
    return "".join(json.dumps(line) + "\n" for line in [header, *pages]).encode("utf-8")


def _digest_document(package: bytes, created: str,
                     signer: WaczSigner | None) -> tuple[bytes, str | None]:
    digest = f"sha256:{hashlib.sha256(package).hexdigest()}"
    document: dict[str, object] = {"path": "datapackage.json", "hash": digest}
    if signer is None:
        return json.dumps(document, indent=2).encode("utf-8"), None
    key = signer.key
    der = key.sign(digest.encode("utf-8"), ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
    public = base64.b64encode(key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
    signed: dict[str, object] = {"hash": digest, "created": created,
                                 "software": f"evidence {_warc.software_version()}"}
    if signer.cert_chain:  # domain form: DER, as authsign signs and checks it
        signature = base64.b64encode(der).decode()
        signed |= {"signature": signature, "domain": subject_name(signer.cert_chain[0]),
                   "domainCert": "".join(c.public_bytes(serialization.Encoding.PEM).decode()
                                         for c in signer.cert_chain)}
        if signer.timestamper is not None:
            stamp = signer.timestamper(signature)
            signed |= {"timeSignature": stamp.time_signature,
                       "timestampCert": stamp.timestamp_cert}
    else:  # anonymous form: r||s, as Web Crypto (ReplayWeb.page) verifies it
        r, s = decode_dss_signature(der)
        width = (key.curve.key_size + 7) // 8
        signed |= {"signature": base64.b64encode(r.to_bytes(width, "big")
                                                 + s.to_bytes(width, "big")).decode(),
                   "publicKey": public}
    document["signedData"] = signed
    return json.dumps(document, indent=2).encode("utf-8"), public


def _signing_time(signer: WaczSigner) -> str:
    """The domain form's ``created``: whole seconds, UTC, as authsign writes it (an RFC 3161
    time is rounded down to the second, and created must not be after it)."""
    moment = signer.signing_time or dt.datetime.now(dt.UTC)
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _digest(data: bytes) -> tuple[str, int]:
    return hashlib.sha256(data).hexdigest(), len(data)


def _file_digest(path: Path) -> tuple[str, int]:
    hasher, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            hasher.update(chunk)
            size += len(chunk)
    return hasher.hexdigest(), size


def _zip_time(created: str) -> tuple[int, int, int, int, int, int]:
    moment = dt.datetime.strptime(created[:19], "%Y-%m-%dT%H:%M:%S")
    return max(moment, dt.datetime(1980, 1, 1)).timetuple()[:6]


def _info(name: str, stamp: tuple[int, int, int, int, int, int], *,
          deflate: bool = False) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=stamp)
    info.compress_type = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    info.create_system = 3  # unix, on every platform: the same bytes everywhere
    info.external_attr = 0o644 << 16
    return info


def _add(zf: zipfile.ZipFile, name: str, data: bytes,
         stamp: tuple[int, int, int, int, int, int], *, deflate: bool = False) -> None:
    # A fixed level: the same bytes in, the same deflated bytes out (zlib), so two exports
    # of the same evidence are still the same file.
    zf.writestr(_info(name, stamp, deflate=deflate), data, compresslevel=6 if deflate else None)


def _add_file(zf: zipfile.ZipFile, name: str, path: Path,
              stamp: tuple[int, int, int, int, int, int]) -> None:
    info = _info(name, stamp)
    info.file_size = path.stat().st_size
    with open(path, "rb") as src, zf.open(info, "w",
                                          force_zip64=info.file_size > (1 << 31)) as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
