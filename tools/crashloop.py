"""SIGKILL the crawler at random moments, many times, then check what the store says.

    python tools/crashloop.py --kills 200 --pages 2000
    python tools/crashloop.py --quick            # 10 kills on a small site, ~20 s
    python tools/crashloop.py --processes 2 --worker-kills 50   # kill worker processes too

A real ``evidence crawl`` process crawls a site served on 127.0.0.1 (evidence._demo.site);
each round waits until the crawler is fetching, sleeps a random time, and kills it with
SIGKILL; the next round resumes the same session. After ``--kills`` kills a last round runs
to completion. Then the invariants of issue 3 are checked against the server's own request
log: every reachable page is done exactly once in the evidence, every done page's links
are in the store, pages requested twice never exceed the pages on their way per kill
(2 x ``--workers``, 4 x with worker processes), robots-disallowed paths are never
requested, every killed run is recorded as such, and ``verify`` is clean.
With ``--processes N`` the crawl runs N worker processes, and ``--worker-kills K`` also
SIGKILLs a random worker process K times (read from the crawl's live-stats.json) while the
crawl goes on: each death must cost only that worker's in-flight pages.
Exit status 0 when every invariant holds. The suite runs bounded versions of this
(tests/test_crawl.py::test_sigkill_at_random_moments_then_resume_records_each_page_once,
tests/test_processes.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from evidence import Store, verify
from evidence._crawl.scheduler import PAGES_PER_FETCH, PAGES_PER_FETCH_IN_WORKERS
from evidence._demo.site import SiteConfig, TestSite


def _path(url: str) -> str:
    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


def _session_completed(store: Path) -> bool:
    """Whether the store's last crawl session is completed (read-only)."""
    with Store.open(store, read_only=True) as s:
        row = s.connection.execute("SELECT outcome FROM crawl_session "
                                   "ORDER BY started_at DESC LIMIT 1").fetchone()
    return row is not None and row[0] == "completed"


def _crawl(url: str, store: Path, args: argparse.Namespace, log: Path) -> subprocess.Popen:
    with log.open("a") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "evidence", "crawl", url, "--store", str(store),
             "--workers", str(args.workers), "--max-attempts", str(args.max_attempts),
             "--processes", str(args.processes)],
            stdout=subprocess.DEVNULL, stderr=err)


def _kill_a_worker(store: Path, proc: subprocess.Popen, rng: random.Random,
                   killed: set[int]) -> bool:
    """SIGKILL one live worker process of the running crawl; False if none is known yet."""
    try:
        pids = json.loads((store / "live-stats.json").read_text()).get("worker_pids", [])
    except (OSError, ValueError):
        return False
    pids = [p for p in pids if p not in killed]
    if not pids or proc.poll() is not None:
        return False
    pid = rng.choice(pids)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    killed.add(pid)
    return True


def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="crashloop-"))
    store, log = work / "store", work / "crawl.log"
    slow = {f"/p/{i}": 0.01 for i in range(0, args.pages, 5)}
    kills = 0
    worker_kills: set[int] = set()
    started = time.monotonic()
    with TestSite(SiteConfig(pages=args.pages, slow=slow)) as site:
        while True:
            seen = len(site.requests)
            proc = _crawl(site.url, store, args, log)
            while len(site.requests) == seen and proc.poll() is None:
                time.sleep(0.005)
            # Spread the worker kills over the rounds, ahead of each round's crawl kill.
            target = min(args.worker_kills,
                         len(worker_kills) + math.ceil(args.worker_kills / (args.kills + 1)))
            while len(worker_kills) < target and proc.poll() is None:
                time.sleep(rng.uniform(0.01, args.max_wait))
                _kill_a_worker(store, proc, rng, worker_kills)
            if kills < args.kills:
                time.sleep(rng.uniform(0.01, args.max_wait))
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    kills += 1
                    if sys.stderr.isatty():
                        print(f"\r{kills}/{args.kills} kills", end="", file=sys.stderr)
                    if not _session_completed(store):
                        continue
                    # The kill landed after the run completed the session (while the
                    # process exited): another round would start a new session.
                    break
            if proc.wait(timeout=600) != 0:
                raise SystemExit(f"the final crawl failed; see {log}")
            break
        counts = site.request_counts()
        reachable, disallowed = site.reachable_pages(), site.disallowed_paths()
        links = {p: set(site.links(p)) for p in reachable}
    if sys.stderr.isatty():
        print(file=sys.stderr)
    problems: list[str] = []
    with Store.open(store) as s:
        conn = s.connection
        done = Counter(_path(u) for (u,) in conn.execute(
            "SELECT url FROM fetch_attempt WHERE http_status = 200 "
            "AND url NOT LIKE '%/robots.txt'"))
        edges: dict[str, set[str]] = {}
        for url, key in conn.execute(
                "SELECT f.url, u.fetch_key FROM fetch_attempt f JOIN discovery_edge e "
                "ON e.source_attempt_seq = f.attempt_seq JOIN url_identity u "
                "ON u.url_id = e.target_url_id WHERE f.http_status = 200"):
            edges.setdefault(_path(url), set()).add(_path(key))
        killed_runs = conn.execute("SELECT count(*) FROM crawl_run WHERE reason LIKE "
                                   "'no end recorded%'").fetchall()[0][0]
        open_runs = conn.execute("SELECT count(*) FROM crawl_run WHERE ended_at IS NULL"
                                 ).fetchall()[0][0]
        # With a small --max-attempts, a page caught in flight (claimed) by that many kills
        # is failed like one that kills the crawler: reported, not an invariant violation
        # only if --max-attempts is below the kills.
        exhausted = {_path(u) for u, r in conn.execute(
            "SELECT url, reason FROM frontier WHERE state = 'failed'")
            if r.startswith("attempts exhausted")}
        report = verify(s)
    unexplained = sorted(reachable - set(done))
    if unexplained or set(done) - reachable:
        problems.append(f"pages done differ from reachable: missing {sorted(unexplained)[:5]}"
                        f", extra {sorted(set(done) - reachable)[:5]}")
    twice_done = [p for p, n in done.items() if n > 1]
    if twice_done:
        problems.append(f"pages done more than once: {twice_done[:5]}")
    missing_links = [p for p in done if edges.get(p, set()) != links[p]]
    if missing_links:
        problems.append(f"pages whose links are not all recorded: {missing_links[:5]}")
    twice = sum(n - 1 for p, n in counts.items() if p in reachable and n > 1)
    deaths = kills + len(worker_kills)
    # What a death can cost: the pages on their way, fetched but not committed: up to
    # PAGES_PER_FETCH per fetch slot in one process, PAGES_PER_FETCH_IN_WORKERS with
    # worker processes.
    per_death = args.workers * (PAGES_PER_FETCH_IN_WORKERS if args.processes
                                else PAGES_PER_FETCH)
    if twice > per_death * deaths:
        problems.append(f"{twice} re-requests exceed {per_death} pages on their way x "
                        f"{deaths} kills")
    if any(counts[p] for p in disallowed):
        problems.append("a robots-disallowed path was requested")
    # A kill can land before the new process recorded its run (the server may still be
    # logging the previous process's last request): then there is no run to record.
    if open_runs or killed_runs > kills or (kills and not killed_runs):
        problems.append(f"{open_runs} runs left open; {killed_runs} recorded as killed, "
                        f"{kills} kills made")
    if not report.ok:
        problems.append(f"verify found {len(report.findings)} problems")
    if len(worker_kills) < args.worker_kills:
        problems.append(f"only {len(worker_kills)} of {args.worker_kills} worker kills landed "
                        "before the crawl completed (a larger site, or a shorter --max-wait)")
    return {"kills": kills, "worker_kills": len(worker_kills), "killed_runs": killed_runs,
            "pages": len(reachable),
            "failed_after_kills": sorted(exhausted), "requests": sum(counts.values()),
            "re_requests": twice, "seconds": round(time.monotonic() - started, 1),
            "verify_ok": report.ok, "problems": problems, "work_dir": str(work)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Only 127.0.0.1 is contacted.")
    parser.add_argument("--kills", type=int, default=100, help="SIGKILLs (default 100)")
    parser.add_argument("--pages", type=int, default=1000, help="site pages (default 1000)")
    parser.add_argument("--workers", type=int, default=4, help="crawler workers (default 4)")
    parser.add_argument("--max-wait", type=float, default=0.4,
                        help="longest random wait before a kill, seconds (default 0.4)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument("--max-attempts", type=int, default=1000,
                        help="the crawl's --max-attempts (default 1000: with 3, a page "
                        "claimed at three random kills is failed like a page that kills "
                        "the crawler, and 'every page done once' cannot hold)")
    parser.add_argument("--processes", type=int, default=0, metavar="N",
                        help="the crawl's --processes (worker processes; default 0)")
    parser.add_argument("--worker-kills", type=int, default=0, metavar="K",
                        help="also SIGKILL a random worker process K times (needs "
                        "--processes), spread over the rounds")
    parser.add_argument("--quick", action="store_true", help="10 kills, 120 pages")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    if args.quick:
        args.kills, args.pages = 10, 120
    if args.worker_kills and not args.processes:
        parser.error("--worker-kills needs --processes N")
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['kills']} kills and {result['worker_kills']} worker kills, "
              f"{result['pages']} pages, {result['requests']} "
              f"requests ({result['re_requests']} re-requests) in {result['seconds']} s; "
              f"verify {'ok' if result['verify_ok'] else 'FAILED'}")
        for problem in result["problems"]:
            print(f"PROBLEM: {problem}")
        print("all invariants hold" if not result["problems"] else "INVARIANTS VIOLATED")
    return 0 if not result["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
