"""The crawler against a real site on 127.0.0.1; the server's request log is the truth."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import pytest

from evidence import CrawlConfig, Crawler, CrawlOptions, EvidenceError, Store, check_log
from evidence._demo.site import SiteConfig, TestSite
from evidence._model.messages import FrontierUpdate, decode_message

from .heldsite import HeldSite

ROOT = Path(__file__).resolve().parent.parent


def crawl(store_path: Path, config: CrawlConfig, **options: object):
    with Store.create(store_path) as store:
        crawler = Crawler(store, config, CrawlOptions(**options))
        return anyio.run(crawler.run)


def path_of(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def frontier_states(store_path: Path) -> dict[str, tuple[str, str]]:
    with Store.open(store_path) as store:
        return {path_of(u): (s, r) for u, s, r in store.connection.execute(
            "SELECT f.url, f.state, f.reason FROM frontier f JOIN crawl_session s "
            "USING (session_id) ORDER BY s.started_at DESC")}


def done_pages(store_path: Path) -> Counter[str]:
    """Pages with a 200 response recorded, counted per path (must be exactly 1 each)."""
    with Store.open(store_path) as store:
        return Counter(path_of(u) for (u,) in store.connection.execute(
            "SELECT url FROM fetch_attempt WHERE http_status = 200 "
            "AND url NOT LIKE '%/robots.txt'"))


def assert_links_recorded(store_path: Path, site: TestSite) -> None:
    """Every page recorded with a 200 has exactly the site's links as discovery edges."""
    with Store.open(store_path) as store:
        rows = store.connection.execute(
            "SELECT f.url, u.fetch_key FROM fetch_attempt f "
            "JOIN discovery_edge e ON e.source_attempt_seq = f.attempt_seq "
            "JOIN url_identity u ON u.url_id = e.target_url_id "
            "WHERE f.http_status = 200 AND f.url NOT LIKE '%/robots.txt'").fetchall()
        pages = [u for (u,) in store.connection.execute(
            "SELECT url FROM fetch_attempt WHERE http_status = 200 "
            "AND url NOT LIKE '%/robots.txt'")]
    edges: dict[str, set[str]] = {}
    for url, key in rows:
        edges.setdefault(path_of(url), set()).add(path_of(key))
    for url in pages:
        expected = set(site.links(path_of(url)))
        assert edges.get(path_of(url), set()) == expected, url


def test_crawl_records_every_reachable_page_exactly_once(tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=40)) as site:
        result = crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), workers=4)
        counts = site.request_counts()
        reachable = site.reachable_pages()
        disallowed = site.disallowed_paths()
    assert result.outcome == "completed" and result.session_completed
    assert set(done_pages(tmp_path / "s")) == reachable
    assert all(n == 1 for n in done_pages(tmp_path / "s").values())
    assert all(counts[p] == 1 for p in reachable), "no page requested twice"
    assert counts["/robots.txt"] == 1
    assert disallowed and all(counts[p] == 0 for p in disallowed)
    states = frontier_states(tmp_path / "s")
    for p in disallowed:
        assert states[p][0] == "skipped" and states[p][1].startswith("robots:")
    assert_links_recorded(tmp_path / "s", site)
    with Store.open(tmp_path / "s") as store:
        assert check_log(store.connection)[2] == []
        refused = store.connection.execute(
            "SELECT count(*) FROM fetch_attempt WHERE outcome = 'refused_by_robots'"
        ).fetchall()[0][0]
    assert refused == len(disallowed)


def test_a_page_claims_its_workers_next_url_in_its_own_commit(tmp_path: Path) -> None:
    # One commit per page (issue 15): a worker's next URL is claimed in the update that
    # settles its page, not by a claim commit of its own before the request. Every claim
    # is still durable before its request, and the crawl is the same crawl.
    in_flight: list[int] = []
    with TestSite(SiteConfig(pages=40)) as site:
        result = crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), workers=4,
                       progress=lambda p: in_flight.append(p.in_flight),
                       progress_interval=0.001)
        counts = site.request_counts()
        reachable = site.reachable_pages()
    assert result.session_completed
    assert set(done_pages(tmp_path / "s")) == reachable
    assert all(counts[p] == 1 for p in reachable)
    assert in_flight and max(in_flight) <= 4, "a claim riding a commit is not in flight yet"
    with Store.open(tmp_path / "s") as store:
        log = [(decode_message(payload), batch) for payload, batch in store.connection.execute(
            "SELECT payload, batch_seq FROM ingest_ledger ORDER BY log_index")]
    claims = ridden = 0
    for message, _batch in log:
        if not (isinstance(message, FrontierUpdate) and message.claimed):
            continue
        claims += len(message.claimed)
        # The update that settles a page done claims its worker's next URL.
        settles_a_page = (any(s.state == "done" for s in message.settled)
                          and not set(message.claimed) & {s.url for s in message.settled})
        ridden += settles_a_page and len(message.claimed)
    assert claims >= len(reachable)
    assert ridden >= claims // 2, f"{ridden} of {claims} claims rode in a page's commit"


def test_redirect_chain_is_recorded_hop_by_hop_and_target_fetched_once(
        tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=10)) as site:
        crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), workers=2)
        counts = site.request_counts()
    assert counts["/old"] == 1 and counts["/moved"] == 1 and counts["/p/1"] == 1
    with Store.open(tmp_path / "s") as store:
        hops = store.connection.execute(
            "SELECT f.url, f.http_status, e.observed_ref, e.edge_kind FROM fetch_attempt f "
            "JOIN discovery_edge e ON e.source_attempt_seq = f.attempt_seq "
            "WHERE e.edge_kind = 'redirect' ORDER BY f.attempt_seq").fetchall()
    assert [(path_of(u), s, ref) for u, s, ref, _k in hops] == [
        ("/old", 301, "/moved"), ("/moved", 301, "/p/1")]


def test_404_is_recorded_and_transient_500_is_retried_within_policy(tmp_path: Path) -> None:
    config = SiteConfig(pages=8, flaky={"/p/3": 2, "/p/4": 5})
    with TestSite(config) as site:
        result = crawl(tmp_path / "s", CrawlConfig(seeds=[site.url], max_attempts=3),
                       workers=2)
        counts = site.request_counts()
    assert result.session_completed
    assert counts["/p/3"] == 3, "two 500s, then the 200"
    assert counts["/p/4"] == 3, "three attempts, then failed"
    states = frontier_states(tmp_path / "s")
    assert states["/p/3"][0] == "done"
    assert states["/p/4"] == ("failed", "HTTP 500 on attempt 3 of 3: attempts exhausted")
    assert states["/missing/a"] == ("done", "HTTP 404")
    with Store.open(tmp_path / "s") as store:
        statuses = [s for (s,) in store.connection.execute(
            "SELECT http_status FROM fetch_attempt WHERE url LIKE '%/p/3' "
            "ORDER BY sequence")]
    assert statuses == [500, 500, 200]


def test_max_documents_chunks_the_session_over_several_runs(tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=25)) as site:
        config = CrawlConfig(seeds=[site.url])
        results = []
        for _ in range(20):
            results.append(crawl(tmp_path / "s", config, workers=3, max_documents=7))
            if results[-1].session_completed:
                break
        counts = site.request_counts()
        reachable = site.reachable_pages()
    assert [r.outcome for r in results[:-1]] == ["capped"] * (len(results) - 1)
    assert results[-1].outcome == "completed" and len(results) >= 4
    assert len({r.session_id for r in results}) == 1, "one session across the runs"
    assert all(r.documents <= 7 for r in results)
    assert all(counts[p] == 1 for p in reachable)
    assert set(done_pages(tmp_path / "s")) == reachable


def test_restart_with_a_different_configuration_is_refused(tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=20)) as site:
        crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), max_documents=3)
        with pytest.raises(EvidenceError, match="these keys differ: max_depth, scope"):
            crawl(tmp_path / "s", CrawlConfig(seeds=[site.url], max_depth=1,
                                              scope="domain"))
        # --clean abandons the open session and starts a new full one.
        result = crawl(tmp_path / "s", CrawlConfig(seeds=[site.url], max_depth=1),
                       clean=True)
    assert result.session_completed and not result.resumed
    with Store.open(tmp_path / "s") as store:
        outcomes = store.connection.execute(
            "SELECT outcome FROM crawl_session ORDER BY started_at").fetchall()
    assert outcomes == [("abandoned",), ("completed",)]


def test_host_in_429_backoff_stays_in_backoff_across_a_restart(tmp_path: Path) -> None:
    config = SiteConfig(pages=12, rate_limited={"/p/2": (1, 3.0)})
    with TestSite(config) as site:
        crawl_config = CrawlConfig(seeds=[site.url])

        async def first_run() -> None:
            with Store.create(tmp_path / "s") as store:
                crawler = Crawler(store, crawl_config, CrawlOptions(workers=1, per_host=1))
                async with anyio.create_task_group() as tg:
                    async def stop_after_429() -> None:
                        while not any(r.status == 429 for r in site.requests):
                            await anyio.sleep(0.02)
                        crawler.request_stop()
                    tg.start_soon(stop_after_429)
                    assert (await crawler.run()).outcome == "stopped"
        anyio.run(first_run)
        limited = next(r for r in site.requests if r.status == 429)
        site.clear_requests()
        result = crawl(tmp_path / "s", crawl_config, workers=2)
        after = site.requests
    assert result.session_completed
    assert after, "the second run fetched the rest"
    assert min(r.time for r in after) >= limited.time + 3.0 - 0.05, \
        "no request reached the host before its Retry-After ran out"
    with Store.open(tmp_path / "s") as store:
        reasons = [r for (r,) in store.connection.execute("SELECT reason FROM host_state")]
    assert any("HTTP 429" in r for r in reasons)


def test_robots_txt_is_reused_from_the_store_until_it_expires(tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=15)) as site:
        config = CrawlConfig(seeds=[site.url])
        crawl(tmp_path / "s", config, max_documents=4)
        crawl(tmp_path / "s", config)
        assert site.request_counts()["/robots.txt"] == 1


_started_crawls: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def reap_crawl_processes() -> Iterator[None]:
    """Each crawl a test started with ``_crawl_process`` is killed if still running when
    the test ends, and its pipe closed: a test that fails half-way leaves no process, and no
    unclosed pipe for the garbage collector to report in whatever test runs next (import
    this fixture into a module that uses ``_crawl_process``)."""
    yield
    while _started_crawls:
        proc = _started_crawls.pop()
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
        proc.wait(timeout=60)


def _crawl_process(url: str, store: Path, *extra: str) -> subprocess.Popen:
    log = open(store.parent / "crawl-stderr.log", "a")  # noqa: SIM115 (the child owns it)
    proc = subprocess.Popen(
        [sys.executable, "-m", "evidence", "crawl", url, "--store", str(store),
         "--workers", "4", *extra],
        stdout=subprocess.PIPE, stderr=log, text=True)
    log.close()
    _started_crawls.append(proc)
    return proc


def _stderr(store: Path) -> str:
    return (store.parent / "crawl-stderr.log").read_text()


def _wait_for_live(store: Path, proc: subprocess.Popen, check, timeout: float = 60.0) -> None:
    """Until the running crawl's STORE/live-stats.json passes ``check`` (it is rewritten
    each progress interval; a half-written file is read again)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check(json.loads((store / "live-stats.json").read_text())):
                return
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        assert proc.poll() is None, f"the crawl ended first:\n{_stderr(store)}"
        assert time.monotonic() < deadline, f"timed out waiting for live-stats:\n{_stderr(store)}"
        time.sleep(0.02)


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_records_each_page_once(
        tmp_path: Path) -> None:
    rng = random.Random(20261202)
    # 120 pages of 50 ms each at 4 workers take at least 1.5 s to fetch; a run lives at
    # most 0.15 s past its first request before it is killed, so 8 kills land mid-crawl.
    slow = {f"/p/{i}": 0.05 for i in range(120)}
    with TestSite(SiteConfig(pages=120, slow=slow)) as site:
        kills = 0
        while True:
            seen = len(site.requests)
            # With max-attempts 3, a page caught in flight by three random kills would be
            # failed like one that kills the crawler (tested on its own below).
            proc = _crawl_process(site.url, tmp_path / "s", "--max-attempts", "100")
            while len(site.requests) == seen and proc.poll() is None:
                time.sleep(0.005)  # kill only once this run is fetching
            if kills < 8:
                time.sleep(rng.uniform(0.02, 0.15))
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.communicate()
                    kills += 1
                    continue
            proc.communicate(timeout=120)
            assert proc.returncode == 0, _stderr(tmp_path / "s")
            break  # a run that was not killed completes the session (checked below)
        counts = site.request_counts()
        reachable = site.reachable_pages()
        disallowed = site.disallowed_paths()
    assert kills == 8, "the loop must actually kill the crawler mid-crawl"
    done = done_pages(tmp_path / "s")
    assert set(done) == reachable
    assert all(n == 1 for n in done.values()), "each page is done exactly once"
    assert_links_recorded(tmp_path / "s", site)
    twice = sum(n - 1 for p, n in counts.items() if p in reachable and n > 1)
    # A kill re-requests at most the pages fetched and not yet committed: two per fetch
    # slot (docs/crawling.md, "Claim before fetch"), at --workers 4.
    assert twice <= 2 * 4 * kills, "re-requests never exceed the pages on their way per kill"
    assert all(counts[p] == 0 for p in disallowed)
    with Store.open(tmp_path / "s") as store:
        assert check_log(store.connection)[2] == []
        killed_runs = store.connection.execute(
            "SELECT count(*) FROM crawl_run WHERE reason LIKE 'no end recorded%'"
        ).fetchall()[0][0]
        sessions = store.connection.execute(
            "SELECT count(*), min(outcome) FROM crawl_session").fetchall()[0]
        open_runs = store.connection.execute(
            "SELECT count(*) FROM crawl_run WHERE ended_at IS NULL").fetchall()[0][0]
    # Every killed run is recorded as such by the next start (a kill can land before the
    # new process recorded its run, if the server logged the previous one's last request
    # late: then there is no run to record).
    assert open_runs == 0 and 0 < killed_runs <= kills
    assert sessions == (1, "completed")


@pytest.mark.slow
def test_a_url_that_kills_the_crawler_every_time_ends_failed(tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=10, kill_paths={"/p/5"}, hold_seconds=30)) as site:
        for claim in range(1, 4):
            proc = _crawl_process(site.url, tmp_path / "s")
            deadline = time.monotonic() + 30
            while site.request_counts()["/p/5"] < claim:
                assert time.monotonic() < deadline, "the crawler never reached /p/5"
                assert proc.poll() is None, _stderr(tmp_path / "s")
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
        site.kill_paths.clear()
        proc = _crawl_process(site.url, tmp_path / "s")
        proc.communicate(timeout=60)
        assert proc.returncode == 0, _stderr(tmp_path / "s")
        assert site.request_counts()["/p/5"] == 3, "never requested a fourth time"
    state, reason = frontier_states(tmp_path / "s")["/p/5"]
    assert state == "failed" and reason.startswith("attempts exhausted: claimed 3 times")


def test_stop_command_ends_a_running_crawl_gracefully(tmp_path: Path) -> None:
    # The pages are held until `evidence stop` has been sent, so the crawl is still running
    # when `evidence status` and `evidence stop` (two interpreters) get to it, at any load.
    with HeldSite(SiteConfig(pages=40)) as site:
        proc = _crawl_process(site.url, tmp_path / "s", "--json")
        try:
            site.wait_for_request("/p/0", timeout=60)
            _wait_for_live(tmp_path / "s", proc, lambda live: live.get("writer", {}).get(
                "committed", 0) > 0 and live.get("requested", 0) > 0)
            shown = subprocess.run([sys.executable, "-m", "evidence", "status",
                                    str(tmp_path / "s"), "--json"], capture_output=True,
                                   text=True, timeout=60)
            stopper = subprocess.run([sys.executable, "-m", "evidence", "stop",
                                      str(tmp_path / "s")], capture_output=True, text=True,
                                     timeout=60)
        finally:
            site.release()  # the in-flight fetches finish within the grace period
        out, _err = proc.communicate(timeout=60)
    assert stopper.returncode == 0, stopper.stderr
    assert proc.returncode == 0, _stderr(tmp_path / "s")
    assert '"outcome":"stopped"' in out
    live = json.loads(shown.stdout)
    assert live["crawl_pid"] == proc.pid
    assert live["live"]["writer"]["committed"] > 0 and live["live"]["requested"] > 0
    assert live["sessions"][0]["frontier"]["in_flight"] >= 0
    states = frontier_states(tmp_path / "s")
    assert not any(s == "in_flight" for s, _r in states.values()), \
        "in-flight fetches finished and were committed"


def test_sitemap_seeding_queues_its_locations(tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=12)) as site:
        result = crawl(tmp_path / "s", CrawlConfig(seeds=[site.url], sitemap=True))
        counts = site.request_counts()
        reachable = site.reachable_pages()
    assert result.session_completed and counts["/sitemap.xml"] == 1
    assert all(counts[p] == 1 for p in reachable)
    with Store.open(tmp_path / "s") as store:
        locs = {path_of(k) for (k,) in store.connection.execute(
            "SELECT u.fetch_key FROM discovery_edge e JOIN url_identity u "
            "ON u.url_id = e.target_url_id WHERE e.edge_kind = 'sitemap'")}
    assert locs == set(reachable)


def test_clean_without_confirmation_changes_nothing(tmp_path: Path) -> None:
    with TestSite(SiteConfig(pages=8)) as site:
        crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), max_documents=2)
        done = subprocess.run(
            [sys.executable, "-m", "evidence", "crawl", site.url, "--store",
             str(tmp_path / "s"), "--clean"], capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "not confirmed" in done.stderr
    assert "--yes" in done.stderr
    with Store.open(tmp_path / "s") as store:
        assert store.connection.execute(
            "SELECT count(*), max(outcome) FROM crawl_session").fetchall() == [(1, None)]


@pytest.mark.parametrize("processes", ["0", "2"])  # 2: the rules run in worker processes
def test_crawl_with_rules_judges_every_page_in_its_own_transaction(tmp_path: Path,
                                                                  processes: str) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(
        '[[rule]]\nid = "has-heading"\nversion = 1\ntype = "selector"\n'
        'selector = "h1"\nexpect = "match"\n\n'
        '[[rule]]\nid = "etag"\nversion = 1\ntype = "header"\nname = "ETag"\n')
    with TestSite(SiteConfig(pages=10)) as site:
        done = subprocess.run(
            [sys.executable, "-m", "evidence", "crawl", site.url, "--store",
             str(tmp_path / "s"), "--rules", str(rules), "--json", "--processes", processes],
            capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    with Store.open(tmp_path / "s") as store:
        judged = store.connection.execute(
            "SELECT f.attempt_id, count(r.evaluation_id), group_concat(r.rule_id) "
            "FROM fetch_attempt f LEFT JOIN rule_evaluation r ON r.attempt_seq = f.attempt_seq "
            "WHERE f.http_status = 200 AND f.url NOT LIKE '%robots.txt' "
            "GROUP BY f.attempt_seq").fetchall()
        batches = store.connection.execute(
            "SELECT count(*) FROM fetch_attempt f JOIN rule_evaluation r "
            "ON r.attempt_seq = f.attempt_seq JOIN ingest_ledger a ON a.log_index = f.log_index "
            "JOIN ingest_ledger b ON b.log_index = r.log_index WHERE a.batch_seq != b.batch_seq"
        ).fetchall()[0][0]
        recorded = json.loads(store.connection.execute(
            "SELECT config FROM crawl_session").fetchall()[0][0])["rules"]
    assert judged and all(n == 2 for _a, n, _r in judged), "two rules on every page"
    assert batches == 0, "verdicts commit with their page"
    assert {r["id"] for r in recorded} == {"has-heading", "etag"}
    report = subprocess.run([sys.executable, "-m", "evidence", "report", str(tmp_path / "s"),
                             "--run", run_id, "--format", "json"],
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert "has-heading" in report.stdout


# --- page requisites, and one pass per page (issue 15) -------------------------------------

def edges_of(store_path: Path) -> set[tuple[str, str, str]]:
    with Store.open(store_path, read_only=True) as store:
        return {(path_of(src), kind, path_of(key)) for src, kind, key in store.connection.execute(
            "SELECT f.url, e.edge_kind, u.fetch_key FROM discovery_edge e "
            "JOIN fetch_attempt f ON f.attempt_seq = e.source_attempt_seq "
            "JOIN url_identity u ON u.url_id = e.target_url_id")}


@pytest.mark.parametrize("requisites", [False, True])
def test_page_requisites_are_recorded_and_fetched_only_when_the_crawl_says_so(
        tmp_path: Path, requisites: bool) -> None:
    from .jssite import JsSite

    with JsSite() as site:
        config = CrawlConfig(seeds=[site.url + "/"], requisites=requisites)
        result = crawl(tmp_path / "s", config, workers=2)
        hits = dict(site.hits)
    assert result.outcome == "completed"
    assert ("/page", "image", "/logo.png") in edges_of(tmp_path / "s")  # recorded always
    assert hits.get("/logo.png", 0) == (1 if requisites else 0)
    states = frontier_states(tmp_path / "s")
    assert ("/logo.png" in states) is requisites  # not followed: not even queued
    with Store.open(tmp_path / "s", read_only=True) as store:
        assert check_log(store.connection)[2] == []


def test_each_url_of_a_crawl_is_normalized_once_and_each_job_carries_its_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One pass per page: a job carries the fetch key and host the frontier gave it, a
    page's links are keyed once (and the writer reuses those keys), so no URL is
    normalized twice in a crawl and url_host runs once per job (issue 15: before, url_host
    ran 3-4 times and normalize_url up to 4 times per page)."""
    import evidence._model.urls as urls

    calls: Counter[tuple[str, str]] = Counter()
    originals = {name: getattr(urls, name) for name in ("normalize_url", "url_host",
                                                        "key_and_host")}

    def counting(name: str):
        def wrapper(url: str, *args: object, **kwargs: object):
            calls[(name, url)] += 1
            return originals[name](url, *args, **kwargs)
        return wrapper

    for module in [m for n, m in sys.modules.items() if n.startswith("evidence")]:
        for name, original in originals.items():
            if getattr(module, name, None) is original:
                monkeypatch.setattr(module, name, counting(name))
    with TestSite(SiteConfig(pages=60)) as site:
        result = crawl(tmp_path / "s", CrawlConfig(seeds=[site.url]), workers=4)
    assert result.outcome == "completed" and result.documents >= 60
    seeds_and_robots = {u for (_, u) in calls if u.rstrip("/") == site.url.rstrip("/")
                        or u.endswith(("/robots.txt", "/sitemap.xml"))}
    keyed = Counter()
    for (name, url), n in calls.items():
        if name != "url_host" and url not in seeds_and_robots:
            keyed[url] += n
    assert keyed and max(keyed.values()) == 1, keyed.most_common(3)
    hosts = sum(n for (name, url), n in calls.items() if name == "url_host")
    assert hosts <= result.documents + 5  # one per job, and a few for seeds and robots.txt
