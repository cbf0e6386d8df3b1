"""Tests for evidence._demo.site: the local website crawler tests are run against."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from email.utils import parsedate_to_datetime
from urllib.parse import urljoin, urlsplit
from urllib.robotparser import RobotFileParser

import httpx
import pytest

from evidence._demo.site import DEFAULT_ROBOTS_TXT, SiteConfig, TestSite

N = 20
HREF = re.compile(r'href="([^"]+)"')


@pytest.fixture
def site() -> Iterator[TestSite]:
    with TestSite(SiteConfig(pages=N)) as s:
        yield s


@pytest.fixture
def client(site: TestSite) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=site.url, timeout=10) as c:
        yield c


def hrefs(response: httpx.Response) -> list[str]:
    return HREF.findall(response.text)


def page_links(links: list[str]) -> list[str]:
    return [h for h in links if h.startswith("/p/")]


def test_home_and_pages_link_as_configured(site: TestSite, client: httpx.Client) -> None:
    r = client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert int(r.headers["content-length"]) == len(r.content)
    home = hrefs(r)
    assert tuple(home) == site.links("/")
    assert home[:4] == ["/p/0", "/p/1", "/p/2", "/p/3"]
    assert "/old" in home and "/moved" not in home  # only the chain head is linked
    for i in (0, 5, 13):
        links = hrefs(client.get(f"/p/{i}"))
        assert tuple(links) == site.links(f"/p/{i}")
        assert "/" in links
        pages = page_links(links)
        assert len(pages) == len(set(pages)) == 4
        assert f"/p/{i}" not in pages
        for t in {(2 * i + 1) % N, (2 * i + 2) % N, (i * 7 + 3) % N} - {i}:
            assert f"/p/{t}" in pages
    extras = [h for p in range(N) for h in site.links(f"/p/{p}") if not h.startswith("/p/")]
    assert {"/private/a", "/private/b", "/missing/a", "/missing/b"} <= set(extras)


def test_links_per_page_is_respected() -> None:
    with TestSite(SiteConfig(pages=10, links_per_page=2)) as s, httpx.Client() as c:
        for i in range(10):
            pages = page_links(hrefs(c.get(s.url_for(f"/p/{i}"))))
            if i not in ((2 * i + 1) % 10, (2 * i + 2) % 10):  # no self-links
                assert pages == [f"/p/{(2 * i + 1) % 10}", f"/p/{(2 * i + 2) % 10}"]
            assert len(pages) == 2
        assert s.reachable_pages() == {"/", *(f"/p/{i}" for i in range(10))}


def test_robots_txt(site: TestSite, client: httpx.Client) -> None:
    r = client.get("/robots.txt")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; charset=utf-8"
    assert r.text == DEFAULT_ROBOTS_TXT + f"\nSitemap: {site.url}sitemap.xml\n"
    assert r.text.startswith("User-agent: *\nDisallow: /private/\n")
    assert client.get("/private/a").status_code == 200  # served, so ignoring robots shows


def test_robots_txt_crawl_delay_and_absence() -> None:
    with TestSite(SiteConfig(pages=5, crawl_delay=2.5, sitemap_in_robots=False)) as s:
        assert httpx.get(s.url_for("/robots.txt")).text == DEFAULT_ROBOTS_TXT + "Crawl-delay: 2.5\n"
    with TestSite(SiteConfig(pages=5, robots_txt=None)) as s:
        assert httpx.get(s.url_for("/robots.txt")).status_code == 404
        assert s.disallowed_paths() == frozenset()
        assert {"/private/a", "/private/b"} <= s.reachable_pages()


def test_redirect_chain_hop_by_hop(client: httpx.Client) -> None:
    r = client.get("/old", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (301, "/moved")
    r = client.get("/moved", follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (301, "/p/1")
    r = client.get("/p/1", follow_redirects=False)
    assert r.status_code == 200 and "<h1>Page 1</h1>" in r.text


def test_not_found_paths(site: TestSite, client: httpx.Client) -> None:
    for path in ("/missing/a", "/missing/b", "/nowhere", f"/p/{N}", "/p/01"):
        r = client.get(path)
        assert r.status_code == 404, path
        assert int(r.headers["content-length"]) == len(r.content) > 0


def test_flaky_answers_500_then_200() -> None:
    cfg = SiteConfig(pages=N, flaky={"/p/3": 2, "/flaky": 1})
    with TestSite(cfg) as s, httpx.Client(base_url=s.url) as c:
        assert [c.get("/p/3").status_code for _ in range(4)] == [500, 500, 200, 200]
        assert "/flaky" in s.links("/")
        assert [c.get("/flaky").status_code for _ in range(2)] == [500, 200]
        assert {"/p/3", "/flaky"} <= s.reachable_pages()


def test_rate_limited_answers_429_with_retry_after() -> None:
    cfg = SiteConfig(pages=N, rate_limited={"/p/4": (2, 1.5), "/limited": (1, 3)})
    with TestSite(cfg) as s, httpx.Client(base_url=s.url) as c:
        for _ in range(2):
            r = c.get("/p/4")
            assert (r.status_code, r.headers["retry-after"]) == (429, "1.5")
        assert c.get("/p/4").status_code == 200
        r = c.get("/limited")
        assert (r.status_code, r.headers["retry-after"]) == (429, "3")
        assert c.get("/limited").status_code == 200
        assert "/limited" in s.reachable_pages()


def test_conditional_get_and_versions(site: TestSite, client: httpx.Client) -> None:
    changed, unchanged = "/p/1", "/p/2"  # version 2 rewrites pages with i % 4 == 1
    first = {p: client.get(p) for p in (changed, unchanged)}
    for p, r in first.items():
        etag, lm = r.headers["etag"], r.headers["last-modified"]
        r304 = client.get(p, headers={"If-None-Match": etag})
        assert r304.status_code == 304 and r304.content == b""
        assert r304.headers["etag"] == etag
        assert client.get(p, headers={"If-None-Match": f'"nope", W/{etag}'}).status_code == 304
        assert client.head(p, headers={"If-None-Match": etag}).status_code == 304
        assert client.get(p, headers={"If-Modified-Since": lm}).status_code == 304
        old_date = "Thu, 01 Jan 1970 00:00:00 GMT"
        assert client.get(p, headers={"If-Modified-Since": old_date}).status_code == 200
        # If-None-Match wins over If-Modified-Since
        both = {"If-None-Match": '"other"', "If-Modified-Since": lm}
        assert client.get(p, headers=both).status_code == 200
    assert "Content revision 1." in first[changed].text
    assert client.get(f"/p/{N}").status_code == 404
    orphan = f"/p/{N - 1}"

    site.set_version(2)
    r = client.get(changed, headers={"If-None-Match": first[changed].headers["etag"]})
    assert r.status_code == 200 and "Content revision 2." in r.text
    assert r.headers["etag"] != first[changed].headers["etag"]
    assert (parsedate_to_datetime(r.headers["last-modified"])
            > parsedate_to_datetime(first[changed].headers["last-modified"]))
    assert client.get(changed, headers={
        "If-Modified-Since": first[changed].headers["last-modified"]}).status_code == 200
    for h in ("etag", "last-modified"):
        header = {"etag": "If-None-Match", "last-modified": "If-Modified-Since"}[h]
        assert client.get(unchanged, headers={header: first[unchanged].headers[h]}
                          ).status_code == 304
    # version 2 adds a page and orphans one, which still answers
    assert client.get(f"/p/{N}").status_code == 200
    assert f"/p/{N}" in hrefs(client.get("/"))
    assert client.get(orphan).status_code == 200
    assert orphan in site.reachable_pages(1)
    assert orphan not in site.reachable_pages()
    assert f"/p/{N}" in site.reachable_pages()
    assert all(orphan not in site.links(p) for p in site.reachable_pages())
    sitemap = client.get("/sitemap.xml").text
    assert f"<loc>{site.url}p/{N}</loc>" in sitemap
    assert f"<loc>{site.url}p/{N - 1}</loc>" not in sitemap

    site.set_version(3)  # rewrites i % 4 == 2
    assert "Content revision 3." in client.get(unchanged).text
    assert "Content revision 2." in client.get(changed).text


def test_sitemap_lists_reachable_pages(site: TestSite, client: httpx.Client) -> None:
    r = client.get("/sitemap.xml")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/xml")
    locs = re.findall(r"<loc>([^<]+)</loc>", r.text)
    assert {urlsplit(u).path for u in locs} == site.reachable_pages()
    assert r.text.count("<lastmod>") == r.text.count("<changefreq>") == len(locs)


def test_request_log_records_every_request(site: TestSite) -> None:
    with httpx.Client(base_url=site.url, headers={"User-Agent": "evidence-test/1"}) as c:
        get = c.get("/p/0")
        head = c.head("/p/0")
        assert head.content == b""
        assert head.headers["content-length"] == get.headers["content-length"]
        c.get("/missing/a")
        c.get("/old")
        c.get("/robots.txt?x=1")
        assert c.post("/p/0", content=b"ignored").status_code == 405
        assert c.get("/p/0").status_code == 200  # the connection survived the POST body
    log = site.requests
    assert [(r.method, r.path, r.status) for r in log] == [
        ("GET", "/p/0", 200),
        ("HEAD", "/p/0", 200),
        ("GET", "/missing/a", 404),
        ("GET", "/old", 301),
        ("GET", "/robots.txt?x=1", 200),
        ("POST", "/p/0", 405),
        ("GET", "/p/0", 200),
    ]
    assert all(r.headers["user-agent"] == "evidence-test/1" for r in log)
    assert [r.time for r in log] == sorted(r.time for r in log)
    assert {r.connection for r in log} == {1}  # keep-alive: one connection
    assert site.request_counts()["/p/0"] == 4
    assert site.request_counts("HEAD") == {"/p/0": 1}
    site.clear_requests()
    assert site.requests == []


def test_reachable_pages_from_config(site: TestSite) -> None:
    reachable = site.reachable_pages()
    assert reachable == {"/", *(f"/p/{i}" for i in range(N))}
    assert "/p/1" in reachable  # the redirect target
    assert not reachable & {"/old", "/moved", "/missing/a", "/missing/b",
                            "/private/a", "/private/b", "/robots.txt", "/sitemap.xml"}
    assert site.disallowed_paths() == {"/private/a", "/private/b"}
    assert site.request_counts() == {}  # computed without touching the server


def crawl(base: str, client: httpx.Client) -> set[str]:
    """A minimal polite crawler: robots.txt, manual redirects, retries on 500 and 429."""
    robots = RobotFileParser()
    robots.parse(client.get(urljoin(base, "/robots.txt")).text.splitlines())
    ok: set[str] = set()
    seen: set[str] = set()
    queue = deque([base])
    while queue:
        url = queue.popleft()
        if url in seen or not robots.can_fetch("*", url):
            continue
        seen.add(url)
        for _ in range(5):
            r = client.get(url)
            if r.status_code not in (429, 500):
                break
        if r.status_code == 200:
            ok.add(urlsplit(url).path)
            queue.extend(urljoin(url, h) for h in hrefs(r))
        elif r.is_redirect:
            queue.append(urljoin(url, r.headers["location"]))
    return ok


def test_a_polite_crawler_ends_with_reachable_pages() -> None:
    cfg = SiteConfig(pages=40, flaky={"/p/7": 2}, rate_limited={"/limited": (1, 0)},
                     slow={"/slow": 0.02}, large={"/big": 50_000})
    with TestSite(cfg) as s, httpx.Client(timeout=10) as c:
        for version in (1, 2):
            s.set_version(version)
            s.clear_requests()
            assert crawl(s.url, c) == s.reachable_pages()
            counts = s.request_counts()
            assert not any(p.startswith("/private/") for p in counts)
            ok = {r.path for r in s.requests if r.status == 200}
            assert ok == s.reachable_pages() | {"/robots.txt"}
        assert s.reachable_pages(2) - s.reachable_pages(1) == {"/p/40"}
        assert s.reachable_pages(1) - s.reachable_pages(2) == {"/p/39"}


def test_slow_large_and_held_paths() -> None:
    cfg = SiteConfig(pages=N, slow={"/p/3": 0.2}, large={"/big": 100_000, "/p/2": 5000},
                     kill_paths=frozenset({"/p/5"}), hold_seconds=0.1)
    with TestSite(cfg) as s, httpx.Client(base_url=s.url, timeout=10) as c:
        assert "/big" in s.links("/")
        assert len(c.get("/big").content) == 100_000
        r = c.get("/p/2")
        assert len(r.content) == 5000 and r.text.endswith("</html>\n")
        for path in ("/p/3", "/p/5"):
            t0 = time.monotonic()
            assert c.get(path).status_code == 200
            assert time.monotonic() - t0 >= 0.1
        s.kill_paths.add("/p/6")  # may change while serving
        t0 = time.monotonic()
        assert c.get("/p/6").status_code == 200
        assert time.monotonic() - t0 >= 0.1


def test_held_request_is_logged_and_released_by_stop() -> None:
    s = TestSite(SiteConfig(pages=N, kill_paths=frozenset({"/hold"}), hold_seconds=60)).start()
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            with httpx.Client(timeout=20) as c:
                c.get(s.url_for("/hold"))
        except httpx.HTTPError as exc:
            errors.append(exc)

    try:
        assert "/hold" in s.links("/")
        t = threading.Thread(target=fetch)
        t.start()
        entry = s.wait_for_request("/hold", timeout=5)
        assert entry.status is None  # logged, not answered
        with pytest.raises(TimeoutError):
            s.wait_for_request("/never", timeout=0.01)
    finally:
        t0 = time.monotonic()
        s.stop()
    t.join(10)
    assert time.monotonic() - t0 < 5
    assert not t.is_alive() and len(errors) == 1
    assert s.requests[-1].status is None


def test_config_is_validated_and_frozen() -> None:
    for bad in ({"pages": 0}, {"flaky": {"p/1": 1}}, {"slow": {"/x": -1}},
                {"not_found": ("/old",)}, {"rate_limited": {"/x": (-1, 1)}}, {"version": 0}):
        with pytest.raises(ValueError):
            SiteConfig(**bad)  # type: ignore[arg-type]
    cfg = SiteConfig()
    with pytest.raises(TypeError):
        cfg.redirects["/x"] = "/y"  # type: ignore[index]
    with pytest.raises(ValueError, match="large size"):
        TestSite(SiteConfig(pages=3, large={"/p/1": 10})).start()


def test_many_requests_on_one_connection(site: TestSite, client: httpx.Client) -> None:
    statuses = {client.get(f"/p/{i % N}").status_code for i in range(500)}
    assert statuses == {200}
    assert {r.connection for r in site.requests} == {1}


def test_cli_help() -> None:
    out = subprocess.run([sys.executable, "-m", "evidence._demo.site", "--help"],
                         capture_output=True, text=True, timeout=30, check=True)
    assert "--pages" in out.stdout and "--port" in out.stdout
    assert out.stderr == ""


def test_cli_serves_until_interrupted() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "evidence._demo.site", "--port", "0", "--pages", "7"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), url
        r = httpx.get(url)
        assert r.status_code == 200 and "7 pages" in r.text
        proc.send_signal(signal.SIGINT)
        # a generous deadline: the 10 s this had ran out once, with 8 test processes and a
        # benchmark on 2 cores (the server had said it was serving, and nothing after)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "stopped after 1 requests" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
