#!/usr/bin/env python3
"""Why a local store commits on the event loop's thread: the GIL convoy, measured.

A SQLite transaction run through apsw releases the GIL around every statement (prepare and
step) and takes it back after. Alone, taking it back is free. Beside a thread that is busy
in Python (an event loop with work to do), the thread coming back from SQLite waits until
the busy one lets go: at the latest after ``sys.getswitchinterval()`` (5 ms by default),
once per statement. This times one batch of ``--statements`` single-row INSERTs in one
transaction, ``--batches`` times with 2 ms between them, into a fresh SQLite file in WAL
mode:

- ``alone``: nothing else runs;
- ``beside a busy thread``: another thread runs Python in a loop, with a non-blocking
  ``epoll`` poll every ~100 us (as an event loop polls its sockets);

at each switch interval in ``--intervals``; with the busy thread's speed meanwhile, against
its speed alone. One of the two waits: the transaction (many times slower) or the busy
thread (stopped while the transaction runs), whichever the GIL happens to favour. That is
the price of committing on a thread of its own while the event loop has work
(docs/benchmarks.md, "Committing on the event loop's thread"). Nothing leaves the
machine; the files are removed at the end.

    python tools/bench_gil_convoy.py [--statements 60] [--batches 20]
        [--intervals 0.005,0.001,0.0002,0.00005] [--json]
"""

from __future__ import annotations

import argparse
import json
import select
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import apsw


def batch_ms(conn: apsw.Connection, statements: int, batches: int) -> list[float]:
    """Each transaction's milliseconds; between two, 2 ms of waiting (as a commit thread
    waits for its next batch, while the event loop runs)."""
    times = []
    for _ in range(batches):
        time.sleep(0.002)
        started = time.perf_counter()
        with conn:  # one transaction
            for i in range(statements):
                conn.execute("INSERT INTO t VALUES (?, ?)", (i, "x" * 100))
        times.append((time.perf_counter() - started) * 1000)
    return times


def busy(stop: threading.Event, rounds: list[int]) -> None:
    """Python in a loop, polling like an event loop; counts its rounds in ``rounds[0]``."""
    poller = select.epoll()
    x = 0
    while not stop.is_set():
        for i in range(2000):  # about 100 us of Python
            x += i * i
        poller.poll(0)
        rounds[0] += 1
    poller.close()


def busy_rate(seconds: float) -> float:
    """Rounds per second of ``busy`` with nothing beside it."""
    stop, rounds = threading.Event(), [0]
    thread = threading.Thread(target=busy, args=(stop, rounds), daemon=True)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    return rounds[0] / seconds


def measure(path: Path, statements: int, batches: int, interval: float) -> dict[str, float]:
    conn = apsw.Connection(str(path))
    for sql in ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL",
                "CREATE TABLE IF NOT EXISTS t (a, b)"):
        conn.execute(sql).fetchall()
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        alone = statistics.median(batch_ms(conn, statements, batches))
        solo_rate = busy_rate(0.3)
        stop, rounds = threading.Event(), [0]
        thread = threading.Thread(target=busy, args=(stop, rounds), daemon=True)
        thread.start()
        try:
            started = time.perf_counter()
            beside = statistics.median(batch_ms(conn, statements, batches))
            elapsed = time.perf_counter() - started
            done = rounds[0]
        finally:
            stop.set()
            thread.join()
    finally:
        sys.setswitchinterval(before)
        conn.close()
    return {"switch_interval_s": interval, "alone_ms": round(alone, 3),
            "beside_busy_thread_ms": round(beside, 3), "ratio": round(beside / alone, 1),
            "busy_thread_speed": round(done / elapsed / solo_rate, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Time a SQLite transaction alone and beside a thread busy in Python "
                    "(the GIL convoy), at several switch intervals.")
    parser.add_argument("--statements", type=int, default=60,
                        help="INSERTs per transaction (a crawl batch runs about 60)")
    parser.add_argument("--batches", type=int, default=20,
                        help="transactions timed per case (the median is reported)")
    parser.add_argument("--intervals", default="0.005,0.001,0.0002,0.00005",
                        help="switch intervals in seconds, comma-separated (5 ms: Python's "
                             "default)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    try:
        intervals = [float(v) for v in args.intervals.split(",") if v]
    except ValueError:
        print(f"Error: --intervals {args.intervals!r} is not a list of numbers\n"
              "Try: --intervals 0.005,0.0002", file=sys.stderr)
        return 2
    if args.statements < 1 or args.batches < 1 or not intervals or min(intervals) <= 0:
        print("Error: --statements, --batches and every interval must be positive\n"
              "Try: python tools/bench_gil_convoy.py --statements 60 --batches 20",
              file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="convoy-") as tmp:
        for n, interval in enumerate(intervals):
            result = measure(Path(tmp) / f"{n}.db", args.statements, args.batches, interval)
            results.append(result)
            if not args.json:
                print(f"switch interval {interval * 1000:g} ms: a {args.statements}-statement "
                      f"transaction {result['alone_ms']:.3f} ms alone, "
                      f"{result['beside_busy_thread_ms']:.3f} ms beside a busy thread "
                      f"({result['ratio']:g}x), which ran meanwhile at "
                      f"{result['busy_thread_speed']:.0%} of its own speed", flush=True)
    if args.json:
        print(json.dumps({"statements": args.statements, "batches": args.batches,
                          "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
