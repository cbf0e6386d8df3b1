"""The crawl command's arguments turned into what the crawl runs with.

``evidence crawl`` takes its options from the command line and from a ``--config`` file
(``configfile``); this module puts them together and checks them before a store is
touched: the seeds (URLs, a seeds file and its per-seed tables), the proxies (what the
session records, and the credentials it does not), the request options (headers,
cookies, credentials and logins: ``secrets``), the worker hosts, how pages are rendered
and what behaviours run, and finally the session's ``CrawlConfig`` (over the open
session's when resuming). ``s3_outage_deadline`` puts one option in the environment the
crawl's worker processes inherit.

It is separate from ``_cli/crawl.py`` so that the command module holds the command's form
(its parser, its signals, its output) and this floor the crawl's configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from .._errors import EvidenceError
from .configfile import apply_config, config_toml

if TYPE_CHECKING:
    from .._store.db import Store
    from .frontier import CrawlConfig

__all__ = ["CONFIG_FLAGS", "behavior_options", "configure", "configure_proxies",
           "crawl_config", "effective_config", "read_seeds", "render_options",
           "request_options", "s3_outage_deadline", "worker_hosts"]


def configure(args: argparse.Namespace) -> None:
    """The options as the command line and ``--config`` give them together (the command line
    wins), the seeds from ``--seeds`` and the file's ``seeds``, and a store to crawl into."""
    extra = {}
    if args.config is not None:
        extra = apply_config(args, args.crawl_parser, args.config,
                             extra=("seeds", "proxies", "hosts"))
    args.request_hosts = None
    if "hosts" in extra:  # [[hosts]] tables: what requests to matching hosts carry
        from .secrets import host_tables

        args.request_hosts = host_tables(extra["hosts"], str(args.config))
    seeds = list(args.urls)
    tables = None
    if args.seeds is not None:
        more, tables = read_seeds(args.seeds, args.secrets)
        seeds += more
    if not seeds and "seeds" in extra:  # the command line's seeds win over the file's
        value = extra["seeds"]
        if isinstance(value, str):
            seeds, tables = read_seeds(value, args.secrets)
        elif isinstance(value, list) and all(isinstance(s, str) for s in value):
            seeds = list(value)
        else:
            raise EvidenceError(f"{args.config}: seeds = {value!r}: expected a list of URLs "
                                "or the path of a seeds file",
                                hint='seeds = ["https://example.com/"] or seeds = "seeds.txt"')
    args.urls = seeds
    configure_proxies(args, extra.get("proxies"))
    args.seed_tables = None
    if tables is not None:  # per-seed rules: every seed has a table (a URL alone: the crawl's)
        from .seeds import SeedOptions

        named = {t.url for t in tables}
        args.seed_tables = [*(SeedOptions(url=u) for u in seeds if u not in named), *tables]
    if args.store is None:
        raise EvidenceError("the crawl needs a store", hint="give --store DIR, or store = "
                            "\"DIR\" in the file given to --config")


_PROXY_PASSWORD_WARNING = (
    "Warning: the --proxy URL on this command line holds a password, which every user of "
    "this machine can read (ps, /proc/PID/cmdline); put proxy = \"...\" in the file given "
    "to --config (mode 600) instead. It is never recorded or shown.\n")


def configure_proxies(args: argparse.Namespace, rules: object) -> None:
    """``--proxy`` and the file's ``[[proxies]]`` checked (before anything is created), and
    split into what the session records (no credentials) and the credentials."""
    from .proxy import crawl_routes, parse_proxy, recordable

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


def effective_config(args: argparse.Namespace) -> str:
    """The effective options as a configuration file (``crawl --print-config``): the keys,
    then the ``[[hosts]]`` (no secrets: those stay in ``--secrets``) and the ``[[proxies]]``
    tables (no credentials)."""
    extra: dict[str, object] = {"seeds": list(args.urls)} if args.urls else {}
    if args.request_hosts:
        extra["hosts"] = [msgspec.to_builtins(h) for h in args.request_hosts]
    text = config_toml(args, args.crawl_parser, extra)
    for rule in args.proxies or ():  # tables come after the keys; no credentials
        hosts, url = msgspec.json.encode(rule["hosts"]), msgspec.json.encode(rule["url"])
        text += f"\n[[proxies]]\nhosts = {hosts.decode()}\nurl = {url.decode()}\n"
    return text


def worker_hosts(args: argparse.Namespace):  # -> dict[str, HostEntry] | None
    """The worker hosts of ``--hosts-file`` (each host's own token: ``hostauth``), and the
    options that only a crawl taking worker hosts (``--listen``) can use, checked."""
    hosts = None
    if args.hosts_file is not None:  # each worker host's own token (_crawl/hostauth.py)
        from .hostauth import load_hosts

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
    return hosts


def read_seeds(path: str, secrets: str | None = None) -> tuple[list[str], list | None]:
    """A seeds file's URLs, and its ``[[seeds]]`` tables if it is TOML (``_crawl.seeds``);
    a table's ``login`` is checked against the logins of ``secrets`` (the secrets file)."""
    from .behaviors import BEHAVIORS
    from .seeds import load_seeds_file

    logins = None
    if secrets is not None and path.endswith(".toml"):
        from .secrets import load_secrets

        logins = set(load_secrets(secrets).named)
    return load_seeds_file(path, behaviors=BEHAVIORS, logins=logins)


CONFIG_FLAGS = ("scope", "include", "exclude", "max_depth", "max_attempts", "sitemap",
                 "obey_robots", "user_agent", "max_body_bytes", "max_content_bytes",
                 "max_parse_bytes", "max_links", "recrawl", "rules", "render", "render_only",
                 "requisites", "allow_network", "render_unsafe_anywhere", "proxy",
                 "proxies", "proxy_remote_dns", "http1_only")


def render_options(args: argparse.Namespace, config: CrawlConfig,
                    request=None):  # -> RenderOptions | None
    """How pages are rendered, when the session renders or logs in (a login runs in the
    browser too); the browser must exist first."""
    if not (config.render or config.render_only or (request is not None and request.logins)):
        return None
    from .browser import find_browser
    from .render import RenderOptions

    return RenderOptions(executable=find_browser(args.browser), timeout=args.render_timeout,
                         tabs=args.render_tabs, mhtml=args.render_mhtml,
                         behaviors=behavior_options(args))


def behavior_options(args: argparse.Namespace):  # -> BehaviorOptions
    """The behaviours a render runs before its capture (docs/replay.md#behaviours)."""
    from .behaviors import BEHAVIORS, BehaviorOptions

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


def request_options(args: argparse.Namespace):  # -> RequestOptions | None
    """Headers, cookies and credentials for the crawl's requests (``_crawl.secrets``), or
    None; checked before the store is touched."""
    hosts = getattr(args, "request_hosts", None) or []
    if not (args.header or args.cookies or args.secrets or hosts):
        return None
    from .cookies import parse_netscape
    from .secrets import (
        WORKER_HOSTS_HINT,
        WORKER_HOSTS_REFUSAL,
        RequestOptions,
        Secrets,
        load_secrets,
    )

    if args.listen:
        raise EvidenceError(WORKER_HOSTS_REFUSAL, hint=WORKER_HOSTS_HINT)
    cookies = []
    if args.cookies is not None:
        try:
            text = Path(args.cookies).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EvidenceError(f"cannot read the cookies file {args.cookies}: {exc}",
                                hint="a Netscape cookies.txt file, in UTF-8") from None
        cookies = parse_netscape(text, source=args.cookies)
    secrets = Secrets() if args.secrets is None else load_secrets(args.secrets)
    options = RequestOptions.build(headers=args.header or (), hosts=hosts, cookies=cookies,
                                   secrets=secrets)
    if getattr(args, "seed_tables", None):  # the logins the seeds name (``_crawl.login``)
        options.use_seed_logins(args.seed_tables, f"the seeds file {args.seeds or args.config}")
    why = options.for_worker()
    if why is not None and args.processes:
        raise EvidenceError(why, hint="leave out --processes for this crawl")
    return options


def crawl_config(args: argparse.Namespace, store: Store,
                  rules: list[dict[str, object]] | None, request=None) -> CrawlConfig:
    """The arguments given, over the open session's recorded configuration when resuming."""
    from .frontier import CrawlConfig, last_session

    last = None
    if not args.urls:
        with store.snapshot() as conn:
            last = last_session(conn)
        if last is None or last.outcome is not None or args.clean:
            raise EvidenceError("no URL given and no open session to resume",
                                hint="give the seed URLs: evidence crawl URL --store STORE")
        if request is not None and not getattr(args, "seed_tables", None):
            from .seeds import SeedOptions  # the recorded seeds' logins run again

            recorded = msgspec.convert(last.config.get("seed_options") or [],
                                       list[SeedOptions])
            request.use_seed_logins(recorded, "the session's seeds")
    given = {k: getattr(args, k) for k in CONFIG_FLAGS if getattr(args, k) is not None}
    if request is not None:
        given["request"] = request.as_record()
    if getattr(args, "seed_tables", None):
        given["seed_options"] = [msgspec.to_builtins(t) for t in args.seed_tables]
    if "recrawl" in given:
        given["recrawl"] = dict(given["recrawl"])
    if rules is not None:
        given["rules"] = rules
    if last is None:
        return CrawlConfig(seeds=list(args.urls), **given)
    return msgspec.convert({**last.config, **given}, CrawlConfig)


@contextlib.contextmanager
def s3_outage_deadline(value: float | None) -> Iterator[None]:
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
