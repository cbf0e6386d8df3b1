"""Inclusion and consistency proofs (JSON documents from ``evidence prove``), checked
against a checkpoint the operator's key signed.

The tree size and root are always the *checkpoint's*: a proof carries its own copies, but
an inclusion path alone does not bind the size it was made for, so a proof is checked only
against a signed (size, root). An inclusion proof carries the ledger entry itself (its
canonical msgpack bytes): its leaf hash is recomputed, walked up the audit path, and must
reach the signed root. A consistency proof shows that an older tree is a prefix of the
signed one; with the older signed checkpoint (``old_checkpoint``) both ends are signed.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from . import msgpack
from .checkpoint import VerifierKey, check_checkpoint
from .merkle import EMPTY_ROOT, leaf_hash, verify_consistency, verify_inclusion
from .verdict import Verdict

PROOF_VERSION = 1


def _bytes(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{what} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not base64") from None


def check_proof(proof: bytes | str, checkpoint: bytes | str, key: VerifierKey, *,
                old_checkpoint: bytes | str | None = None, subject: str = "proof") -> Verdict:
    verdict = Verdict("proof", subject)
    signed, cp = check_checkpoint(checkpoint, key, "checkpoint")
    verdict.notes += signed.notes
    if cp is None:
        verdict.problems += signed.problems
        return verdict.finish()
    verdict.facts |= signed.facts
    old = None
    if old_checkpoint is not None:
        old_verdict, old = check_checkpoint(old_checkpoint, key, "old checkpoint")
        if old is None:
            verdict.problems += [f"old checkpoint: {p}" for p in old_verdict.problems]
            return verdict.finish()
    try:
        doc = json.loads(proof)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        kind = doc.get("type")
        if doc.get("version") != PROOF_VERSION:
            verdict.problem(f"unknown proof version {doc.get('version')!r}")
        if doc.get("origin") != cp.origin:
            verdict.problem(f"the proof is for log {doc.get('origin')!r:.100}, the checkpoint "
                            f"for {cp.origin!r}")
        path = [_bytes(p, "a path hash") for p in doc.get("path", [])]
        verdict.facts["type"] = kind
        if kind == "inclusion":
            _inclusion(doc, path, cp, verdict)
        elif kind == "consistency":
            _consistency(doc, path, cp, old, verdict)
        else:
            verdict.problem(f"not an inclusion or consistency proof (type {kind!r:.40})")
    except (ValueError, TypeError, KeyError) as exc:
        verdict.problem(f"the proof cannot be read: {exc}")
    return verdict.finish()


def _inclusion(doc: dict, path: list[bytes], cp: Any, verdict: Verdict) -> None:
    index, entry = doc["log_index"], _bytes(doc["entry"], "entry")
    if doc.get("tree_size") != cp.tree_size:
        verdict.problem(f"the proof is for tree size {doc.get('tree_size')}, the checkpoint "
                        f"signs {cp.tree_size}: ask for a proof made for this checkpoint")
    leaf = leaf_hash(entry)
    if "leaf_hash" in doc and _bytes(doc["leaf_hash"], "leaf_hash") != leaf:
        verdict.problem("the entry does not hash to the proof's leaf hash")
    if not verify_inclusion(index, cp.tree_size, leaf, path, cp.root):
        verdict.problem(f"the audit path does not lead from entry {index} to the signed root "
                        f"of the tree of size {cp.tree_size}")
        return
    verdict.facts["log_index"] = index
    try:
        message = msgpack.unpack(entry)
    except (ValueError, UnicodeDecodeError) as exc:
        verdict.problem(f"the entry is not a message: {exc}")
        return
    verdict.facts["entry"] = _printable(message)
    if isinstance(message, dict):
        what = message.get("kind", "entry")
        subject = message.get("attempt_id") or message.get("message_id") or ""
        url = message.get("url")
        verdict.facts["statement"] = (
            f"{what} {subject}{f' ({url})' if url else ''} is entry {index} of log "
            f"{cp.origin}, in the tree of size {cp.tree_size} signed by {cp.verified_by}")


def _consistency(doc: dict, path: list[bytes], cp: Any, old: Any, verdict: Verdict) -> None:
    old_size, old_root = doc["old_size"], _bytes(doc["old_root"], "old_root")
    if (doc.get("new_size"), _bytes(doc.get("new_root", ""), "new_root")) != (
            cp.tree_size, cp.root):
        verdict.problem(f"the proof ends at size {doc.get('new_size')}, the checkpoint signs "
                        f"{cp.tree_size} (or another root)")
    if old is not None:
        if old.origin != cp.origin:
            verdict.problem("the two checkpoints are of different logs")
        if (old_size, old_root) != (old.tree_size, old.root):
            verdict.problem(f"the proof starts at size {old_size}, the old checkpoint signs "
                            f"{old.tree_size} (or another root)")
    if old_size == 0 and old_root != EMPTY_ROOT:
        verdict.problem("the root of an empty tree is the hash of nothing")
    if not verify_consistency(old_size, cp.tree_size, old_root, cp.root, path):
        verdict.problem(f"the proof does not show that size {old_size} is a prefix of the "
                        f"signed tree of size {cp.tree_size}")
        return
    verdict.facts |= {"old_size": old_size, "old_root": old_root.hex()}
    if old is None:
        verdict.notes.append(f"the old root {old_root.hex()} is the proof's claim: compare it "
                             "with a root you obtained earlier, or give --old-checkpoint")


def _printable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {str(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value
