"""The ``verify`` command: check a store and locate anything changed, or check a WACZ.

A few lines over ``_audit.verify`` (``verify``, ``reclaim_orphans``, ``unreadable`` for a
database SQLite cannot open), over ``_archive.waczcheck`` when the argument is a file, and
over ``_archive.proofcheck`` for an archive directory and a WACZ's carried checkpoint.
Exit status 0 when the store (or WACZ) verifies, 1 on an error finding (or, with
``--strict``, a notice), 2 for an error (printed by ``_cli.main`` as ``Error:`` / ``Try:``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import msgspec

from .._errors import ProofError
from .._model.units import format_bytes
from .common import local_path, parse_duration, print_json, store_location

if TYPE_CHECKING:  # the commands import what they run: a CLI start loads only its own
    from .._archive.proofcheck import CarriedCheck, WaczProof
    from .._archive.waczcheck import WaczCheck
    from .._audit.checkpoints import SignedCheckpoint
    from .._audit.verify import VerifyReport

__all__ = ["add_commands", "format_report", "format_wacz_check"]


def _cmd_verify(args: argparse.Namespace) -> int:
    from .._audit.verify import reclaim_orphans, unreadable, verify
    from .._errors import CorruptStoreError, EvidenceError
    from .._store.db import Store

    if args.quick and args.full:
        raise EvidenceError("--quick and --full exclude each other: --quick checks less "
                            "than the default, --full more", hint=f"evidence verify "
                            f"{args.store} --quick, or evidence verify {args.store} --full")
    if Path(args.store).is_file():
        return _cmd_verify_wacz(args)
    if _is_archive(Path(args.store)):
        return _cmd_verify_archive(args)
    if args.quick and args.reclaim_orphans:
        raise EvidenceError("--reclaim-orphans needs the orphan listing, which --quick does "
                            "not make", hint=f"evidence verify {args.store} --reclaim-orphans "
                            "(the default verify lists the orphans, then reclaims them)")
    if args.tsa_root or args.witness_key:
        raise ProofError("--tsa-root and --witness-key check the checkpoint an archive "
                         "carries", hint="check a store's checkpoint with 'evidence "
                         "check-proof', or give an archive")

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
            report = verify(store, full=args.full, quick=args.quick, checkpoint=signed)
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


def _is_archive(path: Path) -> bool:
    return (path / "manifest.json").is_file() and not (path / "evidence.db").exists()


def _cmd_verify_archive(args: argparse.Namespace) -> int:
    """An archive: restored privately and verified against the checkpoint it carries."""
    from .._archive.proofcheck import verify_archive
    from .._audit.keys import VerifierKey

    for flag, given in (("--checkpoint", args.checkpoint),
                        ("--reclaim-orphans", args.reclaim_orphans)):
        if given:
            raise ProofError(f"{flag} is for a store; an archive is checked against the "
                             "checkpoint it carries", hint=f"evidence verify {args.store} "
                             f"--public-key KEY.pub (without {flag})")
    if args.quick:  # restoring it is most of the cost: nothing quick is left to leave out
        raise ProofError("--quick is for a store; an archive is restored into a private "
                         "store and checked whole (every row against its ledger entry)",
                         hint=f"evidence verify {args.store} (without --quick), or "
                         f"evidence-verify archive {args.store} --public-key KEY.pub")
    if args.checkpoint_key:
        raise ProofError("--checkpoint-key is for a WACZ; an archive's checkpoint key is "
                         "--public-key", hint=f"evidence verify {args.store} --public-key "
                         "KEY.pub")
    key = VerifierKey.from_text(_read(args.public_key)) if args.public_key else None
    roots, witnesses = _policy(args)
    check = verify_archive(args.store, full=args.full, public_key=key, tsa_roots=roots,
                           witness_keys=witnesses, witnesses=args.witnesses)
    report = cast("VerifyReport", check.report)
    if args.json:
        print_json(msgspec.to_builtins(check) | {"report": msgspec.to_builtins(report)
                                                 | {"ok": report.ok}, "ok": check.ok})
    else:
        print(f"archive  {args.store}  (restored into a private directory and verified)")
        print(format_report(report).replace(
            "FAILED:", "store FAILED:").replace("OK:", "store OK:"))
        print(_format_carried(check))
    failed = not check.ok or (args.strict and (report.findings or check.notes))
    return 1 if failed else 0


def _format_carried(c: CarriedCheck) -> str:
    from .._archive.proofcheck import WaczProof

    if not c.carried:
        lines = ["carries  no checkpoint: nothing signed says this is the operator's log"]
    else:
        lines = ["carries  a checkpoint" + (f", signed by {c.signed_by}" if c.signed_by
                                            else "")]
        if isinstance(c, WaczProof) and c.tree_size is not None:
            lines.append(f"covers   {c.covered} record(s) naming one of its {c.tree_size} "
                         f"entries of {c.origin}; {c.beyond} after it")
        if c.timestamped_at:
            lines.append(f"time     timestamped at {c.timestamped_at} by {c.tsa}")
        lines += [f"witness  cosigned by {name} at {when} (POSIX time)"
                  for name, when in c.witnesses.items()]
    lines += [f"error    {p}" for p in c.problems]
    lines += [f"note     {n}" for n in c.notes]
    lines.append("OK" if c.ok else "FAILED")
    return "\n".join(lines)


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ProofError(f"cannot read {path}: {exc.strerror}", hint="check the path",
                         path=str(path)) from None


def _cmd_verify_wacz(args: argparse.Namespace) -> int:
    from .._archive.waczcheck import check_wacz, load_public_key
    from .._errors import EvidenceError

    for flag, given in (("--full", args.full), ("--quick", args.quick),
                        ("--reclaim-orphans", args.reclaim_orphans)):
        if given:
            raise EvidenceError(f"{flag} is for a store; a WACZ file is always checked whole",
                                hint=f"evidence verify {args.store} (without {flag})")
    pinned = load_public_key(args.public_key) if args.public_key else None
    check = check_wacz(args.store, public_key=pinned)
    proof = _wacz_checkpoint(args)
    stamped = _wacz_timestamp(args, check)
    if args.json:
        print_json(msgspec.to_builtins(check) | ({} if stamped is None else {
            "signature_timestamp": stamped}) | ({} if proof is None else {
                "checkpoint": msgspec.to_builtins(proof) | {"ok": proof.ok}}))
    else:
        print(format_wacz_check(check))
        if stamped is not None:
            print(f"time     the signature timestamped at {stamped['time']} by "
                  f"{stamped['tsa']}" if stamped["ok"] else
                  "error    " + "\n         ".join(stamped["problems"]))
        if proof is not None:
            print(_format_carried(proof))
    failed = (not check.ok or (proof is not None and not proof.ok)
              or (stamped is not None and not stamped["ok"]))
    notes = check.notes + (proof.notes if proof is not None else [])
    return 1 if failed or (args.strict and notes) else 0


def _wacz_checkpoint(args: argparse.Namespace) -> WaczProof | None:
    """The checkpoint a WACZ carries, checked with ``--checkpoint-key``, ``--tsa-root`` and
    ``--witness-key``; None when it carries none and none of them was named."""
    from .._archive.proofcheck import check_wacz_checkpoint
    from .._audit.keys import VerifierKey

    key = (VerifierKey.from_text(_read(args.checkpoint_key)) if args.checkpoint_key
           else None)
    roots, witnesses = _policy(args)
    proof = check_wacz_checkpoint(args.store, public_key=key, tsa_roots=roots,
                                  witness_keys=witnesses, witnesses=args.witnesses)
    # A TSA root alone asks for no checkpoint: it may be for the signature's timestamp.
    return proof if proof.carried or key is not None or witnesses else None


def _wacz_timestamp(args: argparse.Namespace, check: WaczCheck) -> dict | None:
    """With ``--tsa-root``: the domain form's timestamp checked (None: no root named, or
    the signature carries none)."""
    from .._archive.proofcheck import check_wacz_timestamp

    roots, _ = _policy(args)
    if not roots or check.timestamp is None:
        return None
    time, tsa, problems = check_wacz_timestamp(args.store, roots)
    return {"ok": not problems, "time": time, "tsa": tsa, "problems": problems}


def _policy(args: argparse.Namespace) -> tuple[list, list]:
    """``--tsa-root`` certificates and ``--witness-key`` keys, ``--witnesses`` in range."""
    from .._audit.timestamp import load_certificates
    from .._audit.witness import CosignerKey

    roots = [c for path in args.tsa_root or () for c in load_certificates(_read(path), path)]
    witnesses = [CosignerKey.from_text(_read(path)) for path in args.witness_key or ()]
    if args.witnesses is not None and not 1 <= args.witnesses <= len(witnesses):
        raise ProofError(f"--witnesses {args.witnesses}: between 1 and the {len(witnesses)} "
                         "--witness-key given", hint="name at least that many witness keys")
    return roots, witnesses


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
    from .._audit.checkpoints import open_checkpoint

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


_MODES = {"quick": "quick: the log, each table's rows counted against it, payloads by pack",
          "default": "default: every row against its ledger entry",
          "full": "full: integrity_check, artifacts re-hashed"}


def format_report(r: VerifyReport) -> str:
    """The report a person reads: what was checked, then each finding and where it is."""
    from .._audit.verify import NOTICE_KINDS

    lines = [f"store    {r.path} ({r.store_id})",
             f"mode     {_MODES.get(r.mode, r.mode)}",
             f"log      {r.tree_size} entries, root {r.root}",
             "checked  " + ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in r.checks.items())]
    if r.mode == "quick":
        lines.append(f"quick:   rows were not compared with their ledger entries; `evidence "
                     f"verify {r.path}` does")
        lines += [f"not      {what}" for what in r.not_checked]
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
        "entry, the url_current projection and the artifact files; list orphaned files "
        "(--quick: fewer checks, see below). "
        "With --checkpoint, also that the store still matches a checkpoint signed earlier. "
        "Given an archive directory (evidence export): restore it privately and run every "
        "check on it, against the checkpoint it carries (its signature by --public-key, its "
        "timestamp against --tsa-root, its cosignatures by --witness-key). "
        "Given a WACZ file instead: check the zip, every datapackage.json hash, the "
        "signature (pinned to --public-key), each WARC record's digests and every index "
        "line's offset, and the checkpoint it carries (--checkpoint-key). Exit 1 on any "
        "error.")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory, an archive directory (evidence export), or a WACZ "
                   "file")
    p.add_argument("--public-key", metavar="KEY", type=local_path,
                   help="a store: the public key (KEY.pub) that signed --checkpoint; a WACZ: "
                   "the signer's public key (KEY.pub from export --new-key, or a certificate "
                   "of the domain signature's chain), without which a signature by anyone's "
                   "key passes, with a note saying so")
    p.add_argument("--full", action="store_true",
                   help="integrity_check instead of quick_check, and re-hash every artifact")
    p.add_argument("--quick", action="store_true",
                   help="a store: only the schema, quick_check, the log (every leaf, root, "
                   "chain link, commit time; --checkpoint), each evidence table's rows "
                   "counted against the ledger entries that write them, the quarantine "
                   "records, and every payload present with its size, read from the packs' "
                   "indexes: for after a crash or a deploy, and nightly on a large store. It "
                   "does NOT compare rows with their ledger entries field by field, decode "
                   "entries strictly, replay the frontier, rebuild url_current, check foreign "
                   "keys and referenced interned rows, or list orphans (the default does); "
                   "not with --full, --reclaim-orphans, an archive or a WACZ")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 on notices (orphans, writable artifacts) too")
    p.add_argument("--checkpoint", metavar="FILE",
                   help="also check the store still holds what this checkpoint signed "
                   "(every accepted message, commit time, quarantine record, the store's "
                   "identity); needs --public-key")
    p.add_argument("--checkpoint-key", metavar="KEY", type=local_path,
                   help="a WACZ: the operator's checkpoint key (KEY.pub of evidence keygen), "
                   "to check the signed checkpoint the WACZ carries")
    p.add_argument("--tsa-root", metavar="PEM", action="append", type=local_path,
                   help="an archive or a WACZ: check the RFC 3161 timestamp of the checkpoint "
                   "it carries (it fails without a valid one) and of a WACZ's domain "
                   "signature against this TSA root certificate (repeatable)")
    p.add_argument("--witness-key", metavar="FILE", action="append", type=local_path,
                   help="an archive or a WACZ: require a valid cosignature on the checkpoint "
                   "it carries by this witness (KEY.pub; repeatable)")
    p.add_argument("--witnesses", type=int, metavar="N",
                   help="how many of the --witness-key witnesses must have cosigned "
                   "(default: all of them)")
    p.add_argument("--reclaim-orphans", action="store_true",
                   help="then delete orphaned artifact files older than --grace "
                   "(only if no errors were found)")
    p.add_argument("--grace", type=parse_duration, default=parse_duration("24h"),
                   metavar="DURATION", help="keep orphans younger than this (default 24h; "
                   "e.g. 90s, 30m, 7d)")
    p.set_defaults(func=_cmd_verify)
