"""The pack store's digest index (issue 35 point 2: flat memory).

``DigestIndex`` (the unsealed packs' entries) answers exactly what a dict answers, over any
sequence of sets, removals and lookups; ``SealedDigests`` (a sealed pack's own index, on
disk) answers what a dict of that index does, over any entries; a pack store answers every
payload put, and stores each content once, over any sequence of puts, seals, another
appender and reopens; and its memory grows by a few bytes per payload it holds (6.7
measured; it was 65 with the whole index in memory, and 344 before that in dicts).
"""

from __future__ import annotations

import gc
import tempfile
import tracemalloc
from array import array
from pathlib import Path

import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence._errors import ArtifactCorruptError, ArtifactMissingError
from evidence._model.refs import ArtifactRef
from evidence._store import packfile as pf
from evidence._store.packdigests import (
    BYTES_PER_ENTRY,
    DamagedIndex,
    DigestIndex,
    SealedDigests,
    probe,
    sealed_key,
)
from evidence._store.packs import PACKS_DIR, PackStore

# Few digests, two namespaces, and digests sharing their first 8 bytes (the word a run is
# sorted and bisected on): lookups must compare the rest.
_DIGESTS = [bytes(8) + bytes([i]) * 24 for i in range(4)] + \
    [blake3.blake3(bytes([i])).digest() for i in range(8)]
_KEYS = st.tuples(st.sampled_from(["page", "headers"]), st.sampled_from(_DIGESTS))
_LOCS = st.tuples(st.integers(1, 2**32 - 1), st.integers(0, 2**63 - 1),
                  st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
_OPS = st.lists(st.one_of(
    st.tuples(st.just("set"), _KEYS, _LOCS),
    st.tuples(st.just("pop"), _KEYS, st.none()),
    st.tuples(st.just("drop_pack"), st.none(), st.integers(1, 3)),
), max_size=80)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, recent=st.integers(1, 5))
def test_any_sequence_of_changes_reads_as_a_dict(ops: list, recent: int) -> None:
    index, model = DigestIndex(recent=recent), {}
    for op, key, arg in ops:
        if op == "set":
            index.set(*key, arg)
            model[key] = arg
        elif op == "pop":
            assert index.pop(*key) == model.pop(key, None)
        else:  # what forgetting a pack does: every entry located in it removed
            in_pack = sorted(index.in_pack(arg))
            assert in_pack == sorted((*k, v) for k, v in model.items() if v[0] == arg)
            for namespace, digest, _ in in_pack:
                index.pop(namespace, digest)
                del model[(namespace, digest)]
        assert len(index) == len(model)
        for k in [(ns, d) for ns in ("page", "headers") for d in _DIGESTS]:
            assert index.get(*k) == model.get(k)
    assert sorted(index.items()) == sorted((*k, v) for k, v in model.items())


def test_the_index_takes_its_bytes_per_entry_in_its_base() -> None:
    index = DigestIndex(recent=100)
    for i in range(1000):
        index.set("page", blake3.blake3(str(i).encode()).digest(), (1, i, i, i))
    index.compact()
    assert len(index) == 1000
    assert index.nbytes() == BYTES_PER_ENTRY * 1000 == 62_000
    assert index.get("page", blake3.blake3(b"999").digest()) == (1, 999, 999, 999)
    assert index.get("other", blake3.blake3(b"999").digest()) is None


@pytest.mark.parametrize("recent", [0, -1, 1.5])
def test_a_bad_recent_bound_is_refused(recent: object) -> None:
    with pytest.raises(ValueError, match="recent must be a positive int"):
        DigestIndex(recent=recent)  # type: ignore[arg-type]


def _traced_after_puts(store: PackStore, first: int, count: int) -> int:
    with store.batch():
        for i in range(first, first + count):
            store.put("page", i.to_bytes(8, "big"))
    store._wait_behind()  # the seals of full packs, on threads of their own
    store._index.compact()  # the recent entries into the base: both points alike
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def test_a_pack_stores_memory_per_payload_stays_near_the_index_entry(tmp_path: Path) -> None:
    """N payloads, then N more: what the second N added, per payload, is under 10 bytes
    (6.7 here: the sealed packs' fences and filters), where the whole index in memory
    took 65 (its 62-byte entry) and dicts with the sealed packs' record lists 344."""
    # 104-byte records (8-byte payloads), 1,024 to a pack; N is two packs' worth, so at
    # both points the active pack is full, a spare is ready and the others are sealed.
    per_pack, n = 1024, 2048
    with PackStore(tmp_path / "a", pack_bytes=64 + per_pack * 104) as store:
        tracemalloc.start()
        try:
            at_n = _traced_after_puts(store, 0, n)
            at_2n = _traced_after_puts(store, n, n)
        finally:
            tracemalloc.stop()
        assert store.usage()[0] == 2 * n
        assert len(store.packs()) == 5  # four full, one spare
    per_payload = (at_2n - at_n) / n
    assert per_payload < 10, f"{per_payload:.1f} bytes of memory per payload put"


# --- sealed packs: looked up through their own index on disk --------------------------------

_ENTRIES = st.lists(st.builds(
    pf.Entry, kind=st.sampled_from([pf.PAYLOAD, pf.PAYLOAD, pf.TOUCH]),
    namespace=st.sampled_from(["page", "headers", "p"]), digest=st.sampled_from(_DIGESTS),
    offset=st.integers(64, 1200), length=st.integers(0, 300),
    time=st.integers(0, 2**63 - 1)), max_size=60)


def _model(entries: list[pf.Entry], index_offset: int) -> dict[tuple[str, bytes], tuple]:
    """What a dict built from the pack's index holds: per key, its first valid payload
    entry's (offset, length) with the latest time of its valid payload entries."""
    model: dict[tuple[str, bytes], tuple] = {}
    for e in sorted(entries, key=lambda e: (e.namespace, e.digest, e.kind, e.offset)):
        if e.kind != pf.PAYLOAD or e.offset + pf.RECORD_SIZE + e.length > index_offset:
            continue
        have = model.get((e.namespace, e.digest))
        model[(e.namespace, e.digest)] = (e.offset, e.length, e.time) if have is None \
            else (have[0], have[1], max(have[2], e.time))
    return model


@settings(max_examples=200, deadline=None)
@given(entries=_ENTRIES, index_offset=st.integers(200, 1600), block=st.integers(1, 5))
def test_a_sealed_pack_s_index_on_disk_reads_as_a_dict_of_it(
        entries: list[pf.Entry], index_offset: int, block: int) -> None:
    """Any set of index entries (a key put twice, touches, entries past the index that a
    reader skips, keys straddling blocks of any size): ``find`` and ``items`` answer what a
    dict of the index does, and the filter never rules out a key that is there."""
    entries = [e._replace(length=0) if e.kind == pf.TOUCH else e for e in entries]
    index = pf.encode_seal(entries, index_offset)[:-pf.TRAILER_SIZE]
    digests = SealedDigests(index_offset, index, block=block)
    reads: list[int] = []

    def read_at(offset: int, length: int) -> bytes:
        reads.append(length)
        return index[offset - index_offset:offset - index_offset + length]

    model = _model(entries, index_offset)
    for namespace in ("page", "headers", "p", "pages"):
        for digest in _DIGESTS:
            want = model.get((namespace, digest))
            if want is not None:
                assert digests.might_hold(*probe(digest))
            assert digests.find(sealed_key(namespace, digest), read_at) == want
    assert list(digests.items(read_at)) == [(*k, v) for k, v in sorted(model.items())]
    table = array("Q", bytes(8 * digests.words))  # the filter is each payload's probe
    for e in entries:
        if e.kind == pf.PAYLOAD and e.offset + pf.RECORD_SIZE + e.length <= index_offset:
            word, mask = probe(e.digest)
            table[word % digests.words] |= mask
    assert digests.filter == table
    assert sorted(digests.touches(read_at)) == sorted(
        (e.namespace, e.digest, e.time) for e in entries
        if e.kind == pf.TOUCH and e.offset + pf.RECORD_SIZE <= index_offset)
    assert all(length <= block * pf.ENTRY_SIZE for length in reads)


def test_the_filter_rules_out_nearly_every_absent_digest() -> None:
    """16 bits a payload: fewer than 1% of absent digests cost a block read (0.3% here)."""
    n = 20_000
    entries = [pf.Entry(pf.PAYLOAD, "page", blake3.blake3(i.to_bytes(4, "big")).digest(),
                        64 + 100 * i, 4, i) for i in range(n)]
    digests = SealedDigests(64 + 100 * n, pf.encode_seal(entries, 64 + 100 * n)[:-64])
    passed = sum(digests.might_hold(*probe(blake3.blake3(b"x%d" % i).digest()))
                 for i in range(n))
    assert passed < n // 100, passed
    assert digests.nbytes() < 4 * n  # about 3.7 bytes a payload in memory (62 held whole)


def test_a_block_that_changed_on_disk_is_never_believed() -> None:
    entries = [pf.Entry(pf.PAYLOAD, "page", d, 64, 1, 5) for d in _DIGESTS]
    index = pf.encode_seal(entries, 200)[:-64]
    digests = SealedDigests(200, index, block=4)
    damaged = bytearray(index)
    damaged[5 * pf.ENTRY_SIZE + 90] ^= 1  # an entry's time, in the second block
    with pytest.raises(DamagedIndex, match="block 1 of the index fails its checksum"):
        list(digests.items(lambda offset, length: bytes(damaged[offset - 200:][:length])))
    with pytest.raises(DamagedIndex):  # a short read is no better
        digests.find(sealed_key("page", _DIGESTS[0]), lambda offset, length: b"")


def _payload_records(root: Path) -> int:
    count = 0
    for path in (root / PACKS_DIR).glob("*.pack"):
        data = path.read_bytes()
        found = pf.scan(lambda offset, length, data=data: data[offset:offset + length],
                        pf.FILE_HEADER_SIZE, len(data))
        count += sum(e.kind == pf.PAYLOAD for e in found.entries)
    return count


_STORE_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(["page", "headers"]), st.integers(0, 40)),
    st.tuples(st.just("reopen"), st.none(), st.none()),
    st.tuples(st.just("other"), st.sampled_from(["page", "headers"]), st.integers(0, 40)),
), min_size=1, max_size=40)


@settings(max_examples=25, deadline=None)
@given(ops=_STORE_OPS)
def test_any_sequence_of_puts_seals_and_reopens_answers_as_a_dict(ops: list) -> None:
    """Puts (some of content stored already, in this store or by another store on the same
    packs), packs sealed as they fill, the store closed and opened again: every payload
    put reads back, one not put is missing, each content is stored once (dedup through
    the sealed packs' indexes on disk, as it was through the memory index)."""
    with tempfile.TemporaryDirectory() as tmp:
        root, model = Path(tmp), {}
        def payload(i: int) -> bytes:
            return bytes([i]) * (50 + 23 * i)
        store = PackStore(root, pack_bytes=4096, clock=lambda: 1000.0)
        try:
            for op, namespace, i in ops:
                if op == "reopen":
                    store.close()
                    store = PackStore(root, pack_bytes=4096, clock=lambda: 1000.0)
                    continue
                if op == "other":  # another appender, sealing its pack as it closes
                    with PackStore(root, pack_bytes=4096, clock=lambda: 1000.0) as other:
                        ref = other.put(namespace, payload(i))
                    store.refresh()  # what a lookup that misses does (a put does not)
                else:
                    ref = store.put(namespace, payload(i))
                model[ref] = payload(i)
            assert sorted(store.iter_refs(), key=str) == sorted(model, key=str)
            for ref, data in model.items():
                assert store.read(ref, verify=True) == data
            absent = ArtifactRef("page", blake3.blake3(b"never").hexdigest(), 5)
            with pytest.raises(ArtifactMissingError):
                store.check(absent)
        finally:
            store.close()
        assert _payload_records(root) == len(model)


def test_a_sealed_pack_whose_index_changed_on_disk_fails_its_reads(tmp_path: Path) -> None:
    """The index stays on disk: a byte of it changed after the store checked it is found
    by its block's checksum, and a read fails as corrupt instead of going elsewhere."""
    with PackStore(tmp_path) as store:
        ref = store.put("page", b"evidence")
    with PackStore(tmp_path) as store:
        (pack,) = (tmp_path / PACKS_DIR).glob("*.pack")
        pack.chmod(0o644)
        with pack.open("r+b") as f:
            f.seek(-pf.TRAILER_SIZE - 1, 2)  # the last byte of the (one) index entry
            last = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([last[0] ^ 1]))
        with pytest.raises(ArtifactCorruptError, match="index of sealed pack .* changed"):
            store.read(ref)
