"""Private scratch directories that do not outlive their process for long.

A rendering crawl needs a directory of its own for each browser it starts (Chromium's
``--user-data-dir``: cookies, cache, the browser's log). Closing the browser removes it;
a crawl killed with SIGKILL (or by the OOM killer, or a power cut) cannot, and a profile
may hold what the crawled sites set (cookies, storage). So whoever makes the next one first
removes the ones whose owner is gone.

Who owns a directory is told by a lock, not by a process id: the owner holds an exclusive
``flock`` on the file ``owner.lock`` inside it for as long as it lives, and the kernel
releases that lock however the process ends. A directory whose lock can be taken has no
owner and is removed. The lock file gets its name only once it is locked (it is created
under another name and renamed), so a directory being made right now is never taken for a
stale one, and a directory without the file (one made by an older version, or another
program's) is left alone. A process id would be wrong twice: ids are reused, and a crawl
in another PID namespace (a container sharing ``/tmp``) is invisible to ``kill(pid, 0)``.
Only the user's own directories are considered.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path

__all__ = ["ScratchDir", "remove_stale"]

log = logging.getLogger("evidence.crawl")

_LOCK = "owner.lock"


class ScratchDir:
    """A new private directory (mode 0700) under the temporary directory, held by this
    process until ``remove()``; stale ones with the same prefix are removed first."""

    def __init__(self, prefix: str) -> None:
        remove_stale(prefix)
        self.path = Path(tempfile.mkdtemp(prefix=prefix))  # mode 0700
        making = self.path / f".{_LOCK}"
        self._lock = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # fresh: nobody else can hold it yet
        os.rename(making, self.path / _LOCK)

    def remove(self) -> None:
        if self._lock < 0:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)  # after the removal: until then the directory is ours
        self._lock = -1


def remove_stale(prefix: str, directory: str | None = None) -> list[Path]:
    """Remove this user's directories named ``prefix*`` (in ``directory``, by default the
    temporary directory) whose owner is gone; the paths removed."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(directory or tempfile.gettempdir()) as it:
        for entry in it:
            if entry.name.startswith(prefix) and _unowned(entry):
                removed.append(Path(entry.path))
    return removed


def _unowned(entry: os.DirEntry[str]) -> bool:
    """Remove ``entry`` if it is a directory of ours whose owner's lock is free."""
    try:
        if not entry.is_dir(follow_symlinks=False) or \
                entry.stat(follow_symlinks=False).st_uid != os.getuid():
            return False
        fd = os.open(os.path.join(entry.path, _LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # not a directory of this scheme, or gone already
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its owner is alive
        log.info("removing %s: left by a process that ended without removing it", entry.path,
                 extra={"event": "scratch.removed"})
        shutil.rmtree(entry.path, ignore_errors=True)
        return True
    finally:
        os.close(fd)
