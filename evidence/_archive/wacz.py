"""WACZ 1.1.1 export: a store as one file that ReplayWeb.page, pywb and Browsertrix open.

    export_wacz(store, "site.wacz", key="wacz.key")

A WACZ is a ZIP (every entry stored, not deflated) holding, in this order:

    archive/data.warc.gz      every attempt that got a response (``_archive.warc``: response and
                              request records, the bytes that crossed the connection), then
                              each rendered page's screenshot, DOM and MHTML as ``resource``
                              records: ``urn:fullPage:<url>`` (image/png, the Browsertrix
                              convention for a full-page screenshot), ``urn:dom:<url>``
                              (text/html), ``urn:mhtml:<url>`` (multipart/related) and
                              ``urn:behaviors:<url>`` (application/json: the behaviours'
                              action log)
    indexes/index.cdx         the CDXJ index of that WARC (``_archive.cdxj``), sorted
    pages/pages.jsonl         every captured page: each run's current attempt of a URL
                              that got a 2xx HTML response, with its title (the rendered
                              title when the page was rendered, else the document's
                              <title>) and capture time
    datapackage.json          every file above with its SHA-256 and size (a Frictionless
                              data package, ``wacz_version`` 1.1.1)
    datapackage-digest.json   the SHA-256 of datapackage.json, signed (WACZ signing and
                              verification 0.1.0, "anonymous" signature): ECDSA P-384 over
                              SHA-256 of the hash text, the signature as r||s (what Web
                              Crypto produces and verifies), the public key as DER
                              SubjectPublicKeyInfo, both base64

Two exports of the same store are the same bytes: records and pages in store order, every
time taken from the store (``created`` is the time of the store's last commit), ZIP entry
times from it too, gzip members without names or times, and the signature deterministic
(RFC 6979). A payload that does not match its digest stops the export (nothing is left).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import json
import os
import zipfile
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from selectolax.lexbor import LexborHTMLParser

from .._errors import EvidenceError, ProofError
from .._model.http1 import parse_head
from .._model.refs import ArtifactRef
from .._model.text import decode_document, is_html
from .._store.db import Store
from .._store.fsync import fsync_dir, fsync_file
from . import warc as _warc
from .cdxj import index_line

__all__ = ["WaczExport", "export_wacz", "load_signing_key", "new_signing_key"]

WACZ_VERSION = "1.1.1"
WARC_NAME = "data.warc.gz"
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
    pages: int
    renders: int
    signed: bool
    public_key: str | None  # base64 DER SubjectPublicKeyInfo of the signing key
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


def load_signing_key(path: str | os.PathLike[str]) -> ec.EllipticCurvePrivateKey:
    """An ECDSA P-256 or P-384 private key from a PEM file (the curves WACZ signers use)."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as exc:
        raise ProofError(f"cannot read key {path}: {exc.strerror}", path=str(path),
                         hint="give the PEM file written by --new-key") from None
    except (ValueError, TypeError) as exc:
        raise ProofError(f"{path} is not an unencrypted PEM private key ({exc})",
                         path=str(path), hint="give the PEM file written by --new-key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in (
            "secp256r1", "secp384r1"):
        raise ProofError(f"{path} is not an ECDSA P-256 or P-384 key: WACZ signatures are "
                         "ECDSA", path=str(path),
                         hint="make one with: evidence export STORE --format wacz --new-key "
                         "FILE")
    return key


def export_wacz(store: Store, out_path: str | os.PathLike[str], *,
                key: ec.EllipticCurvePrivateKey | None = None) -> WaczExport:
    """Write the store as a new WACZ file at ``out_path`` (see the module docstring).

    Unsigned when ``key`` is None (datapackage-digest.json then holds the hash only). An
    existing file is never overwritten; the file appears complete or not at all.
    """
    out = Path(out_path)
    if out.exists():
        raise EvidenceError(f"{out} already exists; an export never overwrites a file",
                            hint="remove it or choose another name", path=str(out))
    warc_tmp = out.with_name(f".{out.name}.{os.getpid()}.warc.tmp")
    zip_tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with store.reader() as conn, store.errors():
            conn.execute("BEGIN")  # one snapshot: the WARC, the index and the pages agree
            try:
                created, store_id, records, lines, renders = _write_warc(store, conn, warc_tmp)
                pages = _pages(store, conn)
            finally:
                conn.execute("COMMIT")
        lines.sort()
        index = "".join(line + "\n" for line in lines).encode("utf-8")
        page_list = _page_list(pages)
        stamp = _zip_time(created)
        resources = [("archive/" + WARC_NAME, _file_digest(warc_tmp)),
                     ("indexes/index.cdx", _digest(index)),
                     ("pages/pages.jsonl", _digest(page_list))]
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
        digest_doc, public_key = _digest_document(package_bytes, created, key)
        with open(zip_tmp, "xb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as zf:
            _add_file(zf, "archive/" + WARC_NAME, warc_tmp, stamp)
            _add(zf, "indexes/index.cdx", index, stamp)
            _add(zf, "pages/pages.jsonl", page_list, stamp)
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
                      renders=renders, signed=key is not None, public_key=public_key,
                      bytes=size, sha256=sha)


def _write_warc(store: Store, conn, path: Path) -> tuple[str, str, int, list[str], int]:
    """The WARC (one gzip member per record), and a CDXJ line per indexed record."""
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
                  mime: str | None, status: int | None) -> None:
            nonlocal records
            offset = raw.tell()
            _warc.write_record(sink, True, record)
            records += 1
            if index:
                lines.append(index_line(url=url, date=date, mime=mime, status=status,
                                        digest=record.payload, length=raw.tell() - offset,
                                        offset=offset, filename=WARC_NAME))

        info_id = _warc.record_uri(store_id, "*", str(tree_size), "warcinfo")
        write(_warc.warcinfo_record(store_id, None, info_id, created), False, "", "", None, None)
        for row in _warc.attempt_pages(store, conn, last_seq, None):
            response, request = _warc.attempt_records(store, store_id, row)
            status, mime = _status_and_mime(response.head)
            write(response, True, _warc.header_value(row[3]), row[5], mime, status)
            write(request, False, "", "", None, None)
        for row in conn.execute(_RENDERS).fetchall():
            renders += 1
            for record, url, mime in _render_records(store, store_id, row):
                write(record, True, url, row[2], mime, None)
        raw.flush()
        os.fsync(raw.fileno())
    return created, store_id, records, lines, renders


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
                     key: ec.EllipticCurvePrivateKey | None) -> tuple[bytes, str | None]:
    digest = f"sha256:{hashlib.sha256(package).hexdigest()}"
    document: dict[str, object] = {"path": "datapackage.json", "hash": digest}
    public = None
    if key is not None:
        der = key.sign(digest.encode("utf-8"),
                       ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
        r, s = decode_dss_signature(der)
        width = (key.curve.key_size + 7) // 8
        raw = r.to_bytes(width, "big") + s.to_bytes(width, "big")
        public = base64.b64encode(key.public_key().public_bytes(
            serialization.Encoding.DER,
            serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
        document["signedData"] = {"hash": digest, "created": created,
                                  "software": f"evidence {_warc.software_version()}",
                                  "signature": base64.b64encode(raw).decode(),
                                  "publicKey": public}
    return json.dumps(document, indent=2).encode("utf-8"), public


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


def _info(name: str, stamp: tuple[int, int, int, int, int, int]) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=stamp)
    info.compress_type = zipfile.ZIP_STORED
    info.create_system = 3  # unix, on every platform: the same bytes everywhere
    info.external_attr = 0o644 << 16
    return info


def _add(zf: zipfile.ZipFile, name: str, data: bytes,
         stamp: tuple[int, int, int, int, int, int]) -> None:
    zf.writestr(_info(name, stamp), data)


def _add_file(zf: zipfile.ZipFile, name: str, path: Path,
              stamp: tuple[int, int, int, int, int, int]) -> None:
    info = _info(name, stamp)
    info.file_size = path.stat().st_size
    with open(path, "rb") as src, zf.open(info, "w",
                                          force_zip64=info.file_size > (1 << 31)) as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
