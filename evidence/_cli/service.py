"""The service command: ``evidence serve``, a few lines over ``_write.service.Service``.

Runs a store's one writer for producer processes (``evidence.client``) until SIGTERM,
SIGINT or ``evidence stop``; ``--json`` prints a line when ready and one when stopped.
Errors are printed by ``_cli.main`` (``Error:`` / ``Try:`` on stderr, exit status 2).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import EvidenceError, ServiceError
from .common import (
    add_listen_options,
    add_metrics_options,
    add_outage_option,
    artifacts_location,
    listen_options,
    local_path,
    log_to,
    print_json,
    show_default,
    store_location,
)

if TYPE_CHECKING:  # the command imports what it runs: a CLI start loads only its own
    from .._write.service import Service
    from .._write.wire import ServiceStatistics

__all__ = ["add_commands"]

log = logging.getLogger("evidence.service")


def _cmd_serve(args: argparse.Namespace) -> int:
    import anyio

    from .._crawl.heap import bound_heap
    from .._store.db import Store
    from .._store.location import is_server_database
    from .._store.runlock import crawl_lock, running_pid
    from .._write.limits import ServiceLimits, WriterLimits
    from .._write.service import Service

    bound_heap()  # before any thread: a long-lived writer's resident set (``_crawl.heap``)
    if args.socket is None and args.listen is None:
        raise ServiceError("nothing to listen on", hint="give --socket PATH and/or "
                           "--listen 127.0.0.1:PORT --token-file FILE")
    listen, tls, token = listen_options(args)
    log_to(sys.stderr)
    server = is_server_database(args.store)
    path = Path(args.store)
    with Store.open(args.store if server else path, sync=args.sync,
                    artifacts=args.artifacts,
                    db_outage_deadline=args.db_outage_deadline) as store:
        # Built (and so checked) before the lock is taken: a refused configuration changes
        # nothing, not even the lock file.
        service = Service(
            store, socket_path=args.socket, listen=listen, token=token, tls=tls,
            metrics=args.metrics, metrics_public=args.metrics_public,
            limits=ServiceLimits(**_given(args, _SERVICE_LIMITS)),
            writer_limits=WriterLimits(**_given(args, _WRITER_LIMITS),
                                       max_batch_delay=args.batch_delay))
        if server:  # a second service waits as a standby and takes over when this one ends
            with store.writer_lock(wait=True, on_wait=lambda holder: log.info(
                    "standby: the writer lock of %s is held by %s; this service takes over "
                    "when it ends", store.location, holder,
                    extra={"event": "service.waiting_for_lock"})):
                stats = anyio.run(_serve, service, args)
            return _stopped(stats, args)
        pid = running_pid(path)
        if pid is not None:
            raise EvidenceError(f"{path}: a crawl or service (pid {pid}) is writing this store",
                                hint=f"stop it first: evidence stop {path}", path=str(path))
        with crawl_lock(path):  # one writer per store: 'evidence stop' sends us SIGTERM
            stats = anyio.run(_serve, service, args)
    return _stopped(stats, args)


# The limits ``serve`` takes, by option dest: ServiceLimits' fields, and WriterLimits' (an
# option left out keeps the library's default, which --help shows: ``_limit_default``).
_SERVICE_LIMITS = {name: name for name in (
    "max_frame_bytes", "max_in_flight", "max_pending_bytes", "connection_in_flight",
    "max_connections", "max_connections_per_peer", "max_unauthenticated", "send_timeout",
    "handshake_timeout", "body_timeout", "idle_timeout")}
_WRITER_LIMITS = {"queue_size": "queue_size", "batch_messages": "max_batch_messages"}


def _given(args: argparse.Namespace, fields: dict[str, str]) -> dict[str, Any]:
    """The limits the command line gave, under their fields' names."""
    return {field: getattr(args, dest) for dest, field in fields.items()
            if getattr(args, dest) is not None}


def _limit_default(dest: str):  # -> Callable[[], object]
    """Reads the default of the limit option ``dest`` from the library, when the help is
    printed: the writer and the service are imported by ``serve`` itself, not by every
    ``evidence`` start."""
    def read() -> object:
        if dest in _WRITER_LIMITS:
            from .._write.limits import WriterLimits

            return getattr(WriterLimits(), _WRITER_LIMITS[dest])
        from .._write.limits import ServiceLimits

        return getattr(ServiceLimits(), _SERVICE_LIMITS[dest])
    return read


def _stopped(stats: ServiceStatistics, args: argparse.Namespace) -> int:
    w = stats.writer
    summary = (f"stopped: {stats.connections_total} connections, {w.committed} committed, "
               f"{w.duplicates} duplicates, {w.conflicts} conflicts, {w.rejections} rejected, "
               f"{w.batches} batches, log size {w.tree_size}")
    if args.json:
        print_json({"event": "stopped", "statistics": stats}, one_line=True)
    print(summary, file=sys.stderr)
    return 0


async def _serve(service: Service, args: argparse.Namespace) -> ServiceStatistics:
    import anyio

    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with service:
            where = []
            if service.socket_path is not None:
                where.append(f"unix:{service.socket_path}")
            if service.tcp_address is not None:
                where.append("tcp:{}:{}".format(*service.tcp_address))
            metrics = ("http://{}:{}/metrics".format(*service.metrics_address)
                       if service.metrics_address else None)
            log.info("serving %s on %s%s (pid %d); SIGTERM drains and stops", args.store,
                     ", ".join(where), f", metrics at {metrics}" if metrics else "",
                     os.getpid(), extra={"event": "service.ready"})
            if args.json:
                print_json({"event": "ready", "pid": os.getpid(),
                            "socket": None if service.socket_path is None
                            else str(service.socket_path),
                            "listen": "{}:{}".format(*service.tcp_address)
                            if service.tcp_address else None, "metrics": metrics},
                           one_line=True)
            async for signum in signals:
                log.info("%s: stopping: no new connections; committing and acknowledging "
                         "what was read", signal.Signals(signum).name,
                         extra={"event": "service.stopping"})
                break
        return service.statistics()


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve", help="run the writer service: many producer processes, one writer",
        description="Run STORE's serialized writer as a service: producer processes connect "
        "with evidence.client and submit messages; each is acknowledged after its batch "
        "commits. When the writer falls behind, the service stops reading from sockets "
        "(clients block). SIGTERM or 'evidence stop STORE' stops accepting, commits and "
        "acknowledges what was read, and exits 0.")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory, or a PostgreSQL connection string (see "
                   "'evidence init'); on PostgreSQL a second service of the same store waits "
                   "as a standby and takes over when the first ends")
    p.add_argument("--artifacts", metavar="DIR|URL", type=artifacts_location,
                   help="the store's payload location, if not where the store records it: "
                   "its s3:// location with other options (another endpoint, say), or a "
                   "PostgreSQL store's directory (default: the recorded one)")
    p.add_argument("--socket", metavar="PATH", type=local_path,
                   help="listen on a Unix socket, created with mode 0600")
    add_listen_options(p, what="also")
    add_metrics_options(p)
    p.add_argument("--sync", choices=("full", "normal"), default="full",
                   help="durability of commits (see 'evidence init --help')")
    add_outage_option(p, "the service")
    p.add_argument("--max-frame-bytes", metavar="N", type=int,
                   help="largest request (one message or group) accepted, in bytes "
                   "(default %(default)s)")
    p.add_argument("--max-in-flight", metavar="N", type=int,
                   help="requests read and not yet acknowledged, all clients together; at "
                   "the bound reads pause (default %(default)s)")
    p.add_argument("--connection-in-flight", metavar="N", type=int,
                   help="the same bound for one client (default %(default)s)")
    p.add_argument("--max-pending-bytes", metavar="N", type=int,
                   help="bytes read from clients and not yet committed, all clients together, "
                   "counted as they arrive; at the bound reads pause (default %(default)s)")
    p.add_argument("--max-connections", metavar="N", type=int,
                   help="clients connected after a valid hello; more are refused, retryably "
                   "(default %(default)s)")
    p.add_argument("--max-connections-per-peer", metavar="N", type=int,
                   help="of those, from one process on the Unix socket (as the kernel names it) "
                   "or one address over TCP; more are refused, retryably, so one peer cannot "
                   "take every connection (default %(default)s)")
    p.add_argument("--max-unauthenticated", metavar="N", type=int,
                   help="connections that have not said hello yet; a newer one drops the oldest "
                   "(they never take a client's slot) (default %(default)s)")
    p.add_argument("--send-timeout", metavar="SECONDS", type=float,
                   help="seconds a client may leave its acknowledgements unread before it is "
                   "disconnected (default %(default)s)")
    p.add_argument("--handshake-timeout", metavar="SECONDS", type=float,
                   help="seconds from connecting to a valid hello (default %(default)s)")
    p.add_argument("--body-timeout", metavar="SECONDS", type=float,
                   help="seconds of sending time a client has for one frame, from its length "
                   "prefix to its last byte; a slower one is disconnected (default %(default)s)")
    p.add_argument("--idle-timeout", metavar="SECONDS", type=float,
                   help="seconds a client with nothing in flight may stay connected without "
                   "sending; then it is disconnected and reconnects when it needs to "
                   "(default %(default)s)")
    p.add_argument("--queue-size", metavar="N", type=int,
                   help="the writer's queue, in submissions (default %(default)s)")
    p.add_argument("--batch-messages", metavar="N", type=int,
                   help="messages per batch at most (default %(default)s)")
    p.add_argument("--batch-delay", metavar="SECONDS", type=float, default=0.002,
                   help="seconds a batch waits for more messages (default %(default)s)")
    p.add_argument("--json", action="store_true",
                   help="print a JSON line when ready (with the ports) and one when stopped")
    for action in p._actions:
        if action.dest in _SERVICE_LIMITS or action.dest in _WRITER_LIMITS:
            show_default(action, _limit_default(action.dest))
    p.set_defaults(func=_cmd_serve)
