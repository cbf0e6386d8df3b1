"""Error paths a new user meets (issue 34 point 6): one ``Error:`` / ``Try:`` each, exit 2,
no traceback, and nothing created by the command that failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from evidence import Store
from evidence._cli.main import main as cli_main

from .conftest import Factory, flip_payload_byte, submit_all


@pytest.fixture
def small(tmp_path: Path) -> Path:
    with Store.create(tmp_path / "st") as store:
        make = Factory(store)
        body = make.body(b"<html>a page</html>")
        submit_all(store, [make.session(), make.run(), make.attempt(body=body)])
    return tmp_path / "st"


@pytest.mark.parametrize(("fmt", "extra"), [("warc", []), ("wacz", ["--new-key", "k.key"])])
def test_a_single_file_export_into_a_missing_directory_says_so_and_creates_nothing(
        small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], fmt: str, extra: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli_main(["export", str(small), "--format", fmt, "--out",
                     f"missing/dir/x.{fmt}", *extra]) == 2
    err = capsys.readouterr().err
    assert err == (f"Error: cannot write the {fmt.upper()} file missing/dir/x.{fmt}: the "
                   "directory missing/dir does not exist\nTry: create it first (mkdir -p "
                   "missing/dir), or choose another path\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"], "no key, no directory"


def test_a_wacz_export_that_fails_leaves_no_new_key_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with Store.create(tmp_path / "st") as store:
        make = Factory(store)
        body = make.body(b"<html>a page</html>")
        submit_all(store, [make.session(), make.run(), make.attempt(body=body)])
        flip_payload_byte(store, body)  # the export stops at a payload that does not match
    monkeypatch.chdir(tmp_path)
    assert cli_main(["export", "st", "--format", "wacz", "--out", "x.wacz",
                     "--new-key", "k.key"]) == 2
    assert capsys.readouterr().err.startswith("Error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"]
