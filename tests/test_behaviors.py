"""Behaviours before a render's capture (issue 36 point 4): a page whose content appears
only when a person scrolls, clicks, opens or plays it is captured whole, every item found
is followed, and each action is recorded as evidence with the render.

The site (tests/behaviorsite.py) loads two more screens of items as it is scrolled, three
more per click of a "Load more" button that answers only a trusted (the browser's own)
click, an image that has only a data-src, a closed <details> and a video. Every test
drives the real Debian Chromium (conftest.need_chromium).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import zipfile
from pathlib import Path

import anyio
import pytest

from evidence import CrawlConfig, Crawler, CrawlOptions, Store, verify
from evidence._cli.main import main
from evidence._crawl.behaviors import BehaviorOptions
from evidence._crawl.render import RenderOptions

from .behaviorsite import BehaviorSite, every_item, first_items

ROOT = Path(__file__).resolve().parent.parent


def _crawl(store_path: Path, url: str, behaviors: BehaviorOptions) -> None:
    """Crawl the feed and its items, rendering only the feed. The bounds are generous: a
    loaded machine makes each settle slower, and the test is about what is done, not how
    fast (the defaults are 15 s for the behaviours and 30 s for a render)."""
    behaviors = _generous(behaviors)
    with Store.create(store_path) as store:
        crawler = Crawler(store, CrawlConfig(seeds=[url], render_only=[r"/feed$"],
                                             max_depth=1),
                          CrawlOptions(workers=2, render=RenderOptions(
                              behaviors=behaviors, timeout=240.0)))
        anyio.run(crawler.run)


def _generous(options: BehaviorOptions) -> BehaviorOptions:
    return dataclasses.replace(options, max_seconds=180.0, step_settle=60.0)


def _fetched_items(store_path: Path) -> set[int]:
    with Store.open(store_path) as store:
        urls = store.connection.execute(
            "SELECT url FROM fetch_attempt WHERE render_seq IS NULL AND url LIKE '%/item/%' "
            "AND outcome = 'response'").fetchall()
    return {int(u.rsplit("/", 1)[1]) for (u,) in urls}


def _browser_paths(store_path: Path) -> set[str]:
    with Store.open(store_path) as store:
        urls = store.connection.execute(
            "SELECT url FROM fetch_attempt WHERE render_seq IS NOT NULL").fetchall()
    return {"/" + u.split("/", 3)[3].split("?")[0] for (u,) in urls}


def _log(store_path: Path) -> dict:
    with Store.open(store_path) as store:
        (ns, digest, size), = store.connection.execute(
            "SELECT a.namespace, a.digest, a.size FROM render r JOIN fetch_attempt f ON "
            "f.attempt_seq = r.source_attempt_seq JOIN artifact a ON "
            "a.artifact_id = r.behaviors_id WHERE f.url LIKE '%/feed'").fetchall()
        from evidence._model.refs import ArtifactRef
        return json.loads(store.artifacts.read(ArtifactRef(ns, digest, size), verify=True))


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory, chromium: str):
    """One crawl with the default behaviours and one with none (a browser start and a
    crawl cost a few seconds each)."""
    base = tmp_path_factory.mktemp("behaviors")
    with BehaviorSite() as site:
        _crawl(base / "on", site.url + "/feed", BehaviorOptions())
        hits_on = dict(site.hits)
        site.hits.clear()
        _crawl(base / "off", site.url + "/feed", BehaviorOptions(enabled=()))
        hits_off = dict(site.hits)
    return base, site.url, hits_on, hits_off


@pytest.mark.slow
def test_every_item_behind_scrolling_and_clicks_is_captured_and_followed(crawled) -> None:
    base, _, hits_on, hits_off = crawled
    assert _fetched_items(base / "on") == every_item()
    # Without behaviours only the first screen's items exist when the page is captured.
    assert _fetched_items(base / "off") == set(first_items())
    assert hits_on.get("/more") == 2 and hits_on.get("/button") == 2
    assert "/more" not in hits_off and "/button" not in hits_off


def test_each_action_is_recorded_with_the_requests_that_followed_it(crawled) -> None:
    base, url, _, _ = crawled
    log = _log(base / "on")
    assert log["format"] == "evidence-behaviors/1"
    assert log["enabled"] == ["autoscroll", "lazy", "details", "load-more", "autoplay"]
    by = {}
    for action in log["actions"]:
        by.setdefault(action["behavior"], []).append(action)
    scrolled = [r["url"] for a in by["autoscroll"] for r in a["requests"]]
    assert [u for u in scrolled if "/more" in u] == [url + "/more?page=2", url + "/more?page=3"]
    clicks = by["load-more"]
    assert [a["action"] for a in clicks] == ["click", "click"]
    assert all(a["target"] == 'button#more "Load more"' for a in clicks)
    assert [[r["url"] for r in a["requests"]] for a in clicks] == [
        [url + "/button?click=1"], [url + "/button?click=2"]]
    assert any(r["url"] == url + "/lazy.png" for a in log["actions"] for r in a["requests"])
    assert by["details"][0]["target"] == "1 details"
    assert by["autoplay"][0]["target"] == "1 media"
    assert log["stopped"]["autoscroll"] == "done"
    # Each action's time is from the start of the behaviours, and they run in order.
    times = [a["at_ms"] for a in log["actions"]]
    assert times == sorted(times)
    # Every request named in the log is a recorded attempt of the render.
    with Store.open(base / "on") as store:
        made = {(u, s) for u, s in store.connection.execute(
            "SELECT url, sequence FROM fetch_attempt WHERE render_seq IS NOT NULL")}
    assert {(r["url"], r["sequence"]) for a in log["actions"] for r in a["requests"]} <= made


def test_what_the_behaviours_revealed_is_in_the_captured_dom(crawled) -> None:
    base, _, _, _ = crawled
    assert "/lazy.png" in _browser_paths(base / "on")
    assert "/lazy.png" not in _browser_paths(base / "off")
    with Store.open(base / "on") as store:
        (ns, digest, size), = store.connection.execute(
            "SELECT a.namespace, a.digest, a.size FROM render r JOIN artifact a ON "
            "a.artifact_id = r.dom_id JOIN fetch_attempt f ON f.attempt_seq = "
            "r.source_attempt_seq WHERE f.url LIKE '%/feed'").fetchall()
        from evidence._model.refs import ArtifactRef
        dom = store.artifacts.read(ArtifactRef(ns, digest, size)).decode()
    assert '<details id="folded" open="">' in dom
    assert 'href="/item/105"' in dom and 'id="more"' not in dom  # removed after 2 clicks


def test_with_behaviours_off_no_log_is_recorded(crawled) -> None:
    base, _, _, _ = crawled
    with Store.open(base / "off") as store:
        assert store.connection.execute(
            "SELECT count(*) FROM render WHERE behaviors_id IS NOT NULL").fetchall() == [(0,)]


def test_the_log_is_evidence_verified_shown_and_exported(crawled, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    base, url, _, _ = crawled
    with Store.open(base / "on") as store:
        assert verify(store, full=True).ok
    out = tmp_path / "log.json"
    assert main(["show", str(base / "on"), url + "/feed", "--behaviors", str(out)]) == 0
    assert json.loads(out.read_bytes()) == _log(base / "on")
    assert "behaviour actions" in capsys.readouterr().out
    wacz = tmp_path / "x.wacz"
    assert main(["export", str(base / "on"), "--format", "wacz", "--out", str(wacz)]) == 0
    with zipfile.ZipFile(wacz) as z:
        index = gzip.decompress(z.read("indexes/index.cdx.gz")).decode()
    assert "urn:behaviors:" in index


def test_a_user_script_runs_after_the_behaviours_and_its_value_is_recorded(
        tmp_path: Path, chromium: str) -> None:
    script = "(async () => document.querySelectorAll('a.item').length)()"
    with BehaviorSite() as site:
        _crawl(tmp_path / "s", site.url + "/feed",
               BehaviorOptions(enabled=("autoscroll",), script=script, script_name="count.js"))
    log = _log(tmp_path / "s")
    last = log["actions"][-1]
    assert (last["behavior"], last["target"]) == ("script", "count.js")
    assert last["value"] == 15  # the first screen and two scrolled ones: no clicks asked
    assert log["script"] == "count.js"


def test_the_behaviors_option_is_checked_and_none_turns_them_off(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["crawl", "http://127.0.0.1:9/", "--store", str(tmp_path / "st"),
              "--render", "--behaviors", "autoscroll,wiggle"])
    status, err = exited.value.code, capsys.readouterr().err
    assert status == 2 and "wiggle" in err and "autoscroll,lazy" in err
    assert err.startswith("Error:") and "Try:" in err and "Traceback" not in err
    assert not (tmp_path / "st").exists()
    with pytest.raises(ValueError, match="wiggle"):
        BehaviorOptions(enabled=("wiggle",))
    from evidence._cli.crawl import _behavior_list
    assert _behavior_list("none") == ()
    assert _behavior_list("lazy, details") == ("lazy", "details")
