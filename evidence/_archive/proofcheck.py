"""What an export carries, checked as an examiner checks it: an archive restored and
verified against its checkpoint, and a WACZ's checkpoint.

``verify_archive`` (``evidence verify ARCHIVE``) restores the archive into a private
directory (``restore``: every file against the manifest, the schema against the
migrations), runs every check of ``evidence verify`` on the copy with the checkpoint the
archive carries, and checks that checkpoint's signature by the key the examiner names, its
RFC 3161 timestamp against the TSA roots they name and its witnesses' cosignatures against
their policy. ``check_wacz_checkpoint`` does the same for the checkpoint a WACZ carries, as
far as a WACZ allows: it holds no ledger, so the checkpoint is compared with the log the
WARC says it is part of, and with the ledger entries its records name.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec
from cryptography.x509 import Certificate

from .._audit.checkpoints import SignedCheckpoint, open_checkpoint
from .._audit.keys import VerifierKey
from .._audit.timestamp import TSR_SUFFIX
from .._errors import ProofError
from .._store.db import Store
from .archive import restore
from .carried import CHECKPOINT_FILE, WACZ_DIR, Carried, carried_in
from .export import read_manifest

__all__ = ["ArchiveCheck", "CarriedCheck", "WaczProof", "check_wacz_checkpoint",
           "check_wacz_timestamp", "verify_archive"]


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


def check_wacz_timestamp(path: str | os.PathLike[str], roots: list[Certificate]
                         ) -> tuple[str | None, str | None, list[str]]:
    """The domain form's RFC 3161 timestamp (``timeSignature``: the TSA's reply over the
    signature's base64 text, as authsign makes it) against the examiner's TSA roots: (its
    time, its TSA, problems); (None, None, []) when the WACZ has none."""
    import base64
    import binascii
    import json
    import zipfile

    from .._audit.timestamp import check_timestamp

    try:
        with zipfile.ZipFile(path) as zf:
            signed = json.loads(zf.read("datapackage-digest.json")).get("signedData") or {}
        if not isinstance(signed, dict) or "timeSignature" not in signed:
            return None, None, []
        token = base64.b64decode(str(signed["timeSignature"]), validate=True)
        stamp = check_timestamp(str(signed.get("signature", "")).encode("ascii"), token,
                                roots)
    except ProofError as exc:
        return None, None, [f"the signature's timestamp: {exc}"]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, binascii.Error,
            UnicodeEncodeError, AttributeError) as exc:
        return None, None, [f"the signature's timestamp cannot be read: {exc}"]
    return stamp.time, stamp.tsa, []
