#!/usr/bin/env python3
"""The S3 payload path per page (issue 35): one object per payload against segments.

What a crawl's process does with an S3 store per page, without the crawl around it: three
payloads put (sizes of a request, a response head and a body: 400, 300 and 4,000 random
bytes), then, per batch of ``--batch`` pages (a group commit), the writer's
``check_each`` of the batch's references and its ``sync``. Two stores on one SeaweedFS
(``evidence.testing.seaweed``, 127.0.0.1), one thread:

  objects    ``hold=False``: each put is one conditional PUT, each check a HEAD
             (layout 1's path; a worker process's today)
  segments   ``hold=True``: puts held until the sync, which seals them into one segment
             object (the writer's store: ``evidence/_store/s3.py``)

They alternate (ABAB...) ``--reps`` times. Per run: CPU milliseconds per page (this
process's rusage: hashing, signing, HTTP), requests per page (the client's count) and
pages/s; then medians with min-max, and the load. ``--profile`` also prints each mode's
top functions by own time (cProfile; its overhead is in that run's figures).

Options: --pages N (600), --batch N (12), --reps N (3), --profile, --quick (120 pages,
one rep).

Network: only 127.0.0.0/8.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evidence._store.s3 import S3ArtifactStore, open_s3
from evidence.testing.seaweed import SeaweedS3

SIZES = (("headers", 400), ("headers", 300), ("body", 4000))


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _pages(store: S3ArtifactStore, pages: int, batch: int) -> None:
    for _ in range(0, pages, batch):
        refs = [store.put(namespace, os.urandom(size))
                for _ in range(batch) for namespace, size in SIZES]
        problems = store.check_each(refs)
        assert not any(problems), problems
        store.sync(refs)


def run_one(server: SeaweedS3, mode: str, rep: int, pages: int, batch: int,
            profile: bool) -> tuple[float, float, float]:
    """(CPU ms per page, requests per page, pages/s) of one run."""
    store = open_s3(server.url(f"{mode}-{rep}-{os.urandom(4).hex()}"), create=True,
                    read_only=False, environ=server.environ, hold=mode == "segments")
    try:
        requests0, cpu0, wall0 = store.client.requests, _cpu(), time.perf_counter()
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        _pages(store, pages, batch)
        if profiler:
            profiler.disable()
        wall, cpu = time.perf_counter() - wall0, _cpu() - cpu0
        if profiler:
            print(f"--- {mode}, rep {rep}: own time per function (cProfile)")
            pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(10)
        return 1000 * cpu / pages, (store.client.requests - requests0) / pages, pages / wall
    finally:
        store.close()


def _spread(values: list[float], fmt: str) -> str:
    return (f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-"
            f"{fmt.format(max(values))}]")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--pages", type=int, default=600, help="pages per run")
    parser.add_argument("--batch", type=int, default=12, help="pages per group commit")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (ABAB...)")
    parser.add_argument("--profile", action="store_true",
                        help="print each run's top functions (cProfile)")
    parser.add_argument("--quick", action="store_true", help="120 pages, one repetition")
    args = parser.parse_args()
    if args.quick:
        args.pages, args.reps = 120, 1
    if args.pages < 1 or args.batch < 1 or args.reps < 1:
        parser.error("--pages, --batch and --reps must be 1 or more")
    modes = ("objects", "segments")
    results: dict[str, list[tuple[float, float, float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-s3path-") as tmp, \
            SeaweedS3.start(Path(tmp)) as server:
        print(f"SeaweedFS weed mini on 127.0.0.1; {args.pages} pages of 3 payloads, "
              f"{args.batch} pages per sync; {os.cpu_count()} cores")
        print(f"{'mode':9} {'rep':>3} {'CPU ms/page':>11} {'req/page':>8} {'pages/s':>8} "
              f"{'load':>5}")
        for rep in range(args.reps):
            for mode in modes if rep % 2 == 0 else reversed(modes):
                load = os.getloadavg()[0]
                cpu, requests, rate = run_one(server, mode, rep, args.pages, args.batch,
                                              args.profile)
                results[mode].append((cpu, requests, rate, load))
                print(f"{mode:9} {rep:>3} {cpu:11.3f} {requests:8.3f} {rate:8.1f} "
                      f"{load:5.1f}", flush=True)
    print("\nmedians [min-max]")
    for mode in modes:
        runs = results[mode]
        print(f"{mode:9} CPU {_spread([r[0] for r in runs], '{:.3f}')} ms/page, "
              f"{_spread([r[1] for r in runs], '{:.3f}')} requests/page, "
              f"{_spread([r[2] for r in runs], '{:.1f}')} pages/s, load "
              f"{min(r[3] for r in runs):.1f}-{max(r[3] for r in runs):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
