"""WACZ and CDXJ (issue 17 point 2), checked by independent implementations: the ``wacz``
package's validator, ``cdxj-indexer`` over our WARC, the ``surt`` package for URL keys,
the openssl command line for the signature, and warcio for the records."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence import ArtifactRef, CrawlConfig, Crawler, CrawlOptions, Store
from evidence._archive.cdxj import surt_key
from evidence._archive.wacz import export_wacz, load_signing_key, new_signing_key
from evidence._demo.site import SiteConfig, TestSite

from .jssite import JsSite

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd or ROOT)


@pytest.fixture(scope="module")
def rendered_store(tmp_path_factory: pytest.TempPathFactory, chromium: str) -> Path:
    path = tmp_path_factory.mktemp("wacz") / "s"
    with JsSite() as site, Store.create(path) as store:
        crawler = Crawler(store, CrawlConfig(seeds=[site.url], render=True),
                          CrawlOptions(workers=2))
        assert anyio.run(crawler.run).session_completed
    return path


@pytest.fixture(scope="module")
def package(rendered_store: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("out")
    with Store.open(rendered_store) as store:
        key = new_signing_key(out / "k.pem")
        report = export_wacz(store, out / "site.wacz", key=key)
    unpacked = out / "unpacked"
    with zipfile.ZipFile(out / "site.wacz") as zf:
        zf.extractall(unpacked)
        infos = zf.infolist()
    return out, report, unpacked, infos


def test_the_wacz_validator_accepts_the_package(package) -> None:
    out, report, _unpacked, infos = package
    done = run("-m", "wacz", "validate", "-f", str(out / "site.wacz"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Validation succeeded" in done.stdout
    assert [i.filename for i in infos] == [
        "archive/data.warc.gz", "indexes/index.cdx.gz", "indexes/index.idx",
        "pages/pages.jsonl", "datapackage.json", "datapackage-digest.json"]
    # Stored, so that readers take byte ranges of them; the page list, read whole, deflated.
    assert {i.filename: i.compress_type for i in infos} == {
        i.filename: zipfile.ZIP_DEFLATED if i.filename == "pages/pages.jsonl"
        else zipfile.ZIP_STORED for i in infos}
    assert report.signed and report.renders == 3


def test_cdxj_indexer_over_the_warc_gives_the_packaged_index(package) -> None:
    _out, report, unpacked, _infos = package
    # As py-wacz runs it: requests with a body appended to the key, each record's digest,
    # the lines in gzip members of 1,024 with an .idx naming each member.
    done = run("-W", "ignore", "-m", "cdxj_indexer.main", "--post-append", "--sort",
               "--digest-records", "--compress", "index.cdx.gz", "--lines", "1024",
               "-o", "index.idx", "archive/data.warc.gz", cwd=unpacked)
    assert done.returncode == 0, done.stderr
    packaged = unpacked / "indexes"
    assert (unpacked / "index.cdx.gz").read_bytes() == (packaged / "index.cdx.gz").read_bytes()
    assert (unpacked / "index.idx").read_bytes() == (packaged / "index.idx").read_bytes()
    import gzip

    lines = gzip.decompress((packaged / "index.cdx.gz").read_bytes()).decode().splitlines()
    assert len(lines) == report.indexed
    assert any(x.startswith("urn:fullpage:http://127.0.0.1:") for x in lines)  # screenshots


def test_the_signature_verifies_with_openssl(package, tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command line is needed to check the signature independently")
    _out, _report, unpacked, _infos = package
    digest_doc = json.loads((unpacked / "datapackage-digest.json").read_text())
    signed = digest_doc["signedData"]
    package_bytes = (unpacked / "datapackage.json").read_bytes()
    import hashlib

    assert digest_doc["hash"] == "sha256:" + hashlib.sha256(package_bytes).hexdigest()
    assert signed["hash"] == digest_doc["hash"]
    assert signed["created"] == json.loads(package_bytes)["created"]
    (tmp_path / "pub.der").write_bytes(base64.b64decode(signed["publicKey"]))
    raw = base64.b64decode(signed["signature"])
    assert len(raw) == 96  # P-384: r and s, 48 bytes each (Web Crypto's form)
    (tmp_path / "sig.der").write_bytes(_der_signature(raw))
    (tmp_path / "message").write_bytes(signed["hash"].encode())
    subprocess.run(["openssl", "pkey", "-pubin", "-inform", "DER", "-in", "pub.der", "-out",
                    "pub.pem"], cwd=tmp_path, check=True, capture_output=True)
    good = subprocess.run(["openssl", "dgst", "-sha256", "-verify", "pub.pem", "-signature",
                           "sig.der", "message"], cwd=tmp_path, capture_output=True, text=True)
    assert good.returncode == 0 and "Verified OK" in good.stdout, good.stdout + good.stderr
    (tmp_path / "message").write_bytes(signed["hash"].replace("a", "b", 1).encode())
    bad = subprocess.run(["openssl", "dgst", "-sha256", "-verify", "pub.pem", "-signature",
                          "sig.der", "message"], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode != 0 and "Verification failure" in bad.stdout


def _der_signature(raw: bytes) -> bytes:
    """r||s as the DER ECDSA-Sig-Value openssl reads (RFC 3279), written out by hand."""
    def integer(value: bytes) -> bytes:
        value = value.lstrip(b"\0") or b"\0"
        if value[0] & 0x80:
            value = b"\0" + value
        return b"\x02" + bytes([len(value)]) + value
    half = len(raw) // 2
    body = integer(raw[:half]) + integer(raw[half:])
    return b"\x30" + bytes([len(body)]) + body


def test_two_exports_of_the_same_store_are_byte_identical(rendered_store: Path, package,
                                                          tmp_path: Path) -> None:
    out, report, _unpacked, _infos = package
    with Store.open(rendered_store) as store:
        again = export_wacz(store, tmp_path / "again.wacz", key=load_signing_key(out / "k.pem"))
    assert (tmp_path / "again.wacz").read_bytes() == (out / "site.wacz").read_bytes()
    assert again.sha256 == report.sha256


def test_pages_list_every_captured_page_with_its_title_and_time(package) -> None:
    _out, report, unpacked, _infos = package
    lines = [json.loads(x) for x in (unpacked / "pages" / "pages.jsonl").read_text().splitlines()]
    assert lines[0] == {"format": "json-pages-1.0", "id": "pages", "title": "All Pages"}
    pages = {p["url"].split("/", 3)[3]: p for p in lines[1:]}
    assert set(pages) == {"", "page", "hidden"}  # robots.txt, the CSS, favicon: not pages
    assert pages["page"]["title"] == "Scripted page" and pages["hidden"]["title"] == "Hidden"
    assert all(p["ts"].endswith("Z") and p["id"].startswith("a-") for p in pages.values())
    assert report.pages == 3


def test_rendered_screenshots_and_doms_are_resource_records(rendered_store: Path,
                                                           package) -> None:
    from warcio.archiveiterator import ArchiveIterator

    _out, _report, unpacked, _infos = package
    resources = {}
    with open(unpacked / "archive" / "data.warc.gz", "rb") as f:
        for record in ArchiveIterator(f):
            if record.rec_type == "resource":
                resources[record.rec_headers.get_header("WARC-Target-URI")] = (
                    record.rec_headers.get_header("Content-Type"), record.content_stream().read())
    page = next(u for u in resources if u.startswith("urn:fullPage:") and u.endswith("/page"))
    kind, png = resources[page]
    assert kind == "image/png" and png.startswith(b"\x89PNG\r\n\x1a\n")
    with Store.open(rendered_store) as store:
        stored = store.connection.execute(
            "SELECT a.namespace, a.digest, a.size FROM render r JOIN artifact a ON "
            "a.artifact_id = r.screenshot_id WHERE r.url = ?", (page[len("urn:fullPage:"):],)
        ).fetchall()[0]
        assert png == store.artifacts.read(ArtifactRef(*stored))
    dom_kind, dom = resources[page.replace("urn:fullPage:", "urn:dom:")]
    assert dom_kind.startswith("text/html") and b'id="consent"' in dom


def test_an_unrendered_store_exports_titles_from_the_documents(tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=4)) as site, Store.create(tmp_path / "s") as store:
        anyio.run(Crawler(store, CrawlConfig(seeds=[site.url])).run)
        report = export_wacz(store, tmp_path / "x.wacz")
    with zipfile.ZipFile(tmp_path / "x.wacz") as zf:
        pages = [json.loads(x) for x in zf.read("pages/pages.jsonl").splitlines()[1:]]
        digest = json.loads(zf.read("datapackage-digest.json"))
    assert not report.signed and "signedData" not in digest
    assert {p["title"] for p in pages} >= {"Page 1", "Page 2"}
    done = run("-m", "wacz", "validate", "-f", str(tmp_path / "x.wacz"))
    assert done.returncode == 0, done.stdout


def test_wacz_export_refuses_bad_requests_and_changes_nothing(rendered_store: Path,
                                                              tmp_path: Path) -> None:
    cases = [
        (["--run", "r-x"], "--run is not supported"),
        (["--key", str(tmp_path / "missing.pem")], "cannot read key"),
    ]
    for extra, expected in cases:
        done = run("-m", "evidence", "export", str(rendered_store), "--format", "wacz",
                   "--out", str(tmp_path / "x.wacz"), *extra)
        assert done.returncode == 2 and expected in done.stderr, done.stderr
        assert "Try: " in done.stderr and "Traceback" not in done.stderr
    done = run("-m", "evidence", "export", str(rendered_store), "--out", str(tmp_path / "d"),
               "--key", "k.pem")
    assert done.returncode == 2 and "sign a WACZ export only" in done.stderr
    (tmp_path / "ed.pem").write_bytes(b"-----BEGIN PRIVATE KEY-----\nnope\n"
                                      b"-----END PRIVATE KEY-----\n")
    done = run("-m", "evidence", "export", str(rendered_store), "--format", "wacz", "--out",
               str(tmp_path / "x.wacz"), "--key", str(tmp_path / "ed.pem"))
    assert done.returncode == 2 and "not an unencrypted PEM private key" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ed.pem"]


_LABEL = st.text("abcxyzABC019-", min_size=1, max_size=6)
_SEGMENT = st.one_of(st.text("abcAB19-._~%20é/", max_size=8), st.sampled_from([".", "..", ""]))


@st.composite
def _urls(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["http", "https"]))
    host = ".".join(draw(st.lists(_LABEL, min_size=1, max_size=3)))
    if draw(st.booleans()):
        host = draw(st.sampled_from(["www.", "WWW2.", "127.0.0."])) + host
    port = draw(st.sampled_from(["", ":80", ":443", ":8080"]))
    path = "/".join(draw(st.lists(_SEGMENT, max_size=4)))
    query = draw(st.lists(st.tuples(st.text("abcAB%2é", min_size=1, max_size=4),
                                    st.text("xyZ19 ", max_size=3)), max_size=3))
    url = f"{scheme}://{host}{port}/{path}"
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query)
    if draw(st.booleans()):
        url += "#" + draw(st.text("fragAB", max_size=4))
    return url


@settings(max_examples=400, deadline=None)
@given(_urls())
def test_surt_keys_match_the_surt_package(url: str) -> None:
    import surt

    assert surt_key(url) == surt.surt(url)


@pytest.mark.parametrize("url", ["urn:fullPage:http://127.0.0.1:8000/page",
                                 "urn:dom:http://x.com/a/", "http://x.com/%2541",
                                 "http://user:pw@X.com:8080/p?jsessionid="
                                 "0123456789abcdef0123456789abcdef&z=1"])
def test_surt_keys_of_resource_urns_and_odd_urls(url: str) -> None:
    import surt

    assert surt_key(url) == surt.surt(url)
