"""A worker host: ``evidence worker --connect HOST:PORT``, on a machine other than the
crawl's.

It connects to the crawl's writer service (TLS and a token), says ``role: worker``, and
gets a ``Setup`` naming it; then it is a ``PageWorker`` like a local worker process
(``_crawl/workers.py``): it takes orders (the URLs the coordinator leased to it), fetches
them, puts their payloads into the store's object store (``s3://``, opened with this
host's own credentials), and submits each page's messages through a second connection to
the same service, under the name the coordinator gave it. Both sides beat every
``heartbeat`` seconds on the channel; silence for ``lease_timeout`` ends it.

When the channel ends without a ``Bye`` (the coordinator restarted, the network failed,
the lease expired), whatever this host held is the coordinator's to settle: the host
cancels its orders and connects again, with backoff, as a new worker (the old name is
fenced). A ``Bye`` (the run is over) ends the program with status 0; no coordinator for
``reconnect_timeout`` seconds, with status 1.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import ssl
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import msgspec

from .._errors import EvidenceError, ServiceError
from .._model.acks import Ack
from .._model.logs import log_context
from .._model.messages import Message
from .._store.artifactspec import open_artifacts
from .._write.tally import Tally
from .._write.wire import (
    PEER_GONE,
    PROTOCOL_VERSION,
    ErrorFrame,
    FrameReader,
    Hello,
    ProtocolError,
    Welcome,
    decode_server_frame,
    encode_frame,
    gone_in_words,
)
from .frontier import CrawlConfig
from .pages import PageWorker
from .workerchannel import (
    Beat,
    Bye,
    Done,
    Fetched,
    Order,
    Ready,
    Setup,
    _down,
    _read,
    failed,
)
from .workerchild import proxied_client

__all__ = ["HostOptions", "HostStatistics", "serve_coordinator"]

log = logging.getLogger("evidence.worker")


@dataclass(frozen=True, kw_only=True)
class HostOptions:
    address: tuple[str, int]
    token: str
    tls: ssl.SSLContext | None
    local_host: str | None = None  # the address to connect from
    name: str = ""  # how this host introduces itself (default: host name and pid)
    reconnect_timeout: float = 60.0
    connect_timeout: float = 10.0
    metrics: str | None = None  # "HOST:PORT": Prometheus metrics (``_crawl.metrics``)
    metrics_public: bool = False  # ``metrics`` may be an address beyond this machine


@dataclass
class HostStatistics:
    """What this host did, for its metrics: its channels to the coordinator, the pages
    leased to it, and what its submissions recorded (counted as they were acknowledged
    ``committed``, as the writer counts)."""

    tally: Tally = field(default_factory=Tally)
    run_id: str = ""  # the run served last
    connected: bool = False  # a channel to the coordinator is open
    channels: int = 0  # channels opened
    orders: int = 0  # pages leased to this host
    in_flight: int = 0  # of those, not answered yet


class _Lost(Exception):
    """The channel ended without a Bye: connect again."""


class _Refused(Exception):
    """The service refused us for a while (not started yet, stopping, full)."""


async def serve_coordinator(options: HostOptions) -> int:
    """Work for the coordinator until it says Bye (0), or cannot be reached (1)."""
    statistics = HostStatistics()
    if options.metrics is None:
        return await _serve_coordinator(options, statistics)
    from .metrics import host_families, metrics_endpoint

    async with metrics_endpoint(options.metrics, lambda: host_families(statistics),
                                public=options.metrics_public):
        return await _serve_coordinator(options, statistics)


async def _serve_coordinator(options: HostOptions, statistics: HostStatistics) -> int:
    lost_at, delay = time.monotonic(), 0.1
    while True:
        try:
            await _session(options, statistics)
            return 0
        except ServiceError:
            raise
        except (OSError, TimeoutError, anyio.BrokenResourceError, anyio.EndOfStream,
                ProtocolError, _Lost, _Refused) as exc:
            if isinstance(exc, ssl.SSLCertVerificationError):
                raise ServiceError(f"the coordinator at {options.address[0]}:"
                                   f"{options.address[1]} failed TLS verification: "
                                   f"{exc.verify_message or exc}", code="tls",
                                   hint="give its certificate (or CA) with --tls-ca, and "
                                   "dial an address the certificate names") from None
            if isinstance(exc, _Lost):
                lost_at, delay = time.monotonic(), 0.1
                log.warning("lost the coordinator (%s); connecting again as a new worker",
                            exc, extra={"event": "worker.coordinator_lost"})
            waited = time.monotonic() - lost_at
            if waited >= options.reconnect_timeout:
                log.error("no coordinator at %s:%d for %.0f s (last: %s); giving up",
                          *options.address, waited, exc or type(exc).__name__,
                          extra={"event": "worker.gave_up"})
                return 1
            await anyio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 2.0)


async def _connect(options: HostOptions) -> tuple[anyio.abc.ByteStream, FrameReader]:
    from ..client import connect_service  # here: the package imports this module

    name = options.name or f"{socket.gethostname()} pid {os.getpid()}"
    with anyio.fail_after(options.connect_timeout):
        stream = await connect_service(options.address, tls=options.tls,
                                       local_host=options.local_host)
        try:
            await stream.send(encode_frame(Hello(versions=[PROTOCOL_VERSION],
                                                 token=options.token, client=name,
                                                 role="worker")))
            reader = FrameReader(stream)
            size = await reader.read_header()
            if size is None:
                raise anyio.EndOfStream
            frame = decode_server_frame(await reader.read_body(size))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            raise
    if isinstance(frame, Welcome):
        return stream, reader
    await stream.aclose()
    if isinstance(frame, ErrorFrame) and frame.retryable:
        raise _Refused(f"{frame.code}: {frame.message}")
    if isinstance(frame, ErrorFrame):
        raise ServiceError(f"the coordinator refused this worker: {frame.message}",
                           code=frame.code, hint=frame.hint or (
                               "check the token file" if frame.code == "unauthorized"
                               else "run the same version of evidence on both hosts"))
    raise ServiceError("the coordinator answered the hello with a "
                       f"{type(frame).__name__} frame", code="protocol")


async def _session(options: HostOptions, statistics: HostStatistics) -> None:
    """One channel, from hello to Bye (returns) or its loss (``_Lost``)."""
    from ..client import AsyncClient

    stream, reader = await _connect(options)
    statistics.channels += 1
    statistics.connected = True
    async with stream, _disconnected(statistics):
        with anyio.fail_after(options.connect_timeout):
            setup = await _read(reader, _down)
        if not isinstance(setup, Setup):
            raise ServiceError("the coordinator did not start with a setup frame",
                               code="protocol")
        if not setup.artifacts.startswith("s3://"):
            raise ServiceError("the crawl's payloads are not in an object store this host "
                               "can reach", hint="start the crawl with --artifacts s3://...")
        config = msgspec.convert(setup.config, CrawlConfig)
        artifacts = await anyio.to_thread.run_sync(lambda: open_artifacts(
            setup.artifacts, local=Path(os.devnull), create=False, read_only=False))
        http = proxied_client(config, setup)
        address = f"{options.address[0]}:{options.address[1]}"
        try:
            async with AsyncClient(address=address, token=options.token, tls=options.tls,
                                   name=setup.name, local_host=options.local_host
                                   ) as service, http:
                async def submit(messages: Sequence[Message]) -> list[Ack]:
                    acks = await service.submit_group(messages)
                    for message, ack in zip(messages, acks, strict=True):
                        if ack.status == "committed":
                            statistics.tally.add(message)
                    return acks

                pages = PageWorker(config=config, session_id=setup.session_id,
                                   run_id=setup.run_id, artifacts=artifacts, client=http,
                                   submit=submit, deadline=setup.deadline)
                statistics.run_id = setup.run_id
                with log_context(run_id=setup.run_id, session_id=setup.session_id):
                    log.info("serving run %s as %s", setup.run_id, setup.name,
                             extra={"event": "worker.serving"})
                    await _serve(stream, reader, pages, setup, statistics)
        finally:
            close = getattr(artifacts, "close", None)
            if close is not None:
                close()


@contextlib.asynccontextmanager
async def _disconnected(statistics: HostStatistics) -> AsyncIterator[None]:
    try:
        yield
    finally:
        statistics.connected = False
        statistics.in_flight = 0


async def _serve(stream: anyio.abc.ByteStream, reader: FrameReader, pages: PageWorker,
                 setup: Setup, statistics: HostStatistics) -> None:
    lock = anyio.Lock()

    async def answer(frame: msgspec.Struct) -> None:
        with contextlib.suppress(*PEER_GONE):
            async with lock:
                await stream.send(encode_frame(frame))

    async def run(order: Order) -> None:
        statistics.orders += 1
        statistics.in_flight += 1
        try:
            with log_context(url=order.page.url):
                effects = await pages.page(order.page, lambda: answer(Fetched(id=order.id)))
        except Exception as exc:  # the coordinator fails the run with this reason
            await answer(failed(order, exc, setup.name))
        else:
            await answer(Done(id=order.id, effects=effects))
        finally:
            statistics.in_flight = max(0, statistics.in_flight - 1)

    async def beat() -> None:
        while True:
            await anyio.sleep(setup.heartbeat)
            await answer(Beat())

    await answer(Ready(pid=os.getpid()))
    lost: str | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(beat)
        try:
            while lost is None:
                with anyio.move_on_after(setup.lease_timeout) as silent:
                    frame = await _read(reader, _down)
                if silent.cancelled_caught:
                    lost = f"nothing from it for {setup.lease_timeout:g} s"
                elif frame is None:
                    lost = "it closed the channel without saying bye"
                elif isinstance(frame, Bye):
                    log.info("the coordinator ended the run: %s", frame.reason,
                             extra={"event": "worker.run_ended"})
                    break
                elif isinstance(frame, Order):
                    tg.start_soon(run, frame)
        except (*PEER_GONE, msgspec.DecodeError, EvidenceError) as exc:
            lost = gone_in_words(exc)
        tg.cancel_scope.cancel()  # what it held is the coordinator's to settle now
    if lost is not None:
        raise _Lost(lost)
