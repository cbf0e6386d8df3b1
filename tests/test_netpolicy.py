"""Trust at the boundaries (issue 30, points 1 and 2): where a crawl may connect, and its
scope by origin.

A crawled page must not make the crawler, or the browser rendering it, request the
machine's own services or the cloud's metadata service. Each crawl here runs against two
real servers on 127.0.0.1: the site, and an "internal service" on another port that counts
every request it gets; the attack must reach it zero times, and every refused request must
be recorded with its reason. Host names are answered by a resolver the test gives
(``CrawlOptions.resolver``): no DNS here.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence import CrawlConfig, Crawler, CrawlOptions, Store
from evidence._crawl.frontier import Scope
from evidence._crawl.netpolicy import NetworkPolicy, Origin, Refused, refusal
from evidence._model.urls import key_origin, normalize_url, registrable_domain

SECRET = "internal-secret-7f3a"


class Server:
    """A site on 127.0.0.1 from a path -> (status, headers, body) table; counts requests
    (method and path) in ``hits``."""

    __test__ = False

    def __init__(self, routes: dict[str, tuple[int, dict[str, str], bytes]]) -> None:
        self.hits: Counter[str] = Counter()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                path = self.path.split("?")[0]
                server.hits[f"{self.command} {path}"] += 1
                status, headers, body = routes.get(path, (404, {}, b"not found"))
                self.send_response(status)
                for name, value in {"Content-Type": "text/html", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Access-Control-Allow-Origin", "*")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_HEAD = do_OPTIONS = _answer

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Server:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def internal() -> Server:
    page = f"<!doctype html><title>internal</title><p>{SECRET}</p>".encode()
    return Server({p: (200, {}, page) for p in (
        "/", "/frame", "/img.png", "/style.css", "/data", "/admin/delete-everything",
        "/secret", "/latest/meta-data/iam/security-credentials/")})


def resolver(names: dict[str, list[str]]):
    async def resolve(host: str, port: int) -> list[str]:
        if host not in names:
            raise socket.gaierror(socket.EAI_NONAME, f"{host}: not in the test's names")
        return names[host]
    return resolve


NAMES = {"site.test": ["127.0.0.1"], "internal.site.test": ["127.0.0.1"],
         "meta.site.test": ["169.254.169.254"], "localhost": ["127.0.0.1"],
         "internal.test": ["127.0.0.1"]}


def crawl(store_path: Path, seed: str, **config: object):
    render = config.pop("render_options", None)
    with Store.create(store_path) as store:
        crawler = Crawler(store, CrawlConfig(seeds=[seed], **config), CrawlOptions(
            workers=2, resolver=resolver(NAMES), render=render, timeout=5.0))
        return anyio.run(crawler.run)


def rows(store_path: Path, sql: str, *args: object) -> list[tuple]:
    with Store.open(store_path) as store:
        return store.connection.execute(sql, args).fetchall()


# --- the policy itself -------------------------------------------------------------------

REFUSED_V4 = ["0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
              "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "224.0.0.0/4",
              "240.0.0.0/4"]
REFUSED_V6 = ["::/128", "::1/128", "fe80::/10", "fc00::/7", "ff00::/8"]


def in_network(cidr: str) -> st.SearchStrategy[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    net = ipaddress.ip_network(cidr)
    return st.integers(0, net.num_addresses - 1).map(lambda i: net[i])


refused_addresses = st.one_of(*(in_network(c) for c in REFUSED_V4 + REFUSED_V6))
any_v4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)


@given(refused_addresses)
def test_every_non_public_address_is_refused_and_named(address) -> None:
    assert refusal(address) is not None
    assert NetworkPolicy().refused(address) is not None


@given(any_v4)
def test_an_ipv4_address_and_its_ipv6_forms_are_judged_alike(address) -> None:
    mapped = ipaddress.IPv6Address(f"::ffff:{address}")
    nat64 = ipaddress.IPv6Address(int(ipaddress.IPv6Address("64:ff9b::")) | int(address))
    sixtofour = ipaddress.IPv6Address((0x2002 << 112) | (int(address) << 80) | 1)
    v4 = refusal(address)
    assert (refusal(mapped) is None) == (v4 is None)
    if v4 is not None:  # a carried address that is refused refuses the IPv6 one too
        assert refusal(nat64) is not None and refusal(sixtofour) is not None


@given(st.one_of(refused_addresses, any_v4), st.sampled_from(REFUSED_V4 + REFUSED_V6))
def test_an_allowed_network_admits_exactly_its_addresses(address, cidr) -> None:
    policy = NetworkPolicy(allow=[cidr])
    net = ipaddress.ip_network(cidr)
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    inside = address in net or (mapped is not None and mapped in net)
    if inside:
        assert policy.refused(address) is None
    else:
        assert policy.refused(address) == refusal(address)


public_addresses = st.sampled_from(["8.8.8.8", "1.1.1.1", "2606:4700::1111"]).map(
    ipaddress.ip_address)


@settings(deadline=None)
@given(st.lists(st.one_of(refused_addresses, public_addresses), min_size=1, max_size=6,
                unique=True))
def test_a_name_is_connected_only_at_the_addresses_that_pass(answer) -> None:
    """Whatever a name resolves to, the addresses handed to the connection are the ones
    that passed, in the resolver's order; none passing is a refusal naming the first."""
    policy = NetworkPolicy(resolver=resolver({"x.test": [str(a) for a in answer]}))
    passing = [str(a) for a in answer if refusal(a) is None]

    async def main() -> None:
        if passing:
            assert await policy.addresses(Origin("https", "x.test", 443)) == passing
        else:
            with pytest.raises(Refused, match=f"x.test resolves to {answer[0]}, "):
                await policy.addresses(Origin("https", "x.test", 443))

    anyio.run(main)


def test_public_addresses_pass_and_metadata_addresses_do_not() -> None:
    for text in ("8.8.8.8", "1.1.1.1", "2606:4700::1111", "::ffff:8.8.8.8"):
        assert refusal(ipaddress.ip_address(text)) is None, text
    for text in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "192.0.0.192",
                 "::ffff:127.0.0.1", "::ffff:169.254.169.254", "2002:7f00:1::1",
                 "64:ff9b::a9fe:a9fe", "::127.0.0.1", "255.255.255.255"):
        assert refusal(ipaddress.ip_address(text)) is not None, text


def test_a_seed_allows_its_own_origin_at_the_addresses_it_first_had() -> None:
    names = {"site.test": ["127.0.0.1"], "localhost": ["127.0.0.1"]}
    policy = NetworkPolicy(seeds=["http://site.test:8001/", "http://127.0.0.1:8002/"],
                           resolver=resolver(names))

    async def main() -> None:
        assert await policy.addresses(Origin("http", "site.test", 8001)) == ["127.0.0.1"]
        assert await policy.addresses(Origin("http", "127.0.0.1", 8002)) == ["127.0.0.1"]
        for origin in (Origin("http", "site.test", 8002), Origin("https", "site.test", 8001),
                       Origin("http", "127.0.0.1", 8001), Origin("http", "localhost", 8002),
                       Origin("http", "::1", 8002)):
            with pytest.raises(Refused, match="network: "):
                await policy.addresses(origin)
        names["site.test"] = ["10.0.0.1", "127.0.0.1"]  # the answer changes (rebinding)
        assert await policy.addresses(Origin("http", "site.test", 8001)) == ["127.0.0.1"]

    anyio.run(main)


def test_localhost_as_the_system_resolves_it() -> None:
    """/etc/hosts answers for localhost (no DNS query leaves the machine)."""
    policy = NetworkPolicy(seeds=["http://localhost:8001/"])

    async def main() -> None:
        assert "127.0.0.1" in await policy.addresses(Origin("http", "localhost", 8001))
        with pytest.raises(Refused, match="localhost resolves to .*, loopback"):
            await policy.addresses(Origin("http", "localhost", 8002))

    anyio.run(main)


def test_a_bad_network_is_a_usage_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "evidence", "crawl", "http://127.0.0.1:9/",
                          "--store", str(tmp_path / "s"), "--allow-network", "127.0.0.0/33"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Error:" in out.stderr and "Try:" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "s").exists()


# --- scope by origin (point 2) -------------------------------------------------------------

ports = st.integers(1, 65535)


@settings(deadline=None)
@given(st.sampled_from(["http", "https"]), st.sampled_from(["a.example", "127.0.0.1", "[::1]"]),
       ports, ports)
def test_the_host_scope_is_the_seed_origin(scheme: str, host: str, port: int,
                                           other: int) -> None:
    scope = Scope(CrawlConfig(seeds=[f"{scheme}://{host}:{port}/"]))
    assert scope.reason_to_skip(f"{scheme}://{host}:{port}/x", 1) is None
    default = 443 if scheme == "https" else 80
    if port == default:  # the default port, written or not, is one origin
        assert scope.reason_to_skip(f"{scheme}://{host}/x", 1) is None
    if other != port:
        assert "not a seed's origin" in scope.reason_to_skip(f"{scheme}://{host}:{other}/", 1)
    flipped = "https" if scheme == "http" else "http"
    assert scope.reason_to_skip(f"{flipped}://{host}:{port}/", 1) is not None


@settings(deadline=None)
@given(st.sampled_from(["http://", "https://", "HTTP://"]),
       st.sampled_from(["", "u@", "u:p@"]), st.sampled_from(["A.example", "a.example."]),
       st.sampled_from(["", ":80", ":443", ":8080"]), st.sampled_from(["", "/", "/a?b#c"]))
def test_key_origin_is_scheme_host_and_port(scheme, userinfo, host, port, rest) -> None:
    url = f"{scheme}{userinfo}{host}{port}{rest}"
    origin = key_origin(normalize_url(url))
    lowered = scheme.lower()
    default = ":80" if lowered == "http://" else ":443"
    assert origin == f"{lowered}a.example{'' if port == default else port}"


def test_the_default_scope_leaves_another_port_unfetched(tmp_path: Path) -> None:
    with internal() as service:
        other = f"http://127.0.0.1:{service.port}/secret"
        page = f'<a href="{other}">x</a><a href="/b">b</a>'.encode()
        with Server({"/": (200, {}, page), "/b": (200, {}, b"b")}) as site:
            result = crawl(tmp_path / "s", f"http://127.0.0.1:{site.port}/")
    assert result.session_completed and sum(service.hits.values()) == 0
    assert rows(tmp_path / "s", "SELECT state, reason FROM frontier WHERE url = ?", other) == [
        ("skipped", f"scope: host: origin http://127.0.0.1:{service.port} is not a seed's "
         "origin")]


def test_domain_scope_reads_the_public_suffix_list() -> None:
    assert registrable_domain("a.b.example.co.uk") == "example.co.uk"
    assert registrable_domain("alice.github.io") == "alice.github.io"
    assert registrable_domain("www.example.com") == "example.com"
    assert registrable_domain("co.uk") == "co.uk"
    scope = Scope(CrawlConfig(seeds=["https://www.example.co.uk/", "https://alice.github.io/"],
                              scope="domain"))
    assert scope.reason_to_skip("http://shop.example.co.uk:8080/", 1) is None
    assert scope.reason_to_skip("https://docs.alice.github.io/", 1) is None
    for url in ("https://other.co.uk/", "https://bob.github.io/", "https://github.io/"):
        assert scope.reason_to_skip(url, 1) is not None, url


def test_the_suffix_list_is_read_offline() -> None:
    """The package reads the list it ships; nothing in the scope code asks the network."""
    import publicsuffixlist

    shipped = Path(publicsuffixlist.__file__).with_name("public_suffix_list.dat")
    assert shipped.stat().st_size > 100_000
    real = socket.socket.connect

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the Public Suffix List code opened a connection")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    try:
        registrable_domain.cache_clear()
        import evidence._model.urls as urls

        urls._SUFFIXES = None
        assert registrable_domain("x.y.example.org.uk") == "example.org.uk"
    finally:
        socket.socket.connect = real  # type: ignore[method-assign]


# --- a crawl (point 1): links, redirects, robots.txt -----------------------------------------


def test_a_crawl_never_reaches_internal_addresses_and_records_each_refusal(
        tmp_path: Path) -> None:
    with internal() as service:
        b = service.port
        links = [f"http://site.test:{b}/secret", f"http://internal.site.test:{b}/secret"]
        page = "".join(f'<a href="{u}">x</a>' for u in links) + '<a href="/go">go</a>'
        meta = "http://meta.site.test/latest/meta-data/iam/security-credentials/"
        with Server({"/": (200, {}, page.encode()),
                     "/go": (302, {"Location": meta}, b"")}) as site:
            seed = f"http://site.test:{site.port}/"
            # Domain scope: every link above is in scope; only the network policy stands.
            refused = crawl(tmp_path / "refused", seed, scope="domain")
            assert sum(service.hits.values()) == 0
            allowed = crawl(tmp_path / "allowed", seed, scope="domain",
                            allow_network=["127.0.0.0/8"])
            assert service.hits["GET /secret"] == 2  # both names, once allowed
    assert refused.session_completed and allowed.session_completed
    for url in [*links, meta]:
        (state, reason), = rows(tmp_path / "refused",
                                "SELECT state, reason FROM frontier WHERE url = ?", url)
        assert state == "skipped" and reason.startswith("network: "), (url, reason)
        attempts = rows(tmp_path / "refused", "SELECT outcome, error, request_headers_id "
                        "FROM fetch_attempt WHERE url = ?", url)
        assert attempts and all(o == "skipped" and e.startswith("network: ") and r is None
                                for o, e, r in attempts)
    (reason,), = rows(tmp_path / "refused", "SELECT reason FROM frontier WHERE url = ?", meta)
    assert "169.254.169.254, link-local" in reason
    # robots.txt of a refused origin: an attempt too, with the same reason.
    assert rows(tmp_path / "refused", "SELECT outcome FROM fetch_attempt WHERE url = ?",
                f"http://internal.site.test:{b}/robots.txt") == [("skipped",)]
    assert rows(tmp_path / "allowed", "SELECT state FROM frontier WHERE url = ?",
                links[0]) == [("done",)]
    assert rows(tmp_path / "allowed", "SELECT state FROM frontier WHERE url = ?",
                meta) == [("skipped",)]  # 169.254.0.0/16 was not allowed


def test_worker_processes_hold_to_the_policy_and_a_resume_keeps_it(tmp_path: Path) -> None:
    """Through the CLI, with a worker process: another local port, in the domain scope of
    a 127.0.0.1 seed, is refused there too; resuming with another policy is refused."""
    import subprocess
    import sys

    store = tmp_path / "s"
    with internal() as service:
        other = f"http://127.0.0.1:{service.port}/secret"
        page = f'<a href="{other}">x</a><a href="/a">a</a><a href="/b">b</a>'.encode()
        with Server({"/": (200, {}, page)}) as site:
            seed = f"http://127.0.0.1:{site.port}/"
            # One worker claims in frontier order: the seed, then the other port; the run
            # stops there, leaving the session open to resume.
            done = subprocess.run(
                [sys.executable, "-m", "evidence", "crawl", seed, "--store", str(store),
                 "--scope", "domain", "--processes", "1", "--workers", "1",
                 "--max-documents", "2"],
                capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            again = subprocess.run(
                [sys.executable, "-m", "evidence", "crawl", "--store", str(store),
                 "--allow-network", "127.0.0.1"], capture_output=True, text=True, timeout=60)
        assert sum(service.hits.values()) == 0
    assert again.returncode == 2 and "these keys differ: allow_network" in again.stderr
    assert rows(store, "SELECT outcome, error FROM fetch_attempt WHERE url = ?", other) == [
        ("skipped", "network: 127.0.0.1, loopback, is not allowed (only a seed's own origin "
         "or --allow-network reaches it)")]


def test_the_network_policy_is_part_of_the_recorded_configuration() -> None:
    """A resume with another policy is refused like any other configuration change
    (``CrawlConfig.differences``); a session recorded before the key has the default."""
    record = CrawlConfig(seeds=["http://127.0.0.1:9/"]).as_record()
    changed = CrawlConfig(seeds=["http://127.0.0.1:9/"], allow_network=["10.0.0.0/8"],
                          render_unsafe_anywhere=True)
    assert changed.differences(record) == ["allow_network", "render_unsafe_anywhere"]
    del record["allow_network"]
    assert CrawlConfig(seeds=["http://127.0.0.1:9/"]).differences(record) == []


# --- a render (point 1): the browser's requests --------------------------------------------


def attack_page(b: int) -> bytes:
    internal_urls = [f"http://127.0.0.1:{b}/data", f"http://localhost:{b}/data",
                     f"http://[::1]:{b}/data", f"http://internal.test:{b}/data"]
    fetches = "".join(f"get({u!r});" for u in internal_urls)
    return f"""<!doctype html><title>attack</title>
<link rel="stylesheet" href="http://127.0.0.1:{b}/style.css">
<iframe src="http://127.0.0.1:{b}/frame"></iframe>
<img src="http://127.0.0.1:{b}/img.png">
<iframe src="/go"></iframe>
<p id="out"></p>
<script>
const out = document.getElementById('out');
const put = t => {{ out.textContent += ' ' + t; }};
const get = u => fetch(u).then(r => r.text()).then(put, () => put('failed'));
{fetches}
fetch('http://127.0.0.1:{b}/admin/delete-everything', {{method: 'POST', body: 'confirm=yes',
  headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}}}).then(r => r.text())
  .then(put, () => put('post failed'));
fetch('/form', {{method: 'POST', body: 'a=1'}}).then(r => r.text()).then(put);
</script>""".encode()


def rendered_dom(store_path: Path) -> str:
    with Store.open(store_path) as store:
        from evidence import ArtifactRef

        ref, = store.connection.execute(
            "SELECT a.namespace, a.digest, a.size FROM render r JOIN artifact a ON "
            "a.artifact_id = r.dom_id").fetchall()
        return store.artifacts.read(ArtifactRef(*ref)).decode()


def test_a_rendered_page_cannot_reach_internal_addresses(tmp_path: Path, chromium: str) -> None:
    from evidence._crawl.render import RenderOptions

    options = RenderOptions(executable=chromium, quiet=0.3)
    meta = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
    with internal() as service:
        b = service.port
        routes = {"/": (200, {}, attack_page(b)), "/go": (302, {"Location": meta}, b""),
                  "/form": (200, {}, b"form ok")}
        with Server(routes) as site:
            seed = f"http://127.0.0.1:{site.port}/"
            runs = {}
            for name, config in (("refused", {}),
                                 ("allowed", {"allow_network": ["127.0.0.0/8"],
                                              "render_unsafe_anywhere": True})):
                runs[name] = crawl(tmp_path / name, seed, render=True, max_depth=0,
                                   render_options=options, **config)
                if name == "refused":
                    assert sum(service.hits.values()) == 0, service.hits
                    assert site.hits["POST /form"] == 1  # the page's own origin: made
            assert service.hits["POST /admin/delete-everything"] == 1  # allowed, the flag
            assert service.hits["GET /data"] == 3  # 127.0.0.1, localhost, internal.test
    assert all(r.session_completed for r in runs.values())
    dom = rendered_dom(tmp_path / "refused")
    assert SECRET not in dom and "failed" in dom and "form ok" in dom
    found = rows(tmp_path / "refused", "SELECT f.method, f.url, f.outcome, f.error, "
                 "f.request_headers_id FROM fetch_attempt f WHERE f.render_seq IS NOT NULL")
    by_url = {(method, url): (outcome, error, sent)
              for method, url, outcome, error, sent in found}
    network = [f"http://127.0.0.1:{b}/{p}" for p in ("style.css", "frame", "img.png", "data")]
    network += [f"http://localhost:{b}/data", f"http://[::1]:{b}/data",
                f"http://internal.test:{b}/data", meta]
    for url in network:
        outcome, error, sent = by_url[("GET", url)]
        assert (outcome, sent) == ("skipped", None) and error.startswith("network: "), url
    assert "::1, loopback" in by_url[("GET", f"http://[::1]:{b}/data")][1]
    assert "internal.test resolves to 127.0.0.1" in \
        by_url[("GET", f"http://internal.test:{b}/data")][1]
    post = by_url[("POST", f"http://127.0.0.1:{b}/admin/delete-everything")]
    assert post[0] == "skipped" and post[1].startswith("render: a POST outside the crawl's")
    assert by_url[("POST", f"http://127.0.0.1:{site.port}/form")][0] == "response"
    # Allowed (and --render-unsafe-anywhere): the internal replies are evidence, as the
    # operator asked; [::1] is not in 127.0.0.0/8, nor 169.254.169.254.
    assert SECRET in rendered_dom(tmp_path / "allowed")
    assert rows(tmp_path / "allowed", "SELECT outcome FROM fetch_attempt WHERE method = "
                "'POST' AND url LIKE '%/admin/%'") == [("response",)]
    assert set(rows(tmp_path / "allowed", "SELECT url FROM fetch_attempt WHERE "
                    "outcome = 'skipped'")) == {(f"http://[::1]:{b}/data",), (meta,)}
