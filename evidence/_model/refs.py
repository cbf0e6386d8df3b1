"""Artifact references: what messages and rows carry instead of payload bytes.

An ``ArtifactRef`` names one stored payload by namespace, BLAKE3 digest and size. It is a
pure value (no I/O): the message model carries it, and the artifact stores
(``evidence._store``) resolve it. Namespaces are validated names, never paths taken from
input, so no reference can name a file outside an artifact root.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

from .._errors import ArtifactError, NamespaceError

__all__ = ["DIGEST_RE", "NAMESPACE_RE", "ArtifactRef", "validate_digest", "validate_namespace"]

NAMESPACE_RE = re.compile(r"[a-z0-9_-]{1,32}")
DIGEST_RE = re.compile(r"[0-9a-f]{64}")
_NAMESPACE_MATCH = NAMESPACE_RE.fullmatch
_DIGEST_MATCH = DIGEST_RE.fullmatch


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def validate_namespace(ns: str) -> str:
    """Return ``ns`` if it is 1-32 characters of ``[a-z0-9_-]``; raise NamespaceError otherwise."""
    if isinstance(ns, str) and NAMESPACE_RE.fullmatch(ns):
        return ns
    raise NamespaceError(
        f"invalid artifact namespace {_short(ns)}: must be 1-32 characters of [a-z0-9_-]",
        hint="use a short lowercase name such as 'html' or 'robots'",
        namespace=ns,
    )


def validate_digest(digest: str) -> str:
    if isinstance(digest, str) and DIGEST_RE.fullmatch(digest):
        return digest
    raise ArtifactError(
        f"invalid artifact digest {_short(digest)}: must be 64 lowercase hex characters",
        hint="pass the digest from an ArtifactRef returned by put()",
        digest=digest,
    )


# ArtifactRef's own validation errors are also ValueErrors, which msgspec turns into a
# ValidationError while decoding: a bad ref inside a message is then a MessageError like any
# other field defect, while constructing one directly still raises the documented error.
class _RefNamespaceError(NamespaceError, ValueError):
    pass


class _RefFieldError(ArtifactError, ValueError):
    pass


class ArtifactRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A reference to one stored payload: what messages and rows carry instead of the bytes.

    The Meta constraints document the fields in JSON schema and reject most bad values on
    decode; ``__post_init__`` is the authority (the schema's ``$`` admits a trailing newline).
    """

    namespace: Annotated[str, msgspec.Meta(min_length=1, max_length=32, pattern="^[a-z0-9_-]+$")]
    digest: Annotated[str, msgspec.Meta(min_length=64, max_length=64, pattern="^[0-9a-f]{64}$")]
    size: Annotated[int, msgspec.Meta(ge=0)]

    def __post_init__(self) -> None:
        # The common case first, with the same tests (one call a reference: a ledger
        # decoded by verify holds one or more per message); any failure is then named.
        if (self.namespace.__class__ is str and _NAMESPACE_MATCH(self.namespace)
                and self.digest.__class__ is str and _DIGEST_MATCH(self.digest)
                and self.size.__class__ is int and self.size >= 0):
            return
        try:
            validate_namespace(self.namespace)
        except NamespaceError as exc:
            raise _RefNamespaceError(str(exc), hint=exc.hint, **exc.context) from None
        try:
            validate_digest(self.digest)
        except ArtifactError as exc:
            raise _RefFieldError(str(exc), hint=exc.hint, **exc.context) from None
        if type(self.size) is not int or self.size < 0:
            raise _RefFieldError(f"invalid artifact size {_short(self.size)}", size=self.size)
