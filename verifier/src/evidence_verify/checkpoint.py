"""Checkpoints: a C2SP signed note (c2sp.org/signed-note) holding a C2SP tlog-checkpoint.

    evidence/store-0190c1d2...      origin: "evidence/" and the store's id
    1234                            the tree size
    3q2+7w...=                      the root hash, base64
    time 2026-03-03T12:00:00Z       extension lines (any number: the signed time, and what
    ...                             later versions add), all covered by the signature
                                    a blank line
    — name AbCd...==                signatures: em dash, key name, base64(key id || sig)

The operator's key is given as ``<name>+<8 hex digits key id>+<base64(0x01 || Ed25519
public key)>`` (Go's note verifier form; ``KEY.pub`` from ``evidence keygen``). The key id
is SHA-256(name || "\\n" || 0x01 || public key)[:4]. The signature is checked over the whole
signed body exactly as it is (every line before the blank line, each ending in a newline),
so extension lines added by any version are covered; they are reported, and each one this
version knows how to check is checked by a function in ``EXTENSION_CHECKS``.

Other signatures on the note (witnesses' cosignatures, another key of the operator) are
listed, and checking them is ``COSIGNATURE_CHECKS``' job: both tables are where the checks
of trusted time and of witnesses plug in.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from .errors import VerifyError
from .verdict import Verdict

_EM_DASH = "\u2014"
_SIZE = re.compile(r"0|[1-9][0-9]{0,19}")
_HEX8 = re.compile(r"[0-9a-f]{8}")


@dataclass(frozen=True)
class VerifierKey:
    name: str
    key_id: int
    public: bytes  # 32 bytes, Ed25519

    @classmethod
    def parse(cls, text: str) -> VerifierKey:
        name, _, rest = text.strip().partition("+")
        hex_id, _, encoded = rest.partition("+")
        if not name or not _HEX8.fullmatch(hex_id):
            raise VerifyError("not a note verifier key: expected <name>+<8 hex digits>+<base64>",
                              hint="give the KEY.pub file the operator published")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise VerifyError("the key's base64 does not decode") from None
        if len(raw) != 33 or raw[0] != 0x01:
            raise VerifyError("not an Ed25519 note key (0x01 followed by 32 bytes)")
        public = raw[1:]
        key_id = int.from_bytes(hashlib.sha256(name.encode() + b"\n\x01" + public)
                                .digest()[:4], "big")
        if f"{key_id:08x}" != hex_id:
            raise VerifyError(f"the key id {hex_id} does not match its name and key "
                              f"(computed {key_id:08x}): the key text was altered")
        return cls(name, key_id, public)

    @classmethod
    def read(cls, path: str | Path) -> VerifierKey:
        try:
            return cls.parse(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise VerifyError(f"cannot read the public key {path}: {exc.strerror}",
                              hint="give the KEY.pub file the operator published") from None

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True

    def __str__(self) -> str:
        return f"{self.name}+{self.key_id:08x}"


@dataclass(frozen=True)
class Signature:
    name: str
    key_id: int
    signature: bytes


@dataclass
class Checkpoint:
    body: str  # the signed text, ending in a newline
    origin: str
    tree_size: int
    root: bytes
    extensions: list[str]
    signatures: list[Signature]
    time: str | None = None
    verified_by: str | None = None  # the key that signed it, once open_checkpoint checked it
    extras: dict[str, object] = field(default_factory=dict)  # what extension checks found

    @property
    def store_id(self) -> str:
        return self.origin.removeprefix("evidence/")


def parse_checkpoint(data: bytes | str) -> Checkpoint:
    """Parse strictly; no signature is checked here."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise VerifyError("the checkpoint is not UTF-8 text") from None
    if any(c < " " and c != "\n" for c in data):
        raise VerifyError("the checkpoint holds control characters")
    cut = data.rfind("\n\n")
    if cut < 0 or not data.endswith("\n"):
        raise VerifyError("not a signed note: no blank line before the signatures")
    body, block = data[:cut + 1], data[cut + 2:]
    signatures = []
    for line in block[:-1].split("\n"):
        name, _, encoded = line.removeprefix(_EM_DASH + " ").partition(" ")
        if not line.startswith(_EM_DASH + " ") or not name or " " in encoded:
            raise VerifyError(f"malformed signature line {line[:80]!r}")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise VerifyError(f"a signature of {name} does not decode") from None
        if len(raw) < 5:
            raise VerifyError(f"a signature of {name} is too short")
        signatures.append(Signature(name, int.from_bytes(raw[:4], "big"), raw[4:]))
    lines = body[:-1].split("\n")
    if len(lines) < 3 or not all(lines):
        raise VerifyError("a checkpoint has an origin, a size, a root, and no empty line")
    origin, size, encoded_root, *extensions = lines
    if not _SIZE.fullmatch(size):
        raise VerifyError(f"bad tree size {size[:30]!r}")
    try:
        root = base64.b64decode(encoded_root, validate=True)
    except (binascii.Error, ValueError):
        raise VerifyError("the root hash does not decode") from None
    if len(root) != 32:
        raise VerifyError(f"the root hash is {len(root)} bytes, not 32")
    times = [e[5:] for e in extensions if e.startswith("time ")]
    return Checkpoint(body=body, origin=origin, tree_size=int(size), root=root,
                      extensions=extensions, signatures=signatures,
                      time=times[0] if len(times) == 1 else None)


def open_checkpoint(data: bytes | str, key: VerifierKey) -> Checkpoint:
    """Parse and check ``key``'s signature over the whole body: ``VerifyError`` if it is
    missing or does not verify (a signature that claims the key's name and id and fails
    rejects the checkpoint, as C2SP signed-note says)."""
    cp = parse_checkpoint(data)
    ours = [s for s in cp.signatures if (s.name, s.key_id) == (key.name, key.key_id)]
    if not ours:
        raise VerifyError(f"the checkpoint is not signed by {key}",
                          hint="check that you hold the operator's public key for this store")
    for signature in ours:
        if not key.verify(signature.signature, cp.body.encode("utf-8")):
            raise VerifyError(f"the signature by {key} does not verify: the checkpoint was "
                              "altered, or signed by another key of that name")
    cp.verified_by = str(key)
    return cp


# Checks of extension lines, by the line's first word: each gets the checkpoint, the line
# and the verdict, and adds facts, notes or problems. "time" is the signer's clock (a
# fact, not a proof); checks of trusted time and of the commit-log head go here.
ExtensionCheck = Callable[[Checkpoint, str, Verdict], None]
# Checks of other signatures (witness cosignatures): each gets the checkpoint, the
# signature and the verdict.
CosignatureCheck = Callable[[Checkpoint, Signature, Verdict], None]


def _time_line(cp: Checkpoint, line: str, verdict: Verdict) -> None:
    verdict.facts["signed_at"] = line[5:]
    verdict.notes.append(f"signed at {line[5:]} by the signer's own clock: a signed claim, "
                         "not a trusted time")


def bound(cp: Checkpoint, name: str) -> tuple[int, bytes] | None:
    """The extension line ``<name> <number> <base64(32 bytes)>`` (``chain``: the last batch
    and its chain hash; ``legacy-quarantine``: a row count and their SHA-256), or None;
    ``VerifyError`` when it is there more than once or malformed."""
    found = [e for e in cp.extensions if e.split(" ", 1)[0] == name]
    if not found:
        return None
    parts = found[0].split(" ")
    if len(found) > 1 or len(parts) != 3 or not _SIZE.fullmatch(parts[1]):
        raise VerifyError(f"malformed or repeated {name!r} line in the checkpoint")
    try:
        digest = base64.b64decode(parts[2], validate=True)
    except (binascii.Error, ValueError):
        raise VerifyError(f"the {name} hash does not decode") from None
    if len(digest) != 32:
        raise VerifyError(f"the {name} hash is {len(digest)} bytes, not 32")
    return int(parts[1]), digest


def _chain_line(cp: Checkpoint, line: str, verdict: Verdict) -> None:
    seq, digest = bound(cp, "chain") or (0, b"")
    verdict.facts["chain"] = {"batch": seq, "hash": digest.hex()}
    verdict.notes.append(f"binds the commit-log chain through batch {seq} (every commit "
                         "time, quarantine record and the store's id): checked against an "
                         "archive of the store (evidence-verify archive)")


def _legacy_line(cp: Checkpoint, line: str, verdict: Verdict) -> None:
    count, digest = bound(cp, "legacy-quarantine") or (0, b"")
    verdict.facts["legacy_quarantine"] = {"rows": count, "hash": digest.hex()}


EXTENSION_CHECKS: dict[str, ExtensionCheck] = {"time": _time_line, "chain": _chain_line,
                                               "legacy-quarantine": _legacy_line}
COSIGNATURE_CHECKS: list[CosignatureCheck] = []


def check_checkpoint(data: bytes | str, key: VerifierKey, subject: str = "checkpoint"
                     ) -> tuple[Verdict, Checkpoint | None]:
    """The verdict on a checkpoint and, when its signature verifies, the checkpoint."""
    verdict = Verdict("checkpoint", subject)
    try:
        cp = open_checkpoint(data, key)
    except VerifyError as exc:
        verdict.problem(str(exc))
        return verdict.finish(), None
    verdict.facts |= {"origin": cp.origin, "tree_size": cp.tree_size, "root": cp.root.hex(),
                      "key": cp.verified_by}
    for line in cp.extensions:
        check = EXTENSION_CHECKS.get(line.split(" ", 1)[0])
        if check is not None:
            try:
                check(cp, line, verdict)
            except VerifyError as exc:
                verdict.problem(str(exc))
        else:
            verdict.notes.append(f"extension line {line[:60]!r} is covered by the signature; "
                                 "this version does not interpret it")
    others = [s for s in cp.signatures if (s.name, s.key_id) != (key.name, key.key_id)]
    for signature in others:
        if not COSIGNATURE_CHECKS:
            verdict.notes.append(f"another signature, by {signature.name}: checked only "
                                 "when its key is named (--witness-key)")
        for cosign in COSIGNATURE_CHECKS:
            cosign(cp, signature, verdict)
    return verdict.finish(), cp
