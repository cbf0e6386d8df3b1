#!/usr/bin/env python3
"""Writer messages/s on PostgreSQL vs SQLite, against PostgreSQL's own raw ceiling (issue 16).

The workload is tools/bench_writer.py's, imported from it: a *page* is a FetchAttempt (an
attempt row, an artifact lookup, a URL lookup, a projection upsert, a ledger row) and a
Discovery of 10 links (10 edges, ~5 new URLs, a ledger row); every batch writes its
commit_log row. Each configuration writes the same pages into a fresh store, at the same
batch sizes, in one run:

  writer sqlite      evidence.Writer on a SQLite store (sync=full), as bench_writer measures
  writer postgresql  evidence.Writer on a PostgreSQL store of a throwaway cluster started
                     here (evidence.testing.pgcluster: fsync=on, synchronous_commit=on,
                     full_page_writes=on; the Debian package's server), over its Unix socket
  raw copy           the ceiling: the same rows through psycopg COPY, one statement per
                     table per batch, in one transaction per batch (BEGIN ... COMMIT); every
                     id assigned in Python, no validation, no savepoints, no lookups, no
                     Merkle tree, rows and hashes PRECOMPUTED outside the timed region
  raw insert         the same rows by multi-row INSERT (executemany in psycopg's pipeline
                     mode), one transaction per batch

The bar: the PostgreSQL writer at batch 500 reaches >= 0.6x the better of the two raw
ceilings. Messages/s = messages / wall seconds of the timed region (the writer's: from the
first submit to the last ack, producers as in bench_writer).

Examples:
  python tools/bench_postgresql.py                 # 20,000 pages at batch 50 and 500
  python tools/bench_postgresql.py --quick         # a smoke test, well under a minute
"""

from __future__ import annotations

import argparse
import array
import gc
import itertools
import json
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec

sys.path.insert(0, str(Path(__file__).parent))

from bench_writer import (
    PLACEHOLDER_HASH,
    Progress,
    Result,
    RowBuilder,
    RowSet,
    Workload,
    drive_writer,
    environment,
    make_bodies,
    make_result,
    producers_for,
    put_artifacts,
)

from evidence import Store, Writer, WriterLimits
from evidence._model.messages import format_time, now_text
from evidence.testing.pgcluster import PgCluster

BAR = 0.6
BAR_BATCH = 500
COUNTED = ("url_identity", "artifact", "fetch_attempt", "url_current", "discovery_edge",
           "ingest_ledger", "commit_log")

_ATTEMPT = ("attempt_seq, attempt_id, run_id, url_id, url, sequence, method, started_at, "
            "elapsed_ms, outcome, http_status, request_headers_id, response_headers_id, "
            "body_id, body_truncated, content_type, error, log_index")
_EDGE = ("edge_id, run_id, source_attempt_seq, source_artifact_id, position, observed_ref, "
         "target_url_id, edge_kind, tag, attr, rel, log_index")
_TABLES = (  # table, columns, which rows of a batch
    ("url_identity", "url_id, normalizer_version, fetch_key", 0),
    ("artifact", "artifact_id, namespace, digest, size", 1),
    ("ingest_ledger", "log_index, message_id, kind, payload_hash, leaf_hash, payload, "
                      "batch_seq, received_at", 2),
    ("fetch_attempt", _ATTEMPT, 3),
    ("url_current", "run_id, url_id, sequence, attempt_seq", 4),
    ("discovery_edge", _EDGE, 5),
)
_COMMIT_LOG = ("INSERT INTO commit_log (batch_seq, committed_at, first_index, tree_size, "
               "root, frontier, prev_hash, entry_hash) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")


def count_rows(store: Store) -> dict[str, int]:
    with store.snapshot() as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in COUNTED}


def run_writer(kind: str, location: str, artifacts: Path, workload: Workload,
               prebuilt: list, batch: int, pages: int, progress: Progress) -> Result:
    store = (Store.create(location) if kind == "sqlite"
             else Store.create(location, artifacts=str(artifacts)))
    try:
        put_artifacts(store, workload)
        producers = producers_for(batch, pages, 10_000)
        limits = WriterLimits(max_batch_messages=batch, queue_size=max(producers, batch))
        latencies = array.array("d")
        label = f"writer {kind} batch={batch}"

        async def main() -> tuple[float, list[str], object, object]:
            async with Writer(store, limits=limits) as writer:
                for message in workload.setup_messages():
                    await writer.submit(message)
                before = writer.statistics()
                gc.collect()
                seconds, problems, _ = await drive_writer(
                    writer, pages, producers, prebuilt.__getitem__, latencies, progress, label)
                return seconds, problems, before, writer.statistics()

        seconds, problems, before, after = anyio.run(main)
        if problems:
            raise SystemExit(f"{label}: not committed, e.g. {problems}")
        return make_result(f"writer-{kind}", "full", batch, pages, seconds, latencies,
                           after.batches - before.batches, producers=producers,
                           rows=count_rows(store),
                           writer_statistics=msgspec.structs.asdict(after))
    finally:
        store.close()


def run_raw(how: str, location: str, artifacts: Path, workload: Workload,
            rowsets: Sequence[RowSet], batch: int, pages: int, progress: Progress) -> Result:
    """The ceiling on PostgreSQL: the same rows, one transaction per batch."""
    store = Store.create(location, artifacts=str(artifacts))
    try:
        raw = store.connection.raw
        started_at = format_time(workload.started)
        raw.execute("INSERT INTO crawl_session (session_id, started_at, mode, config) "
                    "VALUES (%s, %s, 'full', '{}')", (workload.session_id, started_at))
        raw.execute("INSERT INTO crawl_run (run_id, session_id, started_at, program, host, "
                    "pid) VALUES (%s, %s, %s, 'bench', 'h', 1)",
                    (workload.run_id, workload.session_id, started_at))
        received = now_text()
        count = 2 * pages
        prepared = []
        edge_ids = itertools.count(1)  # every id assigned here, as the writer numbers edges
        for seq, start in enumerate(range(0, count, batch), start=1):
            chunk = rowsets[start:start + batch]
            prepared.append((
                ([u for rs in chunk for u in rs.urls], [a for rs in chunk for a in rs.artifacts],
                 [(*rs.ledger, seq, received) for rs in chunk],
                 [rs.attempt for rs in chunk if rs.attempt is not None],
                 [rs.current for rs in chunk if rs.current is not None],
                 [(next(edge_ids), *e) for rs in chunk for e in rs.edges]),
                (seq, received, start, start + len(chunk), PLACEHOLDER_HASH,
                 PLACEHOLDER_HASH * 20, PLACEHOLDER_HASH, PLACEHOLDER_HASH), len(chunk)))
        inserts = {name: f"INSERT INTO {name} ({cols}) VALUES "
                         f"({', '.join(['%s'] * (cols.count(',') + 1))})"
                   for name, cols, _ in _TABLES}
        label = f"raw {how} batch={batch}"
        latencies: list[float] = []
        clock = time.perf_counter
        done = 0
        gc.collect()
        started = clock()
        with raw.cursor() as cur:
            for tables, commit_row, n in prepared:
                begun = clock()
                cur.execute("BEGIN")
                cur.execute(_COMMIT_LOG, commit_row)
                for name, cols, at in _TABLES:
                    rows = tables[at]
                    if not rows:
                        continue
                    if how == "copy":
                        with cur.copy(f"COPY {name} ({cols}) FROM STDIN") as copy:
                            for row in rows:
                                copy.write_row(row)
                    else:
                        cur.executemany(inserts[name], rows)
                cur.execute("COMMIT")
                latencies.extend([clock() - begun] * n)
                done += n
                progress.update(label, done, count)
        seconds = clock() - started
        progress.clear()
        return make_result(f"raw-{how}", "full", batch, pages, seconds, latencies,
                           len(prepared), rows=count_rows(store))
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Writer messages/s on PostgreSQL vs SQLite, with PostgreSQL's raw "
        "ceiling (COPY and multi-row INSERT), in one run.",
        epilog=__doc__.split("\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=20_000, help="pages per configuration "
                        "(2 messages each) (default %(default)s)")
    parser.add_argument("--batches", type=lambda t: [int(x) for x in t.split(",")],
                        default=[50, 500], help="batch sizes (default 50,500)")
    parser.add_argument("--artifacts", type=int, default=1000,
                        help="distinct bodies stored before timing (default %(default)s)")
    parser.add_argument("--quick", action="store_true", help="2,000 pages: a smoke test")
    parser.add_argument("--workdir", type=Path, help="where the SQLite stores, the artifacts "
                        "and the cluster go (default: a temporary directory)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/bench_postgresql.json"),
                        help="JSON results (default %(default)s)")
    args = parser.parse_args(argv)
    if args.quick:
        args.pages = 2_000
    progress = Progress(sys.stderr.isatty())
    work = Path(tempfile.mkdtemp(prefix="bench-pg-", dir=args.workdir))
    args.workdir = work
    env = environment(args)
    cluster = PgCluster.start()  # its own directory under /tmp: the server user reaches it
    try:
        version = cluster.sql("SHOW server_version").strip()
        print("# evidence writer on PostgreSQL vs SQLite (tools/bench_postgresql.py)")
        print("# rerun:   python tools/bench_postgresql.py "
              + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])))
        print(f"# machine: {env['cpus']} cpus, {env['platform']}, Python {env['python']}, "
              f"SQLite {env['sqlite']}, PostgreSQL {version} (fsync=on, "
              f"synchronous_commit=on, Unix socket), workdir on {env['workdir_fs']}")
        print(f"# at:      {env['measured_at']}; {args.pages} pages = {2 * args.pages} "
              "messages per configuration", flush=True)
        workload = Workload(make_bodies(args.artifacts))
        prebuilt = [workload.page(i) for i in range(args.pages)]
        builder = RowBuilder()
        rowsets = [builder.rows(m) for pair in prebuilt for m in pair]
        gc.collect()
        gc.freeze()
        results: list[Result] = []
        n = 0
        for batch in args.batches:
            for label in ("writer-sqlite", "writer-postgresql", "raw-copy", "raw-insert"):
                n += 1
                artifacts = work / f"artifacts-{n}"
                if label == "writer-sqlite":
                    result = run_writer("sqlite", str(work / f"sqlite-{n}"), artifacts,
                                        workload, prebuilt, batch, args.pages, progress)
                    shutil.rmtree(work / f"sqlite-{n}", ignore_errors=True)
                else:
                    location = cluster.create_database(f"b{n}")
                    if label == "writer-postgresql":
                        result = run_writer("postgresql", location, artifacts, workload,
                                            prebuilt, batch, args.pages, progress)
                    else:
                        result = run_raw(label.split("-")[1], location, artifacts, workload,
                                         rowsets, batch, args.pages, progress)
                    cluster.sql(f'DROP DATABASE "b{n}"')
                shutil.rmtree(artifacts, ignore_errors=True)
                results.append(result)
                print(f"{label:<18} batch={batch:<5} {result.msgs_per_s:>9.0f} msgs/s  "
                      f"p50 {result.p50_ms:7.2f} ms  p99 {result.p99_ms:7.2f} ms  "
                      f"mean batch {result.mean_batch:7.1f}", flush=True)
        verdicts = []
        for batch in args.batches:
            of = {r.mode: r for r in results if r.batch == batch}
            ceiling = max(of["raw-copy"].msgs_per_s, of["raw-insert"].msgs_per_s)
            ratio = of["writer-postgresql"].msgs_per_s / ceiling
            vs_sqlite = of["writer-postgresql"].msgs_per_s / of["writer-sqlite"].msgs_per_s
            verdicts.append({"batch": batch, "vs_raw": ratio, "vs_sqlite_writer": vs_sqlite,
                             "bar": BAR if batch == BAR_BATCH else None})
            print(f"batch {batch}: writer on PostgreSQL = {ratio:.2f}x its raw ceiling "
                  f"(the better of COPY and INSERT), {vs_sqlite:.2f}x the writer on SQLite"
                  + (f"; bar >= {BAR}x: {'PASS' if ratio >= BAR else 'BELOW'}"
                     if batch == BAR_BATCH else ""))
        # The same evidence rows everywhere (the ledger and the commit log differ by the
        # writer's two setup messages and its own batching).
        rows = {tuple(sorted((t, n) for t, n in r.rows.items()
                             if t not in ("ingest_ledger", "commit_log"))) for r in results}
        if len(rows) != 1:
            print(f"WARNING: row counts differ between configurations: {rows}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "environment": {**env, "postgresql": version}, "verdicts": verdicts,
            "results": [msgspec.structs.asdict(r) if hasattr(r, "__struct_fields__")
                        else r.__dict__ for r in results]}, indent=2, default=str))
        print(f"# JSON: {args.out}")
    finally:
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
