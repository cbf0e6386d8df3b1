"""The rules report: verdicts per rule version, failures with their evidence, three formats."""

from __future__ import annotations

import json
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from evidence import Store
from evidence._audit.report import render_html, render_json, render_text, report
from evidence._crawl.rules import evaluate_page, evaluate_stored
from evidence._crawl.rulesfile import parse_rules
from evidence._errors import NotFoundError

from .conftest import Factory, need_chromium, submit_all
from .test_rules import BAD, BAD_HEADERS, CASES, GOOD, GOOD_HEADERS, Pages, rules_text, run_cli

HOSTILE = (b'<html><body><h1>x</h1><p>Copyright 2025</p><img src=x onerror="document.title='
           b"'pwned'\"><script>document.title='pwned'</script></body></html>")
RULES = {
    "copyright": CASES["copyright"],
    "hsts": CASES["hsts"],
    "no-img": "type = \"regex\"\npattern = '<img[^>]*>'\nexpect = \"no_match\"",
}


@pytest.fixture
def judged(store: Store, make: Factory) -> dict[str, object]:
    """Run r1: a good page, a bad page, a hostile page and a page retried after a 500."""
    pages = Pages(store, make)
    good = pages.add("http://example.com/good", GOOD, headers=GOOD_HEADERS)
    bad = pages.add("http://example.com/bad?q=1&r=<2>", BAD, headers=BAD_HEADERS)
    hostile = pages.add("http://example.com/hostile", HOSTILE, headers=GOOD_HEADERS)
    superseded = pages.attempt("http://example.com/retried", b"oops", status=500)
    retried = pages.attempt("http://example.com/retried", GOOD, headers=GOOD_HEADERS,
                            sequence=1)
    rules = parse_rules(rules_text(RULES))
    # The 500 is judged when it happens (as a crawler may do); superseded, it must not count.
    early = evaluate_page(rules, url=superseded.url, attempt_id=superseded.attempt_id,
                          run_id="r1", headers_bytes=store.artifacts.read(
                              superseded.response_headers), body_bytes=b"oops",
                          headers_ref=superseded.response_headers, body_ref=superseded.body,
                          elapsed_ms=superseded.elapsed_ms)
    acks = submit_all(store, [superseded, *early, retried])
    assert {a.status for a in acks} == {"committed"}
    evaluate_stored(store, rules)
    evaluate_stored(store, parse_rules(rules_text({"copyright": CASES["copyright"]},
                                                  version=2)))
    return {"good": good, "bad": bad, "hostile": hostile, "retried": retried}


def test_report_counts_current_pages_per_rule_version(store: Store, judged: dict) -> None:
    data = report(store, "r1")
    assert data.pages == 4 and data.run_id == "r1" and data.session_id == "s1"
    tallies = {(t.rule_id, t.rule_version): (t.verdicts, t.not_evaluated) for t in data.rules}
    assert list(tallies) == [("copyright", "1"), ("copyright", "2"), ("hsts", "1"),
                             ("no-img", "1")]
    assert tallies[("copyright", "1")] == ({"pass": 3, "fail": 1, "error": 0,
                                            "not_applicable": 0}, 0)
    assert tallies[("hsts", "1")][0]["fail"] == 1
    assert tallies[("no-img", "1")][0]["fail"] == 1
    assert all(len(t.rule_hashes) == 1 for t in data.rules)


def test_each_failure_carries_its_evidence(store: Store, judged: dict) -> None:
    data = report(store, "r1")
    found = {(f.rule_id, f.rule_version, f.url): f for f in data.failures}
    assert set(found) == {("copyright", "1", judged["bad"].url),
                          ("copyright", "2", judged["bad"].url),
                          ("hsts", "1", judged["bad"].url),
                          ("no-img", "1", judged["hostile"].url)}
    failure = found[("hsts", "1", judged["bad"].url)]
    attempt = judged["bad"]
    assert failure.attempt_id == attempt.attempt_id and failure.http_status == 200
    assert failure.response_headers_digest == attempt.response_headers.digest
    assert failure.body_digest == attempt.body.digest
    assert failure.reason == "required header strict-transport-security is absent"
    [(index, input_hash)] = store.connection.execute(
        "SELECT log_index, input_hash FROM rule_evaluation WHERE rule_id = 'hsts' "
        "AND verdict = 'fail'").fetchall()
    assert (failure.evaluation_log_index, failure.input_hash) == (index, input_hash)
    assert failure.details["input"]["response_headers"]["digest"] == failure.\
        response_headers_digest


def test_report_is_a_pure_function_of_the_store(store: Store, judged: dict) -> None:
    first = report(store, "r1")
    again = report(store, "r1")
    for render in (render_text, render_json, render_html):
        assert render(first) == render(again)
    data = json.loads(render_json(first))
    assert data["log_size"] == store.connection.execute(
        "SELECT max(tree_size) FROM commit_log").fetchall()[0][0]
    limited = report(store, "r1", max_failures=1)
    assert len(limited.failures) == 1 and limited.failures_omitted == 3


def test_text_report_lists_failures_with_hashes(store: Store, judged: dict) -> None:
    text = render_text(report(store, "r1"))
    attempt = judged["bad"]
    assert re.search(r"^copyright v1 +3 +1 +0 +0 +0$", text, re.MULTILINE)
    assert f"FAIL  hsts v1  {attempt.url}" in text
    assert f"head    {attempt.response_headers.digest}" in text
    assert f"body    {attempt.body.digest}" in text
    assert "failures and errors: 4" in text


def test_report_of_an_unknown_run_is_not_found(store: Store, judged: dict) -> None:
    with pytest.raises(NotFoundError, match="no run 'nope'"):
        report(store, "nope")


def test_html_report_is_self_contained_and_escapes_stored_text(
        store: Store, judged: dict) -> None:
    page = render_html(report(store, "r1"))
    assert "default-src 'none'" in page
    tags = Tags()
    tags.feed(page)
    assert tags.names <= {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3",
                          "dl", "dt", "dd", "code", "span", "table", "thead", "tbody", "tr", "th",
                          "td", "br", "details", "summary", "pre", "p"}
    assert not tags.attributes & {"src", "href", "srcset", "action", "style"} and not any(
        a.startswith("on") for a in tags.attributes)
    assert "&lt;img src=x onerror=" in page
    assert "http://example.com/bad?q=1&amp;r=&lt;2&gt;" in page


class Tags(HTMLParser):
    """Every element name and attribute name in a document."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()
        self.attributes: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.names.add(tag)
        self.attributes.update(name for name, _ in attrs)


def dump_dom(path: Path, tmp_path: Path) -> str:
    """The DOM headless Chromium builds from ``path`` (Debian package: chromium; a
    missing browser fails in CI and skips elsewhere: conftest.need_chromium)."""
    exe = need_chromium()
    done = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_html_report_renders_in_a_headless_browser_and_shows_the_failures(
        store: Store, judged: dict, tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.html"
    assert run_cli("report", store.path, "--run", "r1", "--format", "html", "--out", out) == 0
    assert capsys.readouterr().err == f"wrote {out}\n"
    dom = dump_dom(out, tmp_path)
    rows = re.findall(r'<tr class="(fail|error)" data-rule="([^"]+)" data-attempt="([^"]+)">',
                      dom)
    expected = {(f.verdict, f.rule_id, f.attempt_id) for f in report(store, "r1").failures}
    assert len(rows) == 4 and set(rows) == expected
    assert judged["bad"].response_headers.digest in dom
    assert "http://example.com/bad?q=1&amp;r=&lt;2&gt;" in dom  # the URL, as text
    assert '<span id="failure-count">4</span>' in dom
    assert "<title>Rules report: run r1</title>" in dom, "no stored script ran"
    assert "<img" not in dom and "<script" not in dom, "stored markup stayed text"


def test_cli_report_text_and_json(store: Store, judged: dict, capsys) -> None:
    assert run_cli("report", store.path, "--run", "r1") == 0
    assert "failures and errors: 4" in capsys.readouterr().out
    assert run_cli("report", store.path, "--run", "r1", "--format", "json",
                   "--max-failures", "2") == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["failures"]) == 2 and data["failures_omitted"] == 2
    assert run_cli("report", store.path, "--run", "nope") == 2
    assert "Error: no run 'nope' in the store" in capsys.readouterr().out


def test_a_run_without_verdicts_reports_that(store: Store, make: Factory) -> None:
    Pages(store, make).add("http://example.com/", GOOD, headers=GOOD_HEADERS)
    data = report(store, "r1")
    assert data.rules == [] and data.failures == [] and data.pages == 1
    assert "no rule verdicts in this run" in render_text(data)
    assert "No rule verdicts in this run." in render_html(data)


@pytest.fixture
def many(store: Store, make: Factory) -> None:
    """30 slow pages that also lack HSTS, and 5 good ones: two rules fail, each its way."""
    pages = Pages(store, make)
    attempts = [pages.attempt(f"http://example.com/slow/{i}", BAD, headers=BAD_HEADERS,
                              elapsed_ms=2000.0 + i) for i in range(30)]
    attempts += [pages.attempt(f"http://example.com/ok/{i}", GOOD, headers=GOOD_HEADERS)
                 for i in range(5)]
    assert {a.status for a in submit_all(store, attempts)} == {"committed"}
    evaluate_stored(store, parse_rules(rules_text({"fast": CASES["fast"],
                                                   "hsts": CASES["hsts"]})))


def test_failures_are_grouped_by_rule_and_reason_with_counts(store: Store, many: None) -> None:
    data = report(store, "r1")
    assert [(g.rule_id, g.verdict, g.count, g.reason) for g in data.groups] == [
        ("fast", "fail", 30, "The response took … ms; the limit is 1000 ms."),
        ("hsts", "fail", 30, "Required header strict-transport-security is absent."),
    ]
    assert sum(g.count for g in data.groups) == len(data.failures) == 60
    text = render_text(data)
    assert re.search(r"^ +30  fail +fast v1 +The response took … ms; the limit is 1000 ms\.$",
                     text, re.MULTILINE), text
    assert "reason  The response took 2007 ms; the limit is 1000 ms." in text


def test_html_lists_each_group_up_to_a_bound_and_counts_the_rest(
        store: Store, many: None) -> None:
    data = report(store, "r1")
    page = render_html(data, per_group=4)
    rows = re.findall(r'<tr class="fail" data-rule="([^"]+)" data-attempt=', page)
    assert sorted(rows) == ["fast"] * 4 + ["hsts"] * 4
    assert page.count("26 more in this group not listed here") == 2
    assert '<span id="failure-count">60</span>' in page
    assert "<td>The response took … ms; the limit is 1000 ms.</td><td class=\"n\">30</td>" \
        in page
    assert len(render_html(data, per_group=50)) > len(page)


def test_the_html_page_stays_small_however_many_failures(tmp_path: Path) -> None:
    """tools/bench_report.py, bounded: 4 times the verdicts, about the same page."""
    import importlib.util

    import anyio

    spec = importlib.util.spec_from_file_location(
        "bench_report", Path(__file__).resolve().parent.parent / "tools" / "bench_report.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    sizes = {}
    for pages in (500, 2000):
        with Store.create(tmp_path / str(pages), sync="normal") as store:
            anyio.run(bench.generate, store, pages, 0.3, 13)
            data = report(store, "r1")
        sizes[pages] = (len(render_html(data)), len(render_json(data)),
                        len(bench.baseline_html(data)))
    assert sizes[2000][1] > 3 * sizes[500][1], "the complete listing grows with the run"
    assert sizes[2000][2] > 3 * sizes[500][2], "so did the page before issue 13"
    assert sizes[2000][0] < 1.2 * sizes[500][0], "the page is bounded by groups, not pages"


# --- the crawl's own report, with no rules (issue 34) ------------------------------------

def test_a_crawl_without_rules_gets_its_own_report_for_the_latest_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import anyio

    from evidence import CrawlConfig, Crawler, CrawlOptions
    from evidence._cli.main import main as cli_main
    from evidence._demo.site import SiteConfig, TestSite

    site_config = SiteConfig(pages=12, flaky={"/p/3": 9})  # /p/3: 500 until it fails
    with TestSite(site_config) as site, Store.create(tmp_path / "s") as store:
        first = anyio.run(Crawler(store, CrawlConfig(seeds=[site.url], max_attempts=2),
                                  CrawlOptions(workers=4, max_documents=3)).run)
        second = anyio.run(Crawler(store, CrawlConfig(seeds=[site.url], max_attempts=2),
                                   CrawlOptions(workers=4)).run)
        assert first.run_id != second.run_id and second.session_completed
        data = report(store)  # the latest run
        with store.snapshot() as conn:  # what the report must agree with, asked directly
            statuses = dict(conn.execute(
                "SELECT CAST(http_status AS TEXT), count(*) FROM fetch_attempt WHERE run_id = ? "
                "AND http_status IS NOT NULL GROUP BY 1", (second.run_id,)).fetchall())
            skipped = conn.execute("SELECT count(*) FROM frontier WHERE state = 'skipped'"
                                   ).fetchall()[0][0]
    assert data.run_id == second.run_id and data.rules == []
    crawl = data.crawl
    assert crawl is not None
    assert crawl.statuses == statuses and statuses.get("404") == 2
    assert statuses.get("301") == len(site_config.redirects) and statuses.get("500") == 2
    assert crawl.attempts == sum(crawl.outcomes.values()) >= sum(statuses.values())
    assert crawl.frontier["done"] == second.counts.done
    assert [(r.count, "HTTP 500" in r.reason) for r in crawl.failed] == [(1, True)]
    assert sum(r.count for r in crawl.skipped) == skipped >= 2  # robots.txt's private pages
    assert any("robots" in r.reason for r in crawl.skipped)

    assert cli_main(["report", str(tmp_path / "s")]) == 0
    text = capsys.readouterr().out
    assert f"run      {second.run_id}" in text and "404 2" in text
    assert "failed by reason:" in text and "no rule verdicts in this run" in text
    page = tmp_path / "r.html"
    assert cli_main(["report", str(tmp_path / "s"), "--format", "html", "--out",
                     str(page)]) == 0
    html_page = page.read_text()
    assert '<table id="statuses">' in html_page and "<td>404</td>" in html_page
    assert cli_main(["report", str(tmp_path / "s"), "--run", first.run_id, "--format",
                     "json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == first.run_id


def test_report_on_a_store_with_no_run_says_so(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from evidence._cli.main import main as cli_main

    Store.create(tmp_path / "empty").close()
    assert cli_main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "Error: the store has no run to report on" in err and "Try: crawl into it" in err
