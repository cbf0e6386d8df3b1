"""What a crawl costs per page stays flat as the crawl grows (issue 35): the bytes it
writes to the disk, and its memory; and migration 015, which took the scattering index
off the edges, upgrades a store on both backends.

The crawls run in a child process (the kernel counts writes and resident memory per
process): a crawl of a site of N pages, then one of 4N pages, each into a new store, and
the child reads its own ``/proc/self/io`` (``write_bytes``) and ``/proc/self/status``
(``VmHWM``, the resident set's peak) after each. Both figures are ratios of the child's
own counts, never times. The sites are served by this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from evidence import CrawlConfig, Crawler, CrawlOptions, Store, verify
from evidence._crawl.incremental import sitemap_hint
from evidence._demo.site import SiteConfig, TestSite

from .conftest import disk_directory, new_pg_database

N = 250  # pages of the small site; the large one has 4N

# The child: one crawl per (URL, store) pair, then its own counts. Every bounded buffer of a
# crawl is set small here, so that each is full within the first site and what is measured
# is whether anything else grows with the pages: the writer's SQLite page cache (16 MiB by
# default), a reader's (2,000 KiB), the caches of row ids (50,000 entries), the URL memos
# (20,000), the session's document records per message (2,000), and the open pack, whose
# entries are kept until it is sealed (64 MiB of records by default).
CHILD = """
import json, sys
from pathlib import Path
import anyio
from evidence import CrawlConfig, Crawler, CrawlOptions, Store
from evidence._crawl import pages, session
from evidence._store import sqlite
from evidence._write import apply_rows, writer

sqlite.WRITER_CACHE_MIB = 1
sqlite.READER_CACHE_KIB = 256
session._DOCUMENTS_PER_MESSAGE = 100
apply_rows.INTERNER_LIMIT = 500
writer._URL_KEYS_LIMIT = pages._URL_KEYS_LIMIT = 200

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

def written():
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])

out = []
for url, path in zip(sys.argv[1::2], sys.argv[2::2]):
    before = written()
    with Store.create(Path(path)) as store:
        store.artifacts.pack_bytes = 256 * 1024
        result = anyio.run(Crawler(store, CrawlConfig(seeds=[url]),
                                   CrawlOptions(workers=8, per_host=8)).run)
    size = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    out.append({"documents": result.documents, "written": written() - before,
                "store_bytes": size, "peak_rss": status("VmHWM")})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def two_crawls() -> list[dict]:
    """The child's counts after a crawl of N pages, then after one of 4N, into stores on
    the disk (the suite's temporary files are in memory: tests/conftest.py)."""
    config = dict(links_per_page=8, redirects={}, private_links=(), not_found=())
    with disk_directory() as work, TestSite(SiteConfig(pages=N, **config)) as small, \
            TestSite(SiteConfig(pages=4 * N, **config)) as large:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, small.url, str(work / "small"), large.url,
             str(work / "large")], capture_output=True, text=True, timeout=600,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        counts = json.loads(done.stdout.splitlines()[-1])
        assert [c["documents"] >= n for c, n in zip(counts, (N, 4 * N), strict=True)] == [
            True, True], counts
        # the kernel counts no writes to a tmpfs: a ratio of nothing would pass unmeasured
        assert all(c["written"] > c["store_bytes"] / 2 for c in counts), (work, counts)
    return counts


def test_a_crawl_writes_no_more_per_page_as_its_store_grows(two_crawls: list[dict]) -> None:
    """Bytes written per page at 4N are within 1.15x of those at N, and the crawl of 4N
    writes less than 4x its store's final size (a small store's fixed costs, the schema
    and the WAL's first frames, keep it above the 3x a 5,000-page crawl stays under:
    docs/benchmarks.md). Before the write path was reworked (4 KiB pages, a checkpoint
    every 1,000 frames, an index on every edge's target) the crawl of 4N wrote 1.23x the
    bytes per page of the crawl of N, and 6.0x its store.

    The ratio depends on how the writer's group commits fall, which follows the machine's
    load: 1.05-1.08x in six runs (three idle, three beside three CPU hogs), 1.107x and
    1.108x in two full runs of the suite on the 2-core machine. A bound of 1.1x failed
    those two; 1.15x holds them and still fails the 1.23x this guards against."""
    large = two_crawls[1]
    per_page = [c["written"] / c["documents"] for c in two_crawls]
    assert per_page[1] <= 1.15 * per_page[0], (per_page, two_crawls)
    assert large["written"] < 4 * large["store_bytes"], large


def test_a_crawl_s_memory_does_not_grow_with_its_pages(two_crawls: list[dict]) -> None:
    """The peak resident set over a crawl of 4N pages is within 1.06x of the peak over the
    crawl of N before it (in the same process: imports and buffers are warm), with the
    crawl's bounded buffers full and packs of 256 KiB (sealed every ~25 pages). Measured
    1.022-1.024x in five runs and 1.030x in a sixth on a loaded machine; 1.034-1.037x with
    the whole digest index in memory, too close to tell apart here (test_packdigests.py
    bounds what the index keeps per payload: 6.7 bytes against 62). With the readers'
    caches, the document records and the open pack left at their defaults (not full at N)
    it measured 1.08x; before the row-id caches had a bound below 500,000 entries, 1.19x."""
    small, large = two_crawls
    assert large["peak_rss"] <= 1.06 * small["peak_rss"], two_crawls


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_migration_015_keeps_the_sitemap_lookup_indexed(
        backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request) -> None:
    """A store crawled at schema 14 (an index on every edge's target) opens at 15: that
    index is gone, a partial one over sitemap edges serves the sitemap hint (the query
    plan says so), the edges are unchanged, it verifies, and a crawl goes on in it."""
    from evidence._store import pgschema as _pg
    from evidence._store import sqlite as _sqlite

    if backend == "sqlite":
        location = str(tmp_path / "store")
        options: dict = {}
    else:
        location = new_pg_database(request.getfixturevalue("pg_cluster"))
        options = {"artifacts": str(tmp_path / "payloads")}
    real = _sqlite.load_migrations
    with TestSite(SiteConfig(pages=6)) as site:
        monkeypatch.setattr(_sqlite, "load_migrations", lambda d=None: real(d)[:14])
        monkeypatch.setattr(_pg, "load_migrations", lambda d=None: real(d)[:14])
        with Store.create(location, **options) as store:
            assert index_names(store) >= {"discovery_edge_by_target"}
            anyio.run(Crawler(store, CrawlConfig(seeds=[site.url], sitemap=True),
                                   CrawlOptions()).run)
            edges = store.connection.execute(
                "SELECT * FROM discovery_edge ORDER BY edge_id").fetchall()
        monkeypatch.undo()
        with Store.open(location, **options) as store:
            assert store.connection.execute(
                "SELECT max(version) FROM schema_migration").fetchall() == [(15,)]
            names = index_names(store)
            assert "discovery_edge_by_target" not in names
            assert "discovery_edge_sitemap_by_target" in names
            assert store.connection.execute(
                "SELECT * FROM discovery_edge ORDER BY edge_id").fetchall() == edges
            (session_id,), = store.connection.execute(
                "SELECT session_id FROM crawl_session").fetchall()
            listed = site.url_for("/p/1")
            assert sitemap_hint(store.connection, session_id, listed) is not None
            if backend == "sqlite":
                plan = " ".join(str(row) for row in store.connection.execute(
                    "EXPLAIN QUERY PLAN SELECT rel FROM discovery_edge WHERE edge_kind = "
                    "'sitemap' AND target_url_id = 3"))
                assert "discovery_edge_sitemap_by_target" in plan, plan
            assert verify(store, full=True).ok
            anyio.run(Crawler(store, CrawlConfig(seeds=[site.url], sitemap=True),
                                   CrawlOptions()).run)
            assert verify(store, full=True).ok


def index_names(store: Store) -> set[str]:
    if store.backend.dialect.name == "sqlite":
        query = "SELECT name FROM sqlite_schema WHERE type = 'index'"
    else:
        query = "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
    return {name for (name,) in store.connection.execute(query).fetchall()}
