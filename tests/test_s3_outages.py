"""An object store that goes away for a while (issue 29): requests wait it out.

A real SeaweedFS SIGKILLed and started again on the same port and data (``outage``). A
request that finds it down keeps trying until its outage deadline; a crawl whose puts wait
pauses, says so once per outage, and carries on with every page fetched once; an outage
longer than the deadline fails the run with an error that says what to do, and loses
nothing that was acknowledged. What retrying cannot fix (credentials, a missing bucket, a
checksum the server refused) is not retried at all. A worker host whose puts wait keeps
its lease (they wait on a thread, not on its event loop). The real 10-second outages are
``tools/s3_outages.py``; here they last the 2 to 3 seconds a restart takes.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from evidence import CrawlConfig, Store, verify
from evidence._cli.main import main
from evidence._crawl.progressline import CrawlProgressLine
from evidence._demo.site import SiteConfig, TestSite
from evidence._store.s3client import S3Client, S3Config, S3Error
from evidence._write.tls import make_self_signed
from evidence.testing.seaweed import SeaweedS3

from .heldsite import HeldSite, MeteredSite, pages_from
from .test_crawl import crawl, done_pages
from .test_hosts import COORDINATOR, TOKEN, _coordinator, _finish, _host, _log, _wait


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SeaweedS3]:
    """A server of this test's own (it is killed), its credentials in the environment."""
    s3 = SeaweedS3.start(tmp_path / "s3")
    try:
        for name, value in s3.environ.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("EVIDENCE_S3_OUTAGE_DEADLINE", raising=False)
        yield s3
    finally:
        s3.close()


def _client(s3: SeaweedS3, **options: object) -> S3Client:
    env = s3.environ
    return S3Client(S3Config(endpoint=s3.endpoint, bucket=s3.bucket,
                             access_key=env["AWS_ACCESS_KEY_ID"],
                             secret_key=env["AWS_SECRET_ACCESS_KEY"], **options))  # type: ignore[arg-type]


def _put(client: S3Client, key: str, body: bytes) -> bool:
    return client.put_if_absent(key, body, sha256=hashlib.sha256(body).digest(),
                                md5=hashlib.md5(body).digest())


def _said(caplog: pytest.LogCaptureFixture, words: str) -> int:
    return sum(words in r.getMessage() for r in caplog.records if r.name == "evidence.s3")


def test_a_request_waits_out_an_outage_within_its_deadline(
        server: SeaweedS3, caplog: pytest.LogCaptureFixture) -> None:
    """Down, then up again 2-3 s later: the put started while it was down returns True
    (created once), the outage is said once and its end once, and the connections kept
    from before it are not used again."""
    caplog.set_level(logging.INFO, logger="evidence.s3")
    client = _client(server, outage_deadline=30.0)
    try:
        assert _put(client, "warm", b"a kept-alive connection to the old server")
        assert len(client._idle) == 1
        server.kill()
        outcome: list[object] = []
        thread = threading.Thread(target=lambda: outcome.append(
            _put(client, "during", b"put while the server was down")))
        started = time.monotonic()
        thread.start()
        while client.outage() is None:  # said once the put has failed for a second
            assert thread.is_alive(), f"the put ended ({outcome}) before an outage began"
            assert time.monotonic() - started < 30, "no outage 30 s after the kill"
            time.sleep(0.02)
        thread.join(1.0)
        assert thread.is_alive() and not outcome, "the put gave up instead of waiting"
        assert not client._idle, "a connection to the killed server is still pooled"
        outage = client.outage()
        assert outage is not None and outage.endpoint == server.endpoint
        line = CrawlProgressLine(io.StringIO(), outage=client.outage)  # the crawl's
        assert line.paused().startswith(
            f"; paused: object store {server.endpoint} unreachable since ")
        server.restart()
        thread.join(30)
        assert outcome == [True]
        assert time.monotonic() - started > 1.0
        assert client.retries > 0 and client.outage() is None and client.outages == 1
        assert client.get("during") == b"put while the server was down"
        assert _said(caplog, "unreachable since") == 1
        assert _said(caplog, "reachable again") == 1
    finally:
        client.close()


def test_past_its_deadline_an_outage_fails_each_request_at_its_first_try(
        server: SeaweedS3) -> None:
    """The deadline is the outage's, not each request's: once the store has failed for
    longer, a request tries once and fails (a verify of a store that stays down does not
    wait a deadline per object); the first answer ends that."""
    client = _client(server, outage_deadline=1.0)
    try:
        server.kill()
        started = time.monotonic()
        with pytest.raises(S3Error) as first:
            _put(client, "first", b"waits a second")
        assert 1.0 <= time.monotonic() - started < 10 and client.retries > 0
        assert "past its outage deadline (EVIDENCE_S3_OUTAGE_DEADLINE) of 1 s" in str(
            first.value)
        sent, started = client.requests, time.monotonic()
        with pytest.raises(S3Error, match="failed after 1 try; the object store has failed "
                           "requests for 1.[0-9] s, past its outage deadline"):
            client.head("second")
        # one try, and no wait for a deadline (1 s) before or after it
        assert client.requests == sent + 1 and time.monotonic() - started < 1.0
        server.restart()
        assert _put(client, "third", b"the store answers again") and client.outage() is None
        with pytest.raises(S3Error) as refused:  # a new outage: a deadline of its own
            server.kill()
            _put(client, "fourth", b"waits a second again")
        assert "failed requests for 1." in str(refused.value)
    finally:
        client.close()


def test_what_retrying_cannot_fix_is_not_retried(seaweed: SeaweedS3) -> None:
    """Wrong credentials (403), a bucket that is not there (404) and a checksum the server
    refused (400) fail at the first answer, however long the outage deadline."""
    env = seaweed.environ
    wrong = S3Client(S3Config(endpoint=seaweed.endpoint, bucket=seaweed.bucket,
                              access_key=env["AWS_ACCESS_KEY_ID"], secret_key="not-the-key",
                              outage_deadline=30.0))
    missing = _client(seaweed, outage_deadline=30.0)
    missing = S3Client(S3Config(**{**missing.config.__dict__, "bucket": "no-such-bucket"}))
    checked = _client(seaweed, outage_deadline=30.0)
    try:
        started = time.monotonic()
        with pytest.raises(S3Error) as refused:
            _put(wrong, "outages/refused", b"not with these credentials")
        assert refused.value.status == 403 and "credentials" in (refused.value.hint or "")
        with pytest.raises(S3Error) as no_bucket:
            list(missing.list("x/"))
        assert no_bucket.value.status == 404 and no_bucket.value.code == "NoSuchBucket"
        with pytest.raises(S3Error) as bad_digest:
            checked.put_if_absent("outages/bad", b"these bytes",
                                  sha256=hashlib.sha256(b"these bytes").digest(),
                                  md5=hashlib.md5(b"other bytes").digest())
        assert bad_digest.value.status == 400
        assert time.monotonic() - started < 5
        for client in (wrong, missing, checked):
            assert (client.requests, client.retries, client.outage()) == (1, 0, None)
    finally:
        for client in (wrong, missing, checked):
            client.close()


class _Outages(threading.Thread):
    """``count`` outages of the server, each in the middle of the crawl: once the crawl has
    said the last is over (``said`` counts its lines), the server is killed and only then
    are ``spacing`` more pages answered, so the crawl must store them while it is down; it
    is started again once the crawl has said it is unreachable. Then the rest of the site."""

    def __init__(self, s3: SeaweedS3, site: MeteredSite, said: Callable[[str], int], *,
                 count: int, spacing: int) -> None:
        super().__init__(daemon=True)
        self.s3, self.site, self.said = s3, site, said
        self.count, self.spacing = count, spacing
        self.downtimes: list[float] = []
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self.site.allow(self.spacing)  # the crawl under way before the first
            self._wait(lambda: self.site.answered, self.spacing)
            for n in range(self.count):
                self._wait(lambda: self.said("reachable again"), n)
                started = time.monotonic()
                self.s3.kill()
                self.site.allow(self.spacing)
                self._wait(lambda: self.said("unreachable since"), n + 1)
                self.s3.restart()
                self.downtimes.append(time.monotonic() - started)
        except BaseException as exc:  # reported by the test
            self.failure = exc
        finally:
            self.site.allow(None)

    @staticmethod
    def _wait(count: Callable[[], int], target: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while count() < target:
            if time.monotonic() > deadline:
                raise TimeoutError("the crawl did not get there")
            time.sleep(0.005)


@pytest.mark.slow
def test_a_crawl_rides_through_five_object_store_outages(
        tmp_path: Path, server: SeaweedS3, caplog: pytest.LogCaptureFixture) -> None:
    """Five outages of the object store in the middle of a crawl into an S3 store: the
    crawl pauses (its puts and reference checks wait), says so once per outage and once
    when it is over, and completes with every page fetched once and verify --full clean."""
    caplog.set_level(logging.INFO, logger="evidence.s3")
    with Store.create(tmp_path / "s", artifacts=server.url("outages")):
        pass
    with MeteredSite(SiteConfig(pages=120)) as site:
        # An outage is said once it has lasted a second; the server is started again only
        # after the crawl said it, so each outage is seen whatever the load.
        outages = _Outages(server, site, lambda words: _said(caplog, words), count=5,
                           spacing=4)
        outages.start()
        result = crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), workers=4, delay=0.02)
        outages.join(60)
        assert outages.failure is None and len(outages.downtimes) == 5, (
            "the crawl ended before five outages", outages.failure)
        counts = site.request_counts()
        reachable = site.reachable_pages()
    assert result.outcome == "completed", result.reason
    assert max(counts.values()) == 1, [p for p, n in counts.items() if n > 1]
    done = done_pages(tmp_path / "s")
    assert set(done) == reachable and max(done.values()) == 1
    assert _said(caplog, "unreachable since") == 5
    assert _said(caplog, "reachable again") == 5
    assert min(outages.downtimes) >= 1.0  # each outage lasted the second it must to be said
    with Store.open(tmp_path / "s", read_only=True) as store:
        report = verify(store, full=True)
    assert report.ok, report.findings


def _evidence(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "evidence", *args], capture_output=True,
                          text=True, env=dict(os.environ), timeout=timeout)


@pytest.mark.slow
def test_an_outage_longer_than_the_deadline_fails_the_run_clearly_and_loses_nothing(
        tmp_path: Path, server: SeaweedS3) -> None:
    """--s3-outage-deadline 2 with worker processes, and the server down for good in the
    middle of the crawl: the run fails within seconds with an error naming the endpoint,
    how long it tried and what to do; once the server is back, verify --full finds every
    payload the store acknowledged, and the resumed crawl completes."""
    store = str(tmp_path / "s")
    with TestSite(SiteConfig(pages=40)) as site:
        crawl_cmd = [sys.executable, "-m", "evidence", "crawl", site.url, "--store", store,
                     "--artifacts", server.url("deadline"), "--processes", "2",
                     "--workers", "4", "--delay", "0.05", "--s3-outage-deadline", "2"]
        process = subprocess.Popen(crawl_cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=dict(os.environ))
        try:
            site.wait_for_request("/p/3", timeout=60)
            server.kill()
            killed = time.monotonic()
            _, stderr = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        took = time.monotonic() - killed
        assert process.returncode in (1, 2), stderr
        assert took < 20, f"gave up after {took:.1f} s, not about 2"
        error = stderr[stderr.index("\nError: "):]
        assert server.endpoint in error and (
            "past its outage deadline (EVIDENCE_S3_OUTAGE_DEADLINE) of 2 s" in error), error
        assert "\nTry: " in error and "Traceback" not in stderr, stderr

        server.restart()
        with Store.open(store, read_only=True) as opened:  # what was acknowledged is there
            report = verify(opened, full=True)
        assert report.ok, report.findings
        resumed = _evidence("crawl", "--store", store, "--workers", "4")
        assert resumed.returncode == 0, resumed.stderr
        reachable = site.reachable_pages()
    assert set(done_pages(tmp_path / "s")) == reachable
    with Store.open(store, read_only=True) as opened:
        assert verify(opened, full=True).ok


def test_an_outage_deadline_that_is_not_seconds_is_refused_and_creates_nothing(
        tmp_path: Path, seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in {**seaweed.environ, "EVIDENCE_S3_OUTAGE_DEADLINE": "soon"}.items():
        monkeypatch.setenv(name, value)
    assert main(["init", str(tmp_path / "s"), "--artifacts", seaweed.url("refused")]) == 2
    assert capsys.readouterr().err.startswith(
        "Error: EVIDENCE_S3_OUTAGE_DEADLINE='soon' is not a number of seconds\nTry: ")
    with pytest.raises(SystemExit) as usage:
        main(["crawl", "http://127.0.0.1:9/", "--store", str(tmp_path / "s"),
              "--s3-outage-deadline", "-1"])
    assert usage.value.code == 2
    assert "--s3-outage-deadline: must be 0 seconds or more" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


@pytest.mark.slow
def test_a_worker_host_rides_through_an_outage_longer_than_its_lease(
        tmp_path: Path, server: SeaweedS3) -> None:
    """A worker host whose puts wait on the object store for longer than the lease timeout
    (1.5 s, beats every 0.5 s) still beats: it is not fenced, its pages are fetched once,
    and the crawl completes with verify --full clean."""

    cert, key = make_self_signed([COORDINATOR], tmp_path / "tls")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    with socket.socket() as s:
        s.bind((COORDINATOR, 0))
        port = s.getsockname()[1]
    d = {"cert": cert, "key": key, "token": token, "env": dict(os.environ), "tmp": tmp_path,
         "address": f"{COORDINATOR}:{port}", "store": str(tmp_path / "store"),
         "artifacts": server.url("host")}
    # Pages from /p/10 on are held until the store is down: the host has puts to make during
    # the outage, however fast or slow the machine (else the crawl could end before it).
    with HeldSite(SiteConfig(pages=40), held=pages_from(10)) as site:
        coordinator = _coordinator(d, site.url, "--lease-timeout", "1.5", "--delay", "0.05")
        host = _host(d, "127.0.0.3", "host-a")
        try:
            try:
                _wait("some pages and one held", lambda: len(site.requests) >= 8
                      and site.waiting > 0, [coordinator, host], d)
                server.kill()
                down = time.monotonic()
            finally:
                site.release()
            _wait("the host to find the store down", lambda: "unreachable since" in _log(
                d, "host-a"), [coordinator, host], d)
            time.sleep(max(0.0, down + 3.0 - time.monotonic()))  # down twice the lease
            server.restart()
            assert coordinator.wait(120) == 0, _log(d, "coordinator")
            assert host.wait(60) == 0, _log(d, "host-a")
        finally:
            _finish([coordinator, host])
        counts = site.request_counts()
    assert max(counts.values()) == 1, [p for p, n in counts.items() if n > 1]
    assert "nothing from it for" not in _log(d, "coordinator")
    assert "unreachable since" in _log(d, "host-a")
    with Store.open(tmp_path / "store", read_only=True) as store:
        assert verify(store, full=True).ok
