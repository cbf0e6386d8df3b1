"""Every location a command takes is checked by scheme before anything is made (issue 29).

``evidence backup st --out s3://bucket/x`` used to exit 0 having made ``./s3:/bucket/x``: a
user believed the backup had left the machine. Now each argument that names a store, an
archive, a payload location, a checkpoint destination or an output file says which schemes
it takes, and refuses the others by name: exit status 2, ``Error:`` and ``Try:``, and
nothing created in the working directory.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from evidence._cli import common
from evidence._cli.main import build_parser, main

# Each command line with {L} where a location goes; and whether that argument takes s3://.
LOCATIONS = [
    ("init {L}", False),
    ("init st --artifacts {L}", True),
    ("crawl http://127.0.0.1:9/ --store {L}", False),
    ("crawl http://127.0.0.1:9/ --store st --artifacts {L}", True),
    ("crawl http://127.0.0.1:9/ --store st --checkpoint {L}", True),
    ("diff {L} --session a --session b", False),
    ("stop {L}", False),
    ("demo {L}", False),
    ("status {L}", False),
    ("export {L} --out out", False),
    ("export st --out {L}", True),
    ("export st --format wacz --out {L}", True),
    ("export st --format wacz --out out.wacz --new-key {L}", False),
    ("export st --format wacz --out out.wacz --key {L}", False),
    ("export st --format wacz --out out.wacz --key k --cert {L}", False),
    ("export st --format wacz --out out.wacz --key k --cert c --tsa u --tsa-cert {L}", False),
    ("export st --out out --checkpoint {L}", False),
    ("backup {L} --out out", False),
    ("backup st --out {L}", True),
    ("restore {L} --store new", True),
    ("restore archive --store {L}", False),
    ("restore archive --store new --artifacts {L}", False),
    ("compare {L} b", True),
    ("compare a {L}", True),
    ("compare a b --scratch {L}", False),
    ("convert {L}", False),
    ("verify {L}", False),
    ("verify x.wacz --public-key {L}", False),
    ("verify x.wacz --checkpoint-key {L}", False),
    ("verify archive --tsa-root {L}", False),
    ("verify archive --witness-key {L}", False),
    ("keygen {L}", False),
    ("witness keygen {L} --name w", False),
    ("witness serve --key {L} --state s --trust o=k", False),
    ("witness serve --key k --state {L} --trust o=k", False),
    ("checkpoint {L} --new-key k", False),
    ("checkpoint st --new-key {L}", False),
    ("checkpoint st --key k --out {L}", False),
    ("prove {L} --index 0", False),
    ("prove st --index 0 --out {L}", False),
    ("replay {L} http://127.0.0.1:9/", False),
    ("replay st http://127.0.0.1:9/ --out {L}", False),
    ("replay x.wacz --serve --public-key {L}", False),
    ("show {L} http://127.0.0.1:9/", False),
    *((f"show st http://127.0.0.1:9/ --{part} {{L}}", False)
      for part in ("screenshot", "dom", "behaviors", "headers", "request", "body", "content",
                   "certs")),
    ("crawl --config {L}", False),
    ("crawl http://127.0.0.1:9/ --store st --behavior-script {L}", False),
    ("crawl http://127.0.0.1:9/ --store st --seeds {L}", False),
    ("crawl http://127.0.0.1:9/ --store st --cookies {L}", False),
    ("crawl http://127.0.0.1:9/ --store st --secrets {L}", False),
    ("crawl http://127.0.0.1:9/ --store st --listen 127.0.0.1:0 --hosts-file {L}", False),
    ("rules evaluate {L} --rules r.toml", False),
    ("report {L} --run r", False),
    ("report st --run r --out {L}", False),
    ("serve {L}", False),
    ("serve st --artifacts {L}", True),
    ("serve st --socket {L}", False),
    ("tls-cert --host a --out {L}", False),
]
CASES = [(line.replace("{L}", location), scheme)
         for line, takes_s3 in LOCATIONS
         for location, scheme in [("ftp://host/x", "ftp"),
                                  *([] if takes_s3 else [("s3://bucket/x", "s3")])]]
CASES.append(("export st --out http://host/x", "http"))


@pytest.mark.parametrize(("line", "scheme"), CASES, ids=[c[0] for c in CASES])
def test_a_location_scheme_a_command_cannot_use_is_refused_by_name_and_creates_nothing(
        line: str, scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    try:
        status = main(line.split())
    except SystemExit as exc:
        status = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith("Error: ") and "\nTry: " in err, err
    assert f"{scheme}://" in err or "s3" in err, err
    assert list(tmp_path.iterdir()) == [], "nothing is created in the working directory"


def test_every_location_argument_of_every_command_is_typed_and_in_the_walk() -> None:
    """A new command (or a new --out) must say which schemes it takes, and be walked above:
    every argument named like a location, in every command, has a location type and a line
    in ``LOCATIONS``."""
    found = []
    for command, parser in _commands(build_parser()):
        for action in parser._actions:
            if action.dest in _LOCATION_DESTS or (command, action.dest) in _ALSO:
                found.append((command, action))
    assert len(found) > 30
    for command, action in found:
        assert action.type in _LOCATION_TYPES, f"{command} {action.dest} takes any text"
        if action.option_strings:
            wanted = f"{action.option_strings[0]} {{L}}"
            assert any(line.startswith(command + " ") and wanted in line
                       for line, _ in LOCATIONS), f"{command} {wanted} is not walked"
        else:
            assert any(line.startswith(command + " ") and "{L}" in line.split()[
                :line.split().index("{L}") + 1][-1] and not line.split()[
                line.split().index("{L}") - 1].startswith("--")
                for line, _ in LOCATIONS), f"{command} {action.dest} is not walked"


_LOCATION_DESTS = {"store", "out", "artifacts", "archive", "a", "b", "scratch", "new_key",
                   "socket"}
_ALSO = {("crawl", "checkpoint"), ("keygen", "key"), ("witness keygen", "key"),
         ("witness serve", "key"), ("witness serve", "state"), ("crawl", "config"),
         ("crawl", "seeds"), ("crawl", "behavior_script"), ("crawl", "cookies"),
         ("crawl", "secrets"), ("show", "behaviors"),
         *(("show", part) for part in ("screenshot", "dom", "headers", "request", "body",
                                       "content", "certs"))}
_LOCATION_TYPES = {common.store_location, common.local_path, common.local_directory,
                   common.archive_location, common.archive_source, common.compare_source,
                   common.artifacts_location, common.checkpoint_location}


def _commands(parser: argparse.ArgumentParser
              ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
                if nested:
                    for inner, p in nested[0].choices.items():
                        yield f"{name} {inner}", p
                else:
                    yield name, sub


def test_init_at_s3_says_where_a_store_and_its_payloads_can_live(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["init", "s3://bucket/x"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "a store's database cannot live in S3" in err
    assert "Try: " in err and "init DIR --artifacts s3://" in err
    assert not Path("s3:").exists()


def test_the_library_never_makes_a_folder_named_after_a_url_scheme(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from evidence import Store, StoreError, backup, export

    monkeypatch.chdir(tmp_path)
    Store.create(tmp_path / "st").close()
    for call in (lambda: Store.create("s3://bucket/x"),
                 lambda: export(tmp_path / "st", "s3://bucket/x"),
                 lambda: backup(tmp_path / "st", "ftp://host/x")):
        with pytest.raises(StoreError, match="URL"):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["st"]
