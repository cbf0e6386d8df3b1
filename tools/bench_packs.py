#!/usr/bin/env python3
"""Benchmark artifact puts (issue 15): a put stream into packs against raw appends.

The workload: ``--payloads`` (10,000) payloads of 2-64 KiB (uniform, a fixed seed, random
bytes so nothing compresses or repeats), stored in groups of ``--group`` (100: a writer
batch), each group made durable before the next, as the writer does before a COMMIT:

  raw     the same bytes appended to one file (``os.write`` each payload), one ``fsync``
          per group: the floor, a store that hashes, indexes and checks nothing;
  packs   ``PackStore.put`` each payload (BLAKE3, the dedup lookup, a record header, one
          write), then ``PackStore.sync`` of the group's refs (one fsync of the pack);
  batched the same puts, each group's inside ``PackStore.batch()`` (a group's records held
          and appended in one ``writev`` per MiB, then the group's sync), as a producer
          storing many payloads at once can (a crawl stores each exchange's request,
          response head and body in one batch);
  files   ``ArtifactStore.put`` each payload (temp file, fsync, rename, directory fsync),
          the layout of stores made before packs; ``sync`` has nothing left to do;
  raw-wb  (only when named) raw appends that also start the writeback of every MiB
          written, as packs do (``FileOps.start_writeback``): what the same hint is worth
          to a store that hashes nothing. Not the bar's baseline, which is ``raw``.

With ``--pipeline`` each group's sync runs on a second thread while the next group is
stored (one sync in flight at a time, as the writer's commit thread syncs a batch's packs
while producers put the next pages); raw appends get the same: the fsync of group k runs
while group k+1 is written. A group is still durable only once its own sync returned.

Each kind runs ``--reps`` times, interleaved (raw, packs, files, then rotated), each into a
fresh directory under ``--dir`` (the system temp directory by default, never the
repository; not tmpfs, where fsync costs nothing: the tool refuses one). Reported per
run: seconds, MB/s, payloads/s; then the medians and the ratio packs/raw (the bar:
>= 0.8). The machine's load average is printed with each run: on a shared machine, ratios
from one interleaved run are what count.

Examples:
  python tools/bench_packs.py                       # 10,000 payloads, groups of 100, 5 reps
  python tools/bench_packs.py --quick               # 1,000 payloads, 2 reps
  python tools/bench_packs.py --group 20 --json packs.json
  python tools/bench_packs.py --pipeline            # syncs overlap the next group
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import mmap
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evidence._store.artifacts import ArtifactStore  # noqa: E402 - after the path set-up
from evidence._store.fileops import FileOps  # noqa: E402
from evidence._store.packs import WRITEBACK_BYTES, PackStore  # noqa: E402


def filesystem_type(path: Path) -> str:
    """The type of the file system holding ``path`` (the longest mount point above it)."""
    path, best, kind = path.resolve(), "", "unknown"
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            point = fields[1].replace("\\040", " ")
            if (path.as_posix() == point or path.is_relative_to(point)) and len(point) > len(best):
                best, kind = point, fields[2]
    return kind


def payloads(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(rng.randint(2 * 1024, 64 * 1024)) for _ in range(count)]


class Syncer:
    """Runs each group's sync: in line, or (``pipeline``) on one other thread while the
    caller goes on with the next group, never more than one sync in flight."""

    def __init__(self, pipeline: bool) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(1) if pipeline else None
        self.inflight: concurrent.futures.Future | None = None

    def sync(self, fn, *args) -> None:
        if self.pool is None:
            fn(*args)
            return
        self.wait()
        self.inflight = self.pool.submit(fn, *args)

    def wait(self) -> None:
        if self.inflight is not None:
            self.inflight.result()  # this group is durable (or its error raised here)
            self.inflight = None

    def close(self) -> None:
        self.wait()
        if self.pool is not None:
            self.pool.shutdown()


def run_raw(directory: Path, data: list[bytes], group: int, pipeline: bool, *,
            hint: bool = False) -> float:
    """Raw appends; with ``hint``, the writeback hint every MiB on whole pages, as
    PackStore gives it."""
    fd = os.open(directory / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    dfd = os.open(directory, os.O_RDONLY)
    syncer = Syncer(pipeline)
    ops, page, hinted, end = FileOps(), mmap.PAGESIZE, 0, 0
    try:
        started = time.perf_counter()
        os.fsync(dfd)  # the file's entry, as a pack's creation makes it durable
        for i, payload in enumerate(data, 1):
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            if hint:
                end += len(payload)
                if end - hinted >= WRITEBACK_BYTES:
                    ops.start_writeback(fd, hinted, end - end % page - hinted)
                    hinted = end - end % page
            if i % group == 0 or i == len(data):
                syncer.sync(os.fsync, fd)
        syncer.wait()
        return time.perf_counter() - started
    finally:
        syncer.close()
        os.close(fd)
        os.close(dfd)


def run_raw_wb(directory: Path, data: list[bytes], group: int, pipeline: bool) -> float:
    return run_raw(directory, data, group, pipeline, hint=True)


def run_packs(directory: Path, data: list[bytes], group: int, pipeline: bool) -> float:
    store = PackStore(directory / "artifacts")  # opening a store is not the stream
    syncer = Syncer(pipeline)
    started = time.perf_counter()
    pending = []
    for i, payload in enumerate(data, 1):
        pending.append(store.put("body", payload))
        if i % group == 0 or i == len(data):
            syncer.sync(store.sync, pending)
            pending = []
    syncer.wait()
    elapsed = time.perf_counter() - started
    syncer.close()
    store.close()  # sealing is not part of the stream (one fsync per 64 MiB)
    return elapsed


def run_batched(directory: Path, data: list[bytes], group: int, pipeline: bool) -> float:
    store = PackStore(directory / "artifacts")
    syncer = Syncer(pipeline)
    started = time.perf_counter()
    for first in range(0, len(data), group):
        with store.batch():
            pending = [store.put("body", payload) for payload in data[first:first + group]]
        syncer.sync(store.sync, pending)
    syncer.wait()
    elapsed = time.perf_counter() - started
    syncer.close()
    store.close()
    return elapsed


def run_files(directory: Path, data: list[bytes], group: int, pipeline: bool) -> float:
    store = ArtifactStore(directory / "artifacts")
    syncer = Syncer(pipeline)
    started = time.perf_counter()
    pending = []
    for i, payload in enumerate(data, 1):
        pending.append(store.put("body", payload))
        if i % group == 0 or i == len(data):
            syncer.sync(store.sync, pending)
            pending = []
    syncer.wait()
    elapsed = time.perf_counter() - started
    syncer.close()
    return elapsed


KINDS = {"raw": run_raw, "packs": run_packs, "batched": run_batched, "files": run_files,
         "raw-wb": run_raw_wb}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--payloads", type=int, default=10_000, help="payloads (default 10000)")
    p.add_argument("--group", type=int, default=100,
                   help="payloads per fsync / sync (default 100)")
    p.add_argument("--reps", type=int, default=5, help="repetitions of each kind (default 5)")
    p.add_argument("--kinds", default="raw,packs,batched,files",
                   help="what to run, comma-separated: raw, packs, batched, files, raw-wb "
                   "(default raw,packs,batched,files)")
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()),
                   help="where the runs write (default: the system temp directory, "
                   f"{tempfile.gettempdir()}; not tmpfs)")
    p.add_argument("--seed", type=int, default=15, help="payload sizes and bytes (default 15)")
    p.add_argument("--quick", action="store_true", help="1,000 payloads, 2 reps")
    p.add_argument("--pipeline", action="store_true",
                   help="each group's sync on another thread while the next group is stored "
                   "(one in flight), for every kind: how the writer's commit thread runs")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the report as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.payloads, args.reps = 1000, 2
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown kinds {sorted(unknown)}; known: {sorted(KINDS)}")
    fs = filesystem_type(args.dir)
    if fs == "tmpfs":
        p.error(f"{args.dir} is on tmpfs, where fsync costs nothing; pass --dir on a disk")
    data = payloads(args.payloads, args.seed)
    total = sum(map(len, data))
    print(f"{len(data)} payloads, {total / 1e6:.1f} MB (2-64 KiB), a sync every "
          f"{args.group}{' (pipelined: a sync overlaps the next group)' if args.pipeline else ''}"
          f"; {args.reps} reps, interleaved; under {args.dir} ({fs}); load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    runs: dict[str, list[float]] = {k: [] for k in kinds}
    rows = []
    for rep in range(args.reps):
        order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
        for kind in order:
            directory = Path(tempfile.mkdtemp(prefix=f"bench-packs-{kind}-", dir=args.dir))
            try:
                os.sync()  # no dirty pages of the previous run left to flush on this one's time
                load = os.getloadavg()[0]
                seconds = KINDS[kind](directory, data, args.group, args.pipeline)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            runs[kind].append(seconds)
            rows.append({"kind": kind, "rep": rep, "seconds": seconds, "load_1m": load})
            print(f"  {kind:<7} #{rep}: {seconds:6.3f} s  {total / seconds / 1e6:7.1f} MB/s  "
                  f"{len(data) / seconds:8.0f} payloads/s  load {load:.1f}", flush=True)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    print()
    for kind, seconds in medians.items():
        print(f"{kind:<7} median {seconds:.3f} s = {total / seconds / 1e6:.1f} MB/s, "
              f"{len(data) / seconds:.0f} payloads/s")
    report = {"payloads": len(data), "bytes": total, "group": args.group, "reps": args.reps,
              "pipeline": args.pipeline,
              "dir": str(args.dir), "filesystem": fs,
              "runs": rows, "median_seconds": medians}
    if "raw" in medians and "packs" in medians:
        ratio = medians["raw"] / medians["packs"]
        report["packs_over_raw"] = ratio
        print(f"packs / raw appends (throughput, medians): {ratio:.2f}   bar >= 0.8: "
              f"{'met' if ratio >= 0.8 else 'NOT met'}")
    if "raw" in medians and "batched" in medians:
        ratio = medians["raw"] / medians["batched"]
        report["batched_over_raw"] = ratio
        print(f"batched puts / raw appends (throughput, medians): {ratio:.2f}   bar >= 0.8: "
              f"{'met' if ratio >= 0.8 else 'NOT met'}")
    if "raw-wb" in medians and "packs" in medians:
        report["packs_over_raw_wb"] = medians["raw-wb"] / medians["packs"]
        print(f"packs / raw appends with the same writeback hint: "
              f"{report['packs_over_raw_wb']:.2f}")
    if "files" in medians and "packs" in medians:
        report["packs_over_files"] = medians["files"] / medians["packs"]
        print(f"packs / one file per payload: {report['packs_over_files']:.1f}x")
    print("rerun: python tools/bench_packs.py --payloads "
          f"{args.payloads} --group {args.group} --reps {args.reps} --kinds {','.join(kinds)}"
          + (" --pipeline" if args.pipeline else ""))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
