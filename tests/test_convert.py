"""``evidence convert``: a store's payload files moved into packs, only when asked; the same
evidence before and after; killed anywhere (a real SIGKILL), a second run finishes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evidence import Store, verify
from evidence._archive.export import export
from evidence._cli.main import main as cli_main
from evidence._store.convert import convert_to_packs
from evidence._store.packs import PackStore
from evidence._store.runlock import crawl_lock

from .conftest import Factory, submit_all

ROOT = Path(__file__).resolve().parent.parent
DAY = 86400


def files_store(path: Path, pages: int = 12) -> list:
    """A store in the layout of stores made before packs, with pages, links and orphans."""
    with Store.create(path, artifact_layout="files") as store:
        make = Factory(store)
        messages: list = [make.session(), make.run()]
        bodies = []
        for i in range(pages):
            body = make.body(f"<html><a href=/p{i + 1}>page {i}</a></html>".encode() * 20)
            attempt = make.attempt(f"http://example.com/p{i}", body=body)
            messages += [attempt, make.discovery(attempt, body, [f"http://example.com/p{i + 1}"])]
            bodies.append(body)
        submit_all(store, messages)
        orphan = store.artifacts.put("body", b"an orphan from a crash, two days old")
        then = time.time() - 2 * DAY
        os.utime(store.artifacts.path_for(orphan), (then, then))
        return [*bodies, orphan]


def dump(archive: Path) -> bytes:
    return (archive / "dump.sql").read_bytes()


def test_a_converted_store_holds_the_same_evidence_in_packs(tmp_path: Path) -> None:
    refs = files_store(tmp_path / "s")
    export(tmp_path / "s", tmp_path / "before")
    assert (tmp_path / "s" / "artifacts" / "LAYOUT").read_text() == "evidence-artifacts 2\n"
    with Store.open(tmp_path / "s") as store:  # opened: read and written as it is
        assert not isinstance(store.artifacts, PackStore)
    report = convert_to_packs(tmp_path / "s")
    assert (report.layout_before, report.payloads, report.packed, report.removed) == (
        "files", len(refs), len(refs), len(refs))
    artifacts = tmp_path / "s" / "artifacts"
    assert sorted(p.name for p in artifacts.iterdir()) == ["LAYOUT", "PACKS"]
    assert (artifacts / "LAYOUT").read_text() == "evidence-artifacts 3\n"
    with Store.open(tmp_path / "s", read_only=True) as store:
        assert isinstance(store.artifacts, PackStore)
        assert all(sealed for _, sealed, _ in store.artifacts.packs())
        report_after = verify(store, full=True)
        assert report_after.ok and report_after.checks["orphans"] == 1
        assert store.artifacts.age(refs[-1]) == pytest.approx(2 * DAY, abs=60)  # kept
    export(tmp_path / "s", tmp_path / "after")
    assert dump(tmp_path / "after") == dump(tmp_path / "before")
    before = json.loads((tmp_path / "before" / "manifest.json").read_text())
    after = json.loads((tmp_path / "after" / "manifest.json").read_text())
    assert after["tables"] == before["tables"] and after["artifacts"] == before["artifacts"]
    again = convert_to_packs(tmp_path / "s")  # idempotent: nothing left to do
    assert (again.payloads, again.packed, again.removed) == (0, 0, 0)


@pytest.mark.parametrize(("phase", "at"), [("packing", 1), ("packing", 7),
                                           ("removing files", 5)])
def test_a_conversion_killed_anywhere_is_finished_by_the_next_run(
        tmp_path: Path, phase: str, at: int) -> None:
    refs = files_store(tmp_path / "s")
    export(tmp_path / "s", tmp_path / "before")
    code = (f"import os, signal, sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from evidence._store.convert import convert_to_packs\n"
            "def progress(phase, done, total):\n"
            f"    if phase == {phase!r} and done == {at}:\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            f"convert_to_packs({str(tmp_path / 's')!r}, progress=progress)\n")
    assert subprocess.run([sys.executable, "-c", code]).returncode == -9
    with Store.open(tmp_path / "s", read_only=True) as store:  # readable in between
        assert verify(store, full=True).ok
    report = convert_to_packs(tmp_path / "s")
    assert report.packed + report.already_packed == report.payloads  # the files left
    assert sorted(p.name for p in (tmp_path / "s" / "artifacts").iterdir()) == [
        "LAYOUT", "PACKS"]
    with Store.open(tmp_path / "s") as store:
        assert verify(store, full=True).ok
        for ref in refs:
            store.artifacts.verify(ref)
    export(tmp_path / "s", tmp_path / "after")
    assert dump(tmp_path / "after") == dump(tmp_path / "before")


def test_a_damaged_file_is_left_in_place_and_reported(tmp_path: Path) -> None:
    refs = files_store(tmp_path / "s", pages=3)
    with Store.open(tmp_path / "s") as store:
        path = store.artifacts.path_for(refs[1])
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-1] + b"!")
    report = convert_to_packs(tmp_path / "s")
    assert report.kept == [str(path)] and report.packed == len(refs) - 1
    assert path.exists()
    with Store.open(tmp_path / "s", read_only=True) as store:
        [corrupt] = verify(store, full=True).errors
        assert corrupt.kind == "artifact_corrupt" and corrupt.location.digest == refs[1].digest


def test_the_command_refuses_while_a_crawl_runs_and_says_what_it_did(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files_store(tmp_path / "s", pages=2)
    with crawl_lock(tmp_path / "s"):
        assert cli_main(["convert", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "Error:" in err and "another crawl" in err and "Try:" in err
    assert (tmp_path / "s" / "artifacts" / "LAYOUT").read_text() == "evidence-artifacts 2\n"
    assert cli_main(["convert", str(tmp_path / "s"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["packed"] == data["removed"] == 3
    assert cli_main(["convert", str(tmp_path / "s")]) == 0
    assert "nothing to convert" in capsys.readouterr().out
    assert cli_main(["convert", str(tmp_path / "nowhere")]) == 2
    assert "no evidence store here" in capsys.readouterr().err
