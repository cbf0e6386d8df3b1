#!/usr/bin/env python3
"""Benchmark archives (issue 4): export, restore and verify, against SQLite's own dumpers.

A store of ``--attempts`` fetch attempts is generated through ``evidence.Writer`` (each
attempt: one FetchAttempt with a body from a pool of ``--artifacts`` small HTML bodies, one
Discovery with 4 references; every 10th page also a RuleEvaluated). Then, on that store, in
the same run:

  export        ``evidence export`` (sql): snapshot (backup API), dump (format + BLAKE3),
                artifacts; its phases are timed separately.
  dbdump        ``sqlite3_dbdump`` (C, shipped with apsw in apsw.sqlite_extra): the baseline.
  apsw .dump    ``apsw.shell.Shell`` ``.dump`` (Python): the second baseline.
  restore       ``evidence restore``: load the dump (authorizer on), re-dump and compare every
                section hash, check_log, schema vs migrations, copy + re-hash artifacts.
  load dbdump   executing sqlite3_dbdump's output into a fresh database, with the same
                loading pragmas as restore (journal off, sync off): the restore baseline.
  verify        ``evidence verify`` (quick mode) on the restored store, when available.
  compare       ``evidence compare`` of the store and its restored copy (must be equal).

Determinism is checked in the same run: our dump of the store, of a ``VACUUM INTO`` copy and
of the restored store must be byte-identical; the baselines are tried the same way.

WAL: a second process (up to ``--live-rate`` attempts/s through its own Writer) commits
continuously while each dumper runs; the store's ``-wal`` file size is sampled every 10 ms.
Before each dumper the WAL is truncated and the writer runs 3 s alone ("steady": the WAL's
usual high-water mark between autocheckpoints); a control row runs no dumper at all.
"max wait" is the live writer's longest submit-to-ack wait: apsw's ``.dump`` takes
``BEGIN IMMEDIATE`` and so blocks the writer for the whole dump. Every timed operation
starts after ``sync``, so none pays for the previous one's dirty pages.

Side by side (``--side-by-side``, issue 35 point 4): on each store (``--store PATH``, any
number; by default a generated store of ``--attempts`` and the store of a real crawl of
``--crawl-pages`` pages of tools/bench_crawl.py's site, served on 127.0.0.1), ``--reps``
rounds, each running in alternating order (ABAB, then BABA):

  export        ``evidence export`` (payloads included), against ``sqlite3_dbdump`` of the
                database plus ``cp -r`` of the payload directory
  verify        ``evidence verify`` (the default: every row against its ledger entry)
                in-process, opening the store included, against ``PRAGMA quick_check``
  verify --quick  ``evidence verify --quick`` (the log, rows counted, payloads by pack)
                in-process, opening the store included, against ``PRAGMA quick_check``

  verify --quick  (``quick-mapped``) the same against ``PRAGMA quick_check`` on a
                connection with ``mmap_size`` set, as verify reads its snapshot

``--ops`` picks some of them (``export,verify,quick,quick-mapped``; default all four).

Reported per store: the median wall seconds of each with min-max, the ratio (median of the
per-round ratios, min-max), the same for CPU seconds (this process's threads and its
children's: what a run costs on a shared machine, whatever the scheduler gave it), and the
1-minute load average at the start and the end.

Examples:
  python tools/bench_archive.py --side-by-side --attempts 100000 --crawl-pages 5000
  python tools/bench_archive.py --quick               # well under a minute
  python tools/bench_archive.py                       # 20,000 attempts, ~1 min
  python tools/bench_archive.py --attempts 100000     # the figures in docs/archives.md
  python tools/bench_archive.py --attempts 1000000    # the full run of issue 4 (long)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import apsw
import apsw.shell
import apsw.sqlite_extra
import blake3

import evidence
from evidence import (
    ArtifactRef,
    CommitError,
    Discovery,
    FetchAttempt,
    ObservedRef,
    RuleEvaluated,
    RunStarted,
    SessionStarted,
    Store,
    Writer,
    WriterLimits,
    new_id,
    utc_now,
)
from evidence._archive.archive import compare, restore
from evidence._archive.export import export

HOST = "https://www.example.org"
MIB = 1024 * 1024


# --- the workload ------------------------------------------------------------------------

def bodies(count: int) -> list[bytes]:
    return [(f"<!doctype html><title>page {i}</title><body>"
             + f"<p>paragraph {i} lorem ipsum dolor sit amet</p>\n" * (20 + i % 40)
             + "</body>").encode() for i in range(count)]


def page_messages(i: int, run_id: str, refs: list[ArtifactRef]) -> list:
    ref = refs[i % len(refs)]
    attempt = FetchAttempt(
        message_id=new_id("msg-"), attempt_id=new_id("att-"), run_id=run_id,
        url=f"{HOST}/articles/{i:08d}.html", sequence=0, started_at=utc_now(),
        elapsed_ms=50.0 + (i % 997) / 7, outcome="response", http_status=(200, 404)[i % 50 == 0],
        body=ref, content_type="text/html; charset=utf-8")
    links = [ObservedRef(observed=f"/articles/{4 * i + j + 1:08d}.html",
                         url=f"{HOST}/articles/{4 * i + j + 1:08d}.html", position=j)
             for j in range(4)]
    messages = [attempt, Discovery(message_id=new_id("msg-"), run_id=run_id,
                                   source_attempt_id=attempt.attempt_id, source_artifact=ref,
                                   refs=links)]
    if i % 10 == 0:
        messages.append(RuleEvaluated(
            message_id=new_id("msg-"), run_id=run_id, url=attempt.url, rule_id="has-title",
            rule_version="1", input_hash=ref.digest, verdict=("pass", "fail")[i % 30 == 0],
            evaluated_at=utc_now(), attempt_id=attempt.attempt_id))
    return messages


async def start_run(writer: Writer, label: str) -> str:
    session_id, run_id = new_id("ses-"), new_id("run-")
    for message in (SessionStarted(message_id=new_id("msg-"), session_id=session_id,
                                   started_at=utc_now(), config={"bench": label}),
                    RunStarted(message_id=new_id("msg-"), run_id=run_id, session_id=session_id,
                               started_at=utc_now(), program="bench_archive", pid=os.getpid())):
        await writer.submit(message)
    return run_id


def generate(path: Path, attempts: int, artifacts: int, progress: Callable) -> dict:
    store = Store.create(path, sync="normal")
    refs = [store.artifacts.put("html", b) for b in bodies(artifacts)]
    started = time.perf_counter()
    done = 0

    async def main() -> None:
        nonlocal done
        limits = WriterLimits(max_batch_messages=500, queue_size=1000)
        async with Writer(store, limits=limits) as writer:
            run_id = await start_run(writer, "archive")
            pages = iter(range(attempts))

            async def producer() -> None:
                nonlocal done
                for i in pages:
                    for message in page_messages(i, run_id, refs):
                        await writer.submit(message)
                    done += 1
                    progress("generate", done, attempts)

            async with anyio.create_task_group() as tg:
                for _ in range(min(256, attempts)):
                    tg.start_soon(producer)

    anyio.run(main)
    seconds = time.perf_counter() - started
    store.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    messages = store.connection.execute("SELECT count(*) FROM ingest_ledger").fetchall()[0][0]
    store.close()
    return {"attempts": attempts, "messages": messages, "seconds": seconds,
            "db_bytes": (path / "evidence.db").stat().st_size, "artifacts": artifacts}


# --- the live writer (a separate process: no GIL shared with the dumper) -----------------

def live_writer(path: Path, rate: int) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    store = Store.open(path)
    refs = [store.artifacts.put("html", b) for b in bodies(20)]
    counts = {"committed": 0, "errors": 0, "max_wait_ms": 0.0}

    async def main() -> None:
        async with Writer(store) as writer:
            run_id = await start_run(writer, "live")
            i, tick = 0, 0.05
            print("ready", flush=True)

            async def one(message: FetchAttempt) -> None:
                started = time.perf_counter()
                try:
                    await writer.submit(message)
                    counts["committed"] += 1
                except CommitError:
                    counts["errors"] += 1
                waited = (time.perf_counter() - started) * 1000
                counts["max_wait_ms"] = max(counts["max_wait_ms"], waited)

            while not stop.is_set():
                started = time.monotonic()
                async with anyio.create_task_group() as tg:
                    for _ in range(max(1, int(rate * tick))):
                        tg.start_soon(one, page_messages(i, run_id, refs)[0])
                        i += 1
                await anyio.sleep(max(0.0, tick - (time.monotonic() - started)))

    anyio.run(main)
    store.close()
    print(json.dumps(counts), flush=True)
    return 0


@contextlib.contextmanager
def live(path: Path, rate: int) -> Iterator[dict]:
    result: dict = {}
    child = subprocess.Popen([sys.executable, __file__, "--live-writer", str(path),
                              "--live-rate", str(rate)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        yield result
    finally:
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=120)
        result.update(json.loads(out.strip().splitlines()[-1]))


class WalSampler:
    """Samples the size of ``<db>-wal`` every 10 ms in a thread; marks named moments."""

    def __init__(self, db: Path) -> None:
        self.wal = Path(str(db) + "-wal")
        self.samples: list[tuple[float, int]] = []
        self.marks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                size = self.wal.stat().st_size
            except FileNotFoundError:
                size = 0
            self.samples.append((time.perf_counter(), size))
            time.sleep(0.01)

    def __enter__(self) -> WalSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def max_between(self, start: float, end: float) -> int:
        return max((s for t, s in self.samples if start <= t <= end), default=0)


def truncate_wal(db: Path) -> None:
    conn = apsw.Connection(str(db))
    conn.set_busy_timeout(10_000)
    for _ in range(50):  # the live writer may hold the lock for a moment
        if conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()[0][0] == 0:
            break
        time.sleep(0.05)
    conn.close()


# --- the operations ----------------------------------------------------------------------

def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def run_dbdump(db: Path, out: Path) -> None:
    with open(out, "wb") as handle:
        subprocess.run([apsw.sqlite_extra.path("sqlite3_dbdump"), str(db)], stdout=handle,
                       check=True)


def run_apsw_dump(db: Path, out: Path) -> None:
    conn = apsw.Connection(str(db))
    conn.set_busy_timeout(30_000)  # its BEGIN IMMEDIATE waits for the writer, then blocks it
    with open(out, "w", encoding="utf-8") as handle:
        shell = apsw.shell.Shell(stdout=handle, stderr=sys.stderr, db=conn)
        shell.process_command(".dump")
        shell.db.close()


def load_sql(script: Path, db: Path) -> None:
    conn = apsw.Connection(str(db))
    conn.execute("PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF; "
                 "PRAGMA cache_size = -65536")
    with open(script, encoding="utf-8") as handle:
        pending = ""
        for block in iter(lambda: handle.read(1 << 22), ""):
            pending += block
            cut = pending.rfind("\n") + 1
            if cut and apsw.complete(pending[:cut]):
                for _ in conn.execute(pending[:cut]):
                    pass
                pending = pending[cut:]
        if pending.strip():
            for _ in conn.execute(pending):
                pass
    conn.close()


def file_hash(path: Path) -> str:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    hasher.update_mmap(path)
    return hasher.hexdigest()


class Phases:
    """A progress callback that records when each phase was first and last reported."""

    def __init__(self, show: Callable) -> None:
        self.show = show
        self.started = time.perf_counter()
        self.last: dict[str, float] = {}

    def __call__(self, phase: str, done: int, total: int) -> None:
        self.last[phase] = time.perf_counter()
        self.show(phase, done, total)


def progress_line(enabled: bool) -> Callable:
    last = [0.0]

    def show(phase: str, done: int, total: int) -> None:
        if enabled and (time.monotonic() - last[0] > 0.25 or done == total):
            last[0] = time.monotonic()
            sys.stderr.write(f"\r\x1b[K  {phase}: {done:,}/{total:,}")
            sys.stderr.flush()
    return show


# --- side by side (issue 35 point 4) ---------------------------------------------------

def crawl_store(work: Path, pages: int) -> Path:
    """The store of a real crawl: tools/bench_crawl.py's site on 127.0.0.1, crawled by
    ``evidence crawl --workers 8`` (three payloads a page: request head, response head,
    body)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_crawl import Server, evidence_command, generate_site

    site, store = work / "site", work / "crawl-store"
    generate_site(site, pages)
    server = Server(work, site, "auto")
    try:
        subprocess.run([*evidence_command(), "crawl", server.url, "--store", str(store),
                        "--workers", "8", "--per-host", "8", "--json"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    finally:
        server.close()
    return store


def quick_check(db: Path, *, mapped: bool = False) -> None:
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    if mapped:
        conn.execute("PRAGMA mmap_size = 1099511627776")
    assert conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
    conn.close()


def default_verify(store: Path, *, quick: bool = False) -> None:
    from evidence._audit.verify import verify

    with Store.open(store, read_only=True) as opened:
        assert verify(opened, quick=quick).ok


def dump_and_copy(store: Path, out: Path) -> None:
    out.mkdir()
    run_dbdump(store / "evidence.db", out / "dump.sql")
    subprocess.run(["cp", "-r", str(store / "artifacts"), str(out / "artifacts")], check=True)
    os.sync()  # as export's fsyncs: both end with their bytes on the disk


def cpu_seconds() -> float:
    """CPU used so far by this process (all its threads) and its finished children (the
    baselines run as subprocesses): on a shared machine, what a run costs whatever the
    scheduler gave it."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


SIDE_BY_SIDE = {  # --ops name -> (what is measured, its function, the baseline, its function)
    "export": ("export", lambda st, out: export(st, out), "sqlite3_dbdump + cp -r artifacts",
               dump_and_copy),
    "verify": ("verify", lambda st, out: default_verify(st), "PRAGMA quick_check",
               lambda st, out: quick_check(st / "evidence.db")),
    "quick": ("verify --quick", lambda st, out: default_verify(st, quick=True),
              "PRAGMA quick_check", lambda st, out: quick_check(st / "evidence.db")),
    # The same against quick_check reading through a memory map, as verify reads: what
    # the map is worth to the baseline too.
    "quick-mapped": ("verify --quick, again", lambda st, out: default_verify(st, quick=True),
                     "PRAGMA quick_check, mmap_size set",
                     lambda st, out: quick_check(st / "evidence.db", mapped=True)),
}


def side_by_side(stores: list[Path], work: Path, reps: int, show: Callable,
                 ops: tuple[str, ...] = tuple(SIDE_BY_SIDE)) -> dict:
    pairs = [SIDE_BY_SIDE[op] for op in ops]
    results: dict = {}
    for store in stores:
        entry: dict = {"store": str(store), "db_bytes": (store / "evidence.db").stat().st_size,
                       "payload_bytes": sum(p.stat().st_size for p in
                                            (store / "artifacts").rglob("*") if p.is_file()),
                       "load_start": os.getloadavg()[0]}
        for ours, fn, base, base_fn in pairs:
            times: dict[str, list[float]] = {ours: [], base: []}
            cpu: dict[str, list[float]] = {ours: [], base: []}
            for rep in range(reps):
                order = [(ours, fn), (base, base_fn)]
                for name, run in order if rep % 2 == 0 else order[::-1]:
                    out = work / f"out-{time.time_ns()}"
                    os.sync()
                    started, cpu_started = time.perf_counter(), cpu_seconds()
                    run(store, out)
                    times[name].append(time.perf_counter() - started)
                    cpu[name].append(cpu_seconds() - cpu_started)
                    shutil.rmtree(out, ignore_errors=True)
                    show(f"{store.name}: {name}", rep + 1, reps)
            ratios = [a / b for a, b in zip(times[ours], times[base], strict=True)]
            entry[ours] = {"ours": times[ours], "baseline": base, "base": times[base],
                           "ratios": ratios, "ours_cpu": cpu[ours], "base_cpu": cpu[base],
                           "cpu_ratios": [a / b for a, b in zip(cpu[ours], cpu[base],
                                                                strict=True)]}
        entry["load_end"] = os.getloadavg()[0]
        results[store.name] = entry
    return results


def render_side_by_side(results: dict, reps: int) -> str:
    def spread(values: list[float], unit: str = "") -> str:
        return (f"{statistics.median(values):.2f}{unit} "
                f"({min(values):.2f}-{max(values):.2f})")

    lines = [f"# side by side, {reps} interleaved rounds (ABAB), medians (min-max); "
             f"rerun: {rerun_command()}"]
    for name, entry in results.items():
        lines += ["", f"{name}: {entry['db_bytes'] / MIB:.1f} MiB database, "
                  f"{entry['payload_bytes'] / MIB:.1f} MiB of payload files; load average "
                  f"{entry['load_start']:.1f} at the start, {entry['load_end']:.1f} at the end",
                  f"  {'operation':<16} {'seconds':>20}   {'baseline':<34} {'seconds':>20}"
                  f"  {'ratio':>20}"]
        for op in (k for k in entry if isinstance(entry[k], dict)):
            o = entry[op]
            lines.append(f"  {op:<16} {spread(o['ours']):>20}   {o['baseline']:<34} "
                         f"{spread(o['base']):>20}  {spread(o['ratios'], 'x'):>20}")
            lines.append(f"  {'  CPU seconds':<16} {spread(o['ours_cpu']):>20}   {'':<34} "
                         f"{spread(o['base_cpu']):>20}  {spread(o['cpu_ratios'], 'x'):>20}")
    return "\n".join(lines)


def run_side_by_side(args: argparse.Namespace, work: Path, show: Callable) -> dict:
    stores = [p.resolve() for p in args.store]
    if not stores:
        generate(work / "store", args.attempts, args.artifacts, show)
        stores.append(work / "store")
        if args.crawl_pages:
            stores.append(crawl_store(work, args.crawl_pages))
    return side_by_side(stores, work, args.reps, show, tuple(args.ops.split(",")))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.live_writer:
        return live_writer(args.live_writer, args.live_rate)
    if args.side_by_side:
        work = Path(tempfile.mkdtemp(prefix="bench-archive-", dir=args.workdir)).resolve()
        try:
            results = run_side_by_side(args, work, progress_line(sys.stderr.isatty()))
        finally:
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        print(render_side_by_side(results, args.reps))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"environment": environment(args),
                                        "side_by_side": results}, indent=2) + "\n")
        print(f"\nwrote {args.out}")
        return 0
    if args.quick:
        args.attempts, args.artifacts, args.live_rate = 2_000, 100, 1_000
    show = progress_line(sys.stderr.isatty())
    # Absolute: the determinism check symlinks into it, and a relative link target would
    # resolve against the link's own directory and lose every timing taken before it.
    work = Path(tempfile.mkdtemp(prefix="bench-archive-", dir=args.workdir)).resolve()
    try:
        report = bench(args, work, show)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(render(report))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


def bench(args: argparse.Namespace, work: Path, show: Callable) -> dict:
    store, db = work / "store", work / "store" / "evidence.db"
    gen = generate(store, args.attempts, args.artifacts, show)
    ops: dict[str, dict] = {}

    def op(name: str, fn: Callable[[], object], output: Path | None = None) -> object:
        os.sync()  # no dirty pages of the previous operation left to flush on this one's time
        seconds, value = timed(fn)
        size = (output.stat().st_size if output.is_file() else
                sum(p.stat().st_size for p in output.rglob("*") if p.is_file())) \
            if output is not None else None
        ops[name] = {"seconds": seconds, "output_bytes": size}
        show(name, 1, 1)
        return value

    phases = Phases(show)
    op("export", lambda: export(store, work / "archive", progress=phases), work / "archive")
    # Phases run in order; each ends at its last progress report.
    mark = phases.started
    for phase, label in (("snapshot", "snapshot (backup API)"),
                         ("dump", "check_log + dump + hash"), ("artifacts", "artifacts")):
        if phase in phases.last:
            ops[f"  export: {label}"] = {"seconds": phases.last[phase] - mark,
                                         "output_bytes": None}
            mark = phases.last[phase]
    op("sqlite3_dbdump", lambda: run_dbdump(db, work / "dbdump.sql"), work / "dbdump.sql")
    op("apsw .dump", lambda: run_apsw_dump(db, work / "apsw.sql"), work / "apsw.sql")
    op("restore", lambda: restore(work / "archive", work / "restored", progress=show))
    op("load dbdump output", lambda: load_sql(work / "dbdump.sql", work / "loaded.db"))
    try:
        from evidence._audit.verify import verify
    except ImportError:
        verify = None
    if verify is not None:
        def run_verify() -> None:
            with Store.open(work / "restored") as restored:
                assert verify(restored).ok
        op("verify (quick)", run_verify)
    result = op("compare", lambda: compare(store, work / "restored", scratch=work))
    assert result.equal, result.differences  # type: ignore[attr-defined]

    determinism = check_determinism(work, db, store, show)
    wal = measure_wal(args, work, store, db, show) if args.live_rate > 0 else {}
    return {"environment": environment(args), "store": gen, "operations": ops,
            "determinism": determinism, "wal": wal, "rerun": rerun_command()}


def check_determinism(work: Path, db: Path, store: Path, show: Callable) -> dict:
    vacuumed = work / "vacuumed"
    vacuumed.mkdir()
    conn = apsw.Connection(str(db))
    conn.execute("VACUUM INTO ?", (str(vacuumed / "evidence.db"),))
    conn.close()
    (vacuumed / "artifacts").symlink_to(store / "artifacts")
    export(vacuumed, work / "archive-vacuumed", progress=show)
    export(work / "restored", work / "archive-restored", progress=show)
    ours = file_hash(work / "archive" / "dump.sql")
    run_dbdump(vacuumed / "evidence.db", work / "dbdump-vacuumed.sql")
    run_dbdump(work / "loaded.db", work / "dbdump-loaded.sql")
    run_apsw_dump(db, work / "apsw-again.sql")
    dbdump = file_hash(work / "dbdump.sql")
    return {
        "ours: VACUUM INTO copy identical": file_hash(
            work / "archive-vacuumed" / "dump.sql") == ours,
        "ours: restored store identical": file_hash(
            work / "archive-restored" / "dump.sql") == ours,
        "sqlite3_dbdump: VACUUM INTO copy identical": file_hash(
            work / "dbdump-vacuumed.sql") == dbdump,
        "sqlite3_dbdump: reloaded copy identical": file_hash(
            work / "dbdump-loaded.sql") == dbdump,
        "apsw .dump: twice identical": file_hash(work / "apsw-again.sql") == file_hash(
            work / "apsw.sql"),
    }


def measure_wal(args: argparse.Namespace, work: Path, store: Path, db: Path,
                show: Callable) -> dict:
    results = {}
    settle = 1.0 if args.quick else 3.0  # seconds the writer runs alone before each dumper
    dumpers: list[tuple[str, Callable[[Phases], object]]] = [
        ("(none: control)", lambda p: time.sleep(2 * settle)),
        ("export", lambda p: export(store, work / f"wal-{time.time_ns()}", progress=p)),
        ("sqlite3_dbdump", lambda p: run_dbdump(db, work / "wal-dbdump.sql")),
        ("apsw .dump", lambda p: run_apsw_dump(db, work / "wal-apsw.sql")),
    ]
    for name, fn in dumpers:
        os.sync()
        truncate_wal(db)
        phases = Phases(show)
        with WalSampler(db) as sampler, live(store, args.live_rate) as writer:
            time.sleep(settle)  # autocheckpoint cycles: the WAL's usual high-water mark
            start = time.perf_counter()
            steady = sampler.max_between(start - settle, start)
            fn(phases)
            end = time.perf_counter()
            time.sleep(0.2)
        entry = {"seconds": end - start, "wal_max_bytes": sampler.max_between(start, end),
                 "wal_steady_bytes": steady, "writer_committed": writer["committed"],
                 "writer_errors": writer["errors"], "writer_max_wait_ms": writer["max_wait_ms"]}
        if "snapshot" in phases.last:
            entry["wal_after_snapshot_bytes"] = sampler.max_between(start,
                                                                   phases.last["snapshot"])
        results[name] = entry
    return results


def environment(args: argparse.Namespace) -> dict:
    return {"measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "sqlite": apsw.sqlite_lib_version(),
            "apsw": apsw.apsw_version(), "evidence": evidence.__version__,
            "live_rate": args.live_rate}


def rerun_command() -> str:
    return "python tools/bench_archive.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def render(r: dict) -> str:
    s, env, ops = r["store"], r["environment"], r["operations"]
    base = {name: ops[name]["seconds"] for name in ("sqlite3_dbdump", "apsw .dump")}
    lines = [
        "# evidence archive benchmark (tools/bench_archive.py)",
        f"# rerun:   {r['rerun']}",
        f"# machine: {env['cpus']} cpus, {env['platform']}, Python {env['python']}, "
        f"SQLite {env['sqlite']}",
        f"# store:   {s['attempts']:,} attempts, {s['messages']:,} messages, "
        f"{s['db_bytes'] / MIB:.1f} MiB database, {s['artifacts']} artifacts "
        f"(generated through the Writer in {s['seconds']:.1f} s)",
        "",
        f"{'operation':<34} {'seconds':>9} {'output MiB':>11} {'vs dbdump':>10} "
        f"{'vs apsw .dump':>14}",
        "-" * 82,
    ]
    for name, o in ops.items():
        out = f"{o['output_bytes'] / MIB:.1f}" if o["output_bytes"] else "-"
        ratios = [f"{o['seconds'] / base[b]:.2f}x" if not name.startswith(" ") else "-"
                  for b in base]
        lines.append(f"{name:<34} {o['seconds']:>9.2f} {out:>11} {ratios[0]:>10} "
                     f"{ratios[1]:>14}")
    lines += ["", "determinism (same logical content -> same bytes):"]
    lines += [f"  {k:<45} {'yes' if v else 'NO'}" for k, v in r["determinism"].items()]
    if r["wal"]:
        lines += ["", f"WAL while a second process commits up to {env['live_rate']:,} attempts/s "
                  "(WAL truncated before each):",
                  f"  {'dumper':<16} {'seconds':>8} {'WAL max MiB':>12} {'after snapshot':>15} "
                  f"{'steady MiB':>11} {'writer commits':>15} {'max wait ms':>12} "
                  f"{'errors':>7}"]
        for name, w in r["wal"].items():
            snap = w.get("wal_after_snapshot_bytes")
            lines.append(f"  {name:<16} {w['seconds']:>8.2f} {w['wal_max_bytes'] / MIB:>12.1f} "
                         f"{'-' if snap is None else f'{snap / MIB:.1f}':>15} "
                         f"{w['wal_steady_bytes'] / MIB:>11.1f} {w['writer_committed']:>15,} "
                         f"{w['writer_max_wait_ms']:>12.0f} {w['writer_errors']:>7}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", type=int, default=20_000,
                        help="fetch attempts to generate (default 20,000; issue 4: 1,000,000)")
    parser.add_argument("--artifacts", type=int, default=1000,
                        help="distinct bodies the attempts reuse (default 1000)")
    parser.add_argument("--live-rate", type=int, default=2000,
                        help="attempts/s the live writer commits while the WAL is measured "
                        "(default 2000; 0 skips the WAL measurement)")
    parser.add_argument("--quick", action="store_true",
                        help="2,000 attempts, 100 artifacts, live rate 1,000, 1 s settling: "
                        "well under a minute")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the stores and dumps go (default: the system temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--out", type=Path, default=Path("bench-out/bench_archive.json"),
                        help="JSON results (default bench-out/bench_archive.json)")
    parser.add_argument("--side-by-side", action="store_true",
                        help="export, verify and verify --quick against sqlite3_dbdump + cp "
                        "-r and PRAGMA quick_check, interleaved, on each --store")
    parser.add_argument("--store", type=Path, action="append", default=[],
                        help="a store to compare on (repeatable; default: a generated store "
                        "of --attempts and a crawl of --crawl-pages)")
    parser.add_argument("--crawl-pages", type=int, default=5000,
                        help="pages of the crawled store of --side-by-side (default 5,000; "
                        "0: none)")
    parser.add_argument("--reps", type=int, default=3,
                        help="interleaved rounds of --side-by-side (default 3)")
    parser.add_argument("--ops", default=",".join(SIDE_BY_SIDE),
                        help="what --side-by-side measures, comma-separated, of "
                        f"{', '.join(SIDE_BY_SIDE)} (default all)")
    parser.add_argument("--live-writer", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.ops.split(",")) - set(SIDE_BY_SIDE)
    if unknown:
        parser.error(f"--ops: {', '.join(sorted(unknown))}: not one of "
                     f"{', '.join(SIDE_BY_SIDE)}")
    return args


if __name__ == "__main__":
    sys.exit(main())
