"""The artifact-store contract (``evidence._store.backend.ArtifactBackend``), stated once
and run over every implementation (tests/contract/conftest.py): durable before reference,
idempotent put, get returns exactly what was put, exists / iterate / remove."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import ArtifactCorruptError, ArtifactMissingError, ArtifactRef

from .conftest import ArtifactKind

payloads = st.binary(max_size=4096)
namespaces = st.sampled_from(["body", "headers", "robots"])


def test_a_put_that_returned_and_was_synced_survives_a_crash_of_its_medium(
        artifact_kind: ArtifactKind, tmp_path: Path) -> None:
    with artifact_kind.crashable(tmp_path) as medium:
        artifacts = medium.open()
        refs = [artifacts.put("body", f"payload {i}".encode()) for i in range(3)]
        artifacts.sync(refs)  # what the writer does before the COMMIT that references them
        medium.crash()  # power loss (a directory), SIGKILL and restart (an object store)
        after = medium.open()
        for i, ref in enumerate(refs):
            assert after.read(ref, verify=True) == f"payload {i}".encode()


def test_puts_in_a_batch_are_stored_when_it_ends_and_survive_a_crash_once_synced(
        artifact_kind: ArtifactKind, tmp_path: Path) -> None:
    with artifact_kind.crashable(tmp_path) as medium:
        artifacts = medium.open()
        with artifacts.batch():
            refs = [artifacts.put("body", f"batched {i}".encode() * 50) for i in range(20)]
            refs.append(artifacts.put("body", b"batched 0" * 50))  # the same bytes again
        assert refs[-1] == refs[0]
        artifacts.sync(refs)
        medium.crash()
        after = medium.open()
        for i, ref in enumerate(refs[:-1]):
            assert after.read(ref, verify=True) == f"batched {i}".encode() * 50
        assert len(list(after.iter_refs())) == 20


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(st.tuples(namespaces, payloads), max_size=8))
def test_get_returns_exactly_what_was_put_and_a_second_put_changes_nothing(
        artifact_kind: ArtifactKind, tmp_path_factory: pytest.TempPathFactory,
        items: list[tuple[str, bytes]]) -> None:
    artifacts = artifact_kind.open(tmp_path_factory.mktemp("a"))
    refs = [artifacts.put(namespace, data) for namespace, data in items]
    again = [artifacts.put(namespace, data) for namespace, data in items]
    assert again == refs  # idempotent: the same bytes, the same ref
    for ref, (namespace, data) in zip(refs, items, strict=True):
        assert (ref.namespace, ref.size) == (namespace, len(data))
        assert artifacts.read(ref, verify=True) == data
        with artifacts.open(ref, verify=True) as handle:
            assert handle.read() == data
    # One stored copy per distinct content, listed once each, sorted.
    assert list(artifacts.iter_refs()) == sorted(set(refs),
                                                 key=lambda r: (r.namespace, r.digest))


def test_exists_check_and_a_missing_payload(artifact_kind: ArtifactKind,
                                            tmp_path: Path) -> None:
    artifacts = artifact_kind.open(tmp_path)
    ref = artifacts.put("body", b"here")
    absent = ArtifactRef("body", "0" * 64, 4)
    assert artifacts.exists(ref) and not artifacts.exists(absent)
    artifacts.check(ref)
    with pytest.raises(ArtifactMissingError):
        artifacts.check(absent)
    with pytest.raises(ArtifactMissingError):
        artifacts.read(absent)
    wrong_size = ArtifactRef("body", ref.digest, ref.size + 1)
    with pytest.raises(ArtifactCorruptError):
        artifacts.check(wrong_size)


def test_check_each_answers_as_check_does_for_each_ref(artifact_kind: ArtifactKind,
                                                      tmp_path: Path) -> None:
    artifacts = artifact_kind.open(tmp_path)
    with artifacts.batch():
        here = [artifacts.put("body", f"payload {i}".encode()) for i in range(4)]
    absent = ArtifactRef("body", "0" * 64, 4)
    wrong_size = ArtifactRef("body", here[1].digest, here[1].size + 1)
    refs = [here[0], absent, here[1], wrong_size, here[2], absent, here[3]]
    found = artifacts.check_each(refs)
    assert len(found) == len(refs)
    for ref, problem in zip(refs, found, strict=True):
        if problem is None:
            artifacts.check(ref)  # there, as check_each said
        else:
            with pytest.raises(type(problem)):
                artifacts.check(ref)
    assert [type(p) for p in found] == [type(None), ArtifactMissingError, type(None),
                                        ArtifactCorruptError, type(None),
                                        ArtifactMissingError, type(None)]
    assert artifacts.check_each([]) == []


def test_remove_deletes_one_payload_for_reclaim(artifact_kind: ArtifactKind,
                                                tmp_path: Path) -> None:
    artifacts = artifact_kind.open(tmp_path)
    gone, kept = artifacts.put("body", b"orphan"), artifacts.put("body", b"referenced")
    assert artifacts.age(gone) is not None and artifacts.age(gone) >= 0.0
    assert artifacts.remove(gone) == len(b"orphan")
    assert artifacts.remove(gone) is None  # already gone: nothing freed, no error
    assert artifacts.age(gone) is None
    assert not artifacts.exists(gone) and artifacts.exists(kept)
    assert list(artifacts.iter_refs()) == [kept]
    assert artifacts.put("body", b"orphan") == gone  # a later put stores it again


def test_stored_payloads_are_read_only(artifact_kind: ArtifactKind, tmp_path: Path) -> None:
    artifacts = artifact_kind.open(tmp_path)
    ref = artifacts.put("body", b"evidence is never edited in place")
    assert artifacts.is_writable(ref) is False
    assert str(ref.digest) in artifacts.location(ref)


def test_writable_each_answers_as_is_writable_does_for_each_ref(
        artifact_kind: ArtifactKind, tmp_path: Path) -> None:
    artifacts = artifact_kind.open(tmp_path)
    with artifacts.batch():
        here = [artifacts.put("body", f"payload {i}".encode()) for i in range(3)]
    refs = [here[0], ArtifactRef("body", "0" * 64, 4), here[1], here[2], here[0]]
    assert artifacts.writable_each(refs) == [artifacts.is_writable(r) for r in refs] == [
        False] * len(refs)
    assert artifacts.writable_each([]) == []
