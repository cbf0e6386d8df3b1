"""Crawling through a proxy (issue 36, point 3): HTTP CONNECT and SOCKS5 tunnels for fetches
and renders, recorded with each attempt, under the network policy.

The proxies are the small ones of ``tests/proxies.py`` on 127.0.0.1, each counting the
tunnels it served. A crawl through one must tunnel every connection it makes (the number
of tunnels is the number of new connections its attempts record), store the bytes
exchanged with the origin (a request in origin form, never a CONNECT or the proxy's
credentials), and record which proxy, what it was asked for and what it answered, in the
attempt's ledger entry, ``replay --json``, ``show`` and the WARC. A proxy that refuses, or
is down, leaves a failed attempt that says so; the policy refuses a private origin
before the proxy is asked for it; the credentials appear nowhere in the store.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence import CrawlConfig, Crawler, CrawlOptions, Store, verify
from evidence._archive.warc import export_warc
from evidence._audit.replay import replay
from evidence._cli.main import main as cli_main
from evidence._crawl.fetch import fetch
from evidence._crawl.http import crawl_client
from evidence._crawl.netpolicy import NetworkPolicy
from evidence._crawl.proxy import Routes, parse_proxy, parse_routes
from evidence._demo.site import SiteConfig, TestSite
from evidence._errors import EvidenceError
from evidence._model.messages import FetchAttempt, decode_message

from . import proxies
from .test_connection_facts import authority

SECRET = "s3cr3t-pass"  # a password to look for: it must never be stored


def crawl(path: Path, config: CrawlConfig, **options: object):
    with Store.create(path) as store:
        return anyio.run(Crawler(store, config, CrawlOptions(workers=2, **options)).run)


def attempts(path: Path) -> list[FetchAttempt]:
    """Every attempt of the store, as its ledger entry says (the message its leaf covers)."""
    with Store.open(path, read_only=True) as store:
        rows = store.connection.execute(
            "SELECT l.payload FROM fetch_attempt f JOIN ingest_ledger l "
            "ON l.log_index = f.log_index ORDER BY f.attempt_seq").fetchall()
    found = [decode_message(payload) for (payload,) in rows]
    assert all(isinstance(m, FetchAttempt) for m in found)
    return found  # type: ignore[return-value]


def stored_bytes(path: Path) -> bytes:
    """Every byte of the store's files (database, WAL, packs)."""
    return b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())


def connected(found: list[FetchAttempt]) -> list[FetchAttempt]:
    return [m for m in found if m.connection is not None]


@pytest.fixture(scope="module")
def site() -> Iterator[TestSite]:
    with TestSite(SiteConfig(pages=3)) as s:
        yield s


@pytest.mark.parametrize("kind", ["http", "socks5"])
def test_a_crawl_through_a_proxy_tunnels_every_connection_and_records_it(
        kind: str, site: TestSite, tmp_path: Path, capsys) -> None:
    path = tmp_path / "store"
    with proxies.running(kind, credentials=("crawler", SECRET)) as proxy:
        result = crawl(path, CrawlConfig(seeds=[site.url], proxy=proxy.url()),
                       proxy_credentials={proxy.url(): ("crawler", SECRET)})
    assert result.session_completed and not proxy.refused
    found = connected(attempts(path))
    assert len(found) >= 5
    # Every connection was a tunnel: as many tunnels as attempts on a new connection.
    assert len(proxy.tunnels) == sum(not m.connection.reused for m in found)  # type: ignore[union-attr]
    port = int(site.url.rsplit(":", 1)[1].strip("/"))
    assert set(proxy.tunnels) == {("127.0.0.1", port)}  # the checked address, not a name
    reply = "HTTP/1.1 200 Connection established" if kind == "http" else "succeeded"
    for m in found:
        c = m.connection
        assert c is not None and c.proxy is not None
        assert (c.remote_address, c.remote_port) == ("127.0.0.1", proxy.port)
        assert (c.proxy.scheme, c.proxy.host, c.proxy.port) == (kind, "127.0.0.1", proxy.port)
        assert (c.proxy.target, c.proxy.target_port, c.proxy.reply) == ("127.0.0.1", port,
                                                                        reply)
        assert c.proxy.established
    with Store.open(path, read_only=True) as store:
        assert verify(store, full=True).ok
        replayed = replay(store, site.url)
        assert replayed.connection is not None and replayed.connection.proxy is not None
        (config,) = store.connection.execute(
            "SELECT config FROM crawl_session").fetchone()
    # The origin's bytes: a request in origin form, no CONNECT, no proxy credentials.
    assert cli_main(["show", str(path), site.url, "--request", str(tmp_path / "q")]) == 0
    sent = (tmp_path / "q").read_bytes().decode("latin-1")
    capsys.readouterr()
    assert sent.startswith("GET / HTTP/1.1\r\n") and "CONNECT" not in sent
    assert "Proxy-Authorization" not in sent
    assert proxy.url() in config and SECRET not in config
    assert SECRET.encode() not in stored_bytes(path)
    assert cli_main(["replay", str(path), site.url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["connection"]["proxy"]
    assert shown == {"scheme": kind, "host": "127.0.0.1", "port": proxy.port,
                     "target": "127.0.0.1", "target_port": port, "reply": reply,
                     "established": True, "dns": None}
    assert cli_main(["show", str(path), site.url]) == 0
    assert f"through the {kind} proxy 127.0.0.1:{proxy.port}, to 127.0.0.1:{port}: " \
        f"{reply}" in capsys.readouterr().out


def test_the_warc_names_the_proxy_in_the_attempts_metadata(site: TestSite,
                                                           tmp_path: Path) -> None:
    from warcio.archiveiterator import ArchiveIterator

    path = tmp_path / "store"
    with proxies.running("http") as proxy:
        crawl(path, CrawlConfig(seeds=[site.url], proxy=proxy.url()))
    with Store.open(path, read_only=True) as store:
        export_warc(store, tmp_path / "out.warc")
    with open(tmp_path / "out.warc", "rb") as f:
        records = [(r.rec_type, r.rec_headers.get_header("WARC-Target-URI"),
                    r.rec_headers.get_header("WARC-IP-Address"), r.content_stream().read())
                   for r in ArchiveIterator(f)]
    (block,) = [b for t, u, _ip, b in records if t == "metadata" and u == site.url]
    lines = block.decode().splitlines()
    port = site.url.rsplit(":", 1)[1].strip("/")
    for line in ("proxyScheme: http", "proxyHost: 127.0.0.1", f"proxyPort: {proxy.port}",
                 "proxyTarget: 127.0.0.1", f"proxyTargetPort: {port}",
                 "proxyReply: HTTP/1.1%20200%20Connection%20established",  # one line
                 f"remotePort: {proxy.port}"):
        assert line in lines
    # The address contacted is the proxy's, on the request and response records alike.
    assert {ip for t, _u, ip, _b in records if t in ("request", "response")} == {"127.0.0.1"}


def test_a_tls_origin_through_connect_is_verified_for_its_name(tmp_path: Path,
                                                               monkeypatch) -> None:
    ca_file, context, _chain = authority(tmp_path)
    names: list[str | None] = []
    context.sni_callback = lambda tls, name, _ctx: names.append(name)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = b"<title>tunnelled</title>" if self.path == "/" else b"none"
            self.send_response(200 if self.path == "/" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://localhost:{server.server_address[1]}/"
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
    try:
        with proxies.running("http") as proxy:
            result = crawl(tmp_path / "store", CrawlConfig(seeds=[url], proxy=proxy.url()))
    finally:
        server.shutdown()
        server.server_close()
    assert result.session_completed
    found = connected(attempts(tmp_path / "store"))
    assert {m.url for m in found} == {url + "robots.txt", url}
    assert set(names) == {"localhost"}  # SNI names the origin, not the address asked for
    assert proxy.tunnels and {t for t, _p in proxy.tunnels} == {"127.0.0.1"}
    for m in found:
        c = m.connection
        assert c is not None and c.tls is not None and c.proxy is not None
        assert c.tls.verified and c.tls.sni == "localhost" and c.tls.chain is not None
        assert c.dns is not None and c.dns.host == "localhost"  # the origin's resolution
        assert c.proxy.target == "127.0.0.1" and c.remote_port == proxy.port


@pytest.mark.parametrize(("kind", "refuse", "reply"), [
    ("http", None, "HTTP/1.1 407 Proxy Authentication Required"),
    ("http", 403, "HTTP/1.1 403 Refused"),
    ("socks5", None, "username/password authentication failed (status 1)"),
    ("socks5", 2, "connection not allowed by ruleset (0x02)"),
])
def test_a_proxy_that_refuses_leaves_a_failed_attempt_saying_what_it_answered(
        kind: str, refuse: int | None, reply: str, site: TestSite, tmp_path: Path) -> None:
    path = tmp_path / "store"
    credentials = ("crawler", SECRET) if refuse is None else None
    wrong = {} if refuse is not None else {"x": ("crawler", "wrong")}
    with proxies.running(kind, credentials=credentials, refuse=refuse) as proxy:
        given = {proxy.url(): ("crawler", "wrong")} if wrong else {}
        crawl(path, CrawlConfig(seeds=[site.url], proxy=proxy.url(), obey_robots=False,
                                max_attempts=1), proxy_credentials=given)
    assert not proxy.tunnels and proxy.refused
    (m,) = attempts(path)
    assert m.outcome == "network_error" and m.http_status is None
    assert m.error is not None and m.error.startswith("ProxyError: ")
    assert f"proxy {proxy.url()} refused the tunnel to 127.0.0.1:" in m.error
    assert reply in m.error and "wrong" not in m.error
    c = m.connection
    assert c is not None and c.proxy is not None
    assert (c.proxy.reply, c.proxy.established) == (reply, False)
    assert (c.remote_address, c.remote_port) == ("127.0.0.1", proxy.port)
    assert m.request_headers is None  # nothing was sent to the origin
    with Store.open(path, read_only=True) as store:
        assert verify(store, full=True).ok


def test_a_proxy_that_is_down_is_a_network_error_naming_it(site: TestSite,
                                                          tmp_path: Path) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # nothing listens there once it is closed
    down = f"socks5://127.0.0.1:{port}"
    crawl(tmp_path / "store", CrawlConfig(seeds=[site.url], proxy=down, obey_robots=False,
                                          max_attempts=1))
    (m,) = attempts(tmp_path / "store")
    assert m.outcome == "network_error" and m.connection is None
    assert m.error is not None
    assert m.error.startswith(f"ProxyError: proxy {down} cannot be reached: ")


def test_the_policy_refuses_a_private_origin_before_the_proxy_is_asked(
        site: TestSite, tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=1)) as other, proxies.running("http") as proxy:
        routes = parse_routes(proxy.url())

        async def main() -> list[FetchAttempt]:
            found = []
            with Store.create(tmp_path / "store") as store:
                for seeds in ([site.url, proxy.url()], [site.url]):
                    policy = NetworkPolicy(seeds=seeds)
                    async with crawl_client(connections=2, timeout=10, policy=policy,
                                            proxies=routes) as client:
                        for url in (other.url, site.url):
                            result = await fetch(client, store.artifacts, url=url,
                                                 run_id="r-1", sequence=1, user_agent="t",
                                                 max_body_bytes=1 << 20)
                            found.append(result.attempt)
            return found

        first_other, first_site, second_other, second_site = anyio.run(main)
    # The other origin (loopback, not a seed's): refused before the proxy heard of it.
    assert first_other.outcome == "skipped" and "loopback" in (first_other.error or "")
    assert first_site.outcome == "response" and first_site.connection is not None
    # A proxy the policy was not told of is checked like any address: loopback, refused.
    assert second_other.outcome == second_site.outcome == "skipped"
    assert second_site.error is not None and second_site.error.startswith(
        f"network: the proxy {proxy.url()}: 127.0.0.1, loopback, is not allowed")
    port = int(site.url.rsplit(":", 1)[1].strip("/"))
    assert proxy.tunnels == [("127.0.0.1", port)]
    assert not other.requests


def test_a_rendered_crawl_sends_every_browser_request_through_the_proxy(
        tmp_path: Path, chromium: str) -> None:
    from evidence._crawl.render import RenderOptions

    from .jssite import JsSite

    path = tmp_path / "store"
    with JsSite() as site, proxies.running("socks5") as proxy:
        result = crawl(path, CrawlConfig(seeds=[site.url], render=True, proxy=proxy.url()),
                       render=RenderOptions(executable=chromium))
        hits = dict(site.hits)
    assert result.session_completed
    found = attempts(path)
    rendered = [m for m in found if m.render_id is not None]
    assert {m.url.rsplit("/", 1)[1] for m in rendered} >= {"logo.png", "style.css",
                                                           "data.json"}
    for m in connected(found):
        assert m.connection.proxy is not None  # type: ignore[union-attr]
    assert len(proxy.tunnels) == sum(not m.connection.reused  # type: ignore[union-attr]
                                     for m in connected(found))
    # The site saw no request but those the proxy's tunnels carried: every one recorded.
    assert sum(hits.values()) == len(connected(found))


def test_routes_pick_the_first_matching_rule_and_none_connects_directly() -> None:
    routes = parse_routes("http://127.0.0.1:3128", [
        {"hosts": ["*.example.com", "other.test"], "url": "socks5://127.0.0.1:1080"},
        {"hosts": "direct.example.com", "url": "none"},
        {"hosts": "*", "url": "none"}])
    assert routes.for_host("a.example.com").url == "socks5://127.0.0.1:1080"  # type: ignore[union-attr]
    assert routes.for_host("OTHER.test").url == "socks5://127.0.0.1:1080"  # type: ignore[union-attr]
    assert routes.for_host("direct.example.com").url == "socks5://127.0.0.1:1080"  # type: ignore[union-attr]
    assert routes.for_host("example.com") is None  # "*" matched first
    assert Routes(parse_proxy("http://127.0.0.1:3128")).for_host("x.test") is not None
    for bad in ("ftp://127.0.0.1:21", "http://127.0.0.1", "socks5://:1080",
                "http://127.0.0.1:3128/path", "127.0.0.1:3128"):
        with pytest.raises(EvidenceError):
            parse_proxy(bad)
    with pytest.raises(EvidenceError, match="hosts must be"):
        parse_routes(None, [{"hosts": [], "url": "none"}])


@settings(max_examples=50)
@given(st.text(max_size=20))
def test_a_proxy_password_never_shows_in_its_name_its_repr_or_an_error(tail: str) -> None:
    from urllib.parse import quote

    password = f"Q!{tail}"  # "Q!" appears in no proxy's name
    text = f"http://user:{quote(password, safe='')}@127.0.0.1:3128"
    proxy = parse_proxy(text)
    assert proxy is not None and proxy.password == password
    assert password not in proxy.url and password not in repr(proxy)
    with pytest.raises(EvidenceError) as caught:
        parse_proxy(text.replace("http://", "ftp://"))
    assert quote(password, safe="") not in str(caught.value)


def test_the_cli_takes_proxies_from_the_command_line_and_the_configuration(
        site: TestSite, tmp_path: Path, capsys) -> None:
    with proxies.running("http", credentials=("crawler", SECRET)) as proxy, \
            proxies.running("socks5") as other:
        config = tmp_path / "crawl.toml"
        config.write_text(f'[[proxies]]\nhosts = "127.0.0.1"\nurl = "{other.url()}"\n'
                          '[[proxies]]\nhosts = "*"\nurl = "none"\n')
        store = tmp_path / "store"
        assert cli_main(["crawl", site.url, "--store", str(store), "--config", str(config),
                         "--proxy", proxy.url(userinfo=f"crawler:{SECRET}")]) == 0
    err = capsys.readouterr().err
    assert "Warning: the --proxy URL on this command line holds a password" in err
    assert SECRET not in err
    assert other.tunnels and not proxy.tunnels  # the host's rule wins over --proxy
    with Store.open(store, read_only=True) as opened:
        (recorded,) = opened.connection.execute("SELECT config FROM crawl_session").fetchone()
    recorded = json.loads(recorded)
    assert recorded["proxy"] == proxy.url()
    assert recorded["proxies"] == [{"hosts": ["127.0.0.1"], "url": other.url()},
                                   {"hosts": ["*"], "url": "none"}]
    assert SECRET.encode() not in stored_bytes(store)
    # A socks5h proxy needs the operator's word; a bad URL is a usage error; nothing made.
    for args, words in (([f"--proxy={other.url('socks5h')}"], "--proxy-remote-dns"),
                        (["--proxy", "ftp://u:p@127.0.0.1:1"], "scheme must be")):
        try:
            status = cli_main(["crawl", site.url, "--store", str(tmp_path / "never"), *args])
        except SystemExit as exc:  # a flag's value refused by its parser
            status = exc.code
        assert status == 2
        assert words in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_worker_processes_get_the_proxy_and_its_credentials_outside_the_configuration(
        site: TestSite, tmp_path: Path) -> None:
    path = tmp_path / "store"
    with proxies.running("http", credentials=("crawler", SECRET)) as proxy:
        result = crawl(path, CrawlConfig(seeds=[site.url], proxy=proxy.url()), processes=1,
                       proxy_credentials={proxy.url(): ("crawler", SECRET)})
    assert result.session_completed and not proxy.refused
    found = connected(attempts(path))
    assert len(found) >= 5 and all(m.connection.proxy.established  # type: ignore[union-attr]
                                   for m in found)
    assert len(proxy.tunnels) == sum(not m.connection.reused for m in found)  # type: ignore[union-attr]
    assert SECRET.encode() not in stored_bytes(path)


def test_socks5h_hands_the_name_to_the_proxy_only_when_the_operator_accepts_it(
        site: TestSite, tmp_path: Path) -> None:
    url = f"http://localhost:{site.port}/"
    with proxies.running("socks5") as proxy:
        config = CrawlConfig(seeds=[url], proxy=proxy.url("socks5h"), obey_robots=False,
                             max_depth=0)
        with pytest.raises(EvidenceError, match="network policy cannot check"):
            crawl(tmp_path / "refused", config)
        assert not proxy.tunnels
        crawl(tmp_path / "store", msgspec.structs.replace(config, proxy_remote_dns=True))
    assert proxy.tunnels == [("localhost", site.port)]  # the name, resolved by the proxy
    (m,) = connected(attempts(tmp_path / "store"))
    c = m.connection
    assert c is not None and c.proxy is not None and c.dns is None  # nothing resolved here
    assert (c.proxy.scheme, c.proxy.target, c.proxy.reply) == ("socks5h", "localhost",
                                                               "succeeded")
