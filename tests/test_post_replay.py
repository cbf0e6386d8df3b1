"""POSTs that replay (issue 33 point 3): a rendered page that loads its data by POST is
exported to a WACZ whose index keys each POST in the post-append form, checked against
cdxj-indexer and pywb's own indexer, and replayed by ``evidence replay --serve`` (pywb) and
by ReplayWeb.page in headless Chromium: the POSTs' answers appear, and a GET of the same
URL is not answered with them. The request records hold exactly the bytes sent."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import anyio
import pytest

from evidence import ArtifactRef, CrawlConfig, Crawler, CrawlOptions, Store
from evidence._archive.wacz import export_wacz
from evidence._archive.warc import export_warc
from evidence._crawl.browser import Browser

from .conftest import replayed_in_replaywebpage
from .postsite import PostSite
from .test_replayserve import serve, stop

ROOT = Path(__file__).resolve().parent.parent
ANSWERS = {"alpha": "answer to q=alpha", "beta": "answer to q=beta"}
PROBE = ("(() => { const a = document.querySelector('#alpha'), "
         "b = document.querySelector('#beta'); return a && b ? "
         "{alpha: a.textContent, beta: b.textContent} : null; })()")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "ignore", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


@pytest.fixture(scope="module")
def posted(tmp_path_factory: pytest.TempPathFactory, chromium: str) -> Path:
    path = tmp_path_factory.mktemp("post") / "s"
    with PostSite() as site, Store.create(path) as store:
        crawler = Crawler(store, CrawlConfig(seeds=[site.url], render=True),
                          CrawlOptions(workers=2))
        assert anyio.run(crawler.run).session_completed
        assert site.hits["POST", "/api"] == 2 and site.hits["GET", "/api"] == 0
    return path  # the site has stopped: every answer below comes from the capture


@pytest.fixture(scope="module")
def package(posted: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("postwacz")
    with Store.open(posted) as store:
        export_wacz(store, out / "site.wacz")
    with zipfile.ZipFile(out / "site.wacz") as zf:
        zf.extractall(out / "unpacked")
    return out


def test_request_records_hold_exactly_the_bytes_sent(posted: Path, tmp_path: Path) -> None:
    from warcio.archiveiterator import ArchiveIterator

    with Store.open(posted) as store:
        export_warc(store, tmp_path / "x.warc")
        sent = {attempt: store.artifacts.read(ArtifactRef(ns, digest, size)) for
                attempt, ns, digest, size in store.connection.execute(
                    "SELECT f.attempt_id, a.namespace, a.digest, a.size FROM fetch_attempt f "
                    "JOIN artifact a ON a.artifact_id = f.request_headers_id").fetchall()}
    blocks = {}
    with open(tmp_path / "x.warc", "rb") as f:
        for record in ArchiveIterator(f, no_record_parse=True):
            if record.rec_type == "request":
                block = record.raw_stream.read()
                assert len(block) == int(record.rec_headers.get_header("Content-Length"))
                blocks[record.rec_headers.get_header("Evidence-Attempt-ID")] = block
    assert blocks and blocks == {a: sent[a] for a in blocks}  # byte for byte, nothing added
    posts = [b for b in blocks.values() if b.startswith(b"POST ")]
    assert sorted(p.rsplit(b"\r\n\r\n", 1)[1] for p in posts) == [b"q=alpha", b"q=beta"]


def test_the_index_is_what_cdxj_indexer_writes_with_post_append(package: Path) -> None:
    unpacked = package / "unpacked"
    # As py-wacz runs it: POSTs appended, each line's record digest, gzip members of
    # 1,024 lines with their own digests in the .idx.
    done = run("-m", "cdxj_indexer.main", "--post-append", "--sort", "--digest-records",
               "--compress", "ref.cdx.gz", "--lines", "1024", "-o", "ref.idx",
               "archive/data.warc.gz", cwd=unpacked)
    assert done.returncode == 0, done.stderr
    ours = unpacked / "indexes"
    assert (unpacked / "ref.cdx.gz").read_bytes() == (ours / "index.cdx.gz").read_bytes()
    ref_idx = (unpacked / "ref.idx").read_text().replace('"ref.cdx.gz"', '"index.cdx.gz"')
    assert ref_idx == (ours / "index.idx").read_text()
    lines = gzip.decompress((ours / "index.cdx.gz").read_bytes()).decode().splitlines()
    keys = {line.split(" ")[0].split(")", 1)[1]: json.loads(line.split(" ", 2)[2])
            for line in lines if not line.startswith("urn:")}
    alpha = keys["/api?__wb_method=post&__wb_post_data=ct1hbhboyq=="]  # text/plain: base64
    beta = keys["/api?__wb_method=post&q=beta"]  # a form: its arguments
    assert (alpha["method"], alpha["requestBody"]) == ("POST", "__wb_post_data=cT1hbHBoYQ==")
    assert (beta["method"], beta["requestBody"]) == ("POST", "q=beta")
    assert "/api" not in keys  # no GET was captured, and no POST is keyed as one


def test_pywbs_own_indexer_keys_the_posts_the_same(package: Path) -> None:
    unpacked = package / "unpacked"
    done = run("-m", "pywb.indexer.cdxindexer", "--postappend", "--cdxj", "--sort", "-o",
               "pywb.cdxj", "archive/data.warc.gz", cwd=unpacked)
    assert done.returncode == 0, done.stderr
    theirs = (unpacked / "pywb.cdxj").read_text().splitlines()
    ours = gzip.decompress((unpacked / "indexes" / "index.cdx.gz").read_bytes()
                           ).decode().splitlines()

    def keyed(lines: list[str]) -> list[tuple[str, str, str, str | None, str | None]]:
        made = []
        for line in lines:
            key, ts, text = line.split(" ", 2)
            entry = json.loads(text)
            made.append((key, ts, entry["offset"], entry.get("method"),
                         entry.get("requestBody")))
        return sorted(made)

    assert keyed(theirs) == keyed(ours)
    assert sum(1 for k in keyed(ours) if k[3] == "POST") == 2


def test_the_compressed_index_in_members_of_n_lines_matches_cdxj_indexer(
        package: Path) -> None:
    from evidence._archive.cdxj import compressed_index

    unpacked = package / "unpacked"
    lines = gzip.decompress((unpacked / "indexes" / "index.cdx.gz").read_bytes()
                            ).decode().splitlines()
    # cdxj-indexer writes an extra empty member when the count is a multiple of N, so N
    # here leaves a partial last member.
    per = next(n for n in (3, 4, 5) if len(lines) % n)
    done = run("-m", "cdxj_indexer.main", "--post-append", "--sort", "--digest-records",
               "--compress", "small.cdx.gz", "--lines", str(per), "-o", "small.idx",
               "archive/data.warc.gz", cwd=unpacked)
    assert done.returncode == 0, done.stderr
    data, idx = compressed_index(lines, "small.cdx.gz", per)
    assert data == (unpacked / "small.cdx.gz").read_bytes()
    assert idx == (unpacked / "small.idx").read_bytes()
    entries = [json.loads(x.split(" ", 2)[2]) for x in idx.decode().splitlines()[1:]]
    assert len(entries) == -(-len(lines) // per)
    for entry in entries:  # each member is a gzip stream of its own, read by offset alone
        member = data[entry["offset"]:entry["offset"] + entry["length"]]
        assert len(gzip.GzipFile(fileobj=io.BytesIO(member)).read().splitlines()) <= per


async def _replayed(url: str) -> dict | None:
    """Open a pywb replay URL and read the replayed page (in pywb's frame)."""
    inner = "document.querySelector('iframe') && document.querySelector('iframe').contentDocument"
    probe = f"(() => {{ const d = {inner}; if (!d) return null; " + PROBE.replace(
        "document.", "d.").removeprefix("(() => { ")
    async with Browser() as browser, browser.page() as page:
        await page.send("Page.navigate", {"url": url})
        with anyio.move_on_after(60):
            while not (state := await page.evaluate(probe)):
                await anyio.sleep(0.2)
            return state
    return None


@pytest.mark.slow
def test_replay_serve_answers_each_post_with_its_own_capture_and_no_get(
        package: Path) -> None:
    import httpx

    proc, info = serve(package / "site.wacz")
    try:
        page = next(p for p in info["pages"] if p["url"].endswith(":" + p["url"].split(":")[2]
                                                                  .split("/")[0] + "/"))
        state = anyio.run(_replayed, page["replay_url"])
        api = page["replay_url"].replace("/http", "mp_/http", 1) + "api"
        get = httpx.get(api, timeout=30)
        post = httpx.post(api, content=b"q=beta", timeout=30,
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    finally:
        assert stop(proc) == 0
    assert state == ANSWERS
    assert post.status_code == 200 and post.text == ANSWERS["beta"]
    assert "answer to" not in get.text and get.status_code == 404


def test_replaywebpage_answers_each_post_from_the_wacz(package: Path, chromium: str) -> None:
    with zipfile.ZipFile(package / "site.wacz") as zf:
        pages = [json.loads(x) for x in zf.read("pages/pages.jsonl").splitlines()[1:]]
    home = next(p for p in pages if p["url"].count("/") == 3 and p["url"].endswith("/"))
    state = replayed_in_replaywebpage(package / "site.wacz", home["url"], PROBE)
    assert state == ANSWERS
