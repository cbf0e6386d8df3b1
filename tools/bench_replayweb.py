#!/usr/bin/env python3
"""Benchmark opening a WACZ in ReplayWeb.page (issue 33 point 4): ours against py-wacz's.

The demo site (``evidence._demo.site``) of ``--pages`` pages is crawled into a store,
exported with ``evidence export --format wacz`` (our compressed index: ``index.cdx.gz`` in
gzip members of 1,024 lines plus ``index.idx``), and the WARC inside it is packaged again
by py-wacz (``wacz create`` with the same pages.jsonl): two WACZs of the same WARC. Then,
``--rounds`` times, interleaved A B A B so that load on the machine falls on both alike,
each is opened in ReplayWeb.page (the pinned ``replaywebpage`` npm package,
``evidence.testing.replayweb``, served from 127.0.0.1 with the WACZ, byte ranges and all)
in a fresh headless Chromium (new profile: no service worker, no cache), at the page in the
middle of the page list; the time is from the navigation to the replayed page's title in
its frame (the first replayed page a person sees). Reported: median and min-max per WACZ,
the ratio of the medians, the WACZ sizes and what each read of its WACZ (bytes served).

Examples:
  python tools/bench_replayweb.py --pages 300 --rounds 4      # about two minutes
  python tools/bench_replayweb.py --pages 5000 --rounds 6     # the size of issue 33
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evidence import CrawlConfig, Crawler, CrawlOptions, Store  # noqa: E402
from evidence._archive.cdxj import timestamp14  # noqa: E402
from evidence._archive.wacz import export_wacz  # noqa: E402
from evidence._crawl.browser import Browser  # noqa: E402
from evidence._demo.site import SiteConfig, TestSite  # noqa: E402
from evidence.testing.replayweb import (  # noqa: E402
    ReplayWebPage,
    package_dir,
    replay_frame_value,
)


def build(work: Path, pages: int) -> tuple[Path, Path, dict]:
    """Our WACZ and py-wacz's of the same WARC, and the page to open."""
    with TestSite(SiteConfig(pages=pages, links_per_page=4)) as site, \
            Store.create(work / "store") as store:
        started = time.monotonic()
        report = anyio.run(Crawler(store, CrawlConfig(seeds=[site.url]),
                                   CrawlOptions(workers=8)).run)
        print(f"crawled {report.counts if hasattr(report, 'counts') else ''} "
              f"in {time.monotonic() - started:.1f} s", file=sys.stderr)
        ours = work / "evidence.wacz"
        made = export_wacz(store, ours)
    with zipfile.ZipFile(ours) as zf:
        zf.extract("archive/data.warc.gz", work)
        zf.extract("pages/pages.jsonl", work)
    listed = [json.loads(x) for x in (work / "pages" / "pages.jsonl").read_text()
              .splitlines()[1:]]
    theirs = work / "pywacz.wacz"
    done = subprocess.run([sys.executable, "-W", "ignore", "-m", "wacz", "create", "-o",
                           str(theirs), "-p", str(work / "pages" / "pages.jsonl"),
                           str(work / "archive" / "data.warc.gz")],
                          capture_output=True, text=True, cwd=work, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"wacz create failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    listed.sort(key=lambda p: p["url"])
    page = listed[len(listed) // 2]
    print(f"{made.pages} pages, {made.indexed} index lines; opening {page['url']}",
          file=sys.stderr)
    return ours, theirs, page


async def first_page(url: str, page_url: str, title: str, timeout: float) -> float:
    async with Browser() as browser, browser.page() as page:
        started = time.monotonic()
        await page.send("Page.navigate", {"url": url})
        seen = await replay_frame_value(page, page_url, "document.title", timeout=timeout,
                                        ready=lambda value: value == title,
                                        sleep=lambda s: anyio.sleep(0.02))
        elapsed = time.monotonic() - started
    if seen != title:
        raise SystemExit(f"the page did not replay within {timeout:g} s (title {seen!r})")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--pages", type=int, default=300, help="pages of the demo site")
    parser.add_argument("--rounds", type=int, default=4, help="openings of each WACZ (ABAB)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds one opening may take")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    package = package_dir()
    with tempfile.TemporaryDirectory(prefix="bench-replayweb-") as tmp:
        work = Path(tmp)
        ours, theirs, page = build(work, args.pages)
        ts = timestamp14(page["ts"])
        times: dict[str, list[float]] = {"evidence": [], "py-wacz": []}
        served: dict[str, int] = {}
        for _round in range(args.rounds):
            for name, wacz in (("evidence", ours), ("py-wacz", theirs)):
                with ReplayWebPage(package, wacz) as rwp:
                    times[name].append(anyio.run(first_page, rwp.embed_url(page["url"], ts),
                                                 page["url"], page.get("title", ""),
                                                 args.timeout))
                    served[name] = rwp.bytes_served["/archive.wacz"]
        result = {
            "pages": args.pages, "rounds": args.rounds, "page": page["url"],
            "sizes": {"evidence": ours.stat().st_size, "py-wacz": theirs.stat().st_size},
            "bytes_read_last_round": served,
            "seconds": {name: {"median": round(statistics.median(t), 3),
                               "min": round(min(t), 3), "max": round(max(t), 3),
                               "all": [round(x, 3) for x in t]} for name, t in times.items()},
        }
        result["ratio_of_medians"] = round(
            statistics.median(times["evidence"]) / statistics.median(times["py-wacz"]), 3)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.pages} pages, {args.rounds} rounds (ABAB), time to the first replayed page "
          f"in ReplayWeb.page (headless Chromium, cold profile):")
    for name, stats in result["seconds"].items():
        print(f"  {name:9} median {stats['median']:.2f} s (min {stats['min']:.2f}, "
              f"max {stats['max']:.2f}); WACZ {result['sizes'][name]:,} bytes, "
              f"read {served[name]:,}")
    print(f"  ratio of medians (evidence / py-wacz): {result['ratio_of_medians']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
