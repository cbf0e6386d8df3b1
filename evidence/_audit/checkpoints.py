"""Signed checkpoints: a store's log head, signed so a third party can hold it to it.

A **checkpoint** is a C2SP signed note (https://c2sp.org/signed-note) whose text follows
C2SP tlog-checkpoint (https://c2sp.org/tlog-checkpoint), signed with Ed25519
(``_audit.keys``)::

    evidence/store-0190c1d2...          origin: "evidence/" + the store id
    1234                                tree size, decimal
    3q2+7w...=                          root hash, base64 (RFC 9162 / RFC 6962 tree)
    time 2025-03-03T12:00:00.000000Z    extension line: when it was signed (UTC)
    chain 57 9f3a...=                   extension line: the last batch, and the commit-log
                                        chain hash recomputed up to it
    legacy-quarantine 0 47DE...=        extension line: the quarantine rows in the pre-006
                                        layout, how many and SHA-256 of them
                                        blank line
    — evidence-ops AbCd...==            em dash, key name, base64(4-byte key id || signature)

The root binds every accepted message; the ``chain`` line binds the rest of what ``verify``
checks that is not a leaf: every batch's commit time (which the ledger's receipt times must
equal), what each batch quarantined (so every counted quarantine record), and the store's
identity (where the chain starts). Recomputing the chain after an edit, which anyone who
can write the database can do, gives another hash than the one signed: ``match_checkpoint``
finds it. Checkpoints signed before these lines existed bind the root only; they still
check, and say so.

This module owns the note's text (parsed strictly, signatures checked by
``open_checkpoint``), signing a store's head (``checkpoint``) and matching a store against
a signed one (``match_checkpoint``, which ``verify`` runs); the proofs that leaves and older
trees belong to a signed tree are ``_audit.proofs``'.
"""

from __future__ import annotations

import datetime as _dt
import re

import apsw
import msgspec

from .._errors import CorruptStoreError, ProofError
from .._model.merkle import EMPTY_ROOT
from .._model.messages import format_time, utc_now
from .._store.db import Store
from .._store.log import GENESIS_HASH, Head, check_log, identity_bound, identity_genesis
from .._store.quarantine import legacy_rows
from .keys import _EM_DASH, SigningKey, VerifierKey, _b64, _b64decode

__all__ = ["CheckpointMatch", "SignedCheckpoint", "checkpoint", "match_checkpoint",
           "open_checkpoint", "parse_checkpoint"]

ORIGIN_PREFIX = "evidence/"
CHAIN_LINE = "chain"  # extension line: <last batch> <base64(recomputed chain hash)>
LEGACY_LINE = "legacy-quarantine"  # extension line: <rows> <base64(SHA-256 of them)>
_MAX_SIGNATURES = 100
_SIZE_RE = re.compile(r"0|[1-9][0-9]{0,19}")


class NoteSignature(msgspec.Struct, frozen=True):
    key_name: str
    key_id: int
    signature: bytes


class Bound(msgspec.Struct, frozen=True):
    """An extension line ``<name> <number> <base64(32 bytes)>``: for ``chain``, a batch and
    its recomputed chain hash; for ``legacy-quarantine``, a row count and their digest."""

    number: int
    digest: bytes


class SignedCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed checkpoint. ``parse_checkpoint`` does not check signatures; ``open_checkpoint``
    does, and is the only way to a checkpoint whose fields can be trusted."""

    origin: str
    tree_size: int
    root: bytes
    time: str | None  # the "time" extension line
    chain: Bound | None = None  # the "chain" line (None: signed before it existed)
    legacy: Bound | None = None  # the "legacy-quarantine" line
    extensions: list[str]  # every extension line, "time ..." included
    text: str  # the signed note text (the body, ending in a newline)
    signatures: list[NoteSignature]

    @property
    def store_id(self) -> str:
        return self.origin.removeprefix(ORIGIN_PREFIX)

    def note(self) -> str:
        """The checkpoint as it is written to a file."""
        lines = "".join(
            f"{_EM_DASH} {s.key_name} {_b64(s.key_id.to_bytes(4, 'big') + s.signature)}\n"
            for s in self.signatures)
        return f"{self.text}\n{lines}"


def parse_checkpoint(data: str | bytes) -> SignedCheckpoint:
    """Parse a signed-note checkpoint strictly, without verifying any signature."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ProofError("the checkpoint is not valid UTF-8") from None
    if any(c < " " and c != "\n" for c in data):
        raise ProofError("the checkpoint contains control characters")
    cut = data.rfind("\n\n")
    if cut < 0 or not data.endswith("\n"):
        raise ProofError("not a signed note: no blank line before the signatures")
    text, sig_block = data[: cut + 1], data[cut + 2 :]
    signatures = []
    for line in sig_block[:-1].split("\n"):
        prefix = _EM_DASH + " "
        name, _, blob = line.removeprefix(prefix).partition(" ")
        if not line.startswith(prefix) or not name or "+" in name or " " in blob:
            raise ProofError(f"malformed signature line {line!r}")
        raw = _b64decode(blob, "signature")
        if len(raw) < 5:
            raise ProofError("signature too short")
        signatures.append(NoteSignature(name, int.from_bytes(raw[:4], "big"), raw[4:]))
    if len(signatures) > _MAX_SIGNATURES:
        raise ProofError("too many signatures")
    lines = text[:-1].split("\n")
    if len(lines) < 3 or not all(lines):
        raise ProofError("a checkpoint has an origin, a tree size, a root and no empty lines")
    origin, size_text, root_text, *extensions = lines
    if not _SIZE_RE.fullmatch(size_text):
        raise ProofError(f"bad tree size {size_text!r}")
    root = _b64decode(root_text, "root hash")
    if len(root) != 32:
        raise ProofError(f"the root hash is {len(root)} bytes, not 32")
    times = [e.removeprefix("time ") for e in extensions if e.startswith("time ")]
    return SignedCheckpoint(origin=origin, tree_size=int(size_text), root=root,
                            time=times[0] if len(times) == 1 else None,
                            chain=_bound(extensions, CHAIN_LINE),
                            legacy=_bound(extensions, LEGACY_LINE), extensions=extensions,
                            text=text, signatures=signatures)


def _bound(extensions: list[str], name: str) -> Bound | None:
    """The extension line ``name``, parsed strictly: at most one, well formed."""
    found = [e for e in extensions if e.split(" ", 1)[0] == name]
    if not found:
        return None
    if len(found) > 1:
        raise ProofError(f"the checkpoint has {len(found)} {name!r} lines, not one")
    parts = found[0].split(" ")
    if len(parts) != 3 or not _SIZE_RE.fullmatch(parts[1]):
        raise ProofError(f"malformed {name!r} line {found[0]!r}")
    digest = _b64decode(parts[2], f"the {name} hash")
    if len(digest) != 32:
        raise ProofError(f"the {name} hash is {len(digest)} bytes, not 32")
    return Bound(int(parts[1]), digest)


def open_checkpoint(data: str | bytes | SignedCheckpoint,
                    key: VerifierKey | str | bytes) -> SignedCheckpoint:
    """Parse and verify: ``ProofError`` unless ``key`` signed it (C2SP signed-note rules).

    Signatures by other keys (witnesses, a rotated key) are ignored; a signature that claims
    to be by ``key`` (same name and id) and does not verify rejects the whole checkpoint.
    """
    key = key if isinstance(key, VerifierKey) else VerifierKey.from_text(key)
    cp = data if isinstance(data, SignedCheckpoint) else parse_checkpoint(data)
    ours = [s for s in cp.signatures if (s.key_name, s.key_id) == (key.name, key.key_id)]
    if not ours:
        raise ProofError(f"the checkpoint is not signed by {key.name}+{key.key_id:08x}",
                         hint="check that you were given the store owner's public key")
    for signature in ours:
        if not key.verify(signature.signature, cp.text.encode()):
            raise ProofError(f"the signature by {key.name} does not verify: the checkpoint "
                             "was altered or signed by another key with that name")
    return cp


def checkpoint(store: Store, key: SigningKey | str, *,
               now: _dt.datetime | None = None) -> SignedCheckpoint:
    """Sign (store id, tree size, root, time) for the head of the store's log.

    The root is recomputed from the ledger (``check_log``) first: a log that does not verify
    is never signed, since a signed checkpoint is a promise every later one extends it.
    """
    key = key if isinstance(key, SigningKey) else SigningKey.from_text(key)
    with store.snapshot() as conn:
        store_id = _store_id(conn)
        heads: dict[int, Head] = {}
        size, root, findings = check_log(conn, heads)
        chain = _last_head(conn, heads)
        legacy = legacy_rows(conn)
    if findings:
        raise CorruptStoreError(
            f"will not sign: the log does not verify ({findings[0].detail}; "
            f"{len(findings)} problem(s))", hint="run 'evidence verify' to locate them",
            path=str(store.path))
    moment = format_time(now if now is not None else utc_now())
    text = (f"{ORIGIN_PREFIX}{store_id}\n{size}\n{_b64(root)}\ntime {moment}\n"
            f"{CHAIN_LINE} {chain.batch_seq} {_b64(chain.chain)}\n"
            f"{LEGACY_LINE} {legacy[0]} {_b64(legacy[1])}\n")
    return parse_checkpoint(key.sign_note(text))


def _genesis(conn: apsw.Connection) -> bytes:
    """Where the chain starts: the store's identity, or zeros for a store from before
    issue 12 (``_store.log``)."""
    return GENESIS_HASH if identity_bound(conn) is False else identity_genesis(
        _store_id(conn))


def _last_head(conn: apsw.Connection, heads: dict[int, Head]) -> Head:
    """The newest batch, recomputed; for an empty log, "batch 0": the chain's start."""
    if heads:
        return heads[max(heads)]
    return Head(0, 0, EMPTY_ROOT, _genesis(conn), "")


class CheckpointMatch(msgspec.Struct, kw_only=True):
    """Whether a store still holds what a checkpoint signed (``match_checkpoint``)."""

    ok: bool
    bound: bool  # the checkpoint binds the chain (False: signed before it did: root only)
    statement: str  # what was compared, in one sentence
    problems: list[str]


def match_checkpoint(conn: apsw.Connection, cp: SignedCheckpoint,
                     heads: dict[int, Head] | None = None) -> CheckpointMatch:
    """Compare a (verified) checkpoint with the log recomputed from the store's ledger and
    chain: the same origin, the signed batch with the signed size, root and recomputed
    chain hash, and the same rows in the pre-006 quarantine layout. ``heads``: what
    ``check_log`` recomputed, if the caller ran it already."""
    if heads is None:
        heads = {}
        check_log(conn, heads)
    problems: list[str] = []
    origin = f"{ORIGIN_PREFIX}{_store_id(conn)}"
    if cp.origin != origin:
        problems.append(f"the checkpoint is of log {cp.origin}, this store is {origin}")
    signed = f"size {cp.tree_size}, signed at {cp.time or 'an unstated time'}"
    if cp.chain is None:
        at = [h for h in heads.values() if h.tree_size == cp.tree_size]
        root = at[0].root if at else (EMPTY_ROOT if cp.tree_size == 0 else None)
        if root is None:
            problems.append(f"the log never had the signed size {cp.tree_size} (it has "
                            f"{max((h.tree_size for h in heads.values()), default=0)} entries)")
        elif root != cp.root:
            problems.append(f"the first {cp.tree_size} entries of the log no longer give "
                            "the signed root: an accepted message was changed")
        return CheckpointMatch(ok=not problems, bound=False, problems=problems, statement=(
            f"the first {cp.tree_size} accepted messages against the checkpoint ({signed}); "
            "it was signed before checkpoints bound the commit-log chain, so it vouches for "
            "no commit time, quarantine record or store identity"))
    seq = cp.chain.number
    head = heads.get(seq) if seq else _last_head(conn, {})
    if head is None:
        problems.append(f"the store has no batch {seq}, the last one the checkpoint signs")
    else:
        if (head.tree_size, head.root) != (cp.tree_size, cp.root):
            problems.append(f"batch {seq} recomputes to size {head.tree_size}, root "
                            f"{head.root.hex()[:16]}...; the checkpoint signs size "
                            f"{cp.tree_size}, root {cp.root.hex()[:16]}...")
        if head.chain != cp.chain.digest:
            problems.append(f"the commit-log chain recomputed up to batch {seq} is not the "
                            "one signed: a commit or receipt time, a quarantine record or "
                            "the store's identity was changed since")
    if cp.legacy is not None and legacy_rows(conn) != (cp.legacy.number, cp.legacy.digest):
        count, _ = legacy_rows(conn)
        problems.append(f"the quarantine rows in the pre-006 layout are not the signed ones "
                        f"({count} now, {cp.legacy.number} signed)")
    return CheckpointMatch(ok=not problems, bound=True, problems=problems, statement=(
        f"the log through batch {seq} (every accepted message, commit time, quarantine "
        f"record and the store's identity) against the checkpoint ({signed})"))


def _store_id(conn: apsw.Connection) -> str:
    rows = conn.execute("SELECT value FROM store_meta WHERE key = 'store_id'").fetchall()
    return rows[0][0] if rows else ""
