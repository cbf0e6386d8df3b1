"""Replay and WARC export: the exact stored bytes, for the attempt that was current."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from evidence import ArtifactCorruptError, EvidenceError, Store
from evidence._archive.warc import export_warc
from evidence._audit.replay import replay
from evidence._errors import NotFoundError

from .conftest import Factory, flip_payload_byte, submit_all
from .test_verify import run_cli

T0 = dt.datetime(2025, 3, 3, 9, 0, tzinfo=dt.UTC)
URL = "http://example.com/page?b=2&a=1"
# A head as the crawler stores it: status line, raw header lines as received (odd spacing,
# repeated names, a non-UTF-8 byte), and the blank line.
HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=latin-1\r\n"
        b"Set-Cookie: a=1\r\nSet-Cookie:  b=2\r\nX-Odd: caf\xe9\r\n\r\n")
BODY = bytes(range(256)) * 4 + b"<html>\x00binary\xff</html>"


def at(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def response(make: Factory, url: str = URL, *, minutes: int = 0, sequence: int = 0,
             head: bytes = HEAD, body: bytes | None = BODY, run_id: str = "r1", **kw: object):
    artifacts = make.store.artifacts
    request = artifacts.put("headers", b"GET /page?b=2&a=1 HTTP/1.1\r\nHost: example.com\r\n"
                            b"User-Agent: evidence-test\r\n\r\n")
    return make.attempt(url, run_id=run_id, sequence=sequence, started_at=at(minutes),
                        request_headers=request,
                        response_headers=artifacts.put("headers", head),
                        body=None if body is None else artifacts.put("body", body), **kw)


@pytest.fixture
def history(store: Store, make: Factory) -> dict[str, object]:
    """One URL fetched three times in run r1 (late delivery included) and once in run r2."""
    first = response(make, minutes=0, sequence=0, body=b"first")
    second = response(make, minutes=10, sequence=1, body=b"second")
    third = response(make, minutes=20, sequence=2, body=b"third")
    other = response(make, minutes=5, sequence=0, body=b"other run", run_id="r2")
    submit_all(store, [make.session(), make.run(), make.run("r2"), first, third, second, other])
    return {"first": first, "second": second, "third": third, "other": other}


def test_replay_returns_the_exact_stored_bytes(store: Store, make: Factory) -> None:
    attempt = response(make)
    submit_all(store, [make.session(), make.run(), attempt])
    found = replay(store, "HTTP://EXAMPLE.com:80/page?a=1&b=2#frag")  # the same fetch key
    assert (found.response_headers, found.body) == (HEAD, BODY)
    assert found.http_message() == HEAD + BODY
    assert (found.attempt_id, found.url, found.http_status) == (attempt.attempt_id, URL, 200)
    assert found.body_ref == attempt.body and found.log_index == 2


def test_without_run_or_time_the_latest_current_attempt_is_replayed(store: Store,
                                                                    history: dict) -> None:
    # r1's current is sequence 2 (the late sequence-1 delivery did not move it back), and it
    # started after r2's.
    assert replay(store, URL).body == b"third"


def test_run_picks_that_runs_current_attempt(store: Store, history: dict) -> None:
    assert replay(store, URL, run_id="r1").body == b"third"
    assert replay(store, URL, run_id="r2").body == b"other run"
    with pytest.raises(NotFoundError, match="no run"):
        replay(store, URL, run_id="r9")


@pytest.mark.parametrize(("minutes", "expected"), [
    (0, b"first"), (4, b"first"), (5, b"other run"), (9, b"other run"), (10, b"second"),
    (19, b"second"), (20, b"third"), (600, b"third")])
def test_at_picks_the_latest_attempt_started_at_or_before(store: Store, history: dict,
                                                          minutes: int, expected: bytes) -> None:
    assert replay(store, URL, at=at(minutes)).body == expected


def test_at_within_a_run_and_before_any_attempt(store: Store, history: dict) -> None:
    assert replay(store, URL, run_id="r1", at="2025-03-03T09:09:00Z").body == b"first"
    assert replay(store, URL, run_id="r1", at="2025-03-03T10:09:00+01:00").body == b"first"
    with pytest.raises(NotFoundError, match="started at or before"):
        replay(store, URL, at=at(-1))
    with pytest.raises(EvidenceError, match="no timezone"):
        replay(store, URL, at="2025-03-03T09:09:00")
    with pytest.raises(NotFoundError):
        replay(store, "http://example.com/never-fetched")


def test_an_attempt_without_a_response_says_so(store: Store, make: Factory, capsys) -> None:
    timeout = make.attempt(URL, outcome="timeout", http_status=None, started_at=at(0))
    submit_all(store, [make.session(), make.run(), timeout])
    found = replay(store, URL)
    assert found.outcome == "timeout" and found.response_headers is None and found.body is None
    assert run_cli("replay", store.path, URL) == 1
    assert "received no response: outcome timeout" in capsys.readouterr().err


def test_a_damaged_body_is_never_replayed(store: Store, make: Factory) -> None:
    attempt = response(make)
    submit_all(store, [make.session(), make.run(), attempt])
    flip_payload_byte(store, attempt.body, len(BODY) - 1)
    with pytest.raises(ArtifactCorruptError):
        replay(store, URL)


def test_cli_replay_prints_bytes_as_stored(store: Store, history: dict, tmp_path: Path,
                                           capsysbinary) -> None:
    third = history["third"]
    assert run_cli("replay", store.path, URL) == 0
    assert capsysbinary.readouterr().out == HEAD + b"third"
    assert run_cli("replay", store.path, URL, "--headers-only") == 0
    assert capsysbinary.readouterr().out == HEAD
    assert run_cli("replay", store.path, URL, "--body-only", "--at",
                   "2025-03-03T09:12:00Z") == 0
    assert capsysbinary.readouterr().out == b"second"
    assert run_cli("replay", store.path, URL, "--run", "r2", "--out", tmp_path / "r") == 0
    assert (tmp_path / "r").read_bytes() == HEAD + b"other run"
    capsysbinary.readouterr()
    assert run_cli("replay", store.path, URL, "--json") == 0
    meta = json.loads(capsysbinary.readouterr().out)
    assert meta["attempt_id"] == third.attempt_id and meta["body_ref"]["digest"] == (
        third.body.digest)
    assert "body" not in meta


# --- WARC ----------------------------------------------------------------------------

def read_warc(path: Path) -> list:
    """Every record as (type, headers, http head, raw payload), digests checked by warcio."""
    records = []
    with open(path, "rb") as f:
        for record in ArchiveIterator(f, check_digests="raise"):
            payload = record.raw_stream.read()
            assert record.digest_checker.passed is not False, record.digest_checker.problems
            records.append((record.rec_type, record.rec_headers, record.http_headers, payload,
                            record.digest_checker.passed))
    return records


@pytest.fixture
def crawled(store: Store, make: Factory) -> dict[str, object]:
    gzipped = gzip.compress(b"<html>compressed on the wire</html>", mtime=0)
    plain = response(make, minutes=0)
    encoded = response(make, "http://example.com/gz", minutes=1, body=gzipped,
                       head=b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
                       b"Content-Type: text/html\r\n\r\n")
    no_status_line = response(make, "http://example.com/old", minutes=2, http_status=404,
                              head=b"Content-Type: text/plain\r\n", body=b"gone")
    head_only = response(make, "http://example.com/head", minutes=3, body=None,
                         head=b"HTTP/1.1 204 No Content\r\n\r\n", method="HEAD")
    capped = response(make, "http://example.com/big", minutes=4, body=b"cut at the c",
                      outcome="too_large", body_truncated=True)
    timeout = make.attempt("http://example.com/slow", outcome="timeout", http_status=None)
    elsewhere = response(make, "http://example.com/r2", minutes=5, run_id="r2")
    submit_all(store, [make.session(), make.run(), make.run("r2"), plain, encoded,
                       no_status_line, head_only, capped, timeout, elsewhere])
    return {"plain": plain, "encoded": encoded, "no_status_line": no_status_line,
            "head_only": head_only, "capped": capped, "gzipped": gzipped, "elsewhere": elsewhere}


@pytest.mark.parametrize("name", ["out.warc", "out.warc.gz"])
def test_warc_read_back_with_warcio_gives_the_stored_bytes(store: Store, crawled: dict,
                                                           tmp_path: Path, name: str) -> None:
    result = export_warc(store, tmp_path / name, run_id="r1")
    assert (result.responses, result.skipped, result.records) == (5, 1, 11)
    records = read_warc(tmp_path / name)
    assert [r[0] for r in records] == ["warcinfo"] + ["response", "request"] * 5
    assert all(passed for *_, passed in records)  # warcio verified every digest
    responses = {r[1].get_header("WARC-Target-URI"): r for r in records if r[0] == "response"}
    requests = {r[1].get_header("WARC-Target-URI"): r for r in records if r[0] == "request"}
    for key in ("plain", "encoded", "no_status_line", "head_only", "capped"):
        attempt = crawled[key]
        _, headers, http, payload, _ = responses[attempt.url]
        stored = b"" if attempt.body is None else store.artifacts.read(attempt.body)
        assert payload == stored, key
        assert headers.get_header("WARC-Date") == attempt.started_at.strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ")
        assert headers.get_header("Evidence-Attempt-ID") == attempt.attempt_id
        assert headers.get_header("WARC-Payload-Digest").startswith("sha256:")
        request = requests[attempt.url][1]
        assert request.get_header("WARC-Concurrent-To") == headers.get_header("WARC-Record-ID")
        head = store.artifacts.read(attempt.response_headers)
        if key == "no_status_line":
            assert http.statusline == "404 Not Found"
            assert headers.get_header("Evidence-Reconstructed") == "status-line"
        else:
            assert head.startswith(b"HTTP/1.1 " + http.statusline.encode() + b"\r\n")
            assert headers.get_header("Evidence-Reconstructed") is None
    plain = responses[URL][2]
    assert plain.get_header("X-Odd") == "caf\xe9"  # warcio decodes header bytes as latin-1
    assert [v for k, v in plain.headers if k == "Set-Cookie"] == ["a=1", "b=2"]
    assert responses["http://example.com/big"][1].get_header("WARC-Truncated") == "length"
    assert crawled["elsewhere"].url not in responses


def test_warc_record_blocks_are_the_stored_head_and_body(store: Store, crawled: dict,
                                                         tmp_path: Path) -> None:
    export_warc(store, tmp_path / "out.warc")
    data = (tmp_path / "out.warc").read_bytes()
    plain = crawled["plain"]
    block = store.artifacts.read(plain.response_headers) + store.artifacts.read(plain.body)
    assert block in data  # the http block is exactly head artifact + body artifact
    with open(tmp_path / "out.warc", "rb") as f:  # a reader decodes as the headers say
        decoded = [record.content_stream().read() for record in ArchiveIterator(f)
                   if record.rec_type == "response"
                   and record.rec_headers.get_header("WARC-Target-URI") == crawled["encoded"].url]
    assert decoded == [b"<html>compressed on the wire</html>"]


def test_warc_export_is_deterministic(store: Store, crawled: dict, tmp_path: Path) -> None:
    a = export_warc(store, tmp_path / "a.warc.gz")
    b = export_warc(store, tmp_path / "b.warc.gz")
    assert (tmp_path / "a.warc.gz").read_bytes() == (tmp_path / "b.warc.gz").read_bytes()
    assert a.sha256 == b.sha256 and a.responses == 6


def test_warc_export_never_overwrites_and_never_archives_damage(store: Store, crawled: dict,
                                                                tmp_path: Path) -> None:
    out = tmp_path / "out.warc"
    out.write_bytes(b"precious")
    with pytest.raises(EvidenceError, match="already exists"):
        export_warc(store, out)
    assert out.read_bytes() == b"precious"
    flip_payload_byte(store, crawled["plain"].body, len(BODY) - 1)
    with pytest.raises(ArtifactCorruptError):
        export_warc(store, tmp_path / "damaged.warc")
    assert not list(tmp_path.glob("*damaged*"))  # no partial file left behind


def test_cli_export_warc(store: Store, crawled: dict, tmp_path: Path, capsys) -> None:
    assert run_cli("export", store.path, "--out", tmp_path / "x.warc", "--format", "warc",
                   "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["responses"] == 6 and summary["skipped"] == 1
    assert len(read_warc(tmp_path / "x.warc")) == summary["records"] == 13
    assert run_cli("export", store.path, "--out", tmp_path / "y.warc", "--format", "warc",
                   "--run", "r9") == 2
