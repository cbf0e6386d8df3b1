#!/usr/bin/env python3
"""Measure a crawl frontier of millions of URLs on SQLite and on PostgreSQL (issue 35, 7).

What a crawl at internet scale leans on, measured on the real path:

  fill     the frontier filled through ``evidence.Writer`` as a crawl fills it: each page's
           ``FrontierUpdate`` queues ``--links`` newly found URLs (depth 1, via link), many
           pages' updates in flight at once (``--producers``), group-committed by the writer
           (its default limits: up to 500 messages a batch). Rows, url_identity entries and
           ledger entries are what a crawl writes; no attempt is recorded (no network).
  claim    at each size of ``--sizes`` (URLs queued), the scheduler's refill query
           (``_crawl.frontier.queued_after``: the next 1,000 queued URLs after a cursor,
           joined to their fetch keys) at ``--claims`` random cursors, on a fresh read
           connection: median and p99 milliseconds; and the claim's commit (a
           ``FrontierUpdate`` claiming 8 of them, queued -> in_flight, through the writer,
           acked after its synced commit) ``--claims`` / 10 times.
  resume   what a resumed run reads before its first claim, on a new read connection: the
           last session and its open runs (``last_session``), the URLs left in flight
           (``in_flight``), the hosts' state (``host_states``) and the first refill
           (``queued_after`` from the start), as ``_crawl.session.open_session`` and the
           scheduler do.
  size     the database on disk: SQLite's file and its WAL; PostgreSQL's
           ``pg_database_size`` (tables, indexes and TOAST, not the server's WAL).
  rss      this process's resident memory (VmRSS) at each size, and its peak (VmHWM): the
           client's; a PostgreSQL server's own memory is not counted.
  ceiling  the writer's ceiling in pages/s per backend: a page's group of three messages
           (its ``FetchAttempt``; its ``Discovery`` with 10 links; its ``FrontierUpdate``
           queueing the 10 links and settling the page done), ``Writer.submit_group`` as the
           crawler submits it, 32 pages in flight, nothing but the writer (no network, no
           parsing), into a fresh store whose frontier holds the pages' URLs; ``--repeat``
           repetitions, the backends interleaved (A B A B ...), median and min-max.

The backends are interleaved at every step: fill SQLite to the next size and measure it,
then PostgreSQL, then the next size. Each figure carries the load average (1 minute) when it
was taken: the machine may be shared. PostgreSQL is a throwaway cluster
(``evidence.testing.pgcluster``: fsync=on, synchronous_commit=on, a Unix socket), started
and stopped by this script.

Examples:
  python tools/bench_frontier.py --sizes 100000,1000000          # a few minutes
  python tools/bench_frontier.py --sizes 1000000,5000000,10000000 --json > frontier.json
  python tools/bench_frontier.py --backends sqlite --sizes 100000 --repeat 1   # smoke
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio
import blake3
import msgspec

from evidence import Store, Writer, WriterLimits, new_id
from evidence._crawl import frontier
from evidence._model.messages import (
    ArtifactRef,
    Discovery,
    FetchAttempt,
    FrontierUpdate,
    Message,
    ObservedRef,
    QueuedUrl,
    RunStarted,
    SessionStarted,
    SettledUrl,
    utc_now,
)
from evidence.testing.pgcluster import PgCluster

BACKENDS = ("sqlite", "postgresql")
HOSTS = 1000  # distinct hosts the URLs spread over
CLAIM_ROWS = 1000  # rows per refill query: the scheduler's _READ
CLAIM_BATCH = 8  # URLs per claim commit: one per fetch slot of --workers 8
NAMESPACE = "bench"


# --- progress on the terminal -----------------------------------------------------------

class Progress:
    """One line on stderr, redrawn at most 4 times a second; silent when not a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._last = 0.0

    def update(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.enabled and (force or now - self._last >= 0.25):
            self._last = now
            sys.stderr.write(f"\r\x1b[K  {text}")
            sys.stderr.flush()

    def note(self, text: str) -> None:
        """A finished measure: always written (a long run killed keeps what it measured)."""
        sys.stderr.write(f"\r\x1b[K{text}\n" if self.enabled else f"{text}\n")
        sys.stderr.flush()


# --- figures ----------------------------------------------------------------------------

def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def load() -> float:
    return round(os.getloadavg()[0], 2)


def rss_mb() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process, MB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return round(fields["VmRSS"], 1), round(fields["VmHWM"], 1)


@dataclass
class Point:
    """The measures of one backend at one frontier size."""

    backend: str
    queued: int
    fill_seconds: float  # filling from the previous size to this one
    fill_urls_per_s: float
    refill_ms_median: float
    refill_ms_p99: float
    claim_commit_ms_median: float
    claim_commit_ms_p99: float
    resume_ms: float
    db_bytes: int
    rss_mb: float
    peak_rss_mb: float
    load: float


@dataclass
class Ceiling:
    backend: str
    pages_per_s: list[float] = field(default_factory=list)
    bytes_per_page: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)


# --- the workload -----------------------------------------------------------------------

def url(n: int) -> str:
    return f"http://h{n % HOSTS}.bench.test/articles/{n:09d}/index.html"


class Crawl:
    """One session and run of a store, and the messages a crawl of it sends."""

    def __init__(self) -> None:
        self.session_id = new_id("session-")
        self.run_id = new_id("run-")

    def opening(self) -> list[Message]:
        now = utc_now()
        return [SessionStarted(message_id=new_id("m-"), session_id=self.session_id,
                               started_at=now, config={"bench": "frontier"}),
                RunStarted(message_id=new_id("m-"), run_id=self.run_id,
                           session_id=self.session_id, started_at=now,
                           program="bench_frontier", host=platform.node(), pid=os.getpid())]

    def update(self, **changes: list) -> FrontierUpdate:
        return FrontierUpdate(message_id=new_id("m-"), session_id=self.session_id,
                              run_id=self.run_id, at=utc_now(), **changes)

    def queue(self, first: int, count: int) -> FrontierUpdate:
        return self.update(queued=[QueuedUrl(url=url(n), depth=1)
                                   for n in range(first, first + count)])


async def pump(writer: Writer, groups: Callable[[int], list[Message]], count: int,
               producers: int, tick: Callable[[int], None]) -> None:
    """Submit ``groups(i)`` for i < count, ``producers`` at a time; every ack committed."""
    next_i = 0
    done = 0

    async def producer() -> None:
        nonlocal next_i, done
        while next_i < count:
            i = next_i
            next_i += 1
            acks = await writer.submit_group(groups(i))
            bad = [a for a in acks if a.status != "committed"]
            if bad:
                raise SystemExit(f"the writer refused a message: {bad[0].reason}")
            done += 1
            tick(done)

    async with anyio.create_task_group() as tg:
        for _ in range(min(producers, count)):
            tg.start_soon(producer)


def settled_size(store: Store, backend: str, size_of: Callable[[], int]) -> int:
    """The database's size with no writer running: SQLite's WAL checkpointed and truncated
    first, so the figure is the database's, not a WAL's high-water mark."""
    if backend == "sqlite":
        store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return size_of()


# --- one backend's store ----------------------------------------------------------------

class Bench:
    """One store being filled, and its measures."""

    def __init__(self, backend: str, location: str, artifacts: Path,
                 size_of: Callable[[], int], progress: Progress) -> None:
        self.backend = backend
        self.store = (Store.create(location) if backend == "sqlite"
                      else Store.create(location, artifacts=str(artifacts)))
        self.size_of = size_of
        self.progress = progress
        self.crawl = Crawl()
        self.queued = 0
        self._run(lambda w: self._submit_all(w, self.crawl.opening()))

    def _run(self, body: Callable[[Writer], object]) -> None:
        async def main() -> None:
            async with Writer(self.store, limits=WriterLimits()) as writer:
                await body(writer)  # type: ignore[misc]
        anyio.run(main)

    async def _submit_all(self, writer: Writer, messages: list[Message]) -> None:
        for message in messages:
            ack = await writer.submit(message)
            if ack.status != "committed":
                raise SystemExit(f"the writer refused {message.message_id}: {ack.reason}")

    def fill(self, target: int, links: int, producers: int) -> float:
        """Queue URLs up to ``target``; seconds taken."""
        first, missing = self.queued, target - self.queued
        count = -(-missing // links)
        started = time.perf_counter()

        def group(i: int) -> list[Message]:
            start = first + i * links
            return [self.crawl.queue(start, min(links, target - start))]

        def tick(done: int) -> None:
            rate = done * links / (time.perf_counter() - started)
            self.progress.update(f"{self.backend}: fill {first + done * links:,}/{target:,} "
                                 f"URLs queued ({rate:,.0f}/s)")

        self._run(lambda w: pump(w, group, count, producers, tick))
        self.queued = target
        return time.perf_counter() - started

    def refill_latencies(self, samples: int, rng: random.Random) -> list[float]:
        """The scheduler's refill query at random cursors, on one read connection."""
        out = []
        with self.store.reader() as reader:
            ids = reader.execute("SELECT min(frontier_id), max(frontier_id) FROM frontier "
                                 "WHERE session_id = ?", (self.crawl.session_id,)).fetchall()
            low, high = ids[0]
            for _ in range(samples):
                cursor = rng.randint(low, high)
                started = time.perf_counter()
                rows = frontier.queued_after(reader, self.crawl.session_id, cursor,
                                             CLAIM_ROWS)
                out.append((time.perf_counter() - started) * 1000)
                if not rows and cursor < high - CLAIM_BATCH:
                    raise SystemExit(f"{self.backend}: no queued URL after {cursor}")
        return out

    def claim_latencies(self, samples: int, rng: random.Random) -> list[float]:
        """Claim commits of 8 queued URLs each, through the writer (acked when synced)."""
        out: list[float] = []
        with self.store.reader() as reader:
            picks = []
            for _ in range(samples):
                cursor = rng.randint(0, max(0, self.queued - 1))
                rows = frontier.queued_after(reader, self.crawl.session_id, cursor,
                                             CLAIM_BATCH)
                picks.append([r.url for r in rows])
        seen: set[str] = set()

        async def claim(writer: Writer) -> None:
            for urls in picks:
                fresh = [u for u in urls if u not in seen]
                seen.update(fresh)
                if not fresh:
                    continue
                started = time.perf_counter()
                ack = await writer.submit(self.crawl.update(claimed=fresh))
                out.append((time.perf_counter() - started) * 1000)
                if ack.status != "committed":
                    raise SystemExit(f"{self.backend}: a claim was refused: {ack.reason}")

        self._run(claim)
        return out

    def resume_ms(self) -> float:
        """What a resumed run reads before its first claim, on a new read connection."""
        started = time.perf_counter()
        with self.store.reader() as reader:
            last = frontier.last_session(reader)
            if last is None or last.session_id != self.crawl.session_id:
                raise SystemExit(f"{self.backend}: the session is not the last one")
            frontier.in_flight(reader, last.session_id)
            frontier.host_states(reader)
            rows = frontier.queued_after(reader, last.session_id, 0, CLAIM_ROWS)
        seconds = time.perf_counter() - started
        if not rows:
            raise SystemExit(f"{self.backend}: nothing queued at resume")
        return seconds * 1000

    def measure(self, claims: int, fill_seconds: float, filled: int,
                rng: random.Random) -> Point:
        refill = self.refill_latencies(claims, rng)
        commits = self.claim_latencies(max(5, claims // 10), rng)
        resume = statistics.median(self.resume_ms() for _ in range(3))
        rss, peak = rss_mb()
        return Point(self.backend, self.queued, round(fill_seconds, 2),
                     round(filled / fill_seconds) if fill_seconds else 0.0,
                     round(statistics.median(refill), 3), round(quantile(refill, 0.99), 3),
                     round(statistics.median(commits), 2), round(quantile(commits, 0.99), 2),
                     round(resume, 2), settled_size(self.store, self.backend, self.size_of),
                     rss, peak, load())

    def close(self) -> None:
        self.store.close()


# --- the writer's ceiling ---------------------------------------------------------------

def ceiling_run(backend: str, location: str, artifacts: Path, pages: int,
                progress: Progress, size_of: Callable[[], int]) -> tuple[float, float]:
    """Pages/s of a page's three messages through the writer alone, on a fresh store; and
    the database bytes a page adds (its rows, indexes and ledger entries)."""
    store = (Store.create(location) if backend == "sqlite"
             else Store.create(location, artifacts=str(artifacts)))
    try:
        body = b"<!doctype html><title>page</title>" + b"<p>lorem ipsum dolor</p>" * 150
        ref = store.artifacts.put(NAMESPACE, body)
        if ref != ArtifactRef(NAMESPACE, blake3.blake3(body).hexdigest(), len(body)):
            raise SystemExit("artifact ref mismatch")
        crawl = Crawl()
        fanout = 10

        def page(i: int) -> list[Message]:
            attempt_id = new_id("att-")
            links = [url(pages + i * fanout + j) for j in range(fanout)]
            return [
                FetchAttempt(message_id=new_id("m-"), attempt_id=attempt_id,
                             run_id=crawl.run_id, url=url(i), sequence=0,
                             started_at=utc_now(), elapsed_ms=80.0, outcome="response",
                             http_status=200, body=ref, content_type="text/html"),
                Discovery(message_id=new_id("m-"), run_id=crawl.run_id,
                          source_attempt_id=attempt_id, source_artifact=ref,
                          refs=[ObservedRef(observed=u, url=u, position=j)
                                for j, u in enumerate(links)]),
                crawl.update(queued=[QueuedUrl(url=u, depth=1, source_attempt_id=attempt_id)
                                     for u in links],
                             settled=[SettledUrl(url=url(i), state="done")]),
            ]

        seconds = 0.0

        async def prepare() -> None:
            async with Writer(store, limits=WriterLimits()) as writer:
                for message in crawl.opening():
                    await writer.submit(message)
                await pump(writer, lambda i: [crawl.queue(i * 100, 100)], -(-pages // 100),
                           16, lambda done: None)

        async def crawl_pages() -> None:
            nonlocal seconds
            async with Writer(store, limits=WriterLimits()) as writer:
                started = time.perf_counter()
                await pump(writer, page, pages, 32, lambda done: progress.update(
                    f"{backend}: ceiling {done:,}/{pages:,} pages"))
                seconds = time.perf_counter() - started

        anyio.run(prepare)
        before = settled_size(store, backend, size_of)
        anyio.run(crawl_pages)
        return pages / seconds, (settled_size(store, backend, size_of) - before) / pages
    finally:
        store.close()


# --- the run ----------------------------------------------------------------------------

def sqlite_size(path: Path) -> Callable[[], int]:
    """The store's database files (the database, its WAL and shared memory), not payloads."""
    def size() -> int:
        return sum(p.stat().st_size for p in path.glob("evidence.db*") if p.is_file())
    return size


def pg_size(cluster: PgCluster, database: str) -> Callable[[], int]:
    """The database's size on disk (tables, indexes, TOAST; not the server's WAL)."""
    def size() -> int:
        return int(cluster.sql(f"SELECT pg_database_size('{database}')").strip())
    return size


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(s.replace("_", "")) for s in text.split(",") if s.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of whole numbers: {text!r}") from None
    if not sizes or sizes[0] < CLAIM_ROWS or sizes[-1] > 50_000_000:
        raise argparse.ArgumentTypeError(
            f"sizes must lie between {CLAIM_ROWS:,} and 50,000,000: {text!r}")
    return sizes


def parse_backends(text: str) -> list[str]:
    chosen = [b.strip() for b in text.split(",") if b.strip()]
    bad = [b for b in chosen if b not in BACKENDS]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(f"backends are {', '.join(BACKENDS)}: {text!r}")
    return chosen


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_frontier.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Prints a table (or JSON with --json); progress goes to stderr on a terminal.")
    parser.add_argument("--sizes", type=parse_sizes, default=parse_sizes("100000,1000000"),
                        help="frontier sizes (URLs queued) at which to measure, comma "
                        "separated (default 100000,1000000)")
    parser.add_argument("--backends", type=parse_backends, default=list(BACKENDS),
                        help="comma separated, of sqlite,postgresql (default both)")
    parser.add_argument("--links", type=int, default=50,
                        help="URLs queued per FrontierUpdate: a page's new links "
                        "(default %(default)s)")
    parser.add_argument("--producers", type=int, default=64,
                        help="pages' updates in flight while filling (default %(default)s)")
    parser.add_argument("--claims", type=int, default=200,
                        help="refill queries per size (claim commits: a tenth; default "
                        "%(default)s)")
    parser.add_argument("--pages", type=int, default=3000,
                        help="pages per writer-ceiling run (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="writer-ceiling runs per backend, interleaved (default "
                        "%(default)s; 0: none)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the stores go (default a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the stores")
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    parser.add_argument("--seed", type=int, default=35, help="random seed of the cursors")
    args = parser.parse_args(argv)
    for name in ("links", "producers", "claims", "pages"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.repeat < 0:
        parser.error("--repeat must be 0 or more")
    return args


def cluster_if(needed: bool, stack: ExitStack) -> PgCluster | None:
    return stack.enter_context(PgCluster.start()) if needed else None


def table(points: list[Point], ceilings: list[Ceiling]) -> Iterator[str]:
    yield (f"{'backend':<11}{'queued':>11}{'fill URL/s':>11}{'refill ms':>11}{'p99':>8}"
           f"{'claim ms':>10}{'p99':>8}{'resume ms':>11}{'db MB':>9}{'RSS MB':>8}"
           f"{'load':>6}")
    for p in points:
        yield (f"{p.backend:<11}{p.queued:>11,}{p.fill_urls_per_s:>11,.0f}"
               f"{p.refill_ms_median:>11.2f}{p.refill_ms_p99:>8.2f}"
               f"{p.claim_commit_ms_median:>10.2f}{p.claim_commit_ms_p99:>8.2f}"
               f"{p.resume_ms:>11.2f}{p.db_bytes / 1e6:>9,.0f}{p.rss_mb:>8.0f}{p.load:>6.2f}")
    for c in ceilings:
        if c.pages_per_s:
            yield (f"writer ceiling {c.backend}: {statistics.median(c.pages_per_s):,.0f} "
                   f"pages/s (min {min(c.pages_per_s):,.0f}, max {max(c.pages_per_s):,.0f}, "
                   f"{len(c.pages_per_s)} runs; load {min(c.loads)}-{max(c.loads)}); "
                   f"{statistics.median(c.bytes_per_page):,.0f} database bytes a page")


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    progress = Progress(sys.stderr.isatty())
    rng = random.Random(args.seed)
    if args.workdir is not None:
        args.workdir = args.workdir.resolve()
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-frontier-", dir=args.workdir))
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    points: list[Point] = []
    ceilings = [Ceiling(b) for b in args.backends]
    try:
        with ExitStack() as stack:
            cluster = cluster_if("postgresql" in args.backends, stack)
            benches: dict[str, Bench] = {}
            for backend in args.backends:
                if backend == "sqlite":
                    path = work / "frontier.sqlite"
                    benches[backend] = Bench(backend, str(path), work / "artifacts-sqlite",
                                             sqlite_size(path), progress)
                else:
                    assert cluster is not None
                    location = cluster.create_database("frontier")
                    benches[backend] = Bench(backend, location, work / "artifacts-pg",
                                             pg_size(cluster, "frontier"), progress)
            # The ceilings first, interleaved, while the machine is as it was at the start.
            for n in range(args.repeat):
                for c in ceilings:
                    before = load()
                    size_of: Callable[[], int]
                    if c.backend == "sqlite":
                        location = str(work / f"ceiling-{n}.sqlite")
                        size_of = sqlite_size(Path(location))
                    else:
                        assert cluster is not None
                        location = cluster.create_database(f"ceiling{n}")
                        size_of = pg_size(cluster, f"ceiling{n}")
                    rate, per_page = ceiling_run(c.backend, location, work / f"artifacts-c{n}",
                                                 args.pages, progress, size_of)
                    c.pages_per_s.append(round(rate, 1))
                    c.bytes_per_page.append(round(per_page))
                    c.loads.append(max(before, load()))
                    progress.note(f"writer ceiling {c.backend} run {n + 1}: {rate:,.0f} pages/s")
                    if c.backend == "sqlite":
                        shutil.rmtree(location)
                    else:
                        assert cluster is not None
                        cluster.sql(f'DROP DATABASE "ceiling{n}"')
            for size in args.sizes:
                for backend, bench in benches.items():
                    filled = size - bench.queued
                    seconds = bench.fill(size, args.links, args.producers)
                    point = bench.measure(args.claims, seconds, filled, rng)
                    points.append(point)
                    progress.note(
                        f"{backend} at {size:,}: fill {point.fill_urls_per_s:,.0f} URL/s, "
                        f"refill {point.refill_ms_median} ms (p99 {point.refill_ms_p99}), "
                        f"claim {point.claim_commit_ms_median} ms, resume "
                        f"{point.resume_ms} ms, {point.db_bytes / 1e6:,.0f} MB, "
                        f"RSS {point.rss_mb} MB, load {point.load}")
            for bench in benches.values():
                bench.close()
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report = {
        "command": "python tools/bench_frontier.py " + " ".join(
            shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
        "measured_at": started_at, "cpus": os.cpu_count(), "platform": platform.platform(),
        "python": platform.python_version(), "links_per_update": args.links,
        "producers": args.producers,
        "points": [asdict(p) for p in points],
        "ceilings": [{"backend": c.backend, "pages_per_s": c.pages_per_s,
                      "bytes_per_page": c.bytes_per_page,
                      "median": statistics.median(c.pages_per_s) if c.pages_per_s else None,
                      "loads": c.loads} for c in ceilings],
    }
    if args.json:
        sys.stdout.write(msgspec.json.encode(report).decode() + "\n")
    else:
        print(f"# {report['command']}\n# {started_at}, {report['cpus']} cpus, "
              f"{report['platform']}")
        for line in table(points, ceilings):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
