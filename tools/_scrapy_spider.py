"""The Scrapy peer of tools/bench_crawl.py (used by that benchmark only).

Run inside the benchmark's separate Scrapy venv, never imported by evidence:

    scrapy runspider tools/_scrapy_spider.py -a start_url=http://127.0.0.1:PORT/ \
        -a stats_file=STATS.json -s JOBDIR=DIR -s CONCURRENT_REQUESTS=16 ...

Follows every ``<a href>`` on the start URL's host (the offsite middleware drops other
hosts; the dupe filter, persisted in JOBDIR, drops URLs already seen), yields one small
item per response, and writes the crawler's stats as JSON to ``stats_file`` on close.
Bodies are not stored: this is Scrapy as commonly run, with its durable request queue.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import scrapy


class BenchSpider(scrapy.Spider):
    name = "bench"

    def __init__(self, start_url: str, stats_file: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [start_url]
        self.allowed_domains = [urlsplit(start_url).hostname]
        self.stats_file = stats_file

    def parse(self, response):
        yield {"url": response.url, "status": response.status, "bytes": len(response.body)}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

    def closed(self, reason):
        if self.stats_file:
            stats = dict(self.crawler.stats.get_stats())
            stats["finish_reason"] = reason
            with open(self.stats_file, "w", encoding="utf-8") as f:
                json.dump(stats, f, default=str, indent=1, sort_keys=True)
