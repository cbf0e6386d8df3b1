"""WACZ signatures others check, and a WACZ check of our own (issue 32 point 4).

The attacks of the issue, each on a copy of a genuine signed export: one response record
altered with the package hashes recomputed; the same, made fully consistent (record digests
and index too) and re-signed with the attacker's own key; and a crude edit of the bytes.
``evidence verify X.wacz`` refuses each (the re-signed one when the real key is pinned, and
unpinned it names the other key), ``evidence replay X.wacz --serve`` will not serve them
unless told ``--unverified``, and then every page carries a warning."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import warnings
import zipfile
import zlib
from pathlib import Path

import anyio
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import CrawlConfig, Crawler, Store
from evidence._archive.wacz import (
    TimeSignature,
    Timestamper,
    WaczSigner,
    export_wacz,
    load_certificate_chain,
    load_signing_key,
    new_signing_key,
)
from evidence._archive.waczcheck import check_wacz, load_public_key
from evidence._cli.main import main
from evidence._demo.site import SiteConfig, TestSite
from evidence._errors import ProofError

from .conftest import unavailable

ROOT = Path(__file__).resolve().parent.parent


def evidence(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The command line, in this process (a child would take seconds to start each time)."""
    out, err = io.StringIO(), io.StringIO()
    with (contextlib.redirect_stdout(out), contextlib.redirect_stderr(err),
          contextlib.chdir(cwd or ROOT)):
        code = main([str(a) for a in args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def genuine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(store, signed WACZ, its public key file)."""
    out = tmp_path_factory.mktemp("genuine")
    with TestSite(SiteConfig(pages=3)) as site, Store.create(out / "s") as store:
        anyio.run(Crawler(store, CrawlConfig(seeds=[site.url])).run)
        key = new_signing_key(out / "k.pem")
        export_wacz(store, out / "site.wacz", key=key)
    return out / "s", out / "site.wacz", out / "k.pem.pub"


# --- tampering, as an attacker with the file and no key would ------------------------

def _members(data: bytes) -> list[bytes]:
    """The gzip members of a WARC, each decompressed."""
    out = []
    while data:
        inflater = zlib.decompressobj(wbits=31)
        out.append(inflater.decompress(data))
        data = inflater.unused_data
    return out


def _b32(data: bytes) -> str:
    return "sha256:" + base64.b32encode(hashlib.sha256(data).digest()).decode()


def _alter_response(record: bytes, redigest: bool) -> bytes:
    """A response record with its page title changed (same length); digests recomputed
    only if ``redigest``."""
    head, _, block = record.partition(b"\r\n\r\n")
    block = block[:-4]
    http_head, _, payload = block.partition(b"\r\n\r\n")
    payload = payload.replace(b"<title>Page", b"<title>Fake", 1)
    block = http_head + b"\r\n\r\n" + payload
    if redigest:
        head = re.sub(rb"WARC-Block-Digest: \S+", b"WARC-Block-Digest: " + _b32(block).encode(),
                      head)
        head = re.sub(rb"WARC-Payload-Digest: \S+",
                      b"WARC-Payload-Digest: " + _b32(payload).encode(), head)
    return head + b"\r\n\r\n" + block + b"\r\n\r\n"


def _plain_index(files: dict[str, bytes]) -> dict[str, bytes]:
    """Our WACZ carries a compressed index (index.cdx.gz in gzip members, and index.idx);
    the tests that edit index lines first turn it into the plain index.cdx an older WACZ
    carries (the checker reads either), with the package's resources to match."""
    if "indexes/index.cdx.gz" not in files:
        return files
    text = gzip.decompress(files.pop("indexes/index.cdx.gz"))
    files.pop("indexes/index.idx", None)
    files["indexes/index.cdx"] = text
    package = json.loads(files["datapackage.json"])
    package["resources"] = [
        r for r in package["resources"]
        if r["path"] not in ("indexes/index.cdx.gz", "indexes/index.idx")] + [
        {"name": "index.cdx", "path": "indexes/index.cdx",
         "hash": "sha256:" + hashlib.sha256(text).hexdigest(), "bytes": len(text)}]
    files["datapackage.json"] = json.dumps(package, indent=2).encode()
    return files


def tamper(source: Path, target: Path, *, redigest: bool = False,
           resign: ec.EllipticCurvePrivateKey | None = None) -> None:
    """Alter the first HTML response, rewrite the index offsets and the package hashes;
    with ``redigest`` the record's digests too, with ``resign`` sign it with that key."""
    with zipfile.ZipFile(source) as zf:
        files = _plain_index({name: zf.read(name) for name in zf.namelist()})
    records = _members(files["archive/data.warc.gz"])
    altered = next(i for i, r in enumerate(records)
                   if b"WARC-Type: response" in r and b"<title>Page" in r)
    old_digest = re.search(rb"WARC-Payload-Digest: (\S+)", records[altered]).group(1).decode()
    records[altered] = _alter_response(records[altered], redigest)
    new_digest = re.search(rb"WARC-Payload-Digest: (\S+)", records[altered]).group(1).decode()
    original = files["archive/data.warc.gz"]
    which = {offset: i for i, (offset, _length) in enumerate(_spans(original))}
    files["archive/data.warc.gz"] = b"".join(gzip.compress(r, mtime=0) for r in records)
    spans = _spans(files["archive/data.warc.gz"])
    lines = []
    for line in files["indexes/index.cdx"].decode().splitlines():
        key, ts, rest = line.split(" ", 2)
        fields = json.loads(rest)
        offset, length = spans[which[int(fields["offset"])]]
        fields["offset"], fields["length"] = str(offset), str(length)
        if fields.get("digest") == old_digest:
            fields["digest"] = new_digest
        lines.append(f"{key} {ts} {json.dumps(fields)}\n")
    files["indexes/index.cdx"] = "".join(lines).encode()
    package = json.loads(files["datapackage.json"])
    for resource in package["resources"]:
        data = files[resource["path"]]
        resource["hash"] = "sha256:" + hashlib.sha256(data).hexdigest()
        resource["bytes"] = len(data)
    files["datapackage.json"] = json.dumps(package, indent=2).encode()
    digest_doc = json.loads(files["datapackage-digest.json"])
    digest_doc["hash"] = "sha256:" + hashlib.sha256(files["datapackage.json"]).hexdigest()
    signed = digest_doc["signedData"]
    signed["hash"] = digest_doc["hash"]
    if resign is not None:
        r, s = decode_dss_signature(resign.sign(signed["hash"].encode(),
                                                ec.ECDSA(hashes.SHA256())))
        signed["signature"] = base64.b64encode(r.to_bytes(48, "big") + s.to_bytes(48, "big")
                                               ).decode()
        signed["publicKey"] = base64.b64encode(resign.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        ).decode()
    files["datapackage-digest.json"] = json.dumps(digest_doc, indent=2).encode()
    write_zip(target, files)


def _spans(warc: bytes) -> list[tuple[int, int]]:
    """(offset, length) of each gzip member, in order."""
    spans, position = [], 0
    while position < len(warc):
        inflater = zlib.decompressobj(wbits=31)
        inflater.decompress(warc[position:])
        length = len(warc) - position - len(inflater.unused_data)
        spans.append((position, length))
        position += length
    return spans


def _entry_data(wacz: Path, name: str) -> tuple[int, int]:
    """Where an entry's bytes are in the zip file: after its local header."""
    with zipfile.ZipFile(wacz) as zf:
        info = zf.getinfo(name)
    with open(wacz, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = (int.from_bytes(f.read(2), "little") for _ in range(2))
    return info.header_offset + 30 + name_len + extra_len, info.compress_size


def write_zip(target: Path, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)


@pytest.fixture(scope="module")
def attacks(genuine, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    _store, wacz, _pub = genuine
    out = tmp_path_factory.mktemp("attacks")
    tamper(wacz, out / "altered.wacz")
    attacker = ec.generate_private_key(ec.SECP384R1())
    tamper(wacz, out / "resigned.wacz", redigest=True, resign=attacker)
    (out / "attacker.pub").write_bytes(attacker.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    data = bytearray(wacz.read_bytes())
    start, size = _entry_data(wacz, "archive/data.warc.gz")
    data[start + size // 2:start + size // 2 + 4] = b"FAKE"  # nothing recomputed
    (out / "crude.wacz").write_bytes(bytes(data))
    return {"altered": out / "altered.wacz", "resigned": out / "resigned.wacz",
            "crude": out / "crude.wacz", "attacker": out / "attacker.pub"}


# --- the genuine file ----------------------------------------------------------------

def test_the_genuine_wacz_verifies_pinned_and_unpinned(genuine) -> None:
    _store, wacz, pub = genuine
    done = evidence("verify", wacz, "--public-key", pub)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: intact, and signed by the key you gave" in done.stdout
    done = evidence("verify", wacz, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and not report["pinned"] and report["form"] == "anonymous"
    assert report["records"] >= 7 and report["indexed"] >= 3 and report["files"] == 4
    assert report["key_sha256"] == hashlib.sha256(load_public_key(pub)).hexdigest()
    assert any("anyone can make a key" in n for n in report["notes"])


# --- the three attacks ---------------------------------------------------------------

def test_a_record_altered_with_the_package_hashes_recomputed_is_refused(genuine,
                                                                        attacks) -> None:
    _store, _wacz, pub = genuine
    for pin in ([], ["--public-key", pub]):
        done = evidence("verify", attacks["altered"], "--json", *pin)
        assert done.returncode == 1, done.stdout + done.stderr
        report = json.loads(done.stdout)
        problems = "\n".join(report["problems"])
        assert "the signature does not verify" in problems
        assert "does not match its WARC-Payload-Digest" in problems  # and which record
        assert "does not match its WARC-Block-Digest" in problems


def test_a_consistent_forgery_resigned_with_another_key_is_refused_when_pinned(
        genuine, attacks) -> None:
    _store, _wacz, pub = genuine
    done = evidence("verify", attacks["resigned"], "--public-key", pub)
    assert done.returncode == 1, done.stdout
    assert "not by the key given" in done.stdout and "FAILED" in done.stdout
    # Unpinned, nothing inside the file can tell: it is consistent, and signed. The report
    # says by which key, and that this proves nothing until the key is compared.
    done = evidence("verify", attacks["resigned"], "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"] and not report["pinned"]
    assert report["key_sha256"] == hashlib.sha256(load_public_key(
        attacks["attacker"])).hexdigest() != hashlib.sha256(load_public_key(pub)).hexdigest()
    assert any("compared with the one the operator published" in n for n in report["notes"])
    strict = evidence("verify", attacks["resigned"], "--strict")
    assert strict.returncode == 1  # --strict: a note (here: unpinned) fails too


def test_a_crude_edit_of_the_bytes_is_refused(attacks) -> None:
    done = evidence("verify", attacks["crude"])
    assert done.returncode == 1, done.stdout
    assert "FAILED" in done.stdout
    assert "does not read back" in done.stdout or "its SHA-256 is" in done.stdout


@settings(max_examples=40, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_byte_changed_in_any_file_of_the_wacz_is_caught(genuine, data, tmp_path_factory
                                                            ) -> None:
    _store, wacz, _pub = genuine
    blob = bytearray(wacz.read_bytes())
    with zipfile.ZipFile(wacz) as zf:
        name = data.draw(st.sampled_from(zf.namelist()), label="file")
    start, size = _entry_data(wacz, name)
    position = data.draw(st.integers(start, start + size - 1), label="byte")
    blob[position] ^= data.draw(st.integers(1, 255), label="xor")
    target = tmp_path_factory.mktemp("flip") / "x.wacz"
    target.write_bytes(bytes(blob))
    # A stored entry's bytes are its content. A deflated one (the page list) has bits no
    # content depends on (the padding after its last block): what the package signs is
    # the content, so a flip there that leaves the content whole is no change to check.
    assert check_wacz(target).ok == (_content(target, name) == _content(wacz, name))


def _content(wacz: Path, name: str) -> bytes | None:
    """An entry's content as a reader gets it (None: unreadable, its CRC broken...)."""
    try:
        with zipfile.ZipFile(wacz) as zf:
            return zf.read(name)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError):
        return None


def _unsigned(files: dict[str, bytes]) -> dict[str, bytes]:
    """The package hashes made true again and the signature dropped: what anyone can do."""
    package = json.loads(files["datapackage.json"])
    package["resources"] = [
        {"name": Path(n).name, "path": n, "hash": "sha256:" + hashlib.sha256(d).hexdigest(),
         "bytes": len(d)} for n, d in files.items() if n.startswith(("archive/", "indexes/",
                                                                        "pages/"))]
    files["datapackage.json"] = json.dumps(package).encode()
    files["datapackage-digest.json"] = json.dumps({
        "path": "datapackage.json",
        "hash": "sha256:" + hashlib.sha256(files["datapackage.json"]).hexdigest()}).encode()
    return files


def test_an_index_line_moved_to_another_record_is_caught(genuine, tmp_path: Path) -> None:
    _store, wacz, _pub = genuine
    with zipfile.ZipFile(wacz) as zf:
        files = _plain_index({name: zf.read(name) for name in zf.namelist()})
    lines = files["indexes/index.cdx"].decode().splitlines()
    first, second = (json.loads(line.split(" ", 2)[2]) for line in lines[:2])
    moved = lines[0].replace(f'"offset": "{first["offset"]}"', f'"offset": "{second["offset"]}"'
                             ).replace(f'"length": "{first["length"]}"',
                                       f'"length": "{second["length"]}"')
    files["indexes/index.cdx"] = "\n".join([moved, *lines[1:]]).encode() + b"\n"
    write_zip(tmp_path / "moved.wacz", _unsigned(files))
    check = check_wacz(tmp_path / "moved.wacz")
    assert not check.ok and "indexes/index.cdx line 1 points at the record at offset" in (
        check.problems[0]), check.problems


def test_a_zipnum_index_is_checked_block_by_block(genuine, tmp_path: Path) -> None:
    """The layout py-wacz writes (indexes/index.cdx.gz in gzip blocks, indexes/index.idx
    naming each block by offset, length and SHA-256): read and checked too."""
    _store, wacz, _pub = genuine
    with zipfile.ZipFile(wacz) as zf:
        files = _plain_index({name: zf.read(name) for name in zf.namelist()})
    lines = files.pop("indexes/index.cdx").decode().splitlines(keepends=True)
    blocks = [gzip.compress("".join(lines[i:i + 2]).encode(), mtime=0)
              for i in range(0, len(lines), 2)]
    idx, offset = ['!meta 0 {"format": "cdxj-gzip-1.0", "filename": "index.cdx.gz"}'], 0
    for block, first in zip(blocks, lines[::2], strict=True):
        key, ts, _rest = first.split(" ", 2)
        idx.append(f"{key} {ts} " + json.dumps({"offset": offset, "length": len(block),
                   "digest": "sha256:" + hashlib.sha256(block).hexdigest()}))
        offset += len(block)
    files["indexes/index.cdx.gz"] = b"".join(blocks)
    files["indexes/index.idx"] = "\n".join(idx).encode() + b"\n"
    write_zip(tmp_path / "zipnum.wacz", _unsigned(dict(files)))
    check = check_wacz(tmp_path / "zipnum.wacz")
    assert check.ok and check.indexed == len(lines), check.problems
    files["indexes/index.idx"] = files["indexes/index.idx"].replace(
        b'"offset": 0,', b'"offset": 1,')
    write_zip(tmp_path / "bad.wacz", _unsigned(dict(files)))
    assert check_wacz(tmp_path / "bad.wacz").problems == [
        f"indexes/index.idx line 2: no gzip member of indexes/index.cdx.gz at offset 1 with "
        f"length {len(blocks[0])}"]


# --- replay refuses what does not verify ---------------------------------------------

def test_replay_serve_refuses_each_tampered_wacz_and_creates_nothing(genuine, attacks,
                                                                     tmp_path: Path) -> None:
    _store, _wacz, pub = genuine
    for name, pin in (("altered", []), ("crude", []), ("resigned", ["--public-key", pub])):
        done = evidence("replay", attacks[name], "--serve", "--port", "0", *pin, cwd=tmp_path)
        assert done.returncode == 2, (name, done.stdout, done.stderr)
        assert "fails verification, so it is not served" in done.stderr
        assert "Try: " in done.stderr and "--unverified" in done.stderr
        assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_unverified_serves_it_with_a_warning_above_every_page(attacks) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "evidence", "replay", str(attacks["altered"]),
                             "--serve", "--port", "0", "--json", "--unverified"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["verified"] is False and info["problems"]
        page = info["pages"][0]["replay_url"]
        top = httpx.get(page, timeout=30)
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
    assert top.status_code == 200
    assert 'id="evidence-unverified"' in top.text and "failed verification" in top.text
    assert "UNVERIFIED" in err.decode()


# --- signing: key types and the domain form ------------------------------------------

def test_a_p256_key_is_refused_for_the_anonymous_form(genuine, tmp_path: Path) -> None:
    store, _wacz, _pub = genuine
    key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "p256.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    done = evidence("export", store, "--format", "wacz", "--out", tmp_path / "x.wacz",
                    "--key", tmp_path / "p256.pem")
    assert done.returncode == 2, done.stderr
    assert "ECDSA P-256 key" in done.stderr and "ReplayWeb.page" in done.stderr
    assert "Try: make a P-384 key" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p256.pem"]


def _certificates(directory: Path, curve: ec.EllipticCurve) -> tuple[Path, Path, Path]:
    """A root CA and a certificate for archive.example.org: (key, chain, root) PEM files."""
    now = dt.datetime.now(dt.UTC)
    root_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(curve)
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Examiners' test root")])
    root = (x509.CertificateBuilder().subject_name(root_name).issuer_name(root_name)
            .public_key(root_key.public_key()).serial_number(1)
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(root_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                        "archive.example.org")]))
            .issuer_name(root_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=7))
            .sign(root_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (directory / "signer.pem").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (directory / "chain.pem").write_bytes(leaf.public_bytes(pem) + root.public_bytes(pem))
    (directory / "root.pem").write_bytes(root.public_bytes(pem))
    return directory / "signer.pem", directory / "chain.pem", directory / "root.pem"


def test_the_domain_form_names_the_certificate_and_pins_to_its_root(genuine,
                                                                     tmp_path: Path) -> None:
    store, _wacz, pub = genuine
    key, chain, root = _certificates(tmp_path, ec.SECP256R1())
    done = evidence("export", store, "--format", "wacz", "--out", tmp_path / "d.wacz",
                    "--key", key, "--cert", chain, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["domain"] == "archive.example.org"
    with zipfile.ZipFile(tmp_path / "d.wacz") as zf:
        signed = json.loads(zf.read("datapackage-digest.json"))["signedData"]
        created = json.loads(zf.read("datapackage.json"))["created"]
    assert signed["domain"] == "archive.example.org" and "publicKey" not in signed
    assert signed["domainCert"].count("BEGIN CERTIFICATE") == 2
    assert signed["created"] == created and created.endswith("Z")
    assert base64.b64decode(signed["signature"])[0] == 0x30  # DER, as authsign verifies
    for pin in (root, chain):  # the root, or the signer's own certificate
        done = evidence("verify", tmp_path / "d.wacz", "--public-key", pin, "--json")
        report = json.loads(done.stdout)
        assert done.returncode == 0 and report["pinned"], done.stdout
        assert report["form"] == "domain" and report["domain"] == "archive.example.org"
    done = evidence("verify", tmp_path / "d.wacz", "--public-key", pub)
    assert done.returncode == 1 and "not by the key given" in done.stdout


def test_a_certificate_for_another_key_or_a_broken_chain_is_refused(genuine,
                                                                    tmp_path: Path) -> None:
    store, _wacz, _pub = genuine
    key, chain, _root = _certificates(tmp_path, ec.SECP384R1())
    other = tmp_path / "other"
    other.mkdir()
    other_key, _chain, _ = _certificates(other, ec.SECP384R1())
    leaf_only = chain.read_bytes().split(b"-----END CERTIFICATE-----\n")[0]
    (tmp_path / "broken.pem").write_bytes(leaf_only + b"-----END CERTIFICATE-----\n"
                                          + (other / "root.pem").read_bytes())
    for k, c, expected in ((other_key, chain, "the key is not the certificate's"),
                           (key, tmp_path / "broken.pem", "is not signed by the next one"),
                           (key, None, None)):
        args = ["--key", k] + ([] if c is None else ["--cert", c])
        done = evidence("export", store, "--format", "wacz", "--out", tmp_path / "x.wacz",
                        *args)
        if expected is None:  # a P-384 key with no certificate: the anonymous form
            assert done.returncode == 0, done.stderr
            (tmp_path / "x.wacz").unlink()
            continue
        assert done.returncode == 2 and expected in done.stderr, done.stderr
        assert "Try: " in done.stderr and not (tmp_path / "x.wacz").exists()
    done = evidence("export", store, "--format", "wacz", "--out", tmp_path / "x.wacz",
                    "--cert", chain)
    assert done.returncode == 2 and "--cert needs --key" in done.stderr


_TSA_CONFIG = """[ tsa ]
default_tsa = test
[ test ]
serial = ./serial
crypto_device = builtin
signer_cert = ./tsa.pem
certs = ./root.pem
signer_key = ./tsa.key
signer_digest = sha256
default_policy = 1.2.3.4.1
other_policies = 1.2.3.4.2
digests = sha256
accuracy = secs:1
ordering = no
tsa_name = no
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""


def _openssl_tsa(directory: Path) -> Timestamper:
    """A time-stamping authority of our own: ``openssl ts -reply`` with a TSA certificate
    (timeStamping, critical) issued by a root made here; the timestamper the domain form
    takes, over the signature text as authsign stamps it."""
    if shutil.which("openssl") is None:
        unavailable("the openssl command line is needed for the test TSA")
    now = dt.datetime.now(dt.UTC)
    root_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(
        ec.SECP384R1())
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test TSA root")])
    root = (x509.CertificateBuilder().subject_name(root_name).issuer_name(root_name)
            .public_key(root_key.public_key()).serial_number(1)
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(root_key, hashes.SHA256()))
    tsa = (x509.CertificateBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test TSA")]))
           .issuer_name(root_name).public_key(key.public_key()).serial_number(2)
           .not_valid_before(now - dt.timedelta(hours=1))
           .not_valid_after(now + dt.timedelta(days=1))
           .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]),
                          critical=True)
           .sign(root_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (directory / "root.pem").write_bytes(root.public_bytes(pem))
    (directory / "tsa.pem").write_bytes(tsa.public_bytes(pem))
    (directory / "tsa.key").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    (directory / "serial").write_text("01\n")
    (directory / "ts.cnf").write_text(_TSA_CONFIG)

    def stamp(text: str) -> TimeSignature:
        (directory / "data").write_text(text)
        for command in (["query", "-data", "data", "-sha256", "-cert", "-no_nonce", "-out",
                         "q.tsq"],
                        ["reply", "-config", "ts.cnf", "-queryfile", "q.tsq", "-out", "r.tsr"]):
            done = subprocess.run(["openssl", "ts", f"-{command[0]}", *command[1:]],
                                  cwd=directory, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
        return TimeSignature(
            time_signature=base64.b64encode((directory / "r.tsr").read_bytes()).decode(),
            timestamp_cert=(directory / "tsa.pem").read_text()
            + (directory / "root.pem").read_text())

    return stamp


def test_the_domain_form_carries_the_timestamp_its_timestamper_gives(genuine,
                                                                     tmp_path: Path) -> None:
    """The seam for trusted time: a timestamper's RFC 3161 response over the signature
    text lands in timeSignature, and openssl accepts it against the TSA's root."""
    store, _wacz, _pub = genuine
    (tmp_path / "tsa").mkdir()
    stamp = _openssl_tsa(tmp_path / "tsa")
    key, chain, root = _certificates(tmp_path, ec.SECP384R1())
    signer = WaczSigner(load_signing_key(key, domain=True), load_certificate_chain(chain),
                        timestamper=stamp)
    with Store.open(store, read_only=True) as opened:
        export_wacz(opened, tmp_path / "t.wacz", key=signer)
    with zipfile.ZipFile(tmp_path / "t.wacz") as zf:
        signed = json.loads(zf.read("datapackage-digest.json"))["signedData"]
    (tmp_path / "sig.txt").write_text(signed["signature"])
    (tmp_path / "t.tsr").write_bytes(base64.b64decode(signed["timeSignature"]))
    done = subprocess.run(["openssl", "ts", "-verify", "-data", "sig.txt", "-in", "t.tsr",
                           "-CAfile", "tsa/root.pem", "-untrusted", "tsa/tsa.pem"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Verification: OK" in done.stdout, done.stdout + done.stderr
    assert signed["timestampCert"].count("BEGIN CERTIFICATE") == 2
    # authsign (wacz validate --verify-auth's verifier), trusting our two roots, accepts it:
    # chain, domain, signature, created within the certificate's first days, the timestamp
    # over the signature and its chain. (wacz validate itself trusts only its built-in
    # roots, Let's Encrypt and freetsa.org, so it cannot be pointed at a test root.)
    def fingerprint(path: Path) -> str:
        return x509.load_pem_x509_certificate(path.read_bytes()).fingerprint(
            hashes.SHA256()).hex()

    (tmp_path / "roots.yaml").write_text(
        f"domain_cert_roots:\n  - {fingerprint(root)}\n"
        f"timestamp_cert_roots:\n  - {fingerprint(tmp_path / 'tsa' / 'root.pem')}\n")
    with warnings.catch_warnings():  # authsign's own deprecations (pydantic 1 validators)
        warnings.simplefilter("ignore")
        from authsign.verifier import Verifier

        verifier = Verifier(str(tmp_path / "roots.yaml"))
        verdict = verifier(signed)
        with pytest.raises(AssertionError):  # authsign 0.6 raises on a failed check
            verifier(signed | {"hash": signed["hash"].replace("a", "b", 1)})
    assert verdict and dict(verdict)["observer"] == "archive.example.org", verdict
    check = check_wacz(tmp_path / "t.wacz", public_key=load_public_key(root))
    assert check.ok and check.pinned and check.timestamp == "present"
    assert any("checked only against a TSA root you name" in n for n in check.notes)
    with pytest.raises(ProofError, match="goes with a domain signature"):
        WaczSigner(load_signing_key(key, domain=True), timestamper=stamp)


def test_verify_refuses_flags_that_do_not_apply_to_a_wacz(genuine, tmp_path: Path) -> None:
    store, wacz, pub = genuine
    done = evidence("verify", wacz, "--full")
    assert done.returncode == 2 and "a WACZ file is always checked whole" in done.stderr
    done = evidence("verify", store, "--public-key", pub)  # for a store: a checkpoint's key
    assert done.returncode == 2 and "--checkpoint and --public-key go together" in done.stderr
    for extra in (["--public-key", pub], ["--unverified"]):
        done = evidence("replay", store, "--serve", "--port", "0", *extra)
        assert done.returncode == 2 and "are for a WACZ file" in done.stderr
        done = evidence("replay", wacz, "http://127.0.0.1:9/", *extra)
        assert done.returncode == 2 and "go with --serve" in done.stderr
    (tmp_path / "junk.pub").write_text("not a key\n")
    done = evidence("verify", wacz, "--public-key", tmp_path / "junk.pub")
    assert done.returncode == 2 and "holds no public key" in done.stderr
    assert "Traceback" not in done.stderr
