#!/usr/bin/env python3
"""Benchmark a crawl's writes to disk (issue 35): bytes written against the store's size.

The bench_crawl site (``--pages`` HTML pages, 5,000 by default: 3-5 KB of text and ~10
links a page) is generated into a temp dir and served on 127.0.0.1 (nginx when installed,
else bench_crawl's asyncio server). Then ``evidence crawl URL --store NEW --workers N
--per-host N --json`` runs as a subprocess, at the default ``--sync full``, and what it
wrote is read from the kernel: ``wait4``'s ``ru_oublock`` (in 512-byte blocks) is the
``write_bytes`` of ``/proc/PID/io`` of the process and every child it reaped, the bytes
it caused to be sent to the block device (a page dirtied, written out and dirtied again
counts twice; one written twice before it went out counts once). Reported per run:
those bytes, the store's size once the crawl ended (every file under it), their ratio
(the write amplification the issue's bar is on: under 3), the bytes per request, and the
pages answered (from the server's log), and the CPU per page
(``wait4``'s user and system time).

``--baseline DIR`` (repeatable) adds the same crawl run by another checkout of evidence
(a ``git archive`` of an older commit unpacked into DIR: its ``evidence`` package and
``schema/`` are imported through PYTHONPATH, with this venv's libraries), interleaved
with this checkout's runs, the order rotated each repetition: the before and after of a
change in one run, on one machine load. ``--writer-cache MIB[,MIB...]`` runs this
checkout once per size of the writer's SQLite page cache (``WRITER_CACHE_MIB`` of
``evidence/_store/sqlite.py``, set in the crawl's process before it starts), interleaved
the same way: what the cache buys in pages/s, CPU per page and bytes written (a cache too
small for a batch's dirty pages spills them into the WAL before the COMMIT), against the
peak resident set it costs (``wait4``'s ``ru_maxrss``). ``--syscalls`` adds one run per
configuration under ``strace -f -c`` for the counts of fsync, fdatasync and pwrite per
request (strace slows the crawl, so those runs are not in the byte figures).

Options: --pages N (5000), --workers N (8), --reps N (3), --quick (300 pages, 1 rep),
--baseline DIR, --writer-cache MIB[,MIB...], --syscalls, --server auto|nginx|python,
--json FILE, --keep.

Network: only 127.0.0.1. The site has no link to any other host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_crawl import (  # noqa: E402  (a sibling tool, not a package)
    Server,
    dir_bytes,
    evidence_command,
    generate_site,
    load_average,
    precompile,
    window,
)

SYSCALLS = ("fsync", "fdatasync", "pwrite64", "write", "pwritev", "writev")


def crawl_command(url: str, store: Path, workers: int, cache_mib: int | None = None) -> list[str]:
    command = evidence_command()
    if cache_mib is not None:  # the same CLI, the writer's page cache bound set first
        command = [sys.executable, "-c", "import runpy, sys; "
                   "import evidence._store.sqlite as s; "
                   f"s.WRITER_CACHE_MIB = {int(cache_mib)}; sys.argv[0] = 'evidence'; "
                   "runpy.run_module('evidence', run_name='__main__')"]
    return [*command, "crawl", url, "--store", str(store), "--workers",
            str(workers), "--per-host", str(workers), "--json"]


def environment(checkout: Path | None) -> dict[str, str] | None:
    """Run another checkout's evidence: its package first on the path."""
    if checkout is None:
        return None
    return {**os.environ, "PYTHONPATH": str(checkout)}


def run(name: str, checkout: Path | None, server: Server, work: Path, workers: int,
        rep: int, strace: bool = False, cache_mib: int | None = None) -> dict:
    store = work / f"{name}-{rep}{'-strace' if strace else ''}"
    cmd = crawl_command(server.url, store, workers, cache_mib)
    counts = work / f"{store.name}.strace"
    if strace:
        cmd = ["strace", "-f", "-c", "-o", str(counts), "-e",
               "trace=" + ",".join(SYSCALLS), *cmd]
    load = load_average()
    offset = server.mark()
    t0 = time.perf_counter()
    with (work / f"{store.name}.err").open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err,
                                env=environment(checkout))
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # interrupted: leave no crawl behind
            proc.kill()
            proc.wait()
            raise
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        print((work / f"{store.name}.err").read_text()[-2000:], file=sys.stderr)
    time.sleep(0.05)  # the server's last log lines
    requests = server.requests_since(offset)
    _span, _dups, pages = window(requests)
    written = usage.ru_oublock * 512
    cpu = usage.ru_utime + usage.ru_stime
    size = dir_bytes(store)
    out = {"config": name, "rep": rep, "exit": code, "load_1m": load,
           "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "requests": len(requests),
           "pages": pages, "cpu_ms_per_page": round(1000 * cpu / max(1, pages), 3),
           "pages_per_s": round(pages / wall, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
           "written_bytes": written, "store_bytes": size,
           "ratio": round(written / size, 3) if size else None,
           "bytes_per_request": round(written / max(1, len(requests)))}
    if strace:
        calls = parse_strace(counts.read_text() if counts.exists() else "")
        out["per_request"] = {k: round(v / max(1, len(requests)), 2)
                              for k, v in calls.items()}
    return out


def parse_strace(text: str) -> dict[str, int]:
    """The ``calls`` column of ``strace -c``'s table, per syscall."""
    calls = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in SYSCALLS and re.fullmatch(r"\d+", fields[3]):
            calls[fields[-1]] = int(fields[3])
    return calls


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):.2f} (min {min(values):.2f}, "
            f"max {max(values):.2f})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, help="HTML pages (default 5000)")
    p.add_argument("--workers", type=int, default=8, help="--workers and --per-host (8)")
    p.add_argument("--reps", type=int, help="repetitions, interleaved (3)")
    p.add_argument("--quick", action="store_true", help="300 pages, 1 repetition")
    p.add_argument("--baseline", type=Path, action="append", default=[], metavar="DIR",
                   help="another checkout of evidence to run the same crawl with "
                   "(repeatable)")
    p.add_argument("--writer-cache", metavar="MIB[,MIB...]",
                   help="run this checkout once per size of the writer's page cache, "
                   "interleaved (e.g. 64,16,8)")
    p.add_argument("--syscalls", action="store_true",
                   help="one more run per configuration under strace -c: fsync and "
                   "pwrite calls per request")
    p.add_argument("--server", choices=("auto", "nginx", "python"), default="auto",
                   help="auto (default): nginx when installed, else the Python server")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the runs as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (stores, logs)")
    args = p.parse_args(argv)
    args.pages = args.pages or (300 if args.quick else 5000)
    args.reps = args.reps or (1 if args.quick else 3)
    if min(args.pages, args.workers, args.reps) < 1:
        p.error("--pages, --workers and --reps must be positive")
    args.baseline = [b.absolute() for b in args.baseline]
    try:
        args.writer_cache = [int(v) for v in args.writer_cache.split(",")] \
            if args.writer_cache else []
    except ValueError:
        p.error(f"--writer-cache: whole MiB, comma-separated, not {args.writer_cache!r}")
    if any(v < 1 for v in args.writer_cache):
        p.error("--writer-cache: each size must be at least 1 MiB")
    for checkout in args.baseline:
        if not (checkout / "evidence" / "__init__.py").exists():
            p.error(f"--baseline: {checkout} holds no evidence package (unpack a commit "
                    f"there: git archive COMMIT | tar -x -C {checkout})")
    if args.syscalls and not shutil.which("strace"):
        p.error("--syscalls needs strace (apt-get install -y strace)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configs: list[tuple[str, Path | None, int | None]] = [
        (f"cache-{mib}", None, mib) for mib in args.writer_cache] or [("this", None, None)]
    configs += [(f"baseline-{i}" if len(args.baseline) > 1 else "baseline", b, None)
                for i, b in enumerate(args.baseline)]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cleanups run on a kill
    work = Path(tempfile.mkdtemp(prefix="bench-writes-")).absolute()
    work.chmod(0o755)
    try:
        print(f"bytecode: {precompile()}", flush=True)
        print("$ " + shlex.join(crawl_command("URL", Path("NEW"), args.workers)), flush=True)
        for name, checkout, _ in configs:
            if checkout is not None:
                print(f"{name}: PYTHONPATH={checkout}", flush=True)
        site = generate_site(work / "site", args.pages)
        server = Server(work, work / "site", args.server)
        print(f"site: {site['documents']} documents, server: {server.name}", flush=True)
        runs = []
        try:
            for rep in range(args.reps):
                shift = rep % len(configs)
                for name, checkout, mib in configs[shift:] + configs[:shift]:
                    r = run(name, checkout, server, work, args.workers, rep, cache_mib=mib)
                    runs.append(r)
                    print(f"  {name} #{rep}: {r['written_bytes'] / 1e6:.1f} MB written for a "
                          f"{r['store_bytes'] / 1e6:.1f} MB store (x{r['ratio']}), "
                          f"{r['bytes_per_request'] / 1024:.1f} KiB per request, "
                          f"{r['pages']} pages, {r['wall_s']} s ({r['pages_per_s']} pages/s), "
                          f"{r['cpu_ms_per_page']} CPU ms per page, peak RSS "
                          f"{r['peak_rss_mb']} MB, exit {r['exit']}, load "
                          f"{r['load_1m']:.1f}", flush=True)
            if args.syscalls:
                for name, checkout, mib in configs:
                    r = run(name, checkout, server, work, args.workers, 0, strace=True,
                            cache_mib=mib)
                    runs.append(r)
                    print(f"  {name} under strace: per request {r['per_request']}", flush=True)
        finally:
            server.close()
        print()
        for name, _checkout, _mib in configs:
            mine = [r for r in runs if r["config"] == name and "per_request" not in r]
            print(f"{name}: write amplification {spread([r['ratio'] for r in mine])}; "
                  f"KiB per request {spread([r['bytes_per_request'] / 1024 for r in mine])}; "
                  f"store MB {spread([r['store_bytes'] / 1e6 for r in mine])}; CPU ms per "
                  f"page {spread([r['cpu_ms_per_page'] for r in mine])}; pages/s "
                  f"{spread([r['pages_per_s'] for r in mine])}; peak RSS MB "
                  f"{spread([r['peak_rss_mb'] for r in mine])}; load "
                  f"{spread([r['load_1m'] for r in mine])}")
        if args.json:
            args.json.write_text(json.dumps({"pages": args.pages, "workers": args.workers,
                                             "server": server.name, "runs": runs}, indent=1))
            print(f"wrote {args.json}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
