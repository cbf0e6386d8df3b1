"""Proofs a third party can check offline: signed checkpoints, inclusion and consistency.

A **checkpoint** is a C2SP signed note (https://c2sp.org/signed-note) whose text follows
C2SP tlog-checkpoint (https://c2sp.org/tlog-checkpoint), signed with Ed25519::

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

Keys use the Go ``golang.org/x/mod/sumdb/note`` text forms, so Go's ``note.Open`` and any
C2SP tool verify our checkpoints: ``PRIVATE+KEY+<name>+<id>+<base64(0x01 || seed)>`` and
``<name>+<id>+<base64(0x01 || public key)>``, key id = SHA-256(name || 0x0A || 0x01 ||
public key)[:4].

The root binds every accepted message; the ``chain`` line binds the rest of what ``verify``
checks that is not a leaf: every batch's commit time (which the ledger's receipt times must
equal), what each batch quarantined (so every counted quarantine record), and the store's
identity (where the chain starts). Recomputing the chain after an edit, which anyone who
can write the database can do, gives another hash than the one signed: ``match_checkpoint``
finds it. Checkpoints signed before these lines existed bind the root only; they still
check, and say so.

A **proof** is a JSON document (``type`` "inclusion" or "consistency", bytes in base64).
An inclusion proof carries the ledger entry itself (its canonical msgpack bytes), so the
checker hashes the entry, walks the RFC 9162 audit path, and compares with the root the
*checkpoint* signs, at the size the *checkpoint* signs: never a size or root taken from the
proof (see ``_model.merkle``: a proof alone does not bind its tree size). A consistency proof
shows that an older tree (ideally an older checkpoint) is a prefix of the signed one.

``check_proof`` needs no store. It never raises on bad input: anything malformed, mutated
or signed by another key gives ``ok=False`` with the reasons.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import hashlib
import os
import re
import unicodedata
from pathlib import Path
from typing import Any, Self

import apsw
import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
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
from .._model.messages import decode_message, format_time, ledger_entry, utc_now
from .._store.db import Store
from .._store.log import (
    GENESIS_HASH,
    Head,
    check_log,
    has_column,
    identity_bound,
    identity_genesis,
)
from .._store.quarantine import legacy_rows

__all__ = [
    "CheckpointMatch",
    "ConsistencyProof",
    "InclusionProof",
    "Proof",
    "ProofCheck",
    "SignedCheckpoint",
    "SigningKey",
    "VerifierKey",
    "check_proof",
    "checkpoint",
    "decode_proof",
    "encode_proof",
    "match_checkpoint",
    "open_checkpoint",
    "parse_checkpoint",
    "prove_consistency",
    "prove_inclusion",
    "write_key_pair",
]

ORIGIN_PREFIX = "evidence/"
CHAIN_LINE = "chain"  # extension line: <last batch> <base64(recomputed chain hash)>
LEGACY_LINE = "legacy-quarantine"  # extension line: <rows> <base64(SHA-256 of them)>
PROOF_VERSION = 1
_ALG_ED25519 = 0x01
_EM_DASH = "\u2014"
_MAX_SIGNATURES = 100
_SIZE_RE = re.compile(r"0|[1-9][0-9]{0,19}")
_HEX8_RE = re.compile(r"[0-9a-f]{8}")


# --- keys ----------------------------------------------------------------------------

def _check_key_name(name: str) -> str:
    bad = (not name or "+" in name
           or any(c.isspace() or unicodedata.category(c) in ("Cc", "Zs") for c in name))
    if bad:
        raise ProofError(f"invalid key name {name!r}: it must be non-empty, without spaces "
                         "or '+'", hint="use a schema-less URL such as example.com/evidence")
    return name


def _key_id(name: str, public: bytes, alg: int = _ALG_ED25519) -> int:
    digest = hashlib.sha256(name.encode() + b"\n" + bytes([alg]) + public).digest()
    return int.from_bytes(digest[:4], "big")


def _b64decode(text: str, what: str) -> bytes:
    """Strict standard base64: the text must be the canonical encoding of what it decodes to."""
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ProofError(f"{what} is not valid base64") from None
    if base64.b64encode(data).decode() != text:
        raise ProofError(f"{what} is not canonical base64")
    return data


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class VerifierKey:
    """An Ed25519 public key with its note name and key id. ``ALG`` is the signature type
    byte of its text form and key id (0x01, a note signature; a witness's cosignature key,
    ``_audit.witness.CosignerKey``, is the same with 0x04)."""

    __slots__ = ("key_id", "name", "public")
    ALG = _ALG_ED25519
    _NOT_OURS: tuple[str, str | None] = (
        "public key is not an Ed25519 note key (0x01 || 32 bytes)", None)

    def __init__(self, name: str, public: bytes) -> None:
        self.name = _check_key_name(name)
        if len(public) != 32:
            raise ProofError(f"an Ed25519 public key is 32 bytes, not {len(public)}")
        self.public = bytes(public)
        self.key_id = _key_id(name, self.public, self.ALG)

    @classmethod
    def from_text(cls, text: str | bytes) -> Self:
        """Parse ``<name>+<hex key id>+<base64(0x01 || key)>`` (Go's verifier key form)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        name, _, rest = text.strip().partition("+")
        hex_id, _, key64 = rest.partition("+")
        if not _HEX8_RE.fullmatch(hex_id):
            raise ProofError("malformed public key: expected <name>+<8 hex digits>+<base64>")
        raw = _b64decode(key64, "public key")
        if len(raw) != 33 or raw[0] != cls.ALG:
            raise ProofError(cls._NOT_OURS[0], hint=cls._NOT_OURS[1])
        key = cls(name, raw[1:])
        if f"{key.key_id:08x}" != hex_id:
            raise ProofError(f"public key id {hex_id} does not match its name and key "
                             f"(computed {key.key_id:08x})")
        return key

    def to_text(self) -> str:
        return f"{self.name}+{self.key_id:08x}+{_b64(bytes([self.ALG]) + self.public)}"

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and (self.name, self.public)
                == (other.name, other.public))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"VerifierKey({self.to_text()!r})"


class SigningKey:
    """An Ed25519 private key with its note name. ``repr`` never shows the secret."""

    __slots__ = ("_private", "name", "public_key")

    def __init__(self, name: str, seed: bytes) -> None:
        if len(seed) != 32:
            raise ProofError(f"an Ed25519 private key seed is 32 bytes, not {len(seed)}")
        self._private = Ed25519PrivateKey.from_private_bytes(seed)
        public = self._private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.name = _check_key_name(name)
        self.public_key = VerifierKey(name, public)

    @classmethod
    def generate(cls, name: str) -> SigningKey:
        return cls(name, os.urandom(32))

    @classmethod
    def from_text(cls, text: str | bytes) -> SigningKey:
        """Parse ``PRIVATE+KEY+<name>+<hex key id>+<base64(0x01 || seed)>``."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        text = text.strip()
        if not text.startswith("PRIVATE+KEY+"):
            raise ProofError("not a private key (it should start with PRIVATE+KEY+)",
                             hint="create one with 'evidence keygen FILE'")
        name, _, rest = text.removeprefix("PRIVATE+KEY+").partition("+")
        hex_id, _, key64 = rest.partition("+")
        raw = _b64decode(key64, "private key")
        if not _HEX8_RE.fullmatch(hex_id) or len(raw) != 33 or raw[0] != _ALG_ED25519:
            raise ProofError("malformed private key")
        key = cls(name, raw[1:])
        if f"{key.key_id:08x}" != hex_id:
            raise ProofError("private key id does not match its name and key")
        return key

    @property
    def key_id(self) -> int:
        return self.public_key.key_id

    def to_text(self) -> str:
        seed = self._private.private_bytes_raw()
        return f"PRIVATE+KEY+{self.name}+{self.key_id:08x}+{_b64(bytes([_ALG_ED25519]) + seed)}"

    def sign_note(self, text: str) -> str:
        """Sign ``text`` (which must end in a newline) as a C2SP note; return the whole note."""
        _check_note_text(text)
        signature = self._private.sign(text.encode())
        blob = _b64(self.key_id.to_bytes(4, "big") + signature)
        return f"{text}\n{_EM_DASH} {self.name} {blob}\n"

    def write(self, path: str | os.PathLike[str]) -> tuple[Path, Path]:
        """Write the private key (mode 0600, never over an existing file) and ``<path>.pub``."""
        return write_key_pair(path, self.to_text(), self.public_key.to_text())

    def __repr__(self) -> str:
        return f"SigningKey(name={self.name!r}, key_id={self.key_id:08x})"


def write_key_pair(path: str | os.PathLike[str], private: str,
                   public: str) -> tuple[Path, Path]:
    """A private key's text at ``path`` (mode 0600, never over an existing file) and its
    public key's at ``<path>.pub``: a store's signing key and a witness's alike."""
    path = Path(path)
    public_path = path.with_name(path.name + ".pub")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ProofError(f"{path} already exists; a key is never overwritten",
                         hint="choose another file name", path=str(path)) from None
    with os.fdopen(fd, "w") as f:
        f.write(private + "\n")
    public_path.write_text(public + "\n")
    return path, public_path


# --- signed notes and checkpoints ----------------------------------------------------

def _check_note_text(text: str) -> None:
    if not text.endswith("\n") or any(c < " " and c != "\n" for c in text):
        raise ProofError("a note's text must end in a newline and hold no control characters")


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
