"""With whom and how each request was exchanged (issue 33, point 1).

A crawl of a TLS site on 127.0.0.1, named ``localhost`` (a throwaway authority made here: a
root, an intermediate, and a leaf for ``localhost``), must record the address and port
actually connected to, the local ones, the TLS version, cipher and ALPN protocol the server
saw, the SNI it received, the chain it presented (byte for byte) and that it was verified,
and the resolution of ``localhost`` as its own row, which the attempts reference. All of it
is in the attempts' ledger entries (an edited row is found by verify), in ``replay --json``
and ``show``, in the WARC (``WARC-IP-Address``, metadata records, read back with warcio),
and in an export that restores into SQLite and PostgreSQL and exports again to the same
bytes.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import shutil
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import CrawlConfig, Crawler, CrawlOptions, Store, verify
from evidence._archive.archive import restore
from evidence._archive.export import export
from evidence._archive.warc import der_certificates, export_warc
from evidence._audit.replay import replay
from evidence._audit.show import extract, page_evidence
from evidence._cli.main import main as cli_main
from evidence._crawl.netpolicy import hosts_source
from evidence._demo.site import SiteConfig, TestSite
from evidence._model.messages import FetchAttempt, canonical_encode, decode_message, utc_now

from .conftest import new_pg_database

PAGE = b"<!doctype html><title>Secure</title><p>over TLS</p>"


@dataclass
class TlsSite:
    """A keep-alive HTTPS site on 127.0.0.1 that notes what each handshake settled."""

    url: str
    port: int
    chain: bytes  # the DER certificates it presents, leaf first
    seen: list[tuple[str | None, str, str, str | None]] = field(default_factory=list)


def authority(directory: Path) -> tuple[Path, ssl.SSLContext, bytes]:
    """A root CA file to trust, a server context for ``localhost`` and 127.0.0.1 presenting
    its leaf and the intermediate that signed it, and those two in DER."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def certificate(subject: str, issuer: str, key, signer, *, ca: bool, serial: int):
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(key.public_key()).serial_number(serial)
                   .not_valid_before(now - dt.timedelta(hours=1))
                   .not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
        return builder.sign(signer, hashes.SHA256())

    root_key, middle_key, leaf_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    root = certificate("test root", "test root", root_key, root_key, ca=True, serial=1)
    middle = certificate("test intermediate", "test root", middle_key, root_key, ca=True,
                         serial=2)
    leaf = certificate("localhost", "test intermediate", leaf_key, middle_key, ca=False,
                       serial=3)
    pem, der = serialization.Encoding.PEM, serialization.Encoding.DER
    (directory / "root.pem").write_bytes(root.public_bytes(pem))
    (directory / "chain.pem").write_bytes(leaf.public_bytes(pem) + middle.public_bytes(pem))
    (directory / "leaf.key").write_bytes(leaf_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "chain.pem", directory / "leaf.key")
    context.set_alpn_protocols(["http/1.1"])  # the handler speaks HTTP/1.1 only
    return directory / "root.pem", context, leaf.public_bytes(der) + middle.public_bytes(der)


@pytest.fixture(scope="module")
def tls_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TlsSite, Path]]:
    directory = tmp_path_factory.mktemp("ca")
    ca_file, context, chain = authority(directory)
    names: dict[int, str | None] = {}
    context.sni_callback = lambda tls, name, _ctx: names.__setitem__(id(tls), name)
    site = TlsSite(url="", port=0, chain=chain)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            tls = self.connection
            site.seen.append((names.get(id(tls)), tls.version(), tls.cipher()[0],
                              tls.selected_alpn_protocol()))
            status, body = (200, PAGE) if self.path == "/" else (404, b"not found")
            self.send_response(status)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    site.port = server.server_address[1]
    site.url = f"https://localhost:{site.port}/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site, ca_file
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def tls_store(tls_site: tuple[TlsSite, Path], tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[Path, TlsSite]:
    site, ca_file = tls_site
    path = tmp_path_factory.mktemp("tls") / "store"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SSL_CERT_FILE", str(ca_file))  # the crawler trusts the test root
        with Store.create(path) as store:
            result = anyio.run(Crawler(store, CrawlConfig(seeds=[site.url]),
                                       CrawlOptions(workers=1)).run)
    assert result.session_completed
    return path, site


def attempts(store: Store) -> list[tuple]:
    return store.connection.execute(
        "SELECT f.url, f.remote_address, f.remote_port, f.local_address, f.local_port, "
        "f.tls_version, f.tls_cipher, f.tls_alpn, f.tls_sni, f.tls_verified, f.tls_chain_id, "
        "f.resolution_seq, f.connection_reused FROM fetch_attempt f "
        "ORDER BY f.attempt_seq").fetchall()


def test_a_tls_crawl_records_the_peer_the_handshake_and_the_chain(tls_store) -> None:
    path, site = tls_store
    sni, version, cipher, alpn = site.seen[-1]
    assert (sni, alpn) == ("localhost", "http/1.1")  # the server offers http/1.1 only
    with Store.open(path, read_only=True) as store:
        rows = attempts(store)
        assert [r[0] for r in rows] == [site.url + "robots.txt", site.url]
        for (_url, remote, port, local, local_port, v, c, a, s, verified, chain_id, dns,
             _reused) in rows:
            assert (remote, port, local) == ("127.0.0.1", site.port, "127.0.0.1")
            assert local_port > 0 and local_port != site.port
            assert (v, c, a, s, verified) == (version, cipher, alpn, sni, 1)
            assert chain_id == rows[0][10] and dns is not None
        # The chain is one payload, the certificates exactly as the server presented them.
        page = page_evidence(store, site.url)
        assert extract(store, page, "certs") == site.chain
        assert der_certificates(site.chain)[0] == site.chain[:len(der_certificates(
            site.chain)[0])]
        (host, port, source, addresses, ttl), = store.connection.execute(
            "SELECT host, port, source, addresses, ttl FROM dns_resolution").fetchall()
        assert (host, port, ttl) == ("localhost", site.port, None)
        assert "127.0.0.1" in json.loads(addresses)
        assert source == hosts_source("localhost")
        assert verify(store, full=True).ok


def test_the_facts_are_in_replay_json_and_show(tls_store, capsys) -> None:
    path, site = tls_store
    with Store.open(path, read_only=True) as store:
        chain_ref = replay(store, site.url).connection.tls.chain_ref  # type: ignore[union-attr]
    assert cli_main(["replay", str(path), site.url, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["connection"]
    sni, version, cipher, alpn = site.seen[-1]
    assert {k: found[k] for k in ("remote_address", "remote_port", "local_address")} == {
        "remote_address": "127.0.0.1", "remote_port": site.port, "local_address": "127.0.0.1"}
    assert found["tls"] == {"version": version, "cipher": cipher, "alpn": alpn, "sni": sni,
                            "verified": True, "chain_ref": msgspec.to_builtins(chain_ref)}
    assert found["dns"]["host"] == "localhost" and "127.0.0.1" in found["dns"]["addresses"]
    assert cli_main(["show", str(path), site.url]) == 0
    text = capsys.readouterr().out
    assert f"to 127.0.0.1:{site.port} from 127.0.0.1:" in text
    assert f"{version} {cipher}, ALPN http/1.1, SNI localhost" in text
    assert "localhost resolved to" in text and "verified" in text


def test_the_warc_has_the_address_and_metadata_records_for_tls_and_dns(
        tls_store, tmp_path: Path) -> None:
    from warcio.archiveiterator import ArchiveIterator

    path, site = tls_store
    with Store.open(path, read_only=True) as store:
        export_warc(store, tmp_path / "out.warc.gz")
    records = []
    with open(tmp_path / "out.warc.gz", "rb") as f:
        for record in ArchiveIterator(f):
            records.append((record.rec_type, record.rec_headers, record.content_stream().read()))
    for kind in ("response", "request"):
        assert all(h.get_header("WARC-IP-Address") == "127.0.0.1"
                   for t, h, _ in records if t == kind)
    dns = [(h, block) for t, h, block in records
           if t == "metadata" and h.get_header("WARC-Target-URI") == "dns:localhost"]
    assert len(dns) == 1  # one resolution, written once, before the first response
    kinds = [(t, h.get_header("WARC-Target-URI")) for t, h, _ in records]
    assert kinds.index(("metadata", "dns:localhost")) < kinds.index(
        ("response", site.url + "robots.txt"))
    fields = dns[0][1].decode().splitlines()
    assert "host: localhost" in fields and "address: 127.0.0.1" in fields
    page = [block.decode() for t, h, block in records
            if t == "metadata" and h.get_header("WARC-Target-URI") == site.url]
    lines = page[0].splitlines()
    sni, version, cipher, alpn = site.seen[-1]
    for line in ("remoteAddress: 127.0.0.1", f"remotePort: {site.port}",
                 f"tlsVersion: {version}", f"tlsCipher: {cipher}", f"tlsAlpn: {alpn}",
                 f"tlsSni: {sni}", "tlsVerified: true",
                 f"dnsRecord: {dns[0][0].get_header('WARC-Record-ID')}"):
        assert line in lines
    certificates = [base64.b64decode(line.split(": ", 1)[1]) for line in lines
                    if line.startswith("tlsCertificate: ")]
    assert b"".join(certificates) == site.chain and len(certificates) == 2


def test_an_edited_address_or_answer_is_found_by_verify(tls_store, tmp_path: Path) -> None:
    path, _site = tls_store
    for table, edit in (
            ("fetch_attempt", "UPDATE fetch_attempt SET remote_address = '10.0.0.7'"),
            ("dns_resolution", "UPDATE dns_resolution SET addresses = '[\"10.0.0.7\"]'")):
        copy = tmp_path / table
        shutil.copytree(path, copy)
        with Store.open(copy) as store:
            conn = store.connection
            triggers = conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = "
                                    "'trigger' AND tbl_name = ?", (table,)).fetchall()
            for name, _ in triggers:
                conn.execute(f"DROP TRIGGER {name}")
            conn.execute(edit)
            for _, sql in triggers:
                conn.execute(sql)
            report = verify(store)
        assert not report.ok
        wrong = [f.message for f in report.errors if f.kind == "row_mismatch"]
        assert wrong and all("10.0.0.7" in m for m in wrong), wrong


def test_the_facts_export_restore_and_export_again_to_the_same_bytes_on_both_backends(
        tls_store, tmp_path: Path, pg_cluster) -> None:
    path, _site = tls_store
    first = export(path, tmp_path / "a")
    copies = {"sqlite": str(tmp_path / "restored"), "postgresql": new_pg_database(pg_cluster)}
    for name, target in copies.items():
        restore(tmp_path / "a", target, artifacts=None if name == "sqlite"
                else tmp_path / "pg-payloads")
        again = export(target, tmp_path / f"again-{name}")
        assert {k: v.blake3 for k, v in again.tables.items()} == {
            k: v.blake3 for k, v in first.tables.items()}, name
        assert again.log == first.log
    assert first.tables["dns_resolution"].rows == 1
    # A run's archive holds the resolutions and chains its attempts reference, and restores.
    with Store.open(path, read_only=True) as store:
        (run_id,), = store.connection.execute("SELECT run_id FROM crawl_run").fetchall()
    one_run = export(path, tmp_path / "run", run_id=run_id)
    assert one_run.tables["dns_resolution"].rows == 1 and "dns_resolution" not in (
        one_run.excluded_tables)
    restore(tmp_path / "run", tmp_path / "run-restored")
    with Store.open(tmp_path / "run-restored", read_only=True) as store:
        assert store.connection.execute(
            "SELECT count(*) FROM fetch_attempt f JOIN dns_resolution USING (resolution_seq) "
            "JOIN artifact t ON t.artifact_id = f.tls_chain_id").fetchall() == [(2,)]


def test_a_plain_crawl_of_localhost_records_each_resolution_once(tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=6, links_per_page=2)) as site:
        url = site.url.replace("127.0.0.1", "localhost")
        with Store.create(tmp_path / "s") as store:
            result = anyio.run(Crawler(store, CrawlConfig(seeds=[url]),
                                       CrawlOptions(workers=2)).run)
            assert result.session_completed
            conn = store.connection
            rows = conn.execute("SELECT remote_address, remote_port, tls_version, "
                                "resolution_seq, connection_reused FROM fetch_attempt "
                                "WHERE outcome = 'response'").fetchall()
            resolutions = conn.execute("SELECT resolution_seq, host, addresses FROM "
                                       "dns_resolution").fetchall()
            # Each resolution once, each referenced; kept-alive connections reuse theirs.
            assert {r[3] for r in rows} == {r[0] for r in resolutions}
            assert len(resolutions) <= 2 < len(rows) and any(r[4] for r in rows)
            assert all(r[:3] == ("127.0.0.1", site.port, None) for r in rows)
            assert all(h == "localhost" and "127.0.0.1" in json.loads(a)
                       for _, h, a in resolutions)
            assert verify(store).ok


def test_an_attempt_without_the_facts_encodes_as_before() -> None:
    """The leaf of an attempt recorded before issue 33 is unchanged: a message without a
    connection encodes with no trace of the field, so old stores stay verifiable."""
    old = FetchAttempt(message_id="m1", attempt_id="a1", run_id="r1", url="http://h/",
                       sequence=0, started_at=utc_now(), elapsed_ms=1.0, outcome="timeout")
    encoded = canonical_encode(old)
    assert "connection" not in msgspec.msgpack.decode(encoded)
    assert canonical_encode(decode_message(encoded)) == encoded


def test_the_hosts_file_is_named_only_when_the_resolver_reads_it_first(
        tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost loopy.test # a comment\n::1 ip6-localhost\n")
    files_first = tmp_path / "files-first"
    files_first.write_text("passwd: files\nhosts:  files mdns4_minimal dns\n")
    dns_first = tmp_path / "dns-first"
    dns_first.write_text("hosts: dns files\n")
    named = {(name, ns.name): hosts_source(name, hosts=str(hosts), nsswitch=str(ns))
             for name in ("loopy.test", "LOOPY.test.", "example.test", "comment")
             for ns in (files_first, dns_first)}
    assert named == {
        ("loopy.test", "files-first"): "hosts-file", ("loopy.test", "dns-first"): "getaddrinfo",
        ("LOOPY.test.", "files-first"): "hosts-file", ("LOOPY.test.", "dns-first"): "getaddrinfo",
        ("example.test", "files-first"): "getaddrinfo",
        ("example.test", "dns-first"): "getaddrinfo",
        ("comment", "files-first"): "getaddrinfo", ("comment", "dns-first"): "getaddrinfo"}
    # No nsswitch.conf: glibc reads files first.
    assert hosts_source("loopy.test", hosts=str(hosts),
                        nsswitch=str(tmp_path / "absent")) == "hosts-file"


def test_a_store_made_at_schema_8_upgrades_verifies_and_takes_the_facts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migration 011 (and those before it) on a populated schema-8 store: its rows, log and
    exports are what the same messages give in a new store, it verifies, and it then
    records an attempt with its connection like a new one."""
    import apsw

    from evidence._model.messages import Connection, DnsAnswer, Tls
    from evidence._store import sqlite as _store

    from .conftest import Factory, submit_all

    with Store.create(tmp_path / "new") as new:  # the messages as the old version wrote them
        make = Factory(new)
        head = new.artifacts.put("headers", b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n")
        body = make.body(b"<a href=/x>x</a>")
        attempt = make.attempt(response_headers=head, body=body, capture="wire")
        submit_all(new, [make.session(), make.run(), attempt])
    real = _store.load_migrations
    monkeypatch.setattr(_store, "load_migrations", lambda directory=None: real(directory)[:8])
    Store.create(tmp_path / "old").close()
    monkeypatch.undo()
    conn = apsw.Connection(str(tmp_path / "old" / "evidence.db"))
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("ATTACH ? AS src", (str(tmp_path / "new" / "evidence.db"),))
    assert conn.execute("PRAGMA user_version").fetchall()[0][0] == 8
    for (table,) in conn.execute("SELECT name FROM main.sqlite_schema WHERE type = 'table' "
                                 "AND name NOT LIKE 'sqlite%' AND name != 'schema_migration'"
                                 ).fetchall():
        columns = ", ".join(c[1] for c in conn.execute(f"PRAGMA main.table_info({table})"))
        conn.execute(f"DELETE FROM main.{table}")
        conn.execute(f"INSERT INTO main.{table} ({columns}) SELECT {columns} FROM src.{table}")
    # What later migrations add to store_meta (010's legacy_quarantine) is theirs to add.
    conn.execute("DELETE FROM main.store_meta WHERE key = 'legacy_quarantine'")
    conn.close()
    shutil.copytree(tmp_path / "new" / "artifacts", tmp_path / "old" / "artifacts",
                    dirs_exist_ok=True)
    with Store.open(tmp_path / "old") as old:  # applies 009, 010, 011
        assert old.connection.execute("PRAGMA user_version").fetchall()[0][0] == len(
            _store.load_migrations())
        assert old.connection.execute("SELECT remote_address, resolution_seq, tls_chain_id "
                                      "FROM fetch_attempt").fetchall() == [(None, None, None)]
        assert verify(old, full=True).ok
    a, b = export(tmp_path / "new", tmp_path / "a"), export(tmp_path / "old", tmp_path / "b")
    assert a.log == b.log
    assert {k: v.blake3 for k, v in a.tables.items() if k != "schema_migration"} == {
        k: v.blake3 for k, v in b.tables.items() if k != "schema_migration"}
    with Store.open(tmp_path / "old") as old:  # the same factory: ids not used yet
        chain = old.artifacts.put("certs", b"\x30\x03\x02\x01\x07")
        answer = DnsAnswer(resolution_id="dns-1", host="example.test", port=443,
                           resolved_at=utc_now(), source="given", addresses=["192.0.2.1"])
        later = make.attempt(run_id="r2", response_headers=head, body=body, capture="wire",
                             connection=(
            Connection(remote_address="192.0.2.1", remote_port=443, dns=answer,
                       tls=Tls(version="TLSv1.3", cipher="TLS_AES_128_GCM_SHA256",
                               sni="example.test", chain=chain, verified=True))))
        assert [a.status for a in submit_all(old, [make.run("r2"), later])] == [
            "committed", "committed"]
        assert old.connection.execute(
            "SELECT f.remote_address, d.host, t.namespace FROM fetch_attempt f JOIN "
            "dns_resolution d USING (resolution_seq) JOIN artifact t ON t.artifact_id = "
            "f.tls_chain_id").fetchall() == [("192.0.2.1", "example.test", "certs")]
        assert verify(old, full=True).ok


def test_an_answer_recorded_under_an_id_cannot_be_replaced(store: Store, make) -> None:
    """A second attempt naming a recorded resolution with another answer is refused whole
    (a conflict); the same answer again is what every attempt over a connection carries."""
    from evidence._model.messages import Connection, DnsAnswer

    from .conftest import submit_all

    answer = DnsAnswer(resolution_id="dns-1", host="example.test", port=80,
                       resolved_at=utc_now(), source="getaddrinfo", addresses=["192.0.2.1"])
    other = msgspec.structs.replace(answer, addresses=["192.0.2.66"])
    made = [make.attempt(outcome="timeout", sequence=i, connection=Connection(
        remote_address="192.0.2.1", remote_port=80, dns=dns, reused=i > 0))
        for i, dns in enumerate((answer, answer, other))]
    acks = submit_all(store, [make.session(), make.run(), *made])
    assert [a.status for a in acks[2:]] == ["committed", "committed", "conflict"]
    assert "resolution dns-1 is recorded with another answer" in acks[4].reason
    assert store.connection.execute("SELECT addresses FROM dns_resolution").fetchall() == [
        ('["192.0.2.1"]',)]
    assert verify(store).ok


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["dns-a", "dns-b"]), st.sampled_from([1, 2])),
                min_size=1, max_size=6))
def test_any_sequence_of_attempts_keeps_each_first_answer_once(
        tmp_path_factory: pytest.TempPathFactory, sequence: list[tuple[str, int]]) -> None:
    """Whatever the order in which attempts carrying answers arrive: one row per resolution
    id, holding the first answer; an attempt carrying that answer again commits, one
    carrying another answer under the same id is a conflict and changes nothing."""
    from evidence._model.messages import Connection, DnsAnswer

    from .conftest import Factory, submit_all

    when = utc_now()
    with Store.create(tmp_path_factory.mktemp("any") / "s") as store:
        make = Factory(store)
        made = [make.attempt(outcome="timeout", sequence=i, connection=Connection(
            remote_address=f"192.0.2.{variant}", remote_port=80, dns=DnsAnswer(
                resolution_id=rid, host="example.test", port=80, resolved_at=when,
                source="getaddrinfo", addresses=[f"192.0.2.{variant}"])))
            for i, (rid, variant) in enumerate(sequence)]
        acks = submit_all(store, [make.session(), make.run(), *made])[2:]
        first: dict[str, int] = {}
        for rid, variant in sequence:
            first.setdefault(rid, variant)
        assert [a.status for a in acks] == [
            "committed" if first[rid] == variant else "conflict" for rid, variant in sequence]
        assert dict(store.connection.execute(
            "SELECT resolution_id, addresses FROM dns_resolution").fetchall()) == {
            rid: f'["192.0.2.{variant}"]' for rid, variant in first.items()}
        assert verify(store).ok
