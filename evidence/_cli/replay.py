"""The ``replay`` and ``show`` commands: the exact bytes recorded for a URL, a capture in a
browser, and everything the store holds about one page.

``evidence replay STORE URL`` prints what ``_audit.replay`` finds (the response head and
body as they came off the connection, or the decoded content); ``--serve`` runs
``_archive.replayserve.ReplayServer`` (pywb on 127.0.0.1) until Ctrl-C or SIGTERM. Exit
status 1 when the attempt found received no response, 2 for an error.

``evidence show STORE URL`` prints ``_audit.show.page_evidence`` (attempts, renders, links,
verdicts) and writes the parts a reviewer asks for (``--screenshot out.png``, ``--dom``,
``--headers``, ``--request``, ``--body``, ``--content``) to files.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

import msgspec

from .._errors import EvidenceError
from .common import local_path, print_json, store_location

__all__ = ["add_commands"]


def _cmd_replay(args: argparse.Namespace) -> int:
    from .._store.db import Store

    if args.serve:
        return _cmd_replay_serve(args)
    if args.public_key or args.unverified:
        raise EvidenceError("--public-key and --unverified go with --serve",
                            hint=f"evidence replay {args.store} --serve --public-key KEY.pub")
    if args.url is None:
        raise EvidenceError("replay needs a URL (or --serve to browse the capture)",
                            hint="evidence replay STORE URL, or evidence replay STORE --serve")
    from .._audit.replay import replay

    with Store.open(args.store, read_only=True) as store:
        found = replay(store, args.url, run_id=args.run, at=args.at, content=args.content)
    if args.json:
        print_json(found.metadata())
        return 0
    if found.response_headers is None and found.body is None:
        print(f"attempt {found.attempt_id} ({found.started_at}) received no response: "
              f"outcome {found.outcome}", file=sys.stderr)
        return 1
    if args.headers_only:
        data = found.response_headers or b""
    elif args.body_only:
        data = found.body or b""
    elif args.content:
        data = found.content or b""
    else:
        data = found.http_message()
    if args.out:
        Path(args.out).write_bytes(data)
        print(f"attempt {found.attempt_id} ({found.started_at}, run {found.run_id}): wrote "
              f"{len(data)} bytes to {args.out}", file=sys.stderr)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    return 0


def _cmd_replay_serve(args: argparse.Namespace) -> int:
    from .._archive.replayserve import ReplayServer

    if (args.public_key or args.unverified) and not Path(args.store).is_file():
        raise EvidenceError("--public-key and --unverified are for a WACZ file; a store is "
                            "exported afresh for replay, so it has no signature to check",
                            hint=f"evidence verify {args.store} checks a store")
    pinned = None
    if args.public_key:
        from .._archive.waczcheck import load_public_key

        pinned = load_public_key(args.public_key)
    with ReplayServer(args.store, port=args.port, public_key=pinned,
                      unverified=args.unverified) as server:
        check = server.check
        if check is not None and not check.ok:  # served only because --unverified
            print(f"UNVERIFIED: {args.store} failed verification; every page says so. "
                  f"{len(check.problems)} problem(s), the first: {check.problems[0]}",
                  file=sys.stderr)
            sys.stderr.flush()
        if args.json:  # one line, printed once the server listens: a script reads it
            print_json({"url": server.url, "port": server.port,
                        "verified": None if check is None else check.ok,
                        "problems": [] if check is None else check.problems,
                        "pages": [
                {"url": p.url, "ts": p.ts, "title": p.title, "replay_url": p.replay_url}
                for p in server.pages]}, one_line=True)
        else:
            print(f"serving {args.store} with pywb at {server.url} (127.0.0.1 only); "
                  f"Ctrl-C stops it. {len(server.pages)} pages:")
            for page in server.pages:
                print(f"  {page.replay_url}  {page.title}")
        sys.stdout.flush()
        # SIGTERM as Ctrl-C: the server's temporary collection is removed either way.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        with contextlib.suppress(KeyboardInterrupt):
            server.wait()
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from .._audit.show import PART_NAMES, extract, page_evidence
    from .._store.db import Store

    wanted = {part: getattr(args, part) for part in PART_NAMES if getattr(args, part)}
    targets = [Path(f) for f in wanted.values()]
    if len(set(targets)) < len(targets):
        raise EvidenceError("two parts were asked to go to the same file",
                            hint="give each --PART its own file")
    with Store.open(args.store, read_only=True) as store:
        page = page_evidence(store, args.url, run_id=args.run, at=args.at)
        missing = [part for part in wanted if part not in page.parts]
        if missing:  # before anything is written: a failed command creates nothing
            raise EvidenceError(
                f"the attempt of {page.fetch_key} has no {' or '.join(missing)} recorded",
                hint="drop that option; 'evidence show STORE URL' lists what it has")
        data = {part: extract(store, page, part) for part in wanted}
    for part, target in wanted.items():
        Path(target).write_bytes(data[part])
    if args.json:
        print_json({**msgspec.to_builtins(page),
                    "written": {part: str(target) for part, target in wanted.items()}})
        return 0
    print(_format_page(page))
    for part, target in wanted.items():
        print(f"wrote {part} ({len(data[part])} bytes) to {target}")
    return 0


def _format_page(page) -> str:
    lines = [f"page       {page.fetch_key}",
             f"links      {page.links_out} out (the chosen attempt), {page.links_in} in"]
    lines.append(f"attempts   {len(page.attempts)}")
    for a in page.attempts:
        mark = "*" if a.chosen else " "
        status = a.http_status if a.http_status is not None else "-"
        size = "" if a.body_bytes is None else f" {a.body_bytes} bytes"
        lines.append(f"  {mark} {a.started_at}  run {a.run_id}  {a.method} {status} "
                     f"{a.outcome}{size}  {a.content_type or ''}  log {a.log_index}  "
                     f"{a.attempt_id}" + (f"  error: {a.error}" if a.error else ""))
        if a.connection is not None:
            lines.append(f"      {_format_connection(a.connection)}")
    if page.renders:
        lines.append(f"renders    {len(page.renders)}")
        for r in page.renders:
            acted = ("" if r.behavior_actions is None
                     else f"{r.behavior_actions} behaviour actions  ")
            lines.append(f"    {r.started_at}  {r.outcome}  {r.requests} requests  {acted}"
                         f"title {r.title!r}  log {r.log_index}  of {r.attempt_id}")
    if page.verdicts:
        lines.append("verdicts   " + ", ".join(
            f"{v.rule_id}@{v.rule_version} {v.verdict}" for v in page.verdicts))
    lines.append("recorded   " + (", ".join(f"{part} {ref.size} bytes" for part, ref
                                           in page.parts.items()) or "nothing to extract")
                 + "  (* the attempt the page stands for)")
    return "\n".join(lines)


def _format_connection(c) -> str:
    """One attempt's connection in a line: with whom, from where, how."""
    remote = f"[{c.remote_address}]" if ":" in c.remote_address else c.remote_address
    text = f"to {remote}:{c.remote_port} from {c.local_address}:{c.local_port}"
    if c.reused:
        text += " (kept alive)"
    if c.proxy is not None:
        p = c.proxy
        host = f"[{p.host}]" if ":" in p.host else p.host
        target = f"[{p.target}]" if ":" in p.target else p.target
        text += (f"; through the {p.scheme} proxy {host}:{p.port}, to {target}:"
                 f"{p.target_port}: {p.reply}" + ("" if p.established else " (refused)"))
    if c.dns is not None:
        text += (f"; {c.dns.host} resolved to {', '.join(c.dns.addresses)} by "
                 f"{c.dns.source} at {c.dns.resolved_at}")
    if c.tls is not None:
        t = c.tls
        text += f"; {t.version} {t.cipher}, ALPN {t.alpn or '-'}, SNI {t.sni or '-'}"
        if t.chain_ref is not None:
            text += f", chain {t.chain_ref.size} bytes"
        text += ", verified" if t.verified else ", not verified"
    return text


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``replay`` to the ``evidence`` parser."""
    p = sub.add_parser(
        "replay", help="the exact response bytes recorded for a URL, or browse a capture",
        description="Print the response head and body of the attempt current for URL (in a "
        "run, or at a time) byte for byte, as they came off the connection (chunk framing "
        "and content coding included); --content prints the decoded content instead. "
        "With --serve, serve the whole capture (a store or a WACZ file) for a web browser "
        "through pywb on 127.0.0.1, and list each page's address (docs/replay.md).")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory (with --serve: or a "
                   "WACZ file)")
    p.add_argument("url", metavar="URL", nargs="?",
                   help="the URL (compared by its normalized form)")
    p.add_argument("--serve", action="store_true",
                   help="serve the capture to a browser with pywb until Ctrl-C")
    p.add_argument("--port", type=int, default=8080,
                   help="--serve: the port on 127.0.0.1 (default 8080; 0: a free one)")
    p.add_argument("--public-key", metavar="KEY", type=local_path,
                   help="--serve with a WACZ: serve it only if this key signed it (as "
                   "evidence verify X.wacz --public-key KEY checks)")
    p.add_argument("--unverified", action="store_true",
                   help="--serve: serve a WACZ that fails verification anyway, a warning "
                   "banner above every page")
    p.add_argument("--run", metavar="ID", help="that run's current attempt")
    p.add_argument("--at", metavar="TIME",
                   help="the latest attempt started at or before TIME (ISO 8601, with Z or "
                   "an offset)")
    p.add_argument("--out", metavar="FILE", type=local_path,
                   help="write the bytes here, not to stdout")
    part = p.add_mutually_exclusive_group()
    part.add_argument("--headers-only", action="store_true", help="only the response head")
    part.add_argument("--body-only", action="store_true",
                      help="only the body, as it came off the connection")
    part.add_argument("--content", action="store_true",
                      help="only the content: the body with its transfer coding (chunked) "
                      "and content coding (gzip, deflate) removed")
    p.add_argument("--json", action="store_true",
                   help="print which attempt and its artifact digests, not the bytes")
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser(
        "show", help="everything the store holds about one page; extract its parts",
        description="Print a page's attempts (every run, oldest first), the renders of "
        "them, its links out and in, and its rule verdicts. The attempt the page stands for "
        "is the one replay picks (--run, --at as there), with the connection each went "
        "over (addresses, DNS answer, TLS). --screenshot, --dom, --behaviors, --headers, "
        "--request, --body, --content and --certs write that attempt's recorded bytes (and its "
        "latest render's) to files, re-hashed as they are read. Exit status 2 when the "
        "page, the run or an asked-for part is not in the store (nothing is written).")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory or connection string")
    p.add_argument("url", metavar="URL", help="the URL (compared by its normalized form)")
    p.add_argument("--run", metavar="ID", help="that run's current attempt")
    p.add_argument("--at", metavar="TIME",
                   help="the latest attempt started at or before TIME (ISO 8601)")
    p.add_argument("--screenshot", metavar="FILE", type=local_path,
                   help="write the render's screenshot (PNG)")
    p.add_argument("--dom", metavar="FILE", type=local_path, help="write the rendered DOM (HTML)")
    p.add_argument("--behaviors", metavar="FILE", type=local_path,
                   help="write the log of what the render's behaviours did (JSON: each "
                   "scroll, click and open, when, and the requests that followed)")
    p.add_argument("--headers", metavar="FILE", type=local_path,
                   help="write the response head, as received")
    p.add_argument("--request", metavar="FILE", type=local_path,
                   help="write the request head, as sent")
    p.add_argument("--body", metavar="FILE", type=local_path,
                   help="write the body, as it came off the connection")
    p.add_argument("--content", metavar="FILE", type=local_path,
                   help="write the content: the body with its codings removed")
    p.add_argument("--certs", metavar="FILE", type=local_path,
                   help="write the server's TLS certificate chain (DER certificates, leaf "
                   "first)")
    p.add_argument("--json", action="store_true", help="print the facts as JSON")
    p.set_defaults(func=_cmd_show)
