#!/usr/bin/env python3
"""Benchmark the crawler (issues 3, 15 and 35): evidence against Scrapy and two crawlers
that record nothing (the floor on raw asyncio streams, and httpx), and the cost of a resume.

Throughput. For each ``--pages`` size (600 and 5,000 by default) a static site of that many
HTML pages (``/p/0.html`` .. plus ``/`` and a ``robots.txt`` allowing everything; pages of
3-5 KB of text, each linking to ~10 others, absolute and relative hrefs; every page
reachable from ``/``) is generated into a temp dir and served on 127.0.0.1 by nginx from
the OS packages (one worker, keep-alive on, access log in the temp dir with a millisecond
timestamp per request). Without nginx, a small asyncio static server (files held in
memory) in a separate process stands in, and the report says so. Every crawler then
crawls the whole site at the same concurrency N (8 by default):

  evidence  ``evidence crawl URL --store NEW --workers N --per-host N`` as a subprocess,
            recording full evidence (request head, response head and body in artifact
            packs, attempts, links, frontier transitions, Merkle log), at the default
            ``--sync full``; with ``--processes P`` also ``evidence-pP``, the same with P
            worker processes;
  scrapy    ``scrapy runspider tools/_scrapy_spider.py`` in a separate venv
            (``--scrapy-venv``, created with ``python -m venv`` + ``pip install scrapy``
            when absent) with JOBDIR (its disk request queue and dupe filter),
            CONCURRENT_REQUESTS=N, CONCURRENT_REQUESTS_PER_DOMAIN=N, DOWNLOAD_DELAY=0,
            ROBOTSTXT_OBEY=True, AUTOTHROTTLE off, HTTPCACHE off, LOG_LEVEL=WARNING.
            Scrapy keeps no bodies: it is the common way Scrapy runs, not an equal load;
  bare      ``tools/bare_crawler.py``: httpx, N tasks, links by selectolax's lexbor,
            robots.txt obeyed, nothing recorded;
  floor     ``tools/floor_crawler.py``: the same work on raw asyncio streams, no HTTP
            library (N keep-alive HTTP/1.1 connections, Content-Length and chunked
            bodies, robots.txt obeyed, links by lexbor as evidence follows them): the
            floor every other crawler's pages/s and CPU per page are compared with.

Before any run is timed, the evidence package is compiled to bytecode (``compileall``), as
an installed package is: the others run from bytecode pip wrote at install, and an
editable checkout under PYTHONDONTWRITEBYTECODE would otherwise compile every module again
at each start (``precompile``). Same site and server, interleaved (the order rotated
each repetition) for ``--reps`` repetitions, each run into a fresh store / JOBDIR, all
kept until the end (a delete
between runs would slow the next run's file creations: see KEEP_NOTE). Reported per run:
pages/s over the process's wall time (start to exit, the figure the ratios use), pages/s
over the server's window (first to last request in the access log: no start-up or
shut-down), CPU seconds and peak RSS of the crawler process and its children (``wait4``),
and the checks: the distinct HTML URLs the
server answered 200 (the page count the rates use) must equal the site's documents, and
the crawler's own count must agree: evidence ``SELECT count(*) FROM fetch_attempt WHERE
http_status = 200``, scrapy its ``downloader/response_status_count/200`` stat (both
include robots.txt, so documents + 1). URLs the server saw requested twice are reported
(Scrapy fetches its start URL twice by default: start requests bypass the dupe filter, so
``/`` found as a link is requested again).

Resume cost. A store whose open session has ``--resume-urls`` queued URLs: a real
``evidence crawl URL --max-documents 1`` run (robots.txt and ``/`` are fetched and
recorded, the run ends capped), then the frontier is filled through ``evidence.Writer``
with ``FrontierUpdate`` messages of 10,000 ``QueuedUrl`` each, under a run recorded as
``tools/bench_crawl.py frontier filler`` (started and ended stopped). Then, max(2,
``--reps``) times: start ``evidence crawl --store S`` (no URL: resume), and time from just before
the process is spawned to the first request the server logs (nginx's ``$msec``), then
SIGKILL the crawler. The first resume follows a stopped run; later ones follow a SIGKILL
(the open run is closed as failed and the URLs in flight are requeued first). The same
measurement on a 1,000-URL frontier gives the fixed part (interpreter, imports, opening
the store).

Then the medians per tool with their range over the repetitions (min-max), and the ratios
the issues state their bars in (evidence/scrapy pages/s >= 1.2, CPU per page <= 1.0;
evidence/bare pages/s >= 0.9; every crawler's pages/s and CPU per page against the
floor), each bar marked met or not, with peak RSS beside them. On a shared machine only
ratios from one interleaved run mean anything: the 1-minute load average is printed with
each run, and its range over the runs with the medians.

Options: --pages N[,N...] (600,5000), --concurrency N (8), --reps N (3), --processes P,
--resume-urls N (1000000; the resume part runs only with --only resume), --quick (300
pages, 1 rep, 20,000 resume URLs), --json FILE, --keep (keep the temp dir), --scrapy-venv
DIR, --only evidence|scrapy|bare|floor|resume (repeatable), --server auto|nginx|python.

Network: only 127.0.0.1. The site has no link to any other host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import random
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPIDER = HERE / "_scrapy_spider.py"
HOST = "127.0.0.1"
CHUNK = 10_000  # QueuedUrl per FrontierUpdate when filling the resume frontier
LOG_FORMAT = "$msec $status $request_uri"

_WORDS = (
    "archive", "bridge", "candle", "delta", "ember", "falcon", "garden", "harbor",
    "island", "juniper", "kettle", "lantern", "meadow", "nectar", "orchard", "pepper",
    "quarry", "river", "saddle", "timber", "umber", "valley", "willow", "yarrow",
    "zephyr", "anchor", "beacon", "cobalt", "dune", "estuary", "fjord", "glacier",
    "the", "of", "and", "a", "to", "in", "is", "for", "on", "with", "as", "by", "at",
)  # fmt: skip


# --- the site ------------------------------------------------------------------------------


def _text(rng: random.Random, words: int) -> str:
    out = [rng.choice(_WORDS) for _ in range(words)]
    out[0] = out[0].capitalize()
    return " ".join(out) + "."


def page_links(i: int, n: int) -> list[str]:
    """Hrefs of page i, as written: a binary tree (2i+1, 2i+2) makes all reachable."""
    targets = [2 * i + 1, 2 * i + 2, i + 1, i - 1, (7 * i + 3) % n, (31 * i + 17) % n,
               (i * i + 5) % n]
    hrefs = ["/", "/p/0.html"]
    for k, t in enumerate(targets):
        if 0 <= t < n and t != i:
            hrefs.append(f"/p/{t}.html" if k % 2 == 0 else f"{t}.html")  # relative: /p/
    hrefs.append("#top")
    return hrefs


def render_page(title: str, hrefs: list[str], rng: random.Random) -> str:
    paragraphs = "\n".join(f"<p>{_text(rng, rng.randint(70, 110))}</p>"
                           for _ in range(rng.randint(4, 6)))
    links = "\n".join(f'  <li><a href="{h}">{h.rsplit("/", 1)[-1] or "home"}</a></li>'
                      for h in hrefs)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            f"<title>{title}</title>\n<meta name=\"description\" "
            f"content=\"{_text(rng, 12)}\"></head>\n<body id=\"top\">\n"
            f"<header><nav><a href=\"/\">Home</a> | <a href=\"/p/0.html\">Start</a></nav>"
            f"</header>\n<main><h1>{title}</h1>\n{paragraphs}\n<h2>See also</h2>\n<ul>\n"
            f"{links}\n</ul></main>\n<footer><p>{_text(rng, 20)}</p></footer>\n"
            f"</body></html>\n")


def generate_site(root: Path, pages: int) -> dict:
    """Write the site; return what a complete crawl must see."""
    (root / "p").mkdir(parents=True)
    rng = random.Random(20261202)
    total = 0
    index = render_page("Index", ["/p/0.html", *[f"/p/{j}.html" for j in range(1, min(
        pages, 20))]], rng)
    (root / "index.html").write_text(index)
    total += len(index)
    for i in range(pages):
        html = render_page(f"Page {i}", page_links(i, pages), rng)
        (root / "p" / f"{i}.html").write_bytes(html.encode())
        total += len(html)
    (root / "robots.txt").write_text("User-agent: *\nAllow: /\n")
    for path in [root, *root.rglob("*")]:  # nginx workers may run as another user
        path.chmod(0o755 if path.is_dir() else 0o644)
    return {"pages": pages, "documents": pages + 1, "html_bytes": total,
            "mean_page_bytes": round(total / (pages + 1))}


# --- servers -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {HOST}:{port} after {timeout} s")


class Server:
    """nginx when installed, else the asyncio fallback; both write ``LOG_FORMAT`` lines."""

    def __init__(self, work: Path, site: Path, kind: str = "auto") -> None:
        self.work, self.site = work, site
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}/"
        self.log = work / "access.log"
        self.log.touch()
        self.nginx = shutil.which("nginx") or (
            "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
        if kind == "nginx" and not self.nginx:
            raise RuntimeError("nginx is not installed: apt-get install -y nginx")
        if kind == "python":
            self.nginx = None
        if self.nginx:
            version = subprocess.run([self.nginx, "-v"], capture_output=True, text=True)
            self.name = (version.stderr.strip().split(":", 1)[-1].strip()
                         or "nginx") + " (1 worker, keep-alive, sendfile)"
            self.proc = self._start_nginx()
        else:
            why = "--server python" if kind == "python" else "fallback: nginx not installed"
            self.name = (f"Python asyncio static server ({why}; files in memory, "
                         "keep-alive, one process)")
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--serve", str(site), "--port", str(self.port),
                 "--serve-log", str(self.log)], stdout=subprocess.DEVNULL)
        wait_port(self.port, self.proc)

    def _start_nginx(self) -> subprocess.Popen:
        prefix = self.work / "nginx"
        for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (prefix / d).mkdir(parents=True, exist_ok=True)
        conf = prefix / "nginx.conf"
        conf.write_text(f"""\
daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    types {{ text/html html; text/plain txt; }}
    default_type application/octet-stream;
    log_format bench '{LOG_FORMAT}';
    access_log {self.log} bench;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 75s;
    keepalive_requests 1000000;
    open_file_cache max=20000 inactive=60s;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    server {{
        listen {HOST}:{self.port};
        root {self.site};
        index index.html;
        location / {{ try_files $uri $uri/ =404; }}
    }}
}}
""")
        self.command = [self.nginx, "-e", str(prefix / "error.log"), "-p", str(prefix),
                        "-c", str(conf)]
        return subprocess.Popen(self.command, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    def mark(self) -> int:
        return self.log.stat().st_size

    def requests_since(self, offset: int) -> list[tuple[float, int, str]]:
        with self.log.open("rb") as f:
            f.seek(offset)
            data = f.read()
        out = []
        for line in data.decode("utf-8", "replace").splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3:
                out.append((float(parts[0]), int(parts[1]), parts[2]))
        return out

    def first_request_after(self, offset: int, timeout: float,
                            proc: subprocess.Popen) -> tuple[float, str] | None:
        """Poll the log (every 2 ms) for the first request logged after ``offset``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log.stat().st_size > offset:
                requests = self.requests_since(offset)
                if requests:
                    return requests[0][0], requests[0][2]
            if proc.poll() is not None:
                return None
            time.sleep(0.002)
        return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT if self.nginx else signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve(site: Path, port: int, log_path: Path) -> None:
    """The fallback server: static files held in memory, HTTP/1.1 keep-alive, asyncio."""
    files: dict[str, bytes] = {}
    for path in site.rglob("*"):
        if path.is_file():
            files["/" + path.relative_to(site).as_posix()] = path.read_bytes()
    files["/"] = files["/index.html"]
    log = log_path.open("a", buffering=1)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, _, rest = head.partition(b"\r\n")
                method, target, _version = request_line.decode("latin-1").split(" ", 2)
                body = files.get(target.split("?", 1)[0])
                status = 200 if body is not None else 404
                body = body if body is not None else b"not found\n"
                ctype = ("text/html" if target.endswith((".html", "/"))
                         else "text/plain")
                writer.write(
                    f"HTTP/1.1 {status} {'OK' if status == 200 else 'Not Found'}\r\n"
                    f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    f"Connection: keep-alive\r\n\r\n".encode()
                    + (body if method != "HEAD" else b""))
                log.write(f"{time.time():.3f} {status} {target}\n")
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


# --- running one crawl ---------------------------------------------------------------------


@dataclass
class Run:
    tool: str
    rep: int
    wall_s: float
    cpu_s: float
    status_200: int  # 200 responses by the crawler's own count, robots.txt included
    pages: int  # distinct HTML URLs answered 200, from the server log (rates use this)
    tool_pages: int  # pages by the crawler's own count (evidence: rows; scrapy: items)
    server_requests: int
    server_window_s: float
    duplicates: int  # URLs the server saw requested more than once in this run
    exit_status: int
    store_bytes: int = 0
    extra: dict = field(default_factory=dict)
    load_1m: float = 0.0  # the machine's 1-minute load average as the run started
    peak_rss_kb: int = 0  # the crawler process's peak resident set (wait4's ru_maxrss)
    size: int = 0  # pages in the site

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.wall_s if self.wall_s else 0.0

    @property
    def server_pages_per_s(self) -> float:
        return self.pages / self.server_window_s if self.server_window_s else 0.0


def evidence_command() -> list[str]:
    script = Path(sys.executable).parent / "evidence"
    return [str(script)] if script.exists() else [sys.executable, "-m", "evidence"]


def precompile() -> str:
    """Compile the evidence package's modules to bytecode before any run is timed, as
    installing a package does (pip compiles at install; Scrapy and httpx run from theirs).
    An editable checkout writes its own on a first run, unless PYTHONDONTWRITEBYTECODE is
    set (as on the machines these benchmarks ran on): then every crawl would compile
    about 90 modules again, ~0.15 s of its start that no installed evidence pays."""
    import compileall

    import evidence

    package = Path(evidence.__file__).parent
    ok = compileall.compile_dir(str(package), quiet=1)
    return (f"{package} compiled ({'ok' if ok else 'with errors'}; "
            f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')})")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], server: Server, *, stdout, stderr,
          env: dict | None = None) -> tuple[float, float, int, list, int]:
    """Run ``cmd``; (wall s, CPU s, exit status, server requests, peak RSS in KiB). CPU and
    peak RSS are the process's own and its reaped children's (``wait4``: evidence's
    worker processes count)."""
    offset = server.mark()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    time.sleep(0.05)  # the server's last log lines
    return wall, cpu, proc.returncode, server.requests_since(offset), usage.ru_maxrss


def load_average() -> float:
    """The 1-minute load average: other work on a shared machine skews a run."""
    with contextlib.suppress(OSError):
        return os.getloadavg()[0]
    return float("nan")


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def evidence_counts(store: Path) -> tuple[int, int]:
    import apsw

    conn = apsw.Connection(str(store / "evidence.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        (all_200,), = conn.execute(
            "SELECT count(*) FROM fetch_attempt WHERE http_status = 200").fetchall()
        (robots,), = conn.execute(
            "SELECT count(*) FROM fetch_attempt WHERE http_status = 200 "
            "AND url LIKE '%/robots.txt'").fetchall()
    finally:
        conn.close()
    return all_200, all_200 - robots


def window(requests: list) -> tuple[float, int, int]:
    """(first-to-last request seconds, URLs requested twice, distinct HTML URLs with 200)."""
    if len(requests) < 2:
        return 0.0, 0, 0
    stamps = [r[0] for r in requests]
    dups = sum(1 for c in Counter(r[2] for r in requests).values() if c > 1)
    pages = len({r[2] for r in requests if r[1] == 200 and r[2] != "/robots.txt"})
    return max(stamps) - min(stamps), dups, pages


# Each run's store (and Scrapy's JOBDIR) is kept until the whole benchmark ends. Deleting
# a store removes ~20,000 files and directories; on ext4 without a journal (as on the
# machines this runs on) the inode allocator then skips every inode freed in the last 60-360
# seconds one by one, so the next run's file creations would pay for the harness's deletes
# (perf showed that scan at ~15% of the worker processes' CPU).
KEEP_NOTE = "stores kept until the end (no deletes between runs)"


def run_evidence(server: Server, work: Path, n: int, rep: int, processes: int = 0) -> Run:
    tool = "evidence" if not processes else f"evidence-p{processes}"
    store = work / f"{tool}-{rep}"
    cmd = [*evidence_command(), "crawl", server.url, "--store", str(store),
           "--workers", str(n), "--per-host", str(n), "--json",
           *(["--processes", str(processes)] if processes else [])]
    load = load_average()
    with (work / f"{tool}-{rep}.out").open("w") as out, \
            (work / f"{tool}-{rep}.err").open("w") as err:
        wall, cpu, rc, requests, rss = timed(cmd, server, stdout=out, stderr=err)
    all_200, tool_pages = evidence_counts(store)
    span, dups, pages = window(requests)
    result = {}
    with contextlib.suppress(Exception):
        result = json.loads((work / f"{tool}-{rep}.out").read_text())
    if rc != 0:
        print((work / f"{tool}-{rep}.err").read_text()[-2000:], file=sys.stderr)
    run = Run(tool, rep, wall, cpu, all_200, pages, tool_pages, len(requests), span,
              dups, rc, dir_bytes(store), {"outcome": result.get("outcome")}, load, rss)
    return run  # the store is kept until the end: see KEEP_NOTE


def scrapy_command(venv: Path, url: str, jobdir: Path, stats: Path, n: int) -> list[str]:
    settings = {
        "JOBDIR": str(jobdir), "CONCURRENT_REQUESTS": n, "CONCURRENT_REQUESTS_PER_DOMAIN": n,
        "DOWNLOAD_DELAY": 0, "ROBOTSTXT_OBEY": True, "AUTOTHROTTLE_ENABLED": False,
        "HTTPCACHE_ENABLED": False, "LOG_LEVEL": "WARNING", "TELNETCONSOLE_ENABLED": False,
    }
    cmd = [str(venv / "bin" / "scrapy"), "runspider", str(SPIDER), "-a", f"start_url={url}",
           "-a", f"stats_file={stats}"]
    for k, v in settings.items():
        cmd += ["-s", f"{k}={v}"]
    return cmd


def run_scrapy(server: Server, work: Path, venv: Path, n: int, rep: int) -> Run:
    jobdir, stats_file = work / f"scrapy-job-{rep}", work / f"scrapy-{rep}.stats.json"
    cmd = scrapy_command(venv, server.url, jobdir, stats_file, n)
    load = load_average()
    with (work / f"scrapy-{rep}.err").open("w") as err:
        wall, cpu, rc, requests, rss = timed(
            cmd, server, stdout=subprocess.DEVNULL, stderr=err,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    if rc != 0 or not stats:
        print((work / f"scrapy-{rep}.err").read_text()[-2000:], file=sys.stderr)
    all_200 = int(stats.get("downloader/response_status_count/200", 0))
    tool_pages = int(stats.get("item_scraped_count", 0))
    span, dups, pages = window(requests)
    run = Run("scrapy", rep, wall, cpu, all_200, pages, tool_pages, len(requests), span,
              dups, rc, dir_bytes(jobdir) if jobdir.exists() else 0,
              {"finish_reason": stats.get("finish_reason"),
               "dupefilter_filtered": stats.get("dupefilter/filtered")}, load, rss)
    return run  # kept until the end, as evidence's stores are


def bare_command(url: str, n: int) -> list[str]:
    return [sys.executable, str(HERE / "bare_crawler.py"), url, "--concurrency", str(n)]


def floor_command(url: str, n: int) -> list[str]:
    return [sys.executable, str(HERE / "floor_crawler.py"), url, "--concurrency", str(n)]


def run_bare(server: Server, work: Path, n: int, rep: int, tool: str = "bare") -> Run:
    """A crawler that records nothing: ``bare`` (tools/bare_crawler.py, httpx) or ``floor``
    (tools/floor_crawler.py, raw asyncio streams); both print the same JSON line."""
    out_path, err_path = work / f"{tool}-{rep}.out", work / f"{tool}-{rep}.err"
    command = (floor_command if tool == "floor" else bare_command)(server.url, n)
    load = load_average()
    with out_path.open("w") as out, err_path.open("w") as err:
        wall, cpu, rc, requests, rss = timed(command, server, stdout=out, stderr=err)
    result = {}
    with contextlib.suppress(Exception):
        result = json.loads(out_path.read_text())
    if rc != 0:
        print(err_path.read_text()[-2000:], file=sys.stderr)
    span, dups, pages = window(requests)
    return Run(tool, rep, wall, cpu, int(result.get("status_200", 0)), pages,
               int(result.get("pages", 0)), len(requests), span, dups, rc, 0,
               {"errors": result.get("errors")}, load, rss)


def ensure_scrapy(venv: Path) -> tuple[list[list[str]], str]:
    """Create the separate Scrapy venv when absent; return the commands run and version."""
    commands = []
    if not (venv / "bin" / "scrapy").exists():
        base = getattr(sys, "_base_executable", sys.executable)
        for cmd in ([base, "-m", "venv", str(venv)],
                    [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "scrapy"]):
            print("$ " + shlex.join(cmd), flush=True)
            subprocess.run(cmd, check=True)
            commands.append(cmd)
    version = subprocess.run([str(venv / "bin" / "scrapy"), "version"], capture_output=True,
                             text=True, check=True).stdout.strip()
    return commands, version


# --- resume cost ---------------------------------------------------------------------------


def fill_frontier(store: Path, base_url: str, count: int) -> dict:
    """Queue ``count`` URLs in the open session through the writer, 10,000 per message."""
    import anyio

    from evidence import Store, Writer
    from evidence._crawl.frontier import last_session
    from evidence._model.messages import (
        FrontierUpdate,
        QueuedUrl,
        RunEnded,
        RunStarted,
        new_id,
        utc_now,
    )

    async def main() -> dict:
        with Store.open(store) as s:
            with s.reader() as conn:
                session = last_session(conn)
            assert session is not None and session.outcome is None, "no open session"
            run_id = new_id("run-")
            t0 = time.perf_counter()
            async with Writer(s) as writer:
                async def commit(messages) -> None:
                    acks = await writer.submit_group(messages)
                    bad = [a for a in acks if a.status != "committed"]
                    assert not bad, bad

                await commit([RunStarted(
                    message_id=new_id("m-"), run_id=run_id, session_id=session.session_id,
                    started_at=utc_now(), program="tools/bench_crawl.py frontier filler",
                    host=socket.gethostname(), pid=os.getpid())])
                for start in range(0, count, CHUNK):
                    queued = [QueuedUrl(url=f"{base_url}q/{i}.html", depth=1, via="link")
                              for i in range(start, min(count, start + CHUNK))]
                    await commit([FrontierUpdate(
                        message_id=new_id("m-"), session_id=session.session_id,
                        run_id=run_id, at=utc_now(), queued=queued)])
                await commit([RunEnded(message_id=new_id("m-"), run_id=run_id,
                                       ended_at=utc_now(), outcome="stopped",
                                       reason=f"benchmark filler queued {count} URLs")])
            seconds = time.perf_counter() - t0
        return {"session_id": session.session_id, "filler_run_id": run_id,
                "queued": count, "fill_s": seconds, "fill_urls_per_s": count / seconds}

    return anyio.run(main)


def frontier_state(store: Path) -> dict:
    import apsw

    conn = apsw.Connection(str(store / "evidence.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return dict(conn.execute("SELECT state, count(*) FROM frontier GROUP BY state"))
    finally:
        conn.close()


def resume_cost(server: Server, work: Path, name: str, urls: int, n: int,
                reps: int) -> dict:
    store = work / f"resume-{name}.evidence"
    seed = [*evidence_command(), "crawl", server.url, "--store", str(store), "--max-documents",
            "1", "--workers", "1", "--per-host", "1", "--json"]
    subprocess.run(seed, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fill = fill_frontier(store, server.url, urls)
    before = frontier_state(store)
    cmd = [*evidence_command(), "crawl", "--store", str(store), "--workers", str(n),
           "--per-host", str(n)]
    samples = []
    for rep in range(reps):
        offset = server.mark()
        with (work / f"resume-{name}-{rep}.err").open("w") as err:
            t0 = time.time()
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            first = server.first_request_after(offset, 300.0, proc)
            proc.kill()  # SIGKILL: the next resume also requeues what was in flight
            proc.wait()
        if first is None:
            print((work / f"resume-{name}-{rep}.err").read_text()[-2000:], file=sys.stderr)
            raise RuntimeError(f"resume {name} rep {rep}: no request reached the server")
        samples.append({"after": "a stopped run" if rep == 0 else "SIGKILL",
                        "seconds": first[0] - t0, "first_request": first[1],
                        "load_1m": load_average()})
    size = (store / "evidence.db").stat().st_size
    shutil.rmtree(store, ignore_errors=True)
    return {"frontier_urls": urls, "frontier_before": before, "command": cmd, **fill,
            "db_bytes": size, "samples": samples,
            "median_s": statistics.median(s["seconds"] for s in samples)}


# --- report --------------------------------------------------------------------------------


TOOLS = ("evidence", "scrapy", "bare", "floor")  # and evidence-pN with --processes N


def summarize(runs: list[Run], expected_pages: int) -> dict:
    """Medians per tool, and the ratios the issue's bars are stated in."""
    out: dict = {}
    for tool in dict.fromkeys(r.tool for r in runs):
        rs = [r for r in runs if r.tool == tool]
        rates = [r.pages_per_s for r in rs]
        cpus = [1000 * r.cpu_s / r.pages if r.pages else 0.0 for r in rs]
        out[tool] = {
            "median_pages_per_s": statistics.median(rates),
            "range_pages_per_s": [min(rates), max(rates)],
            "median_server_pages_per_s": statistics.median(r.server_pages_per_s for r in rs),
            "median_cpu_ms_per_page": statistics.median(cpus),
            "range_cpu_ms_per_page": [min(cpus), max(cpus)],
            "median_peak_rss_mb": statistics.median(r.peak_rss_kb / 1024 for r in rs),
            "range_load_1m": [min(r.load_1m for r in rs), max(r.load_1m for r in rs)],
            "all_complete": all(r.pages == expected_pages and r.exit_status == 0
                                and r.tool_pages >= expected_pages for r in rs),
            "duplicate_requests": [r.duplicates for r in rs],
        }

    def ratio(a: str, b: str, key: str) -> float | None:
        if a in out and b in out and out[b][key]:
            return out[a][key] / out[b][key]
        return None

    ratios = {
        "evidence/scrapy pages/s": ratio("evidence", "scrapy", "median_pages_per_s"),
        "evidence/scrapy CPU per page": ratio("evidence", "scrapy", "median_cpu_ms_per_page"),
        "evidence/bare pages/s": ratio("evidence", "bare", "median_pages_per_s"),
        "evidence/bare CPU per page": ratio("evidence", "bare", "median_cpu_ms_per_page"),
        "scrapy/bare pages/s": ratio("scrapy", "bare", "median_pages_per_s"),
        "evidence/scrapy peak RSS": ratio("evidence", "scrapy", "median_peak_rss_mb"),
        "evidence/bare peak RSS": ratio("evidence", "bare", "median_peak_rss_mb"),
    }
    for tool in out:  # everything against the floor (tools/floor_crawler.py)
        if tool != "floor":
            ratios[f"{tool}/floor pages/s"] = ratio(tool, "floor", "median_pages_per_s")
            ratios[f"{tool}/floor CPU per page"] = ratio(tool, "floor",
                                                         "median_cpu_ms_per_page")
    for tool in out:
        if tool.startswith("evidence-p"):
            ratios[f"{tool}/evidence pages/s"] = ratio(tool, "evidence", "median_pages_per_s")
            ratios[f"{tool}/evidence CPU per page"] = ratio(tool, "evidence",
                                                            "median_cpu_ms_per_page")
    out["ratios"] = {k: v for k, v in ratios.items() if v is not None}
    return out


BARS = {"evidence/scrapy pages/s": (">=", 1.2), "evidence/scrapy CPU per page": ("<=", 1.0),
        "evidence/bare pages/s": (">=", 0.9)}


def render(report: dict) -> str:
    lines = [f"server: {report['server']}; concurrency {report['concurrency']}; "
             f"{os.cpu_count()} CPUs"]
    for size in report["sizes"]:
        lines += ["", f"site: {size['site']['documents']} HTML documents (mean "
                  f"{size['site']['mean_page_bytes']} B) + robots.txt, at {size['url']}",
                  f"{'run':<16} {'wall s':>8} {'pages/s':>9} {'srv pages/s':>11} "
                  f"{'cpu ms/page':>11} {'peak RSS MB':>11} {'pages':>7} {'own 200s':>8} "
                  f"{'dup':>4} {'disk MB':>8} {'exit':>4} {'load':>5}"]
        for r in size["runs"]:
            lines.append(
                f"{r['tool'] + ' #' + str(r['rep']):<16} {r['wall_s']:>8.2f} "
                f"{r['pages_per_s']:>9.1f} {r['server_pages_per_s']:>11.1f} "
                f"{1000 * r['cpu_s'] / max(1, r['pages']):>11.2f} "
                f"{r['peak_rss_kb'] / 1024:>11.1f} {r['pages']:>7} "
                f"{r['status_200']:>8} {r['duplicates']:>4} {r['store_bytes'] / 1e6:>8.1f} "
                f"{r['exit_status']:>4} {r['load_1m']:>5.1f}")
        s = size["summary"]
        for tool, t in s.items():
            if tool == "ratios":
                continue
            low, high = t["range_pages_per_s"]
            cpu_low, cpu_high = t["range_cpu_ms_per_page"]
            load_low, load_high = t["range_load_1m"]
            lines.append(f"{tool:<12} median {t['median_pages_per_s']:.1f} pages/s "
                         f"({low:.1f}-{high:.1f}; server window "
                         f"{t['median_server_pages_per_s']:.1f}), "
                         f"{t['median_cpu_ms_per_page']:.2f} CPU ms/page "
                         f"({cpu_low:.2f}-{cpu_high:.2f}), peak RSS "
                         f"{t['median_peak_rss_mb']:.0f} MB, load {load_low:.1f}-"
                         f"{load_high:.1f}; every page fetched: "
                         f"{'yes' if t['all_complete'] else 'NO'}")
        for name, value in s["ratios"].items():
            bar = BARS.get(name)
            verdict = ""
            if bar is not None:
                met = value >= bar[1] if bar[0] == ">=" else value <= bar[1]
                verdict = f"   bar {bar[0]} {bar[1]}: {'met' if met else 'NOT met'}"
            lines.append(f"  {name:<36} {value:.2f}{verdict}")
    lines.append("pages: distinct HTML URLs answered 200 in the server log; own 200s: the "
                 "crawler's count (incl. robots.txt); dup: URLs requested twice; CPU and peak "
                 "RSS: the crawler process and its children (wait4); load: 1-min load "
                 "average at the start; " + KEEP_NOTE)
    for key, res in report.get("resume", {}).items():
        samples = ", ".join(f"{x['seconds']:.3f} s (after {x['after']})"
                            for x in res["samples"])
        lines.append(f"\nresume, {res['frontier_urls']:,} queued URLs ({key}): median "
                     f"{res['median_s']:.3f} s from spawn to first request [{samples}]; "
                     f"frontier filled at {res['fill_urls_per_s']:,.0f} URLs/s "
                     f"({res['fill_s']:.1f} s), evidence.db {res['db_bytes'] / 1e6:.0f} MB")
    lines += ["", "rerun: " + report["rerun"]]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=_sizes, dest="sizes",
                   help="HTML pages in the site; several, comma-separated, make one site "
                   "each (default 600,5000)")
    p.add_argument("--concurrency", type=int, default=8,
                   help="requests in flight, every crawler (default 8)")
    p.add_argument("--reps", type=int, help="repetitions, interleaved (default 3)")
    p.add_argument("--resume-urls", type=int,
                   help="queued URLs in the resume store's frontier (default 1000000)")
    p.add_argument("--quick", action="store_true",
                   help="one site of 300 pages, 1 rep, 20,000 resume URLs")
    p.add_argument("--only", action="append",
                   choices=("evidence", "scrapy", "bare", "floor", "resume"),
                   help="run only these (repeatable; default evidence, scrapy, bare and "
                   "floor; resume only when named)")
    p.add_argument("--processes", type=int, default=0, metavar="N",
                   help="also run evidence with --processes N, interleaved with the rest "
                   "(default 0: not)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the report as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, site)")
    p.add_argument("--scrapy-venv", type=Path, default=Path("/tmp/scrapy-venv"),
                   help="the separate venv Scrapy is installed into (default /tmp/scrapy-venv)")
    p.add_argument("--server", choices=("auto", "nginx", "python"), default="auto",
                   help="auto (default): nginx when installed, else the Python server")
    p.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--serve-log", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = {"sizes": [300], "reps": 1, "resume_urls": 20_000}
    full = {"sizes": [600, 5000], "reps": 3, "resume_urls": 1_000_000}
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not page counts: {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"not page counts: {text!r}")
    return sizes


def run_tool(tool: str, server: Server, work: Path, n: int, rep: int,
             args: argparse.Namespace) -> Run:
    if tool == "evidence":
        return run_evidence(server, work, n, rep)
    if tool.startswith("evidence-p"):
        return run_evidence(server, work, n, rep, args.processes)
    if tool == "scrapy":
        return run_scrapy(server, work, args.scrapy_venv, n, rep)
    return run_bare(server, work, n, rep, tool)


def bench_size(pages: int, work: Path, args: argparse.Namespace, tools: list[str],
               report: dict) -> dict:
    """Every tool against one site of ``pages`` pages, interleaved, ``args.reps`` times."""
    here = work / f"site-{pages}"
    here.mkdir()
    site = generate_site(here / "site", pages)
    print(f"generated {site['documents']} documents under {here}", flush=True)
    server = Server(here, here / "site", args.server)
    report["server"] = server.name
    try:
        print(f"server: {server.name} at {server.url}", flush=True)
        n = args.concurrency
        runs: list[Run] = []
        for rep in range(args.reps):
            order = tools[rep % len(tools):] + tools[:rep % len(tools)]  # rotated
            for tool in order:
                run = run_tool(tool, server, here, n, rep, args)
                run.size = pages
                runs.append(run)
                print(f"  {pages} pages, {tool} #{rep}: {run.pages} pages in "
                      f"{run.wall_s:.2f} s = {run.pages_per_s:.1f} pages/s, "
                      f"{1000 * run.cpu_s / max(1, run.pages):.2f} CPU ms/page, peak RSS "
                      f"{run.peak_rss_kb / 1024:.0f} MB, exit {run.exit_status}", flush=True)
        return {"site": site, "url": server.url,
                "runs": [{**asdict(r), "pages_per_s": r.pages_per_s,
                          "server_pages_per_s": r.server_pages_per_s} for r in runs],
                "summary": summarize(runs, site["documents"])}
    finally:
        server.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.serve_log)
        return 0
    parts = set(args.only or ("evidence", "scrapy", "bare", "floor"))
    tools = [t for t in TOOLS if t in parts]
    if args.processes and "evidence" in parts:
        tools.insert(1, f"evidence-p{args.processes}")
    rerun = shlex.join(["python", "tools/bench_crawl.py",
                        "--pages", ",".join(map(str, args.sizes)),
                        "--concurrency", str(args.concurrency), "--reps", str(args.reps)]
                       + (["--resume-urls", str(args.resume_urls)] if "resume" in parts
                          else [])
                       + (["--processes", str(args.processes)] if args.processes else [])
                       + [x for o in (args.only or []) for x in ("--only", o)]
                       + ([] if args.server == "auto" else ["--server", args.server]))
    work = Path(tempfile.mkdtemp(prefix="bench-crawl-"))
    work.chmod(0o755)
    report: dict = {"date": dt.date.today().isoformat(), "rerun": rerun,
                    "concurrency": args.concurrency, "work": str(work), "sizes": [],
                    "server": "", "load_1m_start": load_average(),
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "platform": platform.platform()}}
    try:
        n = args.concurrency
        if "scrapy" in tools:
            report["scrapy_setup"], report["scrapy_version"] = ensure_scrapy(args.scrapy_venv)
            install = (f"python -m venv {args.scrapy_venv} && {args.scrapy_venv}/bin/python "
                       "-m pip install scrapy")
            print(f"scrapy: {report['scrapy_version']} in {args.scrapy_venv} (installed with: "
                  f"{install}{'' if report['scrapy_setup'] else '; already present'})",
                  flush=True)
            report["scrapy_command"] = scrapy_command(args.scrapy_venv, "URL",
                                                      Path("JOBDIR"), Path("STATS"), n)
            print("$ " + shlex.join(report["scrapy_command"]), flush=True)
        report["evidence_command"] = [*evidence_command(), "crawl", "URL", "--store", "STORE",
                                      "--workers", str(n), "--per-host", str(n), "--json"]
        print("$ " + shlex.join(report["evidence_command"]), flush=True)
        if args.processes:
            print(f"  and the same with --processes {args.processes}", flush=True)
        report["bare_command"] = bare_command("URL", n)
        print("$ " + shlex.join(report["bare_command"]), flush=True)
        report["floor_command"] = floor_command("URL", n)
        print("$ " + shlex.join(report["floor_command"]), flush=True)
        report["bytecode"] = precompile()
        print(f"bytecode: {report['bytecode']}", flush=True)
        for pages in args.sizes:
            if tools:
                report["sizes"].append(bench_size(pages, work, args, tools, report))
        if "resume" in parts and args.resume_urls > 0:
            here = work / "resume"
            here.mkdir()
            generate_site(here / "site", args.sizes[0])
            server = Server(here, here / "site", args.server)
            try:
                report["resume"] = {}
                for name, urls in (("fixed part", min(1000, args.resume_urls)),
                                   ("full", args.resume_urls)):
                    print(f"resume: filling a frontier of {urls:,} URLs ...", flush=True)
                    res = resume_cost(server, here, name.replace(" ", "-"), urls, n,
                                      max(2, args.reps))
                    report["resume"][name] = res
                    print(f"  median {res['median_s']:.3f} s to the first request "
                          f"({[round(x['seconds'], 3) for x in res['samples']]})", flush=True)
            finally:
                server.close()
        report["load_1m_end"] = load_average()
        print()
        print(render(report))
        if args.json:
            args.json.write_text(json.dumps(report, indent=1, default=str))
            print(f"wrote {args.json}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
