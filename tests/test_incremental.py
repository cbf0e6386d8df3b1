"""Incremental sessions against the local site: changed, unchanged, new, orphaned; due."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from evidence import CrawlConfig, Crawler, CrawlOptions, Store, check_log
from evidence._audit.verify import verify
from evidence._crawl.incremental import diff_sessions, parse_frequency
from evidence._demo.site import SiteConfig, TestSite

from .conftest import evidence_in_process
from .rawserver import RawServer, Reply
from .test_crawl import path_of


def crawl(store_path: Path, config: CrawlConfig, **options: object):
    with Store.create(store_path) as store:
        return anyio.run(Crawler(store, config, CrawlOptions(**options)).run)


def records(store_path: Path, session_id: str) -> dict[str, set[str]]:
    with Store.open(store_path) as store:
        out: dict[str, set[str]] = {}
        for url, change in store.connection.execute(
                "SELECT url, change FROM session_document WHERE session_id = ?",
                (session_id,)):
            out.setdefault(change, set()).add(path_of(url))
    return out


def snapshot(site: TestSite, paths: set[str]) -> dict[str, tuple[int, bytes]]:
    with httpx.Client() as client:
        return {p: (r.status_code, r.content) for p in paths
                for r in [client.get(site.url_for(p), follow_redirects=False)]}


@pytest.mark.parametrize("processes", [0, 2])  # 2: worker processes hand 304s back
def test_second_session_classifies_every_document_exactly(tmp_path: Path,
                                                         processes: int) -> None:
    store = tmp_path / "s"
    config = SiteConfig(pages=16, unvalidated={"/p/2", "/p/6", "/p/1"})
    with TestSite(config) as site:
        crawl_config = CrawlConfig(seeds=[site.url])
        first = crawl(store, crawl_config, workers=3, processes=processes)
        assert first.session_completed
        docs1 = records(store, first.session_id)
        assert set(docs1) == {"new"}
        before = snapshot(site, docs1["new"])
        site.set_version(2)
        site.clear_requests()
        # Stopped halfway: the session is open, and no record (so no orphan) is written.
        partial = crawl(store, crawl_config, workers=2, max_documents=5, processes=processes)
        assert partial.outcome == "capped" and not partial.session_completed
        assert records(store, partial.session_id) == {}
        second = crawl(store, crawl_config, workers=3, processes=processes)
        assert second.session_completed and second.session_id == partial.session_id
        log = site.requests
        orphan = site.reachable_pages(1) - site.reachable_pages(2)
        new_pages = site.reachable_pages(2) - site.reachable_pages(1)
        after = snapshot(site, docs1["new"] - orphan)
    docs2 = records(store, second.session_id)
    assert docs2["orphaned"] == orphan and len(orphan) == 1
    assert docs2["new"] == set(new_pages) and len(new_pages) == 1
    changed = {p for p in after if after[p] != before[p]}
    assert changed and docs2["changed"] == changed
    assert docs2["unchanged"] == set(after) - changed
    # Unchanged by 304 where the server gives validators, by checksum where it does not.
    statuses = {(r.path, r.status) for r in log}
    assert ("/p/3", 304) in statuses and "if-none-match" in next(
        r.headers for r in log if r.path == "/p/3")
    assert ("/p/2", 200) in statuses and "/p/2" in docs2["unchanged"]
    assert ("/p/1", 200) in statuses and "/p/1" in docs2["changed"]
    with Store.open(store) as s:
        mode, baseline = s.connection.execute(
            "SELECT mode, baseline_session_id FROM crawl_session WHERE session_id = ?",
            (second.session_id,)).fetchall()[0]
        assert (mode, baseline) == ("incremental", first.session_id)
        assert check_log(s.connection)[2] == []
        diff = diff_sessions(s.connection, first.session_id, second.session_id)
    assert {path_of(u) for u in diff.orphaned} == orphan
    assert {path_of(u) for u in diff.changed} == changed
    assert diff.counts["added"] == 1


def test_documents_not_yet_due_are_skipped_without_a_request(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with TestSite(SiteConfig(pages=12)) as site:
        crawl(store, CrawlConfig(seeds=[site.url]), workers=2)
        site.clear_requests()
        second = crawl(store, CrawlConfig(seeds=[site.url], recrawl={r"/p/\d+$": "weekly"}),
                       workers=2)
        counts = site.request_counts()
        reachable = site.reachable_pages()
    assert second.session_completed
    pages = {p for p in reachable if p.startswith("/p/")}
    assert pages and all(counts[p] == 0 for p in pages), "no request for what is not due"
    assert counts["/"] == 1, "what is due is still requested (conditionally)"
    docs = records(store, second.session_id)
    assert pages <= docs["unchanged"] and "orphaned" not in docs
    with Store.open(store) as s:
        reasons = {r for (r,) in s.connection.execute(
            "SELECT reason FROM frontier WHERE session_id = ? AND url LIKE '%/p/%'",
            (second.session_id,))}
    assert reasons == {"not due: recrawl /p/\\d+$ = weekly"}


def test_sitemap_lastmod_decides_what_is_due(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with TestSite(SiteConfig(pages=10)) as site:
        config = CrawlConfig(seeds=[site.url], sitemap=True)
        crawl(store, config, workers=1)
        site.clear_requests()
        second = crawl(store, config, workers=1)
        counts = site.request_counts()
        reachable = site.reachable_pages()
    assert second.session_completed and counts["/sitemap.xml"] == 1
    # The sitemap's lastmod is older than the first session's fetches: nothing is due.
    assert all(counts[p] == 0 for p in reachable if p != "/")


def test_a_resumed_run_keeps_its_sessions_mode(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with TestSite(SiteConfig(pages=10)) as site:
        config = CrawlConfig(seeds=[site.url])
        crawl(store, config)
        crawl(store, config, max_documents=2)
        crawl(store, config, max_documents=2, full=True)  # resumes: --full is for new ones
    with Store.open(store) as s:
        modes = s.connection.execute(
            "SELECT s.mode, count(r.run_id) FROM crawl_session s JOIN crawl_run r "
            "USING (session_id) GROUP BY s.session_id ORDER BY s.started_at").fetchall()
    assert modes == [("full", 1), ("incremental", 2)]


def test_diff_command_reports_counts_and_urls(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with TestSite(SiteConfig(pages=8)) as site:
        a = crawl(store, CrawlConfig(seeds=[site.url]))
        site.set_version(2)
        b = crawl(store, CrawlConfig(seeds=[site.url]))
    done = evidence_in_process("diff", store, "--session", a.session_id, "--session",
                               b.session_id, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["counts"]["added"] == 1 and report["counts"]["orphaned"] == 1
    assert report["counts"]["changed"] == len(report["changed"]) > 0
    text = evidence_in_process("diff", store, "--session", a.session_id, "--session",
                               b.session_id)
    assert text.returncode == 0 and "orphaned 1" in text.stdout


@pytest.mark.parametrize(("text", "seconds"), [("daily", 86400), ("12h", 43200),
                                               ("90m", 5400), ("2w", 1209600),
                                               ("always", 0)])
def test_frequencies(text: str, seconds: int) -> None:
    assert parse_frequency(text).total_seconds() == seconds


def _reply(status: str, headers: dict[str, str], body: bytes = b"") -> Reply:
    head = f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return Reply([(head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body])


def _edges(store: Store, run_id: str) -> set[tuple[str, str, str, str, str]]:
    """(source URL, edge kind, observed ref, target fetch key, source artifact digest)."""
    return set(store.connection.execute(
        "SELECT f.url, e.edge_kind, e.observed_ref, u.fetch_key, a.digest "
        "FROM discovery_edge e JOIN fetch_attempt f ON f.attempt_seq = e.source_attempt_seq "
        "JOIN url_identity u ON u.url_id = e.target_url_id "
        "JOIN artifact a ON a.artifact_id = e.source_artifact_id WHERE e.run_id = ?",
        (run_id,)))


@pytest.mark.parametrize("unchanged_by", ["not due", "304"])
def test_an_unchanged_page_leads_on_exactly_as_when_it_was_fetched(tmp_path: Path,
                                                                  unchanged_by: str) -> None:
    """A page not due, or answered 304, is not parsed again: its baseline links are
    recorded for the new run and followed. They must lead on as the fetched page's did: to
    the URL as the page wrote it (not its fetch key: the query order is the server's
    business), with the same via and depth, each edge recorded from the artifact it was
    found in (the body for links, the response head for a redirect)."""
    html = b'<a href="/q?b=2&amp;a=1">q</a> <a href="/moved">m</a> <iframe src="/f"></iframe>'
    text = {"Content-Type": "text/plain"}
    routes = {"/": _reply("200 OK", {"Content-Type": "text/html", "ETag": '"v1"'}, html),
              "/moved": _reply("301 Moved Permanently", {"Location": "/r?d=4&c=3"}, b"moved"),
              "/q?b=2&a=1": _reply("200 OK", text, b"q"),
              "/r?d=4&c=3": _reply("200 OK", text, b"r"),
              "/f": _reply("200 OK", {"Content-Type": "text/html"}, b"<p>frame</p>")}
    store_path = tmp_path / "s"
    with RawServer(routes) as server:
        seeds = [server.url("/")]
        first = crawl(store_path, CrawlConfig(seeds=seeds), workers=1)
        before = len(server.exchanges)
        recrawl = {"/moved$": "weekly"}
        if unchanged_by == "not due":
            recrawl["/$"] = "weekly"
        else:
            server.routes["/"] = _reply("304 Not Modified", {"ETag": '"v1"'})
        second = crawl(store_path, CrawlConfig(seeds=seeds, recrawl=recrawl), workers=1)
        requested = [e.path for e in server.exchanges[before:]]
    assert first.session_completed and second.session_completed
    assert "/q?b=2&a=1" in requested and "/r?d=4&c=3" in requested
    assert "/q?a=1&b=2" not in requested and "/r?c=3&d=4" not in requested
    with Store.open(store_path) as store:
        def frontier(session_id: str) -> set[tuple[str, str, int, str]]:
            return set(store.connection.execute(
                "SELECT url, via, depth, state FROM frontier WHERE session_id = ?",
                (session_id,)))

        assert frontier(second.session_id) == frontier(first.session_id)
        unchanged = {server.url("/"), server.url("/moved")}
        assert {e for e in _edges(store, second.run_id) if e[0] in unchanged} == {
            e for e in _edges(store, first.run_id) if e[0] in unchanged}
        assert verify(store).ok
