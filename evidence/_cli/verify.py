"""The ``verify`` command: check a store and locate anything changed, or check a WACZ.

A few lines over ``_audit.verify`` (``verify``, ``reclaim_orphans``, ``unreadable`` for a
database SQLite cannot open), and over ``_archive.waczcheck`` when the argument is a file.
Exit status 0 when the store (or WACZ) verifies, 1 on an error finding (or, with
``--strict``, a notice), 2 for an error (printed by ``_cli.main`` as ``Error:`` / ``Try:``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from .common import format_bytes, local_path, parse_duration, print_json, store_location

if TYPE_CHECKING:  # the commands import what they run: a CLI start loads only its own
    from .._archive.waczcheck import WaczCheck
    from .._audit.proofs import SignedCheckpoint
    from .._audit.verify import VerifyReport

__all__ = ["add_commands", "format_report", "format_wacz_check"]


def _cmd_verify(args: argparse.Namespace) -> int:
    from .._audit.verify import reclaim_orphans, unreadable, verify
    from .._errors import CorruptStoreError
    from .._store.db import Store

    if Path(args.store).is_file():
        return _cmd_verify_wacz(args)

    reclaimed = None
    signed = _signed_checkpoint(args)
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
            report = verify(store, full=args.full, checkpoint=signed)
            if args.reclaim_orphans and report.ok:
                reclaimed = reclaim_orphans(store, args.grace)
    from .._archive.snapshot import stale_builds

    leftovers = [str(p) for p in stale_builds(args.store)]
    if args.json:
        data = msgspec.to_builtins(report) | {"ok": report.ok}
        if args.reclaim_orphans:
            data["reclaimed"] = None if reclaimed is None else msgspec.to_builtins(reclaimed)
        data["leftovers"] = leftovers
        print_json(data)
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


def _cmd_verify_wacz(args: argparse.Namespace) -> int:
    from .._archive.waczcheck import check_wacz, load_public_key
    from .._errors import EvidenceError

    for flag, given in (("--full", args.full), ("--reclaim-orphans", args.reclaim_orphans)):
        if given:
            raise EvidenceError(f"{flag} is for a store; a WACZ file is always checked whole",
                                hint=f"evidence verify {args.store} (without {flag})")
    pinned = load_public_key(args.public_key) if args.public_key else None
    check = check_wacz(args.store, public_key=pinned)
    if args.json:
        print_json(check)
    else:
        print(format_wacz_check(check))
    return 1 if not check.ok or (args.strict and check.notes) else 0


def format_wacz_check(c: WaczCheck) -> str:
    """A WACZ check as a person reads it: what was checked, who signed, what is wrong."""
    signer = ("not signed" if c.form is None else
              f"{c.form} signature by key SHA-256 {c.key_sha256}"
              + (f" ({c.domain})" if c.domain else "")
              + (": the key you gave" if c.pinned else
                 "" if c.signature else ": DOES NOT VERIFY"))
    lines = [f"wacz     {c.path}",
             f"signed   {signer}",
             f"checked  {c.files} file(s) against datapackage.json, {c.records} WARC "
             f"record(s) against their digests, {c.indexed} index line(s) against their "
             "records"]
    lines += [f"error    {p}" for p in c.problems]
    lines += [f"note     {n}" for n in c.notes]
    lines.append(f"FAILED: {len(c.problems)} problem(s)" if not c.ok else
                 "OK: intact, and signed by the key you gave" if c.pinned else
                 "OK: intact (see the notes for what that does not prove)")
    return "\n".join(lines)


def _signed_checkpoint(args: argparse.Namespace) -> SignedCheckpoint | None:
    """``--checkpoint`` opened with ``--public-key``: one not signed by that key is an
    error (exit 2): nothing could be compared with it."""
    from .._audit.proofs import open_checkpoint
    from .._errors import ProofError

    if (args.checkpoint is None) != (args.public_key is None):
        raise ProofError("--checkpoint and --public-key go together",
                         hint="give the checkpoint and the public key of the key that signed "
                         "it (KEY.pub)")
    if args.checkpoint is None:
        return None
    texts = []
    for path in (args.checkpoint, args.public_key):
        try:
            texts.append(Path(path).read_bytes())
        except OSError as exc:
            raise ProofError(f"cannot read {path}: {exc.strerror}", hint="check the path",
                             path=path) from None
    return open_checkpoint(texts[0], texts[1])


def format_report(r: VerifyReport) -> str:
    """The report a person reads: what was checked, then each finding and where it is."""
    from .._audit.verify import NOTICE_KINDS

    lines = [f"store    {r.path} ({r.store_id})",
             f"mode     {'full: integrity_check, artifacts re-hashed' if r.full else 'quick'}",
             f"log      {r.tree_size} entries, root {r.root}",
             "checked  " + ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in r.checks.items())]
    if r.checkpoint is not None:
        lines.append(f"against  {r.checkpoint}")
    for f in r.findings:
        if f.kind == "orphan":  # summed up below: one line, however many
            continue
        lines.append(f"{f.severity:<6} {f.kind}  [{f.location}]")
        lines.append(f"       {f.message}")
    for kind, n in sorted(r.omitted.items()):
        if kind != "orphan":
            lines.append(f"...    {n} more {kind} finding(s) not listed")
    orphans = r.checks.get("orphans", 0)
    if orphans:
        lines.append(f"notice orphan  {orphans} payload(s), {format_bytes(r.orphan_bytes)}, "
                     "stored but referenced by no row (a crash between storing and "
                     "committing leaves them; --json lists each)")
        lines.append(f"       reclaim those older than a day: evidence verify {r.path} "
                     "--reclaim-orphans")
    errors = len(r.errors) + sum(n for k, n in r.omitted.items() if k not in NOTICE_KINDS)
    notices = len(r.notices) + sum(n for k, n in r.omitted.items() if k in NOTICE_KINDS)
    lines.append(f"FAILED: {errors} error(s), {notices} notice(s)" if errors else
                 f"OK: no errors ({notices} notice(s))")
    return "\n".join(lines)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``verify`` to the ``evidence`` parser."""
    p = sub.add_parser(
        "verify", help="check a store (or a WACZ file) and locate anything changed",
        description="Check the schema, SQLite integrity, foreign keys, the Merkle log and hash "
        "chain, that commit times never go back, every evidence row against its ledger "
        "entry, the url_current projection and the artifact files; list orphaned files. "
        "With --checkpoint, also that the store still matches a checkpoint signed earlier. "
        "Given a WACZ file instead: check the zip, every datapackage.json hash, the "
        "signature (pinned to --public-key), each WARC record's digests and every index "
        "line's offset. Exit 1 on any error.")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory, or a WACZ file")
    p.add_argument("--public-key", metavar="KEY", type=local_path,
                   help="a store: the public key (KEY.pub) that signed --checkpoint; a WACZ: "
                   "the signer's public key (KEY.pub from export --new-key, or a certificate "
                   "of the domain signature's chain), without which a signature by anyone's "
                   "key passes, with a note saying so")
    p.add_argument("--full", action="store_true",
                   help="integrity_check instead of quick_check, and re-hash every artifact")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 on notices (orphans, writable artifacts) too")
    p.add_argument("--checkpoint", metavar="FILE",
                   help="also check the store still holds what this checkpoint signed "
                   "(every accepted message, commit time, quarantine record, the store's "
                   "identity); needs --public-key")
    p.add_argument("--reclaim-orphans", action="store_true",
                   help="then delete orphaned artifact files older than --grace "
                   "(only if no errors were found)")
    p.add_argument("--grace", type=parse_duration, default=parse_duration("24h"),
                   metavar="DURATION", help="keep orphans younger than this (default 24h; "
                   "e.g. 90s, 30m, 7d)")
    p.set_defaults(func=_cmd_verify)
