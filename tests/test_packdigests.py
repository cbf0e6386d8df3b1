"""The pack store's digest index in compact form (issue 35 point 2: flat memory).

``DigestIndex`` answers exactly what the dict it replaced answered, over any sequence of
sets, removals and lookups (merged into its base on the way); and a pack store's memory
grows by about the index's 62 bytes per payload it holds (65 measured; it was 344: a dict
entry, a tuple of four ints and a digest object per payload, plus each sealed pack's own
list of its records, kept until the store closed).
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import blake3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence._store.packdigests import BYTES_PER_ENTRY, DigestIndex
from evidence._store.packs import PackStore

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
    """N payloads, then N more: what the second N added, per payload, is about the
    compact index's entry (62 bytes), not a dict's plus the sealed packs' record lists
    (344 bytes here before): a crawl of three payloads a page grew 19.5 MB per 10,000
    pages with them (docs/benchmarks.md, "Writes and memory over a crawl")."""
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
        assert len(store._index) == 2 * n
        assert len(store.packs()) == 5  # four full, one spare
    per_payload = (at_2n - at_n) / n
    assert per_payload < 80, f"{per_payload:.0f} bytes of memory per payload put"
