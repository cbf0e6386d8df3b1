"""An S3 store's payloads in segment objects (layout 2), against a real server (SeaweedFS).

The store a writer runs beside holds its puts until the batch's sync and seals them into
one content-addressed segment (one PUT for the group commit). Proved here: the round trip
through a fresh reader, the one PUT per sync, dedup, reclaim rewriting a segment without
its orphans, a damaged index, a writer SIGKILLed between a segment's PUT and its COMMIT,
a layout-1 store (one object per payload) still read and written, and any sequence of
puts, syncs, removals and reopenings.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import ArtifactRef, Store, reclaim_orphans, verify
from evidence._store.s3 import S3ArtifactStore, open_s3
from evidence._store.s3segment import build_segment, parse_index, parse_trailer
from evidence.testing.seaweed import SeaweedS3

from .conftest import Factory, new_s3_url, submit_all

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def s3_env(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in seaweed.environ.items():
        monkeypatch.setenv(name, value)


def _s3(store: Store) -> S3ArtifactStore:
    assert isinstance(store.artifacts, S3ArtifactStore)
    return store.artifacts


def _payload_objects(s3: S3ArtifactStore) -> list[str]:
    """Keys of layout-1 objects (one per payload) under the store's prefix."""
    base = s3.location_.prefix + "/"
    return [item.key for item in s3.client.list(base)
            if getattr(item, "key", "").startswith(base + "body/")]


def test_the_segment_format_round_trips_and_names_its_bytes() -> None:
    items = [("body", blake3.blake3(b"x" * n).hexdigest(), b"x" * n) for n in (0, 1, 70_000)]
    body, entries, name = build_segment(items)
    assert name == blake3.blake3(body).hexdigest()
    assert [(e.namespace, e.digest) for e in entries] == sorted(i[:2] for i in items)
    start, length, check = parse_trailer(body[-64:], len(body))
    index = parse_index(body[start:start + length], check, start)
    for namespace, digest, data in items:
        entry = index[(namespace, digest)]
        assert body[entry.offset:entry.offset + entry.size] == data
    damaged = bytearray(body)
    damaged[start] ^= 1
    with pytest.raises(ValueError, match="does not match"):
        parse_index(bytes(damaged[start:start + length]), check, start)


def test_a_batch_of_puts_is_one_segment_put_at_the_sync_and_reads_back_anywhere(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: None) -> None:
    url = new_s3_url(seaweed, "seg")
    with Store.create(tmp_path / "s", artifacts=url) as store:
        s3 = _s3(store)
        bodies = [os.urandom(n) for n in (0, 10, 5000, 5000, 200_000)] + [b"twice"] * 2
        refs = [s3.put("body", body) for body in bodies]
        assert s3.segment_keys() == [] and _payload_objects(s3) == []  # held
        assert s3.read(refs[2]) == bodies[2]  # a held payload reads from memory
        before = s3.client.requests
        s3.sync(refs[:1])
        assert s3.client.requests - before == 1, "one conditional PUT for the lot"
        [segment] = s3.segment_keys()
        before = s3.client.requests
        assert s3.put("body", bodies[3]) == refs[3]  # in a young segment: not held again
        s3.sync([refs[3]])
        assert s3.check_each(refs) == [None] * len(refs)
        assert s3.client.requests - before == 1, "one HEAD of the segment for all of them"
        make = Factory(store)
        acks = submit_all(store, [make.session(), make.run(), *(
            make.attempt(f"http://example.com/{i}", body=ref) for i, ref in enumerate(refs))])
        assert {a.status for a in acks} == {"committed"}
    with Store.open(tmp_path / "s", read_only=True, artifacts=url) as reader:
        fresh = _s3(reader)
        for ref, body in zip(refs, bodies, strict=True):
            assert fresh.read(ref, verify=True) == body
            assert fresh.read_range(ref, 1, 3) == body[1:4]
        assert sorted(set(refs), key=lambda r: (r.namespace, r.digest)) == list(fresh.iter_refs())
        assert fresh.location(refs[4]).startswith(f"s3://{seaweed.bucket}/{segment}@")
        assert verify(reader, full=True).ok
        assert fresh.layout == 2
        assert fresh.client.get(fresh._base + "LAYOUT") == b"evidence-s3-artifacts 2\n"


def test_a_payload_stored_before_is_stored_again_only_when_the_writer_names_it(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Dedup across segments: a body put again after its segment's first minute (here at
    once) is held as a copy; the writer names only payloads no row references, so a copy
    of a referenced body is dropped, not stored twice, and an orphan about to be
    referenced is stored again (young, as reclaim's grace period needs)."""
    import evidence._store.s3puts as s3_module

    monkeypatch.setattr(s3_module, "_TOUCH_AFTER", 0.0)
    with Store.create(tmp_path / "s", artifacts=new_s3_url(seaweed, "dedup")) as store:
        s3 = _s3(store)
        make = Factory(store)
        twice = s3.put("body", b"a body fetched twice")
        submit_all(store, [make.session(), make.run(),
                           make.attempt("http://example.com/1", body=twice)])
        [first] = s3.segment_keys()
        assert s3.put("body", b"a body fetched twice") == twice
        other = s3.put("body", b"another page")
        acks = submit_all(store, [make.attempt("http://example.com/2", body=twice),
                                  make.attempt("http://example.com/3", body=other)])
        assert {a.status for a in acks} == {"committed"}
        [second] = set(s3.segment_keys()) - {first}
        assert set(s3._segments[second].entries) == {("body", other.digest)}
        orphan = s3.put("body", b"stored, then its crawl died before the commit")
        s3.sync([orphan])
        [third] = set(s3.segment_keys()) - {first, second}
        assert s3.put("body", b"stored, then its crawl died before the commit") == orphan
        last = s3.put("body", b"a last page")
        acks = submit_all(store, [make.attempt("http://example.com/4", body=orphan),
                                  make.attempt("http://example.com/5", body=last)])
        assert {a.status for a in acks} == {"committed"}
        [fourth] = set(s3.segment_keys()) - {first, second, third}
        assert set(s3._segments[fourth].entries) == {("body", orphan.digest),
                                                     ("body", last.digest)}
        assert [r.digest for r in s3.iter_refs()] == sorted(
            r.digest for r in (twice, other, orphan, last))
        assert verify(store, full=True).ok


def test_reclaim_rewrites_a_segment_without_its_orphans_and_keeps_the_rest(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: None) -> None:
    url = new_s3_url(seaweed, "reclaim")
    with Store.create(tmp_path / "s", artifacts=url) as store:
        s3 = _s3(store)
        kept = s3.put("body", b"referenced by a committed attempt")
        orphans = [s3.put("body", b"orphan %d" % i) for i in range(2)]
        make = Factory(store)
        submit_all(store, [make.session(), make.run(), make.attempt(body=kept)])
        s3.sync(orphans)  # stored, then the crawler died before any row named them
        [old] = s3.segment_keys()
        assert reclaim_orphans(store, 3600.0).kept_young == 2
        report = reclaim_orphans(store, 0.0)
        assert report.bytes_freed == sum(r.size for r in orphans)
        [new] = s3.segment_keys()
        assert new != old
        assert list(s3.iter_refs()) == [kept]
        assert s3.read(kept, verify=True) == b"referenced by a committed attempt"
        assert not any(s3.exists(r) for r in orphans)
        assert verify(store, full=True).ok


def test_a_segment_whose_index_is_damaged_is_not_trusted_and_verify_says_so(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: None) -> None:
    url = new_s3_url(seaweed, "index")
    with Store.create(tmp_path / "s", artifacts=url) as store:
        s3 = _s3(store)
        ref = s3.put("body", b"a payload whose segment's index is damaged")
        make = Factory(store)
        submit_all(store, [make.session(), make.run(), make.attempt(body=ref)])
        [key] = s3.segment_keys()
        data = bytearray(s3.client.get(key) or b"")
        data[ref.size] ^= 0x01  # the index's first byte, the payload untouched
        s3.client.delete(key)
        s3.client.put_if_absent(key, bytes(data), sha256=hashlib.sha256(
            data).digest(), md5=hashlib.md5(data).digest())
    with Store.open(tmp_path / "s", read_only=True, artifacts=url) as reader:
        report = verify(reader, full=False)
        assert [f.kind for f in report.findings] == ["artifact_missing"]


_WRITER = textwrap.dedent("""
    import sys
    from evidence import Store
    from tests.conftest import Factory, submit_all
    store = Store.open(sys.argv[1])
    make = Factory(store)
    committed = store.artifacts.put("body", b"committed before the kill")
    submit_all(store, [make.session(), make.run(), make.attempt(body=committed)])
    stored = store.artifacts.put("body", b"stored, its batch never committed")
    store.artifacts.sync([stored])
    held = store.artifacts.put("body", b"held, never stored")
    print(committed.digest, stored.digest, held.digest, flush=True)
    sys.stdin.read()  # killed here
""")


def test_a_writer_killed_between_its_segment_put_and_its_commit_leaves_an_orphan_only(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: None) -> None:
    """SIGKILL of a real process: what it committed reads back, the payload whose segment
    was acknowledged but whose batch never committed is an orphan that reclaim removes,
    and a payload it only held is nowhere; verify finds nothing wrong."""
    url = new_s3_url(seaweed, "kill")
    with Store.create(tmp_path / "s", artifacts=url):
        pass
    with subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path / "s")], cwd=REPO,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        try:
            line = proc.stdout.readline() if proc.stdout else ""
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(60)
    committed, stored, held = line.split()
    with Store.open(tmp_path / "s") as store:
        s3 = _s3(store)
        listed = {r.digest: r for r in s3.iter_refs()}
        assert set(listed) == {committed, stored}
        assert s3.read(listed[committed], verify=True) == b"committed before the kill"
        assert verify(store, full=True).ok
        report = reclaim_orphans(store, 0.0)
        assert report.bytes_freed == listed[stored].size
        assert [r.digest for r in s3.iter_refs()] == [committed]
        assert not s3.exists(ArtifactRef("body", held, 26))
        assert verify(store, full=True).ok


def test_a_layout_1_store_is_still_read_and_takes_segments_once_upgraded(
        tmp_path: Path, seaweed: SeaweedS3, s3_env: None) -> None:
    """A store written before segments (LAYOUT 1, one object per payload): opened by a
    writer, its LAYOUT becomes 2 (an older program then refuses it rather than miss the
    segments), its old objects are checked, read and verified, new puts go to segments."""
    url = new_s3_url(seaweed, "old")
    first = open_s3(url, create=True, read_only=False)
    key = first._base + "LAYOUT"
    first.client.delete(key)
    first.client.put_if_absent(key, b"evidence-s3-artifacts 1\n",
                               sha256=hashlib.sha256(
                                   b"evidence-s3-artifacts 1\n").digest(),
                               md5=hashlib.md5(
                                   b"evidence-s3-artifacts 1\n").digest())
    first.close()
    old = open_s3(url, create=False, read_only=False)  # as a program of layout 1 wrote
    assert old.layout == 1
    old_ref = old.put("body", b"an object of its own, from before segments")
    old.close()
    with Store.create(tmp_path / "s", artifacts=url) as store:
        s3 = _s3(store)
        assert s3.layout == 2
        assert s3.client.get(key) == b"evidence-s3-artifacts 2\n"
        new_ref = s3.put("body", b"a payload in a segment")
        make = Factory(store)
        acks = submit_all(store, [make.session(), make.run(),
                                  make.attempt("http://example.com/old", body=old_ref),
                                  make.attempt("http://example.com/new", body=new_ref)])
        assert {a.status for a in acks} == {"committed"}
        assert len(s3.segment_keys()) == 1 and len(_payload_objects(s3)) == 1
    with Store.open(tmp_path / "s", read_only=True, artifacts=url) as reader:
        fresh = _s3(reader)
        assert fresh.read(old_ref, verify=True) == b"an object of its own, from before segments"
        assert fresh.read(new_ref, verify=True) == b"a payload in a segment"
        assert list(fresh.iter_refs()) == sorted([old_ref, new_ref], key=lambda r: r.digest)
        assert verify(reader, full=True).ok


_BODIES = [b"", b"a", b"payload b" * 50, bytes(range(256)) * 40, b"d" * 70_000]


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, len(_BODIES) - 1)),
    st.tuples(st.just("sync"), st.just(0)),
    st.tuples(st.just("remove"), st.integers(0, len(_BODIES) - 1)),
    st.tuples(st.just("reopen"), st.just(0))), max_size=12))
def test_any_sequence_of_puts_syncs_removals_and_reopens_reads_back_what_was_stored(
        seaweed: SeaweedS3, steps: list[tuple[str, int]]) -> None:
    """Whatever the order of puts, syncs, removals (reclaim's) and reopenings (close seals
    what is held): every payload put and not removed since reads back exactly, from the
    store and from a fresh reader once it was synced or the store closed, and a listing
    names each once."""
    url = new_s3_url(seaweed, "prop")

    def opened() -> S3ArtifactStore:
        return open_s3(url, create=True, read_only=False, environ=seaweed.environ,
                       hold=True)

    store = opened()
    present: dict[str, bytes] = {}  # digest -> bytes: put and not removed since
    durable: set[str] = set()  # of those, synced or sealed at a close
    try:
        for op, i in steps:
            body = _BODIES[i]
            digest = blake3.blake3(body).hexdigest()
            if op == "put":
                assert store.put("body", body) == ArtifactRef("body", digest, len(body))
                present[digest] = body
            elif op == "sync":
                store.sync(ArtifactRef("body", d, len(b)) for d, b in present.items())
                durable |= set(present)
            elif op == "remove" and digest in present:
                freed = store.remove(ArtifactRef("body", digest, len(body)))
                assert freed is not None and freed >= len(body)  # (two copies: twice)
                del present[digest]
                durable.discard(digest)
            elif op == "reopen":
                store.close()
                durable |= set(present)
                store = opened()
            for d, b in present.items():
                assert store.read(ArtifactRef("body", d, len(b)), verify=True) == b
        reader = open_s3(url, create=False, read_only=True, environ=seaweed.environ)
        try:
            listed = [r.digest for r in reader.iter_refs()]
            assert listed == sorted(durable)
            for d in durable:
                assert reader.read(ArtifactRef("body", d, len(present[d])),
                                   verify=True) == present[d]
        finally:
            reader.close()
    finally:
        store.close()
