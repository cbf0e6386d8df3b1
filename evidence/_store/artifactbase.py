"""What the artifact stores share: the payload limits, the one OSError -> ArtifactError
boundary, a payload taken in chunks, and ``check_each`` as one ``check`` per ref.

The file store (``artifacts.py``) and the packs (``packs.py`` and its parts) read and
write files: every OSError they meet is translated into ``ArtifactError`` at one boundary,
``_os_errors``, with the original kept as ``__cause__`` and a hint for the errno (ENOENT on
a referenced artifact is ``ArtifactMissingError``). A put takes bytes, an iterable of bytes
or a binary file, type-checked before any file exists (``_chunks``). The S3 store shares
only ``check_one_by_one``.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from .._errors import ArtifactCorruptError, ArtifactError, ArtifactMissingError
from .._model.refs import ArtifactRef

__all__ = ["CHUNK_SIZE", "DEFAULT_MAX_PAYLOAD", "check_one_by_one", "exists_by_check", "usage_of"]

DEFAULT_MAX_PAYLOAD = 256 * 1024 * 1024
CHUNK_SIZE = 1024 * 1024
_READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


_HINTS = {
    errno.ENOSPC: "free disk space on the artifact volume, then retry",
    getattr(errno, "EDQUOT", -1): "free disk space or raise the quota on the artifact volume",
    errno.EACCES: "check that this process may read and write the artifact directory",
    errno.EPERM: "check that this process may read and write the artifact directory",
    errno.EROFS: "the artifact volume is read-only; remount it read-write",
    errno.EMFILE: "too many open files; raise the file descriptor limit",
    errno.ENFILE: "too many open files system-wide; raise the limit",
}


class _os_errors:  # a class, not @contextmanager: entered eight times per put
    """The one OSError -> ArtifactError boundary. ENOENT on a referenced artifact is 'missing'.

    ``with _os_errors("fsync directory", path): ...`` (a put enters eight of these).
    """

    __slots__ = ("action", "enoent_hint", "path", "ref")

    def __init__(self, action: str, path: Path, *, ref: ArtifactRef | None = None,
                 enoent_hint: str | None = None) -> None:
        self.action, self.path, self.ref, self.enoent_hint = action, path, ref, enoent_hint

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if isinstance(exc, OSError):
            raise self._translate(exc) from exc

    def _translate(self, exc: OSError) -> ArtifactError:
        path, ref = self.path, self.ref
        context: dict[str, object] = {"path": path, "errno": exc.errno}
        if ref is not None:
            context.update(namespace=ref.namespace, digest=ref.digest)
        if exc.errno == errno.ENOENT and ref is not None:
            return ArtifactMissingError(
                f"artifact {ref.namespace}/{ref.digest} is not in the store (expected at {path})",
                hint="it was never stored here or was deleted; restore it or re-fetch the page",
                **context,
            )
        hint = _HINTS.get(exc.errno or 0)
        if exc.errno == errno.ENOENT and self.enoent_hint:
            hint = self.enoent_hint
        reason = exc.strerror or str(exc)
        return ArtifactError(
            f"could not {self.action} {path}: {reason}",
            hint=hint or "check the artifact volume (dmesg, fsck), then retry",
            **context,
        )


def _chunks(data: bytes | Iterable[bytes] | BinaryIO) -> Iterator[memoryview]:
    """Type-check ``data`` now (before any file exists) and return an iterator of byte views."""
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data).cast("B")
        return (view[i : i + CHUNK_SIZE] for i in range(0, len(view), CHUNK_SIZE))
    if isinstance(data, str):
        raise TypeError("put() takes bytes, an iterable of bytes or a binary file, not str")
    if hasattr(data, "read"):
        return _read_stream(data)  # type: ignore[arg-type]
    return (_as_view(chunk) for chunk in data)


def _read_stream(stream: BinaryIO) -> Iterator[memoryview]:
    while True:
        chunk = stream.read(CHUNK_SIZE)
        if chunk is None:  # a non-blocking stream with nothing ready: never truncate silently
            raise ArtifactError("put() was given a non-blocking stream that returned None")
        if not chunk:
            return
        yield _as_view(chunk)


def _as_view(chunk: object) -> memoryview:
    try:
        return memoryview(chunk).cast("B")  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"payload chunks must be bytes-like, not {type(chunk).__name__}") from None


def _subdirs(path: Path, pattern: re.Pattern[str]) -> list[str]:
    with _os_errors("list directory", path), os.scandir(path) as entries:
        return sorted(
            e.name for e in entries if pattern.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
        )


def check_one_by_one(check: Callable[[ArtifactRef], None], refs: Sequence[ArtifactRef]
                     ) -> list[ArtifactError | None]:
    """``ArtifactBackend.check_each`` by ``check`` (a store's ``check``) of each ref."""
    found: list[ArtifactError | None] = []
    for ref in refs:
        try:
            check(ref)
        except (ArtifactMissingError, ArtifactCorruptError) as exc:
            found.append(exc)
        else:
            found.append(None)
    return found


def exists_by_check(check: Callable[[ArtifactRef], None], ref: ArtifactRef) -> bool:
    """``ArtifactBackend.exists`` by ``check`` (a store's ``check``): stored with the right
    size (bytes are not re-hashed)."""
    try:
        check(ref)
    except (ArtifactMissingError, ArtifactCorruptError):
        return False
    return True


def usage_of(refs: Iterable[ArtifactRef]) -> tuple[int, int]:
    """``ArtifactBackend.usage`` from a store's ``iter_refs``: (payloads, their bytes)."""
    count = total = 0
    for ref in refs:
        count, total = count + 1, total + ref.size
    return count, total
