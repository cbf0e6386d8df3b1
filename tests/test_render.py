"""Rendered capture (issue 17 point 1): a crawl with --render against a scripted site.

The site (tests/jssite.py) builds its page with scripts: a link, a consent banner, a
stylesheet and a fetch() exist only once the page runs. Every test here drives the real
Debian Chromium; in CI a missing browser fails the test (conftest.need_chromium).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import CrawlConfig, Crawler, CrawlOptions, Store, verify
from evidence._crawl.render import RENDER_SEQUENCE, Renderer, RenderOptions, SourceCapture
from evidence._model.messages import Render
from evidence._model.refs import ArtifactRef

from .conftest import Factory, png_pixels, submit_all
from .jssite import BANNER, CHALLENGES, LOGO, STYLE, JsSite
from .testca import make_authority

ROOT = Path(__file__).resolve().parent.parent


def crawl(store_path: Path, url: str, **config: object):
    options = {k: config.pop(k) for k in ("render_options",) if k in config}
    with Store.create(store_path) as store:
        crawler = Crawler(store, CrawlConfig(seeds=[url], **config), CrawlOptions(
            workers=2, render=options.get("render_options")))
        return anyio.run(crawler.run)


def rows(store_path: Path, sql: str, *args: object) -> list[tuple]:
    with Store.open(store_path) as store:
        return store.connection.execute(sql, args).fetchall()


def paths(urls: list[tuple]) -> set[str]:
    return {u.split("/", 3)[3] for (u,) in urls}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, chromium: str):
    """One crawl of the scripted site with --render, and one without (shared: a browser
    start and a crawl cost about a second each)."""
    base = tmp_path_factory.mktemp("render")
    with JsSite() as site:
        with_render = crawl(base / "rendered", site.url, render=True)
        hits = dict(site.hits)  # what the rendering crawl asked for
        without = crawl(base / "plain", site.url)
    return base, site.url, with_render, without, hits


def test_a_script_added_link_is_discovered_only_with_render(rendered) -> None:
    base, url, with_render, without, _hits = rendered
    assert with_render.session_completed and without.session_completed
    plain = paths(rows(base / "plain", "SELECT url FROM frontier"))
    assert "hidden" not in plain and "page" in plain
    found = paths(rows(base / "rendered", "SELECT url FROM frontier WHERE state = 'done'"))
    assert "hidden" in found
    # The edge that found it names a render of /page, and no crawler discovery has it.
    edges = rows(base / "rendered", "SELECT e.observed_ref, r.url FROM discovery_edge e "
                 "JOIN render r ON r.render_seq = e.render_seq WHERE e.observed_ref = '/hidden'")
    assert edges == [("/hidden", url + "page")]
    assert rows(base / "rendered", "SELECT count(*) FROM discovery_edge WHERE "
                "observed_ref = '/hidden' AND render_seq IS NULL") == [(0,)]


def test_the_banner_is_in_the_rendered_dom_and_the_page_is_settled_once(rendered) -> None:
    base, url, *_ = rendered
    with Store.open(base / "rendered") as store:
        (_render_id, outcome, settle, title, dom, digest, size), = store.connection.execute(
            "SELECT r.render_id, r.outcome, r.settle, r.title, a.namespace, a.digest, a.size "
            "FROM render r JOIN artifact a ON a.artifact_id = r.dom_id WHERE r.url = ?",
            (url + "page",)).fetchall()
        from evidence import ArtifactRef

        text = store.artifacts.read(ArtifactRef(dom, digest, size), verify=True).decode()
        body = store.artifacts.read(ArtifactRef(*store.connection.execute(
            "SELECT a.namespace, a.digest, a.size FROM fetch_attempt f JOIN artifact a ON "
            "a.artifact_id = f.body_id WHERE f.url = ? AND f.render_seq IS NULL",
            (url + "page",)).fetchall()[0])).decode()
    assert (outcome, settle, title) == ("rendered", "quiet", "Scripted page")
    assert f'<div id="consent">{BANNER}</div>' in text
    assert '<p id="data">loaded by fetch</p>' in text  # after a fetch() the proxy recorded
    assert BANNER in body and f">{BANNER}<" not in body  # only a script wrote it
    frontier = rows(base / "rendered", "SELECT reason FROM frontier WHERE url = ?", url + "page")
    assert frontier == [("HTTP 200, rendered (quiet)",)]


def test_the_screenshot_is_a_png_of_the_page_with_its_image(rendered) -> None:
    base, url, *_ = rendered
    with Store.open(base / "rendered") as store:
        from evidence import ArtifactRef

        ref = ArtifactRef(*store.connection.execute(
            "SELECT a.namespace, a.digest, a.size FROM render r JOIN artifact a ON "
            "a.artifact_id = r.screenshot_id WHERE r.url = ?", (url + "page",)).fetchall()[0])
        png = store.artifacts.read(ref, verify=True)
    width, height, pixels, channels = png_pixels(png, max_rows=200)
    assert (width, height) == (1280, 800)  # the viewport; the page is not taller
    # The 24x24 red logo is drawn at 240x240 from y=80 (tests/jssite.py); the page is white.
    row = pixels[150]
    assert tuple(row[100 * channels:100 * channels + 3]) == (255, 0, 0)
    assert tuple(row[600 * channels:600 * channels + 3]) == (255, 255, 255)
    # The heading is blue: the stylesheet (chunked, gzip) reached the browser intact.
    blue = [tuple(pixels[y][x * channels:x * channels + 3]) for y in range(10, 60)
            for x in range(0, 100)]
    assert (0, 0, 255) in blue


def test_every_browser_request_is_an_attempt_with_its_wire_bytes(rendered) -> None:
    base, url, _r, _w, hits = rendered
    found = rows(base / "rendered",
                 "SELECT f.url, f.sequence, f.http_status, f.capture, f.content_coding, "
                 "f.transfer_coding, b.namespace, b.digest, b.size, c.namespace, c.digest, "
                 "c.size FROM fetch_attempt f JOIN render r ON r.render_seq = f.render_seq "
                 "LEFT JOIN artifact b ON b.artifact_id = f.body_id "
                 "LEFT JOIN artifact c ON c.artifact_id = f.content_id WHERE r.url = ?",
                 url + "page")
    by_path = {u.split("/", 3)[3]: row for u, *row in found}
    assert {"logo.png", "style.css", "data.json"} <= set(by_path)
    assert all(seq >= RENDER_SEQUENCE for seq, *_ in by_path.values())
    from evidence import ArtifactRef

    with Store.open(base / "rendered") as store:
        _seq, status, capture, _cc, _tc, *body = by_path["logo.png"]
        assert (status, capture) == (200, "wire")
        assert store.artifacts.read(ArtifactRef(*body[:3])) == LOGO
        _seq, status, capture, coding, transfer, *refs = by_path["style.css"]
        assert (coding, transfer) == ("gzip", "chunked")
        wire = store.artifacts.read(ArtifactRef(*refs[:3]))
        assert wire.startswith(b"%x\r\n" % (len(wire) // 2)) or wire.endswith(b"0\r\n\r\n")
        assert store.artifacts.read(ArtifactRef(*refs[3:])) == STYLE
    # The page itself was never fetched by the browser: it got the stored capture.
    assert hits["/page"] == 1
    # A browser's request is never the crawler's current attempt of its URL.
    assert rows(base / "rendered", "SELECT count(*) FROM url_current c JOIN fetch_attempt f "
                "ON f.attempt_seq = c.attempt_seq WHERE f.render_seq IS NOT NULL") == [(0,)]
    with Store.open(base / "rendered") as store:
        report = verify(store, full=True)
    assert report.ok, [f.message for f in report.findings]


def test_a_render_is_redelivered_as_a_duplicate_and_a_changed_copy_is_a_conflict(
        store: Store, make: Factory) -> None:
    page = make.attempt("http://example.com/", capture="wire", body=make.body(b"<p>x"),
                        response_headers=make.body(b"HTTP/1.1 200 OK\r\n\r\n"))
    dom = store.artifacts.put("dom", b"<html><body><p>x</p></body></html>")
    render = Render(message_id=make.id("m"), render_id="r-1", run_id="r1",
                    source_attempt_id=page.attempt_id, url=page.url, started_at=make.now,
                    elapsed_ms=10.0, outcome="rendered", dom=dom, settle="quiet",
                    requests=1)
    browser_request = make.attempt("http://example.com/a.png", sequence=RENDER_SEQUENCE,
                                   render_id="r-1")
    acks = submit_all(store, [make.session(), make.run(), page, render, browser_request,
                              render, msgspec.structs.replace(render, title="other")])
    assert [a.status for a in acks] == ["committed"] * 5 + ["duplicate", "conflict"]
    current = store.connection.execute("SELECT count(*) FROM url_current").fetchall()
    assert current == [(1,)]  # the page only; the browser's request is not projected
    assert verify(store).ok


def test_a_render_of_an_unknown_or_foreign_attempt_is_rejected(store: Store,
                                                               make: Factory) -> None:
    dom = store.artifacts.put("dom", b"<html></html>")
    render = Render(message_id=make.id("m"), render_id="r-1", run_id="r1",
                    source_attempt_id="a-none", url="http://example.com/",
                    started_at=make.now, elapsed_ms=1.0, outcome="rendered", dom=dom)
    orphan = make.attempt("http://example.com/x.png", render_id="r-404")
    acks = submit_all(store, [make.session(), make.run(), render, orphan])
    assert [a.status for a in acks] == ["committed", "committed", "rejected", "rejected"]
    assert "source attempt a-none is not recorded" in acks[2].reason
    assert "render r-404 is not recorded" in acks[3].reason


def test_a_browser_slower_to_start_than_the_render_timeout_still_starts(
        tmp_path: Path, chromium: str) -> None:
    """The render timeout bounds a page, not the browser's start: Chromium that takes
    longer than it to answer its first command (a cold start on a loaded machine; here a
    wrapper that waits 2 s first) still starts. Before, the start had the render timeout
    too, and the run failed: "the browser did not answer Browser.getVersion within 1 s"."""
    from evidence._crawl.browser import Browser

    slow = tmp_path / "slow-chromium"
    slow.write_text(f'#!/bin/sh\nsleep 2\nexec "{chromium}" "$@"\n')
    slow.chmod(0o755)

    async def start() -> str:
        async with Browser(executable=str(slow), timeout=1.0) as browser:
            return browser.version

    assert anyio.run(start).startswith(("Chrome/", "HeadlessChrome/"))


def test_a_hung_page_is_a_timeout_attempt_retried_within_max_attempts(
        tmp_path: Path, chromium: str) -> None:
    with JsSite() as site:
        result = crawl(tmp_path / "s", site.url + "hang", render=True, max_attempts=2,
                       render_options=RenderOptions(timeout=3.0))
        hits = dict(site.hits)
    assert result.session_completed
    renders = rows(tmp_path / "s", "SELECT outcome, error FROM render ORDER BY render_seq")
    assert [o for o, _ in renders] == ["timeout", "timeout"]
    assert "no result within 3 s" in renders[0][1]
    state = rows(tmp_path / "s", "SELECT state, reason FROM frontier WHERE url LIKE '%/hang'")
    assert state[0][0] == "failed"
    assert state[0][1].startswith("render timeout: no result within 3 s")
    assert state[0][1].endswith("on attempt 2 of 2: attempts exhausted")
    assert hits["/hang"] == 1, "the capture is rendered again, never fetched again"


def test_a_page_whose_images_answer_with_a_challenge_renders(tmp_path: Path,
                                                              chromium: str) -> None:
    """Images that answer 401 with a Basic or a Digest challenge are recorded as they were
    answered, challenge included, and the page renders. Before, the browser waited for a
    password nobody would type: the page never loaded, and every render of it ran into its
    timeout."""
    with JsSite() as site:
        crawl(tmp_path / "s", site.url + "locked", render=True, max_attempts=1,
              render_options=RenderOptions(timeout=60.0))
    renders = rows(tmp_path / "s", "SELECT outcome, error FROM render")
    assert renders == [("rendered", None)], renders
    with Store.open(tmp_path / "s") as store:
        images = store.connection.execute(
            "SELECT f.url, f.http_status, a.namespace, a.digest, a.size FROM fetch_attempt f "
            "JOIN artifact a ON a.artifact_id = f.response_headers_id "
            "WHERE f.render_seq IS NOT NULL AND f.url LIKE '%.png' ORDER BY f.url").fetchall()
        heads = {url.rsplit("/", 1)[1]: (status, store.artifacts.read(
            ArtifactRef(ns, digest, size), verify=True))
            for url, status, ns, digest, size in images}
    assert set(heads) == {"basic.png", "digest.png"}
    for name, (status, head) in heads.items():
        assert status == 401
        assert f"WWW-Authenticate: {CHALLENGES['/' + name]}".encode() in head


@pytest.mark.slow
def test_a_browser_that_dies_mid_render_is_a_crashed_render_and_is_restarted(
        tmp_path: Path, chromium: str) -> None:
    import os

    with JsSite() as site, Store.create(tmp_path / "s") as store:
        async def main() -> tuple[list[str], int]:
            from evidence._crawl.fetch import fetch
            from evidence._crawl.http import crawl_client

            async with crawl_client(connections=4, timeout=10) as client, Renderer(
                    artifacts=store.artifacts, client=client, run_id="r1", user_agent="t",
                    max_body_bytes=1 << 20, options=RenderOptions(timeout=20)) as renderer:
                page = await fetch(client, store.artifacts, url=site.url + "slowpage",
                                   run_id="r1", sequence=1, user_agent="t",
                                   max_body_bytes=1 << 20)
                source = SourceCapture(url=page.attempt.url, attempt_id="a1", head=page.head,
                                       body=page.raw_body)
                outcomes = []
                async with anyio.create_task_group() as tg:
                    async def killer() -> None:
                        await anyio.to_thread.run_sync(site.wait_for, "/slow.png")
                        browser = await renderer.browser()
                        os.kill(browser.pid, signal.SIGKILL)
                    tg.start_soon(killer)
                    outcomes.append((await renderer.render(source)).render.outcome)
                site.release()
                outcomes.append((await renderer.render(source)).render.outcome)
                return outcomes, renderer.starts

        outcomes, starts = anyio.run(main)
    assert outcomes == ["crashed", "rendered"]
    assert starts == 2


@pytest.mark.slow
def test_a_kill_during_rendering_resumes_without_a_duplicate_render(
        tmp_path: Path, chromium: str) -> None:
    """... and leaves no key behind; its browser profile goes when the next crawl starts
    its browser (issue 30 point 6; the crawls' own TMPDIR shows what they leave)."""
    store = tmp_path / "s"
    command = [sys.executable, "-m", "evidence", "crawl", "--store", str(store), "--render",
               "--workers", "1"]
    scratch = Path(tempfile.mkdtemp(prefix="ev-tmp-", dir="/tmp"))  # short: Chromium's socket
    env = {**os.environ, "TMPDIR": str(scratch)}
    with JsSite() as site:
        proc = subprocess.Popen([*command, site.url + "slowpage"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=ROOT, env=env)
        try:
            site.wait_for("/slow.png")  # the browser is rendering /slowpage now
        except TimeoutError:
            proc.kill()
            raise AssertionError(proc.communicate()[1].decode()[-2000:]) from None
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        assert rows(store, "SELECT count(*) FROM render") == [(0,)]
        left = sorted(p.name for p in scratch.iterdir())
        assert [n for n in left if n.startswith("evidence-browser-")] and \
            not [n for n in left if n.startswith("evidence-render-tls")], left  # no key
        site.release()
        done = subprocess.run([*command, "--json"], capture_output=True, text=True,
                              timeout=120, cwd=ROOT, env=env)
        hits = dict(site.hits)
    left = sorted(p.name for p in scratch.iterdir())
    shutil.rmtree(scratch, ignore_errors=True)
    assert left == [], "the killed crawl's profile is removed by the next"
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["session_completed"]
    renders = rows(store, "SELECT r.outcome, r.run_id, f.run_id FROM render r JOIN "
                   "fetch_attempt f ON f.attempt_seq = r.source_attempt_seq "
                   "WHERE r.url LIKE '%/slowpage'")
    assert len(renders) == 1, "one render, never two"
    outcome, render_run, source_run = renders[0]
    assert outcome == "rendered" and render_run != source_run  # late, after the restart
    assert hits["/slowpage"] == 1, "the stored capture is rendered, not fetched again"
    with Store.open(store) as opened:
        assert verify(opened).ok


def test_a_crawl_without_a_browser_fails_before_it_starts(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "evidence", "crawl", "http://127.0.0.1:9/",
                           "--store", str(tmp_path / "s"), "--render", "--browser",
                           str(tmp_path / "no-such-browser")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.startswith("Error: browser ") and "\nTry: " in done.stderr
    assert "Traceback" not in done.stderr
    time.sleep(0)  # nothing was crawled: the store holds no session
    assert rows(tmp_path / "s", "SELECT count(*) FROM crawl_session") == [(0,)]


RULES = """
[[rule]]
id = "consent-banner"
version = 1
type = "selector"
selector = "#consent"
input = "rendered"
applies_to = { url = "/page$" }

[[rule]]
id = "consent-banner-served"
version = 1
type = "selector"
selector = "#consent"
applies_to = { url = "/page$" }
"""


def test_a_rule_reads_the_rendered_dom_and_its_input_hash_covers_it(
        tmp_path: Path, chromium: str) -> None:
    from evidence._crawl.rules import input_hash
    from evidence._crawl.rulesfile import parse_rules

    rules = parse_rules(RULES)
    with JsSite() as site:
        crawl(tmp_path / "s", site.url, render=True, rules=rules.as_record())
    found = {rule: (verdict, json.loads(details), digest) for rule, verdict, details, digest in
             rows(tmp_path / "s", "SELECT r.rule_id, r.verdict, r.details, r.input_hash FROM "
                  "rule_evaluation r WHERE r.url_id IN (SELECT url_id FROM fetch_attempt "
                  "WHERE url LIKE '%/page')")}
    rendered, served = found["consent-banner"], found["consent-banner-served"]
    assert rendered[0] == "pass" and served[0] == "fail"  # only a script writes it
    dom = rows(tmp_path / "s", "SELECT a.digest FROM render r JOIN artifact a ON "
               "a.artifact_id = r.dom_id WHERE r.url LIKE '%/page'")[0][0]
    assert rendered[1]["input"]["input"] == "rendered"
    assert rendered[1]["input"]["body"]["digest"] == dom
    assert input_hash(rendered[1]["input"]) == rendered[2]
    assert "input" not in served[1]["input"]  # a response rule's description is as before
    # A rule that reads no document cannot read the rendered one; a crawl that does not
    # render refuses a rendered rule.
    import pytest as _pytest

    from evidence import EvidenceError, RulesError

    with _pytest.raises(RulesError, match="reads no document"):
        parse_rules('[[rule]]\nid = "h"\nversion = 1\ntype = "header"\nname = "x"\n'
                    'input = "rendered"\n')
    with _pytest.raises(EvidenceError, match="reads the rendered DOM"):
        crawl(tmp_path / "t", "http://127.0.0.1:9/", rules=rules.as_record())


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(redeliveries=st.lists(st.integers(min_value=0, max_value=4), max_size=12))
def test_any_redelivery_of_a_render_group_converges_and_never_moves_url_current(
        tmp_path_factory: pytest.TempPathFactory, redeliveries: list[int]) -> None:
    from evidence import Discovery, ObservedRef

    with Store.create(tmp_path_factory.mktemp("redeliver") / "s") as store:
        make = Factory(store)
        head = store.artifacts.put("headers", b"HTTP/1.1 200 OK\r\n\r\n")
        page = make.attempt("http://example.com/p", capture="wire", body=make.body(b"<p>"),
                            response_headers=head, sequence=1)
        dom = store.artifacts.put("dom", b'<html><body><a href="/js">x</a></body></html>')
        render = Render(message_id=make.id("m"), render_id="r-1", run_id="r1",
                        source_attempt_id=page.attempt_id, url=page.url, started_at=make.now,
                        elapsed_ms=5.0, outcome="rendered", dom=dom, settle="quiet",
                        requests=2)
        requests = [make.attempt(u, sequence=RENDER_SEQUENCE + i, render_id="r-1")
                    for i, u in enumerate(["http://example.com/p", "http://example.com/a.png"])]
        links = Discovery(message_id=make.id("m"), run_id="r1",
                          source_attempt_id=page.attempt_id, source_artifact=dom,
                          refs=[ObservedRef(observed="/js", url="http://example.com/js",
                                            position=3)], render_id="r-1")
        group = [page, render, *requests, links]
        first = submit_all(store, [make.session(), make.run(), *group])
        assert {a.status for a in first} == {"committed"}
        tables = ("fetch_attempt", "render", "discovery_edge", "url_current")
        before = {t: store.connection.execute(f"SELECT * FROM {t}").fetchall() for t in tables}
        again = submit_all(store, [group[i] for i in redeliveries])
        assert all(a.status == "duplicate" for a in again)
        after = {t: store.connection.execute(f"SELECT * FROM {t}").fetchall() for t in tables}
        assert after == before
        # The page's own attempt stays current, though a browser request of the same URL
        # has a far higher sequence.
        assert store.connection.execute(
            "SELECT f.attempt_id FROM url_current c JOIN fetch_attempt f "
            "ON f.attempt_seq = c.attempt_seq").fetchall() == [(page.attempt_id,)]
        assert verify(store).ok


def test_https_pages_and_their_resources_are_rendered_and_recorded(
        tmp_path: Path, chromium: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ca_file, context = make_authority(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))  # the crawler trusts the test CA
    with JsSite(tls=context) as site:
        result = crawl(tmp_path / "s", site.url + "page", render=True, max_depth=0)
        hits = dict(site.hits)
    assert result.session_completed
    (outcome, not_recorded, requests), = rows(
        tmp_path / "s", "SELECT outcome, not_recorded, requests FROM render")
    assert outcome == "rendered" and json.loads(not_recorded) == []
    made = {u.split("/", 3)[3]: (status, capture) for u, status, capture in rows(
        tmp_path / "s", "SELECT url, http_status, capture FROM fetch_attempt "
        "WHERE render_seq IS NOT NULL")}
    assert made["logo.png"] == made["style.css"] == made["data.json"] == (200, "wire")
    assert all(u.startswith("https://") for (u,) in rows(
        tmp_path / "s", "SELECT url FROM fetch_attempt WHERE render_seq IS NOT NULL"))
    assert requests == len(made) and hits["/page"] == 1
    # The browser's requests, made again by the crawler, record their connections as the
    # crawler's own attempts do (issue 33): the same server, the same chain.
    peers = set(rows(tmp_path / "s", "SELECT remote_address, tls_version IS NOT NULL, "
                     "tls_chain_id, tls_verified FROM fetch_attempt WHERE outcome = "
                     "'response' AND url LIKE '%/data.json'"))
    assert peers == set(rows(tmp_path / "s", "SELECT remote_address, 1, tls_chain_id, "
                             "tls_verified FROM fetch_attempt WHERE url LIKE '%/page'"))
    assert {p[0] for p in peers} == {"127.0.0.1"} and {p[3] for p in peers} == {1}
    with Store.open(tmp_path / "s") as store:
        dom = store.connection.execute("SELECT a.namespace, a.digest, a.size FROM render r "
                                       "JOIN artifact a ON a.artifact_id = r.dom_id").fetchall()
        from evidence import ArtifactRef

        text = store.artifacts.read(ArtifactRef(*dom[0])).decode()
        assert '<p id="data">loaded by fetch</p>' in text
        assert verify(store, full=True).ok
