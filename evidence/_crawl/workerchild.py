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
                        await stream.send(encode_frame(frame))

                async def run(order: Order) -> None:
                    try:
                        with log_context(url=order.page.url):
                            effects = await pages.page(
                                order.page, lambda: answer(Fetched(id=order.id)))
                    except Exception as exc:  # the parent fails the run with this reason
                        await answer(failed(order, exc, setup.name))
                    else:
                        await answer(Done(id=order.id, effects=effects))

                await answer(Ready(pid=os.getpid()))
                async with anyio.create_task_group() as tg:
                    while (order := await _read(reader, _down)) is not None:
                        tg.start_soon(run, order)
                    tg.cancel_scope.cancel()  # the parent is gone: so is this run
        finally:
            artifacts.close()  # seals this process's pack


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="evidence worker",
        description="A crawl worker process, started by 'evidence crawl --processes N' "
        "with one end of a socketpair; not for direct use.")
    parser.add_argument("--channel-fd", type=int, required=True,
                        help="the file descriptor of this worker's channel to the crawl")
    parser.add_argument("--log-format", choices=FORMATS, default="text",
                        help="as the crawl logs")
    parser.add_argument("--log-level", choices=LEVELS, default="info", help="as the crawl logs")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the crawl, which stops us
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if args.log_format == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s [worker pid %(process)d] %(message)s"))
    logging.basicConfig(handlers=[handler])
    set_level(args.log_level)
    try:
        anyio.run(_child, args.channel_fd)
    except EvidenceError as exc:  # one of ours (a store it cannot open): its message says it
        log.error("this worker process could not go on: %s", exc,
                  extra={"event": "worker.failed"})
        return 1
    except (OSError, anyio.BrokenResourceError, anyio.EndOfStream):
        return 1  # the crawl went away mid-answer
    return 0


if __name__ == "__main__":
    sys.exit(main())
