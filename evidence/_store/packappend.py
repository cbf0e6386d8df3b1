"""Appending to packs: puts, batches, rotation and group-commit syncs (``PackAppend``).

Each process that puts has one *active* pack: it created it, holds an exclusive ``flock``
on it while it lives, and is the only one ever to append to it. A put hashes the payload
(BLAKE3), returns at once if the digest is already indexed (dedup), and otherwise appends
one record (header and payload in one write) without an fsync. ``sync(refs)`` fsyncs each
pack holding a listed payload once, however many payloads it holds and however many
threads ask at the same time (group commit). A pack reaching ``pack_bytes`` is sealed on a
thread of its own while the puts go on in the next pack, created ahead on another thread
once the active one is half full. An fsync that fails poisons its pack in this process
(``_poison``; ``_store/packs.py`` has the whole rule).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import blake3

from .._errors import (
    ArtifactError,
    ArtifactMissingError,
    PayloadTooLargeError,
)
from .._model.refs import ArtifactRef, validate_namespace
from . import packfile as pf
from .artifactbase import _chunks, _os_errors
from .packindex import (
    _FAILED_LIST,
    _PAGE,
    Location,
    _digest_bytes,
    _now_ms,
    _Pack,
)
from .packrecovery import PackRecovery, _append_line

log = logging.getLogger("evidence.store")

__all__ = ["BATCH_BYTES", "BATCH_RECORDS", "TOUCH_AFTER_MS", "WRITEBACK_BYTES", "PackAppend"]

# A put of content already stored appends a touch record (so reclaim's grace period counts
# from the latest put) when the stored copy was last put longer ago than this.
TOUCH_AFTER_MS = 60_000
# The appender hands what it wrote to the kernel's writeback every this many bytes
# (``FileOps.start_writeback``): of 128 KiB, 256 KiB and 1 MiB, 1 MiB measured fastest in
# the put stream of tools/bench_packs.py (the hint costs ~0.1 ms a call).
WRITEBACK_BYTES = 1024 * 1024
# Puts inside ``PackStore.batch()`` are held and appended together, in one ``writev`` for up
# to this many bytes or records (two buffers a record: within Linux's IOV_MAX of 1024). One
# system call per record cost more than BLAKE3 of the payload in the put stream of
# tools/bench_packs.py (docs/benchmarks.md); a payload larger than this is written alone.
BATCH_BYTES = 1024 * 1024
BATCH_RECORDS = 256
# A new pack's file removed by another process's recovery before it was locked is created
# again under a new name; so many times in a row means something else removes them.
_CREATE_TRIES = 5

# A record to append: (kind, namespace, digest, payload, payload length, time ms).
_Record = tuple[int, str, bytes, bytes | memoryview, int, int]


class _Held:
    """The records a thread's ``batch()`` holds until it writes them."""

    __slots__ = ("error", "keys", "records", "size")

    def __init__(self) -> None:
        self.records: list[_Record] = []
        self.keys: set[tuple[str, bytes]] = set()  # held already: a put again holds nothing
        self.size = 0  # bytes held
        self.error: ArtifactError | None = None  # a write of this batch failed


class PackAppend(PackRecovery):
    """Writing a pack store (see the module's docstring)."""

    # --- writing ----------------------------------------------------------------------

    def put(self, namespace: str, data: bytes | Iterable[bytes] | BinaryIO) -> ArtifactRef:
        """Store ``data``; return its ref. Durable once ``sync`` returned for the ref."""
        if namespace not in self._namespaces:  # checked once per name: a put is hot
            validate_namespace(namespace)
            self._namespaces.add(namespace)
        if self.read_only or self._closed:
            raise ArtifactError(f"artifact store {self.root} was opened read-only" if
                                self.read_only else f"artifact store {self.root} is closed",
                                hint="open the store for writing to store payloads",
                                path=self.root)
        if type(data) is bytes or isinstance(data, bytearray | memoryview):
            payload = data if type(data) is bytes else memoryview(data).cast("B")
            size = len(payload)
            if size > self.max_payload:
                raise self._too_large(namespace, size)
            digest = blake3.blake3(payload).digest()
            loc = self._get(namespace, digest)
            if loc is None or not self._known(namespace, digest, size, loc):
                held = getattr(self._local, "held", None)
                if held is not None and size <= BATCH_BYTES:
                    self._hold(held, namespace, digest, payload, size)
                else:
                    with self._append:
                        if self._get(namespace, digest) is None:  # else another thread
                            self._write_record(pf.PAYLOAD, namespace, digest, payload,
                                               size, int(self.clock() * 1000))
            return ArtifactRef(namespace, digest.hex(), size)
        return self._put_stream(namespace, _chunks(data))

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Puts of this thread inside the block are appended together: held (bytes by
        reference, other buffers copied), then written in one ``writev`` per MiB (or 256
        records) and when the block ends. Their refs can be read and synced once the
        block has ended; this thread's ``sync`` or read of one inside it writes what is
        held first. If any of those writes fails, the block raises that error (however it
        ends) and its refs are not to be referenced: some may be stored, as orphans. A
        block that raises drops what it still holds. Nested blocks are one block. Other
        processes (a writer syncing what a worker process put) see nothing held: end the
        block before handing its refs on."""
        if getattr(self._local, "held", None) is not None:
            yield  # inside another block of this thread: that one writes
            return
        held = self._local.held = _Held()
        try:
            yield
            if held.records:
                self._write_held(held)
        finally:
            self._local.held = None
        if held.error is not None:
            raise held.error

    def _hold(self, held: _Held, namespace: str, digest: bytes,
              payload: bytes | memoryview, size: int) -> None:
        key = (namespace, digest)
        if key in held.keys:
            return
        if type(payload) is not bytes:
            payload = bytes(payload)  # the caller may change its buffer once put returns
        held.keys.add(key)
        held.records.append((pf.PAYLOAD, namespace, digest, payload, size, _now_ms(self.clock)))
        held.size += pf.RECORD_SIZE + size
        if held.size >= BATCH_BYTES or len(held.records) >= BATCH_RECORDS:
            self._write_held(held)

    def _write_held(self, held: _Held) -> None:
        """Append what ``held`` holds; on failure remember the error for the block's end."""
        records, held.records, held.size = held.records, [], 0
        held.keys.clear()  # indexed once written
        if self._closed:
            held.error = held.error or ArtifactError(
                f"artifact store {self.root} was closed inside a batch of puts",
                hint="end the batch before closing the store", path=self.root)
            raise held.error
        with self._append:
            try:
                self._append_records(records)
            except ArtifactError as exc:
                held.error = held.error or exc
                raise

    def _write_own_held(self) -> None:
        """Write what this thread's batch holds (a sync or read of its refs comes)."""
        held = getattr(self._local, "held", None)
        if held is not None and held.records:
            self._write_held(held)

    def import_payload(self, namespace: str, data: bytes, *, put_time: float) -> ArtifactRef:
        """Append ``data`` with ``put_time`` (seconds since the epoch) as when it was put:
        a payload file being converted keeps its age (``_store/convert.py``)."""
        validate_namespace(namespace)
        view = memoryview(data).cast("B")
        digest = blake3.blake3(view).digest()
        when = int(put_time * 1000)
        with self._append:
            if self._get(namespace, digest) is None:
                self._write_record(pf.PAYLOAD, namespace, digest, view, view.nbytes, when)
        return ArtifactRef(namespace, digest.hex(), view.nbytes)

    def holds(self, ref: ArtifactRef) -> bool:
        """Whether a pack holds ``ref`` (as far as this process knows; no file is read)."""
        loc = self._get(ref.namespace, _digest_bytes(ref))
        return loc is not None and loc[2] == ref.size

    def verify_packed(self, ref: ArtifactRef) -> None:
        """Re-hash ``ref`` in its pack, which must be sealed (a payload file of a
        conversion does not count): raise ``ArtifactMissingError`` or
        ``ArtifactCorruptError`` otherwise."""
        loc = self._locate(ref)
        if loc is None or not self._packs[loc[0]].sealed:
            raise self._missing(ref)
        self.verify(ref)

    def _known(self, namespace: str, digest: bytes, size: int, loc: Location) -> bool:
        """Whether the content at ``loc`` (the index's entry for it) is stored already (a
        put again touches it, if it is old)."""
        if loc[2] != size or loc[0] not in self._packs:
            return False
        now = _now_ms(self.clock)
        last = max(loc[3], self._touched.get((namespace, digest), 0))
        if now - last > TOUCH_AFTER_MS:
            with self._append:
                self._write_record(pf.TOUCH, namespace, digest, b"", 0, now)
            with self._lock:
                key = (namespace, digest)
                self._touched[key] = max(self._touched.get(key, 0), now)
        return True

    def _write_record(self, kind: int, namespace: str, digest: bytes,
                      payload: memoryview | bytes, length: int, when: int) -> None:
        """Append one whole record; the caller holds ``_append``."""
        self._append_records(((kind, namespace, digest, payload, length, when),))

    def _append_records(self, records: Sequence[_Record]) -> None:
        """Append whole records to the active pack, as many in one write as fit in it
        (``writev`` of each header and payload: the payloads are not copied); a pack
        that would grow past ``pack_bytes`` is rotated first (a record larger than that
        gets a pack of its own). The caller holds ``_append``."""
        first, count = 0, len(records)
        while first < count:
            pack = self._active
            need = pf.RECORD_SIZE + records[first][4]
            if pack is None or pack.broken or pack.failed or (
                    pack.size + need > self.pack_bytes and pack.size > pf.FILE_HEADER_SIZE):
                pack = self._writable(need)
            fd = pack.fd
            assert fd is not None
            offset = end = pack.size
            buffers: list[bytes | memoryview] = []
            placed: list[pf.Entry] = []
            last = first
            while last < count:
                kind, namespace, digest, payload, length, when = records[last]
                if last > first and end + pf.RECORD_SIZE + length > self.pack_bytes:
                    break  # the rest go to the next pack
                buffers.append(pf.encode_record(kind, namespace, digest, length, when))
                buffers.append(payload)
                placed.append(pf.Entry(kind, namespace, digest, end, length, when))
                end += pf.RECORD_SIZE + length
                last += 1
            try:
                self._ops.writev(fd, buffers, end - offset)
            except OSError as exc:
                pack.broken = True  # a part of a record may be there: start a new pack
                raise _os_errors("append to pack", pack.path)._translate(exc) from exc
            except BaseException:
                pack.broken = True
                raise
            with self._lock:
                pack.entries.extend(placed)
                pack.size = end
                for entry in placed:
                    self._add(pack, entry)
                    if self._lost and entry.kind == pf.PAYLOAD:  # stored again: trusted
                        self._lost.pop((entry.namespace, entry.digest), None)
            if end - pack.hinted >= WRITEBACK_BYTES:
                self._start_writeback(pack, end)
            if end > self.pack_bytes >> 1 and self._spare_for != pack.no:
                self._prepare_spare(pack)
            first = last

    def _start_writeback(self, pack: _Pack, end: int) -> None:
        """Let the disk start on what was appended since the last hint (``FileOps
        .start_writeback``): the next ``sync`` of this pack then waits for less. (On a
        thread of its own, measured no faster: the call releases the GIL but has to
        take it first.)"""
        assert pack.fd is not None
        end -= end % _PAGE  # not the page still being appended to: a write into a page
        # under writeback may have to wait for it (stable pages)
        with contextlib.suppress(OSError):  # a hint: the fsync is what reports errors
            self._ops.start_writeback(pack.fd, pack.hinted, end - pack.hinted)
        pack.hinted = end

    def _put_stream(self, namespace: str, chunks: Iterator[memoryview]) -> ArtifactRef:
        """A payload of unknown size: its header is written last, in place (``pwrite``)."""
        with self._append:
            pack = self._writable(pf.RECORD_SIZE)
            assert pack.fd is not None
            start = pack.size
            hasher, size = blake3.blake3(), 0
            try:
                with _os_errors("append to pack", pack.path):
                    self._ops.write(pack.fd, bytes(pf.RECORD_SIZE))  # not a record yet
                    for chunk in chunks:
                        size += len(chunk)
                        if size > self.max_payload:
                            self._void(pack, start, size - len(chunk))
                            raise self._too_large(namespace, size)
                        hasher.update(chunk)
                        self._ops.write(pack.fd, chunk)
                    digest, now = hasher.digest(), _now_ms(self.clock)
                    self._ops.pwrite(pack.fd, pf.encode_record(
                        pf.PAYLOAD, namespace, digest, size, now), start)
            except PayloadTooLargeError:
                raise
            except BaseException:
                pack.broken = True
                raise
            entry = pf.Entry(pf.PAYLOAD, namespace, digest, start, size, now)
            with self._lock:
                pack.entries.append(entry)  # a second copy of known bytes stays a record
                pack.size = entry.end
                self._add(pack, entry)
        return ArtifactRef(namespace, digest.hex(), size)

    def _void(self, pack: _Pack, start: int, written: int) -> None:
        """A streamed put refused half-way: its bytes become a record to skip."""
        assert pack.fd is not None
        try:
            self._ops.pwrite(pack.fd, pf.encode_record(pf.VOID, "", bytes(32), written, 0),
                             start)
        except OSError:
            pack.broken = True
            return
        pack.size = start + pf.RECORD_SIZE + written

    def put_file(self, namespace: str, path: str | os.PathLike[str]) -> ArtifactRef:
        """Store the contents of the file at ``path``."""
        with _os_errors("open source file", Path(path)):
            source = open(path, "rb")  # noqa: SIM115 - closed below
        with source:
            return self.put(namespace, source)

    def _writable(self, need: int) -> _Pack:
        """The active pack, sealed and replaced first when ``need`` bytes would take it
        past ``pack_bytes`` (a record larger than that gets a pack of its own)."""
        pack = self._active
        if pack is not None and (pack.broken or pack.failed):
            self._retire(pack)
            pack = None
        if pack is not None and pack.size > pf.FILE_HEADER_SIZE and \
                pack.size + need > self.pack_bytes:
            self._retire(pack)
            self._behind(self._seal_quietly, pack)
            pack = None
        if pack is None:
            with self._behind_lock:
                pack, self._spare = self._spare, None
            if pack is None:
                pack = self._create()
            self._active = pack
        return pack

    # --- rotation, off the putting thread ---------------------------------------------

    def _behind(self, work: Callable[..., None], *args: object) -> None:
        """Run ``work`` on a thread of its own; ``close`` waits for it. (In line where the
        file operations ask for it: ``FileOps.background``.)"""
        if not self._ops.background:
            work(*args)
            return
        thread = threading.Thread(target=work, args=args, name="evidence-packs")
        with self._behind_lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _wait_behind(self) -> None:
        with self._behind_lock:
            threads, self._threads = self._threads, []
        for thread in threads:
            thread.join()

    def _seal_quietly(self, pack: _Pack) -> None:
        """Seal a full pack behind the puts. Its guarantees are a seal's wherever it runs
        (records fsynced before the index that lists them; ``sync`` of its payloads waits
        for it); a failed fsync poisons the pack as any does, and the writer's next
        ``sync`` or check of a payload in it raises that failure."""
        try:
            self._seal(pack)
        except ArtifactError as exc:
            log.error("could not seal %s: %s", pack.path, exc, extra={"event": "pack.seal_failed"})
        except Exception:  # a thread's error would otherwise go to stderr only
            log.exception("could not seal %s", pack.path, extra={"event": "pack.seal_failed"})

    def _prepare_spare(self, active: _Pack) -> None:
        """Create the pack that follows ``active`` ahead of time (its header's fsync and
        its directory's fsync off the put that rotates); once per active pack."""
        self._spare_for = active.no
        if self._spare is None and not self._closed:
            self._behind(self._make_spare)

    def _make_spare(self) -> None:
        try:
            spare = self._create()
        except ArtifactError as exc:  # the rotating put creates one itself, and says why
            log.warning("could not create the next pack ahead: %s", exc,
                        extra={"event": "pack.prepare_failed"})
            return
        with self._behind_lock:
            kept = self._spare is None and not self._closed
            if kept:
                self._spare = spare
        if not kept:
            self._discard_empty(spare)

    def _create(self) -> _Pack:
        """A new pack of this process: header written, locked, then named ``.pack`` (so a
        recovering opener never takes a pack being created for an abandoned one)."""
        for _ in range(_CREATE_TRIES):
            pack = self._try_create()
            if pack is not None:
                return pack
        raise ArtifactError(f"could not create a pack in {self.packs_dir}: each new one was "
                            "removed before it was locked", path=self.packs_dir)

    def _try_create(self) -> _Pack | None:
        """One try of ``_create``; None when another process's recovery removed the new
        file in the instant between its creation and its lock (the file was not ours yet:
        a ``.new`` nobody holds is an abandoned one to a recovering opener)."""
        now = _now_ms(self.clock)
        pack_id = now.to_bytes(6, "big") + secrets.token_bytes(10)
        stem = pack_id.hex()
        new = self.packs_dir / f"{stem}.new"
        final = self.packs_dir / f"{stem}.pack"
        with _os_errors("create pack", new):
            fd = self._ops.create_exclusive(new, 0o444)
        try:
            # Waiting, not failing: only a recovering opener can hold a pack this new, and
            # it holds it for one unlink (``_remove_stale_new``). Locked, the name is ours
            # only if it still names this file.
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not _names(new, fd):
                self._ops.close(fd)
                return None
            with _os_errors("write pack header", new):
                self._ops.write(fd, pf.encode_file_header(pack_id, now))
            # Its header durable before its name: a pack found after a crash always has
            # one (one fsync per pack, not per payload).
            with _os_errors("fsync pack", new):
                self._ops.fsync(fd)
            with _os_errors("name pack", final):
                self._ops.rename(new, final)
            with _os_errors("fsync directory", self.packs_dir):
                self._ops.fsync_dir(self.packs_dir)
        except BaseException:
            with contextlib.suppress(OSError):
                self._ops.close(fd)
            for path in (new, final):
                with contextlib.suppress(OSError):
                    self._ops.unlink(path)
            raise
        pack = _Pack(next(self._numbers), stem, final, own=True)
        pack.fd = fd
        with self._lock:
            self._packs[pack.no] = pack
            self._by_name[stem] = pack
        return pack

    def _retire(self, pack: _Pack) -> None:
        """No more appends to ``pack`` (sealed, broken or failed); its lock is kept until
        close, so no recovering opener seals a pack whose sync may still be asked for."""
        if self._active is pack:
            self._active = None

    def _seal(self, pack: _Pack) -> None:
        """Append the index and trailer and fsync: the pack never changes again."""
        assert pack.fd is not None
        with pack.cond:
            while pack.syncing:
                pack.cond.wait()
            if pack.failed or pack.sealed:
                return
            pack.syncing = True
        sealed = 0
        try:
            end = os.fstat(pack.fd).st_size  # past a record a failed write left part of
            # The records durable before the index that lists them: written back in any
            # order, the index could reach the disk without a record it names, and the
            # reopened store would deduplicate a put against bytes that are not there.
            if pack.synced < end:
                self._fsync_own(pack)
                with pack.cond:  # a sync waiting for these records need not wait for the
                    pack.synced = end  # index too (the writer's next COMMIT, in a crawl)
                    pack.cond.notify_all()
            seal = pf.encode_seal(pack.entries, end)
            with _os_errors("seal pack", pack.path):
                self._ops.pwrite(pack.fd, seal, end)
            self._fsync_own(pack)
            sealed = end + len(seal)
        finally:
            with pack.cond:  # sealed as the seal ends: a waiting _seal never seals twice
                pack.syncing = False
                if sealed:
                    pack.sealed = True
                    pack.synced = pack.size = sealed
                    pack.entries = []  # in its index now: kept, they grew with every put
                pack.cond.notify_all()
        if sealed:  # its payloads looked up in its index, on disk, from now on
            self._seal_known(pack, end, seal[:-pf.TRAILER_SIZE])

    def _fsync_own(self, pack: _Pack) -> None:
        """fsync a pack this process appends to; a failure poisons it (see ``_poison``)."""
        assert pack.fd is not None
        try:
            self._ops.fsync(pack.fd)
        except OSError as exc:
            self._poison(pack)
            raise self._sync_failed(pack, exc) from exc

    def _discard_empty(self, pack: _Pack) -> None:
        """A pack that got no record: nothing in it to keep (its lock held until it is
        unlinked: no recovering opener seals it meanwhile)."""
        with contextlib.suppress(OSError):
            self._ops.unlink(pack.path)
        self._close_fds(pack)
        with self._lock:
            self._packs.pop(pack.no, None)
            self._by_name.pop(pack.name, None)

    # --- durability -------------------------------------------------------------------

    def sync(self, refs: Iterable[ArtifactRef]) -> None:
        """Make every listed payload durable: one fsync per pack that holds an unsynced one
        (threads asking for the same pack at once share one fsync)."""
        wanted: dict[int, int] = {}
        for ref in refs:
            loc = self._locate(ref)
            if loc is None:
                if self.legacy is not None and self.legacy.exists(ref):
                    continue  # a payload file: durable when its put returned
                raise self._missing(ref)
            end = loc[1] + pf.RECORD_SIZE + loc[2]
            pack = self._packs.get(loc[0])
            if pack is not None and end > pack.synced:
                wanted[loc[0]] = max(wanted.get(loc[0], 0), end)
        for number, end in wanted.items():
            pack = self._packs.get(number)
            if pack is None:
                raise ArtifactMissingError(f"a pack of {self.root} went away during a sync",
                                           hint="retry: it was compacted", path=self.root)
            self._sync_pack(pack, end)

    def _sync_pack(self, pack: _Pack, end: int) -> None:
        with pack.cond:
            while True:
                if pack.synced >= end:
                    return
                if pack.failed:
                    raise self._sync_failed(pack, None)
                if not pack.syncing:
                    break
                pack.cond.wait()
            pack.syncing = True
            target = pack.size  # every record appended so far: written before this fsync
        try:
            fd = pack.fd if pack.own else self._sync_fd(pack)
            assert fd is not None
            self._ops.fsync(fd)
        except OSError as exc:
            with pack.cond:
                pack.syncing = False
                self._poison(pack)
                pack.cond.notify_all()
            raise self._sync_failed(pack, exc) from exc
        except BaseException:
            with pack.cond:
                pack.syncing = False
                pack.cond.notify_all()
            raise
        with pack.cond:
            pack.syncing = False
            pack.synced = max(pack.synced, target)
            pack.cond.notify_all()
        if pack.synced < end:
            self._sync_pack(pack, end)

    def _sync_fd(self, pack: _Pack) -> int:
        if pack.sync_fd is None:
            with _os_errors("open pack", pack.path):
                pack.sync_fd = self._ops.open_read(pack.path)
        return pack.sync_fd

    def _poison(self, pack: _Pack) -> None:
        """An fsync of ``pack`` failed: trust nothing in it past its last good fsync."""
        pack.failed = True
        self._retire(pack)
        with self._lock:
            for namespace, key, (_, offset, length, _) in self._index.in_pack(pack.no):
                if offset + pf.RECORD_SIZE + length > pack.synced:
                    self._index.pop(namespace, key)
                    self._lost[(namespace, key)] = pack
        try:
            _append_line(self.packs_dir / _FAILED_LIST, pack.name)
        except OSError as exc:
            log.error("cannot record that pack %s failed an fsync: %s", pack.path, exc,
                      extra={"event": "pack.fsync_record_failed"})


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)

