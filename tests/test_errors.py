"""Errors a person can act on (issue 13): every user error, through the real command.

Each case runs the ``evidence`` command and must end with exit status 2, an ``Error:`` line
and a ``Try:`` line in the user's words, no traceback, and nothing created or changed: the
whole working directory's file tree (names, sizes, mtimes) is the same before and after.
docs/errors.md lists the same cases. A sample of them, one of each origin (argparse, the
command's own checks, a store, a rules file, the service's options), runs the real
``python -m evidence`` in a subprocess; the others run its ``main`` in this process (its
parser and its error boundary: the same lines, without 0.7 s of CPU to start a process).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anyio
import apsw
import pytest

from evidence import RunStarted, SessionStarted, Store, Writer, utc_now
from evidence._demo.site import SiteConfig, TestSite

from .conftest import Ran, evidence_in_process, unavailable

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = [sys.executable, "-m", "evidence"]
CONFIG = {"seeds": ["http://127.0.0.1:9/"]}


def _prepare(work: Path) -> None:
    """A plain file, a store with an open session, its archive, a store of a newer schema,
    a bad rules file and a token file others can read."""
    (work / "plain").write_text("not a store\n")
    with Store.create(work / "store") as store:
        async def setup() -> None:
            async with Writer(store) as writer:
                await writer.submit_group([
                    SessionStarted(message_id="m1", session_id="s1", started_at=utc_now(),
                                   config=CONFIG),
                    RunStarted(message_id="m2", run_id="r1", session_id="s1",
                               started_at=utc_now())])
        anyio.run(setup)
    (work / "store" / "crawl.lock").touch()  # a crawl ran here before
    export(work / "store", work / "archive")
    shutil.copytree(work / "store", work / "newer")
    conn = apsw.Connection(str(work / "newer" / "evidence.db"))
    conn.execute("INSERT INTO schema_migration VALUES (99, 'future', 'x', 'now'); "
                 "PRAGMA user_version = 99")
    conn.close()
    (work / "bad.toml").write_text('[[rule]]\nid = "x"\nversion = 1\ntype = "regex"\n'
                                   'pattern = "("\n')
    (work / "token").write_text("0123456789abcdef0123456789\n")
    (work / "token").chmod(0o600)
    (work / "open-token").write_text("0123456789abcdef0123456789\n")
    (work / "open-token").chmod(0o644)


# The cases run by the real command in a subprocess: one of each origin of the error.
THROUGH_A_PROCESS = {
    "nonsense",  # argparse
    "crawl ht!tp://x/ --store new",  # the command's own check of its arguments
    "status newer",  # the store
    "rules check bad.toml",  # a rules file
    "serve store --listen 0.0.0.0:0 --token-file token",  # the service's options
}

# (what the user typed, after 'evidence'; a phrase the Error line must hold)
CASES = [
    ("init plain", "plain is a file, not a store directory"),
    ("init archive", "archive is an archive written by 'evidence export', not a store"),
    ("crawl http://127.0.0.1:9/ --store plain", "plain is a file"),
    ("crawl http://127.0.0.1:9/ --store archive", "is an archive"),
    ("crawl ht!tp://x/ --store new", "seed 'ht!tp://x/' cannot be crawled: it does not start "
     "with http:// or https://"),
    ("crawl example.com --store new", "seed 'example.com' cannot be crawled"),
    ("crawl ftp://example.com/ --store new", "only http:// and https:// URLs can be crawled"),
    ("crawl http://exa_mple.com:99999/ --store new", "seed 'http://exa_mple.com:99999/'"),
    ("crawl --store new", "no URL given, and new holds no crawl to resume"),
    ("crawl http://127.0.0.1:9/ --store new --rules bad.toml", "bad.toml"),
    ("crawl http://127.0.0.1:9/ --store new --rules missing.toml", "missing.toml"),
    ("crawl http://127.0.0.1:9/ --store store --clean", "not confirmed"),
    ("crawl http://127.0.0.1:9/ --store new --workers 0", "--workers: must be 1 or more"),
    ("crawl http://127.0.0.1:9/ --store new --deadline soon", "--deadline: not a number"),
    ("crawl http://127.0.0.1:9/ --store new --bogus", "unrecognized arguments: --bogus"),
    ("stop plain", "plain is not an evidence store (it is a file)"),
    ("stop nowhere", "nowhere is not an evidence store"),
    ("demo new --pages 0", "--pages: must be 1 or more"),
    ("status plain", "plain is a file"),
    ("status archive", "is an archive"),
    ("status nowhere", "nowhere: no evidence store here"),
    ("status newer", "schema version 99, newer than this program supports"),
    ("verify newer", "schema version 99"),
    ("export newer --out out", "schema version 99"),
    ("export archive --out out", "archive is an archive, not a store"),
    ("export store --out plain", "plain is a file"),
    ("export store --out archive", "archive is not empty"),
    ("restore store --store out", "not an archive"),
    ("restore archive --store store", "store is not empty"),
    ("compare plain store", "no evidence store here"),
    ("diff store --session s1", "diff takes exactly two --session options"),
    ("report store --run nope", "no run 'nope' in the store"),
    ("replay store http://127.0.0.1:9/nope", "no attempt of http://127.0.0.1:9/nope"),
    ("rules check bad.toml", "invalid regular expression"),
    ("rules evaluate store --rules bad.toml", "invalid regular expression"),
    ("serve store", "nothing to listen on"),
    ("serve store --listen 127.0.0.1:0", "needs a token"),
    ("serve store --listen 0.0.0.0:0 --token-file token", "not a loopback address"),
    ("serve store --socket s.sock --token-file open-token", "readable by other users"),
    ("serve store --socket s.sock --token-file missing-token", "cannot read the token file"),
    ("init new --artifacts ftp://example.com/x", "the other place it can keep them is an "
     "s3:// URL"),
    ("crawl http://127.0.0.1:9/ --store new --listen 10.9.8.7:7000 --token-file token",
     "10.9.8.7 is not a loopback address, and the service listens beyond this machine only "
     "with TLS"),
    ("crawl http://127.0.0.1:9/ --store new --lease-timeout 0.5", "must be 1 second or more"),
    ("worker --connect nohost --token-file token", "expected HOST:PORT"),
    ("worker --connect 127.0.0.2:7400 --token-file token --tls-ca missing.pem",
     "cannot load the CA file missing.pem"),
    ("tls-cert --host 127.0.0.1", "required: --out"),
    ("convert nowhere", "nowhere: no evidence store here"),
    ("init postgresql://127.0.0.1:1/db --artifacts art", "cannot connect to PostgreSQL"),
    ("nonsense", "invalid choice: 'nonsense'"),
]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: (size, mtime in ns); a directory: (0, 0).

    SQLite's own housekeeping is left out: opening a database may create and remove its
    ``-shm`` index and an empty ``-wal`` (which also touches the directory's mtime); an
    unchanged database file and no WAL content mean nothing was written.
    """
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[str((Path(dirpath) / name).relative_to(root))] = (0, 0)
        for name in filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            if name.endswith("-shm") or (name.endswith("-wal") and st.st_size == 0):
                continue
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def export(store: Path, out: Path) -> None:
    done = evidence_in_process("export", store, "--out", out)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("errors")
    _prepare(path)
    return path


@pytest.mark.parametrize(("command", "phrase"), CASES, ids=[c for c, _ in CASES])
def test_a_user_error_says_what_and_what_to_try_and_changes_nothing(
        work: Path, command: str, phrase: str) -> None:
    before = _tree(work)
    time.sleep(0.01)  # a change within the same mtime tick would go unseen
    if command in THROUGH_A_PROCESS:
        done: Ran | subprocess.CompletedProcess[str] = subprocess.run(
            [*EVIDENCE, *command.split()], cwd=work, capture_output=True, text=True,
            timeout=60, stdin=subprocess.DEVNULL)
    else:
        done = evidence_in_process(*command.split(), cwd=work)
    lines = done.stderr.splitlines()
    errors = [line for line in lines if line.startswith("Error: ")]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr
    assert len(errors) == 1 and phrase in errors[0], done.stderr
    assert any(line.startswith("Try: ") for line in lines), done.stderr
    assert not re.search(r"\b(resolve_reference|_[a-z]+\(|evidence\._)", done.stderr), \
        "no internal names"
    assert _tree(work) == before, "a mistake created or changed nothing"


def test_an_archive_given_for_a_store_never_suggests_init(work: Path) -> None:
    """(``verify`` takes an archive: it restores a private copy and checks it, issue 32.)"""
    for command in ("status", "init"):
        done = evidence_in_process(command, "archive", cwd=work)
        assert "evidence init" not in done.stderr, done.stderr
        assert "evidence restore archive --store NEW" in done.stderr


def test_output_cut_short_by_the_reader_ends_quietly(tmp_path: Path) -> None:
    """``evidence compare A B | head -1``: no traceback, as the Python docs advise."""
    with Store.create(tmp_path / "a") as store:
        async def many() -> None:
            async with Writer(store) as writer:
                await writer.submit_group([
                    SessionStarted(message_id=f"m{i}", session_id=f"s{i:05d}",
                                   started_at=utc_now()) for i in range(3000)])
        anyio.run(many)
    Store.create(tmp_path / "b").close()
    proc = subprocess.Popen([*EVIDENCE, "compare", str(tmp_path / "a"), str(tmp_path / "b"),
                             "--rows", "100000"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what head does after its line
    with proc.stderr:
        stderr = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert first.startswith(b"a  store")
    assert proc.returncode == 1
    assert stderr == "", stderr


def test_a_full_disk_prints_the_clean_error_only(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    if shutil.which("mount") is None:
        unavailable("no mount command here")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        unavailable(f"cannot mount a size-limited tmpfs here ({done.stderr.strip()})")
    try:
        large = {f"/p/{i}": 60_000 for i in range(40)}  # 2.4 MB of pages for a 1 MB disk
        with TestSite(SiteConfig(pages=40, large=large)) as site:
            crawl = subprocess.run([*EVIDENCE, "crawl", site.url, "--store",
                                    str(mount / "s"), "--workers", "8"],
                                   capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
    assert crawl.returncode == 2, crawl.stderr
    assert "Traceback" not in crawl.stderr and "Exception Group" not in crawl.stderr, \
        crawl.stderr
    errors = [line for line in crawl.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "disk is full" in errors[0], crawl.stderr
    assert "Try: free disk space" in crawl.stderr
    assert len(crawl.stderr.splitlines()) < 30, crawl.stderr
