#!/usr/bin/env python3
"""Benchmark the writer service (issue 5): messages through ``evidence serve`` from 1, 2 and
4 client processes, against the in-process ``Writer`` on the same messages in the same run.

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

Examples:
  python tools/bench_service.py                 # both workloads, 1/2/4 clients, ~2 min
  python tools/bench_service.py --quick         # smoke test, < 40 s
  python tools/bench_service.py --sync normal --clients 1,4 --messages 50000
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import anyio
import apsw
import blake3
import msgspec

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
    from evidence._cli import build_parser

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


# --- reporting ----------------------------------------------------------------------------

def environment(args: argparse.Namespace) -> dict[str, object]:
    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "sqlite": apsw.sqlite_lib_version(),
            "apsw": apsw.apsw_version(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "sync": args.sync, "window": args.window,
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


def csv_list(kind: type) -> object:
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"a comma-separated list: {text!r}") from None
    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000,
                        help="messages per configuration (default 20000)")
    parser.add_argument("--clients", type=csv_list(int), default=[1, 2, 4],
                        help="client process counts (default 1,2,4)")
    parser.add_argument("--workload", type=csv_list(str), default=["attempt", "page"],
                        help="attempt and/or page (default both)")
    parser.add_argument("--window", type=int, default=256,
                        help="requests in flight per client process, and in-process "
                        "producer tasks (default 256)")
    parser.add_argument("--sync", choices=("full", "normal"), default="full",
                        help="store durability (default full, the product default)")
    parser.add_argument("--artifacts", type=int, default=200,
                        help="distinct bodies in the artifact store (default 200)")
    parser.add_argument("--quick", action="store_true",
                        help="4000 messages, attempt workload only: a smoke test")
    parser.add_argument("--workdir", type=Path,
                        help="where stores and service logs go (default: a temp dir, removed)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/bench_service.json"),
                        help="JSON results (default bench-out/bench_service.json)")
    parser.add_argument("--worker", metavar="SOCKET", help=argparse.SUPPRESS)
    parser.add_argument("start", nargs="?", type=int, help=argparse.SUPPRESS)
    parser.add_argument("stop", nargs="?", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--go", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.workload = 4000, ["attempt"]
    bad = set(args.workload) - {"attempt", "page"}
    if bad:
        parser.error(f"unknown workload {sorted(bad)}: use attempt and/or page")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    keep = args.workdir is not None
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-service-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    try:
        for workload in args.workload:
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
    finally:
        if not keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    env = environment(args)
    rerun = "python tools/bench_service.py " + shlex.join(
        a for a in (argv if argv is not None else sys.argv[1:]))
    print(f"\nwriter service vs in-process writer (sync={args.sync}, window {args.window}, "
          f"{env['cpus']} CPUs, load average {env['load_average'][0]}, SQLite "
          f"{env['sqlite']})\n")
    print(table(results))
    print("\nratio: messages/s over the in-process writer's, same workload, same run."
          f"\nrerun: {rerun.strip()}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"environment": env, "results": [asdict(r) for r in results],
                                    "rerun": rerun.strip()}, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
