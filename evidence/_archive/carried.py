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
ledger (``_audit.checkpoints.match_checkpoint``: the origin is the store, batch N
recomputes to the signed size, root and chain hash, the pre-006 quarantine rows are the
signed ones). A store that grew since the checkpoint still matches it (batch N is still
there); an archive of one run cannot (its ledger is a subset, not a tree), so ``--run`` and
``--checkpoint`` do not go together.

A WACZ carries them as ``evidence/checkpoint`` and ``evidence/checkpoint.tsr``, package
resources like the others, so the WACZ's signature covers their hashes (``reached_by``).

The same store and the same checkpoint give the same bytes: the files are copies, and
nothing about the export (a time, a path) goes in. ``restore`` checks the carried
checkpoint against the database it loaded and keeps it in the store directory; checking
what an export carries, as an examiner does, is ``_archive.proofcheck``'s.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import apsw
import msgspec

from .._audit.checkpoints import (
    CheckpointMatch,
    SignedCheckpoint,
    match_checkpoint,
    parse_checkpoint,
)
from .._audit.timestamp import TSR_SUFFIX
from .._errors import ProofError
from .._store.db import Store

__all__ = ["CHECKPOINT_FILE", "TIMESTAMP_FILE", "WACZ_DIR", "Carried", "bind", "carried_in",
           "keep", "reach", "reached_by", "read_checkpoint_file", "restore_problems"]

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
