"""Artifact packs (issue 15): what only a pack store has to prove, beyond the artifact-store
contract it shares with the file store (tests/contract/test_artifact_store.py).

Group commit, rotation, recovery of a torn or unsynced tail after a crash (any sequence of
puts and syncs, any crash mode of the simulated disk), a failed fsync that poisons a pack,
another process appending while this one syncs, compaction, streaming, and the format as
docs/store.md describes it, read here by a reader written from that page alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import blake3
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from evidence import (
    ArtifactCorruptError,
    ArtifactError,
    ArtifactMissingError,
    ArtifactRef,
    PayloadTooLargeError,
)
from evidence._store.fileops import FileOps
from evidence._store.packs import PACKS_DIR, PackStore
from evidence.testing.disk import CrashFileOps, Fault, SimulatedDisk

ROOT = Path(__file__).resolve().parent.parent


def _payload(i: int, size: int = 3000) -> bytes:
    return (f"<p>{i}</p>".encode() * (size // 8 + 1))[:size]


# --- a third party's reader, written from docs/store.md ("Artifact packs") only ----------

def third_party_read(pack: Path, namespace: str, digest_hex: str) -> bytes | None:
    """Read one payload from a sealed pack: the trailer, then the index, then one record,
    each by (offset, length), as an object store serves ranges."""
    data = pack.read_bytes()
    trailer = data[-64:]
    assert trailer[:8] == b"EVIDPEND"
    assert struct.unpack("<I", trailer[60:64])[0] == zlib.crc32(trailer[:60])
    index_offset, count = struct.unpack("<QQ", trailer[8:24])
    index = data[index_offset:index_offset + 96 * count]
    assert blake3.blake3(index).digest() == trailer[24:56]
    want = (namespace.encode().ljust(32, b"\0"), bytes.fromhex(digest_hex))
    for i in range(count):
        entry = index[96 * i:96 * (i + 1)]
        kind = entry[0]
        if kind != 1 or (entry[8:40], entry[40:72]) != want:
            continue
        offset, length, _time = struct.unpack("<QQQ", entry[72:96])
        header = data[offset:offset + 96]
        assert header[:4] == b"EVR1" and header[4] == 1
        assert struct.unpack("<I", header[92:96])[0] == zlib.crc32(header[:92])
        assert struct.unpack("<Q", header[8:16])[0] == length
        assert header[24:56] == bytes.fromhex(digest_hex)
        payload = data[offset + 96:offset + 96 + length]
        assert blake3.blake3(payload).hexdigest() == digest_hex
        return payload
    return None


def test_a_sealed_pack_is_read_by_the_documented_format_alone(tmp_path: Path) -> None:
    store = PackStore(tmp_path / "artifacts")
    items = [("body", _payload(i, 100 + 37 * i)) for i in range(20)]
    items += [("headers", b"HTTP/1.1 200 OK\r\n\r\n"), ("body", b"")]
    refs = [store.put(ns, data) for ns, data in items]
    store.close()  # seals
    (pack,) = (tmp_path / "artifacts" / PACKS_DIR).glob("*.pack")
    assert pack.stat().st_mode & 0o777 == 0o444
    header = pack.read_bytes()[:64]
    assert header[:8] == b"EVIDPACK" and struct.unpack("<I", header[8:12])[0] == 1
    assert struct.unpack("<I", header[60:64])[0] == zlib.crc32(header[:60])
    for ref, (_, data) in zip(refs, items, strict=True):
        assert third_party_read(pack, ref.namespace, ref.digest) == data
    assert third_party_read(pack, "body", "0" * 64) is None


# --- group commit, rotation ----------------------------------------------------------------

def test_many_puts_from_many_threads_share_one_fsync(tmp_path: Path) -> None:
    disk = SimulatedDisk(tmp_path)
    disk.capture()
    store = PackStore(tmp_path / "artifacts", file_ops=CrashFileOps(disk))
    refs: list[ArtifactRef] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        mine = [store.put("body", _payload(100 * k + i)) for i in range(25)]
        with lock:
            refs.extend(mine)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    before = disk.kind_counts["sync:artifact"]
    store.sync(refs)
    assert disk.kind_counts["sync:artifact"] - before == 1  # 200 payloads, one fsync
    store.sync(refs)  # nothing left to make durable: no fsync at all
    assert disk.kind_counts["sync:artifact"] - before == 1
    disk.power_loss("drop")
    disk.write_crash_image()
    after = PackStore(tmp_path / "artifacts")
    assert sorted(after.iter_refs(), key=str) == sorted(set(refs), key=str)
    for ref in refs:
        after.verify(ref)


def test_packs_rotate_at_their_size_and_a_large_payload_gets_its_own(tmp_path: Path) -> None:
    store = PackStore(tmp_path / "artifacts", pack_bytes=64 * 1024)
    refs = [store.put("body", _payload(i, 10_000)) for i in range(20)]
    big = store.put("body", os.urandom(200_000))
    store.close()
    packs = PackStore(tmp_path / "artifacts").packs()
    assert len(packs) >= 4 and all(sealed for _, sealed, _ in packs)
    assert all(size <= 64 * 1024 + 96 * 10 for _, _, size in packs if size < 200_000)
    reopened = PackStore(tmp_path / "artifacts")
    for ref in [*refs, big]:
        reopened.verify(ref)


def test_check_each_finds_what_a_truncated_pack_lost_and_keeps_the_rest(
        tmp_path: Path) -> None:
    """check_each looks at each pack file once for many refs: payloads that lie past the
    end of a pack cut short under a running store are corrupt, those before it are there,
    in one call as in one call each."""
    store = PackStore(tmp_path / "artifacts")
    refs = [store.put("body", _payload(i, 5_000)) for i in range(6)]
    (path, _, size), = store.packs()
    os.truncate(path, size - 7_000)  # the last payload and part of the one before
    found = store.check_each(refs)
    assert [p is None for p in found] == [True, True, True, True, False, False]
    assert all(isinstance(p, ArtifactCorruptError) for p in found[4:])
    for ref, problem in zip(refs, found, strict=True):
        if problem is None:
            store.check(ref)
        else:
            with pytest.raises(ArtifactCorruptError):
                store.check(ref)
    store.close()


# --- batches of puts ------------------------------------------------------------------------

class _CountingOps(FileOps):
    """The real file operations, each ``writev`` counted with its buffers."""

    def __init__(self) -> None:
        self.writevs: list[int] = []

    def writev(self, fd, buffers, size=None):  # type: ignore[no-untyped-def]
        self.writevs.append(len(buffers))
        super().writev(fd, buffers, size)


def test_a_batch_appends_its_puts_in_one_write_readable_by_the_documented_format(
        tmp_path: Path) -> None:
    ops = _CountingOps()
    store = PackStore(tmp_path / "artifacts", file_ops=ops)
    items = [_payload(i, 200 + 53 * i) for i in range(30)]
    with store.batch():
        refs = [store.put("body", data) for data in items]
        assert store.put("body", items[3]) == refs[3]  # held already: held once
        assert ops.writevs == []  # held, not written
    assert ops.writevs == [60]  # 30 records, a header and a payload each, in one call
    single = store.put("body", b"outside a batch")
    assert ops.writevs == [60, 2]
    store.close()
    (pack,) = (tmp_path / "artifacts" / PACKS_DIR).glob("*.pack")
    for ref, data in zip([*refs, single], [*items, b"outside a batch"], strict=True):
        assert third_party_read(pack, ref.namespace, ref.digest) == data


def test_a_batch_writes_a_mebibyte_at_a_time_and_across_pack_rotations(tmp_path: Path) -> None:
    ops = _CountingOps()
    store = PackStore(tmp_path / "artifacts", file_ops=ops, pack_bytes=1536 * 1024)
    items = [os.urandom(40_000 + i) for i in range(100)]  # ~4 MB
    with store.batch():
        refs = [store.put("body", data) for data in items]
        written = len(ops.writevs)
    # Written each time a MiB was held (27 records of ~40 KB): at records 27, 54 and 81,
    # the second and third split by a rotation (a pack of 1.5 MiB takes 39 records).
    assert written == 5
    assert len(ops.writevs) == 6  # and the last 19 at the block's end
    store.close()
    reopened = PackStore(tmp_path / "artifacts")
    packs = reopened.packs()
    assert len(packs) == 3 and all(sealed for _, sealed, _ in packs)
    assert all(size <= 1536 * 1024 + 96 * 100 for _, _, size in packs)
    for ref, data in zip(refs, items, strict=True):
        assert reopened.read(ref, verify=True) == data


def test_a_batch_reads_its_own_puts_and_holds_a_copy_of_a_changing_buffer(
        tmp_path: Path) -> None:
    store = PackStore(tmp_path / "artifacts")
    buffer = bytearray(b"as it was put")
    with store.batch():
        ref = store.put("body", buffer)
        buffer[:2] = b"XX"  # the caller's buffer changes once put returned
        other = store.put("body", b"second")
        assert store.read(other) == b"second"  # this thread's sync or read writes first
        store.sync([ref])
    assert store.read(ref, verify=True) == b"as it was put"


def test_a_batch_left_by_an_error_stores_nothing_it_held(tmp_path: Path) -> None:
    ops = _CountingOps()
    store = PackStore(tmp_path / "artifacts", file_ops=ops)
    with pytest.raises(RuntimeError), store.batch():
        ref = store.put("body", b"never referenced")
        raise RuntimeError("the page failed")
    assert ops.writevs == [] and not store.exists(ref)
    assert store.put("body", b"never referenced") == ref and store.exists(ref)


def test_a_write_that_fails_in_a_batch_fails_the_batch_even_if_the_put_was_caught(
        tmp_path: Path) -> None:
    """A write at the MiB mark fails inside the block: the put that made it raises, and
    the block raises too when it ends, though its last write succeeds and the caller went
    on: every ref of the block is suspect. Nothing that failed is indexed."""
    disk = SimulatedDisk(tmp_path)
    disk.capture()
    store = PackStore(tmp_path / "artifacts", file_ops=CrashFileOps(disk))
    before = store.put("body", b"before")
    big = [os.urandom(300_000 + i) for i in range(4)]  # the 4th reaches a MiB
    disk.arm(Fault(action="disk_full", at=1, ops=frozenset({"write"}),
                   files=frozenset({"artifact"})))
    with pytest.raises(ArtifactError, match="append") as info, store.batch():
        refs = [store.put("body", data) for data in big[:3]]
        with pytest.raises(ArtifactError):
            store.put("body", big[3])
        disk.arm(None)
        late = store.put("body", b"after the failure")
    assert "disk full" in str(info.value)
    assert store.exists(late)  # written at the block's end: an orphan, never referenced
    assert not any(store.exists(ref) for ref in refs)
    again = [store.put("body", data) for data in big]  # the same bytes: appended again
    store.sync([before, *again])
    store.close()
    after = PackStore(tmp_path / "artifacts")
    assert after.read(before, verify=True) == b"before"
    for ref, data in zip(again, big, strict=True):
        assert after.read(ref, verify=True) == data


def test_threads_batch_their_own_puts(tmp_path: Path) -> None:
    store = PackStore(tmp_path / "artifacts")
    seen: list[bool] = []
    with store.batch():
        held = store.put("body", b"held by this thread")

        def other() -> None:
            ref = store.put("body", b"another thread, no batch")
            seen.append(store._get("body", bytes.fromhex(ref.digest)) is not None)
            seen.append(store._get("body", bytes.fromhex(held.digest)) is not None)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen == [True, False]  # written at once; this thread's put still held
    assert store.read(held) == b"held by this thread"


def test_a_put_of_stored_bytes_writes_nothing_but_an_old_one_is_touched(
        tmp_path: Path) -> None:
    now = [1_000_000.0]
    store = PackStore(tmp_path / "artifacts", clock=lambda: now[0])
    ref = store.put("body", b"same")
    pack = next((tmp_path / "artifacts" / PACKS_DIR).glob("*.pack"))
    size = pack.stat().st_size
    assert store.put("body", b"same") == ref and pack.stat().st_size == size  # dedup
    now[0] += 2 * 86400
    assert store.age(ref) == pytest.approx(2 * 86400)
    store.put("body", b"same")  # put again two days later: young again, 96 bytes more
    assert pack.stat().st_size == size + 96
    assert store.age(ref) == pytest.approx(0)
    store.close()
    assert PackStore(tmp_path / "artifacts", clock=lambda: now[0] + 5).age(ref) == pytest.approx(5)


# --- crashes ---------------------------------------------------------------------------------

ops = st.lists(st.one_of(st.tuples(st.just("put"), st.integers(0, 40)),
                         st.tuples(st.just("sync"), st.just(0))), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=ops, unsynced=st.lists(st.integers(0, 40), min_size=1, max_size=5),
       mode=st.sampled_from(["drop", "torn", "reorder", "keep"]), seed=st.integers(0, 2**16),
       small=st.booleans(), batched=st.booleans())
@example(steps=[("put", 1), ("sync", 0)], unsynced=[2, 3, 4], mode="torn", seed=0,
         small=False, batched=False)
def test_any_sequence_of_puts_and_syncs_then_a_crash_keeps_every_synced_payload(
        tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int]],
        unsynced: list[int], mode: str, seed: int, small: bool, batched: bool) -> None:
    """Any sequence of puts and syncs (each run of puts in a batch, or not), then power
    loss in any crash mode: every payload synced before the crash reads back whole; the
    torn or unsynced tail is recognised and left out (nothing listed fails its hash); the
    store takes new puts after it."""
    root = tmp_path_factory.mktemp("p")
    disk = SimulatedDisk(root, seed=seed)
    disk.capture()
    store = PackStore(root / "artifacts", file_ops=CrashFileOps(disk),
                      pack_bytes=8192 if small else 1 << 20)
    synced: set[ArtifactRef] = set()
    pending: list[ArtifactRef] = []
    run = contextlib.ExitStack()  # the open batch of a run of puts, if batched
    for op, n in steps:
        if op == "put":
            if batched and not pending:
                run.enter_context(store.batch())
            pending.append(store.put("body", _payload(n, 500 + 97 * n)))
        else:
            run.close()  # the batch ends: its records are written
            store.sync(pending)
            synced.update(pending)
            pending.clear()
    run.close()
    with store.batch() if batched else contextlib.nullcontext():
        for n in unsynced:  # the tail a crash tears, reorders or drops
            store.put("body", _payload(n, 500 + 97 * n))
    disk.power_loss(mode)  # type: ignore[arg-type]
    disk.write_crash_image()
    after = PackStore(root / "artifacts")  # recovers: re-hashes and seals what the crash left
    for ref in synced:
        assert after.read(ref, verify=True) == _payload(int(_n_of(ref, steps)),
                                                        ref.size)
    for ref in after.iter_refs():
        after.verify(ref)  # the torn tail is never indexed
    new = after.put("body", b"after the crash")
    after.sync([new])
    after.close()
    again = PackStore(root / "artifacts", read_only=True)
    assert again.read(new, verify=True) == b"after the crash"
    assert all(sealed for _, sealed, _ in again.packs())


def _n_of(ref: ArtifactRef, steps: list[tuple[str, int]]) -> int:
    for op, n in steps:
        if op == "put" and blake3.blake3(_payload(n, 500 + 97 * n)).hexdigest() == ref.digest:
            return n
    raise AssertionError(ref)


def test_a_failed_pack_fsync_is_never_trusted_again(tmp_path: Path) -> None:
    """Linux marks the pages of a failed fsync clean: a retried fsync succeeds without
    writing them. So a payload whose sync failed must be appended again by a later put of
    the same bytes, and a sync of the failed ref itself must keep failing."""
    disk = SimulatedDisk(tmp_path, sync_failure="lose")
    disk.capture()
    store = PackStore(tmp_path / "artifacts", file_ops=CrashFileOps(disk))
    kept = store.put("body", b"synced before")
    store.sync([kept])
    lost = store.put("body", _payload(7))
    disk.arm(Fault(action="io_error", at=1, ops=frozenset({"sync"}),
                   files=frozenset({"artifact"})))
    with pytest.raises(ArtifactError, match="fsync") as info:
        store.sync([lost])
    assert info.value.sync_failed is True
    disk.arm(None)  # the device works again: an fsync now succeeds, having lost the pages
    with pytest.raises(ArtifactError):
        store.sync([lost])  # the failed ref is not in any trusted pack
    again = store.put("body", _payload(7))  # the same bytes: appended to a new pack
    assert again == lost
    store.sync([again])
    assert (tmp_path / "artifacts" / PACKS_DIR / "SYNC-FAILED").read_text().strip()
    disk.power_loss("drop")
    disk.write_crash_image()
    after = PackStore(tmp_path / "artifacts")
    assert after.read(lost, verify=True) == _payload(7)
    assert after.read(kept, verify=True) == b"synced before"


def test_a_write_that_fails_mid_record_leaves_the_pack_readable(tmp_path: Path) -> None:
    disk = SimulatedDisk(tmp_path)
    disk.capture()
    store = PackStore(tmp_path / "artifacts", file_ops=CrashFileOps(disk))
    first = store.put("body", b"one")
    disk.arm(Fault(action="disk_full", at=1, ops=frozenset({"write"}),
                   files=frozenset({"artifact"})))
    with pytest.raises(ArtifactError):
        store.put("body", _payload(1))
    disk.arm(None)
    second = store.put("body", _payload(2))  # goes to a new pack
    store.sync([first, second])
    store.close()
    after = PackStore(tmp_path / "artifacts")
    assert after.read(first, verify=True) == b"one"
    assert after.read(second, verify=True) == _payload(2)
    assert not after.exists(ArtifactRef("body", blake3.blake3(_payload(1)).hexdigest(), 3000))


def test_a_streamed_put_refused_half_way_leaves_the_records_after_it_readable(
        tmp_path: Path) -> None:
    store = PackStore(tmp_path / "artifacts", max_payload=10_000)
    before = store.put("body", b"before")
    with pytest.raises(PayloadTooLargeError):
        store.put("body", iter([b"x" * 6000, b"y" * 6000]))
    streamed = store.put("body", io.BytesIO(_payload(3, 9000)))
    after = store.put("body", b"after")
    store.sync([before, streamed, after])
    store.close()
    reopened = PackStore(tmp_path / "artifacts")
    for ref, data in ((before, b"before"), (streamed, _payload(3, 9000)), (after, b"after")):
        assert reopened.read(ref, verify=True) == data


def test_an_unsealed_pack_left_by_a_crash_is_sealed_by_the_next_writable_open(
        tmp_path: Path) -> None:
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from evidence._store.packs import PackStore\n"
            f"s = PackStore({str(tmp_path / 'artifacts')!r})\n"
            "r = s.put('body', b'from a process that is killed')\n"
            "s.sync([r])\n"
            "print(r.digest, flush=True)\n"
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == -9
    digest = done.stdout.strip()
    ref = ArtifactRef("body", digest, len(b"from a process that is killed"))
    reader = PackStore(tmp_path / "artifacts", read_only=True)  # reads it, seals nothing
    assert reader.read(ref, verify=True) == b"from a process that is killed"
    assert [sealed for _, sealed, _ in PackStore(tmp_path / "artifacts", read_only=True).packs()] \
        == [True]  # read as closed: nobody appends to it
    (pack,) = (tmp_path / "artifacts" / PACKS_DIR).glob("*.pack")
    assert pack.read_bytes()[-64:][:8] != b"EVIDPEND"
    PackStore(tmp_path / "artifacts").close()  # the writable open seals it
    assert third_party_read(pack, "body", digest) == b"from a process that is killed"


def test_a_pack_created_ahead_and_left_unused_by_a_crash_is_removed_by_the_next_open(
        tmp_path: Path) -> None:
    """Past half of its pack, a process creates the next one ahead (header only). Killed
    then, it leaves that pack behind: the next writable open removes it instead of sealing
    an empty pack, and seals the one with the record. (Before: no pack was created ahead.)"""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from evidence._store.packs import PackStore\n"
            f"s = PackStore({str(tmp_path / 'artifacts')!r}, pack_bytes=8192)\n"
            "r = s.put('body', bytes(range(256)) * 20)\n"  # 5 KiB: past half of the pack
            "s.sync([r])\n"
            "s._wait_behind()\n"
            "print(r.digest, flush=True)\n"
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    ref = ArtifactRef("body", done.stdout.strip(), 5120)
    packs = sorted((tmp_path / "artifacts" / PACKS_DIR).glob("*.pack"), key=os.path.getsize)
    assert [p.stat().st_size for p in packs][:1] == [64] and len(packs) == 2
    PackStore(tmp_path / "artifacts").close()
    assert not packs[0].exists()
    assert third_party_read(packs[1], "body", ref.digest) == bytes(range(256)) * 20


# --- another process ---------------------------------------------------------------------------

def test_the_writer_syncs_and_reads_what_another_process_appended(tmp_path: Path) -> None:
    """A crawl worker process appends to its own pack and never fsyncs; the writer's
    process finds those payloads (tailing the pack) and makes them durable."""
    mine = PackStore(tmp_path / "artifacts")
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from evidence._store.packs import PackStore\n"
            f"s = PackStore({str(tmp_path / 'artifacts')!r}, create=False)\n"
            "refs = [s.put('body', b'child %d' % i) for i in range(50)]\n"
            "print(' '.join(r.digest for r in refs), flush=True)\n"
            "sys.stdin.readline()\n"  # still alive (its pack locked) while the writer syncs
            "s.close()\n")
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None and child.stdin is not None
        digests = child.stdout.readline().split()
        refs = [ArtifactRef("body", d, len(b"child %d" % i)) for i, d in enumerate(digests)]
        for ref in refs:
            mine.check(ref)  # found by tailing the child's pack
        mine.sync(refs)
        assert mine.read(refs[7], verify=True) == b"child 7"
        assert mine.put("body", b"child 3") == refs[3]  # dedup across processes
        child.stdin.write("\n")
        child.stdin.close()
        assert child.wait() == 0
    mine.close()
    assert PackStore(tmp_path / "artifacts", read_only=True).read(refs[49]) == b"child 49"


# --- compaction ----------------------------------------------------------------------------------

def test_removal_rewrites_the_pack_without_the_payloads_and_keeps_the_rest(
        tmp_path: Path) -> None:
    store = PackStore(tmp_path / "artifacts")
    refs = [store.put("body", _payload(i)) for i in range(10)]
    store.close()
    store = PackStore(tmp_path / "artifacts")
    (old,) = (tmp_path / "artifacts" / PACKS_DIR).glob("*.pack")
    removals = store.plan_removal(refs[:4])
    assert [r.refs for r in removals] == [sorted(refs[:4], key=lambda r: r.digest)]
    assert old.exists()  # prepared, not committed: nothing is gone yet
    for ref in refs:
        store.verify(ref)
    assert removals[0].commit() == 4 * 3000
    assert not old.exists()
    for ref in refs[:4]:
        assert not store.exists(ref)
        with pytest.raises(ArtifactMissingError):
            store.read(ref)
    for ref in refs[4:]:
        store.verify(ref)
    fresh = PackStore(tmp_path / "artifacts", read_only=True)
    assert list(fresh.iter_refs()) == sorted(refs[4:], key=lambda r: r.digest)


def test_an_aborted_removal_changes_nothing(tmp_path: Path) -> None:
    store = PackStore(tmp_path / "artifacts")
    refs = [store.put("body", _payload(i)) for i in range(3)]
    store.close()
    store = PackStore(tmp_path / "artifacts")
    before = sorted(p.name for p in (tmp_path / "artifacts" / PACKS_DIR).iterdir())
    (removal,) = store.plan_removal(refs[:1])
    removal.abort()
    assert sorted(p.name for p in (tmp_path / "artifacts" / PACKS_DIR).iterdir()) == before
    for ref in refs:
        store.verify(ref)


def test_a_damaged_payload_is_found_by_verify_and_not_compacted_away(tmp_path: Path) -> None:
    store = PackStore(tmp_path / "artifacts")
    refs = [store.put("body", _payload(i)) for i in range(3)]
    store.close()
    (pack,) = (tmp_path / "artifacts" / PACKS_DIR).glob("*.pack")
    data = bytearray(pack.read_bytes())
    offset = data.index(_payload(1)) + 10
    data[offset] ^= 0xFF
    pack.chmod(0o644)
    pack.write_bytes(bytes(data))
    pack.chmod(0o444)
    store = PackStore(tmp_path / "artifacts")
    store.check(refs[1])  # the size is right: only a re-hash finds it
    with pytest.raises(ArtifactCorruptError, match="expected blake3"):
        store.verify(refs[1])
    with pytest.raises(ArtifactCorruptError, match="does not match its digest"):
        store.plan_removal(refs[:1])
    store.verify(refs[0])


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=300_000), min_size=1, max_size=5))
def test_writev_writes_every_byte_in_order_when_the_kernel_takes_part_of_it(
        sizes: list[int]) -> None:
    """A pack record goes out in one ``writev``; when the kernel takes only part of it (here
    a socket whose send times out while nobody reads: a real short write, as a signal or a
    full pipe gives), the rest follows, every byte once and in order."""
    buffers = [os.urandom(n) for n in sizes]
    sender, receiver = socket.socketpair()
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                      struct.pack("ll", 0, 50_000))  # 50 ms: then a short write returns
    got = bytearray()
    started = threading.Event()

    def drain() -> None:
        started.wait()
        while chunk := receiver.recv(65536):
            got.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    calls: list[int] = []
    real_writev = os.writev

    def counting_writev(fd: int, bufs) -> int:  # the real call, counted
        while True:
            try:
                n = real_writev(fd, bufs)
                break
            except BlockingIOError:  # 50 ms and nothing sent (the reader not scheduled
                continue  # yet, on a loaded machine): a file would wait, so wait
        calls.append(n)
        started.set()  # the reader starts only after the first (short) write
        return n

    os.writev = counting_writev
    try:
        FileOps().writev(sender.fileno(), buffers)
    finally:
        os.writev = real_writev
        sender.close()
        started.set()
        reader.join(10)
        receiver.close()
    assert bytes(got) == b"".join(buffers)
    if sum(sizes) > 600_000:  # more than the socket's buffers hold: it took part of it
        assert len(calls) > 1 and calls[0] < sum(sizes)


# --- rotation behind the puts, writeback hints ---------------------------------------------

class _Blocking(FileOps):
    """Real file operations; an fsync of the first pack created waits for ``release``
    once ``armed`` (or fails with EIO, ``fail``), and every fsync notes its thread."""

    def __init__(self, *, fail: bool = False, hold: int = 1) -> None:
        self.hold = hold  # the how-many-th fsync of the first pack, once armed, waits
        self.first: int | None = None
        self.armed = threading.Event()
        self.blocked = threading.Event()
        self.release = threading.Event()
        self.fail = fail
        self.fsync_threads: list[int] = []

    def create_exclusive(self, path: Path, mode: int) -> int:
        fd = super().create_exclusive(path, mode)
        if self.first is None and path.name.endswith(".new"):
            self.first = fd
        return fd

    def fsync(self, fd: int) -> None:
        self.fsync_threads.append(threading.get_ident())
        if fd == self.first and self.armed.is_set() and not self.blocked.is_set():
            self.hold -= 1
        if fd == self.first and self.armed.is_set() and self.hold == 0:
            self.blocked.set()
            if self.fail:
                raise OSError(5, "injected I/O error", "pack")
            assert self.release.wait(30), "the test never released the seal"
        super().fsync(fd)


def _put_in_thread(store: PackStore, data: bytes) -> ArtifactRef:
    out: list[ArtifactRef] = []
    putter = threading.Thread(target=lambda: out.append(store.put("body", data)))
    putter.start()
    putter.join(30)
    assert not putter.is_alive(), "the put waited for the seal of the full pack"
    return out[0]


def test_a_full_pack_is_sealed_behind_the_puts_and_close_waits_for_the_seal(
        tmp_path: Path) -> None:
    """Rotation costs the putting thread no fsync: the full pack is sealed on another
    thread (its records fsynced before its index, as any seal), the next pack was created
    ahead, a sync of a payload in the pack being sealed waits for the seal, and close
    waits for it too. (Before: the put that rotated sealed the pack itself, and waited.)"""
    ops = _Blocking()
    store = PackStore(tmp_path / "artifacts", file_ops=ops, pack_bytes=64 * 1024)
    first = [store.put("body", _payload(i, 10_000)) for i in range(6)]  # 60 KB: one pack
    ops.armed.set()
    putter = threading.get_ident()
    before = len(ops.fsync_threads)
    rotated = _put_in_thread(store, _payload(6, 10_000))  # does not fit: the pack rotates
    assert ops.blocked.wait(30)  # the seal is under way (held in its fsync) ...
    assert store.record(rotated)[0] != store.record(first[0])[0]  # ... and the put is done
    syncer = threading.Thread(target=store.sync, args=(first,))
    syncer.start()
    closer = threading.Thread(target=store.close)
    closer.start()
    syncer.join(0.3)
    closer.join(0.3)
    assert syncer.is_alive() and closer.is_alive()  # both wait for the seal
    ops.release.set()
    syncer.join(30)
    closer.join(30)
    assert not syncer.is_alive() and not closer.is_alive()
    assert putter not in ops.fsync_threads[before:]
    packs = PackStore(tmp_path / "artifacts", read_only=True)
    assert [sealed for _, sealed, _ in packs.packs()] == [True, True]  # no spare left over
    for ref in [*first, rotated]:
        assert third_party_read(Path(packs.record(ref)[0]), ref.namespace, ref.digest) \
            == _payload(first.index(ref) if ref in first else 6, 10_000)


def test_a_sync_in_a_pack_being_sealed_waits_for_its_records_not_for_its_index(
        tmp_path: Path) -> None:
    """The seal's first fsync makes the records durable: a sync of them returns then,
    while the index is still being written and fsynced (close still waits for that).
    (Before: the sync waited for the whole seal.)"""
    ops = _Blocking(hold=2)  # the seal's second fsync: the one after its index
    store = PackStore(tmp_path / "artifacts", file_ops=ops, pack_bytes=64 * 1024)
    first = [store.put("body", _payload(i, 10_000)) for i in range(6)]
    ops.armed.set()
    _put_in_thread(store, _payload(6, 10_000))
    assert ops.blocked.wait(30)
    syncer = threading.Thread(target=store.sync, args=(first,))
    syncer.start()
    syncer.join(30)
    assert not syncer.is_alive()  # the records are durable: the index is not waited for
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()
    ops.release.set()
    closer.join(30)
    assert not closer.is_alive()
    assert all(sealed for _, sealed, _ in PackStore(tmp_path / "artifacts").packs())


def test_a_seal_that_fails_behind_the_puts_fails_the_sync_never_as_missing(
        tmp_path: Path) -> None:
    """The seal's fsync fails on its own thread: the put that rotated has returned, so
    the failure reaches the writer through the next sync (sync_failed: the batch is not
    committed, the store is marked) and through a check of a payload that was only in
    that pack, which must say the store failed, never "missing" (a message naming it
    would be rejected and its evidence lost). A later put of the same bytes stores them
    again. (Before: the put raised; a check after the poison said "missing".)"""
    ops = _Blocking(fail=True)
    store = PackStore(tmp_path / "artifacts", file_ops=ops, pack_bytes=64 * 1024)
    first = [store.put("body", _payload(i, 10_000)) for i in range(6)]
    ops.armed.set()
    rotated = _put_in_thread(store, _payload(6, 10_000))
    assert ops.blocked.wait(30)
    with pytest.raises(ArtifactError) as synced:
        store.sync(first)
    assert synced.value.sync_failed is True
    for ref in first:
        with pytest.raises(ArtifactError) as checked:
            store.check(ref)
        assert not isinstance(checked.value, ArtifactMissingError)
        assert checked.value.sync_failed is True
    store.sync([rotated])  # the next pack is not touched by the failure
    again = store.put("body", _payload(0, 10_000))
    assert again == first[0]
    store.sync([again])
    store.check(again)
    assert store.read(again, verify=True) == _payload(0, 10_000)
    store.close()


def test_writeback_is_started_every_mebibyte_on_whole_pages(tmp_path: Path) -> None:
    """The appender asks the kernel (through the file operations, so the simulated disk
    sees it) to start writing what it appended, every MiB, whole pages only, each range
    once and in order; the payloads read back unchanged. (Before: no such call.)"""
    disk = SimulatedDisk(tmp_path)
    disk.capture()
    asked: list[tuple[int, int]] = []

    class Recording(CrashFileOps):
        def start_writeback(self, fd: int, offset: int, length: int) -> None:
            asked.append((offset, length))
            super().start_writeback(fd, offset, length)

    store = PackStore(tmp_path / "artifacts", file_ops=Recording(disk))
    refs = [store.put("body", os.urandom(50_000 + i)) for i in range(70)]  # ~3.5 MB
    assert len(asked) == 3 and disk.counts["writeback"] == 3
    assert asked[0][0] == 0
    for (offset, length), (after, _) in zip(asked, [*asked[1:], (None, 0)], strict=True):
        assert length >= 1024 * 1024 and (offset + length) % os.sysconf("SC_PAGE_SIZE") == 0
        assert after is None or after == offset + length
    store.sync(refs)
    store.close()
    for ref in refs:
        assert PackStore(tmp_path / "artifacts").read(ref, verify=True)


steps_with_checks = st.lists(st.one_of(st.tuples(st.just("put"), st.integers(0, 30)),
                                       st.tuples(st.just("sync"), st.just(0)),
                                       st.tuples(st.just("check"), st.integers(0, 30))),
                             min_size=1, max_size=40)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps_with_checks, failing=st.integers(1, 12), action=st.sampled_from(
    ["io_error", "disk_full"]), persistent=st.booleans(), write=st.booleans(),
    batched=st.booleans())
def test_any_interleaving_with_a_failing_pack_operation_loses_no_synced_payload(
        tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int]], failing: int,
        action: str, persistent: bool, write: bool, batched: bool) -> None:
    """Any interleaving of puts (small packs: rotations, so seals and pack creations run
    behind the puts; each run of puts in a batch, or not), syncs and checks, with the
    ``failing``-th fsync (or append) of a pack failing, wherever it runs: a sync either
    returns (its payloads are durable: they read back whole after a power loss) or raises;
    a check of a payload a put returned (its batch ended) never says "missing" (the store
    failing is said as such); a put or batch that raises returns nothing to reference."""
    root = tmp_path_factory.mktemp("f")
    disk = SimulatedDisk(root, sync_failure="lose")
    disk.capture()
    store = PackStore(root / "artifacts", file_ops=_Behind(disk), pack_bytes=8192)
    disk.arm(Fault(action=action, at=failing,  # type: ignore[arg-type]
                   ops=frozenset({"write" if write else "sync"}), files=frozenset({"artifact"}),
                   persistent=persistent, heal_after=3))
    returned: dict[int, ArtifactRef] = {}
    pending: list[ArtifactRef] = []
    synced: dict[ArtifactRef, int] = {}
    run = contextlib.ExitStack()  # the open batch, if batched
    held: dict[int, ArtifactRef] = {}  # put in the open batch: theirs once it ends well

    def end_run() -> None:
        try:
            run.close()
        except ArtifactError:
            held.clear()  # the batch failed: none of its refs is to be referenced
        returned.update(held)
        pending.extend(held.values())
        held.clear()

    for op, n in steps:
        data = _payload(n, 700 + 131 * n)
        if op == "put":
            if batched and not held:
                run.enter_context(store.batch())
            try:
                ref = store.put("body", data)
            except ArtifactError:
                continue
            (held if batched else returned)[n] = ref
            if not batched:
                pending.append(ref)
        elif op == "sync":
            end_run()
            try:
                store.sync(pending)
            except ArtifactError:
                continue  # not durable: nothing of it counts as synced
            synced.update({ref: int(_n_of_size(ref)) for ref in pending})
            pending.clear()
        elif n in returned:
            _check_never_missing(store, returned[n])
    end_run()
    store.close()  # waits for the seals under way: each has succeeded or failed now
    for ref in returned.values():
        _check_never_missing(store, ref)
    event(f"fired: {bool(disk.fired)}")
    disk.power_loss("drop")
    disk.write_crash_image()
    after = PackStore(root / "artifacts")
    for ref, n in synced.items():
        assert after.read(ref, verify=True) == _payload(n, 700 + 131 * n)
    for ref in after.iter_refs():
        after.verify(ref)


class _Behind(CrashFileOps):
    """The simulated disk, with the store's seals and new packs on threads of their own
    as on a real disk (``CrashFileOps`` runs them in line, so fault trials repeat)."""

    background = True


def _check_never_missing(store: PackStore, ref: ArtifactRef) -> None:
    try:
        store.check(ref)
    except ArtifactMissingError:
        raise
    except ArtifactError as exc:  # the store failing (a failed fsync): redeliverable
        assert exc.sync_failed is True
        event("a check said the store failed")


def _n_of_size(ref: ArtifactRef) -> int:
    n, rest = divmod(ref.size - 700, 131)
    assert rest == 0
    return n


# --- another process's recovery while a pack is created --------------------------------------

class _RecoveredWhileCreated(FileOps):
    """Real file operations; right after the first ``.new`` file is created, before its
    creator locks it, another writable open of the same packs runs its recovery (the
    instant a second crawl worker process started in, in a CI run)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.removed: list[Path] = []

    def create_exclusive(self, path: Path, mode: int) -> int:
        fd = super().create_exclusive(path, mode)
        if not self.removed and path.name.endswith(".new"):
            PackStore(self.root).close()  # takes the unlocked file for an abandoned one
            self.removed.append(path)
        return fd


def test_a_pack_whose_new_file_another_opener_removed_is_created_again(
        tmp_path: Path) -> None:
    """A ``.new`` file nobody has locked is one a dead creator left, to a recovering
    opener; a live creator is between its create and its lock for an instant. If another
    process's recovery removes the file then, the creator finds its name gone once it holds
    the lock and creates the pack again under a new name. (Before: the put failed with
    "could not name pack ...: No such file or directory", and the crawl with it.)"""
    root = tmp_path / "artifacts"
    PackStore(root).close()
    ops = _RecoveredWhileCreated(root)
    store = PackStore(root, file_ops=ops)
    ref = store.put("body", b"put while another process opened the store")
    store.sync([ref])
    store.close()
    assert len(ops.removed) == 1 and not ops.removed[0].exists()
    (pack,) = (root / PACKS_DIR).glob("*.pack")
    assert pack.stem != ops.removed[0].stem
    assert third_party_read(pack, "body", ref.digest) == \
        b"put while another process opened the store"
    assert not list((root / PACKS_DIR).glob("*.new"))
