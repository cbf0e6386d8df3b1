#!/usr/bin/env python3
"""Fault loops over the write path: every fault class, at every operation N (issue 6).

For each fault class and N = 1, 2, ... (every operation of that kind a fault-free run of
the workload makes, or every ``--stride``-th): create a store, run the fixed workload
(a session and run, then batches of pages: body put in the artifact store, attempt and
links committed as one group) with the fault at operation N on the simulated disk of
``evidence.testing.disk``, crash, reopen with the ordinary VFS, and check:

  * ``PRAGMA integrity_check`` is ok and ``verify(full=True)`` finds no error (ledger and
    rows agree, Merkle roots and the hash chain recompute, referenced artifacts re-hash);
  * every acked message is present (sync=full: all; sync=normal: all but those acked after
    the last WAL sync, which is the documented loss window, measured here);
  * every payload that must survive is present and intact (packs: every payload of an
    acknowledged group, synced before its COMMIT; files: every put that returned); no
    group is half-present;
  * the writer starts again, every group redelivered converges (duplicates), and a new
    page commits.

An error fault (I/O error, disk full) does not cut the power itself: the power is cut at
the first ack after it, which must already be durable.

Examples:
  python tools/faultloop.py                              # every class, every N (~15 min)
  python tools/faultloop.py --class power-sync-drop      # one class
  python tools/faultloop.py --quick                      # stride 10, one seed (< 1 min)
  python tools/faultloop.py --seeds 5 --class power-write-torn --jobs 2
  python tools/faultloop.py --sync normal --batches 40 --checkpoint-wal-bytes 33554432
  python tools/faultloop.py --long-reader                # WAL growth under a reader
  python tools/faultloop.py --json > faultloop.json      # machine-readable record
  python tools/faultloop.py --artifacts files            # one file per payload (old stores)

Progress goes to stderr; the table (or JSON with --json) to stdout. The exit status is 1
if any trial broke a guarantee. Trials run under /dev/shm when it exists (--workdir).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import apsw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evidence.testing.trial import (  # noqa: E402 - after the path set-up above
    Trial,
    Workload,
    count_operations,
    iter_faults,
    run_trial,
)


@dataclass(frozen=True)
class FaultClass:
    name: str
    how: str  # how it is injected, for the record
    action: str
    ops: tuple[str, ...]
    crash: str = "drop"
    persistent: bool = False
    sync_failure: str = "lose"
    sync: str | None = None  # force a sync mode (the sync=normal rows)
    files: tuple[str, ...] = ()  # only operations on these kinds of file (all)
    heal_after: int = 0  # persistent: the device works again after this many failures


CLASSES = [
    FaultClass("power-sync-drop", "power loss at the N-th fsync (database, WAL, journal, "
               "artifact file or directory); every write not yet synced is lost",
               "power_loss", ("sync",)),
    FaultClass("power-write-drop", "power loss at the N-th write; unsynced writes lost",
               "power_loss", ("write",)),
    FaultClass("power-write-torn", "power loss at the N-th write; each 512-byte sector of "
               "each unsynced write is old, new or garbage", "power_loss", ("write",),
               crash="torn"),
    FaultClass("power-any-reorder", "power loss at the N-th write, sync, truncate or "
               "directory operation; each unsynced write survives or not, in any order; "
               "each directory's unsynced entries survive or not", "power_loss",
               ("write", "sync", "truncate", "meta"), crash="reorder"),
    FaultClass("power-meta-drop", "power loss at the N-th create, rename, delete or mkdir; "
               "directory entries not yet fsynced are lost", "power_loss", ("meta",)),
    FaultClass("ioerr-write", "EIO (SQLITE_IOERR) from the N-th write, once",
               "io_error", ("write",)),
    FaultClass("ioerr-sync-lose", "EIO from the N-th fsync, once; the failed fsync's "
               "writes never reach the disk (Linux page-cache semantics)", "io_error",
               ("sync",)),
    FaultClass("ioerr-sync-keep", "EIO from the N-th fsync, once; its writes stay dirty "
               "for a later fsync", "io_error", ("sync",), sync_failure="keep"),
    FaultClass("ioerr-read", "EIO from the N-th read, once", "io_error", ("read",)),
    FaultClass("ioerr-truncate-meta", "EIO from the N-th truncate, create, rename, delete "
               "or mkdir, once", "io_error", ("truncate", "meta")),
    FaultClass("full-write", "ENOSPC / SQLITE_FULL from the N-th write on, until the "
               "workload gives up (a disk that stays full)", "disk_full", ("write",),
               persistent=True),
    FaultClass("full-write-once", "ENOSPC / SQLITE_FULL from the N-th write, once",
               "disk_full", ("write",)),
    FaultClass("sync-lose-onwards", "a failing device: EIO from every fsync from the N-th "
               "on (database, WAL, artifact file or directory) while writes still succeed; a "
               "failed fsync's writes never reach the disk; then power loss", "io_error",
               ("sync",), persistent=True),
    FaultClass("sync-lose-wal-onwards", "EIO from every fsync of the WAL from the N-th on; "
               "then power loss", "io_error", ("sync",), persistent=True, files=("wal",)),
    FaultClass("sync-lose-db-onwards", "EIO from every fsync of evidence.db (the "
               "checkpoints') from the N-th on; then power loss", "io_error", ("sync",),
               persistent=True, files=("database",)),
    FaultClass("sync-lose-artifact-onwards", "EIO from every fsync of an artifact file "
               "from the N-th on; then power loss", "io_error", ("sync",), persistent=True,
               files=("artifact",)),
    FaultClass("sync-lose-dir-onwards", "EIO from every directory fsync (artifact "
               "directories, the store directory) from the N-th on; then power loss",
               "io_error", ("sync",), persistent=True, files=("directory",)),
    FaultClass("sync-lose-heal", "EIO from the N-th fsync and the two after it, then the "
               "device works again (retried fsyncs succeed without writing what was lost); "
               "power loss at the first ack after", "io_error", ("sync",), persistent=True,
               heal_after=3),
    FaultClass("sync-lose-wal-heal", "as sync-lose-heal, fsyncs of the WAL only", "io_error",
               ("sync",), persistent=True, heal_after=3, files=("wal",)),
    FaultClass("sync-lose-db-heal", "as sync-lose-heal, fsyncs of evidence.db only",
               "io_error", ("sync",), persistent=True, heal_after=3, files=("database",)),
    # Aimed at the artifact store alone (packs: the pack segments; files: payload files).
    FaultClass("artifact-write-torn", "power loss at the N-th write of an artifact file (a "
               "pack append); each sector of each unsynced write old, new or garbage: a "
               "torn pack tail", "power_loss", ("write",), crash="torn", files=("artifact",)),
    FaultClass("artifact-write-drop", "power loss at the N-th write of an artifact file; "
               "every append not yet synced is lost", "power_loss", ("write",),
               files=("artifact",)),
    FaultClass("artifact-any-reorder", "power loss at the N-th operation on an artifact "
               "file; its unsynced writes land whole or not, in any order", "power_loss",
               ("write", "sync", "truncate", "meta"), crash="reorder", files=("artifact",)),
    FaultClass("artifact-full-write", "ENOSPC from the N-th write of an artifact file on, "
               "until the workload gives up (a disk full in the middle of an append)",
               "disk_full", ("write",), persistent=True, files=("artifact",)),
    FaultClass("artifact-sync-lose-heal", "EIO from the N-th fsync of an artifact file, "
               "once; its writes never reach the disk (a retried fsync succeeds without "
               "them); power loss at the first ack after", "io_error", ("sync",),
               persistent=True, heal_after=1, files=("artifact",)),
    FaultClass("normal-power-sync-drop", "sync=normal: power loss at the N-th fsync; "
               "unsynced writes lost (measures the loss window)", "power_loss", ("sync",),
               sync="normal"),
    FaultClass("normal-power-write-torn", "sync=normal: power loss at the N-th write, torn "
               "sectors (measures the loss window)", "power_loss", ("write",),
               crash="torn", sync="normal"),
]
BY_NAME = {c.name: c for c in CLASSES}


def default_workdir() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def one_trial(args: tuple) -> dict:
    """Run one trial in a fresh directory (in a worker process with --jobs)."""
    workdir, fault, workload, seed, sync_failure = args
    logging.getLogger("evidence").setLevel(logging.CRITICAL)  # expected: faults are injected
    directory = tempfile.mkdtemp(prefix="faultloop-", dir=workdir)
    try:
        trial = run_trial(directory, fault, workload=workload, seed=seed,
                          sync_failure=sync_failure)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return _trial_dict(trial)


def _trial_dict(trial: Trial) -> dict:
    return {"fault": str(trial.fault), "seed": trial.seed, "ok": trial.ok,
            "problems": trial.problems, "lost": len(trial.lost), "fired": bool(trial.fired),
            "restarts": trial.restarts, "acked": len(trial.acked),
            "errors_seen": trial.errors_seen[:3]}


def workload_for(args: argparse.Namespace, sync: str) -> Workload:
    return Workload(batches=args.batches, pages_per_batch=args.pages, sync=sync,
                    checkpoint_wal_bytes=args.checkpoint_wal_bytes, artifacts=args.artifacts,
                    pack_bytes=args.pack_bytes if args.artifacts == "packs" else None)


def run_class(fc: FaultClass, args: argparse.Namespace, pool) -> dict:
    sync = fc.sync or args.sync
    workload = workload_for(args, sync)
    with tempfile.TemporaryDirectory(dir=args.workdir) as d:
        counts = count_operations(d, workload)
    faults = list(iter_faults(counts, action=fc.action, ops=frozenset(fc.ops),
                              crash=fc.crash, stride=args.stride,  # type: ignore[arg-type]
                              persistent=fc.persistent, heal_after=fc.heal_after,
                              files=frozenset(fc.files)))
    if args.limit:
        faults = faults[:args.limit]
    seeds = args.seeds if fc.crash in ("torn", "reorder") else 1
    jobs = [(args.workdir, fault, workload, fault.at * 1000 + s, fc.sync_failure)
            for fault in faults for s in range(seeds)]
    started = last_shown = time.monotonic()
    results: list[dict] = []
    mapper = pool.map(one_trial, jobs) if pool else map(one_trial, jobs)
    tty = sys.stderr.isatty()
    for result in mapper:
        results.append(result)
        failed = sum(not r["ok"] for r in results)
        now = time.monotonic()
        if tty or now - last_shown > 10 or len(results) == len(jobs):
            last_shown = now
            print(f"{chr(13) if tty else ''}{fc.name}: {len(results)}/{len(jobs)} trials, "
                  f"{failed} failed, {now - started:.0f} s", end="" if tty else "\n",
                  file=sys.stderr, flush=True)
        if args.fail_fast and failed:
            break
    if tty:
        print(file=sys.stderr)
    trials = results
    lost = [r["lost"] for r in trials]
    failures = [r for r in trials if not r["ok"]]
    return {
        "class": fc.name, "how": fc.how, "sync": sync, "sync_failure": fc.sync_failure,
        "artifacts": args.artifacts,
        "operations": {op: counts[op] for op in sorted(counts)},
        "trials": len(trials), "failed": len(failures),
        "acked_lost": sum(lost), "max_acked_lost": max(lost, default=0),
        "trials_with_loss": sum(1 for n in lost if n),
        "faults_fired": sum(r["fired"] for r in trials),
        "writer_restarts": sum(r["restarts"] for r in trials),
        "seconds": round(time.monotonic() - started, 1),
        "command": command_for(fc, args),
        "failures": failures[:5],
    }


def command_for(fc: FaultClass, args: argparse.Namespace) -> str:
    parts = ["python tools/faultloop.py", f"--class {fc.name}"]
    if args.stride != 1:
        parts.append(f"--stride {args.stride}")
    if args.seeds != 1 and fc.crash in ("torn", "reorder"):
        parts.append(f"--seeds {args.seeds}")
    defaults = build_parser().parse_args([])
    for flag in ("batches", "pages", "checkpoint_wal_bytes", "artifacts", "pack_bytes"):
        if getattr(args, flag) != getattr(defaults, flag):
            parts.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    if args.sync != "full" and not fc.sync:
        parts.append(f"--sync {args.sync}")
    return " ".join(parts)


def long_reader(args: argparse.Namespace) -> dict:
    """WAL size while a reader holds one snapshot, then after it lets go."""
    from evidence import FetchAttempt, Store, Writer, WriterLimits, status
    from evidence.testing.trial import FIXED_TIME, build_groups

    samples: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as d, Store.create(Path(d) / "s") as store:
        async def main() -> dict:
            async with Writer(store) as w:
                for m in build_groups(Workload(batches=0))[0].messages:
                    await w.submit(m)
            reader = apsw.Connection(str(store.db_path), flags=apsw.SQLITE_OPEN_READONLY)
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM ingest_ledger").fetchall()
            limits = WriterLimits(checkpoint_wal_bytes=args.checkpoint_wal_bytes)
            started = time.monotonic()
            async with Writer(store, limits=limits) as w:
                for i in range(args.reader_commits):
                    await w.submit(FetchAttempt(
                        message_id=f"lr-{i}", attempt_id=f"lr-a{i}", run_id="r1",
                        url=f"http://example.com/{i}", sequence=0, started_at=FIXED_TIME,
                        elapsed_ms=1.0, outcome="network_error", error="e" * 3000))
                    if (i + 1) % max(1, args.reader_commits // 10) == 0:
                        samples.append((i + 1, status(store).wal_bytes))
                        print(f"\rlong reader: {i + 1} commits, WAL "
                              f"{samples[-1][1] / 2**20:.1f} MiB", end="", file=sys.stderr)
                held = time.monotonic() - started
                peak = status(store).wal_bytes
                reader.execute("COMMIT")
                reader.close()
                await w.submit(FetchAttempt(
                    message_id="lr-end", attempt_id="lr-aend", run_id="r1",
                    url="http://example.com/end", sequence=0, started_at=FIXED_TIME,
                    elapsed_ms=1.0, outcome="timeout"))
                stats = w.statistics()
            print(file=sys.stderr)
            return {"commits_under_reader": args.reader_commits,
                    "reader_held_seconds": round(held, 2),
                    "checkpoint_wal_bytes": args.checkpoint_wal_bytes,
                    "wal_bytes_samples": samples, "wal_bytes_peak": peak,
                    "wal_bytes_after_reader": status(store).wal_bytes,
                    "checkpoints": stats.checkpoints, "wal_truncations": stats.wal_truncations}

        return anyio.run(main)


def environment() -> dict:
    return {"python": platform.python_version(), "sqlite": apsw.sqlite_lib_version(),
            "apsw": apsw.apsw_version(), "platform": platform.platform()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="classes: " + ", ".join(BY_NAME),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--class", dest="classes", action="append", choices=list(BY_NAME),
                        help="a fault class to run (repeatable; default: all)")
    parser.add_argument("--sync", choices=["full", "normal"], default="full",
                        help="the store's sync mode (the normal-* classes force normal)")
    parser.add_argument("--stride", type=int, default=1, help="every N-th operation")
    parser.add_argument("--seeds", type=int, default=1,
                        help="random crash images per operation (torn and reorder classes)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many N per class")
    parser.add_argument("--batches", type=int, default=6, help="page batches in the workload")
    parser.add_argument("--pages", type=int, default=3, help="pages per batch")
    parser.add_argument("--checkpoint-wal-bytes", type=int, default=48 * 1024,
                        help="the writer's checkpoint threshold (small: checkpoints and WAL "
                        "truncations happen inside the workload)")
    parser.add_argument("--artifacts", choices=["packs", "files"], default="packs",
                        help="where the workload's payloads go: packs (new stores) or one "
                        "file each (stores made before packs)")
    parser.add_argument("--pack-bytes", type=int, default=8192,
                        help="packs: rotate at this size (small: packs are sealed and new "
                        "ones created inside the workload)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--workdir", default=default_workdir(),
                        help="where trial stores are made (default /dev/shm)")
    parser.add_argument("--quick", action="store_true", help="--stride 10 --seeds 1")
    parser.add_argument("--fail-fast", action="store_true", help="stop a class at a failure")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--long-reader", action="store_true",
                        help="measure WAL growth under a long reader instead")
    parser.add_argument("--reader-commits", type=int, default=2000,
                        help="commits made while the reader holds its snapshot")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.stride, args.seeds = 10, 1
    if args.long_reader:
        result = {"environment": environment(), "long_reader": long_reader(args)}
        print(json.dumps(result, indent=2) if args.json else _reader_text(result))
        return 0
    classes = [BY_NAME[n] for n in args.classes] if args.classes else CLASSES
    workload = workload_for(args, args.sync)
    rows = []
    pool = concurrent.futures.ProcessPoolExecutor(args.jobs) if args.jobs > 1 else None
    try:
        for fc in classes:
            rows.append(run_class(fc, args, pool))
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)
    record = {"environment": environment(), "workload": asdict(workload), "classes": rows}
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        where = (f"packs rotating at {args.pack_bytes} bytes" if args.artifacts == "packs"
                 else "one file per payload")
        print(f"artifacts: {where}; {args.batches} batches of {args.pages} pages")
        print(_table(rows))
    full_loss = any(r["acked_lost"] for r in rows if r["sync"] == "full")
    return 1 if full_loss or any(r["failed"] for r in rows) else 0


def _table(rows: list[dict]) -> str:
    lines = [f"{'class':<26}{'sync':<8}{'trials':>7}{'fired':>7}{'failed':>8}"
             f"{'acked lost':>12}{'max/trial':>11}{'restarts':>10}{'s':>7}"]
    for r in rows:
        lines.append(f"{r['class']:<26}{r['sync']:<8}{r['trials']:>7}{r['faults_fired']:>7}"
                     f"{r['failed']:>8}{r['acked_lost']:>12}{r['max_acked_lost']:>11}"
                     f"{r['writer_restarts']:>10}{r['seconds']:>7}")
        for failure in r["failures"]:
            lines.append(f"    FAILED {failure['fault']} (seed {failure['seed']}): "
                         f"{'; '.join(failure['problems'][:2])}")
    return "\n".join(lines)


def _reader_text(result: dict) -> str:
    r = result["long_reader"]
    samples = ", ".join(f"{n}: {b / 2**20:.1f}" for n, b in r["wal_bytes_samples"])
    return (f"{r['commits_under_reader']} commits under one reader snapshot "
            f"({r['reader_held_seconds']} s), checkpoint threshold "
            f"{r['checkpoint_wal_bytes'] / 2**20:.2f} MiB\n"
            f"WAL MiB after N commits: {samples}\n"
            f"peak {r['wal_bytes_peak'] / 2**20:.1f} MiB; after the reader ended and one "
            f"more commit: {r['wal_bytes_after_reader'] / 2**20:.2f} MiB "
            f"({r['checkpoints']} checkpoints, {r['wal_truncations']} truncations)")


if __name__ == "__main__":
    sys.exit(main())
