"""One crawl per store at a time, and a way to ask it to stop.

A running crawl holds an exclusive ``flock`` on ``STORE/crawl.lock`` and has written its
pid there. The lock is released by the kernel when the process dies, however it dies, so a
stale file never blocks the next crawl. ``stop`` signals the pid only while the lock is
held, so it cannot signal an unrelated process that reused a dead crawler's pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from .._errors import EvidenceError

__all__ = ["LOCK_NAME", "crawl_lock", "running_pid", "stop"]

LOCK_NAME = "crawl.lock"


@contextlib.contextmanager
def crawl_lock(store_path: Path) -> Iterator[None]:
    path = Path(store_path) / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise EvidenceError(
                f"{store_path}: another crawl (pid {pid}) is running on this store",
                hint=f"wait for it, or stop it with 'evidence stop {store_path}'",
                path=str(store_path)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def running_pid(store_path: Path) -> int | None:
    """The pid of the crawl holding the store's lock, or None when no crawl runs."""
    try:
        fd = os.open(Path(store_path) / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def stop(store_path: Path, *, sig: int = signal.SIGTERM) -> int | None:
    """Ask the crawl running on ``store_path`` to stop; its pid, or None if none runs.

    A path that is not a store directory is an error (not "nothing runs"): a mistyped path
    must not look like a crawl that already ended.
    """
    root = Path(store_path)
    if not (root / "evidence.db").is_file():
        raise EvidenceError(f"{root} is not an evidence store"
                            + (" (it is a file)" if root.is_file() else ""),
                            hint="give the store directory the crawl writes to, as in "
                            "'evidence crawl URL --store DIR'", path=str(root))
    path = root / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: a crawl is running
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            if not text.isdigit():
                raise EvidenceError(f"{path}: the running crawl has not written its pid yet",
                                    hint="try again in a moment") from None
            os.kill(int(text), sig)
            return int(text)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
