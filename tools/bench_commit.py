"""Benchmark the writer's batches on a real crawl's messages (issue 15).

A crawl's CPU is spread over threads that share the GIL: the event loop (HTTP, storing
and parsing pages, and applying a local store's batches) and the writer's commit thread
(a batch's fsyncs and COMMIT; a server-backed store's whole batch). Timed inside a crawl,
the writer's share moves with everything else on the machine; replayed alone, it does
not. So:

1. record: ``tools/bench_crawl.py``'s site of ``--pages`` pages is generated and served on
   127.0.0.1 (nginx when installed, else its asyncio server), and crawled in this process
   (``evidence crawl URL --store S --workers 8 --per-host 8``), every group the crawl
   submits to its writer kept as its canonical bytes;
2. replay, ``--reps`` times, into a fresh store each time (every payload the messages name
   put first, untimed): the groups go to one ``Writer`` ``--groups`` at a time (submitted
   together, then awaited: about the batches the crawl made at 8 pages in flight).

Reported per replay: the writer's CPU per page (``time.thread_time`` around each batch,
on whichever thread runs each part of it), the wall time inside batches and the
batches; medians at the end, and the SQL statements the writer ran per page, counted in
one more replay (apsw's exec trace, which costs time of its own: an ``executemany``
counts once per row).

    python tools/bench_commit.py [--pages 5000] [--reps 3] [--groups 4] [--quick]

Network: only 127.0.0.1.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_crawl

from evidence import Store, Writer
from evidence._cli.main import main as evidence_main
from evidence._model.messages import (
    Discovery,
    FetchAttempt,
    Message,
    canonical_encode,
    decode_message,
)
from evidence._model.refs import ArtifactRef
from evidence._write import writer


def payloads(message: Message) -> list[ArtifactRef]:
    """The payloads a crawl's message names (spelled here, not imported: the tool runs
    against older versions of the writer too, with PYTHONPATH)."""
    if isinstance(message, FetchAttempt):
        refs = [message.request_headers, message.response_headers, message.body,
                message.content, message.surplus]
        return [ref for ref in refs if ref is not None]
    if isinstance(message, Discovery):
        return [message.source_artifact]
    return []


def record(url: str, store: Path) -> list[list[bytes]]:
    """Crawl ``url`` in this process; every group submitted to the writer, encoded."""
    groups: list[list[bytes]] = []
    submit = writer.Writer.submit_group

    async def recording(self: Writer, messages: list[Message], **kw: bool) -> list:
        groups.append([canonical_encode(m) for m in messages])
        return await submit(self, messages, **kw)

    writer.Writer.submit_group = recording  # type: ignore[assignment,method-assign]
    try:
        argv = ["crawl", url, "--store", str(store), "--workers", "8", "--per-host", "8"]
        if evidence_main(argv) not in (0, None):
            raise SystemExit("the recording crawl failed")
    finally:
        writer.Writer.submit_group = submit  # type: ignore[method-assign]
    return groups


def replay(groups: list[list[Message]], source: Store, target: Path, per: int, *,
           traced: bool = False) -> dict:
    """Submit ``groups`` to a writer of a new store, ``per`` at a time; measure its thread."""
    shutil.rmtree(target, ignore_errors=True)
    seen: set[tuple[str, str]] = set()
    with Store.create(target) as store:
        for group in groups:
            for message in group:
                for ref in payloads(message):
                    if (ref.namespace, ref.digest) not in seen:
                        seen.add((ref.namespace, ref.digest))
                        store.artifacts.put(ref.namespace, source.artifacts.read(ref))
        counts = {"cpu": 0.0, "wall": 0.0, "batches": 0, "statements": 0}

        def trace(cursor: object, sql: str, bindings: object) -> bool:
            counts["statements"] += 1  # the write connection: the writer's statements only
            return True

        if traced:  # a replay of its own: the trace costs the writer time
            store.connection.exec_trace = trace
        commit = writer.Writer._commit_batch

        def timing(run: Callable[[], object]) -> object:
            wall, cpu = time.monotonic(), time.thread_time()
            try:
                return run()
            finally:
                counts["cpu"] += time.thread_time() - cpu
                counts["wall"] += time.monotonic() - wall

        def timed(self: Writer, batch: list, **kw: object) -> object:
            # Applied on the event loop's thread, a batch's fsyncs (its tail) run on the
            # commit thread: timed there too (a writer without tails returns the acks).
            result = timing(lambda: commit(self, batch, **kw))
            counts["batches"] += 1
            tail = getattr(writer, "_Tail", None)
            if tail is not None and isinstance(result, tail):
                run = result.run
                result.run = lambda: timing(run)
            return result

        writer.Writer._commit_batch = timed  # type: ignore[method-assign]
        try:
            async def feed() -> None:
                async with Writer(store) as w:
                    for i in range(0, len(groups), per):
                        async with anyio.create_task_group() as tg:
                            for group in groups[i:i + per]:
                                tg.start_soon(w.submit_group, group)

            anyio.run(feed)
        finally:
            writer.Writer._commit_batch = commit  # type: ignore[method-assign]
    shutil.rmtree(target, ignore_errors=True)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=5000, help="site size (default 5000)")
    parser.add_argument("--reps", type=int, default=3, help="replays (default 3)")
    parser.add_argument("--groups", type=int, default=4,
                        help="groups submitted together (default 4)")
    parser.add_argument("--server", choices=("auto", "nginx", "python"), default="auto",
                        help="what serves the site (default auto: nginx when installed)")
    parser.add_argument("--quick", action="store_true", help="300 pages, one replay")
    args = parser.parse_args(argv)
    if args.quick:
        args.pages, args.reps = 300, 1
    work = Path(tempfile.mkdtemp(prefix="bench-commit-"))
    work.chmod(0o755)
    try:
        bench_crawl.generate_site(work / "site", args.pages)
        server = bench_crawl.Server(work, work / "site", args.server)
        try:
            encoded = record(server.url, work / "recorded")
        finally:
            server.close()
        groups = [[decode_message(data) for data in group] for group in encoded]
        pages = sum(1 for g in groups for m in g if type(m).__name__ == "FetchAttempt")
        print(f"recorded {len(groups)} groups, {sum(map(len, groups))} messages, "
              f"{pages} attempts; server: {server.name}", flush=True)
        results = []
        with Store.open(work / "recorded") as source:
            for rep in range(args.reps):
                load = bench_crawl.load_average()
                r = replay(groups, source, work / "replay", args.groups)
                results.append(r)
                print(f"replay #{rep}: writer CPU {r['cpu'] / pages * 1e3:.3f} ms/page, "
                      f"in batches {r['wall']:.2f} s, {r['batches']} batches, "
                      f"load {load:.1f}", flush=True)
            traced = replay(groups, source, work / "replay", args.groups, traced=True)
        med = statistics.median
        print(f"median: writer CPU {med(r['cpu'] for r in results) / pages * 1e3:.3f} "
              f"ms/page, in batches {med(r['wall'] for r in results):.2f} s; "
              f"{traced['statements'] / pages:.1f} SQL statements per page (a traced replay)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
