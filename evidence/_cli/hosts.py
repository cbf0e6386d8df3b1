"""CLI commands for crawling from several hosts: ``evidence worker`` (a worker host) and
``evidence tls-cert`` (a self-signed pair for a test deployment), and the options the
coordinator's ``crawl`` and ``serve`` take to listen beyond this machine.

``add_commands(subparsers)`` adds the two commands; the listening options the coordinator's
``crawl`` and ``serve`` share are in ``common`` (``add_listen_options``,
``listen_options``). docs/scale.md is the deployment guide.
"""

from __future__ import annotations

import argparse

from .common import add_metrics_options, local_path

__all__ = ["add_commands"]


def _cmd_worker(args: argparse.Namespace) -> int:
    import anyio

    from .._crawl.heap import bound_heap
    from .._crawl.workerhost import HostOptions, serve_coordinator
    from .._write.tls import client_context, parse_connect
    from .._write.wire import read_token

    bound_heap()  # before any thread: it fetches as a crawl does (``_crawl.heap``)
    tls = client_context(args.tls_ca) if args.tls_ca or not args.no_tls else None
    address = parse_connect(args.connect, tls=tls is not None)
    token = read_token(args.token_file)
    if args.metrics is not None:
        from .._write.metrics import metrics_address

        metrics_address(args.metrics, public=args.metrics_public)
    options = HostOptions(address=address, token=token, tls=tls, local_host=args.bind,
                          name=args.name or "", reconnect_timeout=args.reconnect_timeout,
                          metrics=args.metrics, metrics_public=args.metrics_public)
    return anyio.run(serve_coordinator, options)


def _cmd_tls_cert(args: argparse.Namespace) -> int:
    from .._write.tls import make_self_signed

    cert, key = make_self_signed(args.host, args.out, days=args.days)
    print(f"wrote {cert} (give it to the workers: --tls-ca {cert}) and {key} (mode 600; "
          f"for the coordinator: --tls-cert {cert} --tls-key {key})")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker", help="fetch pages for a crawl running on another host",
        description="Connect to a crawl started with --listen (the coordinator), take the "
        "URLs it leases to this host, fetch them, put their payloads into the store's "
        "object store (s3://, with this host's AWS_* credentials) and submit their "
        "evidence. A host that dies or is cut off loses only its leases: after "
        "--lease-timeout the coordinator returns them to the frontier. Exit status 0 when "
        "the coordinator ends the run; 1 when it cannot be reached for --reconnect-timeout "
        "seconds; 2 on a refused token or certificate.")
    p.add_argument("--connect", required=True, metavar="HOST:PORT",
                   help="the coordinator's --listen address")
    p.add_argument("--token-file", required=True, metavar="FILE",
                   help="the coordinator's token (a file of mode 600)")
    p.add_argument("--tls-ca", metavar="FILE",
                   help="the certificate (or its CA) to verify the coordinator with "
                   "(default: the system's CAs)")
    p.add_argument("--no-tls", action="store_true",
                   help="plain TCP, for a coordinator listening on a loopback address only")
    p.add_argument("--bind", metavar="ADDRESS",
                   help="the local address to connect from (default: the system's choice)")
    p.add_argument("--name", metavar="NAME",
                   help="how this host introduces itself (default: host name and pid)")
    p.add_argument("--reconnect-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="give up after this long without a coordinator (default %(default)s)")
    add_metrics_options(p)
    p.set_defaults(func=_cmd_worker)

    p = sub.add_parser(
        "tls-cert", help="make a self-signed certificate and key for a test deployment",
        description="Write OUT/cert.pem and OUT/key.pem (mode 600): an ECDSA P-256 key and "
        "a self-signed certificate naming every --host (IP addresses or names). The "
        "coordinator listens with --tls-cert and --tls-key; workers verify it with "
        "--tls-ca OUT/cert.pem. For production, use a certificate from your own CA.")
    p.add_argument("--host", action="append", required=True, metavar="HOST",
                   help="an address or name workers dial (repeat for more)")
    p.add_argument("--out", required=True, type=local_path, metavar="DIR",
                   help="where to write the pair")
    p.add_argument("--days", type=int, default=365, metavar="N",
                   help="validity in days (default %(default)s)")
    p.set_defaults(func=_cmd_tls_cert)
