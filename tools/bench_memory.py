#!/usr/bin/env python3
"""Benchmark a crawl's memory (issue 35): the crawler's resident set against pages crawled.

A site of ``--pages`` HTML pages (the bench_crawl site: 3-5 KB of text, ~10 links a page,
every page reachable from ``/``) is served on 127.0.0.1 by a small asyncio server in a
separate process that renders each page when asked (nothing held in memory, so a site of
100,000 pages costs the server nothing), and logs one line per request. For each size,
``evidence crawl URL --store NEW --workers N --per-host N`` runs as a subprocess while the
resident set of the crawler and its children (``VmRSS`` from ``/proc/PID/status``) and the
pages the server answered are sampled every ``--interval`` seconds. With several
``--reps`` the sizes are interleaved (the order rotated each repetition).

Reported per run: the curve (RSS at each tenth of the pages), the RSS once warm (at
``--warm`` pages, 10,000 by default: the writer's SQLite page cache, 16 MiB, and its
bounded caches of row ids and URL keys fill over about the first 10,000 pages of this
site) and at the end, the growth past warm-up per 10,000 pages,
and the end/warm ratio. With ``--scrapy-venv`` holding Scrapy, the same crawl by
``scrapy runspider tools/_scrapy_spider.py`` (JOBDIR, as tools/bench_crawl.py runs it) is
sampled the same way, interleaved. ``--tracemalloc N`` instead runs one crawl in this
process with tracemalloc on and prints the N allocation sites that grew most between
the warm point and the end (where to look when the curve climbs).

Options: --pages N[,N...] (20000), --workers N (8), --reps N (1), --warm N (10000),
--quick (2,000 pages, warm at 500), --interval S (0.5), --json FILE, --keep,
--scrapy-venv DIR, --tracemalloc N.

Network: only 127.0.0.1. The site links nowhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_crawl import (  # noqa: E402  (a sibling tool, not a package)
    HOST,
    evidence_command,
    free_port,
    load_average,
    page_links,
    precompile,
    render_page,
    scrapy_command,
    wait_port,
)

# --- the site, rendered on demand ----------------------------------------------------


def page(target: str, pages: int) -> bytes | None:
    """The document at ``target`` of a site of ``pages`` pages (the bench_crawl site), or
    None. Each page is rendered from its own seed: the same bytes at every request."""
    path = target.split("?", 1)[0]
    if path == "/robots.txt":
        return b"User-agent: *\nAllow: /\n"
    if path in ("/", "/index.html"):
        return render_page("Index", [f"/p/{j}.html" for j in range(min(pages, 20))],
                           random.Random(-1)).encode()
    if path.startswith("/p/") and path.endswith(".html"):
        number = path[3:-5]
        if number.isdigit() and int(number) < pages:
            i = int(number)
            return render_page(f"Page {i}", page_links(i, pages), random.Random(i)).encode()
    return None


def serve(pages: int, port: int, log_path: Path) -> None:
    """HTTP/1.1 keep-alive on 127.0.0.1; one log line (status, target) per request."""
    log = log_path.open("a", buffering=1)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, _, rest = head.partition(b"\r\n")
                method, target, _version = line.decode("latin-1").split(" ", 2)
                body = page(target, pages)
                status = 200 if body is not None else 404
                body = body if body is not None else b"not found\n"
                ctype = "text/plain" if target.endswith(".txt") or status != 200 \
                    else "text/html"
                writer.write(
                    f"HTTP/1.1 {status} {'OK' if status == 200 else 'Not Found'}\r\n"
                    f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: keep-alive\r\n\r\n".encode()
                    + (body if method != "HEAD" else b""))
                log.write(f"{status} {target}\n")
                await writer.drain()
                if b"connection: close" in rest.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, HOST, port, backlog=1024)
        async with server:
            await server.serve_forever()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(main())


class Site:
    """The server process for one size, and a count of the pages it answered."""

    def __init__(self, work: Path, pages: int) -> None:
        self.pages, self.port = pages, free_port()
        self.url = f"http://{HOST}:{self.port}/"
        self.log = work / f"access-{pages}.log"
        self.log.touch()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(pages), "--port", str(self.port),
             "--serve-log", str(self.log)], stdout=subprocess.DEVNULL)
        wait_port(self.port, self.proc)

    def answered(self, offset: int) -> int:
        """HTML pages answered 200 since ``offset`` (robots.txt not counted)."""
        with self.log.open("rb") as f:
            f.seek(offset)
            data = f.read()
        return data.count(b"\n200 /") + data.startswith(b"200 /") \
            - data.count(b"200 /robots.txt")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --- sampling ------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` and its living descendants, in KiB (0 once gone)."""
    total = 0
    for p in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            out += [int(child), *descendants(int(child))]
    return out


def sample(proc: subprocess.Popen, site: Site, offset: int, interval: float) -> list:
    """[(seconds, pages answered, RSS KiB)] until ``proc`` exits."""
    samples = []
    t0 = time.monotonic()
    while proc.poll() is None:
        rss = rss_kib(proc.pid)
        if rss:
            samples.append((round(time.monotonic() - t0, 2), site.answered(offset), rss))
        time.sleep(interval)
    return samples


def run(tool: str, site: Site, work: Path, workers: int, rep: int, interval: float,
        scrapy_venv: Path | None) -> dict:
    name = f"{tool}-{site.pages}-{rep}"
    if tool == "evidence":
        cmd = [*evidence_command(), "crawl", site.url, "--store", str(work / name),
               "--workers", str(workers), "--per-host", str(workers), "--json"]
        env = None
    else:
        assert scrapy_venv is not None
        cmd = scrapy_command(scrapy_venv, site.url, work / f"{name}-job",
                             work / f"{name}.stats.json", workers)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    load = load_average()
    offset = site.log.stat().st_size
    with (work / f"{name}.err").open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            samples = sample(proc, site, offset, interval)
        finally:
            if proc.poll() is None:  # interrupted: leave no crawl behind
                proc.kill()
                proc.wait()
    if proc.returncode != 0:
        print((work / f"{name}.err").read_text()[-2000:], file=sys.stderr)
    return {"tool": tool, "pages": site.pages, "rep": rep, "exit": proc.returncode,
            "answered": site.answered(offset), "load_1m": load, "samples": samples}


def at_pages(samples: list, pages: int) -> int | None:
    """RSS (KiB) of the first sample at or past ``pages`` answered."""
    return next((rss for _t, n, rss in samples if n >= pages), None)


def summary(result: dict, warm: int) -> dict:
    samples = result["samples"]
    if not samples:
        return {"warm_mb": None, "end_mb": None, "ratio": None, "mb_per_10k": None}
    end_pages, end_rss = samples[-1][1], samples[-1][2]
    # the largest RSS of the last tenth: the final sample may be the exit's teardown
    tail = [rss for _t, n, rss in samples if n >= 0.9 * end_pages] or [end_rss]
    end_rss = max(tail)
    warm_rss = at_pages(samples, warm) or samples[0][2]
    grown = (end_rss - warm_rss) / 1024
    span = max(1, end_pages - warm)
    return {"warm_mb": round(warm_rss / 1024, 1), "end_mb": round(end_rss / 1024, 1),
            "ratio": round(end_rss / warm_rss, 3),
            "mb_per_10k": round(grown * 10_000 / span, 2)}


def curve(result: dict) -> str:
    samples, pages = result["samples"], result["pages"]
    points = []
    for tenth in range(1, 11):
        rss = at_pages(samples, pages * tenth // 10)
        if rss is not None:
            points.append(f"{pages * tenth // 10}:{rss / 1024:.0f}")
    return " ".join(points)


# --- tracemalloc: where the growth is --------------------------------------------------


def trace(pages: int, work: Path, workers: int, warm: int, top: int) -> None:
    """Crawl in this process with tracemalloc on; print what grew from ``warm`` pages to
    the end, by allocation site (tracemalloc slows the crawl several times)."""
    import tracemalloc

    from evidence._cli.main import main as cli

    site = Site(work, pages)
    snapshots: dict[str, tracemalloc.Snapshot] = {}
    stop = threading.Event()

    def watch() -> None:
        offset = 0
        while not stop.wait(0.5):
            if "warm" not in snapshots and site.answered(offset) >= warm:
                snapshots["warm"] = tracemalloc.take_snapshot()

    tracemalloc.start(1)  # one frame: deeper tracebacks slow the crawl ten times
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with contextlib.suppress(SystemExit):
            cli(["crawl", site.url, "--store", str(work / "traced"), "--workers",
                 str(workers), "--per-host", str(workers), "--json"])
    finally:
        stop.set()
        watcher.join()
        site.close()
    end = tracemalloc.take_snapshot()
    if "warm" not in snapshots:
        print("the crawl ended before the warm point")
        return
    filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
    stats = end.filter_traces(filters).compare_to(
        snapshots["warm"].filter_traces(filters), "lineno")
    for stat in stats[:top]:
        print(f"{stat.size_diff / 1024:+10.0f} KiB {stat.count_diff:+8d} blocks")
        for line in stat.traceback.format():
            print("    " + line)


# --- main ----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one site of 2,000 pages, warm at 500")
    p.add_argument("--pages", default=None,
                   help="HTML pages in the site; several, comma-separated, one site each "
                   "(default 20000)")
    p.add_argument("--workers", type=int, default=8, help="requests in flight (default 8)")
    p.add_argument("--reps", type=int, default=1, help="repetitions, interleaved (default 1)")
    p.add_argument("--warm", type=int, default=None,
                   help="pages after which the crawl counts as warm (default 10000)")
    p.add_argument("--interval", type=float, default=0.5,
                   help="seconds between samples (default 0.5)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the runs as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (stores, logs)")
    p.add_argument("--scrapy-venv", type=Path,
                   help="a venv with Scrapy: sample its crawl too, interleaved")
    p.add_argument("--tracemalloc", type=int, metavar="N",
                   help="instead: one crawl in this process, the N allocation sites that "
                   "grew most after warm-up")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--serve-log", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.pages = args.pages or ("2000" if args.quick else "20000")
    args.warm = args.warm or (500 if args.quick else 10_000)
    try:
        args.sizes = [int(x) for x in args.pages.split(",") if x.strip()]
    except ValueError:
        p.error(f"--pages: not page counts: {args.pages!r}")
    if not args.sizes or min(args.sizes) < 1 or args.reps < 1 or args.workers < 1:
        p.error("--pages, --reps and --workers must be positive")
    if args.scrapy_venv and not (args.scrapy_venv / "bin" / "scrapy").exists():
        p.error(f"--scrapy-venv: no scrapy in {args.scrapy_venv}; install it with: python -m "
                f"venv {args.scrapy_venv} && {args.scrapy_venv}/bin/pip install scrapy")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.serve_log)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cleanups run on a kill
    work = Path(tempfile.mkdtemp(prefix="bench-memory-")).absolute()
    try:
        if args.tracemalloc:
            trace(args.sizes[0], work, args.workers, args.warm, args.tracemalloc)
            return 0
        print(f"bytecode: {precompile()}", flush=True)
        print("$ " + shlex.join([*evidence_command(), "crawl", "URL", "--store", "NEW",
                                 "--workers", str(args.workers), "--per-host",
                                 str(args.workers), "--json"]), flush=True)
        tools = ["evidence", *(["scrapy"] if args.scrapy_venv else [])]
        sites = {n: Site(work, n) for n in args.sizes}
        results = []
        try:
            plan = [(n, t) for n in args.sizes for t in tools]
            for rep in range(args.reps):
                for n, tool in plan[rep % len(plan):] + plan[:rep % len(plan)]:
                    result = run(tool, sites[n], work, args.workers, rep, args.interval,
                                 args.scrapy_venv)
                    result["summary"] = summary(result, args.warm)
                    results.append(result)
                    s = result["summary"]
                    print(f"{tool} {n} pages #{rep} (exit {result['exit']}, "
                          f"{result['answered']} answered, load {result['load_1m']:.1f}): "
                          f"RSS {s['warm_mb']} MB at {args.warm} pages, {s['end_mb']} MB at "
                          f"the end (x{s['ratio']}; {s['mb_per_10k']:+} MB per 10,000 "
                          f"pages)\n  curve (pages:MB): {curve(result)}", flush=True)
        finally:
            for site in sites.values():
                site.close()
        for tool in tools:
            for n in args.sizes:
                mine = [r["summary"] for r in results if r["tool"] == tool and r["pages"] == n]
                ends = [s["end_mb"] for s in mine if s["end_mb"] is not None]
                if ends:
                    print(f"{tool} {n} pages: end RSS median {statistics.median(ends)} MB "
                          f"(min {min(ends)}, max {max(ends)}, {len(ends)} runs)")
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
            print(f"wrote {args.json}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
