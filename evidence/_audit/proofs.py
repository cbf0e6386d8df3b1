"""Proofs a third party can check offline: inclusion and consistency, against a checkpoint.

A **proof** is a JSON document (``type`` "inclusion" or "consistency", bytes in base64).
An inclusion proof carries the ledger entry itself (its canonical msgpack bytes), so the
checker hashes the entry, walks the RFC 9162 audit path, and compares with the root the
*checkpoint* signs (``_audit.checkpoints``), at the size the *checkpoint* signs: never a
size or root taken from the proof (see ``_model.merkle``: a proof alone does not bind its
tree size). A consistency proof shows that an older tree (ideally an older checkpoint) is a
prefix of the signed one.

``check_proof`` needs no store. It never raises on bad input: anything malformed, mutated
or signed by another key gives ``ok=False`` with the reasons. This module owns the proof
documents, making them from a store and checking them; the checkpoint they are checked
against is ``_audit.checkpoints``', its key ``_audit.keys``'.
"""

from __future__ import annotations

from typing import Any

import apsw
import msgspec
from cryptography.x509 import Certificate

from .._errors import CorruptStoreError, MessageError, NotFoundError, ProofError
from .._model.merkle import (
    EMPTY_ROOT,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)
from .._model.merkle import root as merkle_root
from .._model.messages import decode_message, ledger_entry
from .._store.db import Store
from .._store.log import has_column
from .checkpoints import ORIGIN_PREFIX, SignedCheckpoint, _store_id, open_checkpoint
from .keys import VerifierKey

__all__ = ["ConsistencyProof", "InclusionProof", "Proof", "ProofCheck", "check_proof",
           "decode_proof", "encode_proof", "prove_consistency", "prove_inclusion"]

PROOF_VERSION = 1


# --- proofs --------------------------------------------------------------------------

_STRUCT = {"frozen": True, "kw_only": True, "forbid_unknown_fields": True, "tag_field": "type",
           "omit_defaults": True}


class InclusionProof(msgspec.Struct, tag="inclusion", **_STRUCT):
    """Ledger entry ``log_index`` is leaf ``log_index`` of the ``tree_size``-leaf tree."""

    version: int
    origin: str
    log_index: int
    tree_size: int
    entry: bytes  # the ledger payload: canonical msgpack of the message
    leaf_hash: bytes  # SHA-256(0x00 || ledger_entry(entry, submitter))
    path: list[bytes]  # RFC 9162 2.1.3 audit path, leaf sibling first
    root: bytes  # the root the store computed; the checker trusts only the checkpoint's
    # The worker host that submitted the entry (ingest_ledger.submitter), covered by the
    # leaf hash; absent for the crawl's own messages (their proofs are as they always were).
    submitter: str | None = None
    # Carried along (prove --checkpoint), so the proof travels alone: the checkpoint's note
    # as its file holds it, and its RFC 3161 timestamp (the DER of CHECKPOINT.tsr). The
    # checker trusts them only once the signature and the timestamp verify.
    checkpoint: str | None = None
    timestamp: bytes | None = None


class ConsistencyProof(msgspec.Struct, tag="consistency", **_STRUCT):
    """The ``old_size`` tree ``old_root`` is a prefix of the ``new_size`` tree ``new_root``."""

    version: int
    origin: str
    old_size: int
    new_size: int
    old_root: bytes
    new_root: bytes
    path: list[bytes]  # RFC 9162 2.1.4 consistency proof
    checkpoint: str | None = None  # as in InclusionProof
    timestamp: bytes | None = None


Proof = InclusionProof | ConsistencyProof
_proof_decoder = msgspec.json.Decoder(Proof)


def encode_proof(proof: Proof) -> bytes:
    """The proof as indented JSON (bytes as standard base64), ending in a newline."""
    return msgspec.json.format(msgspec.json.encode(proof), indent=2) + b"\n"


def decode_proof(data: str | bytes) -> Proof:
    try:
        return _proof_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise ProofError(f"invalid proof: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ProofError(f"not a proof (malformed JSON: {exc})") from None


def _leaves(conn: apsw.Connection, size: int) -> list[bytes]:
    """The first ``size`` stored leaf hashes, contiguous from 0."""
    leaves: list[bytes] = []
    for index, leaf in conn.execute("SELECT log_index, leaf_hash FROM ingest_ledger "
                                    "WHERE log_index < ? ORDER BY log_index", (size,)):
        if index != len(leaves):
            raise CorruptStoreError(f"ledger entry {len(leaves)} is missing",
                                    hint="run 'evidence verify'")
        leaves.append(leaf)
    if len(leaves) != size:
        raise CorruptStoreError(f"the ledger has {len(leaves)} entries, not {size}",
                                hint="run 'evidence verify'")
    return leaves


def _head_and_leaves(conn: apsw.Connection, size: int | None) -> tuple[str, int, list[bytes]]:
    head = conn.execute("SELECT coalesce(max(tree_size), 0) FROM commit_log").fetchall()[0][0]
    if size is None:
        size = head
    if not 0 <= size <= head:
        raise ProofError(f"tree size {size} is not in 0..{head} (the log's size)")
    leaves = _leaves(conn, size)
    recorded = conn.execute("SELECT root FROM commit_log WHERE tree_size = ? ORDER BY batch_seq "
                            "DESC LIMIT 1", (size,)).fetchall()
    if recorded and merkle_root(leaves) != recorded[0][0]:
        raise CorruptStoreError(f"the stored leaves do not give the root the commit log "
                                f"records for size {size}", hint="run 'evidence verify'")
    return f"{ORIGIN_PREFIX}{_store_id(conn)}", size, leaves


def prove_inclusion(store: Store, attempt_id: str | None = None, *, log_index: int | None = None,
                    tree_size: int | None = None) -> InclusionProof:
    """Prove a fetch attempt's ledger entry (or any entry, by ``log_index``) is in the log.

    ``tree_size`` defaults to the log's current size; pass a checkpoint's size to prove
    against that checkpoint.
    """
    if (attempt_id is None) == (log_index is None):
        raise TypeError("give exactly one of attempt_id and log_index")
    with store.snapshot() as conn:
        if attempt_id is not None:
            rows = conn.execute("SELECT log_index FROM fetch_attempt WHERE attempt_id = ?",
                                (attempt_id,)).fetchall()
            if not rows:
                raise NotFoundError(f"no attempt {attempt_id!r} in the store",
                                    hint="'evidence status' lists runs; attempt ids are "
                                    "in the crawler's output", attempt_id=attempt_id)
            log_index = rows[0][0]
        assert log_index is not None
        origin, size, leaves = _head_and_leaves(conn, tree_size)
        if not 0 <= log_index < size:
            raise ProofError(f"log index {log_index} is not in a tree of size {size}")
        by = "submitter" if has_column(conn, "ingest_ledger", "submitter") else "NULL"
        entry, submitter = conn.execute(f"SELECT payload, {by} FROM ingest_ledger "
                                        "WHERE log_index = ?", (log_index,)).fetchall()[0]
    if leaf_hash(ledger_entry(entry, submitter)) != leaves[log_index]:
        raise CorruptStoreError(f"ledger entry {log_index} does not hash to its leaf hash",
                                hint="run 'evidence verify'", log_index=log_index)
    return InclusionProof(version=PROOF_VERSION, origin=origin, log_index=log_index,
                          tree_size=size, entry=entry, leaf_hash=leaves[log_index],
                          path=inclusion_proof(log_index, leaves), root=merkle_root(leaves),
                          submitter=submitter)


def prove_consistency(store: Store, from_size: int, to_size: int | None = None
                      ) -> ConsistencyProof:
    """Prove the log at ``from_size`` is a prefix of the log at ``to_size`` (default: now)."""
    with store.snapshot() as conn:
        origin, size, leaves = _head_and_leaves(conn, to_size)
    if not 0 <= from_size <= size:
        raise ProofError(f"from size {from_size} is not in 0..{size}")
    return ConsistencyProof(version=PROOF_VERSION, origin=origin, old_size=from_size,
                            new_size=size, old_root=merkle_root(leaves[:from_size]),
                            new_root=merkle_root(leaves),
                            path=consistency_proof(from_size, leaves))


# --- checking, offline ---------------------------------------------------------------

class ProofCheck(msgspec.Struct, kw_only=True):
    """The verdict of ``check_proof``; ``statement`` says what was proven, in one sentence."""

    ok: bool
    kind: str | None = None  # "inclusion" or "consistency"
    origin: str | None = None
    tree_size: int | None = None  # from the checkpoint
    root: str | None = None  # hex, from the checkpoint
    signed_at: str | None = None
    key: str | None = None
    log_index: int | None = None
    old_size: int | None = None
    entry: dict[str, Any] | None = None  # the decoded ledger entry (inclusion)
    submitter: str | None = None  # the worker host that submitted it (inclusion), if one did
    chain_bound: bool | None = None  # the checkpoint binds the commit-log chain head
    timestamped_at: str | None = None  # the RFC 3161 genTime, once the token verified
    tsa: str | None = None  # the TSA certificate's subject
    statement: str = ""
    problems: list[str] = []


def check_proof(proof: Proof | str | bytes, checkpoint: SignedCheckpoint | str | bytes | None,
                public_key: VerifierKey | str | bytes, *,
                old_checkpoint: SignedCheckpoint | str | bytes | None = None,
                timestamp: bytes | None = None,
                tsa_roots: list[Certificate] | None = None) -> ProofCheck:
    """Verify a proof against a checkpoint signed by ``public_key``, without the store.

    The tree size and root come from the verified checkpoint. For a consistency proof,
    ``old_checkpoint`` (same key) pins the old size and root too; without it they are the
    proof's claim, to compare with a root obtained earlier. With ``tsa_roots``, the
    checkpoint's RFC 3161 ``timestamp`` (its ``cp.tsr``) must verify over the checkpoint's
    bytes and chain to one of them (``_audit.timestamp``); without a timestamp, that fails.
    ``checkpoint`` and ``timestamp`` None: the ones the proof carries, if it does.
    """
    result = ProofCheck(ok=False)
    try:
        key = public_key if isinstance(public_key, VerifierKey) else VerifierKey.from_text(
            public_key)
        result.key = f"{key.name}+{key.key_id:08x}"
        parsed = proof if isinstance(proof, InclusionProof | ConsistencyProof) else decode_proof(
            proof)
        if checkpoint is None:
            if parsed.checkpoint is None:
                raise ProofError("the proof carries no checkpoint and none was given")
            checkpoint = parsed.checkpoint
        if timestamp is None:
            timestamp = parsed.timestamp  # over another checkpoint's bytes, it fails
        cp = open_checkpoint(checkpoint, key)
        result.origin, result.tree_size, result.root = cp.origin, cp.tree_size, cp.root.hex()
        result.signed_at = cp.time
        result.chain_bound = cp.chain is not None
        old = None if old_checkpoint is None else open_checkpoint(old_checkpoint, key)
    except ProofError as exc:
        result.problems.append(str(exc))
        return result
    result.kind = str(type(parsed).__struct_config__.tag)
    problems = result.problems
    if parsed.version != PROOF_VERSION:
        problems.append(f"unknown proof version {parsed.version}")
    if parsed.origin != cp.origin:
        problems.append(f"the proof is for log {parsed.origin!r}, the checkpoint for "
                        f"{cp.origin!r}")
    if isinstance(parsed, InclusionProof):
        _check_inclusion(parsed, cp, result)
    else:
        _check_consistency(parsed, cp, old, result)
    if tsa_roots:
        _check_timestamp(checkpoint, cp, timestamp, tsa_roots, result)
    result.ok = not problems
    if not result.ok:
        result.statement = ""
    return result


def _check_timestamp(given: SignedCheckpoint | str | bytes, cp: SignedCheckpoint,
                     token: bytes | None, roots: list[Certificate], result: ProofCheck) -> None:
    """The checkpoint's timestamp, over the checkpoint's bytes as they were handed over (a
    checkpoint passed parsed is hashed as ``note()`` writes it)."""
    from .timestamp import check_timestamp

    if token is None:
        result.problems.append("no RFC 3161 timestamp for the checkpoint (CHECKPOINT.tsr), "
                               "and a TSA root was named to check one")
        return
    data = given.note().encode() if isinstance(given, SignedCheckpoint) else (
        given if isinstance(given, bytes) else given.encode())
    try:
        stamp = check_timestamp(data, token, roots)
    except ProofError as exc:
        result.problems.append(str(exc))
        return
    result.timestamped_at, result.tsa = stamp.time, stamp.tsa
    if result.statement:
        result.statement += f", timestamped at {stamp.time} by {stamp.tsa}"


def _check_inclusion(p: InclusionProof, cp: SignedCheckpoint, result: ProofCheck) -> None:
    problems = result.problems
    result.log_index = p.log_index
    if p.tree_size != cp.tree_size:
        problems.append(f"the proof is for tree size {p.tree_size}, the checkpoint signs "
                        f"{cp.tree_size}: make the proof with --checkpoint")
    if p.root != cp.root:
        problems.append("the proof claims another root than the checkpoint signs")
    if p.submitter is not None and not 1 <= len(p.submitter) <= 256:
        problems.append("the proof names a submitter of an impossible length")
    leaf = leaf_hash(ledger_entry(p.entry, p.submitter))
    if leaf != p.leaf_hash:
        problems.append("the entry does not hash to the proof's leaf hash")
    if not verify_inclusion(p.log_index, cp.tree_size, leaf, p.path, cp.root):
        problems.append(f"the audit path does not lead from entry {p.log_index} to the signed "
                        f"root of size {cp.tree_size}")
    try:
        message = decode_message(p.entry)
    except MessageError as exc:
        problems.append(f"the entry is not a message: {exc}")
        return
    result.entry = msgspec.to_builtins(message)
    result.submitter = p.submitter
    what = type(message).__struct_config__.tag
    subject = getattr(message, "attempt_id", None) or message.message_id
    url = getattr(message, "url", None)
    by = f", submitted by worker host {p.submitter!r}," if p.submitter else ""
    result.statement = (f"{what} {subject}{f' ({url})' if url else ''}{by} is entry "
                        f"{p.log_index} of log {cp.origin}, in the tree of size {cp.tree_size} "
                        f"signed at {cp.time or 'an unstated time'}")


def _check_consistency(p: ConsistencyProof, cp: SignedCheckpoint, old: SignedCheckpoint | None,
                       result: ProofCheck) -> None:
    problems = result.problems
    result.old_size = p.old_size
    if (p.new_size, p.new_root) != (cp.tree_size, cp.root):
        problems.append(f"the proof ends at size {p.new_size}, the checkpoint signs size "
                        f"{cp.tree_size} (or another root)")
    if old is not None:
        if old.origin != cp.origin:
            problems.append("the two checkpoints are of different logs")
        if (p.old_size, p.old_root) != (old.tree_size, old.root):
            problems.append(f"the proof starts at size {p.old_size}, the old checkpoint signs "
                            f"size {old.tree_size} (or another root)")
    if p.old_size == 0 and p.old_root != EMPTY_ROOT:
        problems.append("the old root of an empty tree must be the empty-tree hash")
    if not verify_consistency(p.old_size, cp.tree_size, p.old_root, cp.root, p.path):
        problems.append(f"the proof does not show size {p.old_size} is a prefix of the signed "
                        f"tree of size {cp.tree_size}")
    pinned = "the older signed checkpoint" if old is not None else (
        f"root {p.old_root.hex()} (compare it with a root you hold)")
    result.statement = (f"log {cp.origin} at size {p.old_size}, {pinned}, is a prefix of the "
                        f"tree of size {cp.tree_size} signed at {cp.time or 'an unstated time'}")
