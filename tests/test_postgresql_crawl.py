"""The crawl on a PostgreSQL store (issue 16, part 1): `evidence crawl URL --store
postgresql://... --artifacts DIR` end to end, and resumed after SIGKILL (the frontier is in
the store): each page recorded once, its links with it, the log intact."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evidence import Store, verify
from evidence._demo.site import SiteConfig, TestSite

from .test_crawl import assert_links_recorded, done_pages


def _crawl(url: str, store: str, log: Path, *extra: str) -> subprocess.Popen[str]:
    with open(log, "a") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "evidence", "crawl", url, "--store", store, "--workers",
             "4", *extra], stdout=subprocess.PIPE, stderr=stderr, text=True)


@pytest.mark.slow
def test_a_crawl_into_postgresql_resumes_after_sigkill_each_page_once(
        tmp_path: Path, pg_url: str) -> None:
    rng = random.Random(20261203)
    slow = {f"/p/{i}": 0.05 for i in range(60)}
    log = tmp_path / "crawl.log"
    with TestSite(SiteConfig(pages=60, slow=slow)) as site:
        kills, first = 0, True
        while True:
            seen = len(site.requests)
            extra = ["--artifacts", str(tmp_path / "art")] if first else []
            proc = _crawl(site.url, pg_url, log, "--max-attempts", "100", *extra)
            first = False
            while len(site.requests) == seen and proc.poll() is None:
                time.sleep(0.005)  # kill only once this run is fetching
            if kills < 4:
                time.sleep(rng.uniform(0.02, 0.15))
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.communicate()
                    kills += 1
                    continue
            proc.communicate(timeout=120)
            assert proc.returncode == 0, log.read_text()
            break
        counts = site.request_counts()
        reachable = site.reachable_pages()
    assert kills == 4
    done = done_pages(pg_url)  # type: ignore[arg-type]
    assert set(done) == reachable
    assert all(n == 1 for n in done.values()), "each page is done exactly once"
    assert_links_recorded(pg_url, site)  # type: ignore[arg-type]
    twice = sum(n - 1 for p, n in counts.items() if p in reachable and n > 1)
    assert twice <= 2 * 4 * kills  # pages fetched, not committed: two per fetch slot
    with Store.open(pg_url) as store:
        with store.snapshot() as conn:
            sessions = conn.execute("SELECT count(*), min(outcome) FROM crawl_session"
                                    ).fetchall()[0]
            open_runs = conn.execute("SELECT count(*) FROM crawl_run WHERE ended_at IS NULL"
                                     ).fetchall()[0][0]
        assert sessions == (1, "completed") and open_runs == 0
        report = verify(store)  # the log recomputed, every row against the ledger
        assert report.ok and report.checks["log_entries"] > 60
    assert {"LAYOUT", "PACKS"} <= {p.name for p in (tmp_path / "art").iterdir()}  # packs


@pytest.mark.parametrize("processes", ["0", "2"])
def test_crawl_status_and_stop_name_a_postgresql_store(
        tmp_path: Path, pg_url: str, processes: str) -> None:
    with TestSite(SiteConfig(pages=10)) as site:
        result = subprocess.run(
            [sys.executable, "-m", "evidence", "crawl", site.url, "--store", pg_url,
             "--artifacts", str(tmp_path / "art"), "--processes", processes, "--json"],
            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    status = subprocess.run([sys.executable, "-m", "evidence", "status", pg_url],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "completed" in status.stdout, status.stderr
    stop = subprocess.run([sys.executable, "-m", "evidence", "stop", pg_url],
                          capture_output=True, text=True, timeout=60)
    assert (stop.returncode, stop.stdout.strip()) == (1, f"no crawl is running on {pg_url}")
