"""The bytes on the wire: what the crawler stores equals what a raw-socket server wrote.

The server (tests/rawserver.py) keeps its own copy of every byte it read and wrote; each
test fetches through the crawler's client and compares the stored artifacts with it.
"""

from __future__ import annotations

import gzip
import types
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from warcio.archiveiterator import ArchiveIterator
from warcio.checker import Checker

from evidence import Store, verify
from evidence._archive.warc import export_warc
from evidence._audit.replay import replay
from evidence._crawl.fetch import FetchResult, fetch
from evidence._crawl.http import crawl_client
from evidence._model import http1
from evidence._model.http1 import derive_content, split_response

from .conftest import Factory, submit_all
from .rawserver import RawServer, Reply

ODD_HEAD = (b"HTTP/1.1 200 Fine  and dandy\r\n"
            b"X-Spaces:    padded value   \r\n"
            b"X-Tab:\tv\t\r\n"
            b"Set-Cookie: a=1\r\n"
            b"Set-Cookie:  b=2\r\n"
            b"X-Folded: first\r\n"
            b"   second line\r\n"
            b"\tthird line\r\n"
            b"content-TYPE: text/plain\r\n"
            b"Content-Length: 11\r\n\r\n")
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
CHUNKED_BODY = (b"5;ext=\"quoted; value\"\r\nhello\r\n"
                b"6;a=1;b\r\n world\r\n"
                b"0;last=yes\r\nX-Trailer: done\r\nX-Other:  two \r\n\r\n")
GZIPPED = gzip.compress(b"<html>" + b"compressed words " * 200 + b"</html>", mtime=0)


def chunked(data: bytes, size: int = 300) -> bytes:
    pieces = [b"%x\r\n%s\r\n" % (len(data[i:i + size]), data[i:i + size])
              for i in range(0, len(data), size)]
    return b"".join(pieces) + b"0\r\n\r\n"


ROUTES = {
    "/odd": Reply([ODD_HEAD[:40], ODD_HEAD[40:], b"hello world"], pause=0.02),
    "/bare-lf": Reply([b"HTTP/1.1 200 OK\nContent-Length: 2\nX-A: b\n\nok"]),
    "/chunked": Reply([CHUNKED_HEAD, CHUNKED_BODY[:20], CHUNKED_BODY[20:]], pause=0.02),
    "/gzip": Reply([b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: gzip\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(GZIPPED), GZIPPED]),
    "/chunked-gzip": Reply([b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                            b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
                            chunked(GZIPPED)]),
    "/cut": Reply([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"only ten!!"],
                  close=True, pause=0.02),
    "/cut-chunk": Reply([CHUNKED_HEAD, b"a\r\n12345"], close=True, pause=0.02),
    "/malformed": Reply([b"HTTP/1.1 200 OK\r\nBad Header : x\r\nContent-Length: 2\r\n\r\nok"],
                        close=True),
    "/surplus": Reply([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA BYTES"]),
    "/big": Reply([b"HTTP/1.1 200 OK\r\nContent-Length:\t5000\r\n\r\n", b"x" * 5000]),
    "/slow": Reply([b"HTTP/1.1 200 OK\r\nX-Slow:  yes\r\nContent-Length: 50\r\n\r\n",
                    b"partial"], pause=0.02, hold=3.0),
}


def run_fetches(store: Store, server: RawServer, paths: list[str], *, timeout: float = 5.0,
                cap: int = 1 << 20, connections: int = 4) -> dict[str, FetchResult]:
    async def main() -> dict[str, FetchResult]:
        results = {}
        async with crawl_client(connections=connections, timeout=timeout) as client:
            for path in paths:
                results[path] = await fetch(client, store.artifacts, url=server.url(path),
                                            run_id="r1", sequence=0, user_agent="wire-test",
                                            max_body_bytes=cap)
        return results

    return anyio.run(main)


def stored(store: Store, ref) -> bytes | None:
    return None if ref is None else store.artifacts.read(ref, verify=True)


@pytest.fixture
def server():
    with RawServer(dict(ROUTES)) as s:
        yield s


@pytest.mark.parametrize("path", ["/odd", "/bare-lf", "/chunked", "/gzip", "/chunked-gzip"])
def test_stored_response_is_byte_for_byte_what_the_server_wrote(
        store: Store, server: RawServer, path: str) -> None:
    result = run_fetches(store, server, [path])[path]
    attempt, seen = result.attempt, server.exchange(path)
    head, body = stored(store, attempt.response_headers), stored(store, attempt.body)
    assert head + body == seen.sent
    assert head == seen.sent[:len(head)] and head.endswith((b"\r\n\r\n", b"\n\n"))
    assert stored(store, attempt.request_headers) == seen.received  # what went out
    assert (attempt.capture, attempt.outcome, attempt.http_status) == ("wire", "response", 200)
    assert attempt.surplus is None and not attempt.body_truncated


def test_chunk_extensions_and_trailers_are_kept_and_the_content_is_derived(
        store: Store, server: RawServer) -> None:
    attempt = run_fetches(store, server, ["/chunked"])["/chunked"].attempt
    assert stored(store, attempt.body) == CHUNKED_BODY  # framing, extensions, trailers
    assert stored(store, attempt.content) == b"hello world"
    assert attempt.content.namespace == "content"
    assert (attempt.transfer_coding, attempt.content_coding) == ("chunked", None)


@pytest.mark.parametrize("path", ["/gzip", "/chunked-gzip"])
def test_gzip_content_is_decoded_beside_the_gzipped_wire_body(
        store: Store, server: RawServer, path: str) -> None:
    result = run_fetches(store, server, [path])[path]
    attempt = result.attempt
    assert stored(store, attempt.content) == gzip.decompress(GZIPPED) == result.body
    assert attempt.content_coding == "gzip"
    assert attempt.transfer_coding == ("chunked" if "chunked" in path else None)
    assert GZIPPED in stored(store, attempt.body) or path == "/chunked-gzip"


def test_identity_body_is_its_own_content(store: Store, server: RawServer) -> None:
    attempt = run_fetches(store, server, ["/odd"])["/odd"].attempt
    assert attempt.content is None and attempt.transfer_coding is None
    assert stored(store, attempt.body) == b"hello world"


@pytest.mark.parametrize("path", ["/cut", "/cut-chunk"])
def test_a_response_cut_short_keeps_exactly_what_came(store: Store, server: RawServer,
                                                      path: str) -> None:
    attempt = run_fetches(store, server, [path])[path].attempt
    seen = server.exchange(path)
    assert stored(store, attempt.response_headers) + stored(store, attempt.body) == seen.sent
    assert attempt.outcome == "network_error" and "body read" in attempt.error
    assert attempt.http_status == 200 and attempt.body_truncated and attempt.content_truncated


def test_a_malformed_response_is_still_evidence(store: Store, server: RawServer) -> None:
    attempt = run_fetches(store, server, ["/malformed"])["/malformed"].attempt
    seen = server.exchange("/malformed")
    assert attempt.outcome == "network_error" and "RemoteProtocolError" in attempt.error
    assert attempt.http_status is None  # the client never accepted a response
    assert stored(store, attempt.response_headers) + stored(store, attempt.body) == seen.sent
    assert stored(store, attempt.request_headers) == seen.received


def test_bytes_after_the_response_are_kept_apart_and_never_reused(
        store: Store, server: RawServer) -> None:
    results = run_fetches(store, server, ["/surplus", "/odd"], connections=1)
    attempt = results["/surplus"].attempt
    assert stored(store, attempt.body) == b"ok"
    assert stored(store, attempt.surplus) == b"EXTRA BYTES"
    # the connection was closed, not reused: "EXTRA BYTES" was never read as /odd's answer
    assert results["/odd"].attempt.http_status == 200
    assert server.exchange("/surplus").connection != server.exchange("/odd").connection


def test_keep_alive_reuse_records_each_exchange_apart(store: Store, server: RawServer) -> None:
    paths = ["/odd", "/chunked", "/gzip", "/bare-lf"]
    results = run_fetches(store, server, paths, connections=1)
    assert server.connections == 1
    for path in paths:
        attempt, seen = results[path].attempt, server.exchange(path)
        assert stored(store, attempt.request_headers) == seen.received
        assert (stored(store, attempt.response_headers)
                + stored(store, attempt.body)) == seen.sent


def test_concurrent_fetches_on_a_pool_never_mix_their_bytes(store: Store) -> None:
    routes = {f"/c{i}": Reply([b"HTTP/1.1 200 OK\r\ncontent-length:   %d \r\n\r\n" % (3 + i),
                               b"c%d" % i + b"." * (i + 3 - len(b"c%d" % i))], pause=0.01)
              for i in range(24)}
    with RawServer(routes) as server:
        async def main() -> dict[str, FetchResult]:
            results: dict[str, FetchResult] = {}
            async with crawl_client(connections=4, timeout=5.0) as client:
                async def one(path: str) -> None:
                    results[path] = await fetch(client, store.artifacts, url=server.url(path),
                                                run_id="r1", sequence=0, user_agent="t",
                                                max_body_bytes=1 << 20)
                async with anyio.create_task_group() as tg:
                    for path in routes:
                        tg.start_soon(one, path)
            return results

        results = anyio.run(main)
        assert server.connections <= 4
        for path, result in results.items():
            seen = server.exchange(path)
            assert stored(store, result.attempt.request_headers) == seen.received
            assert (stored(store, result.attempt.response_headers)
                    + stored(store, result.attempt.body)) == seen.sent


def test_a_body_over_the_cap_is_cut_at_the_cap(store: Store, server: RawServer) -> None:
    attempt = run_fetches(store, server, ["/big"], cap=1000)["/big"].attempt
    assert attempt.outcome == "too_large" and attempt.body_truncated
    assert stored(store, attempt.body) == b"x" * 1000
    seen = server.exchange("/big")
    assert stored(store, attempt.response_headers) == seen.sent[:len(seen.sent) - 5000]


def test_a_timeout_mid_body_keeps_what_came(store: Store, server: RawServer) -> None:
    attempt = run_fetches(store, server, ["/slow"], timeout=0.5)["/slow"].attempt
    assert attempt.outcome == "timeout" and attempt.body_truncated
    assert stored(store, attempt.response_headers) + stored(store, attempt.body) == (
        ROUTES["/slow"].data)


def test_wire_attempts_commit_verify_and_replay(store: Store, server: RawServer,
                                                make: Factory) -> None:
    paths = ["/odd", "/chunked", "/chunked-gzip", "/cut", "/malformed", "/surplus"]
    results = run_fetches(store, server, paths)
    submit_all(store, [make.session(), make.run(), *(r.attempt for r in results.values())])
    report = verify(store, full=True)
    assert report.ok, report.findings
    found = replay(store, server.url("/chunked-gzip"), content=True)
    seen = server.exchange("/chunked-gzip")
    assert found.http_message() == seen.sent  # the wire by default
    assert found.content == gzip.decompress(GZIPPED)


def test_cli_replay_content_option(store: Store, server: RawServer, make: Factory,
                                   capsysbinary) -> None:
    from .test_verify import run_cli

    results = run_fetches(store, server, ["/chunked"])
    submit_all(store, [make.session(), make.run(), results["/chunked"].attempt])
    assert run_cli("replay", store.path, server.url("/chunked"), "--body-only") == 0
    assert capsysbinary.readouterr().out == CHUNKED_BODY
    assert run_cli("replay", store.path, server.url("/chunked"), "--content") == 0
    assert capsysbinary.readouterr().out == b"hello world"


def test_warc_of_chunked_and_gzip_responses_passes_warcio_check(
        store: Store, server: RawServer, make: Factory, tmp_path: Path, capsys) -> None:
    paths = ["/chunked", "/gzip", "/chunked-gzip", "/odd"]
    results = run_fetches(store, server, paths)
    submit_all(store, [make.session(), make.run(), *(r.attempt for r in results.values())])
    out = tmp_path / "crawl.warc"
    export = export_warc(store, out)
    assert export.responses == 4
    capsys.readouterr()
    checker = Checker(types.SimpleNamespace(inputs=[str(out)], verbose=True))
    assert checker.process_all() == 0
    printed = capsys.readouterr().out
    # warcinfo has no digest; each attempt: response, request, its connection's metadata
    assert printed.count("digest pass") == 1 + 3 * 4, printed
    assert "failed" not in printed

    data = out.read_bytes()
    for path in paths:  # each block is the bytes that crossed the connection
        seen = server.exchange(path)
        assert seen.sent in data and seen.received in data
    with open(out, "rb") as f:
        for record in ArchiveIterator(f):
            if record.rec_type == "response":
                path = "/" + record.rec_headers.get_header("WARC-Target-URI").split("/", 3)[3]
                if path == "/chunked":  # warcio's de-chunker stops at trailers (gives them
                    continue            # as content): the block is right, its reader is not
                assert record.content_stream().read() == results[path].body  # the content


def test_verify_full_derives_each_content_again(store: Store, server: RawServer,
                                                make: Factory) -> None:
    good = run_fetches(store, server, ["/chunked-gzip"])["/chunked-gzip"].attempt
    forged = msgspec.structs.replace(
        good, message_id="m-forged", attempt_id="a-forged", sequence=1,
        content=store.artifacts.put("content", b"not what the body says"))
    submit_all(store, [make.session(), make.run(), good, forged])
    assert verify(store).ok  # the quick form reads no payload
    report = verify(store, full=True)
    assert [f.kind for f in report.errors] == ["content_mismatch"]
    assert "a-forged" in report.errors[0].message
    assert report.checks["contents_derived"] == 2


# --- the framing rules, for any body --------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=3000), sizes=st.lists(st.integers(1, 700), min_size=1),
       ext=st.sampled_from([b"", b";a=1", b';q="x;y"', b" ; z"]),
       trailers=st.sampled_from([b"", b"X-T: 1\r\n", b"A: b\r\nC:  d \r\n"]),
       surplus=st.binary(max_size=20), gzipped=st.booleans(), lf_head=st.booleans())
def test_any_chunking_splits_exactly_and_derives_the_content(
        body: bytes, sizes: list[int], ext: bytes, trailers: bytes, surplus: bytes,
        gzipped: bool, lf_head: bool) -> None:
    payload = gzip.compress(body, mtime=0) if gzipped else body
    wire, pos, i = b"", 0, 0
    while pos < len(payload):
        piece = payload[pos:pos + sizes[i % len(sizes)]]
        wire += b"%x%s\r\n%s\r\n" % (len(piece), ext, piece)
        pos, i = pos + len(piece), i + 1
    wire += b"0" + ext + b"\r\n" + trailers + b"\r\n"
    eol = b"\n" if lf_head else b"\r\n"
    head = eol.join([b"HTTP/1.1 200 OK", b"Transfer-Encoding:  chunked",
                     *([b"Content-Encoding: gzip"] if gzipped else []), b"", b""])
    split = split_response(head + wire + surplus)
    assert (split.head, split.body, split.surplus, split.complete) == (head, wire, surplus, True)
    content = derive_content(split.head, split.body, 1 << 20)
    assert content.data == body and not content.truncated
    assert (content.transfer_coding, content.content_coding) == (
        "chunked", "gzip" if gzipped else None)
    # any prefix: never more than what came, never an exception
    cut = derive_content(split.head, split.body[:len(split.body) // 2], 1 << 20)
    assert cut.truncated and body.startswith(cut.data)


def test_old_attempts_keep_their_encoding_and_hash() -> None:
    """An attempt as the previous version recorded it: no new key, the same bytes."""
    from evidence import FetchAttempt
    from evidence._model.messages import canonical_encode, decode_message, utc_now
    from evidence._model.refs import ArtifactRef

    ref = ArtifactRef("body", "0" * 64, 1)
    old = FetchAttempt(message_id="m1", attempt_id="a1", run_id="r1", url="http://h/",
                       sequence=0, started_at=utc_now(), elapsed_ms=1.0, outcome="response",
                       http_status=200, response_headers=ref, body=ref)
    encoded = canonical_encode(old)
    keys = set(msgspec.msgpack.decode(encoded))
    assert not keys & {"capture", "content", "transfer_coding", "content_coding",
                       "content_truncated", "surplus", "text_encoding", "text_encoding_source"}
    again = decode_message(encoded)
    assert again.capture == "rebuilt" and again.content is None
    assert canonical_encode(again) == encoded


def test_a_store_made_before_wire_capture_upgrades_with_its_evidence_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migration 005 on a populated schema-4 store: the rows, the log and every export
    section but the migration list are what the same messages give in a new store."""
    import shutil

    import apsw

    from evidence import export
    from evidence._store import sqlite as _store

    with Store.create(tmp_path / "new") as new:  # the messages as the old version wrote them
        make = Factory(new)
        head = new.artifacts.put("headers", b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n")
        body = make.body(b"<a href=/x>x</a>")
        attempt = make.attempt(response_headers=head, body=body)
        submit_all(new, [make.session(), make.run(), attempt,
                         make.discovery(attempt, body, ["http://example.com/x"])])
    real = _store.load_migrations
    monkeypatch.setattr(_store, "load_migrations", lambda directory=None: real(directory)[:4])
    Store.create(tmp_path / "old").close()
    monkeypatch.undo()
    conn = apsw.Connection(str(tmp_path / "old" / "evidence.db"))
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("ATTACH ? AS src", (str(tmp_path / "new" / "evidence.db"),))
    assert conn.execute("PRAGMA user_version").fetchall()[0][0] == 4
    tables = [t for (t,) in conn.execute("SELECT name FROM main.sqlite_schema WHERE type = "
                                         "'table' AND name NOT LIKE 'sqlite%'")]
    for table in tables:
        if table == "schema_migration":
            continue
        columns = ", ".join(c[1] for c in conn.execute(f"PRAGMA main.table_info({table})"))
        conn.execute(f"DELETE FROM main.{table}")
        conn.execute(f"INSERT INTO main.{table} ({columns}) SELECT {columns} FROM src.{table}")
    # What later migrations add to store_meta (010's legacy_quarantine) is theirs to add.
    conn.execute("DELETE FROM main.store_meta WHERE key = 'legacy_quarantine'")
    conn.close()
    shutil.copytree(tmp_path / "new" / "artifacts", tmp_path / "old" / "artifacts",
                    dirs_exist_ok=True)
    with Store.open(tmp_path / "old") as old:  # applies 005 and every later migration
        assert old.connection.execute("PRAGMA user_version").fetchall()[0][0] == len(
            _store.load_migrations())
        assert old.connection.execute(
            "SELECT capture, content_id, text_encoding FROM fetch_attempt").fetchall() == [
            ("rebuilt", None, None)]
        assert verify(old, full=True).ok
        assert replay(old, "http://example.com/").body == b"<a href=/x>x</a>"
    a, b = export(tmp_path / "new", tmp_path / "a"), export(tmp_path / "old", tmp_path / "b")
    assert a.log == b.log
    assert {k: v.blake3 for k, v in a.tables.items() if k != "schema_migration"} == {
        k: v.blake3 for k, v in b.tables.items() if k != "schema_migration"}
    assert a.schema.blake3 == b.schema.blake3


def test_a_whole_body_at_the_cap_followed_by_surplus_is_not_cut(store: Store) -> None:
    routes = {"/edge": Reply([b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
                              + b"y" * 1000 + b"MORE"])}
    with RawServer(routes) as server:
        attempt = run_fetches(store, server, ["/edge"], cap=1000)["/edge"].attempt
    assert (attempt.outcome, attempt.body_truncated) == ("response", False)
    assert stored(store, attempt.body) == b"y" * 1000
    assert stored(store, attempt.surplus) == b"MORE"


def test_a_client_that_does_not_record_the_wire_is_refused(store: Store,
                                                           server: RawServer) -> None:
    import httpx

    from evidence import EvidenceError

    async def main() -> None:
        async with httpx.AsyncClient() as client:
            await fetch(client, store.artifacts, url=server.url("/odd"), run_id="r1",
                        sequence=0, user_agent="t", max_body_bytes=1000)

    with pytest.raises(EvidenceError, match="does not record") as raised:
        anyio.run(main)
    assert "crawl_client" in raised.value.hint


@settings(max_examples=300, deadline=None)
@given(data=st.one_of(st.binary(max_size=400), st.builds(
    lambda head, rest: head + rest,
    st.sampled_from([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                     b"HTTP/1.1 200 OK\nContent-Encoding: gzip\nContent-Length: 5\n\n",
                     b"HTTP/1.1 103 Early\r\n\r\nHTTP/1.1 204 No\r\n\r\n",
                     b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate, br\r\n\r\n"]),
    st.binary(max_size=300))))
def test_any_bytes_split_into_their_own_parts_and_never_raise(data: bytes) -> None:
    split = split_response(data)
    assert split.head + split.body + split.surplus == data
    content = derive_content(split.head, split.body, 1000)
    assert len(content.data) <= 1000


_HEAD_LINES = st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.1 304 Not Modified", b"HTTP/1.0 404",
                               b"Content-Length: 5", b"content-type:text/html", b" folded",
                               b"X-A: 1", b"Set-Cookie: a=b", b"", b"bad line", b"\t tab"])


@given(st.lists(st.tuples(st.lists(_HEAD_LINES, max_size=6), st.sampled_from(["\r\n", "\n"]),
                          st.booleans(), st.booleans()), min_size=1, max_size=12))
def test_any_sequence_of_heads_parses_as_each_head_alone(
        heads: list[tuple[list[bytes], str, bool, bool]]) -> None:
    """``parse_head`` remembers the last head it parsed (a fetch parses the same head
    three times): in any sequence, repeats and bytearrays included, each answer is the
    head's own, and a caller changing the fields it got changes no later answer."""
    for lines, eol, as_bytearray, spoil in heads:
        head = eol.encode().join(lines) + eol.encode() * 2
        given_head = bytearray(head) if as_bytearray else head
        status, fields = http1.parse_head(given_head)
        assert (status, fields) == http1._parse_head(head)
        if spoil:
            fields.append((b"Spoiled", b"yes"))
            if isinstance(given_head, bytearray):
                given_head[:] = b"HTTP/1.1 500 Spoiled\r\n\r\n"
