"""Proof that travels with the evidence: a signed checkpoint carried inside an archive.

An archive says what a store held; a checkpoint says what its operator signed. Handed over
apart, an examiner has to pair them up and trust that the pairing is right. ``export
--checkpoint CP`` puts them together: the checkpoint's file, byte for byte (its
cosignature lines included), and its RFC 3161 timestamp (``CP.tsr`` beside it, the whole
DER reply) become two files of the archive::

    ARCHIVE/checkpoint        the signed note, exactly as CP holds it
    ARCHIVE/checkpoint.tsr    the timestamp over exactly those bytes (when CP has one)

Both are listed in ``manifest.json`` with their size and BLAKE3 like the dump, so ``openssl
ts -verify -data checkpoint -in checkpoint.tsr -CAfile TSA-ROOT.pem`` works inside the
archive as it does beside the store. The export refuses a checkpoint its snapshot does not
reach: ``bind`` compares it, in the export's one snapshot, with the log recomputed from the
ledger (``_audit.proofs.match_checkpoint``: the origin is the store, batch N recomputes to
the signed size, root and chain hash, the pre-006 quarantine rows are the signed ones). A
store that grew since the checkpoint still matches it (batch N is still there); an archive
of one run cannot (its ledger is a subset, not a tree), so ``--run`` and ``--checkpoint``
do not go together.

The same store and the same checkpoint give the same bytes: the files are copies, and
nothing about the export (a time, a path) goes in. ``restore`` checks the carried
checkpoint against the database it loaded, as ``verify_archive`` does (``evidence verify
ARCHIVE``): it restores the archive into a private directory, runs every check of
``evidence verify`` on it with the carried checkpoint (its signature by the key the
examiner names), then checks the timestamp and the witnesses' cosignatures.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import apsw
import msgspec
from cryptography.x509 import Certificate

from .._audit.proofs import (
    CheckpointMatch,
    SignedCheckpoint,
    VerifierKey,
    match_checkpoint,
    open_checkpoint,
    parse_checkpoint,
)
from .._audit.timestamp import TSR_SUFFIX
from .._errors import ProofError
from .._store.db import Store

__all__ = ["CHECKPOINT_FILE", "TIMESTAMP_FILE", "ArchiveCheck", "Carried", "CarriedCheck",
           "WaczProof", "bind", "carried_in", "check_wacz_checkpoint", "keep", "reach",
           "reached_by", "read_checkpoint_file", "restore_problems", "verify_archive"]

CHECKPOINT_FILE = "checkpoint"
TIMESTAMP_FILE = CHECKPOINT_FILE + TSR_SUFFIX


class Carried(msgspec.Struct, frozen=True, kw_only=True):
    """A checkpoint file's bytes and, when there is one, its timestamp's (``CP.tsr``)."""

    note: bytes
    timestamp: bytes | None = None

    def checkpoint(self) -> SignedCheckpoint:
        return parse_checkpoint(self.note)

    def files(self) -> dict[str, bytes]:
        """What goes into an archive, by name."""
        found = {CHECKPOINT_FILE: self.note}
        if self.timestamp is not None:
            found[TIMESTAMP_FILE] = self.timestamp
        return found


def read_checkpoint_file(path: str | os.PathLike[str]) -> Carried:
    """The checkpoint at ``path`` and the ``.tsr`` beside it, if any; ``ProofError`` when
    it cannot be read or is not a checkpoint."""
    path = Path(path)
    try:
        note = path.read_bytes()
        stamp = path.with_name(path.name + TSR_SUFFIX)
        timestamp = stamp.read_bytes() if stamp.is_file() else None
    except OSError as exc:
        raise ProofError(f"cannot read checkpoint {path}: {exc.strerror}", path=str(path),
                         hint="give the file 'evidence checkpoint --out' wrote") from None
    carried = Carried(note=note, timestamp=timestamp)
    carried.checkpoint()  # ProofError: not a checkpoint
    if timestamp is not None:
        _check_imprint(note, timestamp, str(stamp))
    return carried


def _check_imprint(note: bytes, timestamp: bytes, where: str) -> None:
    """The token is over these very bytes (the TSA's signature and chain are the
    examiner's check, against a root they name; this keeps a wrong pairing out)."""
    from rfc3161_client import decode_timestamp_response

    try:
        imprint = bytes(decode_timestamp_response(timestamp).tst_info.message_imprint.message)
    except (ValueError, TypeError) as exc:
        raise ProofError(f"{where} is not an RFC 3161 timestamp response ({exc})",
                         path=where, hint="give the .tsr 'evidence checkpoint --tsa' wrote"
                         ) from None
    if imprint != hashlib.sha256(note).digest():
        raise ProofError(f"{where} is a timestamp of other bytes than its checkpoint",
                         path=where, hint="keep each checkpoint with its own .tsr")


def bind(conn: apsw.Connection, carried: Carried) -> CheckpointMatch:
    """The checkpoint against the log recomputed from ``conn``'s ledger and chain."""
    return match_checkpoint(conn, carried.checkpoint())


def reach(conn: apsw.Connection, carried: Carried) -> None:
    """``ProofError`` unless the snapshot ``conn`` holds the log the checkpoint signs."""
    matched = bind(conn, carried)
    if not matched.ok:
        raise ProofError("the store does not hold what the checkpoint signs: "
                         + "; ".join(matched.problems),
                         hint="give a checkpoint of this store ('evidence checkpoint STORE "
                         "--key KEY --out CP'), or run 'evidence verify STORE --checkpoint CP "
                         "--public-key KEY.pub' to see what changed")


WACZ_DIR = "evidence/"  # where a WACZ keeps them: evidence/checkpoint, evidence/checkpoint.tsr


def reached_by(store: Store, carried: Carried) -> dict[str, bytes]:
    """The WACZ resources of a checkpoint the store's log holds (``reach``, in a snapshot
    of its own: the log only grows, so the WACZ's later snapshot holds it too)."""
    with store.snapshot() as conn:
        reach(conn, carried)
    return {WACZ_DIR + name: data for name, data in carried.files().items()}


def carried_in(archive: str | os.PathLike[str], files: Sequence[str]) -> Carried | None:
    """The checkpoint an archive carries (``files``: the names its manifest lists), or
    None. Whether the files are the ones the manifest hashed is the caller's check."""
    if CHECKPOINT_FILE not in files:
        return None
    root = Path(archive)
    try:
        note = (root / CHECKPOINT_FILE).read_bytes()
        timestamp = (root / TIMESTAMP_FILE).read_bytes() if TIMESTAMP_FILE in files else None
    except OSError as exc:
        raise ProofError(f"{archive}: cannot read its checkpoint ({exc.strerror})",
                         path=str(archive), hint="the archive is incomplete") from None
    return Carried(note=note, timestamp=timestamp)


# --- an archive, checked as a store ----------------------------------------------------

class CarriedCheck(msgspec.Struct, kw_only=True):
    """What the checkpoint an export carries says, once checked: who signed it, when a TSA
    saw it, which witnesses cosigned it; and what is wrong with it."""

    carried: bool = False  # the export carries a checkpoint
    signed_by: str | None = None  # the key that signed it (checked against --public-key)
    timestamped_at: str | None = None
    tsa: str | None = None
    witnesses: dict[str, int] = {}  # name -> cosignature time (POSIX), valid ones only
    problems: list[str] = []  # about the carried proof (the report has the store's)
    notes: list[str] = []

    @property
    def ok(self) -> bool:
        return not self.problems


class ArchiveCheck(CarriedCheck, kw_only=True):
    """``verify_archive``'s verdict: the restored store's report, and the carried proof."""

    report: object = None  # the VerifyReport of the restored copy

    @property
    def ok(self) -> bool:
        return not self.problems and bool(getattr(self.report, "ok", False))


class WaczProof(CarriedCheck, kw_only=True):
    """``check_wacz_checkpoint``'s verdict: the carried proof, and how far it covers the
    WACZ's records (each names its ledger entry, ``Evidence-Log-Index``)."""

    origin: str | None = None  # the log the WARC says it is part of (warcinfo isPartOf)
    tree_size: int | None = None
    covered: int = 0  # records naming an entry the checkpoint signs
    beyond: int = 0  # records naming a later entry: not covered by it


def verify_archive(archive: str | os.PathLike[str], *, full: bool = False,
                   public_key: VerifierKey | None = None,
                   tsa_roots: list[Certificate] | None = None,
                   witness_keys: Sequence[VerifierKey] = (), witnesses: int | None = None,
                   scratch: str | os.PathLike[str] | None = None) -> ArchiveCheck:
    """Everything ``evidence verify`` checks, on an archive: restored into a private
    directory (``restore``: every file against the manifest, the schema against the
    migrations), verified there against the checkpoint it carries, whose signature
    (``public_key``), timestamp (``tsa_roots``) and cosignatures (``witness_keys``, at
    least ``witnesses`` of them, default all) are checked when the examiner names them."""
    from .._audit.verify import verify
    from .archive import restore
    from .export import read_manifest

    manifest = read_manifest(archive)
    carried = carried_in(archive, list(manifest.files))
    check = ArchiveCheck(carried=carried is not None)
    signed = _check_carried(carried, check, public_key, tsa_roots, witness_keys, witnesses)
    with tempfile.TemporaryDirectory(prefix="evidence-verify-", dir=scratch) as tmp:
        where = Path(tmp) / "store"
        restore(archive, where, check_carried=False)
        with Store.open(where, read_only=True) as store:
            check.report = verify(store, full=full, checkpoint=signed)
    return check


def _check_carried(carried: Carried | None, check: CarriedCheck,
                   public_key: VerifierKey | None, tsa_roots: list[Certificate] | None,
                   witness_keys: Sequence[VerifierKey], witnesses: int | None
                   ) -> SignedCheckpoint | None:
    """The carried checkpoint's signature, timestamp and cosignatures, as named; the
    checkpoint (None: there is none, or it does not parse or verify)."""
    if carried is None:
        if public_key is not None or tsa_roots or witness_keys:
            check.problems.append("no checkpoint is carried, and a key, TSA root or witness "
                                  "was named to check one")
        return None
    try:
        signed = carried.checkpoint()
        if public_key is not None:
            signed = open_checkpoint(signed, public_key)
            check.signed_by = f"{public_key.name}+{public_key.key_id:08x}"
        else:
            check.notes.append("the carried checkpoint's signature was not checked: name "
                               "the operator's key to check it")
    except ProofError as exc:
        check.problems.append(f"checkpoint: {exc}")
        return None
    _check_carried_time(carried, tsa_roots, check)
    _check_witnesses(signed, witness_keys, witnesses, check)
    return signed


def _check_carried_time(carried: Carried, roots: list[Certificate] | None,
                        check: CarriedCheck) -> None:
    from .._audit.timestamp import check_timestamp

    if not roots:
        if carried.timestamp is not None:
            check.notes.append("the checkpoint's timestamp was not checked: name the TSA's "
                               "root (--tsa-root) to check it")
        return
    if carried.timestamp is None:
        check.problems.append("the archive carries no timestamp for its checkpoint, and a "
                              "TSA root was named to check one")
        return
    try:
        stamp = check_timestamp(carried.note, carried.timestamp, roots)
    except ProofError as exc:
        check.problems.append(f"timestamp: {exc}")
        return
    check.timestamped_at, check.tsa = stamp.time, stamp.tsa


def _check_witnesses(cp: SignedCheckpoint, keys: Sequence[VerifierKey], need: int | None,
                     check: CarriedCheck) -> None:
    from .._audit.witness import CosignerKey, check_cosignatures

    if not keys:
        return
    enough, found, problems = check_cosignatures(
        cp, [k if isinstance(k, CosignerKey) else CosignerKey.from_text(k.to_text())
             for k in keys], need)
    check.witnesses = found
    if not enough:
        check.problems += [f"witnesses: {p}" for p in problems]
        check.problems.append(f"{len(found)} of the {len(keys) if need is None else need} "
                              "witness cosignatures needed")


def restore_problems(archive: str | os.PathLike[str], files: Mapping[str, object],
                     conn: apsw.Connection, *, against_log: bool = True) -> list[str]:
    """What ``restore`` finds wrong with the checkpoint an archive carries: a carried file
    that is not the one the manifest hashed, and (``against_log``) a checkpoint the loaded
    database does not hold: the archive is not the log that was signed."""
    import blake3

    problems = []
    for name in (CHECKPOINT_FILE, TIMESTAMP_FILE):
        entry = files.get(name)
        if entry is None:
            continue
        path = Path(archive) / name
        data = path.read_bytes() if path.is_file() else None
        if data is None or (len(data), blake3.blake3(data).hexdigest()) != (
                getattr(entry, "bytes", None), getattr(entry, "blake3", None)):
            problems.append(f"{name} is missing or does not match its manifest")
    carried = None if problems else carried_in(archive, list(files))
    if carried is None or not against_log:
        return problems
    try:
        matched = bind(conn, carried)
    except ProofError as exc:
        return [f"the carried checkpoint: {exc}"]
    return [f"the carried checkpoint: {p}" for p in matched.problems]


def keep(archive: str | os.PathLike[str], files: Sequence[str], store_dir: Path) -> None:
    """Copy the carried checkpoint (and timestamp) into a restored store's directory, under
    the same names: ``evidence verify STORE --checkpoint STORE/checkpoint`` checks it."""
    for name in (CHECKPOINT_FILE, TIMESTAMP_FILE):
        if name in files:
            (store_dir / name).write_bytes((Path(archive) / name).read_bytes())


# --- a WACZ's checkpoint ---------------------------------------------------------------

def check_wacz_checkpoint(path: str | os.PathLike[str], *,
                          public_key: VerifierKey | None = None,
                          tsa_roots: list[Certificate] | None = None,
                          witness_keys: Sequence[VerifierKey] = (),
                          witnesses: int | None = None) -> WaczProof:
    """The checkpoint a WACZ carries (``evidence/checkpoint``, ``.tsr``): signed by
    ``public_key``, timestamped, cosigned, of the log the WARC says it is part of, and how
    many records name an entry it signs. A WACZ holds no ledger, so this is as far as it
    goes: that each record's entry is in the log is an inclusion proof's job. Whether the
    files are the ones the package lists and its signature covers is ``check_wacz``'s."""
    import zipfile

    check = WaczProof()
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            name = WACZ_DIR + CHECKPOINT_FILE
            carried = None if name not in names else Carried(
                note=zf.read(name), timestamp=zf.read(name + TSR_SUFFIX)
                if name + TSR_SUFFIX in names else None)
            check.carried = carried is not None
            signed = _check_carried(carried, check, public_key, tsa_roots, witness_keys,
                                    witnesses)
            if signed is None:
                return check
            check.tree_size = signed.tree_size
            for fields in _warc_heads(zf, "archive/data.warc.gz"):
                if fields.get("warc-type") == "warcinfo":
                    check.origin = check.origin or fields.get("ispartof")
                index = fields.get("evidence-log-index")
                if index is not None and index.isdigit():
                    if int(index) < signed.tree_size:
                        check.covered += 1
                    else:
                        check.beyond += 1
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as exc:
        check.problems.append(f"the WACZ cannot be read for its checkpoint: {exc}")
        return check
    if check.origin != signed.origin:
        check.problems.append(f"the checkpoint is of log {signed.origin}, the WARC is part of "
                              f"{check.origin}")
    if check.beyond:
        check.notes.append(f"{check.beyond} record(s) name a ledger entry after the "
                           f"checkpoint's {signed.tree_size}: not covered by it")
    return check


def _warc_heads(zf: object, name: str) -> Iterator[dict[str, str]]:
    """Each record's header fields (names lowercased; warcinfo's block fields too) of a
    gzipped WARC in the zip, read one record at a time."""
    import gzip

    with zf.open(name) as raw, gzip.open(raw) as warc:  # type: ignore[attr-defined]
        while line := warc.readline():
            if not line.strip():
                continue
            fields: dict[str, str] = {}
            while (line := warc.readline()).strip():
                key, _, value = line.decode("utf-8", "replace").partition(":")
                fields[key.strip().lower()] = value.strip()
            block = warc.read(int(fields.get("content-length", "0")))
            if fields.get("warc-type") == "warcinfo":
                for text in block.decode("utf-8", "replace").splitlines():
                    key, _, value = text.partition(":")
                    fields.setdefault(key.strip().lower(), value.strip())
            yield fields
