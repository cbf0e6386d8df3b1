"""The crawl commands: ``init``, ``crawl``, ``diff``, ``stop``, ``demo``, ``status``.

Create a store, crawl into it (or resume its open session), watch it (``status``, the
live progress line), stop it gracefully from another terminal, compare two sessions, or
do all of it on the demo site. ``run_crawl`` turns the arguments into a ``CrawlConfig``
and ``CrawlOptions``, checks everything a mistake could be caught by before the store is
opened for writing, and turns SIGINT/SIGTERM into the crawler's graceful stop (a second
signal cancels in-flight fetches).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from .._errors import EvidenceError
from .._model.units import format_bytes
from .common import (
    Parser,
    add_listen_options,
    add_metrics_options,
    add_outage_option,
    artifacts_location,
    checkpoint_location,
    confirm,
    listen_options,
    local_path,
    log_to,
    logs_are_json,
    non_negative,
    note_given,
    parse_duration,
    positive,
    positive_seconds,
    print_json,
    seconds,
    show_default,
    store_location,
)

if TYPE_CHECKING:  # the commands import what they run: a CLI start loads only its own
    from .._archive.checkpoint import Checkpointer
    from .._crawl.options import CrawlResult
    from .._store.db import Store

__all__ = ["add_commands", "crawl_exit_status", "run_crawl"]

def _cmd_init(args: argparse.Namespace) -> int:
    from .._store.db import Store

    with Store.create(args.store, sync=args.sync, artifacts=args.artifacts) as store:
        where = getattr(store.artifacts, "url", None)  # an object store's, if not artifacts/
        print(f"store {store.store_id} ready at {store.location} "
              f"(schema v{store.schema_version})" + (f", payloads at {where}" if where else ""))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from .._audit.status import status, status_text
    from .._store.db import Store

    with Store.open(args.store, read_only=True) as store:
        report = status(store)
    if args.json:
        print_json(report)
    else:
        print(status_text(report))
    return 0


def _cmd_crawl(args: argparse.Namespace) -> int:
    from .._crawl.arguments import configure, effective_config
    from .._crawl.heap import bound_heap

    bound_heap()  # before any thread: a crawl's resident set stays flat (``_crawl.heap``)
    configure(args)
    if args.print_config:
        sys.stdout.write(effective_config(args))
        return 0
    result = run_crawl(args)
    if args.json:
        print_json(result, one_line=True)
    else:
        c = result.counts
        print(f"run {result.run_id} {result.outcome}: {result.reason}\n"
              f"session {result.session_id} "
              f"{'completed' if result.session_completed else 'open'}: "
              f"{c.done} done, {c.queued} queued, {c.failed} failed, {c.skipped} skipped; "
              f"{result.documents} pages requested by this run")
    return crawl_exit_status(result)


def crawl_exit_status(result: CrawlResult) -> int:
    """0 when the run completed, stopped or reached its cap; 1 when it failed (an error, or
    not one seed could be fetched). ``crawl`` and ``demo`` exit alike."""
    return 1 if result.outcome == "failed" else 0


# What a stop signal is called in the run's record and on the terminal.
_SIGNAL_WORDS = {signal.SIGINT: "interrupted by Ctrl-C (SIGINT)",
                 signal.SIGTERM: "stopped by SIGTERM ('evidence stop' or kill)"}


def run_crawl(args: argparse.Namespace, *, stderr=None) -> CrawlResult:
    """Build the configuration from the arguments and run one crawl, handling signals.

    Everything a mistake could be caught by (the seeds, the rules file, resuming a store
    that does not exist) is checked before the store is created or opened for writing.
    """
    from .._crawl.arguments import (
        configure_proxies,
        crawl_config,
        render_options,
        request_options,
        s3_outage_deadline,
        worker_hosts,
    )
    from .._crawl.frontier import check_seeds
    from .._crawl.progressline import CrawlProgressLine, CrawlProgressLog
    from .._store.db import DB_NAME, Store
    from .._store.location import is_server_database

    stderr = stderr or sys.stderr
    if not hasattr(args, "proxy_credentials"):  # parsed without --config (the demo)
        configure_proxies(args, None)
    path = Path(args.store)
    postgres = is_server_database(args.store)  # a database: resuming is checked at open
    if args.urls:
        check_seeds(list(args.urls))
    elif not postgres and not (path / DB_NAME).exists():
        raise EvidenceError(f"no URL given, and {path} holds no crawl to resume",
                            hint=f"give the seed URLs: evidence crawl URL --store {path}")
    hosts = worker_hosts(args)
    listen, tls, token = listen_options(args, hosts=hosts is not None)  # before the store
    request = request_options(args)
    if args.metrics is not None:
        from .._write.metrics import metrics_address

        metrics_address(args.metrics, public=args.metrics_public)
    rules = None
    if args.rules is not None:  # the full definitions are recorded with the session
        from .._crawl.rulesfile import load_rules

        rules = load_rules(args.rules).as_record()
    if args.clean and not args.yes and not confirm(
            f"Abandon the open session of {path} (if any) and start a new one? [y/N] "):
        raise EvidenceError("not confirmed: --clean abandons the open session",
                            hint="add --yes to skip the question")
    if args.checkpoint is not None:  # credentials, bucket and prefix: before the store
        from .._archive.checkpoint import check_destination

        check_destination(args.checkpoint,
                          new_store=not postgres and not (path / DB_NAME).exists())
    import anyio  # the crawl itself: after every check, so a mistake costs no more

    from .._crawl.crawler import Crawler
    from .._crawl.options import CrawlOptions

    log_to(stderr)
    with s3_outage_deadline(args.s3_outage_deadline), Store.create(
            args.store if postgres else path, sync=args.sync, artifacts=args.artifacts,
            db_outage_deadline=args.db_outage_deadline) as store, store.writer_lock(), \
            _checkpoints(args, store) as checkpointer:
        config = crawl_config(args, store, rules, request)
        if config.request and request is None:
            raise EvidenceError("the open session's requests carry headers, cookies or "
                                "credentials, and none were given",
                                hint="give the same --header, --cookies, --secrets and "
                                "[[hosts]] as the run that started it")
        render = render_options(args, config, request)
        progress: CrawlProgressLine | CrawlProgressLog = (
            CrawlProgressLog() if logs_are_json() else CrawlProgressLine(
                stderr, outage=getattr(store.artifacts, "outage", None)))
        options = CrawlOptions(
            workers=args.workers, per_host=args.per_host, delay=args.delay,
            timeout=args.timeout, deadline=args.deadline, grace=args.grace,
            max_documents=args.max_documents, clean=args.clean, full=args.full,
            processes=args.processes, render=render, progress=progress,
            listen=listen, tls=tls, token=token, lease_timeout=args.lease_timeout,
            hosts=hosts, no_hosts_timeout=args.fail_when_no_hosts,
            cross_check=args.cross_check or 0.0, proxy_credentials=args.proxy_credentials,
            progress_interval=1.0, metrics=args.metrics, metrics_public=args.metrics_public,
            request=request)
        crawler = Crawler(store, config, options)

        async def main() -> CrawlResult:
            async with anyio.create_task_group() as tg:
                async def signals() -> None:
                    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
                        async for signum in received:
                            words = _SIGNAL_WORDS[signal.Signals(signum)]
                            if not crawler.stopping:
                                progress.say(f"{words}: no new requests; in-flight fetches "
                                             f"get {options.grace:g} s to finish (a second "
                                             "Ctrl-C cancels them now)")
                                crawler.request_stop(words)
                            else:
                                progress.say(f"{words} again: cancelling in-flight fetches; "
                                             "their URLs are requeued by the next run")
                                crawler.cancel(f"{words} again")
                tg.start_soon(signals)
                if checkpointer is not None:
                    tg.start_soon(checkpointer.every, args.every)
                try:
                    result = await crawler.run()
                finally:
                    progress.end()
                    tg.cancel_scope.cancel()
            return result

        try:
            result = anyio.run(main)
        except Exception:
            if checkpointer is not None:  # what the failed run committed, if it can be
                with contextlib.suppress(EvidenceError, OSError):
                    checkpointer.take()
            raise
        if checkpointer is not None:
            _final_checkpoint(checkpointer)
        return result


@contextlib.contextmanager
def _checkpoints(args: argparse.Namespace, store: Store) -> Iterator[Checkpointer | None]:
    """With ``--checkpoint``: the store's checkpoints to object storage (docs/scale.md,
    "Ephemeral runners"); else None."""
    if args.checkpoint is None:
        yield None
        return
    from .._archive.checkpoint import Checkpointer

    with Checkpointer(store, args.checkpoint) as checkpointer:
        yield checkpointer


def _final_checkpoint(checkpointer: Checkpointer) -> None:
    """The checkpoint at the end of the run (its failure is the command's, exit 2)."""
    last = checkpointer.final()
    print(f"checkpoint {last.checkpoint_id} at {checkpointer.url}: {last.uploaded} payloads "
          f"uploaded ({format_bytes(last.uploaded_bytes)}), database "
          f"{format_bytes(last.database.bytes)}; {len(checkpointer.taken)} checkpoints this "
          f"run, {checkpointer.failures} failed", file=sys.stderr)


def _interval(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 1, not {text}")
    return value


def _lease(text: str) -> float:
    value = seconds(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 second or more, not {text}")
    return value


def _proxy(text: str) -> str:
    from .._crawl.proxy import parse_proxy

    try:
        parse_proxy(text)
    except EvidenceError as exc:
        raise argparse.ArgumentTypeError(f"{exc} ({exc.hint})") from None
    return text


def _behavior_list(text: str) -> tuple[str, ...]:
    """``none``, or behaviour names separated by commas, each known."""
    from .._crawl.behaviors import BEHAVIORS

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if names == ("none",):
        return ()
    unknown = [n for n in names if n not in BEHAVIORS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown behaviour {', '.join(unknown) or repr(text)}: give 'none' or some of "
            f"{','.join(BEHAVIORS)}")
    return names


def _config_default(field: str):  # -> Callable[[], object]
    """Reads ``CrawlConfig``'s default for ``field`` when ``crawl --help`` is printed (the
    crawl's configuration is imported by the commands that crawl, not by every start)."""
    def read() -> object:
        from .._crawl.frontier import CrawlConfig

        return getattr(CrawlConfig(seeds=[]), field)
    return read


def _network(text: str) -> str:
    from .._crawl.netpolicy import parse_network

    try:
        return str(parse_network(text))
    except EvidenceError as exc:
        raise argparse.ArgumentTypeError(f"{exc} ({exc.hint})") from None


def _recrawl_rule(text: str) -> tuple[str, str]:
    key, sep, value = text.rpartition("=")
    if not sep or not key or not value:
        raise argparse.ArgumentTypeError(f"expected REGEX=FREQUENCY, got {text!r}")
    from .._crawl.incremental import parse_frequency

    parse_frequency(value)
    return key, value


def _cmd_diff(args: argparse.Namespace) -> int:
    from .._store.db import Store

    if len(args.session) != 2:
        raise EvidenceError("diff takes exactly two --session options",
                            hint="evidence diff STORE --session A --session B")
    from .._crawl.incremental import diff_sessions

    with Store.open(args.store, read_only=True) as store, store.snapshot() as conn:
        report = diff_sessions(conn, *args.session)
    if args.json:
        print_json(report, one_line=True)
        return 0
    print(f"{report.session_a} -> {report.session_b}")
    for change in ("added", "changed", "unchanged", "orphaned"):
        urls = getattr(report, change)
        print(f"{change} {len(urls)}")
        if change != "unchanged":
            for url in urls:
                print(f"  {url}")
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    from .._store.db import stop_writer

    pid = stop_writer(args.store)
    if pid is None:
        print(f"no crawl is running on {args.store}")
        return 1
    print(f"asked the crawl (pid {pid}) to stop: it makes no new requests, gives in-flight "
          "fetches its grace period (crawl --grace) to finish, commits and exits")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .._demo.site import SiteConfig, TestSite, demo_tally
    from .._store.db import Store

    config = SiteConfig(pages=args.pages)
    with TestSite(config) as site:
        print(f"serving a demo site at {site.url} (127.0.0.1 only): a home page and "
              f"{args.pages} pages, with {len(config.redirects)} redirects, "
              f"{len(config.private_links)} pages robots.txt keeps private and "
              f"{len(config.not_found)} broken links", file=sys.stderr)
        result = run_crawl(_crawl_arguments(site.url, "--store", args.store, "--clean",
                                            "--yes"))
    with Store.open(args.store) as store, store.snapshot() as conn:
        found = demo_tally(conn, result.session_id)
    print(f"\ncrawled into {args.store}: the home page {'and' if found['home'] else 'not, but'}"
          f" {found['pages']} of the {args.pages} pages; followed {found['redirects']} "
          f"redirects, recorded {found['broken']} broken links, skipped "
          f"{result.counts.skipped} URLs (robots.txt or scope), {result.counts.failed} failed. "
          f"Session {result.session_id} "
          f"{'completed' if result.session_completed else 'open'}; run {result.outcome}: "
          f"{result.reason}.\nNext: evidence status {args.store}")
    return crawl_exit_status(result)


def _crawl_arguments(*argv: str) -> argparse.Namespace:
    """``evidence crawl ARGV`` parsed, as the command line would give it to ``run_crawl``."""
    parser: argparse.ArgumentParser = Parser(prog="evidence")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["crawl", *argv])


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add init, crawl, diff, stop, demo and status to the ``evidence`` parser."""
    p = sub.add_parser("init", help="create an evidence store",
                       description="Create an evidence store (a directory holding "
                       "evidence.db and artifacts/) in a new or empty directory. Opening an "
                       "existing store is harmless; a file or a directory of other things "
                       "(an archive, say) is refused.")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory, or a PostgreSQL connection string "
                   "(postgresql://..., or libpq's 'host=... dbname=...'): see docs/store.md")
    p.add_argument("--sync", choices=("full", "normal"), default="full",
                   help="full (default): every commit survives power loss; normal: survives "
                   "a process crash, may lose the last commits on power loss")
    p.add_argument("--artifacts", metavar="DIR|URL", type=artifacts_location,
                   help="where the payloads live, recorded in the store so that later "
                   "commands find it: an S3-compatible object store, "
                   "s3://BUCKET/PREFIX[?endpoint=URL&region=NAME] (credentials from "
                   "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; endpoint and region also "
                   "from AWS_ENDPOINT_URL and AWS_REGION), or, for a PostgreSQL store, a "
                   "directory (default: a store directory keeps them in STORE/artifacts; a "
                   "PostgreSQL store needs one; see docs/scale.md)")
    p.set_defaults(func=_cmd_init)

    p = sub.add_parser(
        "crawl", help="crawl a site into a store (or resume the open session)",
        description="Crawl from the seed URLs into STORE, recording every attempt, payload "
        "and link as evidence. Without URLs, resume the open session with its recorded "
        "configuration. A run ends when the frontier is exhausted, at --max-documents, or "
        "on Ctrl-C, SIGTERM or 'evidence stop' (no new requests; in-flight fetches get "
        "--grace seconds to finish, then are cancelled, as they are at once by a second "
        "signal; the session stays open). Exit status 0 when the run completed, stopped or "
        "reached its cap; 1 when it failed, or when not one seed could be fetched.")
    p.add_argument("urls", metavar="URL", nargs="*", help="seed URLs (new session)")
    p.add_argument("--store", type=store_location,
                   help="the store directory (created if absent), or a PostgreSQL "
                   "connection string (required, here or in --config)")
    p.add_argument("--config", metavar="FILE", type=local_path,
                   help="a TOML file of options under their long flags' names (store, "
                   "workers, max_documents, ...) and seeds (a list of URLs, or a seeds "
                   "file); options given on the command line win (docs/crawling.md)")
    p.add_argument("--seeds", metavar="FILE", type=local_path,
                   help="seed URLs from a file, one a line (# starts a comment); or, named "
                   "*.toml, [[seeds]] tables with each seed's own scope, max_depth, "
                   "include, exclude, headers, behaviors and login (a named [[logins]] table "
                   "of --secrets; docs/crawling.md)")
    p.add_argument("--print-config", action="store_true",
                   help="print the effective options as a --config file and exit (nothing "
                   "is crawled or created)")
    p.add_argument("--artifacts", metavar="DIR|URL", type=artifacts_location,
                   help="a new store: where its payloads live, s3://BUCKET/PREFIX or (a "
                   "PostgreSQL store) a directory (see 'evidence init --help'); an existing "
                   "store knows where they are")
    p.add_argument("--workers", type=positive, default=8, metavar="N",
                   help="fetches in flight at once, in all")
    p.add_argument("--per-host", type=positive, metavar="N",
                   help="fetches in flight at once on one host (default: as many as "
                   "--workers; lower it to be gentler with each site)")
    p.add_argument("--delay", type=seconds, default=0.0, metavar="SECONDS",
                   help="seconds between request starts per host (robots Crawl-delay wins)")
    p.add_argument("--timeout", type=seconds, default=30.0, metavar="SECONDS",
                   help="seconds one read may wait: connecting, the response head, each part "
                   "of the body")
    p.add_argument("--deadline", type=seconds, default=120.0, metavar="SECONDS",
                   help="seconds one fetch may take in all (connect, head and body); past it "
                   "the attempt is recorded as a timeout with the bytes that came")
    p.add_argument("--grace", type=seconds, default=10.0, metavar="SECONDS",
                   help="after Ctrl-C, SIGTERM or 'evidence stop': seconds in-flight fetches "
                   "get to finish before they are cancelled (a second signal cancels them at "
                   "once)")
    p.add_argument("--processes", type=non_negative, default=0, metavar="N",
                   help="fetch and parse in N worker processes; this one keeps the frontier "
                   "and runs the writer as a service for them (default 0: all in this one). "
                   "It helps where a page's own work (HTTP, storing, parsing) is what one "
                   "process is short of, a core is free, many requests are in flight and the "
                   "crawl is long enough to pay for starting them (about 0.5 s). On 2 cores "
                   "shared with a local web server and 3.6 KB pages, on 5,000 pages: "
                   "--processes 2 ran at 1.08 times the one-process rate at --workers 32, but "
                   "at --workers 8 --processes 1 and 2 ran at 0.91 and 0.90 times (0.81 and "
                   "0.72 on 600 pages)")
    add_listen_options(p, what="take worker hosts ('evidence worker --connect'):")
    add_metrics_options(p)
    p.add_argument("--lease-timeout", type=_lease, default=15.0, metavar="SECONDS",
                   help="a worker host silent this long loses the pages it holds, which "
                   "return to the frontier (default %(default)s)")
    p.add_argument("--hosts-file", type=local_path, metavar="FILE",
                   help="a TOML file naming each worker host and its own token "
                   "([hosts.NAME] token_sha256 = \"HEX\", or token_file = \"FILE\"): a "
                   "host connects only with its token, every message it submits records "
                   "its name in the ledger, and one that submits what was not leased to it "
                   "is refused for the rest of the run (docs/scale.md); --token-file then "
                   "serves no worker host")
    p.add_argument("--cross-check", type=_fraction, metavar="FRACTION",
                   help="fetch this share (0 to 1) of the pages worker hosts fetched again "
                   "here and record whether the content matched (rule evidence.cross-check:"
                   " pass, fail or error, on this crawl's own attempt; docs/scale.md); a "
                   "page that changes between fetches fails it too")
    p.add_argument("--fail-when-no-hosts", type=positive_seconds, metavar="SECONDS",
                   help="fail the run when no worker host has served it for SECONDS, once "
                   "one has (all fenced or gone); by default the run waits for hosts to "
                   "come back, however long")
    p.add_argument("--max-documents", type=positive, metavar="N",
                   help="pages this run requests; the next run continues the session "
                   "(default: no cap)")
    p.add_argument("--scope", choices=("host", "domain", "prefix"),
                   help="what the crawl may leave the seeds for: host, the seeds' origins "
                   "(scheme, host and port; the default); domain, any host under a seed's "
                   "registrable domain (Public Suffix List); prefix, under a seed URL")
    p.add_argument("--header", action="append", metavar="'NAME: VALUE'",
                   help="add this header to every request, the browser's too (repeatable); "
                   "per host: [[hosts]] in the --config file; a credential or a cookie is "
                   "refused here (--secrets, --cookies; see docs/crawling.md)")
    p.add_argument("--cookies", metavar="FILE", type=local_path,
                   help="start the session's cookie jar with these cookies (Netscape "
                   "cookies.txt); their values are secrets: sealed in the stored requests "
                   "and left out of exports (docs/security.md)")
    p.add_argument("--secrets", metavar="FILE", type=local_path,
                   help="credentials (HTTP basic or digest), secret headers and cookies per "
                   "host pattern ([[hosts]] tables), and form logins run in Chromium "
                   "([[logins]]: cookies and localStorage carried to every fetch and "
                   "render), from a TOML file only its owner may read (mode 600); sealed in "
                   "the stored requests; with --processes (no login there) but not "
                   "--listen (docs/crawling.md)")
    p.add_argument("--allow-network", action="append", type=_network, metavar="CIDR",
                   help="let the crawl and its renders connect to addresses in CIDR too "
                   "(repeatable); by default loopback, private, link-local, unique-local, "
                   "multicast and other non-public addresses are refused and recorded, a "
                   "seed's own origin aside (see docs/security.md)")
    p.add_argument("--proxy", type=_proxy, metavar="URL",
                   help="fetch and render through this proxy: http://HOST:PORT (a CONNECT "
                   "tunnel for every origin), socks5://HOST:PORT (the crawler resolves and "
                   "checks each origin), socks5h://HOST:PORT (the proxy resolves names: needs "
                   "--proxy-remote-dns), USER:PASSWORD@ before the host if it asks for them "
                   "(never recorded); 'none' connects directly; per host pattern: [[proxies]] "
                   "in --config (docs/crawling.md, \"Proxies\")")
    p.add_argument("--proxy-remote-dns", action="store_true", default=None,
                   help="accept a socks5h proxy, which resolves the origins' names itself: "
                   "the network policy then cannot check where those connections go")
    p.add_argument("--include", action="append", metavar="REGEX",
                   help="only URLs matching one of these (repeatable)")
    p.add_argument("--exclude", action="append", metavar="REGEX",
                   help="never URLs matching one of these (repeatable)")
    p.add_argument("--max-depth", type=non_negative, metavar="N",
                   help="links from a seed (default unlimited)")
    p.add_argument("--max-attempts", type=positive, metavar="N",
                   help="claims of one URL before it is failed (default 3)")
    p.add_argument("--sitemap", action="store_true", default=None,
                   help="also seed from each seed host's /sitemap.xml")
    p.add_argument("--requisites", action="store_true", default=None,
                   help="also fetch each page's requisites within the scope: images "
                   "(src, srcset, icons), scripts, stylesheets, CSS url()s, media (default: "
                   "recorded as edges of their own kinds, not fetched)")
    p.add_argument("--http1-only", action="store_true", default=None,
                   help="speak HTTP/1.1 only: TLS offers ALPN http/1.1 alone (default: it "
                   "offers h2 and http/1.1 and the server picks; each attempt records the "
                   "protocol used; recorded in the session configuration)")
    p.add_argument("--ignore-robots", dest="obey_robots", action="store_false", default=None,
                   help="do not obey robots.txt (recorded in the session configuration)")
    show_default(p.add_argument("--user-agent", metavar="TEXT",
                                help="the User-Agent header (default %(default)r)"),
                 _config_default("user_agent"))
    show_default(p.add_argument("--max-body-bytes", type=positive, metavar="N",
                                help="bodies are cut at this size and recorded as truncated "
                                "(default %(default)s, 10 MiB)"),
                 _config_default("max_body_bytes"))
    show_default(p.add_argument("--max-content-bytes", type=positive, metavar="N",
                                help="content decoded from a body (gzip, deflate, chunks) is "
                                "cut at this size and recorded as truncated; the body is kept "
                                "whole (default %(default)s, 8 MiB)"),
                 _config_default("max_content_bytes"))
    show_default(p.add_argument("--max-parse-bytes", type=positive, metavar="N",
                                help="links are found in this much of a page's content at "
                                "most, and rules read no larger document; past it the "
                                "discovery is recorded as truncated (default %(default)s, "
                                "2 MiB)"),
                 _config_default("max_parse_bytes"))
    show_default(p.add_argument("--max-links", type=positive, metavar="N",
                                help="references taken from one page; past it the discovery "
                                "is recorded as truncated (default %(default)s)"),
                 _config_default("max_links"))
    p.add_argument("--recrawl", action="append", type=_recrawl_rule, metavar="REGEX=FREQ",
                   help="incremental sessions: do not refetch documents whose fetch key "
                   "matches REGEX (or type:MEDIA/TYPE) more often than FREQ (daily, weekly, "
                   "12h, 3d...); sitemap lastmod/changefreq come first (repeatable)")
    p.add_argument("--rules", metavar="FILE",
                   help="judge every page by these compliance rules (TOML, see docs/rules.md);"
                   " the definitions are recorded with the session (default: no rules)")
    p.add_argument("--render", action="store_true", default=None,
                   help="load each 2xx HTML page in headless Chromium and record the DOM, a "
                   "full-page screenshot and every request the browser made; links in the "
                   "rendered DOM are followed (see docs/replay.md)")
    p.add_argument("--render-only", action="append", metavar="REGEX",
                   help="render only pages whose fetch key matches (repeatable; implies "
                   "--render)")
    p.add_argument("--render-unsafe-anywhere", action="store_true", default=None,
                   help="let a rendered page send requests other than GET and HEAD (a form's "
                   "POST, a script's fetch PUT or DELETE) outside the crawl's scope; by "
                   "default they are refused and recorded")
    p.add_argument("--render-timeout", type=positive_seconds, default=30.0, metavar="SECONDS",
                   help="the longest one render may take; then it is a 'timeout' attempt "
                   "(default 30)")
    p.add_argument("--render-tabs", type=positive, default=2, metavar="N",
                   help="pages rendered at once (default 2)")
    p.add_argument("--render-mhtml", action="store_true",
                   help="also keep each rendered page as MHTML")
    p.add_argument("--behaviors", type=_behavior_list, metavar="LIST",
                   help="what a render does to the page before its capture, in order: "
                   "autoscroll (to the bottom, at most 50,000 px), lazy (load lazy images "
                   "and frames), details (open them), load-more (click 'load more' buttons, "
                   "at most 20 clicks), autoplay (start media, muted); each action is "
                   "recorded with the render. 'none' turns them off (default: all)")
    p.add_argument("--behavior-click", action="append", metavar="SELECTOR",
                   help="also click elements matching this CSS selector in load-more "
                   "(repeatable)")
    p.add_argument("--behavior-script", metavar="FILE", type=local_path,
                   help="run this JavaScript in each rendered page after the behaviours; "
                   "its value (awaited if a promise) is recorded")
    p.add_argument("--behavior-seconds", type=positive_seconds, default=15.0,
                   metavar="SECONDS",
                   help="the longest the behaviours of one render may take (default 15; "
                   "the render's --render-timeout still bounds the whole render)")
    p.add_argument("--browser", metavar="PATH",
                   help="the Chromium executable (default: chromium on PATH)")
    p.add_argument("--full", action="store_true",
                   help="a new session crawls in full even when a completed one exists "
                   "(default: incremental against the last completed session)")
    p.add_argument("--clean", action="store_true",
                   help="abandon the open session (its evidence stays) and start a new one")
    p.add_argument("--yes", action="store_true", help="do not ask to confirm --clean")
    p.add_argument("--sync", choices=("full", "normal"), default="full",
                   help="durability of commits (see 'evidence init --help')")
    add_outage_option(p, "the crawl")
    p.add_argument("--checkpoint", type=checkpoint_location, metavar="s3://BUCKET/PREFIX",
                   help="copy the store to object storage every --every and when the run "
                   "ends, for a machine whose disk is thrown away: each checkpoint a "
                   "consistent snapshot, uploading only new payloads; a failed one is logged "
                   "and retried, a failed final one fails the command (exit 2). Restore on "
                   "another machine with evidence restore s3://BUCKET/PREFIX --store DIR and "
                   "resume: what "
                   "committed after the last checkpoint is fetched again (docs/scale.md, "
                   "'Ephemeral runners')")
    p.add_argument("--every", type=_interval, default=300.0, metavar="DURATION",
                   help="time between checkpoints: 90s, 5m, 1h (default 5m)")
    p.add_argument("--s3-outage-deadline", type=seconds, metavar="SECONDS",
                   help="payloads in an object store: how long requests to it keep "
                   "retrying while it is unreachable or failing with 5xx (the crawl pauses "
                   "meanwhile) before the run fails (default: EVIDENCE_S3_OUTAGE_DEADLINE, "
                   "else 60; docs/scale.md)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    note_given(p)  # last: --config fills in only what the command line left out
    p.set_defaults(func=_cmd_crawl, crawl_parser=p)

    p = sub.add_parser("diff", help="compare two completed sessions document by document",
                       description="Added, changed, unchanged and orphaned documents between "
                       "two completed sessions, from their records (a document is a URL "
                       "whose last attempt in the session got an HTTP answer; changed: "
                       "another status or body checksum).")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory")
    p.add_argument("--session", action="append", required=True, metavar="ID",
                   help="give twice: the older session A, then B")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_cmd_diff)

    p = sub.add_parser("stop", help="ask the crawl running on a store to stop gracefully",
                       description="Send SIGTERM to the crawl holding STORE's crawl lock: it "
                       "makes no new requests, gives in-flight fetches its grace period to "
                       "finish, commits and exits; the session stays open. Exit status 1 "
                       "when no crawl is running, 2 when STORE is not a store.")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory")
    p.set_defaults(func=_cmd_stop)

    p = sub.add_parser("demo", help="crawl a small site served on 127.0.0.1 into a store",
                       description="Serve a generated demo site on 127.0.0.1 (random port) "
                       "and crawl it into STORE with a new session, as 'evidence crawl' "
                       "does (and with its exit status). No other address is contacted.")
    p.add_argument("store", metavar="STORE", nargs="?", default="demo.evidence",
                   type=local_path,
                   help="the store directory (default ./demo.evidence)")
    p.add_argument("--pages", type=positive, default=60, metavar="N",
                   help="pages in the demo site, besides its home page")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("status", help="show what a store holds",
                       description="Show sessions, runs (a run whose process is gone shows "
                       "as interrupted), row counts, the Merkle log head, quarantine and WAL "
                       "size, from one short read-only snapshot.")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_cmd_status)
