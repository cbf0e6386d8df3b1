"""Worker processes for ``evidence crawl --processes N``, and worker hosts (``--listen``).

The parent process keeps everything that reads the store: the scheduler and its frontier
claims, robots.txt, an incremental session's baseline; and it runs the writer as a service
on a private Unix socket. Each of N child processes (``_crawl.workerchild``, a new interpreter)
runs a ``PageWorker``: it requests the pages it is handed, stores their payloads in the artifact
store (files: no child opens the database) and submits each page's evidence through
``evidence.client``. The parent learns a page's ``PageEffects`` only once its group has
committed.

Parent and child talk over a socketpair in length-prefixed msgpack frames
(``_crawl.workerchannel``): ``Setup`` and
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

import collections
import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from .._errors import EvidenceError
from .._model.logs import (
    log_arguments,
)
from .._model.messages import Message
from .._net import acquire, wrap_socket
from .._write.wire import PEER_GONE, FrameReader, encode_frame, gone_in_words
from .hostauth import check_submission
from .pages import PageEffects, PageOrder
from .workerchannel import Beat, Bye, Done, Failed, Fetched, Order, Ready, Setup, _read, _up

__all__ = ["Handed", "WorkerLost", "WorkerPool"]

log = logging.getLogger("evidence.crawl")

# A new interpreter that runs the worker process's main (``_crawl.workerchild``).
_CHILD_MAIN = "import sys; from evidence._crawl.workerchild import main; sys.exit(main())"
_START_TIMEOUT = 60.0  # seconds for a child to import, connect to the service and say ready


def worker_command(channel_fd: int) -> list[str]:
    """The command line of a worker process of this one, given its end of the channel."""
    return [sys.executable, "-c", _CHILD_MAIN, "--channel-fd", str(channel_fd),
            "--parent-pid", str(os.getpid()), *log_arguments()]


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
    __slots__ = ("event", "fetched", "over", "result")

    def __init__(self) -> None:
        self.event = anyio.Event()  # answered: ``result`` is set
        self.over = anyio.Event()  # the order's request is over, or it was answered
        self.fetched = False  # its worker said the request is over before answering
        self.result: PageEffects | BaseException | None = None

    def request_over(self) -> None:
        if not self.event.is_set():
            self.fetched = True
            self.over.set()

    def resolve(self, result: PageEffects | BaseException) -> None:
        if not self.event.is_set():
            self.result = result
            self.event.set()
            self.over.set()


class Handed:
    """An order a worker holds (``WorkerPool.hand``): wait for its request to be over,
    then for its outcome; the pool calls nothing back."""

    def __init__(self, waiter: _Waiter,
                 spot_check: Callable[[PageEffects], Coroutine[Any, Any, None]] | None = None
                 ) -> None:
        self._waiter = waiter
        self._spot_check = spot_check  # a worker host's page: fetched again by a sample

    async def request_over(self) -> bool:
        """Wait until the worker says the order's request is over (True), or the order is
        answered or lost without that (False)."""
        await self._waiter.over.wait()
        return self._waiter.fetched

    async def outcome(self) -> PageEffects:
        """The page's effects once its group committed; ``WorkerLost`` if its worker died
        (or its lease expired) first."""
        await self._waiter.event.wait()
        if isinstance(self._waiter.result, BaseException):
            raise self._waiter.result
        assert self._waiter.result is not None
        if self._spot_check is not None:
            await self._spot_check(self._waiter.result)
        return self._waiter.result


class _Child:
    def __init__(self, index: int, name: str, process: anyio.abc.Process | None,
                 stream: anyio.abc.ByteStream) -> None:
        self.index = index
        self.name = name
        self.process = process  # None: a worker host
        self.stream = stream
        self.pending: dict[int, _Waiter] = {}
        # A worker host's: the URLs leased to it now (what it may submit evidence of), its
        # identity in the hosts file ("" without one), the address it connected from, and
        # why it was fenced, once it was (``_crawl/hostauth.py``).
        self.leased: dict[str, PageOrder] = {}
        self.host = ""
        self.address = ""
        self.fenced_for = ""
        self.send_lock = anyio.Lock()
        self.alive = False  # set once it said ready; cleared when its channel ends
        self.scope = anyio.CancelScope()  # a worker host's channel, ended at the run's end


class WorkerPool:
    """N worker processes running orders for one run. Use ``async with``.

    ``hand`` gives an order to the least busy live child: the ``Handed`` says when the
    child's request is over, then the effects once the child's group has committed (or
    raises ``WorkerLost`` if the child dies first); ``page`` waits for the effects. A dead
    child is replaced; a child that fails to start fails the run: ``page`` raises its error
    from then on, and so does leaving the pool.

    Entering the pool starts the children without waiting for them (a new interpreter takes
    ~0.5 s to import and connect): the parent meanwhile fetches robots.txt and claims the
    first pages, and ``page`` waits for the first child that is ready.
    """

    def __init__(self, processes: int, setup: Setup, *, heartbeat: float = 2.0,
                 lease_timeout: float = 15.0, no_hosts_timeout: float | None = None) -> None:
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
        # Channels that ended, by name: their address or hosts-file identity. A host whose
        # channel ended (its lease expired, say) may still be submitting: refused, not
        # at fault.
        self._ended: dict[str, str] = {}
        self._host_ids = itertools.count(1)
        self._ids = itertools.count(1)
        self._closing = False
        self._failure: EvidenceError | None = None  # a replacement that did not start
        # Worker hosts (``check_submission``): the run fails once none has served it for
        # this long, after one did (None: it waits for one to come, as long as it takes).
        self.no_hosts_timeout = no_hosts_timeout
        self._host_joined = False
        self._last_host_end = ""  # how the last worker host ended, in words
        self.fenced: collections.Counter[str] = collections.Counter()  # by host, at fault
        # Set by the crawl: the service's fences (by client name, and by hosts-file
        # identity), and the crawl's scope rule (a URL and depth -> why it is not fetched).
        self.fence_client: Callable[[str], Coroutine[Any, Any, None]] | None = None
        self.fence_host: Callable[[str], Coroutine[Any, Any, None]] | None = None
        self.out_of_scope: Callable[[str, int], str | None] = lambda _url, _depth: None
        # Called with each page a worker host committed, and its effects (``CrossCheck``).
        self.spot_check: Callable[[PageOrder, PageEffects], Coroutine[Any, Any, None]] | None \
            = None
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

    async def page(self, order: PageOrder) -> PageEffects:
        async with self.hand(order) as handed:
            return await handed.outcome()

    @contextlib.asynccontextmanager
    async def hand(self, order: PageOrder) -> AsyncIterator[Handed]:
        """Hand ``order`` to the least busy live worker, which holds it until the block
        ends."""
        child = await self._pick()
        request_id = next(self._ids)
        waiter = _Waiter()
        child.pending[request_id] = waiter  # no await since _pick: the child is alive
        if child.process is None:  # a worker host may submit this page's evidence now
            child.leased[order.url] = order
        try:
            try:
                await acquire(child.send_lock)
                try:
                    await child.stream.send(encode_frame(Order(id=request_id, page=order)))
                finally:
                    child.send_lock.release()
            except PEER_GONE:
                pass  # the child died: its receiver resolves every pending order
            spot = self.spot_check if child.process is None else None
            yield Handed(waiter, None if spot is None else (lambda effects: spot(order, effects)))
        finally:
            child.pending.pop(request_id, None)
            child.leased.pop(order.url, None)

    async def _pick(self) -> _Child:
        while True:
            if self._failure is not None:
                raise self._failure
            live = [c for c in (*self._children.values(), *self._hosts.values()) if c.alive]
            if live:
                return min(live, key=lambda c: len(c.pending))
            self._changed = anyio.Event() if self._changed.is_set() else self._changed
            wait = self.no_hosts_timeout
            if wait is None or self.processes or not self._host_joined:
                await self._changed.wait()  # a child is starting, or a host will come
                continue
            with anyio.move_on_after(wait):
                await self._changed.wait()
            if not any(c.alive for c in self._hosts.values()):
                raise EvidenceError(
                    f"no worker host has served the run for {wait:g} s (the last one "
                    f"{self._last_host_end}); the run stops, as --fail-when-no-hosts says",
                    hint="start worker hosts, then resume: the session stays open")

    async def _spawn(self, index: int) -> None:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root, *filter(None, [env.get("PYTHONPATH")])])
        try:
            process = await anyio.open_process(
                worker_command(child_end.fileno()),
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
                           peer: str, address: str = "", identity: str = "") -> None:
        """One worker host's channel, for as long as it lasts (the writer service calls
        this for a connection whose hello says ``role: worker``; ``address``: whom it
        counts against, ``identity``: its name in the hosts file, if there is one)."""
        if self._closing:
            return
        peer_host = peer.split(" from ", 1)[-1].split(" ", 1)[0].rsplit(":", 1)[0]
        name = f"worker host {peer_host} #{next(self._host_ids)}"
        host = _Child(-1, name, None, stream)
        host.host, host.address = identity, address
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
        self._host_joined = True
        self._changed.set()
        log.info("%s joined: %s%s, pid %d", name, client or "unnamed",
                 f", host {identity!r} of the hosts file" if identity else "", ready.pid,
                 extra={"event": "worker_host.joined"})
        how = "was dropped at the end of the run"
        try:
            with host.scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._beat, host)
                    how = await self._receive_remote(host, reader)
                    tg.cancel_scope.cancel()
        finally:  # also when the service ends the channel (a fenced host's, say)
            how = host.fenced_for or how
            host.alive = False
            self._hosts.pop(name, None)
            self._ended[name] = host.host or host.address
            self._last_host_end = f"({name}) {how}"
            host.leased.clear()
            for waiter in list(host.pending.values()):
                waiter.resolve(WorkerLost(name, how, remote=True))
            self._changed.set()
            if not self._closing:
                log.warning("%s %s; the pages it held are settled from the store", name,
                            how, extra={"event": "worker_host.lost"})

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
                elif isinstance(frame, Failed):  # that host's fault, not the run's
                    self.fenced[host.host or host.name] += 1
                    log.warning("%s failed a page (%s); it is fenced, and the pages it "
                                "held go to other hosts", host.name, frame.error,
                                extra={"event": "worker_host.failed"})
                    return f"failed a page ({frame.error}): fenced"
        except (*PEER_GONE, msgspec.DecodeError, EvidenceError) as exc:
            return f"broke its connection ({gone_in_words(exc)})"

    def check_submission(self, client: str, identity: str, address: str,
                         messages: Sequence[Message]) -> str | None:
        """The writer service's ``submission_guard``: why the TCP client ``client``
        (``identity`` in the hosts file, from ``address``) may not submit ``messages``, or
        None. A refusal is that host's fault: it is fenced (``_crawl/hostauth.py``)."""
        host = self._hosts.get(client)
        if host is None or not host.alive:
            if client in self._ended and self._ended[client] == (identity or address):
                return f"{client} holds no lease any more (its channel ended)"
            why = f"{client or 'an unnamed client'} holds no lease of this run"
            if identity:  # a host of the hosts file, under a name it was never given
                self._at_fault(None, identity, why)
            return why
        if host.host != identity or (not identity and host.address != address):
            why = (f"{client} is the channel of {host.host or host.address}, and this "
                   f"came from {identity or address}")
            self._at_fault(None, identity, why)
            return why
        refused = check_submission(messages, leased=host.leased, run_id=self.setup.run_id,
                                   session_id=self.setup.session_id,
                                   out_of_scope=self.out_of_scope)
        if refused is not None:
            self._at_fault(host, identity, refused)
        return refused

    def _at_fault(self, host: _Child | None, identity: str, why: str) -> None:
        """Fence a worker host that submitted what it may not: its channel (its leases go
        back to the frontier, ``WorkerLost``) and, with a hosts file, its identity."""
        who = identity or (host.name if host is not None else "")
        if not who:
            return
        self.fenced[who] += 1
        log.error("worker host %s submitted what it may not (%s); it is fenced%s", who, why,
                  " for the rest of the run" if identity else "",
                  extra={"event": "worker_host.fenced"})
        channels = [host] if host is not None else []
        channels += [c for c in self._hosts.values() if identity and c.host == identity
                     and c is not host]
        for channel in channels:
            channel.fenced_for = channel.fenced_for or f"submitted what it may not ({why}): " \
                "fenced"
            channel.scope.cancel()
            if self.fence_client is not None:
                self._tg.start_soon(self.fence_client, channel.name)
        if identity and self.fence_host is not None:
            self._tg.start_soon(self.fence_host, identity)
