"""Checking a WACZ, ours or anyone's: is every byte still the one that was signed?

    check = check_wacz("site.wacz", public_key=load_public_key("wacz.key.pub"))
    check.ok, check.problems, check.notes

A WACZ proves itself in a chain, and each link is checked here, from the outside in:

1. **the zip**: it opens, no two entries share a name, every entry reads back with its
   CRC-32, and every entry but the two package files is listed in ``datapackage.json``
   (a file that is not listed is covered by no hash and no signature);
2. **the package**: each listed resource has the SHA-256 and size the package states, and
   ``datapackage-digest.json`` holds the SHA-256 of ``datapackage.json``;
3. **the signature** over that hash (WACZ signing and verification 0.1.0): the anonymous
   form with its ``publicKey``, or the domain form with its ``domainCert`` chain (each
   certificate signed by the next, the domain the leaf's subject). The signature is ECDSA
   over SHA-256 of the hash text, r||s or DER (both occur: Web Crypto writes the one,
   authsign the other; the mathematics is the same). ``signedData.created`` must be the
   package's ``created`` (as py-wacz checks);
4. **the pinned key**: a signature proves only that whoever holds its key signed. The key
   travels inside the file, so an attacker who rewrites the WARC re-signs with a key of
   their own and steps 1-3 pass. ``public_key`` (the key the examiner got from the
   operator, or the root of the domain chain) is compared with the signing key (or any
   certificate of the chain); without it the check says so in a note, and ``ok`` means
   only "internally consistent";
5. **the records**: every WARC record in ``archive/`` parses, and its
   ``WARC-Block-Digest`` and ``WARC-Payload-Digest`` (SHA-256 or SHA-1, base32 or hex)
   match its bytes. A gzipped WARC is read member by member, so each record's offset and
   length in the compressed file are known;
6. **the index**: every CDXJ line of ``indexes/`` (plain, or gzip members: ``.cdx.gz``)
   points at a record that starts at its ``offset`` with its ``length`` in its
   ``filename``, has its ``url`` as WARC-Target-URI, its ``digest`` as payload digest, its
   time, and the SURT key of its URL; a ZipNum ``.idx`` line points at a gzip member of its
   ``.cdx.gz``. A replay tool trusts the index to find a URL's bytes: an index line moved
   to another record replays other bytes under that URL.

Steps 5 and 6 matter even though the package hashes cover the files: a WACZ whose WARC
was altered and whose hashes were recomputed fails at step 4 (if pinned) but passes 1-3;
the per-record digests then still say *which* record changed, unless the attacker
recomputed them too. ``check_wacz`` never raises on bad input: everything wrong is a
problem in the result. The timestamp of the domain form (``timeSignature``) is reported
here; it is checked against the TSA roots the examiner names by
``_archive.proofcheck.check_wacz_timestamp``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Protocol

import msgspec
from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from .._errors import ProofError
from .cdxj import surt_key, timestamp14
from .wacz import chain_problem, subject_name

__all__ = ["WaczCheck", "check_wacz", "load_public_key"]

_PACKAGE = "datapackage.json"
_DIGEST = "datapackage-digest.json"
_MAX_LISTED = 20  # problems of one kind listed before "... N more"
_MAX_RECORD = 1 << 31  # bytes one record may decompress to (a bomb is a problem, not a crash)
_CHUNK = 1 << 20
_INDEXED_TYPES = {"response", "revisit", "resource", "metadata"}
_DIGEST_ALGORITHMS = {"sha1": hashlib.sha1, "sha256": hashlib.sha256,
                      "sha512": hashlib.sha512}


class WaczCheck(msgspec.Struct, kw_only=True):
    """The verdict of ``check_wacz``. ``ok``: no problem (with ``pinned`` False it means
    "consistent", not "from whom you think": see ``notes``)."""

    path: str
    ok: bool = False
    form: str | None = None  # "anonymous", "domain", or None: not signed
    signature: bool = False  # the signature verifies with the key the file names
    key: str | None = None  # base64 DER SubjectPublicKeyInfo of the signing key
    key_sha256: str | None = None  # its SHA-256, hex: what a person compares
    pinned: bool = False  # the signing key (or a certificate of the chain) is the one given
    domain: str | None = None
    created: str | None = None
    timestamp: str | None = None  # "present": checked apart, against the examiner's roots
    files: int = 0  # package resources checked
    records: int = 0  # WARC records whose digests were checked
    indexed: int = 0  # index lines checked against their records
    problems: list[str] = []
    notes: list[str] = []


def load_public_key(path: str | os.PathLike[str]) -> bytes:
    """The key an examiner pins, as DER SubjectPublicKeyInfo, from a file holding a PEM
    public key (``KEY.pub`` from ``--new-key``), a PEM certificate (the first one's key:
    the signer's, or a root of its chain), or one line of base64 DER (as ``export --json``
    prints ``public_key``)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ProofError(f"cannot read public key {path}: {exc.strerror}", path=str(path),
                         hint="give the KEY.pub file the WACZ was signed with") from None
    try:
        if b"-----BEGIN CERTIFICATE-----" in data:
            return _spki(x509.load_pem_x509_certificates(data)[0].public_key())
        if b"-----BEGIN" in data:
            return _spki(serialization.load_pem_public_key(data))
        return _spki(serialization.load_der_public_key(base64.b64decode(data.strip(),
                                                                        validate=True)))
    except (ValueError, binascii.Error, UnsupportedAlgorithm) as exc:
        raise ProofError(f"{path} holds no public key (PEM, certificate or base64 DER): "
                         f"{exc}", path=str(path),
                         hint="give the KEY.pub file written by export --new-key") from None


def check_wacz(path: str | os.PathLike[str], *, public_key: bytes | None = None) -> WaczCheck:
    """Check the WACZ at ``path`` (see the module docstring); ``public_key`` (DER SPKI, from
    ``load_public_key``) pins the signer."""
    result = WaczCheck(path=str(path))
    problems = _Problems(result.problems)
    try:
        with zipfile.ZipFile(path) as zf:
            _check(zf, result, problems, public_key)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as exc:
        problems.add("zip", f"not a readable zip file: {exc}")
    problems.close()
    result.ok = not result.problems
    return result


class _Problems:
    """Problems grouped by kind, the first few of each listed."""

    def __init__(self, out: list[str]) -> None:
        self.out = out
        self.counts: dict[str, int] = {}

    def add(self, kind: str, message: str) -> None:
        n = self.counts[kind] = self.counts.get(kind, 0) + 1
        if n <= _MAX_LISTED:
            self.out.append(message)

    def close(self) -> None:
        for kind, n in self.counts.items():
            if n > _MAX_LISTED:
                self.out.append(f"... {n - _MAX_LISTED} more {kind} problem(s) not listed")


def _check(zf: zipfile.ZipFile, result: WaczCheck, problems: _Problems,
           pinned: bytes | None) -> None:
    names = [info.filename for info in zf.infolist()]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.add("zip", f"{name} is in the zip more than once (readers disagree on which "
                     "one they read)")
    if _PACKAGE not in names:
        problems.add("zip", f"no {_PACKAGE}: not a WACZ")
        return
    digests: dict[str, tuple[str, int] | None] = {}
    for info in zf.infolist():  # every byte read once: the CRC-32 and the SHA-256 together
        try:
            digests[info.filename] = _sha256(zf.open(info))
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
            problems.add("zip", f"{info.filename} does not read back: {exc}")
            digests[info.filename] = None
    package_bytes = zf.read(_PACKAGE)
    package = _json(package_bytes, _PACKAGE, problems)
    if not isinstance(package, dict):
        return
    result.created = package.get("created") if isinstance(package.get("created"),
                                                          str) else None
    listed = _check_resources(package, digests, problems)
    result.files = len(listed)
    for name in names:
        if name not in listed and name not in (_PACKAGE, _DIGEST) and not name.endswith("/"):
            problems.add("package", f"{name} is not listed in {_PACKAGE}: no hash or "
                         "signature covers it")
    package_hash = f"sha256:{hashlib.sha256(package_bytes).hexdigest()}"
    digest_doc = _json(zf.read(_DIGEST), _DIGEST, problems) if _DIGEST in names else None
    _check_signature(digest_doc, package_hash, package, result, problems, pinned)
    records = {}
    for name in listed:
        if digests.get(name) is None:  # missing or unreadable: said above
            continue
        if name.startswith("archive/") and name.endswith((".warc", ".warc.gz")):
            with zf.open(name) as stream:
                records[Path(name).name] = _check_records(name, stream, result, problems)
    for name in listed:
        if name.startswith("indexes/") and digests.get(name) is not None:
            _check_index(zf, name, records, result, problems)


def _sha256(stream: IO[bytes]) -> tuple[str, int]:
    hasher, size = hashlib.sha256(), 0
    with stream:
        while chunk := stream.read(_CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return hasher.hexdigest(), size


def _json(data: bytes, name: str, problems: _Problems) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        problems.add("package", f"{name} is not JSON: {exc}")
        return None


def _check_resources(package: dict, digests: dict[str, tuple[str, int] | None],
                     problems: _Problems) -> list[str]:
    listed: list[str] = []
    resources = package.get("resources")
    if not isinstance(resources, list) or not resources:
        problems.add("package", f"{_PACKAGE} lists no resources")
        return listed
    for resource in resources:
        path = resource.get("path") if isinstance(resource, dict) else None
        if not isinstance(path, str):
            problems.add("package", f"a resource without a path: {resource!r:.200}")
            continue
        listed.append(path)
        if path not in digests:
            problems.add("package", f"{path} is listed in {_PACKAGE} but not in the zip")
            continue
        known = digests[path]
        if known is None:  # unreadable: said above
            continue
        sha, size = known
        if resource.get("hash") != f"sha256:{sha}":
            problems.add("hash", f"{path}: its SHA-256 is {sha}, {_PACKAGE} says "
                         f"{resource.get('hash')}")
        if resource.get("bytes") is not None and resource.get("bytes") != size:
            problems.add("hash", f"{path}: {size} bytes, {_PACKAGE} says "
                         f"{resource.get('bytes')}")
    return listed


# --- the signature -------------------------------------------------------------------

def _check_signature(doc: Any, package_hash: str, package: dict, result: WaczCheck,
                     problems: _Problems, pinned: bytes | None) -> None:
    if doc is None:  # optional in WACZ 1.1.1; without it nothing covers datapackage.json
        result.notes.append(f"no {_DIGEST}: not signed, and nothing states the hash of "
                            f"{_PACKAGE} itself")
        if pinned is not None:
            problems.add("signature", f"not signed (no {_DIGEST}), but a public key was "
                         "given to check it with")
        return
    if not isinstance(doc, dict) or doc.get("hash") != package_hash:
        problems.add("signature", f"{_DIGEST} states another hash of {_PACKAGE} "
                     f"({doc.get('hash') if isinstance(doc, dict) else doc!r:.100}) than "
                     f"its own ({package_hash})")
        return
    signed = doc.get("signedData")
    if not signed:
        result.notes.append("not signed: anyone who can write the file can write its "
                            "hashes too, so this shows only that the file is intact")
        if pinned is not None:
            problems.add("signature", "not signed, but a public key was given to check it "
                         "with")
        return
    if not isinstance(signed, dict):
        problems.add("signature", "signedData is not an object")
        return
    if signed.get("hash") != package_hash:
        problems.add("signature", f"the signature is over another hash "
                     f"({signed.get('hash')!r:.100}) than {_PACKAGE}'s ({package_hash})")
    if signed.get("created") != package.get("created"):
        problems.add("signature", f"signed 'created' {signed.get('created')!r:.60} is not "
                     f"the package's {package.get('created')!r:.60}")
    result.form = "domain" if signed.get("domainCert") and not signed.get(
        "publicKey") else "anonymous"
    try:
        chain = _signer(signed, result)
    except (ValueError, TypeError, binascii.Error, UnsupportedAlgorithm) as exc:
        problems.add("signature", f"the {result.form} signature's key cannot be read: {exc}")
        return
    key = chain[0]
    result.key = base64.b64encode(key).decode()
    result.key_sha256 = hashlib.sha256(key).hexdigest()
    public = serialization.load_der_public_key(key)
    if not isinstance(public, ec.EllipticCurvePublicKey):
        problems.add("signature", "the signing key is not an ECDSA key (WACZ signatures are)")
        return
    if result.form == "anonymous" and public.curve.name != "secp384r1":
        result.notes.append(f"the key is ECDSA {public.curve.name}: ReplayWeb.page checks "
                            "an anonymous signature with P-384 only and shows this one as "
                            "not available")
    result.signature = _verify(public, signed.get("signature"), str(signed.get("hash")))
    if not result.signature:
        problems.add("signature", "the signature does not verify with the key the file "
                     "names: datapackage-digest.json was altered, or signed by another key")
    if "timeSignature" in signed:
        _check_time_signature(signed, result)
    if pinned is not None:
        result.pinned = pinned in chain
        if not result.pinned:
            problems.add("signature", f"signed by key {result.key_sha256[:16]}..., not by the "
                         "key given: whoever signed this is not who you expected")
    elif result.signature:
        result.notes.append(
            f"signed by key SHA-256 {result.key_sha256}" + (f" for {result.domain}"
                                                            if result.domain else "")
            + ": anyone can make a key and re-sign an altered file, so this proves who made "
            "it only once that key is compared with the one the operator published (give "
            "--public-key)")


def _signer(signed: dict, result: WaczCheck) -> list[bytes]:
    """The signing key first, then (domain form) each certificate's key up the chain."""
    if result.form == "anonymous":
        return [_spki(serialization.load_der_public_key(
            base64.b64decode(signed["publicKey"], validate=True)))]
    chain = x509.load_pem_x509_certificates(str(signed["domainCert"]).encode())
    problem = chain_problem(chain)
    if problem:
        raise ValueError(f"domainCert: {problem}")
    result.domain = subject_name(chain[0])
    if signed.get("domain") != result.domain:
        raise ValueError(f"the signature claims domain {signed.get('domain')!r:.80}, the "
                         f"certificate is for {result.domain!r}")
    root = chain[-1]
    result.notes.append(f"the certificate chain ends at {root.subject.rfc4514_string()} "
                        f"(SHA-256 {root.fingerprint(hashes.SHA256()).hex()}): whether you "
                        "trust that root is yours to decide (pin it: --public-key ROOT.pem)")
    return [_spki(cert.public_key()) for cert in chain]


def _verify(key: ec.EllipticCurvePublicKey, signature: Any, text: str) -> bool:
    try:
        raw = base64.b64decode(str(signature), validate=True)
    except (binascii.Error, ValueError):
        return False
    width = (key.curve.key_size + 7) // 8
    candidates = [raw]
    if len(raw) == 2 * width:  # r||s (Web Crypto); DER otherwise (authsign)
        candidates.insert(0, encode_dss_signature(int.from_bytes(raw[:width], "big"),
                                                  int.from_bytes(raw[width:], "big")))
    for der in candidates:
        try:
            key.verify(der, text.encode("utf-8"), ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            continue
        return True
    return False


def _check_time_signature(signed: dict, result: WaczCheck) -> None:
    """The domain form's RFC 3161 timestamp of the signature: checked against the TSA roots
    the examiner names (``--tsa-root``), apart from this check, which has no roots."""
    result.timestamp = "present"
    result.notes.append("the signature carries an RFC 3161 timestamp (timeSignature): it "
                        "is checked only against a TSA root you name (--tsa-root); without "
                        "one, the signing time is the signer's word")


def _spki(key: Any) -> bytes:
    return bytes(key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo))


# --- the records ---------------------------------------------------------------------

class _Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class _Record(msgspec.Struct):
    offset: int
    length: int
    type: str
    uri: str | None
    date: str | None
    payload_digest: str | None


class _Bad(Exception):
    pass


def _check_records(name: str, stream: IO[bytes], result: WaczCheck,
                   problems: _Problems) -> dict[int, _Record]:
    """Each record's digests; the records by offset, for the index."""
    found: dict[int, _Record] = {}
    chunks = _gzip_members(stream) if name.endswith(".gz") else _plain(stream)
    try:
        for offset, length, data in chunks:
            for index, (fields, block) in enumerate(_parse(data)):
                result.records += 1
                where = f"{name} record at offset {offset}"
                record = _Record(offset, length, fields.get("warc-type", ""),
                                 fields.get("warc-target-uri"), fields.get("warc-date"),
                                 fields.get("warc-payload-digest"))
                if index == 0:
                    found[offset] = record
                _check_digests(where, record, fields, block, problems)
    except _Bad as exc:
        problems.add("record", f"{name}: {exc}")
    return found


def _gzip_members(stream: _Readable) -> Iterator[tuple[int, int, bytes]]:
    """(offset, compressed length, decompressed bytes) of each gzip member."""
    offset, pending = 0, b""
    while True:
        if not pending:
            pending = stream.read(_CHUNK)
            if not pending:
                return
        inflater = zlib.decompressobj(wbits=31)
        parts: list[bytes] = []
        size = fed = 0
        data = pending
        fed += len(data)
        while True:
            try:
                out = inflater.decompress(data, _MAX_RECORD + 1 - size)
            except zlib.error as exc:
                raise _Bad(f"gzip member at offset {offset} is corrupt ({exc})") from None
            size += len(out)
            parts.append(out)
            if size > _MAX_RECORD:
                raise _Bad(f"gzip member at offset {offset} decompresses to more than "
                           f"{_MAX_RECORD} bytes")
            if inflater.eof:
                break
            data = inflater.unconsumed_tail
            if not data:
                data = stream.read(_CHUNK)
                if not data:
                    raise _Bad(f"gzip member at offset {offset} is cut short")
                fed += len(data)
        pending = inflater.unused_data
        length = fed - len(pending)
        yield offset, length, b"".join(parts)
        offset += length


def _plain(stream: _Readable) -> Iterator[tuple[int, int, bytes]]:
    """An uncompressed WARC: one piece per record, split by Content-Length."""
    data = stream.read()
    offset = 0
    while offset < len(data):
        end = data.find(b"\r\n\r\n", offset)
        if end < 0:
            raise _Bad(f"no end of the WARC header at offset {offset}")
        fields = _fields(data[offset:end])
        length = end + 4 + _content_length(fields, offset) + 4 - offset
        yield offset, length, data[offset:offset + length]
        offset += length


def _fields(head: bytes) -> dict[str, str]:
    lines = head.decode("utf-8", "replace").split("\r\n")
    if not lines[0].startswith("WARC/"):
        raise _Bad(f"not a WARC record: {lines[0][:40]!r}")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip().lower(), value.strip())
    return fields


def _content_length(fields: dict[str, str], offset: int) -> int:
    try:
        return int(fields["content-length"])
    except (KeyError, ValueError):
        raise _Bad(f"record at offset {offset} has no Content-Length") from None


def _parse(data: bytes) -> Iterator[tuple[dict[str, str], bytes]]:
    position = 0
    while position < len(data):
        end = data.find(b"\r\n\r\n", position)
        if end < 0:
            raise _Bad("a record's header does not end")
        fields = _fields(data[position:end])
        length = _content_length(fields, position)
        block = data[end + 4:end + 4 + length]
        if len(block) < length or data[end + 4 + length:end + 8 + length] != b"\r\n\r\n":
            raise _Bad(f"a {fields.get('warc-type', '')} record is cut short or not "
                       "followed by its two CRLFs")
        yield fields, block
        position = end + 8 + length


def _check_digests(where: str, record: _Record, fields: dict[str, str], block: bytes,
                   problems: _Problems) -> None:
    block_digest = fields.get("warc-block-digest")
    if block_digest is not None and not _digest_matches(block_digest, block):
        problems.add("record", f"{where} ({record.type} {record.uri or ''}): the block does "
                     f"not match its WARC-Block-Digest {block_digest}")
    if record.payload_digest is None or record.type == "revisit":
        return  # a revisit's payload digest names the payload of the record it revisits
    payload = _payload(record.type, fields.get("content-type", ""), block)
    if payload is not None and not _digest_matches(record.payload_digest, payload):
        problems.add("record", f"{where} ({record.type} {record.uri or ''}): the payload "
                     f"does not match its WARC-Payload-Digest {record.payload_digest}")


def _payload(kind: str, content_type: str, block: bytes) -> bytes | None:
    """The payload: after the HTTP head in an application/http block, else the block."""
    if not content_type.lower().startswith("application/http"):
        return block
    position = 0
    while True:  # the head ends at its first empty line (CRLF or bare LF, as readers allow)
        end = block.find(b"\n", position)
        if end < 0:
            return None
        line = block[position:end + 1]
        position = end + 1
        if line in (b"\r\n", b"\n") and position > len(line):
            return block[position:]


def _digest_matches(value: str, data: bytes) -> bool:
    algorithm, _, encoded = value.partition(":")
    hasher = _DIGEST_ALGORITHMS.get(algorithm.lower())
    if hasher is None:
        return False
    digest = hasher(data).digest()
    return encoded.rstrip("=").upper() == base64.b32encode(digest).decode().rstrip("=") or (
        encoded.lower() == digest.hex())


# --- the index -----------------------------------------------------------------------

_LINE = re.compile(r"(\S+) (\d{14}) (\{.*\})")


def _check_index(zf: zipfile.ZipFile, name: str, records: dict[str, dict[int, _Record]],
                 result: WaczCheck, problems: _Problems) -> None:
    data = zf.read(name)
    if name.endswith(".idx"):
        _check_zipnum(zf, name, data, problems)
        return
    if name.endswith(".gz"):
        try:
            data = b"".join(piece for _, _, piece in _gzip_members(_BytesReader(data)))
        except _Bad as exc:
            problems.add("index", f"{name}: {exc}")
            return
    elif not name.endswith((".cdx", ".cdxj")):
        return
    for number, text in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not text.strip() or text.startswith("!"):
            continue
        result.indexed += 1
        _check_line(f"{name} line {number}", text, records, problems)


def _check_line(where: str, text: str, records: dict[str, dict[int, _Record]],
                problems: _Problems) -> None:
    match = _LINE.fullmatch(text)
    try:
        line = json.loads(match.group(3)) if match else None
        offset, length = int(line["offset"]), int(line["length"])  # type: ignore[index]
    except (ValueError, TypeError, KeyError):
        problems.add("index", f"{where}: not a CDXJ line: {text[:120]!r}")
        return
    assert match is not None and isinstance(line, dict)
    record = records.get(str(line.get("filename")), {}).get(offset)
    if record is None:
        problems.add("index", f"{where}: no record starts at offset {offset} of "
                     f"{line.get('filename')!r}")
        return
    wrong = []
    if record.length != length:
        wrong.append(f"length {length} (the record's is {record.length})")
    if record.uri != line.get("url"):
        wrong.append(f"url {line.get('url')!r:.100} (the record's is {record.uri!r:.100})")
    if record.type not in _INDEXED_TYPES:
        wrong.append(f"a {record.type} record")
    if "digest" in line and record.type != "revisit" and line["digest"] != record.payload_digest:
        wrong.append(f"digest {line['digest']} (the record's is {record.payload_digest})")
    if record.date and timestamp14(record.date) != match.group(2):
        wrong.append(f"time {match.group(2)} (the record's is {timestamp14(record.date)})")
    if record.uri and _expected_key(record.uri, line) != match.group(1):
        wrong.append(f"key {match.group(1)!r:.100} (the URL's is "
                     f"{_expected_key(record.uri, line)!r:.100})")
    if wrong:
        problems.add("index", f"{where} points at the record at offset {offset} but says "
                     + "; ".join(wrong))


def _expected_key(uri: str, line: dict) -> str:
    """The SURT key of a line's record: of its URL, or for a request that was not a GET or
    HEAD (the line names its ``method``) of the URL with the method and the line's
    ``requestBody`` appended (the post-append form replay tools look it up by)."""
    method = str(line.get("method") or "GET").upper()
    if method in ("GET", "HEAD"):
        return surt_key(uri)
    body = line.get("requestBody") or ""
    suffix = f"__wb_method={method}" + (f"&{body}" if body else "")
    return surt_key(uri + ("&" if "?" in uri else "?") + suffix)


def _check_zipnum(zf: zipfile.ZipFile, name: str, data: bytes, problems: _Problems) -> None:
    """Each ``.idx`` line names a gzip member of a ``.cdx.gz`` (the file of the ``!meta``
    line, or its own ``filename``) by offset and length, and its SHA-256 (``digest``)."""
    members: dict[str, dict[tuple[int, int], bytes]] = {}
    default = None
    for number, text in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        match = re.fullmatch(r"(\S+) (\S+) (\{.*\})", text)
        try:
            line = json.loads(match.group(3)) if match else None
            if not isinstance(line, dict):
                raise ValueError("no JSON object")
            if match and match.group(1) == "!meta":
                default = line.get("filename")
                continue
            target = "indexes/" + str(line.get("filename", default))
            span = (int(line["offset"]), int(line["length"]))
        except (ValueError, TypeError, KeyError):
            problems.add("index", f"{name} line {number}: not a ZipNum index line")
            continue
        if target not in members:
            try:
                blob = zf.read(target)
                members[target] = {(o, n): blob[o:o + n] for o, n, _ in _gzip_members(
                    _BytesReader(blob))}
            except (KeyError, _Bad, zipfile.BadZipFile) as exc:
                problems.add("index", f"{name} line {number}: {target} unreadable ({exc})")
                members[target] = {}
        block = members[target].get(span)
        if block is None:
            problems.add("index", f"{name} line {number}: no gzip member of {target} at "
                         f"offset {span[0]} with length {span[1]}")
        elif "digest" in line and not _digest_matches(str(line["digest"]), block) and (
                line["digest"] != "sha256:" + hashlib.sha256(block).hexdigest()):
            problems.add("index", f"{name} line {number}: the block of {target} at offset "
                         f"{span[0]} does not have the digest the line gives")


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self.data, self.position = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else self.position + n
        piece = self.data[self.position:end]
        self.position += len(piece)
        return piece
