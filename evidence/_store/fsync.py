"""fsync by path: the one spelling of a directory fsync (and of a file's), for every stage.

A file's bytes are durable once the file is fsynced; its *name* (a create, a rename, an
unlink) only once the directory holding it is fsynced: POSIX leaves directory entries to
the directory's own fsync, and after a power cut on ext4 or XFS a renamed file can be
back under its old name, or gone, without it. So every "write a temp file, fsync it,
rename it into place" here ends with ``fsync_dir`` of the destination's directory: the
artifact store (through ``FileOps.fsync_dir``, the seam the fault tests replace), the
store's own directory at open and resync, exports, backups, restores, WARC and WACZ
files.

A failure is raised as the ``OSError`` it is; each caller translates it at its own
boundary (``ArtifactError`` in the artifact store, ``SyncError`` when opening a store).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "fsync_file"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of the directory ``path`` durable (created, renamed, removed
    names). ``NotADirectoryError`` if ``path`` is not a directory."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Make the bytes of the file ``path`` durable (written through another handle, or by
    another program such as SQLite's backup)."""
    if Path(path).is_dir():
        raise IsADirectoryError(f"{path} is a directory: use fsync_dir")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
