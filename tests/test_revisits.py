"""Revisit records (issue 33 point 5): a payload already written in the same export is a
``revisit`` record (identical-payload-digest), and a page an incremental session found
unchanged by a 304 is one too (server-not-modified); warcio reads and checks them,
cdxj-indexer indexes them as we do, and ``evidence replay --serve`` (pywb) still shows
the page at the revisit's time."""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import hashlib
import io
import subprocess
import sys
import tempfile
import time
import types
import zipfile
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from evidence import ArtifactRef, CrawlConfig, Crawler, CrawlOptions, Store
from evidence._archive.cdxj import timestamp14
from evidence._archive.wacz import export_wacz
from evidence._archive.warc import export_warc
from evidence._demo.site import SiteConfig, TestSite

from .test_replayserve import serve, stop

IDENTICAL_PAYLOAD = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
SERVER_NOT_MODIFIED = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
UNVALIDATED = "/p/1"  # served without ETag or Last-Modified: fetched whole again, same bytes


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "ignore", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


@pytest.fixture(scope="module")
def twice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site crawled, then crawled again by an incremental session with nothing changed:
    validated pages answer 304, the unvalidated one its same bytes."""
    path = tmp_path_factory.mktemp("revisit") / "s"
    with TestSite(SiteConfig(pages=4, unvalidated={UNVALIDATED})) as site:
        for session in range(2):
            if session:  # index times are whole seconds: the second session gets its own
                second = int(time.time())
                while int(time.time()) == second:
                    time.sleep(0.05)
            with Store.create(path) as store:
                report = anyio.run(Crawler(store, CrawlConfig(seeds=[site.url]),
                                           CrawlOptions(workers=2)).run)
                assert report.session_completed
    return path


@pytest.fixture(scope="module")
def warc(twice: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("revisit-warc") / "x.warc.gz"
    with Store.open(twice) as store:
        report = export_warc(store, out)
    return out, report


def _records(path: Path) -> list:
    from warcio.archiveiterator import ArchiveIterator

    made = []
    with open(path, "rb") as f:
        for record in ArchiveIterator(f):
            made.append((record.rec_type, dict(record.rec_headers.headers),
                         record.http_headers.get_statuscode() if record.http_headers else None,
                         record.content_stream().read()))
    return made


def test_a_304_and_a_repeated_payload_are_revisit_records_naming_their_original(
        twice: Path, warc, capsys: pytest.CaptureFixture[str]) -> None:
    from warcio.checker import Checker

    path, report = warc
    records = _records(path)
    responses = {h["WARC-Record-ID"]: (h, status, content) for kind, h, status, content
                 in records if kind == "response"}
    revisits = [(h, status, content) for kind, h, status, content in records
                if kind == "revisit"]
    assert report.revisits == len(revisits) > 0
    profiles = {h["WARC-Profile"] for h, _s, _c in revisits}
    assert profiles == {IDENTICAL_PAYLOAD, SERVER_NOT_MODIFIED}
    with Store.open(twice) as store:
        heads = {attempt: store.artifacts.read(ArtifactRef(ns, digest, size)) for
                 attempt, ns, digest, size in store.connection.execute(
                     "SELECT f.attempt_id, a.namespace, a.digest, a.size FROM fetch_attempt f "
                     "JOIN artifact a ON a.artifact_id = f.response_headers_id").fetchall()}
    for headers, status, content in revisits:
        original, _status, original_content = responses[headers["WARC-Refers-To"]]
        assert headers["WARC-Refers-To-Target-URI"] == original["WARC-Target-URI"]
        assert headers["WARC-Refers-To-Date"] == original["WARC-Date"] < headers["WARC-Date"]
        assert headers["WARC-Payload-Digest"] == original["WARC-Payload-Digest"]
        assert content == b"" and original_content  # the payload is written once
        assert headers["Content-Length"] == str(len(heads[headers["Evidence-Attempt-ID"]]))
        if headers["WARC-Profile"] == SERVER_NOT_MODIFIED:
            assert status == "304"  # the head as the server sent it
            assert headers["WARC-Target-URI"] == original["WARC-Target-URI"]
    # The unvalidated page came whole again, the same bytes (redirects and 404s too).
    assert any(h["WARC-Profile"] == IDENTICAL_PAYLOAD and status == "200"
               and h["WARC-Target-URI"].endswith(UNVALIDATED) for h, status, _c in revisits)
    capsys.readouterr()
    assert Checker(types.SimpleNamespace(inputs=[str(path)], verbose=True)).process_all() == 0
    printed = capsys.readouterr().out
    # warcio checks every block but a revisit's; that one is checked here, over the head.
    assert printed.count("digest pass") == len(records) - len(revisits)
    assert printed.count("not checked (revisit)") == len(revisits)
    for headers, _status, _content in revisits:
        head = heads[headers["Evidence-Attempt-ID"]]
        assert headers["WARC-Block-Digest"] == "sha256:" + base64.b32encode(
            hashlib.sha256(head).digest()).decode()


def test_the_wacz_index_of_revisits_is_what_cdxj_indexer_writes(twice: Path,
                                                                tmp_path: Path) -> None:
    with Store.open(twice) as store:
        report = export_wacz(store, tmp_path / "x.wacz")
        again = export_wacz(store, tmp_path / "again.wacz")
    assert report.sha256 == again.sha256 and report.revisits > 0
    with zipfile.ZipFile(tmp_path / "x.wacz") as zf:
        zf.extractall(tmp_path / "u")
    done = run("-m", "cdxj_indexer.main", "--post-append", "--sort", "--digest-records",
               "--compress", "index.cdx.gz", "--lines", "1024", "-o", "index.idx",
               "archive/data.warc.gz", cwd=tmp_path / "u")
    assert done.returncode == 0, done.stderr
    for name in ("index.cdx.gz", "index.idx"):
        assert (tmp_path / "u" / name).read_bytes() == (
            tmp_path / "u" / "indexes" / name).read_bytes()
    lines = gzip.decompress((tmp_path / "u" / "indexes" / "index.cdx.gz").read_bytes())
    assert lines.count(b'"mime": "warc/revisit"') == report.revisits


def test_replay_serve_shows_the_page_at_the_time_of_each_revisit(twice: Path,
                                                                 tmp_path: Path) -> None:
    import httpx

    with Store.open(twice) as store:
        export_wacz(store, tmp_path / "x.wacz")
        latest = store.connection.execute(
            "SELECT f.url, f.started_at, f.http_status FROM fetch_attempt f WHERE f.attempt_seq ="
            " (SELECT max(g.attempt_seq) FROM fetch_attempt g WHERE g.url = f.url) AND "
            "f.url LIKE '%/p/%'").fetchall()
        first = dict(store.connection.execute(
            "SELECT url, min(attempt_seq) FROM fetch_attempt GROUP BY url").fetchall())
        bodies = {url: store.connection.execute(
            "SELECT a.namespace, a.digest, a.size FROM fetch_attempt f JOIN artifact a ON "
            "a.artifact_id = f.body_id WHERE f.attempt_seq = ?", (first[url],)).fetchall()[0]
            for url, _t, _s in latest}
        bodies = {url: store.artifacts.read(ArtifactRef(*ref)) for url, ref in bodies.items()}
    assert {status for _u, _t, status in latest} == {200, 304}
    proc, info = serve(tmp_path / "x.wacz")
    try:
        answers = {url: httpx.get(f"{info['url']}{timestamp14(ts)}id_/{url}", timeout=30)
                   for url, ts, _status in latest}
    finally:
        assert stop(proc) == 0
    for url, answer in answers.items():
        assert answer.status_code == 200, url
        assert answer.content == bodies[url], url  # id_: the payload as captured


# --- property: any sequence of attempts ------------------------------------------------------

_BODIES = [b"", b"<p>one</p>", b"<p>two</p>", b"<p>three</p>"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["/a", "/b", "/c"]), st.sampled_from([200, 304, 404]),
                          st.integers(0, len(_BODIES) - 1), st.booleans()),
                min_size=1, max_size=10))
# /b's 200 repeats /a's body, so it is itself a revisit of /a's record; its 304 then names
# /a's record, which holds the payload of /b's last 2xx (a run of the suite found it).
@example([("/a", 200, 1, False), ("/b", 200, 1, False), ("/b", 304, 0, False)])
# /b's last 2xx is empty: its 304 names no older capture (it stays a response record).
@example([("/b", 200, 1, False), ("/b", 200, 0, False), ("/b", 304, 0, False)])
def test_any_sequence_of_attempts_writes_each_payload_once_and_revisits_point_back(
        attempts: list[tuple[str, int, int, bool]]) -> None:
    """Whatever the URLs, statuses, bodies and cuts: every non-empty whole body is in
    exactly one response record; every revisit names a response record before it with its
    payload digest (a 304 the one holding its own URL's last 2xx payload); the content of
    every response is its body."""
    from warcio.archiveiterator import ArchiveIterator

    from .conftest import Factory, submit_all

    with tempfile.TemporaryDirectory() as tmp, Store.create(Path(tmp) / "s",
                                                            sync="normal") as store:
        make = Factory(store)
        messages = [make.session(), make.run()]
        for seq, (path, status, body, cut) in enumerate(attempts):
            content = b"" if status == 304 else _BODIES[body]
            head = (f"HTTP/1.1 {status} X\r\nContent-Length: {len(content)}\r\n\r\n").encode()
            messages.append(make.attempt(
                f"http://example.com{path}", sequence=seq, http_status=status,
                started_at=make.now + dt.timedelta(seconds=seq),
                response_headers=store.artifacts.put("headers", head),
                body=make.body(content) if content else None,
                body_truncated=cut and bool(content), capture="wire"))
        submit_all(store, messages)
        export_warc(store, Path(tmp) / "x.warc")
        export_warc(store, Path(tmp) / "y.warc")
        assert (Path(tmp) / "x.warc").read_bytes() == (Path(tmp) / "y.warc").read_bytes()
        seen: dict[str, dict] = {}
        last_2xx: dict[str, str] = {}  # URL -> the payload digest of its last 2xx record
        whole_bodies: list[bytes] = []
        with open(Path(tmp) / "x.warc", "rb") as f:
            for record in ArchiveIterator(f):
                headers = dict(record.rec_headers.headers)
                content = record.content_stream().read()
                if record.rec_type == "response":
                    seen[headers["WARC-Record-ID"]] = headers
                    if content and "WARC-Truncated" not in headers:
                        whole_bodies.append(content)
                elif record.rec_type == "revisit":
                    original = seen[headers["WARC-Refers-To"]]  # written before it
                    assert headers["WARC-Payload-Digest"] == original["WARC-Payload-Digest"]
                    assert headers["WARC-Refers-To-Target-URI"] == original["WARC-Target-URI"]
                    assert content == b""
                    if headers["WARC-Profile"] == SERVER_NOT_MODIFIED:
                        assert record.http_headers.get_statuscode() == "304"
                        assert headers["WARC-Payload-Digest"] == last_2xx[
                            headers["WARC-Target-URI"]]
                if record.rec_type in ("response", "revisit") and record.http_headers \
                        .get_statuscode().startswith("2") and "WARC-Payload-Digest" in headers:
                    last_2xx[headers["WARC-Target-URI"]] = headers["WARC-Payload-Digest"]
    assert len(whole_bodies) == len(set(whole_bodies))  # each payload once
    written = {_BODIES[b] for _p, s, b, cut in attempts if s != 304 and _BODIES[b] and not cut}
    assert set(whole_bodies) == written


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([b"POST", b"PUT", b"DELETE", b"GET", b"PATCH"]),
       st.sampled_from([b"", b"Content-Type: application/json\r\n",
                        b"Content-Type: multipart/form-data; boundary=xx\r\n",
                        b"Content-Type: application/x-www-form-urlencoded\r\n",
                        b"Content-Type: text/plain\r\n", b"Content-Length: 3\r\n",
                        b"Content-Length: nope\r\n"]), st.binary(max_size=200))
def test_any_request_bytes_give_a_key_and_never_raise(method: bytes, field: bytes,
                                                      body: bytes) -> None:
    from evidence._archive.cdxj import index_line, method_query
    from evidence._model.http1 import header, parse_head

    request = method + b" /api HTTP/1.1\r\nHost: x\r\n" + field + b"\r\n" + body
    query = method_query(request)
    if method == b"GET":
        assert query is None
        return
    assert query is not None and query.method == method.decode()
    assert query.suffix.startswith(f"__wb_method={method.decode()}")
    assert query.body is None or len(query.body) <= 4096
    line = index_line(url="http://x/api", date="2024-01-02T03:04:05Z", mime=None, status=200,
                      digest=None, length=1, offset=0, filename="f", method=query)
    key = line.split(" ")[0]
    assert key.startswith("x)/api?") and "__wb_method=" + method.decode().lower() in key
    if method in (b"POST", b"PUT"):  # the oracle: cdxj-indexer's own reading of the body
        from cdxj_indexer.postquery import append_method_query

        _status, fields = parse_head(request)
        kind, length = header(fields, b"content-type"), header(fields, b"content-length")
        try:
            _q, theirs = append_method_query(
                method.decode(), kind and kind.decode("latin-1"),
                length and length.decode("latin-1"), io.BytesIO(body), "http://x/api")
        except Exception:  # its multipart parser raises on a malformed body; ours never does
            return
        assert "?" + query.suffix == theirs


@pytest.mark.parametrize("body", [
    b'--xx\r\nContent-Disposition: form-data; name="q"\r\n\r\nalpha beta\r\n'
    b'--xx\r\nContent-Disposition: form-data; name="f"; filename="a.bin"\r\n'
    b'Content-Type: application/octet-stream\r\n\r\n\x00\xff&=\r\n--xx--\r\n',
    b'--xx\r\nContent-Disposition: form-data; name="caf\xc3\xa9"\r\n\r\n\xc3\xa9\r\n--xx--\r\n',
])
def test_multipart_forms_are_keyed_as_cdxj_indexer_keys_them(body: bytes) -> None:
    from cdxj_indexer.postquery import append_method_query

    from evidence._archive.cdxj import method_query

    request = (b"POST /f HTTP/1.1\r\nContent-Type: multipart/form-data; boundary=xx\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body)
    query = method_query(request)
    _q, theirs = append_method_query("POST", "multipart/form-data; boundary=xx",
                                     str(len(body)), io.BytesIO(body), "http://x/f")
    assert query is not None and "?" + query.suffix == theirs
