"""``compare`` covers the payloads, not only the rows (issue 29): two stores or archives
whose rows are equal but whose payloads differ (one missing, one with other bytes, an
archive's file replaced) are not equal, and the difference names the payload. Without
``--full`` a payload is looked up by its presence and size; ``--full`` re-hashes it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from evidence import ArtifactRef, Store, compare
from evidence._archive.archive import backup
from evidence._archive.export import export
from evidence._cli.main import main as cli_main

from .conftest import Factory, as_format_1, flip_payload_byte, lose_payload, submit_all


@pytest.fixture
def pair(populated_store: Store, tmp_path: Path) -> tuple[Store, Path, ArtifactRef]:
    """A store, its backup (equal, payloads included) and the payload they share."""
    backup(populated_store, tmp_path / "copy")
    (ref,) = populated_store.artifacts.iter_refs()
    return populated_store, tmp_path / "copy", ref


def payload_differences(a: object, b: object, *, full: bool = False) -> set[tuple]:
    result = compare(a, b, full=full)  # type: ignore[arg-type]
    assert result.equal == (result.differences == [])
    return {(d.what, d.name, d.a, d.b) for d in result.differences}


def test_equal_stores_compare_equal_with_their_payloads_re_hashed(pair) -> None:
    store, copy, _ref = pair
    for full in (False, True):
        result = compare(store, copy, full=full)
        assert result.equal and result.differences == [], result.differences
        assert result.payloads == 1 and result.full is full
        assert result.a.payloads == result.a.payloads_held == 1
        assert result.b.payloads == result.b.payloads_held == 1


def test_a_payload_missing_on_one_side_is_a_difference_that_names_it(
        pair, capsys: pytest.CaptureFixture[str]) -> None:
    store, copy, ref = pair
    with Store.open(copy) as damaged:
        lose_payload(damaged, ref)
    name = f"{ref.namespace}/{ref.digest}"
    assert payload_differences(store, copy) == {("payload", name, "held", "missing")}
    assert payload_differences(copy, store, full=True) == {("payload", name, "missing", "held")}
    assert cli_main(["compare", str(store.path), str(copy)]) == 1
    text = capsys.readouterr().out
    assert f"DIFF payload {name}: a=held b=missing\n" in text
    assert "b  store" in text and "0 of 1 payloads held" in text
    assert re.search(r"\n1 differences: compared \d+ tables, 1 run\(s\), \d+ report rows, "
                     r"1 payloads \(present, by size; --full re-hashes\)\n$", text), text
    assert cli_main(["compare", str(store.path), str(copy), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["equal"] is False and result["b"]["payloads_held"] == 0
    assert result["differences"] == [
        {"what": "payload", "name": name, "key": "", "a": "held", "b": "missing"}]


def test_a_payload_whose_bytes_were_altered_differs_once_re_hashed(pair) -> None:
    """The same size, other bytes: only a re-hash tells them apart, as ``verify --full``."""
    store, copy, ref = pair
    with Store.open(copy) as damaged:
        flip_payload_byte(damaged, ref)
    assert payload_differences(store, copy) == set()  # present, with its size
    assert payload_differences(store, copy, full=True) == {
        ("payload", f"{ref.namespace}/{ref.digest}", "held", "corrupt")}


@pytest.mark.parametrize(("replacement", "found_without_full"), [
    (b"<html>HELLO</html>", False),  # the same size, other bytes
    (b"<html>another page</html>", True),  # another size
    (None, True),  # the file deleted
])
def test_an_archive_whose_payload_file_was_replaced_is_not_equal_to_its_source(
        pair, tmp_path: Path, replacement: bytes | None, found_without_full: bool) -> None:
    """(An archive of format 1, one file per payload, as older evidence wrote it; format 2's
    segments: the next test.)"""
    store, _copy, ref = pair
    export(store, tmp_path / "archive")
    as_format_1(tmp_path / "archive")
    file = tmp_path / "archive" / "artifacts" / ref.namespace / ref.digest[:2] / ref.digest
    assert file.read_bytes() == b"<html>hello</html>"
    file.chmod(0o644)
    if replacement is None:
        file.unlink()
    else:
        file.write_bytes(replacement)
    state = "missing" if replacement is None else "corrupt"
    name = f"{ref.namespace}/{ref.digest}"
    quick = payload_differences(store, tmp_path / "archive")
    assert quick == ({("payload", name, "held", state)} if found_without_full else set())
    assert payload_differences(tmp_path / "archive", store, full=True) == {
        ("payload", name, state, "held")}


def test_an_archive_whose_segment_bytes_were_altered_differs_once_re_hashed(
        pair, tmp_path: Path) -> None:
    """Format 2: a payload's bytes altered inside its segment (same size): present by
    size, found corrupt once re-hashed."""
    store, _copy, ref = pair
    export(store, tmp_path / "archive")
    segment = tmp_path / "archive" / "artifacts" / "segment-000000"
    data = segment.read_bytes()
    assert data.count(b"<html>hello</html>") == 1
    segment.chmod(0o644)
    segment.write_bytes(data.replace(b"<html>hello</html>", b"<html>HELLO</html>"))
    name = f"{ref.namespace}/{ref.digest}"
    assert payload_differences(store, tmp_path / "archive") == set()
    assert payload_differences(tmp_path / "archive", store, full=True) == {
        ("payload", name, "corrupt", "held")}


def test_a_payload_only_one_side_references_is_named_with_its_rows(
        populated_store: Store, make: Factory, tmp_path: Path) -> None:
    """A payload the other side's rows do not reference at all is listed as such (None),
    besides the artifact row that differs."""
    backup(populated_store, tmp_path / "copy")
    body = make.body(b"<html>only in a</html>")
    acks = submit_all(populated_store, [make.session("s2"), make.run("r2", "s2"), make.attempt(
        "http://example.com/new", run_id="r2", body=body)])
    assert [a.status for a in acks] == ["committed"] * 3
    found = payload_differences(populated_store, tmp_path / "copy")
    assert ("payload", f"body/{body.digest}", "held", None) in found
    assert any(what == "table" and name == "artifact" for what, name, _a, _b in found)
