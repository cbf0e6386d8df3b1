#!/usr/bin/env python3
"""Peak memory of a crawl of decompression bombs, against a crawl of as many normal pages
(issue 30, "bounded memory per page").

A bomb is a small body that decodes to a great deal: here ``--bomb-mib`` MiB of NUL bytes
(1,024 by default), compressed once, gzip (about 1 MB for 1 GiB: zlib's ratio on zeros is
about 1,030) or zlib-wrapped deflate, the two codings the crawler asks for
(``Accept-Encoding: gzip, deflate``), served as ``text/html`` so that the crawler parses
what it decodes. A normal page is 3-5 KB of HTML with ten links, gzip-compressed as most
servers send it.

A site of ``--pages`` N pages is served on 127.0.0.1 by a threaded ``http.server`` in this
process (all bodies built before any crawl): ``/`` links to ``/p/0`` .. ``/p/N-1``, and
each of those is a bomb (gzip and deflate alternating) in the bomb site, a normal page in
the baseline site; ``robots.txt`` is a 404. Each crawl is

    evidence crawl http://127.0.0.1:PORT/{bombs,normal}/ --store NEW --workers W
        --per-host W --max-depth 1 [--max-content-bytes ...]

as a subprocess, its peak RSS read two ways: VmHWM from /proc/PID/status, sampled every
20 ms while it runs (the last sample before it exits), and ``ru_maxrss`` from ``wait4``
(the kernel's own high-water mark, the figure reported). Baseline and bomb crawls
alternate for ``--reps`` repetitions in one run; the report gives each run (wall time,
pages answered 200, contents recorded truncated, peak RSS), the medians, the ratio of the
bomb crawl's peak to the baseline's, and the 1-minute load average before each crawl (2
cores shared with other work skew a run: compare the figures of one run only).

Options: --pages N (64), --workers N (16), --reps N (1), --bomb-mib N (1024), --quick
(16 pages, 256 MiB bombs), --json FILE, --crawl-arg ARG (repeatable, passed to both
crawls, e.g. --crawl-arg=--max-content-bytes=1048576), --keep (keep the temp dir).

Network: only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

HOST = "127.0.0.1"


def _nul_bomb(mib: int, wbits: int) -> bytes:
    """``mib`` MiB of NUL bytes compressed (gzip, or zlib-wrapped deflate with ``wbits``
    15), built in the time of a checksum: after a full flush the compressor starts afresh,
    so every further MiB of zeros compresses to the same bytes."""
    block = bytes(1024 * 1024)
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    first = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    gz = wbits > zlib.MAX_WBITS
    end = packer.flush()[:-8 if gz else -4]  # the last (empty) block, without its trailer
    check = 0 if gz else 1
    for _ in range(mib):
        check = zlib.crc32(block, check) if gz else zlib.adler32(block, check)
    trailer = (struct.pack("<II", check, mib * (1024 * 1024) & 0xFFFFFFFF) if gz
               else struct.pack(">I", check))
    return first + again * (mib - 1) + end + trailer


def bomb(mib: int, coding: str) -> bytes:
    """``mib`` MiB of NUL bytes, gzip or zlib-wrapped deflate."""
    return _nul_bomb(mib, 16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS)


def normal_page(i: int, n: int, rng: random.Random) -> bytes:
    words = ("archive", "bridge", "candle", "delta", "ember", "falcon", "garden", "harbor",
             "the", "of", "and", "a", "to", "in", "is", "for", "on", "with")
    text = " ".join(rng.choice(words) for _ in range(rng.randint(500, 750)))
    links = "".join(f'<li><a href="/normal/p/{(i + k) % n}">page {(i + k) % n}</a></li>'
                    for k in range(1, 11))
    return (f"<!doctype html><html><head><title>page {i}</title></head><body>"
            f"<h1>page {i}</h1><p>{text}</p><ul>{links}</ul></body></html>").encode()


class Site:
    """``/bombs/`` and ``/normal/``: an index linking to N pages each; bodies in memory."""

    def __init__(self, pages: int, bomb_mib: int) -> None:
        rng = random.Random(30)
        self.pages = pages
        self.bombs = {"gzip": bomb(bomb_mib, "gzip"), "deflate": bomb(bomb_mib, "deflate")}
        self.normal = [zlib.compress(normal_page(i, pages, rng), 6, 16 + zlib.MAX_WBITS)
                       for i in range(pages)]

    def index(self, kind: str) -> bytes:
        links = "".join(f'<a href="/{kind}/p/{i}">{i}</a>\n' for i in range(self.pages))
        return f"<!doctype html><html><body>{links}</body></html>".encode()

    def answer(self, path: str) -> tuple[int, dict[str, str], bytes]:
        kind, _, rest = path.strip("/").partition("/")
        if kind not in ("bombs", "normal"):
            return 404, {"Content-Type": "text/plain"}, b"not found"
        if rest == "":
            return 200, {"Content-Type": "text/html"}, self.index(kind)
        number = rest.removeprefix("p/")
        if not number.isdigit() or int(number) >= self.pages:
            return 404, {"Content-Type": "text/plain"}, b"not found"
        i = int(number)
        if kind == "normal":
            return 200, {"Content-Type": "text/html", "Content-Encoding": "gzip"}, self.normal[i]
        coding = "gzip" if i % 2 == 0 else "deflate"
        return 200, {"Content-Type": "text/html", "Content-Encoding": coding}, self.bombs[coding]


@contextlib.contextmanager
def serve(site: Site) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            status, headers, body = site.answer(self.path)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def evidence_command() -> list[str]:
    script = Path(sys.executable).parent / "evidence"
    return [str(script)] if script.exists() else [sys.executable, "-m", "evidence"]


def vm_hwm(pid: int) -> int | None:
    """The process's peak resident set (VmHWM), in KiB, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


@dataclass
class Run:
    kind: str  # "normal" or "bombs"
    rep: int
    wall_s: float
    exit_status: int
    pages_200: int
    contents_truncated: int
    vm_hwm_mib: float  # the last VmHWM sampled
    maxrss_mib: float  # wait4's ru_maxrss
    load_1min: float


def crawl(url: str, store: Path, workers: int, extra: list[str], log: Path) -> tuple[
        float, int, int, int]:
    """Run one crawl; (wall s, exit status, last VmHWM KiB, ru_maxrss KiB)."""
    cmd = [*evidence_command(), "crawl", url, "--store", str(store), "--workers", str(workers),
           "--per-host", str(workers), "--max-depth", "1", *extra]
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        hwm = 0
        while True:
            sample = vm_hwm(proc.pid)  # the process is ours until reaped: never reused
            if sample is not None:
                hwm = max(hwm, sample)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, proc.returncode, hwm, usage.ru_maxrss


def counts(store: Path) -> tuple[int, int]:
    import apsw

    conn = apsw.Connection(str(store / "evidence.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        ((ok, cut),) = conn.execute(
            "SELECT count(*), coalesce(sum(content_truncated), 0) FROM fetch_attempt "
            "WHERE http_status = 200 AND url LIKE '%/p/%'").fetchall()
    finally:
        conn.close()
    return ok, cut


def load_average() -> float:
    with contextlib.suppress(OSError):
        return os.getloadavg()[0]
    return float("nan")


def run(args: argparse.Namespace, work: Path) -> dict:
    t0 = time.perf_counter()
    site = Site(args.pages, args.bomb_mib)
    built = time.perf_counter() - t0
    runs: list[Run] = []
    with serve(site) as base:
        for rep in range(args.reps):
            for kind in ("normal", "bombs"):
                store = work / f"{kind}-{rep}"
                load = load_average()
                wall, status, hwm, maxrss = crawl(f"{base}/{kind}/", store, args.workers,
                                                  args.crawl_arg, work / f"{kind}-{rep}.log")
                ok, cut = counts(store) if (store / "evidence.db").exists() else (0, 0)
                runs.append(Run(kind, rep, round(wall, 2), status, ok, cut,
                                round(hwm / 1024, 1), round(maxrss / 1024, 1), load))
                print(f"  {kind:6} rep {rep}: {wall:6.2f} s, exit {status}, {ok} pages 200, "
                      f"{cut} contents truncated, peak RSS {maxrss / 1024:.0f} MiB (VmHWM "
                      f"{hwm / 1024:.0f}), load {load:.2f}", file=sys.stderr)
    median = {kind: statistics.median(r.maxrss_mib for r in runs if r.kind == kind)
              for kind in ("normal", "bombs")}
    return {
        "command": " ".join([*evidence_command(), "crawl", "URL", "--store", "NEW",
                             "--workers", str(args.workers), "--per-host", str(args.workers),
                             "--max-depth", "1", *args.crawl_arg]),
        "pages": args.pages, "workers": args.workers, "reps": args.reps,
        "bomb_mib": args.bomb_mib,
        "bomb_bytes": {k: len(v) for k, v in site.bombs.items()},
        "normal_page_bytes": round(statistics.mean(len(p) for p in site.normal)),
        "site_built_s": round(built, 2), "cpus": os.cpu_count(),
        "runs": [asdict(r) for r in runs],
        "median_peak_rss_mib": median,
        "ratio_bombs_to_normal": round(median["bombs"] / median["normal"], 2),
    }


def render(report: dict) -> str:
    lines = [f"{report['pages']} pages, --workers {report['workers']}, {report['reps']} rep(s); "
             f"bombs of {report['bomb_mib']} MiB of NULs: gzip {report['bomb_bytes']['gzip']:,} "
             f"bytes, deflate {report['bomb_bytes']['deflate']:,} bytes; normal pages "
             f"{report['normal_page_bytes']:,} bytes gzipped; {report['cpus']} CPUs",
             f"command: {report['command']}",
             "kind    rep  wall s  exit  200s  truncated  peak RSS MiB  VmHWM MiB  load"]
    for r in report["runs"]:
        lines.append(f"{r['kind']:7} {r['rep']:3} {r['wall_s']:7.2f} {r['exit_status']:5} "
                     f"{r['pages_200']:5} {r['contents_truncated']:10} {r['maxrss_mib']:13.1f} "
                     f"{r['vm_hwm_mib']:10.1f} {r['load_1min']:5.2f}")
    m = report["median_peak_rss_mib"]
    lines.append(f"median peak RSS: normal {m['normal']:.1f} MiB, bombs {m['bombs']:.1f} MiB; "
                 f"bombs / normal = {report['ratio_bombs_to_normal']:.2f}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, help="pages per site, besides its index (default 64)")
    p.add_argument("--workers", type=int, default=16, help="--workers of each crawl (16)")
    p.add_argument("--reps", type=int, default=1, help="repetitions, alternating (1)")
    p.add_argument("--bomb-mib", type=int, help="MiB of NULs a bomb decodes to (1024)")
    p.add_argument("--quick", action="store_true", help="16 pages, 256 MiB bombs")
    p.add_argument("--crawl-arg", action="append", default=[], metavar="ARG",
                   help="an argument for both crawls, e.g. --crawl-arg=--max-links=100")
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (stores, logs)")
    args = p.parse_args(argv)
    args.pages = args.pages or (16 if args.quick else 64)
    args.bomb_mib = args.bomb_mib or (256 if args.quick else 1024)
    if min(args.pages, args.workers, args.reps, args.bomb_mib) < 1:
        p.error("--pages, --workers, --reps and --bomb-mib must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-bombs-"))
    try:
        report = run(args, work)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
