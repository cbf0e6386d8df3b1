#!/usr/bin/env python3
"""Benchmark the durable writer (issue 2) against a raw-SQL ceiling and a naive pattern.

A *page* is the realistic unit of work, two messages:

  * one ``FetchAttempt``: 1 ``fetch_attempt`` row, 1 ``artifact`` row for a body already in
    the artifact store (``--artifacts`` distinct small bodies are stored before timing and
    reused round-robin, so after the first pass it is a lookup), 1 ``url_identity``
    (a lookup: the page's URL was discovered earlier), 1 ``url_current`` upsert and
    1 ``ingest_ledger`` row;
  * one ``Discovery`` with 10 references: 10 ``discovery_edge`` rows, ~5 new
    ``url_identity`` rows (5 links to pages not seen before, 5 back-links to pages already
    known) and 1 ``ingest_ledger`` row.

Every batch also writes its ``commit_log`` row. Ids are time ordered (``evidence.new_id``).

Three ways of writing the same rows, each into a fresh store made by ``Store.create`` (same
schema, same pragmas, same ``sync``):

  writer  ``evidence.Writer`` with ``WriterLimits(max_batch_messages=B)``, fed by a pool of
          concurrent producer tasks (each submits a page's FetchAttempt, waits for the ack,
          then submits its Discovery: a Discovery needs its attempt committed). The pool is
          ``min(max(2, 2*B), --producers-cap, pages)`` tasks, queue_size = max(pool, B), so
          batches can fill. Ack latency = from the submit() call to its return, per message.
  raw     the ceiling: the same rows through apsw ``executemany``, one statement per table
          per batch, ``BEGIN IMMEDIATE ... COMMIT`` per B messages; no validation, no
          savepoints, no lookups (ids assigned in Python), no Merkle tree (the commit_log row
          carries fixed placeholder hashes). Payload bytes, BLAKE3 payload hashes, leaf
          hashes and all row tuples are PRECOMPUTED OUTSIDE the timed region.
          "Latency" = the duration of the message's transaction.
  naive   one transaction per message (BEGIN IMMEDIATE, plain INSERTs one row at a time,
          COMMIT), rows precomputed the same way as raw (a generous naive baseline).

Both baselines insert the batch's commit_log row FIRST by default (they know it up front:
its hashes are placeholders). The writer can only insert it last (the row carries the Merkle
root of the batch), and then SQLite resolves the deferred foreign keys
ingest_ledger.batch_seq -> commit_log by scanning ingest_ledger, which has no index on
batch_seq: a cost linear in the ledger size, per batch. ``--baseline-log-order last`` makes
the baselines pay it too (the naive pattern then slows quadratically).

Batch size 1 is slow (a commit, so an fsync at sync=full, per message); it and the naive
pattern run ``--pages-small`` pages, the others ``--pages``. Throughput ratios compare
rates, so the different sizes are comparable (a smaller database slightly favours the
baseline).

``--growth`` is a separate mode: ``--growth-messages`` messages (default 1,000,000, i.e.
500,000 pages) through the writer at batch 500 and sync=full; it reports messages/s per
``--growth-window`` messages (first and last window highlighted). Messages are built by the
producers on the fly there (the matrix builds them before timing), to bound memory.

``--profile DIR`` (matrix mode) profiles each writer configuration with cProfile: the event
loop thread (submit, encoding, hashing, queueing, acks) and the commit thread (the batch
transaction) separately, and writes ``.pstats`` files plus a text summary to DIR.

Examples:
  python tools/bench_writer.py                          # default matrix, ~2-4 min
  python tools/bench_writer.py --quick                  # smoke test, < 20 s
  python tools/bench_writer.py --sync full --batches 500 --profile bench-out/prof
  python tools/bench_writer.py --growth                 # 1M messages, many minutes
"""

from __future__ import annotations

import argparse
import array
import contextlib
import cProfile
import datetime as dt
import gc
import io
import itertools
import json
import os
import platform
import pstats
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import anyio
import apsw
import blake3
import msgspec

import evidence
from evidence import (
    ArtifactRef,
    Discovery,
    FetchAttempt,
    ObservedRef,
    RunStarted,
    SessionStarted,
    Store,
    Writer,
    WriterLimits,
    canonical_encode,
    new_id,
    normalize_url,
    payload_hash,
    utc_now,
)
from evidence._model.merkle import leaf_hash
from evidence._model.messages import format_time, now_text
from evidence._write.committers import Tail

NAMESPACE = "html"
HOST = "https://www.example.org"
NEW_LINKS = 5  # per page: links to pages not seen before
BACK_LINKS = 5  # per page: links to pages already known
BAR_VS_RAW = 0.6
BAR_VS_NAIVE = 3.0
BAR_BATCH = 500
BAR_SYNC = "full"
PLACEHOLDER_HASH = bytes(32)

# --- statements shared by the raw ceiling and the naive pattern ------------------------
# Same tables, same columns, same conflict clauses as evidence/_write/apply_*.py where it matters.

SQL_URL = ("INSERT INTO url_identity (url_id, normalizer_version, fetch_key) "
           "VALUES (?, ?, ?)")
SQL_ARTIFACT = "INSERT INTO artifact (artifact_id, namespace, digest, size) VALUES (?, ?, ?, ?)"
SQL_LEDGER = ("INSERT INTO ingest_ledger (log_index, message_id, kind, payload_hash, "
              "leaf_hash, payload, batch_seq, received_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
SQL_ATTEMPT = (
    "INSERT INTO fetch_attempt (attempt_seq, attempt_id, run_id, url_id, url, sequence, "
    "method, started_at, elapsed_ms, outcome, http_status, request_headers_id, "
    "response_headers_id, body_id, body_truncated, content_type, error, log_index) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
SQL_CURRENT = (
    "INSERT INTO url_current (run_id, url_id, sequence, attempt_seq) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (run_id, url_id) DO UPDATE SET sequence = excluded.sequence, "
    "attempt_seq = excluded.attempt_seq WHERE excluded.sequence > url_current.sequence")
SQL_EDGE = (
    "INSERT INTO discovery_edge (run_id, source_attempt_seq, source_artifact_id, position, "
    "observed_ref, target_url_id, edge_kind, tag, attr, rel, log_index) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
SQL_COMMIT_LOG = (
    "INSERT INTO commit_log (batch_seq, committed_at, first_index, tree_size, root, "
    "frontier, prev_hash, entry_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")

COUNTED = ("url_identity", "artifact", "fetch_attempt", "url_current", "discovery_edge",
           "ingest_ledger", "commit_log", "quarantine")


# --- progress ---------------------------------------------------------------------------

class Progress:
    """A one-line progress display on stderr, only when stderr is a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._last = 0.0

    def update(self, label: str, done: int, total: int, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.25:
            return
        self._last = now
        sys.stderr.write(f"\r\x1b[K  {label}: {done:,}/{total:,} messages")
        sys.stderr.flush()

    def note(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(f"\r\x1b[K{text}\n")
            sys.stderr.flush()

    def clear(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


# --- the workload -----------------------------------------------------------------------

def page_path(n: int) -> str:
    return f"/articles/{n:08d}/index.html"


def page_url(n: int) -> str:
    return HOST + page_path(n)


def make_bodies(count: int) -> list[bytes]:
    """``count`` distinct small HTML bodies, 2-6 KB."""
    bodies = []
    for i in range(count):
        filler = (f"<p>paragraph {i} " + "lorem ipsum dolor sit amet " * 8 + "</p>\n")
        body = (f"<!doctype html><html><head><title>page {i}</title></head><body>\n"
                + filler * (4 + i % 12) + "</body></html>\n").encode()
        bodies.append(body)
    return bodies


class Workload:
    """Builds the messages of page ``i`` (ids are fresh and time ordered on each call)."""

    def __init__(self, bodies: Sequence[bytes]) -> None:
        self.bodies = list(bodies)
        self.refs = [ArtifactRef(NAMESPACE, blake3.blake3(b).hexdigest(), len(b))
                     for b in self.bodies]
        self.session_id = new_id("ses-")
        self.run_id = new_id("run-")
        self.started = utc_now()

    def setup_messages(self) -> list[SessionStarted | RunStarted]:
        return [
            SessionStarted(message_id=new_id("msg-"), session_id=self.session_id,
                           started_at=self.started, config={"bench": "writer"}),
            RunStarted(message_id=new_id("msg-"), run_id=self.run_id,
                       session_id=self.session_id, started_at=self.started,
                       program="bench_writer", host=platform.node(), pid=os.getpid()),
        ]

    def page(self, i: int) -> tuple[FetchAttempt, Discovery]:
        ref = self.refs[i % len(self.refs)]
        attempt_id = new_id("att-")
        fetch = FetchAttempt(
            message_id=new_id("msg-"), attempt_id=attempt_id, run_id=self.run_id,
            url=page_url(i), sequence=0, started_at=utc_now(), elapsed_ms=87.5 + i % 100,
            outcome="response", http_status=200, body=ref,
            content_type="text/html; charset=utf-8")
        refs = [ObservedRef(observed=page_path(NEW_LINKS * i + j + 1),
                            url=page_url(NEW_LINKS * i + j + 1), position=j)
                for j in range(NEW_LINKS)]
        refs += [ObservedRef(observed=page_path(max(0, i - k)), url=page_url(max(0, i - k)),
                             position=NEW_LINKS + k - 1, rel="prev" if k == 1 else "")
                 for k in range(1, BACK_LINKS + 1)]
        discovery = Discovery(message_id=new_id("msg-"), run_id=self.run_id,
                              source_attempt_id=attempt_id, source_artifact=ref, refs=refs)
        return fetch, discovery


def put_artifacts(store: Store, workload: Workload) -> float:
    """Store the bodies through the store's artifact API (durable puts); return seconds."""
    started = time.perf_counter()
    for body, expected in zip(workload.bodies, workload.refs, strict=True):
        ref = store.artifacts.put(NAMESPACE, body)
        if ref != expected:
            raise SystemExit(f"artifact ref mismatch: {ref} != {expected}")
    return time.perf_counter() - started


# --- rows for the baselines (precomputed, outside every timed region) -------------------

@dataclass
class RowSet:
    """The rows one message writes, minus batch_seq/received_at of its ledger row."""

    urls: list[tuple] = field(default_factory=list)
    artifacts: list[tuple] = field(default_factory=list)
    ledger: tuple = ()
    attempt: tuple | None = None
    current: tuple | None = None
    edges: list[tuple] = field(default_factory=list)


class RowBuilder:
    """Turns messages into rows in message order: assigns url, artifact and attempt ids."""

    def __init__(self) -> None:
        self.url_ids: dict[str, int] = {}
        self.artifact_ids: dict[str, int] = {}
        self.attempts: dict[str, int] = {}
        self.log_index = 0
        self.version = evidence.NORMALIZER_VERSION

    def _url(self, url: str, rows: RowSet) -> int:
        key = normalize_url(url)
        uid = self.url_ids.get(key)
        if uid is None:
            uid = self.url_ids[key] = len(self.url_ids) + 1
            rows.urls.append((uid, self.version, key))
        return uid

    def _artifact(self, ref: ArtifactRef, rows: RowSet) -> int:
        aid = self.artifact_ids.get(ref.digest)
        if aid is None:
            aid = self.artifact_ids[ref.digest] = len(self.artifact_ids) + 1
            rows.artifacts.append((aid, ref.namespace, ref.digest, ref.size))
        return aid

    def rows(self, m: FetchAttempt | Discovery) -> RowSet:
        rows = RowSet()
        encoded = canonical_encode(m)
        index = self.log_index
        self.log_index += 1
        rows.ledger = (index, m.message_id, type(m).__struct_config__.tag,
                       payload_hash(encoded), leaf_hash(encoded), encoded)
        if isinstance(m, FetchAttempt):
            uid = self._url(m.url, rows)
            body = self._artifact(m.body, rows) if m.body is not None else None
            seq = self.attempts[m.attempt_id] = len(self.attempts) + 1
            rows.attempt = (seq, m.attempt_id, m.run_id, uid, m.url, m.sequence, m.method,
                            format_time(m.started_at), m.elapsed_ms, m.outcome, m.http_status,
                            None, None, body, int(m.body_truncated), m.content_type, m.error,
                            index)
            rows.current = (m.run_id, uid, m.sequence, seq)
        else:
            source = self.attempts[m.source_attempt_id]
            artifact = self._artifact(m.source_artifact, rows)
            for ref in m.refs:
                rows.edges.append((m.run_id, source, artifact, ref.position, ref.observed,
                                   self._url(ref.url, rows), ref.edge_kind, ref.tag, ref.attr,
                                   ref.rel, index))
        return rows


def setup_rows(conn: apsw.Connection, workload: Workload) -> None:
    """Session and run rows for a baseline store (the writer gets them as messages)."""
    started = format_time(workload.started)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO crawl_session (session_id, started_at, mode, config) "
                 "VALUES (?, ?, 'full', '{}')", (workload.session_id, started))
    conn.execute("INSERT INTO crawl_run (run_id, session_id, started_at, program, host, "
                 "pid) VALUES (?, ?, ?, 'bench_writer', ?, ?)",
                 (workload.run_id, workload.session_id, started, platform.node(),
                  os.getpid()))
    conn.execute("COMMIT")


# --- results ----------------------------------------------------------------------------

@dataclass
class Result:
    mode: str  # writer | raw | naive
    sync: str
    batch: int
    pages: int
    messages: int
    seconds: float
    pages_per_s: float
    msgs_per_s: float
    p50_ms: float
    p99_ms: float
    mean_batch: float
    batches: int
    producers: int = 0
    setup_seconds: float = 0.0
    rows: dict[str, int] = field(default_factory=dict)
    writer_statistics: dict | None = None
    vs_raw: float | None = None
    vs_naive: float | None = None
    raw_batch: int | None = None  # the raw configuration vs_raw compares with
    all_msgs_per_s: list[float] = field(default_factory=list)  # every run, with --repeat
    loads: list[float] = field(default_factory=list)  # 1-minute load average at each run
    vs_raw_runs: list[float] = field(default_factory=list)  # per round, against its raw run

    @property
    def label(self) -> str:
        if self.mode == "naive":
            return f"naive  sync={self.sync:<6} commit/msg"
        return f"{self.mode:<6} sync={self.sync:<6} batch={self.batch}"


def quantile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_ms(latencies: Sequence[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return quantile(ordered, 0.50) * 1000, quantile(ordered, 0.99) * 1000


def count_rows(conn: apsw.Connection) -> dict[str, int]:
    return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in COUNTED}


def fresh_dir(workdir: Path, name: str) -> Path:
    path = workdir / name
    if path.exists():
        shutil.rmtree(path)
    return path


def make_result(mode: str, sync: str, batch: int, pages: int, seconds: float,
                latencies: Sequence[float], batches: int, **extra: object) -> Result:
    messages = 2 * pages
    p50, p99 = latency_ms(latencies)
    return Result(mode=mode, sync=sync, batch=batch, pages=pages, messages=messages,
                  seconds=seconds, pages_per_s=pages / seconds, msgs_per_s=messages / seconds,
                  p50_ms=p50, p99_ms=p99, mean_batch=messages / batches if batches else 0.0,
                  batches=batches, **extra)  # type: ignore[arg-type]


# --- the writer -------------------------------------------------------------------------

class ThreadProfiler:
    """cProfile for the writer's commit thread: wraps the writer's batch function."""

    def __init__(self, writer: Writer) -> None:
        self.profile = cProfile.Profile()
        self.busy = 0.0
        inner = writer._commit_batch  # benchmark instrumentation only

        def measured(run: Callable[[], object]) -> object:
            started = time.perf_counter()
            self.profile.enable()
            try:
                return run()
            finally:
                self.profile.disable()
                self.busy += time.perf_counter() - started

        def profiled(batch: list, **kw: object) -> object:
            # A batch applied on the event loop's thread leaves its fsyncs (its tail) to
            # the commit thread: profiled there too.
            result = measured(lambda: inner(batch, **kw))
            if isinstance(result, Tail):
                run = result.run
                result.run = lambda: measured(run)
            return result

        writer._commit_batch = profiled  # type: ignore[method-assign]


async def drive_writer(writer: Writer, pages: int, producers: int,
                       page_messages: Callable[[int], tuple[FetchAttempt, Discovery]],
                       latencies: array.array, progress: Progress, label: str,
                       on_ack: Callable[[int], None] | None = None,
                       deadline: float | None = None) -> tuple[float, list[str], int]:
    """Run ``producers`` tasks over pages 0..pages-1; return (seconds, problems, acked).

    With ``deadline`` (a ``time.perf_counter`` value) producers take no new page after it.
    """
    pages_iter = iter(range(pages))
    problems: list[str] = []
    acked = 0
    total = 2 * pages
    clock = time.perf_counter

    async def producer() -> None:
        nonlocal acked
        for i in pages_iter:
            if deadline is not None and clock() > deadline:
                return
            for message in page_messages(i):
                started = clock()
                ack = await writer.submit(message)
                latencies.append(clock() - started)
                if ack.status != "committed" and len(problems) < 10:
                    problems.append(f"{message.message_id}: {ack.status} {ack.reason}")
                acked += 1
                if on_ack is not None:
                    on_ack(acked)

    async def show() -> None:
        while True:
            progress.update(label, acked, total)
            await anyio.sleep(0.25)

    started = clock()
    async with anyio.create_task_group() as outer:
        if progress.enabled:
            outer.start_soon(show)
        async with anyio.create_task_group() as group:
            for _ in range(producers):
                group.start_soon(producer)
        outer.cancel_scope.cancel()
    seconds = clock() - started
    progress.update(label, acked, total, force=True)
    progress.clear()
    return seconds, problems, acked


def producers_for(batch: int, pages: int, cap: int) -> int:
    return max(1, min(max(2, 2 * batch), cap, pages))


def run_writer(workload: Workload, prebuilt: list[tuple[FetchAttempt, Discovery]],
               sync: str, batch: int, pages: int, args: argparse.Namespace,
               progress: Progress) -> Result:
    path = fresh_dir(args.workdir, f"writer-{sync}-{batch}")
    store = Store.create(path, sync=sync)
    try:
        setup = put_artifacts(store, workload)
        producers = producers_for(batch, pages, args.producers_cap)
        limits = WriterLimits(max_batch_messages=batch, queue_size=max(producers, batch))
        latencies = array.array("d")
        label = f"writer sync={sync} batch={batch}"
        profiles: dict[str, object] = {}

        async def main() -> tuple[float, list[str], object, object]:
            async with Writer(store, limits=limits) as writer:
                for message in workload.setup_messages():
                    ack = await writer.submit(message)
                    if ack.status != "committed":
                        raise SystemExit(f"setup message not committed: {ack}")
                before = writer.statistics()
                thread_prof = ThreadProfiler(writer) if args.profile else None
                loop_prof = cProfile.Profile() if args.profile else None
                gc.collect()
                if loop_prof:
                    loop_prof.enable()
                seconds, problems, _ = await drive_writer(
                    writer, pages, producers, prebuilt.__getitem__, latencies, progress, label)
                if loop_prof:
                    loop_prof.disable()
                    profiles["loop"] = loop_prof
                    profiles["commit"] = thread_prof
                    profiles["seconds"] = seconds
                after = writer.statistics()
            return seconds, problems, before, after

        seconds, problems, before, after = anyio.run(main)
        if problems:
            raise SystemExit(f"{label}: messages not committed, e.g. {problems}")
        stats = msgspec.structs.asdict(after)
        batches = after.batches - before.batches
        result = make_result("writer", sync, batch, pages, seconds, latencies, batches,
                             producers=producers, setup_seconds=setup,
                             rows=count_rows(store.connection), writer_statistics=stats)
        if args.profile:
            write_profiles(args.profile, label, profiles)
        return result
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)


def write_profiles(directory: Path, label: str, profiles: dict[str, object]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    stem = label.replace(" ", "_").replace("=", "")
    loop: cProfile.Profile = profiles["loop"]  # type: ignore[assignment]
    thread: ThreadProfiler = profiles["commit"]  # type: ignore[assignment]
    seconds: float = profiles["seconds"]  # type: ignore[assignment]
    out = io.StringIO()
    out.write(f"# {label}: wall {seconds:.2f} s; commit thread busy {thread.busy:.2f} s "
              f"({100 * thread.busy / seconds:.0f}% of wall)\n")
    for name, prof in (("event-loop thread", loop), ("commit thread", thread.profile)):
        prof.dump_stats(directory / f"{stem}.{name.split()[0]}.pstats")
        for order in ("tottime", "cumulative"):
            out.write(f"\n## {name}, by {order}\n")
            stats = pstats.Stats(prof, stream=out)
            stats.strip_dirs().sort_stats(order).print_stats(22)
    (directory / f"{stem}.txt").write_text(out.getvalue())


# --- the baselines ----------------------------------------------------------------------

def run_raw(workload: Workload, rowsets: Sequence[RowSet], sync: str, batch: int,
            pages: int, args: argparse.Namespace, progress: Progress) -> Result:
    path = fresh_dir(args.workdir, f"raw-{sync}-{batch}")
    store = Store.create(path, sync=sync)
    try:
        conn = store.connection
        setup_rows(conn, workload)
        received = now_text()
        frontier = PLACEHOLDER_HASH * 20
        count = 2 * pages
        prepared = []  # per batch: rows per table, all outside the timed region
        for seq, start in enumerate(range(0, count, batch), start=1):
            chunk = rowsets[start:start + batch]
            prepared.append((
                [u for rs in chunk for u in rs.urls],
                [a for rs in chunk for a in rs.artifacts],
                [(*rs.ledger, seq, received) for rs in chunk],
                [rs.attempt for rs in chunk if rs.attempt is not None],
                [rs.current for rs in chunk if rs.current is not None],
                [e for rs in chunk for e in rs.edges],
                (seq, received, start, start + len(chunk), PLACEHOLDER_HASH, frontier,
                 PLACEHOLDER_HASH, PLACEHOLDER_HASH),
                len(chunk),
            ))
        label = f"raw sync={sync} batch={batch}"
        log_first = args.baseline_log_order == "first"
        latencies: list[float] = []
        done = 0
        clock = time.perf_counter
        gc.collect()
        started = clock()
        for urls, arts, ledger, attempts, current, edges, commit_row, n in prepared:
            begun = clock()
            conn.execute("BEGIN IMMEDIATE")
            if log_first:
                conn.execute(SQL_COMMIT_LOG, commit_row)
            if urls:
                conn.executemany(SQL_URL, urls)
            if arts:
                conn.executemany(SQL_ARTIFACT, arts)
            conn.executemany(SQL_LEDGER, ledger)
            if attempts:
                conn.executemany(SQL_ATTEMPT, attempts)
                conn.executemany(SQL_CURRENT, current)
            if edges:
                conn.executemany(SQL_EDGE, edges)
            if not log_first:
                conn.execute(SQL_COMMIT_LOG, commit_row)
            conn.execute("COMMIT")
            took = clock() - begun
            latencies.extend([took] * n)
            done += n
            progress.update(label, done, count)
        seconds = clock() - started
        progress.clear()
        return make_result("raw", sync, batch, pages, seconds, latencies, len(prepared),
                           rows=count_rows(conn))
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)


def run_naive(workload: Workload, rowsets: Sequence[RowSet], sync: str, pages: int,
              args: argparse.Namespace, progress: Progress) -> Result:
    path = fresh_dir(args.workdir, f"naive-{sync}")
    store = Store.create(path, sync=sync)
    try:
        conn = store.connection
        setup_rows(conn, workload)
        received = now_text()
        frontier = PLACEHOLDER_HASH
        count = 2 * pages
        label = f"naive sync={sync}"
        latencies: list[float] = []
        execute = conn.execute
        clock = time.perf_counter
        gc.collect()
        started = clock()
        log_first = args.baseline_log_order == "first"
        for seq, rs in enumerate(rowsets[:count], start=1):
            begun = clock()
            execute("BEGIN IMMEDIATE")
            log_row = (seq, received, seq - 1, seq, PLACEHOLDER_HASH, frontier,
                       PLACEHOLDER_HASH, PLACEHOLDER_HASH)
            if log_first:
                execute(SQL_COMMIT_LOG, log_row)
            for row in rs.urls:
                execute(SQL_URL, row)
            for row in rs.artifacts:
                execute(SQL_ARTIFACT, row)
            execute(SQL_LEDGER, (*rs.ledger, seq, received))
            if rs.attempt is not None:
                execute(SQL_ATTEMPT, rs.attempt)
                execute(SQL_CURRENT, rs.current)
            for row in rs.edges:
                execute(SQL_EDGE, row)
            if not log_first:
                execute(SQL_COMMIT_LOG, log_row)
            execute("COMMIT")
            latencies.append(clock() - begun)
            progress.update(label, seq, count)
        seconds = clock() - started
        progress.clear()
        return make_result("naive", sync, 1, pages, seconds, latencies, count,
                           rows=count_rows(conn))
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)


# --- reporting --------------------------------------------------------------------------

def environment(args: argparse.Namespace) -> dict[str, object]:
    fs = "?"
    with contextlib.suppress(Exception):
        fs = subprocess.run(["df", "-T", str(args.workdir)], capture_output=True, text=True,
                            check=False).stdout.splitlines()[-1].split()[1]
    return {
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": apsw.sqlite_lib_version(),
        "apsw": apsw.apsw_version(),
        "evidence": evidence.__version__,
        "workdir": str(args.workdir),
        "workdir_fs": fs,
    }


def rerun_command() -> str:
    return "python tools/bench_writer.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def header(args: argparse.Namespace, env: dict[str, object], *, growth: bool = False) -> str:
    lines = [
        "# evidence writer benchmark (tools/bench_writer.py)",
        f"# rerun:   {rerun_command()}",
        f"# machine: {env['cpus']} cpus, {env['platform']}, Python {env['python']}, "
        f"SQLite {env['sqlite']}, workdir on {env['workdir_fs']}",
        f"# at:      {env['measured_at']}",
        "# page = FetchAttempt (1 attempt, 1 artifact row/lookup, 1 url lookup, 1 projection "
        "upsert, 1 ledger row) + Discovery (10 edges, ~5 new urls, 1 ledger row)",
        "# raw ceiling: executemany per table per batch; payload bytes, hashes and row tuples "
        "precomputed OUTSIDE the timed region; no validation/savepoints/Merkle tree",
        "# naive: one BEGIN IMMEDIATE..COMMIT per message, plain INSERTs, same precomputed rows",
        f"# baselines insert the commit_log row {args.baseline_log_order} in each transaction "
        "(the writer: last)",
        "# latency: writer = submit() call to ack; raw/naive = the message's transaction",
    ]
    if growth:
        lines = [*lines[:5], "# latency: submit() call to ack, per message"]
    return "\n".join(lines)


def compute_ratios(results: list[Result]) -> None:
    raw = {(r.sync, r.batch): r for r in results if r.mode == "raw"}
    naive = {r.sync: r for r in results if r.mode == "naive"}
    for r in results:
        if r.mode == "writer":
            if (r.sync, r.batch) in raw:
                r.vs_raw = r.msgs_per_s / raw[r.sync, r.batch].msgs_per_s
                r.raw_batch = r.batch
            if r.sync in naive:
                r.vs_naive = r.msgs_per_s / naive[r.sync].msgs_per_s
        elif r.mode == "raw" and r.sync in naive:
            r.vs_naive = r.msgs_per_s / naive[r.sync].msgs_per_s


def table(results: list[Result]) -> str:
    head = (f"{'configuration':<32} {'pages':>7} {'pages/s':>9} {'msgs/s':>9} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'mean batch':>10} {'vs raw':>7} {'vs naive':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        vs_raw = f"{r.vs_raw:.2f}x" if r.vs_raw is not None else "-"
        vs_naive = f"{r.vs_naive:.1f}x" if r.vs_naive is not None else "-"
        lines.append(f"{r.label:<32} {r.pages:>7} {r.pages_per_s:>9.0f} {r.msgs_per_s:>9.0f} "
                     f"{r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.mean_batch:>10.1f} {vs_raw:>7} "
                     f"{vs_naive:>8}")
    if any(len(r.all_msgs_per_s) > 1 for r in results):
        lines += ["", "over the rounds (median, min-max; load at the start of each run):"]
        for r in results:
            spread = (f"msgs/s {r.msgs_per_s:,.0f} ({min(r.all_msgs_per_s):,.0f}-"
                      f"{max(r.all_msgs_per_s):,.0f})")
            if r.vs_raw_runs:
                ratios = sorted(r.vs_raw_runs)
                spread += (f", vs raw of its round {ratios[(len(ratios) - 1) // 2]:.2f}x "
                           f"({ratios[0]:.2f}-{ratios[-1]:.2f})")
            loads = ", ".join(f"{x:.1f}" for x in r.loads)
            lines.append(f"  {r.label:<32} {spread}; load {loads}")
    return "\n".join(lines)


def bar(results: list[Result]) -> dict[str, object]:
    target = next((r for r in results if r.mode == "writer" and r.sync == BAR_SYNC
                   and r.batch == BAR_BATCH), None)
    verdict: dict[str, object] = {"configuration": f"writer sync={BAR_SYNC} batch={BAR_BATCH}"}
    for name, value, need in (("vs_raw", target and target.vs_raw, BAR_VS_RAW),
                              ("vs_naive", target and target.vs_naive, BAR_VS_NAIVE)):
        verdict[name] = {
            "ratio": value, "bar": need,
            "verdict": "NOT MEASURED" if value is None else
                       ("PASS" if value >= need else "BELOW"),
        }
    return verdict


def bar_text(verdict: dict[str, object]) -> str:
    lines = [f"bar ({verdict['configuration']}):"]
    for name, label in (("vs_raw", "raw ceiling"), ("vs_naive", "naive pattern")):
        v = verdict[name]  # type: ignore[index]
        ratio = "n/a" if v["ratio"] is None else f"{v['ratio']:.2f}x"
        lines.append(f"  vs {label:<14} {ratio:>7}  (bar >= {v['bar']}x)  {v['verdict']}")
    return "\n".join(lines)


# --- modes ------------------------------------------------------------------------------

def run_matrix(args: argparse.Namespace, progress: Progress, env: dict[str, object]) -> dict:
    print(header(args, env), flush=True)
    bodies = make_bodies(args.artifacts)
    workload = Workload(bodies)
    most = max(args.pages, args.pages_small)
    progress.note(f"building {most:,} pages of messages and their baseline rows ...")
    prebuilt = [workload.page(i) for i in range(most)]
    builder = RowBuilder()
    rowsets = [builder.rows(m) for pair in prebuilt for m in pair]
    gc.collect()
    gc.freeze()  # the prebuilt objects are permanent: keep them out of every collection
    results: list[Result] = []

    configs: list[tuple[str, Callable[[], Result]]] = []
    for sync in args.sync:
        if not args.no_baselines:
            configs.append((f"naive sync={sync}", lambda sync=sync: run_naive(
                workload, rowsets, sync, args.pages_small, args, progress)))
        for batch in args.batches:
            pages = args.pages_small if batch == 1 else args.pages
            if not args.no_baselines:
                configs.append((f"raw sync={sync} batch={batch}",
                                lambda sync=sync, batch=batch, pages=pages: run_raw(
                                    workload, rowsets, sync, batch, pages, args, progress)))
            configs.append((f"writer sync={sync} batch={batch}",
                            lambda sync=sync, batch=batch, pages=pages: run_writer(
                                workload, prebuilt, sync, batch, pages, args, progress)))
    # Interleaved: every configuration once per round, the order reversed every other
    # round (ABBA), so a machine that slows down or speeds up during the run moves every
    # configuration alike instead of whichever ran last.
    runs: dict[str, list[Result]] = {label: [] for label, _ in configs}
    for round_ in range(args.repeat):
        for label, run in configs if round_ % 2 == 0 else configs[::-1]:
            progress.note(f"{label}" + (f" (round {round_ + 1}/{args.repeat})"
                                        if args.repeat > 1 else ""))
            load = os.getloadavg()[0]
            result = run()
            result.loads = [load]
            runs[label].append(result)
            progress.note(f"  -> {result.msgs_per_s:,.0f} msgs/s, "
                          f"mean batch {result.mean_batch:.0f}, load {load:.1f}")
    for label, _ in configs:
        ordered = sorted(runs[label], key=lambda r: r.msgs_per_s)
        chosen = ordered[(len(ordered) - 1) // 2]  # the run with the median msgs/s
        chosen.all_msgs_per_s = [r.msgs_per_s for r in runs[label]]
        chosen.loads = [r.loads[0] for r in runs[label]]
        if label.startswith("writer ") and (raw := runs.get("raw " + label[7:])):
            chosen.vs_raw_runs = [w.msgs_per_s / r.msgs_per_s
                                  for w, r in zip(runs[label], raw, strict=True)]
        results.append(chosen)
    compute_ratios(results)
    print(table(results))
    verdict = bar(results)
    print(bar_text(verdict))
    check_row_counts(results)
    return {
        "mode": "matrix",
        "rerun": rerun_command(),
        "environment": env,
        "parameters": {"pages": args.pages, "pages_small": args.pages_small,
                       "artifacts": args.artifacts, "batches": args.batches,
                       "sync": args.sync, "producers_cap": args.producers_cap,
                       "repeat": args.repeat,
                       "baseline_log_order": args.baseline_log_order},
        "notes": [
            "raw ceiling: payload bytes, BLAKE3 payload hashes, leaf hashes and row tuples "
            "precomputed outside the timed region; commit_log hashes are placeholders",
            "naive: one transaction per message, plain INSERTs, rows precomputed like raw",
            f"baselines insert the commit_log row {args.baseline_log_order} in each "
            "transaction; the writer inserts it last (deferred FK scan of ingest_ledger)",
            "writer latency: submit() call to ack; raw/naive latency: transaction duration",
        ],
        "results": [asdict(r) | {"label": r.label} for r in results],
        "bar": verdict,
    }


def check_row_counts(results: list[Result]) -> None:
    """Warn when two modes that wrote the same pages did not write the same rows."""
    by_pages: dict[int, dict[str, int]] = {}
    for r in results:
        rows = {k: v for k, v in r.rows.items() if k not in ("commit_log", "ingest_ledger")}
        rows["ledger_minus_setup"] = r.rows.get("ingest_ledger", 0) - (2 if r.mode == "writer"
                                                                       else 0)
        first = by_pages.setdefault(r.pages, rows)
        if rows != first:
            print(f"WARNING: {r.label} wrote {rows}, another mode with {r.pages} pages "
                  f"wrote {first}")


def run_growth(args: argparse.Namespace, progress: Progress, env: dict[str, object]) -> dict:
    total = args.growth_messages
    pages = total // 2
    window = args.growth_window
    batch, sync = BAR_BATCH, BAR_SYNC
    limit = args.growth_max_seconds
    print(header(args, env, growth=True), flush=True)
    print(f"# growth: {2 * pages:,} messages ({pages:,} pages) through the writer at "
          f"batch={batch} sync={sync}; messages built by producers on the fly"
          + (f"; stops taking pages after {limit:g} s" if limit else ""), flush=True)
    workload = Workload(make_bodies(args.artifacts))
    path = fresh_dir(args.workdir, "growth")
    store = Store.create(path, sync=sync)
    marks: list[tuple[int, float]] = []
    try:
        put_artifacts(store, workload)
        producers = producers_for(batch, pages, args.producers_cap)
        limits = WriterLimits(max_batch_messages=batch, queue_size=max(producers, batch))
        latencies = array.array("d")
        clock = time.perf_counter

        def on_ack(acked: int) -> None:
            if acked % window == 0 or acked == 2 * pages:
                marks.append((acked, clock()))

        async def main() -> tuple[float, int, object, object]:
            async with Writer(store, limits=limits) as writer:
                for message in workload.setup_messages():
                    await writer.submit(message)
                before = writer.statistics()
                gc.collect()
                started = clock()
                marks.append((0, started))
                seconds, problems, acked = await drive_writer(
                    writer, pages, producers, workload.page, latencies, progress,
                    "growth", on_ack, deadline=started + limit if limit else None)
                if problems:
                    raise SystemExit(f"growth: messages not committed, e.g. {problems}")
                if marks[-1][0] != acked:
                    marks.append((acked, clock()))  # a partial last window
                after = writer.statistics()
            return seconds, acked, before, after

        seconds, written, before, after = anyio.run(main)
        db_bytes = store.db_path.stat().st_size
        wal_bytes = store.wal_size()
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)
    windows = []
    for (n0, t0), (n1, t1) in itertools.pairwise(marks):
        lat = latencies[n0:n1]  # approximately the messages acked in this window
        p50, p99 = latency_ms(lat)
        windows.append({"from": n0, "to": n1, "seconds": t1 - t0,
                        "msgs_per_s": (n1 - n0) / (t1 - t0), "p50_ms": p50, "p99_ms": p99,
                        "complete": n1 - n0 == window})
    complete = [w for w in windows if w["complete"]] or windows
    first, last = complete[0], complete[-1]
    batches = after.batches - before.batches
    print(f"{'messages':>21} {'seconds':>8} {'msgs/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    for w in windows:
        print(f"{w['from']:>10,}-{w['to']:<10,} {w['seconds']:>8.1f} {w['msgs_per_s']:>8.0f} "
              f"{w['p50_ms']:>8.1f} {w['p99_ms']:>8.1f}"
              + ("" if w["complete"] else "  (partial window)"))
    stopped = written < 2 * pages
    print(f"total: {written:,} messages in {seconds:.1f} s = {written / seconds:,.0f} "
          f"msgs/s; mean batch {written / batches:.0f}; database {db_bytes / 2**20:,.0f} MiB"
          + (f"; STOPPED EARLY by --growth-max-seconds ({written:,} of {2 * pages:,} "
             "messages)" if stopped else ""))
    print(f"first window ({first['from']:,}-{first['to']:,}): {first['msgs_per_s']:,.0f} "
          f"msgs/s; last complete window ({last['from']:,}-{last['to']:,}): "
          f"{last['msgs_per_s']:,.0f} msgs/s; last/first = "
          f"{last['msgs_per_s'] / first['msgs_per_s']:.2f}")
    return {
        "mode": "growth",
        "rerun": rerun_command(),
        "environment": env,
        "parameters": {"messages": 2 * pages, "pages": pages, "window": window,
                       "batch": batch, "sync": sync, "producers": producers,
                       "artifacts": args.artifacts, "max_seconds": limit},
        "messages_written": written,
        "stopped_early": stopped,
        "seconds": seconds,
        "msgs_per_s": written / seconds,
        "mean_batch": written / batches,
        "database_bytes": db_bytes,
        "wal_bytes": wal_bytes,
        "windows": windows,
        "first_window": first,
        "last_complete_window": last,
    }


# --- command line -----------------------------------------------------------------------

def int_list(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("a comma-separated list of positive integers")
    return values


def sync_list(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or any(v not in ("full", "normal") for v in values):
        raise argparse.ArgumentTypeError("a comma-separated list of 'full' and 'normal'")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench_writer.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=20_000,
                        help="pages per configuration for batch sizes > 1 (default 20000)")
    parser.add_argument("--pages-small", type=int, default=2_000,
                        help="pages for batch size 1 and the naive pattern (default 2000)")
    parser.add_argument("--batches", type=int_list, default=[1, 50, 500, 5000],
                        help="comma-separated max_batch_messages values (default 1,50,500,5000)")
    parser.add_argument("--sync", type=sync_list, default=["full", "normal"],
                        help="comma-separated sync modes (default full,normal)")
    parser.add_argument("--artifacts", type=int, default=1000,
                        help="distinct bodies stored before timing, reused round-robin "
                             "(default 1000)")
    parser.add_argument("--producers-cap", type=int, default=10_000,
                        help="most concurrent producer tasks (default 10000; the pool is "
                             "min(max(2, 2*batch), cap, pages))")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds: every configuration runs once per round, interleaved "
                             "(the order reversed every other round); the run with the "
                             "median msgs/s is reported with the range, and the writer's "
                             "ratio to the raw run of the same round; all are kept in the "
                             "JSON (default 1)")
    parser.add_argument("--baseline-log-order", choices=("first", "last"), default="first",
                        help="where the baselines insert the batch's commit_log row: 'first' "
                             "(default; no deferred foreign-key violations, so no scan) or "
                             "'last' (the writer's order: inserting the parent row after its "
                             "ledger rows makes SQLite scan ingest_ledger for them, which has "
                             "no index on batch_seq)")
    parser.add_argument("--no-baselines", action="store_true",
                        help="measure only the writer (no raw ceiling, no naive pattern)")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny run for smoke tests (< 20 s): 300 pages, 40 small pages, "
                             "50 artifacts")
    parser.add_argument("--growth", action="store_true",
                        help="growth mode instead of the matrix: --growth-messages through the "
                             "writer at batch 500, sync=full")
    parser.add_argument("--growth-messages", type=int, default=1_000_000,
                        help="messages in growth mode (default 1000000 = 500000 pages)")
    parser.add_argument("--growth-window", type=int, default=100_000,
                        help="messages per reported window in growth mode (default 100000)")
    parser.add_argument("--growth-max-seconds", type=float, default=0.0,
                        help="growth mode: take no new page after this many seconds and report "
                             "the windows completed (default 0: no limit)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="cProfile each writer configuration (event-loop and commit "
                             "threads) into DIR (slows the writer; figures are not comparable)")
    parser.add_argument("--workdir", type=Path,
                        help="where the temporary stores go (default: a new temp directory, "
                             "removed afterwards)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/bench_writer.json"),
                        help="JSON results file (default bench-out/bench_writer.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.pages, args.pages_small, args.artifacts = 300, 40, 50
        args.growth_messages, args.growth_window = 4_000, 1_000
    if min(args.pages, args.pages_small, args.artifacts, args.repeat, args.producers_cap) < 1:
        parser.error("--pages, --pages-small, --artifacts, --repeat and --producers-cap "
                     "must be positive")
    if args.growth_messages < 4 or args.growth_window < 2 or args.growth_window % 2:
        parser.error("--growth-messages must be >= 4 and --growth-window even and >= 2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    progress = Progress(sys.stderr.isatty())
    with contextlib.ExitStack() as stack:
        if args.workdir is None:
            args.workdir = Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="bench-writer-")))
        else:
            args.workdir.mkdir(parents=True, exist_ok=True)
        args.workdir = args.workdir.resolve()
        env = environment(args)
        report = run_growth(args, progress, env) if args.growth else run_matrix(args, progress,
                                                                                env)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"# results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
