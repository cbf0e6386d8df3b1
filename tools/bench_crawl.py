#!/usr/bin/env python3
"""Benchmark the crawler (issue 3): pages/s against Scrapy, and the cost of a resume.

Throughput. A static site of ``--pages`` HTML pages (``/p/0.html`` .. plus ``/`` and a
``robots.txt`` allowing everything; pages of 3-5 KB of text, each linking to ~10 others,
absolute and relative hrefs; every page reachable from ``/``) is generated into a temp
dir and served on 127.0.0.1 by nginx from the OS packages (one worker, keep-alive on,
access log in the temp dir with a millisecond timestamp per request). Without nginx, a
small asyncio static server (files held in memory) in a separate process stands in, and
the report says so. Both crawlers then crawl the whole site at equal concurrency N:

  evidence  ``evidence crawl URL --store NEW --workers N --per-host N`` as a subprocess,
            recording full evidence (request head, response head and body in the
            artifact store, attempts, links, frontier transitions, Merkle log), at the
            default ``--sync full``;
  scrapy    ``scrapy runspider tools/_scrapy_spider.py`` in a separate venv
            (``--scrapy-venv``, created with ``python -m venv`` + ``pip install scrapy``
            when absent) with JOBDIR (its disk request queue and dupe filter),
            CONCURRENT_REQUESTS=N, CONCURRENT_REQUESTS_PER_DOMAIN=N, DOWNLOAD_DELAY=0,
            ROBOTSTXT_OBEY=True, AUTOTHROTTLE off, HTTPCACHE off, LOG_LEVEL=WARNING.
            Scrapy keeps no bodies: it is the common way Scrapy runs, not an equal load.

Same site and server, alternating order (evidence, scrapy, scrapy, evidence, ...) for
``--reps`` repetitions, each run into a fresh store / JOBDIR, all kept until the end (a
delete between runs would slow the next run's file creations: see KEEP_NOTE). Reported per
run: pages/s over the process's wall time (start to exit, the figure the ratio uses),
pages/s over the server's window (first to last request in the access log: no start-up or
shut-down), CPU seconds of the crawler process, and the checks: the distinct HTML URLs the
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

Options: --pages N (10000), --concurrency N (16), --reps N (3), --resume-urls N
(1000000), --quick (300 pages, 1 rep, 20,000 resume URLs: well under a minute once the
Scrapy venv exists), --json FILE, --keep (keep the temp dir), --scrapy-venv DIR,
--only evidence|scrapy|resume (repeatable), --server auto|nginx|python.

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

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.wall_s if self.wall_s else 0.0

    @property
    def server_pages_per_s(self) -> float:
        return self.pages / self.server_window_s if self.server_window_s else 0.0


def evidence_command() -> list[str]:
    script = Path(sys.executable).parent / "evidence"
    return [str(script)] if script.exists() else [sys.executable, "-m", "evidence"]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd: list[str], server: Server, *, stdout, stderr,
          env: dict | None = None) -> tuple[float, float, int, list]:
    offset = server.mark()
    cpu0 = children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=stdout, stderr=stderr, env=env)
    wall = time.perf_counter() - t0
    cpu = children_cpu() - cpu0
    time.sleep(0.05)  # the server's last log lines
    return wall, cpu, proc.returncode, server.requests_since(offset)


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
    store = work / f"evidence-{rep}"
    cmd = [*evidence_command(), "crawl", server.url, "--store", str(store),
           "--workers", str(n), "--per-host", str(n), "--json",
           *(["--processes", str(processes)] if processes else [])]
    load = load_average()
    with (work / f"evidence-{rep}.out").open("w") as out, \
            (work / f"evidence-{rep}.err").open("w") as err:
        wall, cpu, rc, requests = timed(cmd, server, stdout=out, stderr=err)
    all_200, tool_pages = evidence_counts(store)
    span, dups, pages = window(requests)
    result = {}
    with contextlib.suppress(Exception):
        result = json.loads((work / f"evidence-{rep}.out").read_text())
    if rc != 0:
        print((work / f"evidence-{rep}.err").read_text()[-2000:], file=sys.stderr)
    run = Run("evidence", rep, wall, cpu, all_200, pages, tool_pages, len(requests), span,
              dups, rc, dir_bytes(store), {"outcome": result.get("outcome")}, load)
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
        wall, cpu, rc, requests = timed(cmd, server, stdout=subprocess.DEVNULL, stderr=err,
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
               "dupefilter_filtered": stats.get("dupefilter/filtered")}, load)
    return run  # kept until the end, as evidence's stores are


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


def summarize(runs: list[Run], expected_pages: int) -> dict:
    out = {}
    for tool in ("evidence", "scrapy"):
        rs = [r for r in runs if r.tool == tool]
        if not rs:
            continue
        out[tool] = {
            "median_pages_per_s": statistics.median(r.pages_per_s for r in rs),
            "median_server_pages_per_s": statistics.median(r.server_pages_per_s for r in rs),
            "median_cpu_ms_per_page": statistics.median(
                1000 * r.cpu_s / r.pages if r.pages else 0.0 for r in rs),
            "all_complete": all(r.pages == expected_pages and r.exit_status == 0
                                and r.tool_pages >= expected_pages for r in rs),
            "duplicate_requests": [r.duplicates for r in rs],
        }
    if "evidence" in out and "scrapy" in out:
        out["ratio_evidence_over_scrapy"] = (out["evidence"]["median_pages_per_s"]
                                             / out["scrapy"]["median_pages_per_s"])
        out["ratio_server_window"] = (out["evidence"]["median_server_pages_per_s"]
                                      / out["scrapy"]["median_server_pages_per_s"])
    return out


def render(report: dict) -> str:
    lines = [f"server: {report['server']}",
             f"site: {report['site']['documents']} HTML documents "
             f"(mean {report['site']['mean_page_bytes']} B) + robots.txt, at "
             f"{report['url']}; concurrency {report['concurrency']}", ""]
    if report["runs"]:
        lines.append(f"{'run':<12} {'wall s':>8} {'pages/s':>9} {'srv pages/s':>11} "
                     f"{'cpu ms/page':>11} {'pages':>7} {'own 200s':>8} {'dup':>4} "
                     f"{'disk MB':>8} {'exit':>4} {'load':>5}")
        for r in report["runs"]:
            lines.append(
                f"{r['tool'] + ' #' + str(r['rep']):<12} {r['wall_s']:>8.2f} "
                f"{r['pages_per_s']:>9.1f} {r['server_pages_per_s']:>11.1f} "
                f"{1000 * r['cpu_s'] / max(1, r['pages']):>11.2f} {r['pages']:>7} "
                f"{r['status_200']:>8} {r['duplicates']:>4} {r['store_bytes'] / 1e6:>8.1f} "
                f"{r['exit_status']:>4} {r['load_1m']:>5.1f}")
        s = report["summary"]
        lines.append("pages: distinct HTML URLs answered 200 in the server log; own 200s: "
                     "the crawler's count (incl. robots.txt); dup: URLs requested twice; "
                     f"load: 1-min load average at the start ({os.cpu_count()} CPUs); "
                     + KEEP_NOTE)
        lines.append("")
        for tool in ("evidence", "scrapy"):
            if tool in s:
                t = s[tool]
                lines.append(f"{tool:<9} median {t['median_pages_per_s']:.1f} pages/s "
                             f"(server window {t['median_server_pages_per_s']:.1f}), "
                             f"{t['median_cpu_ms_per_page']:.2f} CPU ms/page; every page "
                             f"fetched: {'yes' if t['all_complete'] else 'NO'}; URLs "
                             f"requested twice per run: {t['duplicate_requests']}")
        if "ratio_evidence_over_scrapy" in s:
            r = s["ratio_evidence_over_scrapy"]
            lines.append(f"ratio evidence/scrapy (medians, wall): {r:.2f}   (server window: "
                         f"{s['ratio_server_window']:.2f})   bar >= 1.0: "
                         f"{'met' if r >= 1.0 else 'NOT met'}")
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
    p.add_argument("--pages", type=int, help="HTML pages in the site (default 10000)")
    p.add_argument("--concurrency", type=int, default=16,
                   help="requests in flight, both crawlers (default 16)")
    p.add_argument("--reps", type=int, help="repetitions, alternating order (default 3)")
    p.add_argument("--resume-urls", type=int,
                   help="queued URLs in the resume store's frontier (default 1000000; 0: skip)")
    p.add_argument("--quick", action="store_true",
                   help="300 pages, 1 rep, 20,000 resume URLs")
    p.add_argument("--only", action="append", choices=("evidence", "scrapy", "resume"),
                   help="run only these parts (repeatable)")
    p.add_argument("--processes", type=int, default=0, metavar="N",
                   help="run evidence with --processes N (worker processes; default 0)")
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
    quick = {"pages": 300, "reps": 1, "resume_urls": 20_000}
    full = {"pages": 10_000, "reps": 3, "resume_urls": 1_000_000}
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.serve_log)
        return 0
    parts = set(args.only or ("evidence", "scrapy", "resume"))
    rerun = shlex.join(["python", "tools/bench_crawl.py", "--pages", str(args.pages),
                        "--concurrency", str(args.concurrency), "--reps", str(args.reps),
                        "--resume-urls", str(args.resume_urls)]
                       + (["--processes", str(args.processes)] if args.processes else [])
                       + [x for o in (args.only or []) for x in ("--only", o)]
                       + ([] if args.server == "auto" else ["--server", args.server]))
    work = Path(tempfile.mkdtemp(prefix="bench-crawl-"))
    work.chmod(0o755)
    report: dict = {"date": dt.date.today().isoformat(), "rerun": rerun,
                    "concurrency": args.concurrency, "work": str(work), "runs": [],
                    "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "platform": platform.platform()}}
    server = None
    try:
        t = time.perf_counter()
        report["site"] = generate_site(work / "site", args.pages)
        print(f"generated {report['site']['documents']} documents in "
              f"{time.perf_counter() - t:.1f} s under {work}", flush=True)
        server = Server(work, work / "site", args.server)
        report["server"], report["url"] = server.name, server.url
        print(f"server: {server.name} at {server.url}", flush=True)
        if server.nginx:
            print("$ " + shlex.join(server.command), flush=True)
        n = args.concurrency
        if "scrapy" in parts:
            report["scrapy_setup"], report["scrapy_version"] = ensure_scrapy(args.scrapy_venv)
            install = (f"python -m venv {args.scrapy_venv} && {args.scrapy_venv}/bin/python "
                       "-m pip install scrapy")
            print(f"scrapy: {report['scrapy_version']} in {args.scrapy_venv} (installed with: "
                  f"{install}{'' if report['scrapy_setup'] else '; already present'})",
                  flush=True)
        print("$ " + shlex.join([*evidence_command(), "crawl", server.url, "--store",
                                 "STORE", "--workers", str(n), "--per-host", str(n),
                                 "--json", *(["--processes", str(args.processes)]
                                             if args.processes else [])]), flush=True)
        report["evidence_processes"] = args.processes
        if "scrapy" in parts:
            report["scrapy_command"] = scrapy_command(args.scrapy_venv, server.url,
                                                      work / "JOBDIR", work / "STATS", n)
            print("$ " + shlex.join(report["scrapy_command"]), flush=True)
        runs: list[Run] = []
        for rep in range(args.reps):
            order = ["evidence", "scrapy"] if rep % 2 == 0 else ["scrapy", "evidence"]
            for tool in order:
                if tool not in parts:
                    continue
                run = (run_evidence(server, work, n, rep, args.processes) if tool == "evidence"
                       else run_scrapy(server, work, args.scrapy_venv, n, rep))
                runs.append(run)
                print(f"  {tool} #{rep}: {run.pages} pages in {run.wall_s:.2f} s = "
                      f"{run.pages_per_s:.1f} pages/s (server window "
                      f"{run.server_pages_per_s:.1f}), {run.status_200} 200s, "
                      f"{run.duplicates} duplicate requests, exit {run.exit_status}",
                      flush=True)
        report["runs"] = [{**asdict(r), "pages_per_s": r.pages_per_s,
                           "server_pages_per_s": r.server_pages_per_s} for r in runs]
        report["summary"] = summarize(runs, report["site"]["documents"])
        if "resume" in parts and args.resume_urls > 0:
            report["resume"] = {}
            for name, urls in (("fixed part", min(1000, args.resume_urls)),
                               ("full", args.resume_urls)):
                print(f"resume: filling a frontier of {urls:,} URLs ...", flush=True)
                res = resume_cost(server, work, name.replace(" ", "-"), urls, n,
                                  max(2, args.reps))
                report["resume"][name] = res
                print(f"  median {res['median_s']:.3f} s to the first request "
                      f"({[round(x['seconds'], 3) for x in res['samples']]})", flush=True)
        print()
        print(render(report))
        if args.json:
            args.json.write_text(json.dumps(report, indent=1, default=str))
            print(f"wrote {args.json}")
    finally:
        if server is not None:
            server.close()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
