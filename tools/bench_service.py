#!/usr/bin/env python3
"""Benchmark the writer service (issue 5): messages through ``evidence serve`` from 1, 2 and
4 client processes, against the in-process ``Writer`` on the same messages in the same run;
and pages/s of ``evidence crawl --processes 2`` against the single-process crawl.

Workloads (``--workload``, both by default):

  attempt  one ``FetchAttempt`` per request (``submit``): 1 fetch_attempt row, 1 artifact
           row for a body already in the artifact store (``--artifacts`` distinct bodies,
           reused round-robin), 1 url_identity, 1 url_current, 1 ledger row;
  page     a crawler's page as one group (``submit_group``): that ``FetchAttempt`` and its
           ``Discovery`` with 10 references (5 new URLs, 5 back-links).

Each configuration writes ``--messages`` messages into a fresh store made by ``Store.create``
(same schema and pragmas, ``--sync``; session and run recorded before timing):

  inproc      ``Writer`` in this process, ``--window`` producer tasks (each submits a
              request and waits for its acks). The baseline.
  service xN  ``evidence serve`` in its own process, on a Unix socket; N client processes
              (this script with ``--worker``), each an ``AsyncClient`` with ``--window``
              requests in flight, sharing the messages. Clients build their messages and
              connect before a start barrier; the clock runs from the first client's start
              to the last client's end (CLOCK_MONOTONIC is system-wide).

Ack latency is per request, from the submit call to its return (for a page: the group's).
``ratio`` is messages/s over the in-process writer's on the same workload. After each run the
ledger is counted: every message must be there exactly once.

Crawl (``--crawl-pages``, 0 skips it): ``evidence crawl URL --store NEW --workers W
--per-host W --processes N --json`` for each N of ``--crawl-processes`` (0, the single-process
crawl, is the baseline and always runs) on one local static site of ``--crawl-pages`` pages,
generated and served on 127.0.0.1 by ``tools/bench_crawl.py``'s code (nginx when installed,
else its Python server). Each crawl goes into a fresh store, ``--crawl-reps`` times, the
order reversed on every other rep (0 2 2 0 ...). A crawl's time is the wall time of the
subprocess, spawn to exit; its pages are ``counts.done`` of its JSON result, which must equal
the site's documents, as must the distinct pages the server answered. Reported per N: median
pages/s and the range over reps, ``ratio`` (median over the N=0 median, same run), pages/s
over the server's first-to-last request (no start-up or shut-down), and CPU ms per page of
the crawl's parent process and of its worker processes (read from /proc/PID/stat while the
exited parent is a zombie: its own time, and its reaped children's).

Examples:
  python tools/bench_service.py                 # both workloads, 1/2/4 clients, 3000-page
                                                # crawl x3 at 0 and 2 processes
  python tools/bench_service.py --quick         # smoke test: 4000 messages, a 300-page crawl
  python tools/bench_service.py --sync normal --clients 1,4 --messages 50000 --crawl-pages 0
  python tools/bench_service.py --messages 0 --crawl-processes 0,1,2,4   # the crawl only
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import anyio
import apsw
import blake3
import msgspec

import evidence
from evidence import (
    ArtifactRef,
    Discovery,
    FetchAttempt,
    Message,
    ObservedRef,
    RunStarted,
    SessionStarted,
    Store,
    Writer,
    WriterLimits,
)
from evidence.client import AsyncClient, ClientLimits

NAMESPACE = "html"
HOST = "https://www.example.org"
RUN_ID = "run-bench"
STARTED = dt.datetime(2026, 3, 3, 12, 0, tzinfo=dt.UTC)  # fixed: same messages every run
BATCH_DELAY = 0.002  # the service's default WriterLimits.max_batch_delay; the baseline's too
# The directory holding the ``evidence`` package this script imported: crawl subprocesses
# run there with it first on PYTHONPATH, so they run the same code (not another checkout).
PACKAGE_ROOT = Path(evidence.__file__).resolve().parent.parent


# --- the workload -----------------------------------------------------------------------

def make_bodies(count: int) -> list[bytes]:
    """``count`` distinct small HTML bodies, 2-6 KB."""
    return [(f"<!doctype html><html><head><title>page {i}</title></head><body>\n"
             + (f"<p>paragraph {i} " + "lorem ipsum dolor sit amet " * 8 + "</p>\n")
             * (4 + i % 12) + "</body></html>\n").encode() for i in range(count)]


def body_refs(count: int) -> list[ArtifactRef]:
    return [ArtifactRef(NAMESPACE, blake3.blake3(b).hexdigest(), len(b))
            for b in make_bodies(count)]


def url(n: int) -> str:
    return f"{HOST}/articles/{n:08d}/index.html"


def request(workload: str, i: int, refs: Sequence[ArtifactRef]) -> list[Message]:
    """The messages of request ``i``: one attempt, or a page (attempt and discovery)."""
    ref = refs[i % len(refs)]
    fetch = FetchAttempt(
        message_id=f"msg-{i:08d}-a", attempt_id=f"att-{i:08d}", run_id=RUN_ID, url=url(i),
        sequence=0, started_at=STARTED, elapsed_ms=87.5 + i % 100, outcome="response",
        http_status=200, body=ref, content_type="text/html; charset=utf-8")
    if workload == "attempt":
        return [fetch]
    refs_out = [ObservedRef(observed=url(5 * i + j + 1), url=url(5 * i + j + 1), position=j)
                for j in range(5)]
    refs_out += [ObservedRef(observed=url(max(0, i - k)), url=url(max(0, i - k)),
                             position=4 + k) for k in range(1, 6)]
    return [fetch, Discovery(message_id=f"msg-{i:08d}-d", run_id=RUN_ID,
                             source_attempt_id=fetch.attempt_id, source_artifact=ref,
                             refs=refs_out)]


def fresh_store(path: Path, sync: str, artifacts: int) -> None:
    """A new store with the bodies stored and the session and run recorded."""
    shutil.rmtree(path, ignore_errors=True)
    with Store.create(path, sync=sync) as store:
        for body in make_bodies(artifacts):
            store.artifacts.put(NAMESPACE, body)

        async def setup() -> None:
            async with Writer(store) as writer:
                await writer.submit_group([
                    SessionStarted(message_id="msg-session", session_id="ses-bench",
                                   started_at=STARTED),
                    RunStarted(message_id="msg-run", run_id=RUN_ID, session_id="ses-bench",
                               started_at=STARTED, program="bench_service")])

        anyio.run(setup)


def ledger_size(path: Path) -> int:
    conn = apsw.Connection(str(path / "evidence.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return conn.execute("SELECT count(*) FROM ingest_ledger").fetchall()[0][0]
    finally:
        conn.close()


# --- measuring --------------------------------------------------------------------------

@dataclass
class Result:
    mode: str
    clients: int
    workload: str
    messages: int
    requests: int
    seconds: float
    messages_per_s: float
    ack_p50_ms: float
    ack_p99_ms: float
    batches: int
    mean_batch: float
    commit_p50_ms: float
    commit_p99_ms: float
    ratio: float | None = None


def quantile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def make_result(mode: str, clients: int, workload: str, messages: int, requests: int,
                seconds: float, latencies: list[float], writer: dict) -> Result:
    ordered = sorted(latencies)
    return Result(mode=mode, clients=clients, workload=workload, messages=messages,
                  requests=requests, seconds=round(seconds, 3),
                  messages_per_s=round(messages / seconds, 1),
                  ack_p50_ms=round(quantile(ordered, 0.5) * 1000, 2),
                  ack_p99_ms=round(quantile(ordered, 0.99) * 1000, 2),
                  batches=writer["batches"],
                  mean_batch=round(messages / max(1, writer["batches"]), 1),
                  commit_p50_ms=round(writer["commit_latency_p50"] * 1000, 2),
                  commit_p99_ms=round(writer["commit_latency_p99"] * 1000, 2))


def run_inproc(path: Path, workload: str, count: int, args: argparse.Namespace) -> Result:
    refs = body_refs(args.artifacts)
    requests = [request(workload, i, refs) for i in range(count)]
    latencies: list[float] = []

    async def main() -> tuple[float, dict]:
        with Store.open(path, sync=args.sync) as store:
            async with Writer(store, limits=WriterLimits(max_batch_delay=BATCH_DELAY)) as w:
                queue = iter(requests)

                async def producer() -> None:
                    for group in queue:
                        started = time.perf_counter()
                        await w.submit_group(group)
                        latencies.append(time.perf_counter() - started)

                started = time.monotonic()
                async with anyio.create_task_group() as tg:
                    for _ in range(args.window):
                        tg.start_soon(producer)
                seconds = time.monotonic() - started
                return seconds, msgspec.to_builtins(w.statistics())

    seconds, writer = anyio.run(main)
    messages = sum(len(r) for r in requests)
    return make_result("inproc", 0, workload, messages, count, seconds, latencies, writer)


def serve_command() -> list[str]:
    """``evidence serve`` once the CLI has it; its module directly until then."""
    from evidence._cli.main import build_parser

    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    if "serve" in sub.choices:
        return [sys.executable, "-m", "evidence", "serve"]
    return [sys.executable, "-m", "evidence", "serve"]


def run_service(path: Path, workload: str, count: int, clients: int,
                args: argparse.Namespace) -> Result:
    rundir = Path(tempfile.mkdtemp(prefix="evb-", dir="/tmp"))  # socket paths < 108 bytes
    sock = rundir / "s.sock"
    log = (args.workdir / f"service-{workload}-{clients}.log").open("w")
    service = subprocess.Popen(
        [*serve_command(), str(path), "--socket", str(sock), "--sync", args.sync, "--json"],
        stdout=subprocess.PIPE, stderr=log, text=True)
    workers: list[subprocess.Popen] = []
    try:
        if not service.stdout or not service.stdout.readline():
            raise SystemExit(f"the service did not start; see {log.name}")
        go = rundir / "go"
        bounds = [count * k // clients for k in range(clients + 1)]
        for k in range(clients):
            workers.append(subprocess.Popen([
                sys.executable, __file__, "--worker", str(sock), str(bounds[k]),
                str(bounds[k + 1]), "--workload", workload, "--window", str(args.window),
                "--artifacts", str(args.artifacts), "--go", str(go),
                "--result", str(rundir / f"w{k}.json")]))
        deadline = time.monotonic() + 120
        while not all((rundir / f"w{k}.json.ready").exists() for k in range(clients)):
            if time.monotonic() > deadline or any(w.poll() for w in workers):
                raise SystemExit("a client process failed to start")
            time.sleep(0.01)
        go.touch()
        if any(w.wait() != 0 for w in workers):
            raise SystemExit("a client process failed")
        service.send_signal(signal.SIGTERM)
        out, _ = service.communicate(timeout=120)
        if service.returncode != 0:
            raise SystemExit(f"the service exited with {service.returncode}; see {log.name}")
        stopped = json.loads(out.strip().splitlines()[-1])
        parts = [json.loads((rundir / f"w{k}.json").read_text()) for k in range(clients)]
    finally:
        for proc in (*workers, service):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.close()
        shutil.rmtree(rundir, ignore_errors=True)
    seconds = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    latencies = [x for p in parts for x in p["latencies"]]
    messages = sum(p["messages"] for p in parts)
    return make_result("service", clients, workload, messages, count, seconds, latencies,
                       stopped["statistics"]["writer"])


def worker_main(args: argparse.Namespace) -> int:
    """One client process: build, connect, wait for the barrier, submit, report."""
    refs = body_refs(args.artifacts)
    [workload] = args.workload
    requests = [request(workload, i, refs) for i in range(args.start, args.stop)]
    latencies: list[float] = []
    result = Path(args.result)

    async def main() -> tuple[float, float]:
        limits = ClientLimits(max_in_flight=args.window)
        async with AsyncClient(args.worker, limits=limits, name=f"bench {os.getpid()}") as c:
            (result.parent / (result.name + ".ready")).touch()
            while not Path(args.go).exists():
                await anyio.sleep(0.001)
            queue = iter(requests)

            async def producer() -> None:
                for group in queue:
                    started = time.perf_counter()
                    acks = await c.submit_group(group)
                    latencies.append(time.perf_counter() - started)
                    if any(a.status != "committed" for a in acks):
                        raise SystemExit(f"not committed: {acks}")

            start = time.monotonic()
            async with anyio.create_task_group() as tg:
                for _ in range(args.window):
                    tg.start_soon(producer)
            return start, time.monotonic()

    start, end = anyio.run(main)
    result.write_text(json.dumps({"start": start, "end": end, "latencies": latencies,
                                  "messages": sum(len(r) for r in requests)}))
    return 0


# --- the crawl: --processes N against the single-process crawl ---------------------------

def load_bench_crawl() -> ModuleType:
    """``tools/bench_crawl.py``, for its site generator and server (tools/ is no package)."""
    if "bench_crawl" in sys.modules:
        return sys.modules["bench_crawl"]
    spec = importlib.util.spec_from_file_location(
        "bench_crawl", Path(__file__).resolve().with_name("bench_crawl.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_crawl"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@dataclass
class CrawlRun:
    processes: int
    rep: int
    wall_s: float
    pages: int  # counts.done of the crawl's JSON result
    pages_per_s: float
    server_pages_per_s: float  # over the server's first to last request of this crawl
    parent_cpu_s: float  # the crawl process: scheduler, frontier, writer (and all, at N=0)
    workers_cpu_s: float  # its reaped children: the N worker processes
    load_1m: float  # the machine's 1-minute load average as the crawl started


def crawl_command(url: str, store: Path, workers: int, processes: int | str) -> list[str]:
    return [sys.executable, "-m", "evidence", "crawl", url, "--store", str(store),
            "--workers", str(workers), "--per-host", str(workers),
            "--processes", str(processes), "--json"]


def crawl_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT) + (
        os.pathsep + path if path else "")}


def exited_cpu(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of an exited, not yet reaped, process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])  # stat fields 14-17
    tick = os.sysconf("SC_CLK_TCK")
    return (utime + stime) / tick, (cutime + cstime) / tick


def run_crawl(bc: ModuleType, server, documents: int, work: Path, processes: int,
              rep: int, workers: int) -> CrawlRun:
    name = f"crawl-p{processes}-{rep}"
    store = work / name
    cmd = crawl_command(server.url, store, workers, processes)
    load = bc.load_average()
    offset = server.mark()
    with (work / f"{name}.out").open("w") as out, (work / f"{name}.err").open("w") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=crawl_env(),
                                cwd=PACKAGE_ROOT)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        wall = time.perf_counter() - started
        parent_cpu, workers_cpu = exited_cpu(proc.pid)
        status = proc.wait()
    time.sleep(0.05)  # the server's last log lines
    span, _duplicates, served = bc.window(server.requests_since(offset))
    try:
        result = json.loads((work / f"{name}.out").read_text())
    except ValueError:
        result = {}
    pages = result.get("counts", {}).get("done", 0)
    if status != 0 or result.get("outcome") != "completed" or not pages == served == documents:
        print((work / f"{name}.err").read_text()[-2000:], file=sys.stderr)
        raise SystemExit(
            f"crawl --processes {processes} rep {rep}: exit {status}, outcome "
            f"{result.get('outcome')!r}, {pages} pages done and {served} served of "
            f"{documents}; rerun with --workdir DIR to keep the logs")
    shutil.rmtree(store, ignore_errors=True)
    return CrawlRun(processes=processes, rep=rep, wall_s=round(wall, 3), pages=pages,
                    pages_per_s=round(pages / wall, 1),
                    server_pages_per_s=round(pages / span, 1) if span else 0.0,
                    parent_cpu_s=round(parent_cpu, 2), workers_cpu_s=round(workers_cpu, 2),
                    load_1m=round(load, 2))


def crawl_summary(runs: list[CrawlRun], processes: list[int]) -> list[dict]:
    """Per N: medians over the reps, and the ratios to N=0 (of medians, and per rep)."""
    base = {r.rep: r.pages_per_s for r in runs if r.processes == 0}
    base_median = statistics.median(base.values())
    out = []
    for n in processes:
        rs = [r for r in runs if r.processes == n]
        rates = [r.pages_per_s for r in rs]
        median = statistics.median(rates)
        out.append({
            "processes": n, "reps": len(rs), "median_pages_per_s": round(median, 1),
            "min_pages_per_s": min(rates), "max_pages_per_s": max(rates),
            "ratio": round(median / base_median, 2),
            "ratio_per_rep": [round(r.pages_per_s / base[r.rep], 2) for r in rs],
            "median_server_pages_per_s": round(
                statistics.median(r.server_pages_per_s for r in rs), 1),
            "median_wall_s": round(statistics.median(r.wall_s for r in rs), 2),
            "parent_cpu_ms_per_page": round(statistics.median(
                1000 * r.parent_cpu_s / r.pages for r in rs), 2),
            "workers_cpu_ms_per_page": round(statistics.median(
                1000 * r.workers_cpu_s / r.pages for r in rs), 2)})
    return out


def run_crawls(args: argparse.Namespace) -> dict:
    """Generate and serve the site, crawl it at each --crawl-processes, alternating."""
    bc = load_bench_crawl()
    work = args.workdir / "crawl"
    work.mkdir()
    for path in (args.workdir, work):  # nginx workers may run as another user
        path.chmod(0o755)
    site = bc.generate_site(work / "site", args.crawl_pages)
    print(f"bytecode: {bc.precompile()}", file=sys.stderr, flush=True)  # as installed
    server = bc.Server(work, work / "site", args.crawl_server)
    runs: list[CrawlRun] = []
    try:
        print(f"crawl: {site['documents']} pages served by {server.name} at {server.url}\n"
              f"$ PYTHONPATH={shlex.quote(str(PACKAGE_ROOT))} " + shlex.join(crawl_command(
                  server.url, Path("STORE"), args.crawl_workers, "N")),
              file=sys.stderr, flush=True)
        for rep in range(args.crawl_reps):
            order = args.crawl_processes[::-1 if rep % 2 else 1]
            for n in order:
                run = run_crawl(bc, server, site["documents"], work, n, rep,
                                args.crawl_workers)
                runs.append(run)
                print(f"  --processes {n} #{rep}: {run.pages} pages in {run.wall_s:.2f} s = "
                      f"{run.pages_per_s:.1f} pages/s; CPU s parent {run.parent_cpu_s:.1f}, "
                      f"workers {run.workers_cpu_s:.1f}; load {run.load_1m:.1f}",
                      file=sys.stderr, flush=True)
    finally:
        server.close()
    return {"site": site, "server": server.name, "workers": args.crawl_workers,
            "reps": args.crawl_reps,
            "command": crawl_command(server.url, Path("STORE"), args.crawl_workers, "N"),
            "pythonpath": str(PACKAGE_ROOT),
            "runs": [asdict(r) for r in runs],
            "summary": crawl_summary(runs, args.crawl_processes)}


# --- reporting ----------------------------------------------------------------------------

def environment(args: argparse.Namespace) -> dict[str, object]:
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "sqlite": apsw.sqlite_lib_version(),
            "apsw": apsw.apsw_version(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "evidence": str(PACKAGE_ROOT), "sync": args.sync, "window": args.window,
            "artifacts": args.artifacts, "batch_delay": BATCH_DELAY}


def table(results: list[Result]) -> str:
    head = (f"{'workload':<8} {'mode':<10} {'msgs':>7} {'msg/s':>8} {'ratio':>6} "
            f"{'ack p50':>8} {'ack p99':>8} {'batches':>7} {'mean':>6} {'commit p50':>10}")
    lines = [head, "-" * len(head)]
    for r in results:
        mode = "inproc" if r.mode == "inproc" else f"service x{r.clients}"
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(f"{r.workload:<8} {mode:<10} {r.messages:>7} {r.messages_per_s:>8.0f} "
                     f"{ratio:>6} {r.ack_p50_ms:>6.1f}ms {r.ack_p99_ms:>6.1f}ms "
                     f"{r.batches:>7} {r.mean_batch:>6.1f} {r.commit_p50_ms:>8.1f}ms")
    return "\n".join(lines)


def crawl_table(crawl: dict) -> str:
    head = (f"{'processes':>9} {'pages/s':>8} {'min-max':>13} {'ratio':>6} {'per rep':>16} "
            f"{'srv pages/s':>11} {'wall s':>7} {'parent CPU':>10} {'workers CPU':>11}")
    lines = [head, "-" * len(head)]
    for s in crawl["summary"]:
        spread = f"{s['min_pages_per_s']:.0f}-{s['max_pages_per_s']:.0f}"
        ratio, per_rep = "", ""  # the baseline's are 1 by definition
        if s["processes"] != 0:
            ratio = f"{s['ratio']:.2f}"
            per_rep = ",".join(f"{x:.2f}" for x in s["ratio_per_rep"])
        lines.append(f"{s['processes']:>9} {s['median_pages_per_s']:>8.1f} {spread:>13} "
                     f"{ratio:>6} {per_rep:>16} "
                     f"{s['median_server_pages_per_s']:>11.1f} {s['median_wall_s']:>7.2f} "
                     f"{s['parent_cpu_ms_per_page']:>7.2f} ms "
                     f"{s['workers_cpu_ms_per_page']:>8.2f} ms")
    return "\n".join(lines)


def csv_list(kind: type) -> object:
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"a comma-separated list: {text!r}") from None
    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", metavar="N", type=int,
                        help="messages per configuration (default 20000; 0: no writer "
                        "service runs)")
    parser.add_argument("--clients", metavar="N,N", type=csv_list(int), default=[1, 2, 4],
                        help="client process counts (default 1,2,4)")
    parser.add_argument("--workload", metavar="NAME,NAME", type=csv_list(str),
                        help="attempt and/or page (default both)")
    parser.add_argument("--window", metavar="N", type=int, default=256,
                        help="requests in flight per client process, and in-process "
                        "producer tasks (default 256)")
    parser.add_argument("--sync", choices=("full", "normal"), default="full",
                        help="store durability (default full, the product default)")
    parser.add_argument("--artifacts", metavar="N", type=int, default=200,
                        help="distinct bodies in the artifact store (default 200)")
    parser.add_argument("--crawl-pages", type=int, metavar="N",
                        help="pages in the crawled site (default 3000; 0: no crawl)")
    parser.add_argument("--crawl-reps", type=int, metavar="N",
                        help="crawls per --processes value, alternating order (default 3)")
    parser.add_argument("--crawl-workers", type=int, default=16, metavar="N",
                        help="the crawl's --workers and --per-host (default 16)")
    parser.add_argument("--crawl-processes", type=csv_list(int), default=[0, 2],
                        metavar="N,N", help="the crawl's --processes values (default 0,2; "
                        "0, the single-process crawl, always runs as the baseline)")
    parser.add_argument("--crawl-server", choices=("auto", "nginx", "python"), default="auto",
                        help="the site's server: auto (default) is nginx when installed, "
                        "else bench_crawl.py's Python server")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 4000 messages, attempt workload only, a "
                        "300-page crawl once (options given still apply)")
    parser.add_argument("--workdir", metavar="DIR", type=Path,
                        help="where stores, logs and the crawled site go (default: a temp "
                        "dir, removed)")
    parser.add_argument("--out", metavar="FILE", type=Path,
                        default=Path("bench-out/bench_service.json"),
                        help="JSON results (default bench-out/bench_service.json)")
    parser.add_argument("--worker", metavar="SOCKET", help=argparse.SUPPRESS)
    parser.add_argument("start", nargs="?", type=int, help=argparse.SUPPRESS)
    parser.add_argument("stop", nargs="?", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--go", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for key, quick, full in (("messages", 4000, 20_000), ("workload", ["attempt"],
                              ["attempt", "page"]), ("crawl_pages", 300, 3000),
                             ("crawl_reps", 1, 3)):
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    bad = set(args.workload) - {"attempt", "page"}
    if bad:
        parser.error(f"unknown workload {sorted(bad)}: use attempt and/or page")
    if any(n < 0 for n in args.crawl_processes):
        parser.error("--crawl-processes: each value must be 0 or more")
    if args.crawl_reps < 1 or args.crawl_workers < 1 or args.crawl_pages < 0:
        parser.error("--crawl-reps and --crawl-workers must be 1 or more, --crawl-pages 0 "
                     "or more")
    args.crawl_processes = list(dict.fromkeys([0, *args.crawl_processes]))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    keep = args.workdir is not None
    args.workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="bench-service-"))).resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    crawl: dict | None = None
    try:
        for workload in args.workload if args.messages > 0 else []:
            per_request = 1 if workload == "attempt" else 2
            count = args.messages // per_request
            store = args.workdir / f"store-{workload}"
            configs = [0, *args.clients]
            for clients in configs:
                label = "inproc" if clients == 0 else f"service x{clients}"
                print(f"{workload}: {label}, {count * per_request} messages ...",
                      file=sys.stderr, flush=True)
                fresh_store(store, args.sync, args.artifacts)
                result = (run_inproc(store, workload, count, args) if clients == 0
                          else run_service(store, workload, count, clients, args))
                stored = ledger_size(store) - 2
                if stored != result.messages:
                    raise SystemExit(f"{label}: {stored} messages stored, expected "
                                     f"{result.messages}")
                results.append(result)
            base = next(r for r in results if r.workload == workload and r.mode == "inproc")
            for r in results:
                if r.workload == workload and r.mode == "service":
                    r.ratio = round(r.messages_per_s / base.messages_per_s, 2)
        if args.crawl_pages > 0:
            crawl = run_crawls(args)
    finally:
        if not keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    env = environment(args)
    rerun = "python tools/bench_service.py " + shlex.join(
        a for a in (argv if argv is not None else sys.argv[1:]))
    if results:
        print(f"\nwriter service vs in-process writer (sync={args.sync}, window "
              f"{args.window}, {env['cpus']} CPUs, load average {env['load_average'][0]}, "
              f"SQLite {env['sqlite']})\n")
        print(table(results))
        print("\nratio: messages/s over the in-process writer's, same workload, same run.")
    if crawl:
        reps = f"{crawl['reps']} rep{'s' if crawl['reps'] > 1 else ''}"
        print(f"\ncrawl --processes N vs the single-process crawl (N=0): "
              f"{crawl['site']['documents']} pages (mean {crawl['site']['mean_page_bytes']} B), "
              f"--workers {crawl['workers']}, {reps},\n{crawl['server']}, "
              f"{env['cpus']} CPUs, load average {env['load_average'][0]}\n")
        print(crawl_table(crawl))
        print("\npages/s: pages over the crawl process's wall time, median over reps (min-max);"
              "\nratio: median pages/s over N=0's in this run (per rep: over N=0's same rep);"
              "\nsrv pages/s: over the server's first to last request; CPU: ms per page, "
              "median, of the\ncrawl process and of its worker processes.")
    print(f"rerun: {rerun.strip()}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"environment": env, "results": [asdict(r) for r in results],
                                    "crawl": crawl, "rerun": rerun.strip()}, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
