"""ReplayWeb.page checks our WACZ signature (issue 32 point 4).

ReplayWeb.page (the ``replaywebpage`` package from the npm registry, its ``ui.js`` and
service worker ``sw.js``) is served from 127.0.0.1 with the WACZ beside it, and opened in
headless Chromium. It verifies the anonymous signature itself (Web Crypto, ECDSA P-384)
and records what it found in the collection's IndexedDB ``verification`` store: the test
reads that store from the page. A genuine export verifies (``signature`` matched, our
public key shown); the same file with a record altered and the package hashes recomputed
does not; and a P-256 key, which evidence now refuses, is not even taken up (no public
key: what its UI shows as "Not Available").
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import anyio
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from evidence._crawl.browser import Browser

from .conftest import unavailable
from .test_waczcheck import genuine, tamper, write_zip  # noqa: F401 - genuine: a fixture

REPLAYWEBPAGE = "2.5.3"  # the version this test was written against (npm view replaywebpage)

# The collection's verification records, and how many pages it has loaded: ReplayWeb.page
# checks the signature while it reads datapackage-digest.json, before the package and its
# pages, so once pages are in, its verdict on the signature (or its silence) is final.
_PROBE = """(async () => {
  const open = name => new Promise((ok, bad) => {
    const r = indexedDB.open(name);
    r.onsuccess = () => ok(r.result); r.onerror = () => bad(r.error);
  });
  const all = (db, store, count) => new Promise((ok, bad) => {
    const s = db.transaction(store).objectStore(store);
    const r = count ? s.count() : s.getAll();
    r.onsuccess = () => ok(r.result); r.onerror = () => bad(r.error);
  });
  for (const info of await indexedDB.databases()) {
    const db = await open(info.name);
    const names = db.objectStoreNames;
    if (!names.contains('verification') || !names.contains('pages')) { db.close(); continue; }
    const found = {verification: await all(db, 'verification'),
                   pages: await all(db, 'pages', true)};
    db.close();
    return JSON.stringify(found);
  }
  return null;
})()"""


@pytest.fixture(scope="module")
def replaywebpage() -> Path:
    """ReplayWeb.page's files, as ``python -m evidence.testing.replayweb --install`` fetched
    them (the pinned npm package; nothing is fetched while a test runs)."""
    from evidence.testing.replayweb import VERSION, ReplayWebUnavailable, package_dir

    assert VERSION == REPLAYWEBPAGE
    try:
        return package_dir()
    except ReplayWebUnavailable as exc:
        unavailable(str(exc))


class _Handler(SimpleHTTPRequestHandler):
    """ReplayWeb.page's files, and WACZ files with byte ranges (it reads a WACZ in ranges)."""

    waczs: ClassVar[dict[str, Path]] = {}

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _wacz(self, head: bool) -> bool:
        path = self.waczs.get(self.path.split("?")[0])
        if path is None:
            return False
        data = path.read_bytes()
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if wanted:
            start = int(wanted.group(1))
            end = int(wanted.group(2)) if wanted.group(2) else len(data) - 1
            body = data[start:end + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{start + len(body) - 1}/"
                             f"{len(data)}")
        else:
            body = data
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/wacz")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
        return True

    def do_GET(self) -> None:
        if not self._wacz(False):
            super().do_GET()

    def do_HEAD(self) -> None:
        if not self._wacz(True):
            super().do_HEAD()


@pytest.fixture
def site(replaywebpage: Path) -> Iterator[tuple[str, dict[str, Path]]]:
    waczs: ClassVar[dict[str, Path]] = {}
    handler = type("Handler", (_Handler,), {"waczs": waczs})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(
        replaywebpage)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", waczs
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def _verification(url: str) -> dict[str, dict]:
    """What ReplayWeb.page recorded about the WACZ at ``url``, by id, once it has loaded
    the file's pages."""
    base = url.rsplit("/", 1)[0]
    async with Browser() as browser, browser.page() as page:
        await page.send("Page.enable")
        await page.send("Page.navigate", {"url": f"{base}/?source={url}"})
        deadline = time.monotonic() + 90
        found: dict = {}
        while time.monotonic() < deadline:
            text = await page.evaluate(_PROBE)
            found = json.loads(text) if text else {}
            if found.get("pages"):
                return {r["id"]: r for r in found["verification"]}
            await anyio.sleep(0.3)
    raise AssertionError(f"ReplayWeb.page did not load {url} within 90 s: {found}")


@pytest.mark.slow
def test_replaywebpage_verifies_our_signature_and_not_a_tampered_one(genuine, site,  # noqa: F811
                                                                     tmp_path: Path) -> None:
    _store, wacz, pub = genuine
    base, waczs = site
    tamper(wacz, tmp_path / "altered.wacz")
    waczs["/genuine.wacz"], waczs["/altered.wacz"] = wacz, tmp_path / "altered.wacz"
    records = anyio.run(_verification, f"{base}/genuine.wacz")
    assert records.get("signature", {}).get("matched") is True, records
    key = serialization.load_pem_public_key(pub.read_bytes()).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert records["publicKey"]["expected"] == base64.b64encode(key).decode()
    records = anyio.run(_verification, f"{base}/altered.wacz")
    assert records.get("signature", {}).get("matched") is False, records


def test_replaywebpage_does_not_take_up_a_p256_key(genuine, site,  # noqa: F811
                                                   tmp_path: Path) -> None:
    """Why evidence refuses P-256 for the anonymous form: ReplayWeb.page imports the key as
    P-384, fails, and records no key and no verdict."""
    _store, wacz, _pub = genuine
    import zipfile

    with zipfile.ZipFile(wacz) as zf:
        files = {name: zf.read(name) for name in zf.namelist()}
    digest = json.loads(files["datapackage-digest.json"])
    key = ec.generate_private_key(ec.SECP256R1())
    r, s = decode_dss_signature(key.sign(digest["hash"].encode(), ec.ECDSA(hashes.SHA256())))
    digest["signedData"]["signature"] = base64.b64encode(r.to_bytes(32, "big")
                                                         + s.to_bytes(32, "big")).decode()
    digest["signedData"]["publicKey"] = base64.b64encode(key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
    files["datapackage-digest.json"] = json.dumps(digest, indent=2).encode()
    write_zip(tmp_path / "p256.wacz", files)
    base, waczs = site
    waczs["/p256.wacz"] = tmp_path / "p256.wacz"
    records = anyio.run(_verification, f"{base}/p256.wacz")
    assert "datapackageHash" in records, records  # it read the digest file ...
    assert "publicKey" not in records and "signature" not in records, records  # ... no key
