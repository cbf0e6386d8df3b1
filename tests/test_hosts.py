"""Worker hosts over TCP and TLS (issue 16 point 3).

The "hosts" are processes of this machine on their own loopback addresses: the crawl
(coordinator) listens on 127.0.0.2, worker hosts connect from 127.0.0.3 and 127.0.0.4, the
payloads go to the S3 server (SeaweedFS), the site is the demo site on 127.0.0.1. Hosts are
killed with SIGKILL and cut off with SIGSTOP (a host that sends nothing at all, as a
partitioned one does), and the site's request log is the truth.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest

from evidence import ServiceError, Store, verify
from evidence._demo.site import SiteConfig, TestSite
from evidence._write.service import Service
from evidence._write.tls import TLSFiles, client_context, make_self_signed
from evidence._write.wire import gone_in_words
from evidence.client import AsyncClient, ClientLimits
from evidence.testing.seaweed import SeaweedS3

from .conftest import Factory, new_s3_url
from .heldsite import HeldSite, pages_from
from .test_crawl import done_pages

COORDINATOR = "127.0.0.2"
TOKEN = "a-token-of-the-test-deployment-0123456789"


@pytest.fixture
def deployment(tmp_path: Path, seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A certificate for the coordinator's address, a token file, an environment with the
    object store's credentials (this process's too: the test reads the store), and a free
    port on the coordinator's address."""
    for name, value in seaweed.environ.items():
        monkeypatch.setenv(name, value)
    cert, key = make_self_signed([COORDINATOR], tmp_path / "tls")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    with socket.socket() as s:
        s.bind((COORDINATOR, 0))
        port = s.getsockname()[1]
    env = {**os.environ, **seaweed.environ}
    return {"cert": cert, "key": key, "token": token, "env": env, "port": port,
            "address": f"{COORDINATOR}:{port}", "tmp": tmp_path, "store": str(tmp_path / "store"),
            "artifacts": new_s3_url(seaweed, "hosts")}


def _coordinator(d: dict, url: str, *extra: str) -> subprocess.Popen:
    log = open(d["tmp"] / "coordinator.log", "a")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [sys.executable, "-m", "evidence", "crawl", url, "--store", d["store"],
         "--artifacts", d["artifacts"], "--listen", d["address"], "--tls-cert",
         str(d["cert"]), "--tls-key", str(d["key"]), "--token-file", str(d["token"]),
         "--workers", "4", *extra],
        stdout=subprocess.DEVNULL, stderr=log, text=True, env=d["env"])
    log.close()
    return proc


def _host(d: dict, bind: str, name: str) -> subprocess.Popen:
    log = open(d["tmp"] / f"{name}.log", "a")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [sys.executable, "-m", "evidence", "worker", "--connect", d["address"],
         "--token-file", str(d["token"]), "--tls-ca", str(d["cert"]), "--bind", bind,
         "--name", name, "--reconnect-timeout", "20"],
        stdout=subprocess.DEVNULL, stderr=log, text=True, env=d["env"])
    log.close()
    return proc


def _log(d: dict, name: str) -> str:
    return (d["tmp"] / f"{name}.log").read_text()


def _live(d: dict) -> dict:
    try:
        return json.loads((d["tmp"] / "store" / "live-stats.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _wait(what: str, check, procs: list[subprocess.Popen], d: dict, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        for proc in procs:
            assert proc.poll() is None, f"exited before {what}:\n{_log(d, 'coordinator')}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def _finish(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


# --- the service beyond loopback ---------------------------------------------------------

def test_the_service_listens_beyond_loopback_only_with_tls_and_clients_verify_it(
        tmp_path: Path) -> None:
    cert, key = make_self_signed([COORDINATOR], tmp_path / "tls")
    other, _ = make_self_signed([COORDINATOR], tmp_path / "other")
    with pytest.raises(ServiceError, match="only with TLS"):
        Service(Store.create(tmp_path / "refused"), listen="10.9.8.7:0", token=TOKEN)

    async def main() -> None:
        with Store.create(tmp_path / "store") as store:
            make = Factory(store)
            async with Service(store, listen=f"{COORDINATOR}:0", token=TOKEN,
                               tls=TLSFiles(cert=str(cert), key=str(key))) as service:
                assert service.tcp_address is not None
                address = f"{COORDINATOR}:{service.tcp_address[1]}"
                async with AsyncClient(address=address, token=TOKEN,
                                       tls=client_context(str(cert))) as client:
                    acks = await client.submit_group([make.session(), make.run()])
                    assert [a.status for a in acks] == ["committed", "committed"]
                quick = ClientLimits(reconnect_timeout=1.0, backoff_max=0.2)
                with pytest.raises(ServiceError) as untrusted:  # another CA: refused at once
                    async with AsyncClient(address=address, token=TOKEN, limits=quick,
                                           tls=client_context(str(other))):
                        pass
                assert untrusted.value.code == "tls"
                with pytest.raises(ServiceError) as wrong:
                    async with AsyncClient(address=address, token="not-" + TOKEN,
                                           limits=quick, tls=client_context(str(cert))):
                        pass
                assert wrong.value.code == "unauthorized"
                with pytest.raises(ServiceError, match="no connection"):  # plain TCP
                    async with AsyncClient(address=address, token=TOKEN, limits=quick):
                        pass
                stats = service.statistics()
                assert stats.writer.committed == 2
                assert stats.protocol_errors.get("unauthorized") == 1

    anyio.run(main)


def test_serve_refuses_a_non_loopback_address_without_tls_and_binds_nothing(
        tmp_path: Path) -> None:
    Store.create(tmp_path / "s").close()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    before = sorted(tmp_path.rglob("*"))
    result = subprocess.run(
        [sys.executable, "-m", "evidence", "serve", str(tmp_path / "s"), "--listen",
         "10.9.8.7:7400", "--token-file", str(token)], capture_output=True, text=True,
        timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ") and "only with TLS" in lines[0]
    assert lines[1].startswith("Try: ") and "--tls-cert" in lines[1]
    assert sorted(tmp_path.rglob("*")) == before


# --- crawling with worker hosts ---------------------------------------------------------

@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.slow
def test_worker_hosts_crawl_a_site_over_tls_into_the_object_store(
        deployment: dict, database: str, request: pytest.FixtureRequest) -> None:
    """The deployment docs/scale.md draws: a coordinator whose store is a directory or a
    PostgreSQL database, payloads in the object store, two worker hosts over TLS."""
    d = deployment
    if database == "postgresql":
        d["store"] = request.getfixturevalue("pg_url")
    # The pages are held until both hosts serve the run: on a loaded machine the crawl
    # could otherwise be over before the second host has started.
    with HeldSite(SiteConfig(pages=30)) as site:
        coordinator = _coordinator(d, site.url, "--timeout", "100")  # > any hold here
        hosts = [_host(d, "127.0.0.3", "host-a"), _host(d, "127.0.0.4", "host-b")]
        try:
            try:
                _wait("both hosts serving", lambda: all(
                    "serving run" in _log(d, name) for name in ("host-a", "host-b")),
                    [coordinator, *hosts], d)
            finally:
                site.release()
            assert coordinator.wait(180) == 0, _log(d, "coordinator")
            assert [h.wait(60) for h in hosts] == [0, 0]
        finally:
            _finish([coordinator, *hosts])
        counts = site.request_counts()
        reachable = site.reachable_pages()
    assert set(done_pages(d["store"])) == reachable
    assert all(counts[p] == 1 for p in reachable), "no page requested twice"
    log = _log(d, "coordinator")
    assert "worker host 127.0.0.3 #" in log and "worker host 127.0.0.4 #" in log
    served = [_log(d, name).count("serving run") for name in ("host-a", "host-b")]
    assert served == [1, 1]
    with Store.open(d["store"], read_only=True) as store:
        report = verify(store, full=True)
        # The hosts' attempts carry the connections they made (issue 33).
        peers = set(store.connection.execute(
            "SELECT remote_address, remote_port FROM fetch_attempt WHERE outcome = "
            "'response'").fetchall())
    assert report.ok, report.findings
    assert peers == {("127.0.0.1", int(site.url.rsplit(":", 1)[1].strip("/")))}


def test_a_worker_host_killed_mid_crawl_loses_only_the_pages_it_held(deployment: dict) -> None:
    d = deployment
    slow = {f"/p/{i}": 0.2 for i in range(60)}
    with TestSite(SiteConfig(pages=60, slow=slow)) as site:
        coordinator = _coordinator(d, site.url)
        hosts = [_host(d, "127.0.0.3", "host-a"), _host(d, "127.0.0.4", "host-b")]
        try:
            _wait("both hosts and some pages", lambda: len(_live(d).get("worker_hosts", []))
                  == 2 and _live(d).get("counts", {}).get("done", 0) >= 5,
                  [coordinator, *hosts], d)
            hosts[0].send_signal(signal.SIGKILL)
            assert coordinator.wait(240) == 0, _log(d, "coordinator")
            assert hosts[1].wait(60) == 0
        finally:
            _finish([coordinator, *hosts])
        counts = site.request_counts()
        reachable = site.reachable_pages()
    done = done_pages(d["tmp"] / "store")
    assert set(done) == reachable and all(n == 1 for n in done.values())
    twice = [p for p in reachable if counts[p] > 1]
    assert len(twice) <= 4, twice  # at most what it held: --workers 4 in flight in all
    log = _log(d, "coordinator")
    # The peer's end reaches the coordinator as an end of stream or, when the kernel
    # resets the connection under unread bytes, as a broken TLS stream: either is the loss.
    assert re.search(r"worker host 127\.0\.0\.3 #\d+ (closed|broke) its connection", log), log


def test_a_lost_host_is_logged_with_the_cause_of_an_empty_error() -> None:
    """A TLS stream whose peer vanished raises BrokenResourceError with no text: the log
    line names what broke it instead of ending in an empty colon."""
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError as reset:
            raise anyio.BrokenResourceError from reset
    except anyio.BrokenResourceError as broken:
        words = gone_in_words(broken)
    assert words == ("BrokenResourceError: ConnectionResetError: "
                     "[Errno 104] Connection reset by peer")
    assert gone_in_words(anyio.EndOfStream()) == "EndOfStream"
    assert gone_in_words(OSError("no route")) == "OSError: no route"


def test_a_silent_worker_host_is_fenced_when_its_lease_expires(deployment: dict) -> None:
    """SIGSTOP: the host's sockets stay open and it sends nothing, like a host cut off by
    the network. After --lease-timeout its pages go back to the frontier and its name is
    refused; resumed (SIGCONT), what it still tries to submit is refused, and it joins
    again as a new worker. Every page is recorded once."""
    d = deployment
    # Pages from /p/10 on are held until the stopped host has rejoined, so the crawl is
    # still running through each step below however long the machine takes over them.
    with HeldSite(SiteConfig(pages=60), held=pages_from(10)) as site:
        coordinator = _coordinator(d, site.url, "--lease-timeout", "3", "--timeout", "100")
        hosts = [_host(d, "127.0.0.3", "host-a"), _host(d, "127.0.0.4", "host-b")]
        try:
            try:
                _wait("both hosts and some pages", lambda: len(_live(d).get(
                    "worker_hosts", [])) == 2 and _live(d).get("counts", {}).get(
                    "done", 0) >= 5, [coordinator, *hosts], d)
                hosts[0].send_signal(signal.SIGSTOP)
                _wait("the lease to expire", lambda: "its leases expired" in
                      _log(d, "coordinator"), [coordinator], d, timeout=60)
                hosts[0].send_signal(signal.SIGCONT)
                _wait("the stopped host to rejoin", lambda: _log(d, "host-a").count(
                    "serving run") >= 2, [coordinator, *hosts], d, timeout=60)
            finally:
                site.release()
            assert coordinator.wait(240) == 0, _log(d, "coordinator")
            assert [h.wait(60) for h in hosts] == [0, 0]
        finally:
            for h in hosts:
                if h.poll() is None:
                    h.send_signal(signal.SIGCONT)
            _finish([coordinator, *hosts])
        reachable = site.reachable_pages()
    done = done_pages(d["tmp"] / "store")
    assert set(done) == reachable and all(n == 1 for n in done.values()), Counter(done)
    log = _log(d, "coordinator")
    assert "sent nothing for 3 s: its leases expired" in log
    host_log = _log(d, "host-a")
    assert "lost the coordinator" in host_log
    with Store.open(d["tmp"] / "store", read_only=True) as store:
        assert verify(store, full=True).ok


def test_a_fenced_client_is_cut_off_and_refused_and_what_it_sent_before_stands(
        tmp_path: Path) -> None:
    """What a crawl does to a worker host whose lease expired, at the service: what its
    connection had sent is committed, the connection ends, and its name is refused from
    then on (so nothing it still holds can be written after its pages were requeued)."""

    async def main() -> None:
        with Store.create(tmp_path / "store") as store:
            make = Factory(store)
            async with Service(store, socket_path=tmp_path / "w.sock") as service:
                limits = ClientLimits(reconnect_timeout=2.0, backoff_max=0.1)
                async with AsyncClient(tmp_path / "w.sock", name="worker host A #1",
                                       limits=limits) as fenced, \
                        AsyncClient(tmp_path / "w.sock", name="worker host B #2",
                                    limits=limits) as other:
                    acks = await fenced.submit_group([make.session(), make.run()])
                    assert [a.status for a in acks] == ["committed", "committed"]
                    await service.fence("worker host A #1")
                    assert not any(c.client == "worker host A #1"
                                   for c in service._connections)
                    with pytest.raises(ServiceError) as refused:
                        await fenced.submit(make.attempt())
                    assert refused.value.code == "lease_expired"
                    assert (await other.submit(make.attempt())).status == "committed"
                assert service.statistics().protocol_errors.get("lease_expired", 0) >= 1
            count = store.connection.execute("SELECT count(*) FROM fetch_attempt").fetchall()
            assert count == [(1,)]

    anyio.run(main)
