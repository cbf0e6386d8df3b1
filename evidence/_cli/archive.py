"""The archive commands: ``export``, ``backup``, ``restore``, ``compare``.

Each is a few lines over the library function of the same name (``_archive.export.export``,
``_archive.archive.backup``, ``restore``, ``compare``); ``export --format warc`` and
``--format wacz`` write one file for other tools (``_archive.warc``, ``_archive.wacz``).
Long work shows progress on stderr when stderr is a terminal; ``--json`` prints the
library's report for scripts. ``_cli.main`` prints any ``EvidenceError`` (exit 2);
``backup`` exits 1 on findings, ``compare`` exits 1 when the two sides differ.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from .._errors import EvidenceError
from .common import (
    Progress,
    archive_location,
    archive_source,
    compare_source,
    local_directory,
    local_path,
    print_json,
    store_location,
)

if TYPE_CHECKING:  # the commands import what they run: a CLI start loads only its own
    from .._archive.archive import Comparison
    from .._archive.checkpoint import Checkpoint
    from .._archive.export import Manifest
    from .._archive.wacz import Timestamper

__all__ = ["add_commands"]


def _cmd_export(args: argparse.Namespace) -> int:
    if args.format == "wacz":  # one file for replay tools: WARC, CDXJ, pages, signed
        return _cmd_export_wacz(args)
    if args.key or args.new_key or args.cert or args.tsa or args.tsa_cert:
        raise EvidenceError("--key, --new-key, --cert and --tsa sign a WACZ export only",
                            hint="add --format wacz, or leave the key out")
    if args.include_secrets and args.format in ("warc", "wacz"):
        raise EvidenceError("--include-secrets keeps the openings of sealed requests in a "
                            "restorable archive; a WARC or WACZ holds requests as stored, "
                            "their secrets sealed", hint="add --format sql (or jsonl, csv), "
                            "or leave --include-secrets out")
    if args.format == "warc":  # request and response records, not a restorable archive
        if args.checkpoint:
            raise EvidenceError("a WARC file cannot carry a checkpoint",
                                hint="carry it in an archive (--format sql) or a WACZ")
        return _cmd_export_warc(args)
    from .._archive.carried import read_checkpoint_file
    from .._archive.remote import export_to

    carried = read_checkpoint_file(args.checkpoint) if args.checkpoint else None
    with Progress() as progress:
        manifest = export_to(args.store, args.out, run_id=args.run, format=args.format,
                             progress=progress, checkpoint=carried,
                             include_secrets=args.include_secrets)
    if args.json:
        print_json(manifest)
    else:
        print(_format_manifest(args.out, manifest))
    return 0


def _cmd_export_wacz(args: argparse.Namespace) -> int:
    from .._archive.wacz import (
        WaczSigner,
        export_wacz,
        load_certificate_chain,
        load_signing_key,
        new_signing_key,
    )
    from .._store.db import Store

    if args.run:
        raise EvidenceError("a WACZ export holds the whole store; --run is not supported",
                            hint="leave out --run (or export one run with --format warc)")
    if args.key and args.new_key:
        raise EvidenceError("give --key or --new-key, not both",
                            hint="--key FILE signs with an existing key; --new-key FILE "
                            "makes one")
    if isinstance(args.out, Path) and args.out.exists():
        raise EvidenceError(f"{args.out} already exists; an export never overwrites a file",
                            hint="remove it or choose another name", path=str(args.out))
    _check_parent(args.out, "the WACZ file")
    if args.cert and not args.key:
        raise EvidenceError("--cert needs --key: the private key the certificate is for",
                            hint="evidence export STORE --format wacz --key KEY.pem --cert "
                            "CHAIN.pem")
    if args.new_key:
        _check_parent(Path(args.new_key), "the new key")
    chain = load_certificate_chain(args.cert) if args.cert else ()
    stamper = _timestamper(args, chain)
    signer = (WaczSigner(load_signing_key(args.key, domain=bool(chain)), chain, stamper)
              if args.key else None)
    from .._archive.carried import read_checkpoint_file

    carried = read_checkpoint_file(args.checkpoint) if args.checkpoint else None
    made: list[Path] = []
    try:
        with Store.open(args.store, read_only=True) as store, _one_file(args.out) as out:
            if args.new_key:
                signer = WaczSigner(new_signing_key(args.new_key))
                made += [Path(args.new_key), Path(f"{args.new_key}.pub")]
            report = export_wacz(store, out, key=signer, checkpoint=carried)
    except BaseException:
        for file in made:  # a command that failed leaves nothing behind, a new key neither
            file.unlink(missing_ok=True)
        raise
    if not isinstance(args.out, Path):
        report = msgspec.structs.replace(report, path=args.out)
    if args.json:
        print_json(report)
    else:
        print(f"wacz      {report.path}  ({report.bytes} bytes, sha256 {report.sha256})\n"
              f"warc      {report.records} records ({report.revisits} revisits), "
              f"{report.indexed} indexed; "
              f"{report.renders} rendered pages\n"
              f"pages     {report.pages}\n"
              f"signed    " + (f"yes, by {report.domain} (certificate), ECDSA public key "
                               f"{report.public_key}" if report.domain else
                               f"yes, ECDSA public key {report.public_key}" if report.signed
                               else "no (give --key or --new-key to sign)"))
    return 0


def _timestamper(args: argparse.Namespace, chain: tuple) -> Timestamper | None:
    """``--tsa URL [--tsa-cert PEM]``: the domain form's RFC 3161 timestamp."""
    from .._archive.wacz import tsa_timestamper
    from .._audit.timestamp import load_certificates

    if args.tsa_cert and not args.tsa:
        raise EvidenceError("--tsa-cert names the certificate of the TSA given by --tsa",
                            hint="add --tsa URL, or leave out --tsa-cert")
    if not args.tsa:
        return None
    if not chain:
        raise EvidenceError("--tsa timestamps a domain signature: it needs --key and --cert",
                            hint="evidence export STORE --format wacz --key KEY.pem --cert "
                            "CHAIN.pem --tsa URL --tsa-cert TSA-CHAIN.pem")
    try:
        certs = (load_certificates(Path(args.tsa_cert).read_bytes(), args.tsa_cert)
                 if args.tsa_cert else [])
    except OSError as exc:
        raise EvidenceError(f"cannot read {args.tsa_cert}: {exc.strerror}",
                            hint="give the TSA's certificate and its chain (PEM)",
                            path=args.tsa_cert) from None
    return tsa_timestamper(args.tsa, certs)


def _cmd_export_warc(args: argparse.Namespace) -> int:
    from .._archive.warc import export_warc
    from .._store.db import Store

    _check_parent(args.out, "the WARC file")
    with Store.open(args.store, read_only=True) as store, _one_file(args.out) as out:
        result = export_warc(store, out, run_id=args.run)
    if not isinstance(args.out, Path):  # the object's name, not the local file's
        result = msgspec.structs.replace(result, path=args.out)
    if args.json:
        print_json(result)
    else:
        print(f"wrote {result.path}: {result.records} records, {result.responses} responses "
              f"({result.revisits} as revisit records; {result.skipped} attempts without a "
              f"response skipped), {result.bytes} bytes, sha256 {result.sha256}")
    return 0

def _check_parent(out: Path | str, what: str) -> None:
    """A single file goes into a directory that exists (checked before anything is made;
    an s3:// destination has no directory)."""
    if isinstance(out, Path) and not out.parent.is_dir():
        raise EvidenceError(f"cannot write {what} {out}: the directory {out.parent} does not "
                            "exist", hint=f"create it first (mkdir -p {out.parent}), or choose "
                            "another path", path=str(out))


@contextlib.contextmanager
def _one_file(out: Path | str) -> Iterator[Path]:
    """Where a single-file export is written: the local file, or a temporary one that
    becomes the s3:// object when the export succeeds."""
    if isinstance(out, Path):
        yield out
        return
    from .._archive.remote import object_destination

    with object_destination(out) as path:
        yield path


def _format_manifest(path: Path | str, m: Manifest) -> str:
    rows = sum(s.rows for s in m.tables.values())
    lines = [
        f"archive   {path}  ({m.format}, {'run ' + m.run_id if m.run_id else 'whole store'})",
        f"store     {m.store_id}  (schema v{m.schema_version}, normalizer "
        f"v{', v'.join(map(str, m.normalizer_versions)) or '-'})",
        f"rows      {rows} in {len(m.tables)} tables; {len(m.runs)} runs, "
        f"{len(m.sessions)} sessions, {m.quarantined} quarantined",
        f"artifacts {m.artifacts} ({m.artifact_bytes} bytes)",
        f"log       tree size {m.log.tree_size}, root {m.log.root[:16]}…, "
        f"{'verified' if m.log.verified else 'NOT VERIFIED'}",
    ]
    if "checkpoint" in m.files:
        lines.append("carries   checkpoint" + (" and its timestamp checkpoint.tsr"
                                               if "checkpoint.tsr" in m.files else ""))
    lines += [f"gap       {g.kind}: {g.subject}: {g.detail}" for g in m.gaps]
    return "\n".join(lines)


def _cmd_backup(args: argparse.Namespace) -> int:
    from .._archive.checkpoint import Checkpoint
    from .._archive.remote import backup_to

    with Progress() as progress:
        report = backup_to(args.store, args.out, progress=progress)
    if isinstance(report, Checkpoint):
        return _print_checkpoint_backup(args, report)
    if args.json:
        print_json(report)
    else:
        print(f"backup    {report.path}  (store {report.store_id})\n"
              f"rows      {sum(report.tables.values())} in {len(report.tables)} tables, "
              f"{report.pages} pages\n"
              f"artifacts {report.artifacts} ({report.artifact_bytes} bytes)\n"
              f"log       tree size {report.tree_size}, root {report.root[:16]}…")
        for finding in report.findings:
            print(f"FINDING   {finding}")
        print("verified: integrity_check, check_log, every referenced artifact present"
              if not report.findings else f"{len(report.findings)} findings")
    return 1 if report.findings else 0


def _print_checkpoint_backup(args: argparse.Namespace, c: Checkpoint) -> int:
    if args.json:
        print_json(c)
    else:
        print(f"backup    {args.out}  (store {c.store_id}, checkpoint {c.checkpoint_id})\n"
              f"database  {c.database.bytes} bytes in {len(c.database.parts)} object(s)\n"
              f"artifacts {c.artifacts} ({c.artifact_bytes} bytes), {c.uploaded} uploaded\n"
              f"log       tree size {c.tree_size}, root {c.root[:16]}…")
        for finding in c.findings:
            print(f"FINDING   {finding}")
        print("verified: integrity_check, check_log, every referenced artifact uploaded"
              if not c.findings else f"{len(c.findings)} findings")
    return 1 if c.findings else 0


def _cmd_restore(args: argparse.Namespace) -> int:
    from .._archive.checkpoint import RestoredCheckpoint
    from .._archive.remote import restore_from

    with Progress() as progress:
        report = restore_from(args.archive, args.store, artifacts=args.artifacts,
                              checkpoint_id=args.checkpoint, progress=progress)
    if isinstance(report, RestoredCheckpoint):
        if args.json:
            print_json(report)
        else:
            print(f"restored  {report.source} checkpoint {report.checkpoint_id} (taken "
                  f"{report.created_at}) -> {report.path}  (store {report.store_id})\n"
                  f"sessions  {', '.join(report.open_sessions) or 'none'} open: resume with "
                  f"evidence crawl --store {report.path}\n"
                  f"artifacts {report.artifacts} ({report.artifact_bytes} bytes)\n"
                  f"log       tree size {report.tree_size}, root {report.root[:16]}…")
            print("matched   " + "; ".join(report.checks))
            for finding in report.findings:
                print(f"note      {finding}")
        return 0
    if args.json:
        print_json(report)
    else:
        print(f"restored  {args.archive} -> {report.path}  (store {report.store_id}"
              f"{', run ' + report.run_id if report.run_id else ''})\n"
              f"rows      {sum(report.tables.values())} in {len(report.tables)} tables; "
              f"artifacts {report.artifacts}\n"
              f"log       tree size {report.tree_size}, root {report.root[:16]}…")
        print("matched   " + "; ".join(report.checks))
        for finding in report.findings:
            print(f"note      {finding}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from .._archive.archive import compare
    from .._archive.remote import fetched_archive
    from .._store.location import is_s3_url

    with Progress() as progress, contextlib.ExitStack() as stack:
        a, b = ((stack.enter_context(fetched_archive(side, scratch=args.scratch))[0]
                 if is_s3_url(side) else side) for side in (args.a, args.b))
        result = compare(a, b, full=args.full, rows_per_table=args.rows,
                         scratch=args.scratch, progress=progress)
    for name, side in (("a", args.a), ("b", args.b)):  # a download is named by its URL
        if is_s3_url(side):
            shown = msgspec.structs.replace(getattr(result, name), source=side)
            result = msgspec.structs.replace(result, **{name: shown})
    if args.json:
        print_json(result)
    else:
        print(_format_comparison(result))
    return 0 if result.equal else 1


def _format_comparison(c: Comparison) -> str:
    lines = [f"{name}  {s.kind} {s.source}  (store {s.store_id}, {s.rows} rows, tree size "
             f"{s.tree_size}, {s.payloads_held} of {s.payloads} payloads held)"
             for name, s in (("a", c.a), ("b", c.b))]
    lines += [f"DIFF {d}" for d in c.differences]
    verdict = "equal" if c.equal else f"{len(c.differences)} differences"
    lines.append(f"{verdict}: compared {c.tables} tables, {c.runs} run(s), "
                 f"{c.report_rows} report rows, {c.payloads} payloads "
                 f"({'bytes re-hashed' if c.full else 'present, by size; --full re-hashes'})")
    return "\n".join(lines)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add export, backup, restore and compare to the ``evidence`` command's subparsers."""
    p = sub.add_parser(
        "export", help="write a canonical archive (dump, artifacts, manifest)",
        description="Write an archive of STORE to the new directory ARCHIVE: dump.sql (the "
        "same logical content always gives the same bytes), artifacts/ with every payload "
        "its rows reference (in segment files and a sorted index), and manifest.json "
        "(counts, a BLAKE3 hash per section, the Merkle root, the gaps). Reads one "
        "snapshot taken with SQLite's backup API: the writer is never blocked. See "
        "docs/archives.md.")
    p.add_argument("store", metavar="STORE", type=store_location,
                   help="the store directory (or a backup of one)")
    p.add_argument("--out", required=True, type=archive_location, metavar="ARCHIVE",
                   help="the archive directory to create (must not exist, or be empty), or "
                   "an empty s3://BUCKET/PREFIX (built here, then uploaded, INDEX.json last; "
                   "warc and wacz: the object to create; see docs/archives.md)")
    p.add_argument("--run", metavar="ID", help="only this run's rows and what they reference")
    p.add_argument("--include-secrets", action="store_true",
                   help="also copy the openings of sealed requests (the credentials and "
                   "cookies a crawl sent, in clear; docs/security.md): left out by default, "
                   "each named in the manifest's gaps")
    p.add_argument("--format", choices=("sql", "jsonl", "csv", "warc", "wacz"), default="sql",
                   help="sql (default; restorable), or jsonl/csv files per table for review "
                   "tools, in the same order; warc: a WARC/1.1 file of request and response "
                   "records (--out names the file; .gz compresses each record); wacz: a "
                   "WACZ 1.1.1 file for replay tools (WARC, CDXJ index, page list, "
                   "rendered screenshots and DOMs; see docs/replay.md)")
    p.add_argument("--key", metavar="FILE", type=local_path,
                   help="wacz: sign datapackage-digest.json with this ECDSA P-384 PEM key "
                   "(with --cert: P-256 or P-384, the certificate's key)")
    p.add_argument("--cert", metavar="PEM", type=local_path,
                   help="wacz: sign in the domain form with --key and this certificate chain "
                   "(PEM, leaf first): the WACZ names the certificate's domain")
    p.add_argument("--tsa", metavar="URL",
                   help="wacz, domain form: an RFC 3161 timestamp of the signature from the "
                   "time-stamping authority at URL (timeSignature, as authsign checks it)")
    p.add_argument("--tsa-cert", metavar="PEM", type=local_path,
                   help="the --tsa's certificate, then its chain up to its root: the reply "
                   "is checked against it, and it is the WACZ's timestampCert")
    p.add_argument("--new-key", metavar="FILE", type=local_path,
                   help="wacz: make an ECDSA P-384 key (FILE, mode 0600, and FILE.pub) and "
                   "sign with it")
    p.add_argument("--checkpoint", metavar="CP", type=local_path,
                   help="carry this signed checkpoint (evidence checkpoint --out CP), with "
                   "its timestamp CP.tsr and its cosignatures, inside the export; the store "
                   "must hold the log it signs (see docs/verify.md)")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser(
        "backup", help="copy a store online, with its artifacts, then verify the copy",
        description="Copy STORE into the new directory DIR while it is being written: "
        "SQLite's online backup API for the database, then every artifact its rows "
        "reference, then integrity_check, check_log and an artifact check on the copy. "
        "Exit status 1 if the copy has findings.")
    p.add_argument("store", metavar="STORE", type=store_location, help="the store directory")
    p.add_argument("--out", required=True, type=archive_location, metavar="DIR",
                   help="the backup directory to create (must not exist, or be empty), or an "
                   "empty s3://BUCKET/PREFIX (a checkpoint there, as crawl --checkpoint "
                   "writes; restore it with evidence restore s3://...)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_backup)

    p = sub.add_parser(
        "restore", help="build a new store from an archive and prove it matches",
        description="Build a store at NEW (which must not exist, or be empty) from ARCHIVE, "
        "then check row counts, section hashes, the Merkle root, the schema and every "
        "artifact against the manifest. On any mismatch nothing is left at NEW.")
    p.add_argument("archive", metavar="ARCHIVE", type=archive_source,
                   help="a directory written by evidence export, or s3://BUCKET/PREFIX: an "
                   "export uploaded there, or (a backup's or crawl --checkpoint's) the newest "
                   "complete checkpoint")
    p.add_argument("--store", required=True, metavar="NEW", type=store_location,
                   help="where to create the store: a new or empty directory, or a "
                   "PostgreSQL connection string to an empty database")
    p.add_argument("--artifacts", metavar="DIR", type=local_path,
                   help="restoring into PostgreSQL: a new or empty directory for the "
                   "payloads, recorded in the store")
    p.add_argument("--checkpoint", metavar="ID",
                   help="restoring from s3://: this checkpoint, not the newest complete one")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_restore)

    p = sub.add_parser(
        "compare", help="compare two stores or archives; exit 0 only when equal",
        description="Compare A and B (each a store or an archive): per-table and per-run "
        "row counts and hashes, the fixed report queries (pages per status per run, rule "
        "verdicts per rule, artifacts per media type, edges per run), the rows that "
        "differ, and the payloads: each one either side references, held or not by each "
        "(present with its size; --full: its bytes re-hashed). Exit status 0 when equal, 1 "
        "when anything differs, 2 when a payload cannot be read.")
    p.add_argument("a", metavar="A", type=compare_source,
                   help="a store directory or an archive (a directory, or an export at "
                   "s3://BUCKET/PREFIX)")
    p.add_argument("b", metavar="B", type=compare_source,
                   help="a store directory or an archive")
    p.add_argument("--rows", type=int, default=20, metavar="N",
                   help="list at most N differing rows per table (default 20)")
    p.add_argument("--full", action="store_true",
                   help="re-hash every payload on both sides (default: each is present, "
                   "with its size)")
    p.add_argument("--scratch", type=local_directory, metavar="DIR",
                   help="where to put the two temporary copies (default: the system's "
                   "temporary directory)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=_cmd_compare)
