"""An I/O error that does not name its operation is a possible fsync failure (issue 30
point 7; docs/design.md, "After a failed fsync, reads are not evidence").

A Python VFS (an encryption or compression shim, a test VFS) that raises ``apsw.IOError``
itself hands SQLite a bare ``SQLITE_IOERR``, and apsw raises that same exception at the
COMMIT: it has no extended code at all. Here the simulated disk's VFS is wrapped so that
each of its errors arrives that way, and the disk fails the sync of a COMMIT: the writer
must not read its commit back from the page cache and ack it (before the fix: 10 of 10
such acks were lost in a power-cut trial), but stop, mark the store and resync at the
next open, as for ``SQLITE_IOERR_FSYNC``.
"""

from __future__ import annotations

import anyio
import apsw
import pytest

from evidence import FetchAttempt, SyncError
from evidence._store.resync import is_sync_failure
from evidence.testing.disk import CrashVFS, Fault, open_store

from .test_faults import FIXED_TIME, Rig, assert_clean, fast_dir, setup_messages, submit  # noqa: F401


class BareErrorVFS(CrashVFS):
    """The simulated disk's VFS, raising each I/O error as a shim would: a new
    ``apsw.IOError`` with a message and no extended code."""

    def fail(self, op, path, offset=0, length=0):  # type: ignore[no-untyped-def]
        try:
            super().fail(op, path, offset, length)
        except apsw.IOError:
            raise apsw.IOError(f"the device failed ({op})") from None


def test_an_io_error_without_an_extended_code_counts_as_a_failed_fsync() -> None:
    assert is_sync_failure(apsw.IOError("no code"))
    assert not is_sync_failure(apsw.FullError("disk full"))
    write_error = apsw.IOError("write")
    write_error.extendedresult = apsw.SQLITE_IOERR_WRITE  # type: ignore[attr-defined]
    assert not is_sync_failure(write_error)


def test_a_commit_whose_sync_fails_without_a_code_is_not_acked_and_the_store_resyncs(
        fast_dir) -> None:  # noqa: F811
    rig = Rig(fast_dir)
    try:
        assert rig.vfs is not None and rig.store is not None
        rig.store.close()  # reopened through the shim's VFS
        rig.vfs.unregister()
        rig.vfs = BareErrorVFS(f"bare-{id(rig):x}", disk=rig.disk)
        rig.store = open_store(rig.path, rig.vfs, rig.disk, rig.sync)
        anyio.run(submit, rig.store, setup_messages())
        attempt = FetchAttempt(message_id="b-1", attempt_id="b-a1", run_id="r1",
                               url="http://example.com/b", sequence=0, started_at=FIXED_TIME,
                               elapsed_ms=1.0, outcome="timeout")
        rig.disk.arm(Fault(action="io_error", at=1, ops=frozenset({"sync"}), persistent=True))
        try:
            acks = anyio.run(submit, rig.store, [attempt])
        except BaseException as exc:
            errors = _leaves(exc)
        else:
            pytest.fail(f"acked from the page cache after its sync failed: {acks}")
        assert SyncError in {type(e) for e in errors}, errors
        marker = rig.path / "sync-failed"
        assert "the device failed (sync)" in marker.read_text()
        rig.disk.arm(None)  # the device works again: the next open resyncs first
        store = rig.reopen()
        assert not marker.exists()
        [ack] = anyio.run(submit, store, [attempt])
        assert ack.status in ("committed", "duplicate")
        with rig.crash() as crashed:
            ledger = {m for (m,) in crashed.connection.execute(
                "SELECT message_id FROM ingest_ledger")}
            assert "b-1" in ledger
            assert_clean(crashed)
    finally:
        rig.close()


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]
