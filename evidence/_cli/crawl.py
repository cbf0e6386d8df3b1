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
import logging
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from .._errors import EvidenceError
from .common import (
    Parser,
    add_listen_options,
    add_metrics_options,
    add_outage_option,
    apply_config,
    artifacts_location,
    checkpoint_location,
    config_toml,
    confirm,
    format_bytes,
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
    from .._audit.status import RunStatus, StoreStatus
    from .._crawl.crawler import CrawlProgress, CrawlResult
    from .._crawl.frontier import CrawlConfig
    from .._store.db import Store

__all__ = ["add_commands", "crawl_exit_status", "run_crawl"]

log = logging.getLogger("evidence.crawl")


def _cmd_init(args: argparse.Namespace) -> int:
    from .._store.db import Store

    with Store.create(args.store, sync=args.sync, artifacts=args.artifacts) as store:
        where = getattr(store.artifacts, "url", None)  # an object store's, if not artifacts/
        print(f"store {store.store_id} ready at {store.location} "
              f"(schema v{store.schema_version})" + (f", payloads at {where}" if where else ""))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from .._audit.status import status
    from .._store.db import Store

    with Store.open(args.store, read_only=True) as store:
        report = status(store)
    if args.json:
        print_json(report)
    else:
        print(_format_status(report))
    return 0


def _cmd_crawl(args: argparse.Namespace) -> int:
    _configure(args)
    if args.print_config:
        extra: dict[str, object] = {"seeds": list(args.urls)} if args.urls else {}
        if args.request_hosts:
            extra["hosts"] = [msgspec.to_builtins(h) for h in args.request_hosts]
        sys.stdout.write(config_toml(args, args.crawl_parser, extra))
        for rule in args.proxies or ():  # tables come after the keys; no credentials
            hosts, url = msgspec.json.encode(rule["hosts"]), msgspec.json.encode(rule["url"])
            sys.stdout.write(f"\n[[proxies]]\nhosts = {hosts.decode()}\nurl = {url.decode()}\n")
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


def _configure(args: argparse.Namespace) -> None:
    """The options as the command line and ``--config`` give them together (the command line
    wins), the seeds from ``--seeds`` and the file's ``seeds``, and a store to crawl into."""
    extra = {}
    if args.config is not None:
        extra = apply_config(args, args.crawl_parser, args.config,
                             extra=("seeds", "proxies", "hosts"))
    args.request_hosts = None
    if "hosts" in extra:  # [[hosts]] tables: what requests to matching hosts carry
        from .._crawl.secrets import host_tables

        args.request_hosts = host_tables(extra["hosts"], str(args.config))
    seeds = list(args.urls)
    tables = None
    if args.seeds is not None:
        more, tables = read_seeds(args.seeds)
        seeds += more
    if not seeds and "seeds" in extra:  # the command line's seeds win over the file's
        value = extra["seeds"]
        if isinstance(value, str):
            seeds, tables = read_seeds(value)
        elif isinstance(value, list) and all(isinstance(s, str) for s in value):
            seeds = list(value)
        else:
            raise EvidenceError(f"{args.config}: seeds = {value!r}: expected a list of URLs "
                                "or the path of a seeds file",
                                hint='seeds = ["https://example.com/"] or seeds = "seeds.txt"')
    args.urls = seeds
    _configure_proxies(args, extra.get("proxies"))
    args.seed_tables = None
    if tables is not None:  # per-seed rules: every seed has a table (a URL alone: the crawl's)
        from .._crawl.seeds import SeedOptions

        named = {t.url for t in tables}
        args.seed_tables = [*(SeedOptions(url=u) for u in seeds if u not in named), *tables]
    if args.store is None:
        raise EvidenceError("the crawl needs a store", hint="give --store DIR, or store = "
                            "\"DIR\" in the file given to --config")


_PROXY_PASSWORD_WARNING = (
    "Warning: the --proxy URL on this command line holds a password, which every user of "
    "this machine can read (ps, /proc/PID/cmdline); put proxy = \"...\" in the file given "
    "to --config (mode 600) instead. It is never recorded or shown.\n")


def _configure_proxies(args: argparse.Namespace, rules: object) -> None:
    """``--proxy`` and the file's ``[[proxies]]`` checked (before anything is created), and
    split into what the session records (no credentials) and the credentials."""
    from .._crawl.proxy import crawl_routes, parse_proxy, recordable

    where = f"{args.config}: " if args.config is not None else ""
    if rules is None:
        rules = []
    if not isinstance(rules, list):
        raise EvidenceError(f"{where}proxies: expected [[proxies]] tables",
                            hint='[[proxies]] hosts = ["*.example.com"] '
                            'url = "socks5://127.0.0.1:1080"')
    typed = "proxy" in getattr(args, "given", set()) and args.proxy is not None
    try:
        if typed and getattr(parse_proxy(args.proxy), "password", None):
            sys.stderr.write(_PROXY_PASSWORD_WARNING)
        args.proxy, args.proxies, args.proxy_credentials = recordable(args.proxy, rules)
        crawl_routes(args.proxy, args.proxies, remote_dns=bool(args.proxy_remote_dns))
    except EvidenceError as exc:
        raise EvidenceError(f"{where}{exc}", hint=exc.hint) from None
    if not args.proxies:
        args.proxies = None  # not given: a resumed session keeps its recorded rules


def _proxy(text: str) -> str:
    from .._crawl.proxy import parse_proxy

    try:
        parse_proxy(text)
    except EvidenceError as exc:
        raise argparse.ArgumentTypeError(f"{exc} ({exc.hint})") from None
    return text


def read_seeds(path: str) -> tuple[list[str], list | None]:
    """A seeds file's URLs, and its ``[[seeds]]`` tables if it is TOML (``_crawl.seeds``)."""
    from .._crawl.behaviors import BEHAVIORS
    from .._crawl.seeds import load_seeds_file

    return load_seeds_file(path, behaviors=BEHAVIORS)


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
    from .._crawl.frontier import check_seeds
    from .._store.db import DB_NAME, Store
    from .._store.location import is_server_database

    stderr = stderr or sys.stderr
    if not hasattr(args, "proxy_credentials"):  # parsed without --config (the demo)
        _configure_proxies(args, None)
    path = Path(args.store)
    postgres = is_server_database(args.store)  # a database: resuming is checked at open
    if args.urls:
        check_seeds(list(args.urls))
    elif not postgres and not (path / DB_NAME).exists():
        raise EvidenceError(f"no URL given, and {path} holds no crawl to resume",
                            hint=f"give the seed URLs: evidence crawl URL --store {path}")
    hosts = None
    if args.hosts_file is not None:  # each worker host's own token (_crawl/hostauth.py)
        from .._crawl.hostauth import load_hosts

        if args.listen is None:
            raise EvidenceError("--hosts-file names the worker hosts of a crawl that takes "
                                "them", hint="add --listen HOST:PORT")
        hosts = load_hosts(args.hosts_file)
    if args.cross_check is not None and args.listen is None:
        raise EvidenceError("--cross-check fetches again pages that worker hosts fetched",
                            hint="add --listen HOST:PORT (and worker hosts)")
    if args.fail_when_no_hosts is not None and args.listen is None:
        raise EvidenceError("--fail-when-no-hosts is for a crawl that takes worker hosts",
                            hint="add --listen HOST:PORT")
    listen, tls, token = listen_options(args, hosts=hosts is not None)  # before the store
    request = _request_options(args)
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

    from .._crawl.crawler import Crawler, CrawlOptions

    log_to(stderr)
    with _s3_outage_deadline(args.s3_outage_deadline), Store.create(
            args.store if postgres else path, sync=args.sync, artifacts=args.artifacts,
            db_outage_deadline=args.db_outage_deadline) as store, store.writer_lock(), \
            _checkpoints(args, store) as checkpointer:
        config = _crawl_config(args, store, rules, request)
        if config.request and request is None:
            raise EvidenceError("the open session's requests carry headers, cookies or "
                                "credentials, and none were given",
                                hint="give the same --header, --cookies, --secrets and "
                                "[[hosts]] as the run that started it")
        render = _render_options(args, config, request)
        progress: _CrawlProgressLine | _CrawlProgressLog = (
            _CrawlProgressLog() if logs_are_json() else _CrawlProgressLine(
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


@contextlib.contextmanager
def _s3_outage_deadline(value: float | None) -> Iterator[None]:
    """``--s3-outage-deadline``: in the environment, where this process and the worker
    processes it starts read an S3 store's settings (``_store/s3location.py``), for the run."""
    if value is None:
        yield
        return
    from .._store.s3location import OUTAGE_DEADLINE_ENV

    before = os.environ.get(OUTAGE_DEADLINE_ENV)
    os.environ[OUTAGE_DEADLINE_ENV] = repr(value)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(OUTAGE_DEADLINE_ENV, None)
        else:
            os.environ[OUTAGE_DEADLINE_ENV] = before


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


_CONFIG_FLAGS = ("scope", "include", "exclude", "max_depth", "max_attempts", "sitemap",
                 "obey_robots", "user_agent", "max_body_bytes", "max_content_bytes",
                 "max_parse_bytes", "max_links", "recrawl", "rules", "render", "render_only",
                 "requisites", "allow_network", "render_unsafe_anywhere", "proxy",
                 "proxies", "proxy_remote_dns", "http1_only")


def _render_options(args: argparse.Namespace, config: CrawlConfig,
                    request=None):  # -> RenderOptions | None
    """How pages are rendered, when the session renders or logs in (a login runs in the
    browser too); the browser must exist first."""
    if not (config.render or config.render_only or (request is not None and request.logins)):
        return None
    from .._crawl.browser import find_browser
    from .._crawl.render import RenderOptions

    return RenderOptions(executable=find_browser(args.browser), timeout=args.render_timeout,
                         tabs=args.render_tabs, mhtml=args.render_mhtml,
                         behaviors=_behavior_options(args))


def _behavior_options(args: argparse.Namespace):  # -> BehaviorOptions
    """The behaviours a render runs before its capture (docs/replay.md#behaviours)."""
    from .._crawl.behaviors import BEHAVIORS, BehaviorOptions

    script = name = None
    if args.behavior_script is not None:
        try:
            script = Path(args.behavior_script).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EvidenceError(f"{args.behavior_script}: cannot read the behaviour script "
                                f"({exc})", hint="give a UTF-8 JavaScript file") from None
        name = Path(args.behavior_script).name
    return BehaviorOptions(
        enabled=BEHAVIORS if args.behaviors is None else args.behaviors,
        click_selectors=tuple(args.behavior_click or ()), script=script, script_name=name,
        max_seconds=args.behavior_seconds)


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


def _request_options(args: argparse.Namespace):  # -> RequestOptions | None
    """Headers, cookies and credentials for the crawl's requests (``_crawl.secrets``), or
    None; checked before the store is touched."""
    hosts = getattr(args, "request_hosts", None) or []
    if not (args.header or args.cookies or args.secrets or hosts):
        return None
    from .._crawl.cookies import parse_netscape
    from .._crawl.secrets import RequestOptions, Secrets, load_secrets

    if args.processes or args.listen:
        raise EvidenceError("headers, cookies and credentials are sent by this process only, "
                            "and its session's cookie jar lives here",
                            hint="leave out --processes and --listen for this crawl")
    cookies = []
    if args.cookies is not None:
        try:
            text = Path(args.cookies).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EvidenceError(f"cannot read the cookies file {args.cookies}: {exc}",
                                hint="a Netscape cookies.txt file, in UTF-8") from None
        cookies = parse_netscape(text, source=args.cookies)
    secrets = Secrets() if args.secrets is None else load_secrets(args.secrets)
    return RequestOptions.build(headers=args.header or (), hosts=hosts, cookies=cookies,
                                secrets=secrets)


def _crawl_config(args: argparse.Namespace, store: Store,
                  rules: list[dict[str, object]] | None, request=None) -> CrawlConfig:
    """The arguments given, over the open session's recorded configuration when resuming."""
    from .._crawl.frontier import CrawlConfig, last_session

    given = {k: getattr(args, k) for k in _CONFIG_FLAGS if getattr(args, k) is not None}
    if request is not None:
        given["request"] = request.as_record()
    if getattr(args, "seed_tables", None):
        given["seed_options"] = [msgspec.to_builtins(t) for t in args.seed_tables]
    if "recrawl" in given:
        given["recrawl"] = dict(given["recrawl"])
    if rules is not None:
        given["rules"] = rules
    if args.urls:
        return CrawlConfig(seeds=list(args.urls), **given)
    with store.snapshot() as conn:
        last = last_session(conn)
    if last is None or last.outcome is not None or args.clean:
        raise EvidenceError("no URL given and no open session to resume",
                            hint="give the seed URLs: evidence crawl URL --store STORE")
    return msgspec.convert({**last.config, **given}, CrawlConfig)


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


class _CrawlProgressLine:
    """The crawl's progress on stderr. On a terminal: the session and seed once, then a
    live line redrawn in place (and ended with a newline when the crawl ends); elsewhere a
    full line every 10 seconds. It counts errors as they happen, and says why fewer fetches
    are in flight than allowed."""

    def __init__(self, stream, *, outage: Callable[[], Any] | None = None) -> None:
        self.stream = stream
        self.outage = outage  # an object store's outage under way, if any (``describe``)
        self.tty = stream.isatty()
        self._drawn = False
        self._named = False
        self._last = 0.0

    def __call__(self, p: CrawlProgress) -> None:
        if self.tty:
            if not self._named:
                self.say(f"crawling {self.seeds(p)} in session {p.session_id} "
                         f"(run {p.run_id})")
                self._named = True
            line = self.line(p)
            width = shutil.get_terminal_size().columns - 1  # a wrapped line cannot be redrawn
            self.stream.write("\r\x1b[K" + (line if len(line) <= width else
                                             line[:max(0, width - 1)] + "…"))
            self.stream.flush()
            self._drawn = True
        elif p.elapsed - self._last >= 10:
            self._last = p.elapsed
            self.stream.write(f"{p.session_id} {self.seeds(p)}: {self.line(p)}\n")
            self.stream.flush()

    @staticmethod
    def seeds(p: CrawlProgress) -> str:
        if not p.seeds:
            return "?"
        return p.seeds[0] + (f" (+{len(p.seeds) - 1} more seeds)" if len(p.seeds) > 1 else "")

    def line(self, p: CrawlProgress) -> str:
        return self.counts(p) + self.paused()

    def paused(self) -> str:
        """Why the crawl is paused, if an object store it waits on is down (else "")."""
        outage = self.outage() if self.outage is not None else None
        return f"; paused: {outage.describe()}" if outage else ""

    @staticmethod
    def counts(p: CrawlProgress) -> str:
        c = p.counts
        text = (f"done {c.done}, queued {c.queued}, in flight {p.in_flight} of {p.workers}, "
                f"failed {c.failed}, skipped {c.skipped}, errors {p.errors}, "
                f"{p.pages_per_second:.1f} pages/s")
        if p.limited_by:
            text += "; fewer in flight: " + "; ".join(p.limited_by)
        if p.database_unreachable_since is not None:
            text = (f"paused: database unreachable since {p.database_unreachable_since}, "
                    f"retrying; {text}")
        return text

    def say(self, text: str) -> None:
        """A line of its own (the live line is redrawn after it)."""
        self.end()
        self.stream.write(text + "\n")
        self.stream.flush()

    def end(self) -> None:
        """End the live line with a newline, so what follows starts on a line of its own."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


class _CrawlProgressLog:
    """The progress as log lines, with ``--log-format json`` (stderr then carries JSON lines
    only): a ``crawl.progress`` line at the first report and every 10 seconds after, its
    counts in ``data``; what the line would say (a stop signal) as ``crawl.stopping``."""

    def __init__(self) -> None:
        self._last: float | None = None

    def __call__(self, p: CrawlProgress) -> None:
        if self._last is None or p.elapsed - self._last >= 10:
            self._last = p.elapsed
            c = p.counts
            text = _CrawlProgressLine.counts(p)
            log.info("%s", text, extra={"event": "crawl.progress", "data": {
                "done": c.done, "queued": c.queued, "in_flight": p.in_flight,
                "failed": c.failed, "skipped": c.skipped, "errors": p.errors,
                "requested": p.requested, "pages_per_second": round(p.pages_per_second, 3),
                "limited_by": p.limited_by}})

    def say(self, text: str) -> None:
        log.info("%s", text, extra={"event": "crawl.stopping"})

    def end(self) -> None:
        pass


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
    from .._demo.site import SiteConfig, TestSite
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
        found = _demo_tally(conn, result.session_id)
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


def _demo_tally(conn, session_id: str) -> dict[str, int]:
    """The demo site's URLs the session settled as done, counted the way the demo announced
    them (the site's paths are fixed: /, /p/N, redirects answer 301, broken links 404)."""
    from urllib.parse import urlsplit

    found = {"home": 0, "pages": 0, "redirects": 0, "broken": 0}
    for url, reason in conn.execute("SELECT url, reason FROM frontier WHERE session_id = ? "
                                    "AND state = 'done'", (session_id,)):
        path = urlsplit(url).path
        if reason == "HTTP 404":
            found["broken"] += 1
        elif reason.startswith("HTTP 3"):
            found["redirects"] += 1
        elif path == "/":
            found["home"] += 1
        elif path.startswith("/p/"):
            found["pages"] += 1
    return found


def _format_status(s: StoreStatus) -> str:
    lines = [
        f"store      {s.path}",
        f"id         {s.store_id}  (schema v{s.schema_version}, normalizer "
        f"v{s.normalizer_version}, sync={s.sync})",
        f"log        {s.tree_size} messages, root {s.root[:16]}…, last commit "
        f"{s.last_commit_at or 'never'}",
        f"artifacts  {s.rows['artifact']} ({format_bytes(s.artifact_bytes)})",
        f"attempts   {s.rows['fetch_attempt']}   edges {s.rows['discovery_edge']}   "
        f"urls {s.rows['url_identity']}   rule verdicts {s.rows['rule_evaluation']}   "
        f"renders {s.rows['render']}",
        f"quarantine {s.quarantined} ({s.conflicts} conflicts)",
        f"wal        {format_bytes(s.wal_bytes)}",
    ]
    if s.crawl_pid and not s.live:
        lines.append(f"in use     pid {s.crawl_pid} holds the store (a writer service, or a "
                     "crawl just starting)")
    if s.crawl_pid and s.live:
        live = s.live
        writer = live.get("writer") or {}
        lines.append(f"crawling   pid {s.crawl_pid}, run {live.get('run_id', '?')}: "
                     f"{live.get('requested', 0)} requests, {live.get('in_flight', 0)} in "
                     f"flight, {float(live.get('pages_per_second', 0.0)):.1f} pages/s")
        if live.get("worker_pids"):
            lines.append("workers    worker processes, pids "
                         + ", ".join(str(pid) for pid in live["worker_pids"]))
        if writer:
            lines.append(f"writer     queue {writer['queue_depth']}, oldest pending "
                         f"{writer['oldest_pending_age']:.3f} s, {writer['batches']} batches, "
                         f"commit p50 {writer['commit_latency_p50'] * 1000:.1f} ms p99 "
                         f"{writer['commit_latency_p99'] * 1000:.1f} ms, "
                         f"{writer['duplicates']} duplicates, {writer['busy_retries']} busy "
                         "retries")
    if s.hosts_in_backoff:
        lines.append("backoff    " + "; ".join(s.hosts_in_backoff))
    if s.sessions:
        lines.append("sessions")
        for x in s.sessions:
            f = x.frontier
            lines.append(f"  {x.session_id}  {x.mode:<11} {x.outcome or 'open':<9} runs "
                         f"{x.runs}  started {x.started_at}")
            lines.append(f"    frontier: {f.done} done, {f.queued} queued, {f.in_flight} in "
                         f"flight, {f.failed} failed, {f.skipped} skipped" + (
                             f"; oldest in flight since {f.oldest_in_flight_at}"
                             if f.oldest_in_flight_at else ""))
    if s.runs:
        lines.append("runs")
        lines += [_format_run(r) for r in s.runs]
    return "\n".join(lines)


def _format_run(r: RunStatus) -> str:
    return f"  {r.run_id}  {r.state:<9} attempts {r.attempts}  session {r.session_id}"


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
                   "include, exclude, headers and behaviors (docs/crawling.md)")
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
                   "([[logins]]), from a TOML file only its owner may read (mode 600); "
                   "sealed in the stored requests (docs/crawling.md)")
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
