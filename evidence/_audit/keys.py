"""Signing keys and verifier keys of checkpoints: Ed25519, in Go's note text forms.

Keys use the Go ``golang.org/x/mod/sumdb/note`` text forms, so Go's ``note.Open`` and any
C2SP tool verify our checkpoints: ``PRIVATE+KEY+<name>+<id>+<base64(0x01 || seed)>`` and
``<name>+<id>+<base64(0x01 || public key)>``, key id = SHA-256(name || 0x0A || 0x01 ||
public key)[:4].

Separate from ``_audit.checkpoints`` (what a signed note says and how a store is matched
against one) because a key is also a witness's (``_audit.witness``, its cosigning key is
the same form with 0x04) and is written, parsed and named without any store: this module
owns the key text forms, the strict base64 they use, and signing a note's text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import unicodedata
from pathlib import Path
from typing import Self

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from .._errors import ProofError

__all__ = ["SigningKey", "VerifierKey", "private_key_fields", "write_key_pair"]

_ALG_ED25519 = 0x01
_EM_DASH = "\u2014"
_HEX8_RE = re.compile(r"[0-9a-f]{8}")


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
        name, hex_id, raw = private_key_fields(text, "create one with 'evidence keygen FILE'")
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


def private_key_fields(text: str | bytes, hint: str) -> tuple[str, str, bytes]:
    """``PRIVATE+KEY+<name>+<hex key id>+<base64(type byte || seed)>`` split into (name, hex
    key id, decoded key): a store's signing key and a witness's alike; ``hint`` says how
    to make one."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text.strip()
    if not text.startswith("PRIVATE+KEY+"):
        raise ProofError("not a private key (it should start with PRIVATE+KEY+)", hint=hint)
    name, _, rest = text.removeprefix("PRIVATE+KEY+").partition("+")
    hex_id, _, key64 = rest.partition("+")
    return name, hex_id, _b64decode(key64, "private key")


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


def _check_note_text(text: str) -> None:
    if not text.endswith("\n") or any(c < " " and c != "\n" for c in text):
        raise ProofError("a note's text must end in a newline and hold no control characters")
