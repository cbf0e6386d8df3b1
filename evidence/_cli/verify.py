"""CLI commands for verification, proofs and replay: each a few lines over the library.

``add_commands(subparsers)`` adds ``verify``, ``keygen``, ``checkpoint``, ``prove``,
``check-proof`` and ``replay`` to the ``evidence`` parser (WARC output is
``export --format warc``, in _cli_archive, which calls ``_cmd_export_warc``). Exit status:
0 when all is well, 1 when a check fails (a finding, a proof that does not verify), 2 for
an error (printed by ``_cli.main`` as ``Error:`` / ``Try:``).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from .._errors import EvidenceError, ProofError
from .._store.db import Store

if TYPE_CHECKING:  # the commands import what they run: a CLI start loads only its own
    from .._audit.verify import VerifyReport

__all__ = ["add_commands", "parse_duration"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``24h``, ``7d`` -> seconds."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 24h, 30m, 7d)")
    return float(match[1]) * _UNITS[match[2]]


def _print_json(data: object) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(data).decode()) + "\n")


def _write_text(text: str, out: str | None) -> None:
    if out is None:
        sys.stdout.write(text)
    else:
        Path(out).write_text(text)
        print(f"wrote {out}", file=sys.stderr)


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ProofError(f"cannot read {path}: {exc.strerror}", path=path) from None


# --- verify --------------------------------------------------------------------------

def _cmd_verify(args: argparse.Namespace) -> int:
    from .._audit.verify import reclaim_orphans, unreadable, verify
    from .._errors import CorruptStoreError

    reclaimed = None
    try:
        # Read-only unless orphans are to be reclaimed: a store on read-only media or
        # someone else's can be verified, and so can a damaged one.
        store = Store.open(args.store, read_only=not args.reclaim_orphans)
    except CorruptStoreError as exc:
        if not Path(args.store, "evidence.db").is_file():
            raise
        report = unreadable(args.store, exc.__cause__ or exc, full=args.full)
    else:
        with store:
            report = verify(store, full=args.full)
            if args.reclaim_orphans and report.ok:
                reclaimed = reclaim_orphans(store, args.grace)
    from .._archive.export import stale_builds

    leftovers = [str(p) for p in stale_builds(args.store)]
    if args.json:
        data = msgspec.to_builtins(report) | {"ok": report.ok}
        if args.reclaim_orphans:
            data["reclaimed"] = None if reclaimed is None else msgspec.to_builtins(reclaimed)
        data["leftovers"] = leftovers
        _print_json(data)
    else:
        print(format_report(report))
        for path in leftovers:  # a restore or backup to this path was killed midway
            print(f"note     {path}: a partial restore or backup left by a killed process; "
                  "nothing uses it (remove it, or restore again: that removes it)")
        if reclaimed is not None:
            print(f"reclaimed {len(reclaimed.removed)} orphan(s), {reclaimed.bytes_freed} "
                  f"bytes; kept {reclaimed.kept_young} inside the grace period, "
                  f"{reclaimed.kept_referenced} referenced meanwhile, {reclaimed.skipped_busy} "
                  "skipped (store busy)")
    if args.reclaim_orphans and not report.ok:
        print("not reclaiming orphans: the store has errors, and a file that looks orphaned "
              "may be evidence of them", file=sys.stderr)
    failed = not report.ok or (args.strict and report.findings)
    return 1 if failed else 0


def format_report(r: VerifyReport) -> str:
    """The report a person reads: what was checked, then each finding and where it is."""
    from .._audit.verify import NOTICE_KINDS

    lines = [f"store    {r.path} ({r.store_id})",
             f"mode     {'full: integrity_check, artifacts re-hashed' if r.full else 'quick'}",
             f"log      {r.tree_size} entries, root {r.root}",
             "checked  " + ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in r.checks.items())]
    for f in r.findings:
        lines.append(f"{f.severity:<6} {f.kind}  [{f.location}]")
        lines.append(f"       {f.message}")
    for kind, n in sorted(r.omitted.items()):
        lines.append(f"...    {n} more {kind} finding(s) not listed")
    errors = len(r.errors) + sum(n for k, n in r.omitted.items() if k not in NOTICE_KINDS)
    notices = len(r.notices) + sum(n for k, n in r.omitted.items() if k in NOTICE_KINDS)
    lines.append(f"FAILED: {errors} error(s), {notices} notice(s)" if errors else
                 f"OK: no errors ({notices} notice(s))")
    return "\n".join(lines)


# --- keys, checkpoints, proofs --------------------------------------------------------

def _cmd_keygen(args: argparse.Namespace) -> int:
    from .._audit.proofs import SigningKey

    key = SigningKey.generate(args.name)
    private, public = key.write(args.key)
    print(f"private key {private} (keep it secret), public key {public}:")
    print(key.public_key.to_text())
    return 0


def _cmd_checkpoint(args: argparse.Namespace) -> int:
    from .._audit.proofs import SigningKey, checkpoint

    with Store.open(args.store, read_only=True) as store:
        if args.new_key:
            key = SigningKey.generate(f"evidence/{store.store_id}")
            _, public = key.write(args.new_key)
            print(f"new key {args.new_key}, public key {public}", file=sys.stderr)
        else:
            key = SigningKey.from_text(_read(args.key))
        cp = checkpoint(store, key)
    if args.json:
        _print_json({"origin": cp.origin, "store_id": cp.store_id, "tree_size": cp.tree_size,
                     "root": cp.root.hex(), "time": cp.time, "key": key.public_key.to_text(),
                     "note": cp.note()})
        if args.out:
            Path(args.out).write_text(cp.note())
    else:
        _write_text(cp.note(), args.out)
    return 0


def _cmd_prove(args: argparse.Namespace) -> int:
    from .._audit.proofs import encode_proof, parse_checkpoint, prove_consistency, prove_inclusion

    size = args.to_size
    cp = None
    if args.checkpoint:
        cp = parse_checkpoint(_read(args.checkpoint))
        size = cp.tree_size
    with Store.open(args.store, read_only=True) as store:
        if args.from_size is not None:
            proof = prove_consistency(store, args.from_size, size)
            root = proof.new_root
        else:
            proof = prove_inclusion(store, args.attempt, log_index=args.index, tree_size=size)
            root = proof.root
    if cp is not None and (cp.origin, cp.root) != (proof.origin, root):
        raise ProofError(f"the checkpoint ({cp.origin}, size {cp.tree_size}) does not match "
                         "this store's log at that size",
                         hint="use a checkpoint of this store; if it is, run 'evidence verify'")
    data = encode_proof(proof)
    if args.out:
        Path(args.out).write_bytes(data)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.buffer.write(data)
    return 0


def _cmd_check_proof(args: argparse.Namespace) -> int:
    from .._audit.proofs import check_proof

    result = check_proof(_read(args.proof), _read(args.checkpoint), _read(args.public_key),
                         old_checkpoint=_read(args.old_checkpoint) if args.old_checkpoint
                         else None)
    if args.json:
        _print_json(result)
    elif result.ok:
        print(f"OK: {result.statement}")
        print(f"    signed by {result.key}, root {result.root}")
    else:
        print("FAILED: the proof does not hold")
        for problem in result.problems:
            print(f"  - {problem}")
    return 0 if result.ok else 1


# --- replay and WARC -----------------------------------------------------------------

def _cmd_replay(args: argparse.Namespace) -> int:
    if args.serve:
        return _cmd_replay_serve(args)
    if args.url is None:
        raise EvidenceError("replay needs a URL (or --serve to browse the capture)",
                            hint="evidence replay STORE URL, or evidence replay STORE --serve")
    from .._audit.replay import replay

    with Store.open(args.store, read_only=True) as store:
        found = replay(store, args.url, run_id=args.run, at=args.at, content=args.content)
    if args.json:
        _print_json(found.metadata())
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

    with ReplayServer(args.store, port=args.port) as server:
        if args.json:  # one line, printed once the server listens: a script reads it
            sys.stdout.write(msgspec.json.encode({
                "url": server.url, "port": server.port, "pages": [
                    {"url": p.url, "ts": p.ts, "title": p.title, "replay_url": p.replay_url}
                    for p in server.pages]}).decode() + "\n")
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


def _cmd_export_warc(args: argparse.Namespace) -> int:
    from .._archive.warc import export_warc

    with Store.open(args.store, read_only=True) as store:
        result = export_warc(store, args.out, run_id=args.run)
    if args.json:
        _print_json(result)
    else:
        print(f"wrote {result.path}: {result.records} records, {result.responses} responses "
              f"({result.skipped} attempts without a response skipped), {result.bytes} bytes, "
              f"sha256 {result.sha256}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this module's subcommands to the ``evidence`` parser."""
    p = sub.add_parser(
        "verify", help="check a store and locate anything changed",
        description="Check the schema, SQLite integrity, foreign keys, the Merkle log and hash "
        "chain, every evidence row against its ledger entry, the url_current projection and "
        "the artifact files; list orphaned files. Exit 1 on any error.")
    p.add_argument("store", metavar="STORE", help="the store directory")
    p.add_argument("--full", action="store_true",
                   help="integrity_check instead of quick_check, and re-hash every artifact")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 on notices (orphans, writable artifacts) too")
    p.add_argument("--reclaim-orphans", action="store_true",
                   help="then delete orphaned artifact files older than --grace "
                   "(only if no errors were found)")
    p.add_argument("--grace", type=parse_duration, default=parse_duration("24h"),
                   metavar="DURATION", help="keep orphans younger than this (default 24h; "
                   "e.g. 90s, 30m, 7d)")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser(
        "keygen", help="create an Ed25519 key for signing checkpoints",
        description="Write a new signing key to KEY (mode 0600, never overwritten) and its "
        "public key to KEY.pub, in the signed-note key formats.")
    p.add_argument("key", metavar="KEY", help="file for the private key")
    p.add_argument("--name", default="evidence",
                   help="the key name in signatures: no spaces or '+', e.g. example.com/crawl")
    p.set_defaults(func=_cmd_keygen)

    p = sub.add_parser(
        "checkpoint", help="sign the log's current size and root",
        description="Recompute the log from the ledger and sign (store id, tree size, root, "
        "time) as a C2SP checkpoint with Ed25519.")
    p.add_argument("store", metavar="STORE", help="the store directory")
    key = p.add_mutually_exclusive_group(required=True)
    key.add_argument("--key", metavar="KEY", help="the private key file (see keygen)")
    key.add_argument("--new-key", metavar="FILE",
                     help="create a key named after the store in FILE (and FILE.pub), sign "
                     "with it")
    p.add_argument("--out", metavar="FILE", help="write the checkpoint here, not to stdout")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_cmd_checkpoint)

    p = sub.add_parser(
        "prove", help="an inclusion or consistency proof",
        description="Print an RFC 9162 inclusion proof for an attempt's ledger entry, or a "
        "consistency proof between two tree sizes, as JSON.")
    p.add_argument("store", metavar="STORE", help="the store directory")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--attempt", metavar="ID", help="prove this fetch attempt is logged")
    what.add_argument("--index", type=int, metavar="N", help="prove ledger entry N is logged")
    what.add_argument("--from-size", type=int, metavar="N",
                      help="prove the log at size N is a prefix of the log now")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--to-size", type=int, metavar="M",
                      help="prove against the tree of size M (default: the current size)")
    size.add_argument("--checkpoint", metavar="FILE",
                      help="prove against this checkpoint's size (and check its root)")
    p.add_argument("--out", metavar="FILE", help="write the proof here, not to stdout")
    p.set_defaults(func=_cmd_prove)

    p = sub.add_parser(
        "check-proof", help="verify a proof offline, against a signed checkpoint",
        description="Verify a proof against a checkpoint and the signer's public key, without "
        "the store. Exit 0 if it holds, 1 if not.")
    p.add_argument("proof", metavar="PROOF", help="the proof file ('-' for stdin)")
    p.add_argument("--checkpoint", required=True, metavar="FILE", help="the signed checkpoint")
    p.add_argument("--public-key", required=True, metavar="FILE",
                   help="the signer's public key (KEY.pub)")
    p.add_argument("--old-checkpoint", metavar="FILE",
                   help="consistency: the older checkpoint the proof starts from")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_cmd_check_proof)

    p = sub.add_parser(
        "replay", help="the exact response bytes recorded for a URL, or browse a capture",
        description="Print the response head and body of the attempt current for URL (in a "
        "run, or at a time) byte for byte, as they came off the connection (chunk framing "
        "and content coding included); --content prints the decoded content instead. "
        "With --serve, serve the whole capture (a store or a WACZ file) for a web browser "
        "through pywb on 127.0.0.1, and list each page's address (docs/replay.md).")
    p.add_argument("store", metavar="STORE", help="the store directory (with --serve: or a "
                   "WACZ file)")
    p.add_argument("url", metavar="URL", nargs="?",
                   help="the URL (compared by its normalized form)")
    p.add_argument("--serve", action="store_true",
                   help="serve the capture to a browser with pywb until Ctrl-C")
    p.add_argument("--port", type=int, default=8080,
                   help="--serve: the port on 127.0.0.1 (default 8080; 0: a free one)")
    p.add_argument("--run", metavar="ID", help="that run's current attempt")
    p.add_argument("--at", metavar="TIME",
                   help="the latest attempt started at or before TIME (ISO 8601, with Z or "
                   "an offset)")
    p.add_argument("--out", metavar="FILE", help="write the bytes here, not to stdout")
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

