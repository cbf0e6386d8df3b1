"""HTTP/2 in the crawler, recorded exactly (issue 33, point 2).

Hypercorn serves a tiny ASGI app over TLS on 127.0.0.1 (``tests/h2site.py``), offering h2
and HTTP/1.1, or h2 only (refusing HTTP/1.1 with 505). A crawl negotiates h2 by ALPN and
records each exchange as the frames of its stream, from which ``_model.http2`` derives
the head and body stored beside them; ``--http1-only`` keeps HTTP/1.1. The WARC export
writes h2 exchanges with ``WARC-Protocol: h2`` and an HTTP/1-style head that warcio and
pywb's indexer read; the WACZ validates; ``replay --serve`` (pywb) replays the page.
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import hpack
import pytest
from hyperframe.frame import DataFrame, HeadersFrame
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence import ArtifactRef, CrawlConfig, Crawler, CrawlOptions, Store, verify
from evidence._archive.archive import restore
from evidence._archive.export import export
from evidence._archive.wacz import export_wacz
from evidence._archive.warc import export_warc
from evidence._audit.replay import replay
from evidence._cli.main import main as cli_main
from evidence._crawl.http import Exchange, crawl_client
from evidence._model import http2
from evidence._model.http1 import derive_content
from evidence._model.messages import FetchAttempt, decode_message

from .conftest import Factory, new_pg_database, replayed_in_replaywebpage, submit_all
from .h2site import DATA, PAGE, TEXT, H2Site

ROOT = Path(__file__).resolve().parent.parent


def crawl(site: H2Site, path: Path, **config: object) -> Path:
    config.setdefault("seeds", [site.url])
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SSL_CERT_FILE", str(site.ca_file))  # the crawler trusts the test CA
        with Store.create(path) as store:
            crawler = Crawler(store, CrawlConfig(**config),  # type: ignore[arg-type]
                              CrawlOptions(workers=2))
            assert anyio.run(crawler.run).session_completed
    return path


def recorded(path: Path) -> dict[str, FetchAttempt]:
    """Each page's attempt, by URL, as its ledger entry says."""
    with Store.open(path, read_only=True) as store:
        rows = store.connection.execute(
            "SELECT payload FROM ingest_ledger WHERE kind = 'fetch_attempt'").fetchall()
    found = {}
    for (payload,) in rows:
        message = decode_message(payload)
        assert isinstance(message, FetchAttempt)
        found[message.url] = message
    return found


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[H2Site]:
    with H2Site(tmp_path_factory.mktemp("both"), h2_only=False) as site:
        yield site


@pytest.fixture(scope="module")
def h2_store(both: H2Site, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return crawl(both, tmp_path_factory.mktemp("h2") / "store")


def test_a_crawl_speaks_h2_and_stores_each_streams_frames(h2_store: Path, both: H2Site) -> None:
    attempts = recorded(h2_store)
    assert set(attempts) == {both.url + p for p in ("robots.txt", "", "data", "gz")}
    assert {("2", p) for p in ("/robots.txt", "/", "/data", "/gz")} <= set(both.seen)
    with Store.open(h2_store, read_only=True) as store:
        read = store.artifacts.read
        for url, attempt in attempts.items():
            assert attempt.protocol == "h2" and attempt.capture == "wire"
            assert attempt.connection and attempt.connection.tls
            assert attempt.connection.tls.alpn == "h2"
            assert attempt.frames is not None and attempt.frames.namespace == "frames"
            frames = read(attempt.frames)
            # The head and body stored are the ones derived from the frames, byte for byte.
            split = http2.split_response(frames)
            assert split.complete
            assert read(attempt.response_headers) == split.head  # type: ignore[arg-type]
            assert read(attempt.body) == split.body  # type: ignore[arg-type]
            assert split.head.startswith(b"HTTP/2 ")
            # The request is what was written: the stream's frames, one HEADERS first.
            sent = read(attempt.request_headers)  # type: ignore[arg-type]
            first, _ = http2.frames(sent)
            assert isinstance(first[0].frame, HeadersFrame)
            message = http2.request_message(sent)
            target = "/" + url.removeprefix(both.url)
            assert message.startswith(f"GET {target} HTTP/2\r\nhost: 127.0.0.1:".encode())
            assert b"\r\nuser-agent: evidence/" in message
        page, data, gz = (attempts[both.url + p] for p in ("", "data", "gz"))
        assert read(page.body) == PAGE and page.content is None  # type: ignore[arg-type]
        # 68 KiB came in more than one DATA frame: the body is their payloads joined.
        assert read(data.body) == DATA  # type: ignore[arg-type]
        parsed, _ = http2.frames(read(data.frames))  # type: ignore[arg-type]
        assert sum(isinstance(f.frame, DataFrame) for f in parsed) > 1
        # A gzip-coded body: the content is derived from it, as for HTTP/1.1.
        assert gz.content_coding == "gzip" and read(gz.content) == TEXT  # type: ignore[arg-type]
        assert derive_content(read(gz.response_headers), read(gz.body),  # type: ignore[arg-type]
                              1 << 20).data == TEXT
        assert verify(store, full=True).ok


def test_replay_json_names_the_protocol_and_alpn(h2_store: Path, both: H2Site,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["replay", str(h2_store), both.url + "gz", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["protocol"] == "h2" and found["frames_ref"]["namespace"] == "frames"
    assert found["connection"]["tls"]["alpn"] == "h2"
    with Store.open(h2_store, read_only=True) as store:
        assert replay(store, both.url + "gz", content=True).content == TEXT


def test_http1_only_keeps_http11(both: H2Site, tmp_path: Path) -> None:
    before = len(both.seen)
    path = crawl(both, tmp_path / "store", http1_only=True)
    attempts = recorded(path)
    assert {a.protocol for a in attempts.values()} == {"http/1.1"}
    assert {a.connection.tls.alpn for a in attempts.values()  # type: ignore[union-attr]
            } == {"http/1.1"}
    assert all(a.frames is None for a in attempts.values())
    assert {v for v, _ in both.seen[before:]} == {"1.1"}
    with Store.open(path, read_only=True) as store:
        page = attempts[both.url]
        assert store.artifacts.read(page.request_headers).startswith(  # type: ignore[arg-type]
            b"GET / HTTP/1.1\r\n")


def test_http1_only_is_a_flag_and_a_config_key(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s")
    (tmp_path / "c.toml").write_text(f'store = "{store}"\nseeds = ["https://127.0.0.1:1/"]\n'
                                     'http1_only = true\n')
    assert cli_main(["crawl", "--config", str(tmp_path / "c.toml"), "--print-config"]) == 0
    assert "http1_only = true" in capsys.readouterr().out
    assert cli_main(["crawl", "https://127.0.0.1:1/", "--store", store, "--http1-only",
                     "--print-config"]) == 0
    assert "http1_only = true" in capsys.readouterr().out
    assert not (tmp_path / "s").exists()


def test_a_server_that_refuses_http11_is_crawlable(tmp_path: Path) -> None:
    with H2Site(tmp_path, h2_only=True) as site:
        path = crawl(site, tmp_path / "store")
        attempts = recorded(path)
        page = attempts[site.url]
        assert (page.http_status, page.protocol) == (200, "h2")
        assert {site.url + "data", site.url + "gz"} <= set(attempts)
        assert {v for v, _ in site.seen} == {"2"}


def test_streams_share_one_connection_per_origin(both: H2Site) -> None:
    async def main() -> list[Exchange]:
        exchanges = [Exchange("GET") for _ in range(6)]
        async with crawl_client(connections=6, timeout=20) as client:
            async def one(exchange: Exchange, path: str) -> None:
                response = await client.send("GET", both.url + path, {}, exchange)
                assert (await response.read_body(1 << 20))[0] == "response"

            async with anyio.create_task_group() as group:
                for exchange, path in zip(exchanges, ["data", "gz", "", "data", "gz", ""],
                                          strict=True):
                    group.start_soon(one, exchange, path)
        return exchanges

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SSL_CERT_FILE", str(both.ca_file))
        exchanges = anyio.run(main)
    ports = {e.peer.local_port for e in exchanges}  # type: ignore[union-attr]
    assert len(ports) == 1  # one connection, six streams
    assert sorted(e.reused for e in exchanges) == [False] + [True] * 5
    ids = set()
    for exchange in exchanges:
        parsed, _ = http2.frames(exchange.received)
        stream_ids = {f.frame.stream_id for f in parsed}
        assert len(stream_ids) == 1  # each exchange holds its own stream's frames only
        ids |= stream_ids
    assert len(ids) == 6
    assert [e.split().body for e in exchanges][:3] == [DATA, gzip.compress(TEXT, mtime=0),
                                                        PAGE]


def test_a_body_over_the_cap_resets_its_stream_not_the_connection(both: H2Site) -> None:
    async def main() -> tuple[Exchange, Exchange, tuple[object, ...]]:
        cut, after = Exchange("GET"), Exchange("GET")
        async with crawl_client(connections=2, timeout=20) as client:
            response = await client.send("GET", both.url + "data", {}, cut)
            outcome = await response.read_body(1000)
            response = await client.send("GET", both.url + "gz", {}, after)
            assert (await response.read_body(1 << 20))[0] == "response"
        return cut, after, outcome

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SSL_CERT_FILE", str(both.ca_file))
        cut, after, outcome = anyio.run(main)
    assert outcome[0] == "too_large" and outcome[2] is True
    assert not cut.split().complete and DATA.startswith(cut.split().body)
    sent, _ = http2.frames(cut.sent)
    assert type(sent[-1].frame).__name__ == "RstStreamFrame"  # the client's CANCEL, recorded
    assert after.reused and after.peer.local_port == cut.peer.local_port  # type: ignore[union-attr]
    assert after.split().complete


def test_the_warc_has_h2_records_warcio_and_pywb_read(h2_store: Path, both: H2Site,
                                                      tmp_path: Path) -> None:
    from warcio.archiveiterator import ArchiveIterator

    with Store.open(h2_store, read_only=True) as store:
        export_warc(store, tmp_path / "out.warc.gz")
    records = {}
    with open(tmp_path / "out.warc.gz", "rb") as f:
        for record in ArchiveIterator(f, check_digests=True):
            if record.rec_type in ("response", "request"):
                uri = record.rec_headers.get_header("WARC-Target-URI")
                records[record.rec_type, uri] = (record.rec_headers, record.http_headers,
                                                 record.content_stream().read())
    for (_kind, _uri), (headers, _http, _content) in records.items():
        assert headers.get_header("WARC-Protocol") == "h2"
    _, http, content = records["response", both.url + "gz"]
    assert http.get_statuscode() == "200" and content == TEXT  # warcio decodes the gzip
    # An HTTP/1.1-style head (the start line pywb requires), its fields as decoded.
    assert http.statusline == "200 OK" and http.protocol == "HTTP/1.1"
    assert http.get_header("content-encoding") == "gzip"
    assert http.get_header("x-served-over") == "2"
    _, http, content = records["response", both.url + "data"]
    assert content == DATA
    _, http, _ = records["request", both.url]
    assert http.protocol == "GET" and http.get_header("user-agent").startswith("evidence/")
    # pywb's own indexer reads the records as HTTP: each response indexed with its status.
    done = subprocess.run([sys.executable, "-W", "ignore", "-m", "pywb.indexer.cdxindexer",
                           "--cdxj", "-o", "index.cdxj", "out.warc.gz"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    entries = [json.loads(line.split(" ", 2)[2])
               for line in (tmp_path / "index.cdxj").read_text().splitlines()]
    statuses = {e["url"]: e.get("status") for e in entries}
    assert statuses[both.url + "gz"] == "200" and statuses[both.url] == "200"
    assert statuses[both.url + "data"] == "200"


def test_the_wacz_validates_and_replays_in_pywb(h2_store: Path, both: H2Site,
                                                tmp_path: Path) -> None:
    with Store.open(h2_store, read_only=True) as store:
        export_wacz(store, tmp_path / "site.wacz")
    done = subprocess.run([sys.executable, "-m", "wacz", "validate", "-f",
                           str(tmp_path / "site.wacz")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0 and "Validation succeeded" in done.stdout, done.stderr
    with zipfile.ZipFile(tmp_path / "site.wacz") as zf:
        index = gzip.decompress(zf.read("indexes/index.cdx.gz")).decode()
        warc = zf.read("archive/data.warc.gz")
    assert '"status": "200"' in index
    from warcio.archiveiterator import ArchiveIterator

    protocols = {r.rec_headers.get_header("WARC-Protocol")
                 for r in ArchiveIterator(io.BytesIO(warc)) if r.rec_type == "response"}
    assert protocols == {"h2"}  # what the replay below serves was captured over h2
    proc = subprocess.Popen([sys.executable, "-m", "evidence", "replay", str(h2_store),
                             "--serve", "--port", "0", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        page, = (p for p in info["pages"] if p["url"] == both.url)
        # The page as captured (pywb's id_ mode: the bytes, not rewritten), and a resource.
        raw = page["replay_url"].replace(f"/{page['ts']}/", f"/{page['ts']}id_/")
        with urllib.request.urlopen(raw, timeout=60) as r:
            assert r.status == 200 and r.read() == PAGE
        with urllib.request.urlopen(raw + "gz", timeout=60) as r:
            assert r.status == 200 and r.read() == TEXT  # pywb removes the gzip for urllib
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def test_the_wacz_of_an_h2_crawl_replays_in_replaywebpage_and_indexes_with_cdxj_indexer(
        h2_store: Path, both: H2Site, tmp_path: Path, chromium: str) -> None:
    """The issue's last check: a WACZ of a TLS site crawled over h2 is indexed by
    cdxj-indexer as its own index says, and ReplayWeb.page (headless Chromium, served on
    127.0.0.1) shows the page captured over h2."""
    wacz = tmp_path / "site.wacz"
    with Store.open(h2_store, read_only=True) as store:
        export_wacz(store, wacz)
    with zipfile.ZipFile(wacz) as zf:
        (tmp_path / "data.warc.gz").write_bytes(zf.read("archive/data.warc.gz"))
        ours = gzip.decompress(zf.read("indexes/index.cdx.gz")).decode()
    # As py-wacz runs it: the same compressed index, byte for byte.
    done = subprocess.run([sys.executable, "-W", "ignore", "-m", "cdxj_indexer.main",
                           "--post-append", "--sort", "--digest-records", "--compress",
                           "ref.cdx.gz", "--lines", "1024", "-o", "ref.idx", "data.warc.gz"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert gzip.decompress((tmp_path / "ref.cdx.gz").read_bytes()).decode() == ours
    assert both.url.replace("https://", "").split("/")[0].split(":")[0] in ours
    shown = replayed_in_replaywebpage(wacz, both.url,
                                      "document.title + ' ' + document.links.length",
                                      ready=lambda v: v == "Over h2 2")
    assert shown == "Over h2 2"


def test_the_render_proxy_speaks_h2_to_the_server(both: H2Site, tmp_path: Path,
                                                  chromium: str) -> None:
    before = len(both.seen)
    path = crawl(both, tmp_path / "store", render=True, max_depth=0,
                 seeds=[both.url + "scripted"])
    with Store.open(path, read_only=True) as store:
        (outcome, dom_ns, dom_digest, dom_size), = store.connection.execute(
            "SELECT r.outcome, a.namespace, a.digest, a.size FROM render r "
            "JOIN artifact a ON a.artifact_id = r.dom_id").fetchall()
        assert outcome == "rendered"
        dom = store.artifacts.read(ArtifactRef(dom_ns, dom_digest, dom_size)).decode()
        assert f"loaded {len(DATA)}" in dom  # the script's fetch was answered over h2
        made = store.connection.execute(
            "SELECT url, protocol, tls_alpn, http_status FROM fetch_attempt "
            "WHERE render_seq IS NOT NULL").fetchall()
        assert (both.url + "data", "h2", "h2", 200) in made
        assert verify(store, full=True).ok
    assert ("2", "/data") in both.seen[before:]


def test_verify_full_finds_a_head_its_frames_do_not_give(h2_store: Path, both: H2Site,
                                                        tmp_path: Path) -> None:
    page = recorded(h2_store)[both.url]
    with Store.create(tmp_path / "s") as store:
        with Store.open(h2_store, read_only=True) as source:
            frames = store.artifacts.put("frames", source.artifacts.read(page.frames))  # type: ignore[arg-type]
            head = source.artifacts.read(page.response_headers)  # type: ignore[arg-type]
            body = store.artifacts.put("body", source.artifacts.read(page.body))  # type: ignore[arg-type]
        make = Factory(store)
        honest = make.attempt(both.url, capture="wire", protocol="h2", frames=frames,
                              body=body, response_headers=store.artifacts.put("headers", head))
        forged = make.attempt(both.url, sequence=1, capture="wire", protocol="h2",
                              frames=frames, body=body, response_headers=store.artifacts.put(
                                  "headers", head.replace(b"HTTP/2 200", b"HTTP/2 404")))
        # Frames go with h2, and h2 with a wire capture: else the writer refuses them.
        wrong = [make.attempt(both.url, sequence=2, capture="wire", frames=frames),
                 make.attempt(both.url, sequence=3, protocol="h2")]
        acks = submit_all(store, [make.session(), make.run(), honest, forged, *wrong])
        assert [a.status for a in acks] == ["committed"] * 4 + ["rejected"] * 2
        report = verify(store, full=True)
        assert [(f.kind, f.location.row_id) for f in report.findings] == [
            ("content_mismatch", 2)]
        assert forged.attempt_id in report.findings[0].message


def test_h2_attempts_export_restore_and_export_again_on_both_backends(
        h2_store: Path, tmp_path: Path, pg_cluster: object) -> None:
    first = export(h2_store, tmp_path / "a")
    copies = {"sqlite": str(tmp_path / "restored"),
              "postgresql": new_pg_database(pg_cluster)}  # type: ignore[arg-type]
    for name, target in copies.items():
        restore(tmp_path / "a", target, artifacts=None if name == "sqlite"
                else tmp_path / "pg-payloads")
        again = export(target, tmp_path / f"again-{name}")
        assert {k: v.blake3 for k, v in again.tables.items()} == {
            k: v.blake3 for k, v in first.tables.items()}, name
        with Store.open(target, read_only=True) as store:
            assert store.connection.execute(
                "SELECT count(*), count(DISTINCT a.namespace) FROM fetch_attempt f JOIN "
                "artifact a ON a.artifact_id = f.frames_id WHERE f.protocol = 'h2'"
            ).fetchall() == [(4, 1)]
            assert verify(store, full=True).ok, name
    # A run's archive holds its attempts' frames.
    with Store.open(h2_store, read_only=True) as store:
        (run_id,), = store.connection.execute("SELECT run_id FROM crawl_run").fetchall()
    export(h2_store, tmp_path / "run", run_id=run_id)
    restore(tmp_path / "run", tmp_path / "run-restored")
    with Store.open(tmp_path / "run-restored", read_only=True) as store:
        rows = store.connection.execute(
            "SELECT a.namespace, a.digest, a.size FROM fetch_attempt f "
            "JOIN artifact a ON a.artifact_id = f.frames_id").fetchall()
        assert len(rows) == 4
        assert all(http2.split_response(store.artifacts.read(ArtifactRef(*row))).complete
                   for row in rows)


# Any header list and any body, cut into any DATA frames and encoded by an encoder that
# keeps no dynamic table (as the client asks of servers): the frames alone give the head
# rendered from the list, and the body.
_NAME = st.from_regex(rb"[a-z][a-z0-9-]{0,15}", fullmatch=True)
_VALUE = st.from_regex(rb"[ -~]{0,40}", fullmatch=True).map(lambda v: v.strip())


@settings(max_examples=60, deadline=None)
@given(status=st.sampled_from([b"200", b"404", b"301"]),
       fields=st.lists(st.tuples(_NAME, _VALUE), max_size=12),
       body=st.binary(max_size=3000), cuts=st.lists(st.integers(1, 800), max_size=8),
       pad=st.integers(0, 20))
def test_any_stream_gives_its_head_and_body_back(status: bytes,
                                                 fields: list[tuple[bytes, bytes]],
                                                 body: bytes, cuts: list[int],
                                                 pad: int) -> None:
    encoder = hpack.Encoder()
    encoder.header_table_size = 0
    block = encoder.encode([(b":status", status), *fields])
    headers = HeadersFrame(1, block)
    headers.flags.add("END_HEADERS")
    frames = [headers.serialize()]
    rest = body
    for cut in [*cuts, len(body)]:
        data = DataFrame(1, rest[:cut])
        if pad:
            data.flags.add("PADDED")
            data.pad_length = pad
        frames.append(data.serialize())
        rest = rest[cut:]
        if not rest:
            break
    last = DataFrame(1, b"")
    last.flags.add("END_STREAM")
    frames.append(last.serialize())
    split = http2.split_response(b"".join(frames))
    assert split.complete and split.body == body
    assert split.head == http2.render_head(status, fields)
