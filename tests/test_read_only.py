"""Stores on read-only media and stores of another user are readable; one mode policy.

Tests run as root, and root ignores permission bits, so "read-only" is made real two ways:
a read-only bind mount of the store (the media case) and the command run as ``nobody``
through ``setpriv`` on a store owned by root (the other-user case). Without root either
way is impossible, and those tests skip saying so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from evidence import (
    ArtifactError,
    FetchAttempt,
    Store,
    StoreError,
    Writer,
)
from evidence._cli.main import main as cli_main
from evidence._store.resync import mark_sync_failed
from evidence.testing.trial import FIXED_TIME

from .conftest import unavailable

NOBODY = 65534


def _root_only(what: str) -> None:
    if os.geteuid() != 0:
        unavailable(f"{what} needs root (tests usually run as root here); not run")


@contextlib.contextmanager
def world_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's tmp_path is 0700), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="evidence-ro-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def read_only_mount(source: Path) -> Iterator[Path]:
    """``source`` bind-mounted read-only: writes fail with EROFS, even for root."""
    _root_only("a read-only bind mount")
    target = Path(tempfile.mkdtemp(prefix="evidence-rom-", dir="/tmp"))
    try:
        done = subprocess.run(["mount", "--bind", str(source), str(target)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            unavailable(f"cannot bind-mount here ({done.stderr.strip()})")
        try:
            remount = subprocess.run(["mount", "-o", "remount,ro,bind", str(target)],
                                     capture_output=True, text=True, check=False)
            if remount.returncode != 0:
                unavailable(f"cannot remount read-only here ({remount.stderr.strip()})")
            yield target
        finally:
            subprocess.run(["umount", "-l", str(target)], check=False)
    finally:
        with contextlib.suppress(OSError):
            target.rmdir()


def as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    """``evidence ARGS`` run as the user nobody."""
    _root_only("running a command as another user")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        unavailable("setpriv (util-linux) is not installed")
    return subprocess.run(
        [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         sys.executable, "-m", "evidence", *args],
        capture_output=True, text=True, check=False, timeout=120, cwd="/")


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and directory under ``root``: (size, mtime_ns, mode)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            st = os.lstat(Path(dirpath) / name)
            found[str((Path(dirpath) / name).relative_to(root))] = (
                st.st_size, st.st_mtime_ns, st.st_mode)
    return found


@pytest.fixture(scope="module")
def demo_store() -> Iterator[Path]:
    """A crawled store (the demo site on 127.0.0.1), closed cleanly: no WAL, no index."""
    with world_dir() as d:
        store = d / "demo"
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            assert cli_main(["demo", str(store)]) == 0
        yield store


@pytest.fixture
def store_copy(demo_store: Path) -> Iterator[Path]:
    with world_dir() as d:
        target = d / "store"
        shutil.copytree(demo_store, target, symlinks=True)
        yield target


def reading_commands(store: Path, out: Path) -> dict[str, list[str]]:
    with Store.open(store, read_only=True) as s:
        url, run_id = s.connection.execute(
            "SELECT url, run_id FROM fetch_attempt WHERE http_status = 200 LIMIT 1"
        ).fetchall()[0]
    return {
        "status": ["status", str(store), "--json"],
        "verify": ["verify", str(store)],
        "verify --full": ["verify", str(store), "--full"],
        "export": ["export", str(store), "--out", str(out / "archive")],
        "export warc": ["export", str(store), "--format", "warc", "--out", str(out / "w.warc")],
        "export wacz": ["export", str(store), "--format", "wacz", "--out", str(out / "w.wacz"),
                        "--new-key", str(out / "wacz.key")],
        "replay": ["replay", str(store), url, "--out", str(out / "replayed")],
        "report": ["report", str(store), "--run", run_id, "--out", str(out / "report.txt")],
        "compare": ["compare", str(store), str(store)],
        "backup": ["backup", str(store), "--out", str(out / "backup")],
        "checkpoint": ["checkpoint", str(store), "--new-key", str(out / "key")],
        "prove": ["prove", str(store), "--index", "0", "--out", str(out / "proof.json")],
    }


COMMANDS = ["status", "verify", "verify --full", "export", "export warc", "export wacz",
            "replay", "report",
            "compare", "backup", "checkpoint", "prove"]


@pytest.mark.parametrize("command", COMMANDS)
def test_reading_commands_work_on_read_only_media(
        store_copy: Path, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Before issue 12 each of these failed: "unable to open database file" (SQLite could
    # not create the WAL index), or the open tried to migrate and write.
    with world_dir() as out, read_only_mount(store_copy.parent) as media:
        store = media / store_copy.name
        before = snapshot(store)
        args = reading_commands(store, out)[command]
        assert cli_main(args) == 0, capsys.readouterr().err
        assert snapshot(store) == before


@pytest.mark.slow
def test_reading_commands_work_for_another_user_and_change_nothing(store_copy: Path) -> None:
    # Before issue 12: "attempt to write a readonly database" for every one of them.
    with world_dir() as out:
        os.chown(out, NOBODY, NOBODY)
        commands = reading_commands(store_copy, out)
        for name in ("evidence.db-wal", "evidence.db-shm"):  # left by root's reader just now
            (store_copy / name).unlink(missing_ok=True)
        before = snapshot(store_copy)
        for command, args in commands.items():
            done = as_nobody(*args)
            assert done.returncode == 0, (command, done.stderr)
        assert snapshot(store_copy) == before, "nothing in the store was created or changed"


def test_another_user_reads_what_a_running_writer_has_committed(store_copy: Path) -> None:
    # The writer holds the store open: its WAL holds the new commits, its WAL index is
    # root's and read-only to nobody. SQLite then reads through a private copy of it.
    with Store.open(store_copy) as store:
        run_id = store.connection.execute("SELECT run_id FROM crawl_run").fetchall()[0][0]
        before = store.connection.execute("SELECT count(*) FROM fetch_attempt").fetchall()[0][0]

        async def commit() -> None:
            async with Writer(store) as writer:
                for i in range(3):
                    await writer.submit(FetchAttempt(
                        message_id=f"ro-{i}", attempt_id=f"ro-a{i}", run_id=run_id,
                        url=f"http://example.com/ro/{i}", sequence=0, started_at=FIXED_TIME,
                        elapsed_ms=1.0, outcome="timeout"))

        anyio.run(commit)
        assert (store_copy / "evidence.db-wal").stat().st_size > 0
        done = as_nobody("status", str(store_copy), "--json")
        assert done.returncode == 0, done.stderr
        assert f'"fetch_attempt": {before + 3}' in done.stdout


def test_a_wal_holding_commits_without_a_readable_index_is_refused_clearly(
        store_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # immutable=1 would skip the WAL's commits silently; the command says what to do.
    with Store.open(store_copy) as store:
        run_id = store.connection.execute("SELECT run_id FROM crawl_run").fetchall()[0][0]

        async def commit() -> None:
            async with Writer(store) as writer:
                await writer.submit(FetchAttempt(
                    message_id="ro-w", attempt_id="ro-aw", run_id=run_id,
                    url="http://example.com/ro/w", sequence=0, started_at=FIXED_TIME,
                    elapsed_ms=1.0, outcome="timeout"))

        anyio.run(commit)
        with world_dir() as d:
            copy = d / "copy"
            shutil.copytree(store_copy, copy, ignore=shutil.ignore_patterns("*-shm"))
            with read_only_mount(d) as media:
                assert cli_main(["status", str(media / "copy")]) == 2
    err = capsys.readouterr().err
    assert "Error:" in err and "WAL holds commits" in err
    assert "Try: copy the store directory" in err


def test_a_store_opened_read_only_writes_nothing_and_refuses_writers(tmp_path: Path) -> None:
    with Store.create(tmp_path / "s"):
        pass
    for name in ("LAYOUT", "PACKS"):  # what a read-write open would create again
        path = tmp_path / "s" / "artifacts" / name
        path.chmod(0o755) if path.is_dir() else path.chmod(0o644)
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    before = snapshot(tmp_path / "s")
    with Store.open(tmp_path / "s", read_only=True) as store:
        assert store.read_only and store.schema_version >= 4
        with pytest.raises(StoreError, match="read-only"):
            Writer(store)
        with pytest.raises(StoreError, match="read-only"):
            store.reopen_connection()
        with pytest.raises(ArtifactError, match="read-only"):
            store.artifacts.put("body", b"x")
    after = snapshot(tmp_path / "s")
    # In a directory it may write, SQLite creates the empty WAL and the WAL index a reader
    # needs beside a writer (as any SQLite reader does); nothing else appears or changes.
    assert after.pop("evidence.db-wal", (0,))[0] == 0
    after.pop("evidence.db-shm", None)
    assert after == before


def test_files_the_store_creates_follow_one_mode_policy(tmp_path: Path) -> None:
    # Directories 0755 and the database's files 0644 (less the umask); files that never
    # change once written 0444: payloads, artifacts/LAYOUT, the sync-failed marker.
    # Before issue 12 LAYOUT was 0600, so another user could not read the store.
    old = os.umask(0o022)
    try:
        with Store.create(tmp_path / "s") as store:
            store.artifacts.put("body", b"<html>mode policy</html>")
            mark_sync_failed(store.path, store.file_ops, "a test of the marker's mode")
            modes = {str(p.relative_to(store.path)): stat.S_IMODE(p.stat().st_mode)
                     for p in store.path.rglob("*")}
            modes["."] = stat.S_IMODE(store.path.stat().st_mode)
    finally:
        os.umask(old)
    expected = {}
    for name in modes:
        path = tmp_path / "s" / name
        if name.startswith("evidence.db"):
            expected[name] = 0o644
        elif path.is_dir():
            expected[name] = 0o755
        else:
            expected[name] = 0o444
    assert modes == expected
    assert {"artifacts/LAYOUT", "sync-failed", "evidence.db-wal"} <= set(modes)


def test_writing_to_read_only_media_or_another_users_store_is_refused_with_a_hint(
        store_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 34: "unable to open database file" and no hint for a crawl; a traceback for
    # init and for a crawl into a new store there.
    with read_only_mount(store_copy.parent) as media:
        store = media / store_copy.name
        before = snapshot(media)
        attempts = {
            "resume": (["crawl", "--store", str(store)], "reading commands"),
            "new store": (["crawl", "http://127.0.0.1:9/", "--store", str(media / "new")],
                          "choose a directory on storage this user can write"),
            "init": (["init", str(media / "new2")],
                     "choose a directory on storage this user can write"),
        }
        for name, (args, hint) in attempts.items():
            assert cli_main(args) == 2, name
            err = capsys.readouterr().err
            assert err.startswith("Error: ") and f"Try: {hint}" in err, (name, err)
            assert "read-only" in err and "Traceback" not in err
        assert snapshot(media) == before, "nothing created or changed"
    done = as_nobody("crawl", "--store", str(store_copy))
    assert done.returncode == 2 and "Try: reading commands" in done.stderr, done.stderr
