"""Worker processes for ``evidence crawl --processes N``, and worker hosts (``--listen``).

The parent process keeps everything that reads the store: the scheduler and its frontier
claims, robots.txt, an incremental session's baseline; and it runs the writer as a service
on a private Unix socket. Each of N child processes (``main`` below, a new interpreter)
runs a ``PageWorker``: it requests the pages it is handed, stores their payloads in the artifact
store (files: no child opens the database) and submits each page's evidence through
``evidence.client``. The parent learns a page's ``PageEffects`` only once its group has
committed.

Parent and child talk over a socketpair in length-prefixed msgpack frames: ``Setup`` and
``Order`` go down, ``Ready``, ``Fetched`` (an order's request is over, its page
committing), ``Done`` and ``Failed`` come up. A child ends when its channel
does: the parent closing it (the run is over) or dying. A child never outlives its crawl,
so a restarted crawl never races an orphan still submitting results.

A child that dies (SIGKILL, OOM) loses only what it had in flight: each of its orders
raises ``WorkerLost`` in the parent, which settles the URL from what the store holds (see
``Crawler._lost``), and a replacement child is started.

Worker hosts (``evidence worker --connect``, ``_crawl/workerhost.py``) are the same design
over TCP and TLS: a host connects to the crawl's writer service with ``role: worker``, and
the service hands the connection to ``WorkerPool.serve_remote``, which speaks the same
frames on it. What a socketpair gives for free, a network does not: a host that dies or is
cut off sends no end of stream. So the orders a host holds are *leases*: both sides send a
``Beat`` every ``heartbeat`` seconds, and a host from which nothing came for
``lease_timeout`` seconds is lost; its orders raise ``WorkerLost(remote=True)``, and the
crawl *fences* it at the service (``Service.fence``: its connections end, its name is
refused from then on) before it settles those URLs from the store, so a late submission
from a host that was only cut off can never race the requeue. The host, seeing its channel
gone, drops what it held and connects again as a new worker. At the run's end the crawl
says ``Bye``, and the host exits.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from .._errors import EvidenceError
from .._model.logs import (
    FORMATS,
    LEVELS,
    JsonFormatter,
    add_log_context,
    log_arguments,
    log_context,
    set_level,
)
from .._net import acquire, wrap_socket
from .._store.artifactspec import open_artifacts
from .._store.db import ARTIFACTS_DIR
from .._store.location import is_postgres_location, is_s3_url
from .._store.resync import SYNC_MARKER
from .._write.wire import PEER_GONE, FrameReader, encode_frame, gone_in_words
from .frontier import CrawlConfig
from .http import crawl_client
from .netpolicy import NetworkPolicy
from .pages import PageEffects, PageOrder, PageWorker

__all__ = ["Setup", "WorkerLost", "WorkerPool"]

log = logging.getLogger("evidence.crawl")

_MAX_FRAME = 16 * 1024 * 1024
# Not ``-m evidence._crawl.workers``: the package imports this module, and runpy warns.
_CHILD_MAIN = "import sys; from evidence._crawl.workers import main; sys.exit(main())"
_START_TIMEOUT = 60.0  # seconds for a child to import, connect to the service and say ready


class Setup(msgspec.Struct, tag="setup", kw_only=True):
    store: str  # the store (its directory, or a connection string): for messages
    socket: str  # the writer service
    config: dict[str, Any]  # the session's CrawlConfig record
    session_id: str
    run_id: str
    connections: int  # HTTP connections the child may keep open
    timeout: float
    name: str = ""  # how the service knows this child's connection
    deadline: float | None = None  # seconds one fetch may take in all
    # the store's artifact location: an s3:// URL or a directory (default: STORE/artifacts)
    artifacts: str = ""
    heartbeat: float = 0.0  # a worker host: seconds between beats (0: a local child)
    lease_timeout: float = 0.0  # a worker host: silence after which its leases expire


class Order(msgspec.Struct, tag="order"):
    id: int
    page: PageOrder


class Ready(msgspec.Struct, tag="ready"):
    pid: int


class Done(msgspec.Struct, tag="done"):
    id: int
    effects: PageEffects


class Fetched(msgspec.Struct, tag="fetched"):
    """Up, before an order's ``Done``: its request is over and its page is committing, so
    the crawl may start another request on its host (its fetch slot is free)."""

    id: int


class Failed(msgspec.Struct, tag="failed"):
    id: int
    error: str
    hint: str | None = None  # the error's own advice (an S3 outage's deadline, say)


class Beat(msgspec.Struct, tag="beat"):
    """Both ways on a worker host's channel: still here (the lease goes on)."""


class Bye(msgspec.Struct, tag="bye"):
    """Down a worker host's channel: the run is over; exit."""

    reason: str = ""


_down = msgspec.msgpack.Decoder(Setup | Order | Beat | Bye)
_up = msgspec.msgpack.Decoder(Ready | Fetched | Done | Failed | Beat)


async def _read(reader: FrameReader, decoder: msgspec.msgpack.Decoder) -> Any:
    """The next frame, or None when the channel has ended."""
    size = await reader.read_header()
    if size is None:
        return None
    if size > _MAX_FRAME:
        raise EvidenceError(f"a {size}-byte frame on a worker channel (at most {_MAX_FRAME})")
    return decoder.decode(await reader.read_body(size))


class WorkerLost(Exception):
    """The worker process (or host) holding an order died (or its lease expired) before
    answering it."""

    def __init__(self, name: str, how: str, *, remote: bool = False) -> None:
        super().__init__(f"{name} {how}")
        self.name = name  # its connection's name at the writer service
        self.how = how
        self.remote = remote  # a worker host: fence it before settling its pages


# --- the parent's side -----------------------------------------------------------------

class _Waiter:
    __slots__ = ("event", "fetched", "result")

    def __init__(self, fetched: Callable[[], None] | None) -> None:
        self.event = anyio.Event()
        self.result: PageEffects | BaseException | None = None
        self.fetched = fetched  # called (once) when the order's request is over

    def request_over(self) -> None:
        fetched, self.fetched = self.fetched, None
        if fetched is not None and not self.event.is_set():
            fetched()

    def resolve(self, result: PageEffects | BaseException) -> None:
        if not self.event.is_set():
            self.result = result
            self.event.set()


class _Child:
    def __init__(self, index: int, name: str, process: anyio.abc.Process | None,
                 stream: anyio.abc.ByteStream) -> None:
        self.index = index
        self.name = name
        self.process = process  # None: a worker host
        self.stream = stream
        self.pending: dict[int, _Waiter] = {}
        self.send_lock = anyio.Lock()
        self.alive = False  # set once it said ready; cleared when its channel ends
        self.scope = anyio.CancelScope()  # a worker host's channel, ended at the run's end


class WorkerPool:
    """N worker processes running orders for one run. Use ``async with``.

    ``page`` hands an order to the least busy live child and returns its effects once the
    child's group has committed (calling ``fetched`` when the child says its request is
    over, before that); it raises ``WorkerLost`` if the child dies first. A dead
    child is replaced; a child that fails to start fails the run: ``page`` raises its error
    from then on, and so does leaving the pool.

    Entering the pool starts the children without waiting for them (a new interpreter takes
    ~0.5 s to import and connect): the parent meanwhile fetches robots.txt and claims the
    first pages, and ``page`` waits for the first child that is ready.
    """

    def __init__(self, processes: int, setup: Setup, *, heartbeat: float = 2.0,
                 lease_timeout: float = 15.0) -> None:
        if processes < 0:
            raise ValueError("a worker pool needs zero or more processes")
        if lease_timeout <= heartbeat:
            raise ValueError("the lease timeout must be longer than the heartbeat")
        self.processes = processes
        self.setup = setup
        self.heartbeat = heartbeat
        self.lease_timeout = lease_timeout
        self._children: dict[int, _Child] = {}
        self._hosts: dict[str, _Child] = {}  # worker hosts, by name
        self._host_ids = itertools.count(1)
        self._ids = itertools.count(1)
        self._closing = False
        self._failure: EvidenceError | None = None  # a replacement that did not start
        self._tg: anyio.abc.TaskGroup
        self._changed: anyio.Event

    @property
    def pids(self) -> list[int]:
        return [c.process.pid for c in self._children.values()
                if c.alive and c.process is not None]

    @property
    def hosts(self) -> list[str]:
        """The worker hosts serving this run now."""
        return [c.name for c in self._hosts.values() if c.alive]

    async def __aenter__(self) -> WorkerPool:
        self._changed = anyio.Event()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        for index in range(self.processes):
            self._tg.start_soon(self._start, index)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: object) -> bool | None:
        """Close every channel (a child exits when its channel ends) and reap the children.

        Shielded: when the run's in-flight work is cancelled (a second Ctrl-C), the children
        are killed and reaped all the same, never left behind.
        """
        self._closing = True
        with anyio.CancelScope(shield=True):
            for host in list(self._hosts.values()):
                with contextlib.suppress(*PEER_GONE), anyio.move_on_after(5):
                    async with host.send_lock:
                        await host.stream.send(encode_frame(Bye(reason="the run is over")))
                host.scope.cancel()
            for child in list(self._children.values()):
                with contextlib.suppress(*PEER_GONE):
                    await child.stream.send_eof()
            if exc is not None:
                await self._kill_all()
            with anyio.move_on_after(30):
                for child in list(self._children.values()):
                    if child.process is not None:  # a worker host has no process here
                        await child.process.wait()
        # Nothing is in flight any more: stop a start still waiting for its child.
        self._tg.cancel_scope.cancel()
        await self._kill_all()
        await self._tg.__aexit__(None, None, None)  # the body's error goes on as is
        if exc is None and self._failure is not None:
            raise self._failure
        return None

    async def _kill_all(self) -> None:
        for child in list(self._children.values()):
            if child.process is not None and child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()
                with anyio.CancelScope(shield=True):
                    await child.process.wait()

    async def page(self, order: PageOrder,
                   fetched: Callable[[], None] | None = None) -> PageEffects:
        child = await self._pick()
        request_id = next(self._ids)
        waiter = _Waiter(fetched)
        child.pending[request_id] = waiter  # no await since _pick: the child is alive
        try:
            try:
                await acquire(child.send_lock)
                try:
                    await child.stream.send(encode_frame(Order(id=request_id, page=order)))
                finally:
                    child.send_lock.release()
            except PEER_GONE:
                pass  # the child died: its receiver resolves every pending order
            await waiter.event.wait()
        finally:
            child.pending.pop(request_id, None)
        if isinstance(waiter.result, BaseException):
            raise waiter.result
        assert waiter.result is not None
        return waiter.result

    async def _pick(self) -> _Child:
        while True:
            if self._failure is not None:
                raise self._failure
            live = [c for c in (*self._children.values(), *self._hosts.values()) if c.alive]
            if live:
                return min(live, key=lambda c: len(c.pending))
            self._changed = anyio.Event() if self._changed.is_set() else self._changed
            await self._changed.wait()  # a child is starting

    async def _spawn(self, index: int) -> None:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root, *filter(None, [env.get("PYTHONPATH")])])
        try:
            process = await anyio.open_process(
                [sys.executable, "-c", _CHILD_MAIN, "--channel-fd", str(child_end.fileno()),
                 *log_arguments()],
                stdin=subprocess.DEVNULL, stdout=None, stderr=None, env=env,
                pass_fds=[child_end.fileno()])
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()
        name = f"crawl worker {index} pid {process.pid}"
        stream = await wrap_socket(parent_end)
        child = _Child(index, name, process, stream)
        self._children[index] = child
        reader = FrameReader(stream)
        try:
            await stream.send(encode_frame(msgspec.structs.replace(self.setup, name=name)))
            ready = await _read(reader, _up)
        except (OSError, anyio.BrokenResourceError, anyio.EndOfStream, msgspec.DecodeError,
                EvidenceError) as exc:
            ready = exc
        if not isinstance(ready, Ready):
            with contextlib.suppress(OSError):
                await stream.aclose()
            code = await process.wait()
            raise EvidenceError(f"worker process {index} (pid {process.pid}) did not start: "
                                f"exit status {code}; see its messages above",
                                hint="run with --processes 0 to crawl in one process")
        log.info("worker process %d started: pid %d", index, process.pid,
                 extra={"event": "worker.started"})
        child.alive = True
        self._changed.set()
        self._tg.start_soon(self._receive, child, reader)

    async def _receive(self, child: _Child, reader: FrameReader) -> None:
        """Answers from one child until its channel ends; then it is lost or done."""
        try:
            while True:
                frame = await _read(reader, _up)
                if frame is None:
                    break
                if isinstance(frame, Beat | Ready):
                    continue
                waiter = child.pending.get(frame.id)
                if waiter is None:
                    continue
                if isinstance(frame, Fetched):
                    waiter.request_over()
                elif isinstance(frame, Done):
                    waiter.resolve(frame.effects)
                elif isinstance(frame, Failed):
                    waiter.resolve(EvidenceError(f"{child.name}: {frame.error}",
                                                 hint=frame.hint))
        except (*PEER_GONE, msgspec.DecodeError, EvidenceError) as exc:
            log.warning("%s: channel broken: %s", child.name, exc,
                        extra={"event": "worker.channel_broken"})
        child.alive = False
        with contextlib.suppress(OSError):
            await child.stream.aclose()
        assert child.process is not None
        code = await child.process.wait()
        how = (f"was killed by signal {-code}" if code is not None and code < 0
               else f"exited with status {code}")
        for waiter in list(child.pending.values()):
            waiter.resolve(WorkerLost(child.name, how))
        if self._closing:
            return
        log.warning("%s %s; its in-flight pages are settled from the store, and a new "
                    "worker process starts", child.name, how, extra={"event": "worker.lost"})
        await self._start(child.index)

    async def _start(self, index: int) -> None:
        """Start child ``index``. A failure is kept in ``_failure``: ``page`` raises it from
        then on (waking any caller waiting for a child), and so does ``__aexit__``. Once the
        pool is closing, a child that did not get ready is no failure: the end of the run
        stopped it (its channel closed, perhaps before its setup was written)."""
        try:
            with anyio.fail_after(_START_TIMEOUT):
                await self._spawn(index)
        except (EvidenceError, OSError, TimeoutError) as exc:
            if self._closing:
                log.debug("worker process %d stopped while it started: %s", index, exc,
                          extra={"event": "worker.stopped_starting"})
            elif self._failure is None:
                self._failure = exc if isinstance(exc, EvidenceError) else EvidenceError(
                    f"worker process {index} did not start: {type(exc).__name__}: {exc}",
                    hint="run with --processes 0 to crawl in one process")
            self._changed.set()


    # --- worker hosts ---------------------------------------------------------------------

    async def serve_remote(self, stream: anyio.abc.ByteStream, initial: bytes, client: str,
                           peer: str) -> None:
        """One worker host's channel, for as long as it lasts (the writer service calls
        this for a connection whose hello says ``role: worker``)."""
        if self._closing:
            return
        peer_host = peer.split(" from ", 1)[-1].split(" ", 1)[0].rsplit(":", 1)[0]
        name = f"worker host {peer_host} #{next(self._host_ids)}"
        host = _Child(-1, name, None, stream)
        reader = FrameReader(stream, initial)
        setup = msgspec.structs.replace(self.setup, name=name, socket="",
                                        heartbeat=self.heartbeat,
                                        lease_timeout=self.lease_timeout)
        try:
            with anyio.fail_after(_START_TIMEOUT):
                await stream.send(encode_frame(setup))
                ready = await _read(reader, _up)
        except (OSError, TimeoutError, anyio.BrokenResourceError, anyio.EndOfStream,
                msgspec.DecodeError, EvidenceError) as exc:
            log.warning("%s (%s) did not start: %s", name, client or "unnamed", exc,
                        extra={"event": "worker_host.refused"})
            return
        if not isinstance(ready, Ready):
            log.warning("%s did not say ready", name, extra={"event": "worker_host.not_ready"})
            return
        self._hosts[name] = host
        host.alive = True
        self._changed.set()
        log.info("%s joined: %s, pid %d", name, client or "unnamed", ready.pid,
                 extra={"event": "worker_host.joined"})
        how = "was dropped at the end of the run"
        with host.scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._beat, host)
                how = await self._receive_remote(host, reader)
                tg.cancel_scope.cancel()
        host.alive = False
        self._hosts.pop(name, None)
        for waiter in list(host.pending.values()):
            waiter.resolve(WorkerLost(name, how, remote=True))
        if not self._closing:
            log.warning("%s %s; the pages it held are settled from the store", name, how,
                        extra={"event": "worker_host.lost"})

    async def _beat(self, host: _Child) -> None:
        with contextlib.suppress(*PEER_GONE):
            while True:
                await anyio.sleep(self.heartbeat)
                async with host.send_lock:
                    await host.stream.send(encode_frame(Beat()))

    async def _receive_remote(self, host: _Child, reader: FrameReader) -> str:
        """Answers from a worker host until its channel ends or its lease expires; how it
        ended, in words."""
        try:
            while True:
                with anyio.move_on_after(self.lease_timeout) as silent:
                    frame = await _read(reader, _up)
                if silent.cancelled_caught:
                    return (f"sent nothing for {self.lease_timeout:g} s: its leases "
                            "expired")
                if frame is None:
                    return "closed its connection"
                if isinstance(frame, Beat | Ready):
                    continue
                waiter = host.pending.get(frame.id)
                if waiter is None:
                    continue
                if isinstance(frame, Fetched):
                    waiter.request_over()
                elif isinstance(frame, Done):
                    waiter.resolve(frame.effects)
                elif isinstance(frame, Failed):
                    waiter.resolve(EvidenceError(f"{host.name}: {frame.error}",
                                                 hint=frame.hint))
        except (*PEER_GONE, msgspec.DecodeError, EvidenceError) as exc:
            return f"broke its connection ({gone_in_words(exc)})"


# --- the child's side ------------------------------------------------------------------

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
        server = is_postgres_location(setup.store)  # no store directory: no store marker
        local = (Path(spec) if spec is not None and not is_s3_url(spec)
                 else Path(setup.store) / ARTIFACTS_DIR)
        artifacts = open_artifacts(spec, local=local, create=False, read_only=False,
                                   store_marker=None if server
                                   else Path(setup.store) / SYNC_MARKER)
        http = crawl_client(connections=setup.connections, timeout=setup.timeout,
                            policy=NetworkPolicy(allow=config.allow_network,
                                                 seeds=config.seeds))
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


def failed(order: Order, exc: Exception, name: str) -> Failed:
    """What a page's failure is to the parent, which fails the run with it (its traceback
    logged here unless it is one of ours, whose message and hint say it all)."""
    if isinstance(exc, EvidenceError):
        log.error("%s: %s: %s", name, order.page.url, exc, extra={"event": "page.crashed"})
    else:
        log.exception("%s: %s", name, order.page.url, extra={"event": "page.crashed"})
    return Failed(id=order.id, error=f"{type(exc).__name__}: {exc}", hint=exc.hint
                  if isinstance(exc, EvidenceError) else None)


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
