"""A worker process of ``evidence crawl --processes N`` (``_crawl.workers``): a new
interpreter started by the crawl with one end of a socketpair (``main``). It reads its
``Setup``, opens the store's artifact store (files or an s3:// location: no child opens
the database) and a ``PageWorker``, then requests each page it is ordered, submits its
evidence through ``evidence.client`` and answers ``Fetched`` and ``Done`` (or
``Failed``). It ends when its channel does.

Separate from the pool because it is the other process: what runs here never reads the
store, and the crawl's side (``WorkerPool``) never runs a page.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import msgspec

from .._errors import EvidenceError
from .._model.logs import FORMATS, LEVELS, JsonFormatter, add_log_context, log_context, set_level
from .._net import wrap_socket
from .._store.artifactspec import open_artifacts
from .._store.db import ARTIFACTS_DIR
from .._store.location import is_s3_url, is_server_database
from .._store.resync import SYNC_MARKER
from .._write.wire import FrameReader, encode_frame
from .frontier import CrawlConfig
from .heap import bound_heap
from .http import Client, crawl_client
from .netpolicy import NetworkPolicy
from .pages import PageWorker
from .proxy import crawl_routes
from .workerchannel import Done, Fetched, Order, Ready, Setup, _down, _read, failed

__all__ = ["main", "proxied_client"]

log = logging.getLogger("evidence.crawl")


def proxied_client(config: CrawlConfig, setup: Setup) -> Client:
    """A worker's HTTP client: the crawl's network policy and proxies (``_crawl.proxy``),
    the proxies' credentials from the setup (the recorded configuration has none)."""
    proxies = crawl_routes(config.proxy, config.proxies, remote_dns=config.proxy_remote_dns,
                           credentials=setup.proxy_credentials)
    policy = NetworkPolicy(allow=config.allow_network, seeds=[*config.seeds, *proxies.urls()])
    return crawl_client(connections=setup.connections, timeout=setup.timeout, policy=policy,
                        proxies=proxies, http1_only=config.http1_only)


async def _child(fd: int) -> None:
    stream = await wrap_socket(socket.socket(fileno=fd))
    async with stream:
        reader = FrameReader(stream)
        setup = await _read(reader, _down)
        if not isinstance(setup, Setup):
            raise SystemExit("evidence worker: the channel did not start with a setup frame")
        config = msgspec.convert(setup.config, CrawlConfig)
        add_log_context(run_id=setup.run_id, session_id=setup.session_id)  # this process's
        # Its own pack (packs), files, or an s3:// location opened with this process's
        # environment (its credentials): the writer in the parent syncs what it appends.
        spec = setup.artifacts or None
        server = is_server_database(setup.store)  # no store directory: no store marker
        local = (Path(spec) if spec is not None and not is_s3_url(spec)
                 else Path(setup.store) / ARTIFACTS_DIR)
        artifacts = open_artifacts(spec, local=local, create=False, read_only=False,
                                   store_marker=None if server
                                   else Path(setup.store) / SYNC_MARKER)
        http = proxied_client(config, setup)
        from ..client import AsyncClient  # here: the package imports this module

        try:
            async with AsyncClient(setup.socket, name=setup.name) as service, http:
                pages = PageWorker(config=config, session_id=setup.session_id,
                                   run_id=setup.run_id, artifacts=artifacts, client=http,
                                   submit=service.submit_group, deadline=setup.deadline)
                lock = anyio.Lock()

                async def answer(frame: msgspec.Struct) -> None:
                    async with lock:
                        try:
                            await stream.send(encode_frame(frame))
                        except _BROKEN as exc:
                            raise _CrawlGone from exc

                async def run(order: Order) -> None:
                    try:
                        with log_context(url=order.page.url):
                            effects = await pages.page(
                                order.page, lambda: answer(Fetched(id=order.id)))
                    except _CrawlGone:
                        raise  # not the page's failure: nobody is left to tell
                    except Exception as exc:  # the parent fails the run with this reason
                        await answer(failed(order, exc, setup.name))
                    else:
                        await answer(Done(id=order.id, effects=effects))

                await answer(Ready(pid=os.getpid()))
                async with anyio.create_task_group() as tg:
                    while (order := await _next_order(reader)) is not None:
                        tg.start_soon(run, order)
                    tg.cancel_scope.cancel()  # the parent is gone: so is this run
        finally:
            artifacts.close()  # seals this process's pack


def _ends_with(parent: int) -> bool:
    """Have the kernel end this process when the crawl's does (Linux's PR_SET_PDEATHSIG,
    prctl option 1, with SIGKILL: what a crash of this process would leave, the next open
    recovers). A worker still starting (connecting to the writer service, which retries
    for a minute) reads no channel that could tell it, and outlived a killed crawl by that
    minute, holding its output pipes open. False if the crawl is gone already."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    return os.getppid() == parent


class _CrawlGone(Exception):
    """The channel to the crawl broke: the crawl process is gone (killed, or out of
    memory). Not an error of this process and no traceback: this process ends, and the
    crawl's next start requeues the pages it held."""


_BROKEN = (OSError, anyio.BrokenResourceError, anyio.EndOfStream)


async def _next_order(reader: FrameReader) -> Order | None:
    try:
        order = await _read(reader, _down)
    except _BROKEN as exc:
        raise _CrawlGone from exc
    return order


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="evidence worker",
        description="A crawl worker process, started by 'evidence crawl --processes N' "
        "with one end of a socketpair; not for direct use.")
    parser.add_argument("--channel-fd", type=int, required=True,
                        help="the file descriptor of this worker's channel to the crawl")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="the crawl's pid: this process ends when that one does")
    parser.add_argument("--log-format", choices=FORMATS, default="text",
                        help="as the crawl logs")
    parser.add_argument("--log-level", choices=LEVELS, default="info", help="as the crawl logs")
    args = parser.parse_args(argv)
    if args.parent_pid is not None and not _ends_with(args.parent_pid):
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the crawl, which stops us
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if args.log_format == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s [worker pid %(process)d] %(message)s"))
    logging.basicConfig(handlers=[handler])
    set_level(args.log_level)
    bound_heap()  # as the crawl's own process (``_crawl.heap``)
    try:
        anyio.run(_child, args.channel_fd)
    except EvidenceError as exc:  # one of ours (a store it cannot open): its message says it
        log.error("this worker process could not go on: %s", exc,
                  extra={"event": "worker.failed"})
        return 1
    except (_CrawlGone, *_BROKEN):
        return 1  # the crawl went away (before its orders, or mid-answer)
    except BaseExceptionGroup as group:  # ... or while its orders ran
        if group.split(_CrawlGone)[1] is not None:
            raise
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
