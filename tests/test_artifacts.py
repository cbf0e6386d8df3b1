"""The content-addressed artifact store, against real files in tmp_path (no mocks).

Fault injection uses real ``FileOps`` subclasses that record or fail calls and otherwise
delegate to the real ``os`` calls.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence._errors import (
    ArtifactCorruptError,
    ArtifactError,
    ArtifactMissingError,
    NamespaceError,
    PayloadTooLargeError,
)
from evidence._model.refs import ArtifactRef, validate_namespace
from evidence._store.artifactbase import DEFAULT_MAX_PAYLOAD
from evidence._store.artifacts import ArtifactStore
from evidence._store.fileops import FileOps

MiB = 1024 * 1024
DEAD_PID = 4_194_305  # above the largest possible Linux pid_max (2**22), so never alive


def tree(path: Path) -> set[str]:
    """Every path under ``path`` (files and directories), relative, for before/after checks."""
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def store_files(store: ArtifactStore) -> list[Path]:
    """Every regular file under the root except in .tmp and the LAYOUT record."""
    return sorted(
        p
        for p in store.root.rglob("*")
        if p.is_file() and ".tmp" not in p.relative_to(store.root).parts
        and p != store.root / "LAYOUT"
    )


def temp_files(store: ArtifactStore) -> list[Path]:
    return sorted((store.root / ".tmp").iterdir())


def make_writable(path: Path) -> None:
    path.chmod(0o644)


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "store")


# -- put / read ---------------------------------------------------------------------------


def test_put_read_roundtrip(store: ArtifactStore) -> None:
    data = b"<html>hello</html>" * 1000
    ref = store.put("html", data)
    assert ref == ArtifactRef("html", blake3.blake3(data).hexdigest(), len(data))
    path = store.path_for(ref)
    assert path == store.root / "html" / ref.digest[:2] / ref.digest
    assert path.read_bytes() == data
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert store.read(ref) == data
    assert store.read(ref, verify=True) == data
    with store.open(ref, verify=True) as handle:
        assert handle.read() == data  # rewound after verifying
    store.verify(ref)
    store.check(ref)
    assert store.exists(ref)
    assert temp_files(store) == []
    assert store.usage() == (1, len(data))


@pytest.mark.parametrize(
    "make",
    [
        bytes,
        bytearray,
        memoryview,
        io.BytesIO,
        lambda d: iter([d[:3], b"", d[3:]]),
        lambda d: [d[i : i + 1] for i in range(len(d))],
    ],
    ids=["bytes", "bytearray", "memoryview", "stream", "iterator", "one-byte-chunks"],
)
def test_put_accepts_bytes_like_streams_and_iterables(store: ArtifactStore, make) -> None:
    data = b"payload bytes \x00\xff"
    ref = store.put("raw", make(data))
    assert ref.digest == blake3.blake3(data).hexdigest()
    assert ref.size == len(data)
    assert store.read(ref, verify=True) == data


def test_empty_payload(store: ArtifactStore) -> None:
    ref = store.put("empty", b"")
    assert ref.size == 0
    assert ref.digest == blake3.blake3(b"").hexdigest()
    assert store.read(ref, verify=True) == b""


def test_put_file(store: ArtifactStore, tmp_path: Path) -> None:
    source = tmp_path / "body.bin"
    source.write_bytes(os.urandom(3 * MiB + 17))
    ref = store.put_file("html", source)
    assert store.read(ref, verify=True) == source.read_bytes()
    with pytest.raises(ArtifactError) as info:
        store.put_file("html", tmp_path / "absent.bin")
    assert info.value.path == tmp_path / "absent.bin"


def test_streaming_put_keeps_memory_flat(store: ArtifactStore) -> None:
    chunks = 64

    def body():
        for i in range(chunks):
            yield bytes([i]) * MiB

    expected = blake3.blake3()
    for chunk in body():
        expected.update(chunk)

    tracemalloc.start()
    try:
        ref = store.put("big", body())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ref == ArtifactRef("big", expected.hexdigest(), chunks * MiB)
    assert peak < 8 * MiB, f"peak {peak} bytes for a {chunks} MiB payload"
    assert store.path_for(ref).stat().st_size == chunks * MiB
    store.verify(ref)


def test_put_is_idempotent(store: ArtifactStore) -> None:
    first = store.put("html", b"same body")
    inode = store.path_for(first).stat().st_ino
    second = store.put("html", [b"same ", b"body"])
    assert first == second
    assert store_files(store) == [store.path_for(first)]
    assert store.path_for(first).stat().st_ino == inode  # the first copy is kept
    assert stat.S_IMODE(store.path_for(first).stat().st_mode) == 0o444
    assert temp_files(store) == []
    make_writable(store.path_for(first))  # a put of the same bytes restores read-only
    assert store.put("html", b"same body") == first
    assert stat.S_IMODE(store.path_for(first).stat().st_mode) == 0o444
    # Same bytes in another namespace are a separate artifact.
    other = store.put("robots", b"same body")
    assert other.digest == first.digest and other != first
    assert len(store_files(store)) == 2


def test_put_repairs_a_truncated_copy(store: ArtifactStore) -> None:
    ref = store.put("html", b"0123456789")
    path = store.path_for(ref)
    make_writable(path)
    path.write_bytes(b"0123")
    assert not store.exists(ref)
    assert store.put("html", b"0123456789") == ref
    store.verify(ref)
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


def test_put_rejects_text(store: ArtifactStore) -> None:
    with pytest.raises(TypeError):
        store.put("html", "text is not bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        store.put("html", [b"ok", "not bytes"])  # type: ignore[list-item]
    assert store_files(store) == [] and temp_files(store) == []


def test_non_blocking_stream_is_refused(store: ArtifactStore) -> None:
    class NotReady:
        def read(self, n: int) -> None:
            return None

    with pytest.raises(ArtifactError, match="non-blocking"):
        store.put("html", NotReady())  # type: ignore[arg-type]
    assert store_files(store) == [] and temp_files(store) == []


# -- namespaces, digests and refs -------------------------------------------------------------

BAD_NAMESPACES = [
    "",
    ".",
    "..",
    ".tmp",
    "/",
    "a/b",
    "../x",
    "..\\x",
    "/etc",
    "A",
    "Html",
    "a" * 33,
    "é",
    "ｈｔｍｌ",
    "a\x00",
    "a\n",
    " a",
    "a b",
    "a.b",
    5,
    None,
    b"html",
]
GOOD_NAMESPACES = ["a", "a" * 32, "html", "html_v2-x", "-", "_", "0"]


@pytest.mark.parametrize("namespace", BAD_NAMESPACES, ids=repr)
def test_bad_namespace_refused_and_nothing_created(tmp_path: Path, namespace: object) -> None:
    store = ArtifactStore(tmp_path / "store")
    before = tree(tmp_path)
    with pytest.raises(NamespaceError) as info:
        store.put(namespace, b"data")  # type: ignore[arg-type]
    assert repr(namespace)[:20] in str(info.value)
    assert "[a-z0-9_-]" in str(info.value)
    assert info.value.namespace == namespace
    with pytest.raises(NamespaceError):
        validate_namespace(namespace)  # type: ignore[arg-type]
    with pytest.raises(NamespaceError):
        store.path_for(namespace, "0" * 64)  # type: ignore[arg-type]
    assert tree(tmp_path) == before


@pytest.mark.parametrize("namespace", GOOD_NAMESPACES)
def test_good_namespaces(store: ArtifactStore, namespace: str) -> None:
    assert validate_namespace(namespace) == namespace
    ref = store.put(namespace, b"x")
    assert store.path_for(ref).is_relative_to(store.root / namespace)


def test_long_bad_namespace_message_is_bounded() -> None:
    with pytest.raises(NamespaceError) as info:
        validate_namespace("A" * 100_000)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    "digest",
    ["", "0" * 63, "0" * 65, "A" * 64, "g" * 64, "../" + "0" * 61, "0" * 63 + "\n", 64],
    ids=repr,
)
def test_bad_digest_refused(store: ArtifactStore, digest: object) -> None:
    with pytest.raises(ArtifactError, match="64 lowercase hex"):
        store.path_for("html", digest)  # type: ignore[arg-type]
    with pytest.raises(ArtifactError):
        ArtifactRef("html", digest, 1)  # type: ignore[arg-type]


def test_ref_validation_and_wire_format() -> None:
    ref = ArtifactRef("html", "ab" * 32, 10)
    assert msgspec.json.decode(msgspec.json.encode(ref), type=ArtifactRef) == ref
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(ref), type=ArtifactRef) == ref
    with pytest.raises(AttributeError):
        ref.size = 11  # type: ignore[misc]
    for bad in (
        b'{"namespace":"html","digest":"' + b"ab" * 32 + b'","size":10,"extra":1}',
        b'{"namespace":"HTML","digest":"' + b"ab" * 32 + b'","size":10}',
        b'{"namespace":"html","digest":"' + b"AB" * 32 + b'","size":10}',
        b'{"namespace":"html","digest":"' + b"ab" * 32 + b'","size":-1}',
        b'{"namespace":"html","digest":"' + b"ab" * 32 + b'","size":true}',
        b'{"namespace":"html","digest":"' + b"ab" * 32 + b'"}',
    ):
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(bad, type=ArtifactRef)
    with pytest.raises(ArtifactError):
        ArtifactRef("html", "ab" * 32, -1)
    with pytest.raises(ArtifactError):
        ArtifactRef("html", "ab" * 32, True)  # type: ignore[arg-type]
    # "$" in the schema pattern admits a trailing newline; __post_init__ still refuses it, and
    # as a ValidationError, so a message carrying such a ref fails to decode like any other.
    for namespace, digest in (("html\n", "ab" * 32), ("html", "ab" * 31 + "a\n")):
        with pytest.raises(msgspec.ValidationError, match=r"invalid artifact|matching regex"):
            msgspec.json.decode(
                msgspec.json.encode({"namespace": namespace, "digest": digest, "size": 1}),
                type=ArtifactRef,
            )
    with pytest.raises(NamespaceError):
        ArtifactRef("html\n", "ab" * 32, 1)


def test_path_for_forms_agree(store: ArtifactStore) -> None:
    ref = ArtifactRef("html", "cd" * 32, 1)
    assert store.path_for(ref) == store.path_for("html", "cd" * 32)
    with pytest.raises(TypeError):
        store.path_for(ref, "cd" * 32)


# -- limits --------------------------------------------------------------------------------


def test_default_limit(store: ArtifactStore) -> None:
    assert store.max_payload == DEFAULT_MAX_PAYLOAD
    assert store.max_payload == 256 * MiB


def test_oversized_bytes_refused_before_touching_disk(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store", max_payload=10)
    before = tree(tmp_path)
    with pytest.raises(PayloadTooLargeError) as info:
        store.put("html", b"x" * 11)
    assert info.value.limit == 10 and info.value.size == 11
    assert info.value.hint
    assert tree(tmp_path) == before
    assert store.put("html", b"x" * 10).size == 10  # exactly at the limit is fine


def test_oversized_stream_stops_early_and_leaves_nothing(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store", max_payload=3 * MiB)
    pulled = []

    def body():
        for i in range(100):
            pulled.append(i)
            yield b"y" * MiB

    with pytest.raises(PayloadTooLargeError):
        store.put("html", body())
    assert len(pulled) == 4  # refused at the first chunk over the limit, not at the end
    assert store_files(store) == []
    assert temp_files(store) == []
    with pytest.raises(PayloadTooLargeError):
        store.put("html", io.BytesIO(b"z" * (3 * MiB + 1)))
    assert store_files(store) == [] and temp_files(store) == []


def test_bad_max_payload() -> None:
    with pytest.raises(ValueError):
        ArtifactStore("/nonexistent", max_payload=-1)


# -- corruption and missing ------------------------------------------------------------------


def test_verify_detects_a_flipped_byte(store: ArtifactStore) -> None:
    data = os.urandom(100_000)
    ref = store.put("html", data)
    path = store.path_for(ref)
    make_writable(path)
    with path.open("r+b") as handle:
        handle.seek(54_321)
        original = handle.read(1)
        handle.seek(54_321)
        handle.write(bytes([original[0] ^ 0x01]))
    with pytest.raises(ArtifactCorruptError) as info:
        store.verify(ref)
    error = info.value
    assert error.path == path and error.digest == ref.digest
    assert error.actual_digest != ref.digest
    for needle in (ref.digest, error.actual_digest, str(path)):
        assert needle in str(error)
    with pytest.raises(ArtifactCorruptError):
        store.read(ref, verify=True)
    with pytest.raises(ArtifactCorruptError):
        store.open(ref, verify=True)
    assert store.exists(ref)  # same size: only re-hashing can tell
    assert store.read(ref) != data  # unverified reads return what is there


def test_wrong_size_is_corruption(store: ArtifactStore) -> None:
    ref = store.put("html", b"abcdef")
    path = store.path_for(ref)
    make_writable(path)
    path.write_bytes(b"abc")
    assert not store.exists(ref)
    with pytest.raises(ArtifactCorruptError) as info:
        store.check(ref)
    assert (info.value.expected_size, info.value.actual_size) == (6, 3)
    with pytest.raises(ArtifactCorruptError):
        store.read(ref)


def test_directory_in_place_of_artifact_is_corruption(store: ArtifactStore) -> None:
    ref = ArtifactRef("html", "ef" * 32, 0)
    store.path_for(ref).mkdir(parents=True)
    assert not store.exists(ref)
    with pytest.raises(ArtifactCorruptError, match="not a regular file"):
        store.check(ref)


def test_missing_artifact(store: ArtifactStore) -> None:
    ref = ArtifactRef("html", "12" * 32, 5)
    assert not store.exists(ref)
    for call in (store.check, store.verify, store.read, store.open):
        with pytest.raises(ArtifactMissingError) as info:
            call(ref)
        assert info.value.path == store.path_for(ref)
        assert info.value.digest == ref.digest and info.value.namespace == "html"
        assert info.value.hint


# -- walking --------------------------------------------------------------------------------


def test_iter_refs_lists_artifacts_and_skips_strays(store: ArtifactStore) -> None:
    refs = {store.put(ns, data) for ns in ("html", "robots") for data in (b"a", b"bb", b"ccc")}
    (store.root / "README").write_text("not an artifact")
    (store.root / "Bad.NS").mkdir()
    (store.root / "html" / "zz").mkdir()
    some = next(iter(refs))
    leaf = store.path_for(some).parent
    (leaf / "not-a-digest").write_bytes(b"x")
    (leaf / ("0" * 64)).write_bytes(b"x")  # a digest that does not belong in this directory
    (store.root / ".tmp" / "put-1-0000000000000000.tmp").write_bytes(b"partial")
    listed = list(store.iter_refs())
    assert set(listed) == refs
    assert listed == sorted(listed, key=lambda r: (r.namespace, r.digest))
    assert store.usage() == (6, 2 * (1 + 2 + 3))


def test_open_existing_store_without_create(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="does not exist"):
        ArtifactStore(tmp_path / "absent", create=False)
    assert not (tmp_path / "absent").exists()
    ref = ArtifactStore(tmp_path / "store").put("html", b"kept")
    reopened = ArtifactStore(tmp_path / "store", create=False)
    assert reopened.read(ref, verify=True) == b"kept"


# -- stale temp files -----------------------------------------------------------------------


def _temp(store: ArtifactStore, name: str, age: float = 0.0) -> Path:
    path = store.root / ".tmp" / name
    path.write_bytes(b"partial")
    if age:
        when = path.stat().st_mtime - age
        os.utime(path, (when, when))
    return path


def test_stale_temp_files_cleaned_on_open(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    dead = _temp(store, f"put-{DEAD_PID}-00aa00aa00aa00aa.tmp")
    ours = _temp(store, f"put-{os.getpid()}-11bb11bb11bb11bb.tmp")  # earlier process, same pid
    live_other = _temp(store, f"put-{os.getppid()}-22cc22cc22cc22cc.tmp")
    old_other = _temp(store, f"put-{os.getppid()}-33dd33dd33dd33dd.tmp", age=2 * 3600)
    unparsable = _temp(store, "put-x-44ee44ee44ee44ee.tmp")
    foreign = _temp(store, "notes.txt", age=10 * 3600)
    not_a_file = store.root / ".tmp" / f"put-{DEAD_PID}-55ff55ff55ff55ff.tmp"
    not_a_file.mkdir()

    ArtifactStore(tmp_path / "store")

    assert not dead.exists() and not ours.exists() and not old_other.exists()
    assert live_other.exists() and unparsable.exists()  # writer may be alive: wait for the grace
    assert foreign.exists() and not_a_file.is_dir()  # not ours to touch

    assert store.clean_stale_temp(older_than=0) == 2
    assert not live_other.exists() and not unparsable.exists()
    assert foreign.exists() and not_a_file.is_dir()


def test_sweep_never_removes_a_live_put(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = ArtifactStore(root)
    link = tmp_path / "link"
    link.symlink_to(root)
    seen: list[list[Path]] = []

    def body():
        yield b"first "
        seen.append(temp_files(store))
        # Another store on the same root, spelled differently, sweeping as hard as it can.
        assert ArtifactStore(link).clean_stale_temp(older_than=0) == 0
        assert ArtifactStore(root).clean_stale_temp(older_than=0) == 0
        yield b"second"

    ref = store.put("html", body())
    assert len(seen[0]) == 1 and seen[0][0].name.startswith(f"put-{os.getpid()}-")
    assert store.read(ref, verify=True) == b"first second"
    assert temp_files(store) == []


# -- durability order and fault injection ----------------------------------------------------


class RecordingOps(FileOps):
    """Records each call as (name, argument) and delegates to the real implementation."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def open_temp(self, directory: Path) -> tuple[int, Path]:
        fd, path = super().open_temp(directory)
        self.calls.append(("open_temp", path))
        return fd, path

    def write(self, fd: int, data: bytes | memoryview) -> None:
        self.calls.append(("write", fd))
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self.calls.append(("fsync", fd))
        super().fsync(fd)

    def close(self, fd: int) -> None:
        self.calls.append(("close", fd))
        super().close(fd)

    def rename(self, src: Path, dst: Path) -> None:
        self.calls.append(("rename", (src, dst)))
        super().rename(src, dst)

    def fsync_dir(self, path: Path) -> None:
        self.calls.append(("fsync_dir", path))
        super().fsync_dir(path)

    def makedirs(self, path: Path) -> list[Path]:
        self.calls.append(("makedirs", path))
        return super().makedirs(path)

    def chmod_readonly(self, path: Path) -> None:
        self.calls.append(("chmod_readonly", path))
        super().chmod_readonly(path)

    def unlink(self, path: Path) -> None:
        self.calls.append(("unlink", path))
        super().unlink(path)

    def index(self, name: str, arg: object) -> int:
        return self.calls.index((name, arg))


def test_durability_order(tmp_path: Path) -> None:
    ops = RecordingOps()
    store = ArtifactStore(tmp_path / "store", file_ops=ops)
    ops.calls.clear()
    ref = store.put("html", [b"a" * 10, b"b" * 10, b"c" * 10])
    dest = store.path_for(ref)
    calls = ops.calls

    fd = next(arg for name, arg in calls if name == "write")
    tmp = next(arg for name, arg in calls if name == "open_temp")
    writes = [i for i, call in enumerate(calls) if call == ("write", fd)]
    assert len(writes) == 3
    fsync_file = ops.index("fsync", fd)
    rename = ops.index("rename", (tmp, dest))
    dir_syncs = [i for i, call in enumerate(calls) if call == ("fsync_dir", dest.parent)]
    assert max(writes) < fsync_file < ops.index("close", fd) < rename
    assert ops.index("chmod_readonly", tmp) < fsync_file  # mode is as durable as the bytes
    assert any(i > rename for i in dir_syncs), "destination directory not fsynced after rename"
    # The new directories html/, html/xx/, html/xx/yy/ are each made durable in their parent.
    for parent in (store.root, store.root / "html", dest.parent.parent):
        assert ops.index("fsync_dir", parent) < rename
    assert "unlink" not in [name for name, _ in calls]

    # A duplicate put: no rename, temp dropped, destination directory still fsynced.
    ops.calls.clear()
    assert store.put("html", b"a" * 10 + b"b" * 10 + b"c" * 10) == ref
    names = [name for name, _ in ops.calls]
    assert "rename" not in names
    assert names.index("unlink") < len(names) - 1 - names[::-1].index("fsync_dir")
    assert ops.calls[-1] == ("fsync_dir", dest.parent)


class FailingOps(FileOps):
    """Raises OSError(code) from the named method; every other call is the real one."""

    def __init__(self, method: str, code: int) -> None:
        self.method, self.code = method, code

    def _maybe_fail(self, name: str) -> None:
        if name == self.method:
            raise OSError(self.code, os.strerror(self.code))

    def open_temp(self, directory: Path) -> tuple[int, Path]:
        self._maybe_fail("open_temp")
        return super().open_temp(directory)

    def write(self, fd: int, data: bytes | memoryview) -> None:
        self._maybe_fail("write")
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self._maybe_fail("fsync")
        super().fsync(fd)

    def rename(self, src: Path, dst: Path) -> None:
        self._maybe_fail("rename")
        super().rename(src, dst)

    def chmod_readonly(self, path: Path) -> None:
        self._maybe_fail("chmod_readonly")
        super().chmod_readonly(path)

    def fsync_dir(self, path: Path) -> None:
        self._maybe_fail("fsync_dir")
        super().fsync_dir(path)


def test_enospc_at_write_is_a_clear_error_with_no_partial_file(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    failing = ArtifactStore(tmp_path / "store", file_ops=FailingOps("write", errno.ENOSPC))
    with pytest.raises(ArtifactError) as info:
        failing.put("html", [b"some", b"body"])
    error = info.value
    assert type(error) is ArtifactError
    assert "free disk space" in error.hint
    assert error.errno == errno.ENOSPC
    assert error.path.parent == store.root / ".tmp"
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.ENOSPC
    assert "No space left on device" in str(error)
    assert store_files(store) == []
    assert temp_files(store) == []


@pytest.mark.parametrize(
    ("method", "code", "hint"),
    [
        ("open_temp", errno.ENOSPC, "free disk space"),
        ("chmod_readonly", errno.EPERM, "may read and write"),
        ("fsync", errno.EIO, "check the artifact volume"),
        ("rename", errno.EACCES, "may read and write"),
        ("rename", errno.ENOENT, "stale-temp sweep"),
        ("rename", errno.EROFS, "read-only"),
    ],
)
def test_failures_before_rename_leave_nothing(
    tmp_path: Path, method: str, code: int, hint: str
) -> None:
    ArtifactStore(tmp_path / "store")
    store = ArtifactStore(tmp_path / "store", file_ops=FailingOps(method, code))
    with pytest.raises(ArtifactError) as info:
        store.put("html", b"body")
    assert hint in info.value.hint
    assert info.value.errno == code and info.value.__cause__.errno == code
    assert store_files(store) == []
    assert temp_files(store) == []


def test_failed_directory_fsync_after_rename_fails_the_put(tmp_path: Path) -> None:
    class FailDirSyncAfterRename(FileOps):
        renamed = False

        def rename(self, src: Path, dst: Path) -> None:
            super().rename(src, dst)
            self.renamed = True

        def fsync_dir(self, path: Path) -> None:
            if self.renamed:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            super().fsync_dir(path)

    ArtifactStore(tmp_path / "store")  # created (its LAYOUT recorded) before the faults
    store = ArtifactStore(tmp_path / "store", file_ops=FailDirSyncAfterRename())
    with pytest.raises(ArtifactError, match="fsync directory") as info:
        store.put("html", b"body")
    assert info.value.errno == errno.EIO
    assert temp_files(store) == []
    # The put did not return, so no row references it; the file that landed is a complete
    # (orphan) artifact, never a partial one.
    (orphan,) = store.iter_refs()
    store.verify(orphan)


def test_concurrent_puts_from_threads(store: ArtifactStore) -> None:
    bodies = [b"shared body"] * 8 + [f"body {i}".encode() * 1000 for i in range(8)]

    def put(body: bytes) -> ArtifactRef:
        return store.put("html", [body[:5], body[5:]])

    with ThreadPoolExecutor(max_workers=8) as pool:
        refs = list(pool.map(put, bodies))
    assert len(set(refs)) == 9
    assert set(store.iter_refs()) == set(refs)
    for ref in set(refs):
        store.verify(ref)
    assert temp_files(store) == []


# -- property -------------------------------------------------------------------------------

namespaces = st.from_regex(r"[a-z0-9_-]{1,32}", fullmatch=True)
payloads = st.binary(max_size=512) | st.sampled_from([b"", b"dup", b"dup" * 100])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(namespaces, min_size=1, max_size=3, unique=True).flatmap(
        lambda names: st.lists(st.tuples(st.sampled_from(names), payloads), max_size=12)
    )
)
def test_any_sequence_of_puts_leaves_a_consistent_store(
    tmp_path_factory: pytest.TempPathFactory, puts: list[tuple[str, bytes]]
) -> None:
    store = ArtifactStore(tmp_path_factory.mktemp("prop") / "store")
    stored: dict[ArtifactRef, bytes] = {}
    for namespace, data in puts:
        ref = store.put(namespace, data)
        assert stored.setdefault(ref, data) == data
    assert set(store.iter_refs()) == set(stored)
    assert len(list(store.iter_refs())) == len(stored)
    for ref, data in stored.items():
        store.verify(ref)
        assert store.read(ref) == data
    assert store.usage() == (len(stored), sum(r.size for r in stored))
    assert temp_files(store) == []


def test_putting_existing_content_again_refreshes_its_age(tmp_path: Path) -> None:
    # Orphan reclaim deletes only files older than its grace period; a payload put again
    # (about to be referenced by a new message) must not look old.
    store = ArtifactStore(tmp_path / "a")
    ref = store.put("body", b"same bytes")
    path = store.path_for(ref)
    os.utime(path, (1_000_000, 1_000_000))
    assert store.put("body", b"same bytes") == ref
    assert path.stat().st_mtime > time.time() - 60


# -- layouts ---------------------------------------------------------------------------------


def test_a_new_root_records_its_layout_before_any_put(tmp_path: Path) -> None:
    calls: list[tuple[str, str]] = []

    class Recording(FileOps):
        def rename(self, src: Path, dst: Path) -> None:
            calls.append(("rename", dst.name))
            super().rename(src, dst)

        def fsync_dir(self, path: Path) -> None:
            calls.append(("fsync_dir", path.name))
            super().fsync_dir(path)

    store = ArtifactStore(tmp_path / "store", file_ops=Recording())
    assert store.layout == 2
    assert (store.root / "LAYOUT").read_text() == "evidence-artifacts 2\n"
    assert calls[-2:] == [("rename", "LAYOUT"), ("fsync_dir", "store")]  # durable at open
    ref = store.put("html", b"x")
    assert store.path_for(ref) == store.root / "html" / ref.digest[:2] / ref.digest
    assert ArtifactStore(store.root, create=False).layout == 2
    assert temp_files(store) == []


def test_a_store_from_before_layouts_keeps_two_levels(tmp_path: Path) -> None:
    """No LAYOUT and artifacts on disk: layout 1, read and written as it was."""
    root = tmp_path / "store"
    data = b"written by an older version"
    digest = blake3.blake3(data).hexdigest()
    legacy = root / "html" / digest[:2] / digest[2:4] / digest
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(data)
    store = ArtifactStore(root)
    assert store.layout == 1
    assert not (root / "LAYOUT").exists()  # never converted or re-labelled
    ref = ArtifactRef("html", digest, len(data))
    assert store.read(ref, verify=True) == data
    assert list(store.iter_refs()) == [ref]
    other = store.put("body", b"new bytes")
    assert store.path_for(other) == root / "body" / other.digest[:2] / other.digest[2:4] / \
        other.digest
    assert set(store.iter_refs()) == {ref, other}


def test_an_unknown_layout_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    ArtifactStore(root)
    os.chmod(root / "LAYOUT", 0o644)
    (root / "LAYOUT").write_text("evidence-artifacts 3\n")
    with pytest.raises(ArtifactError, match="does not know") as info:
        ArtifactStore(root)
    assert "newer version" in info.value.hint


def test_an_empty_read_only_root_opens_but_other_errors_raise(tmp_path: Path) -> None:
    """Read-only media: nothing to read in any layout and nothing can be put; EIO is real."""
    root = tmp_path / "store"
    root.mkdir()

    class Failing(FileOps):
        def __init__(self, code: int) -> None:
            self.code = code

        def open_temp(self, directory: Path) -> tuple[int, Path]:
            raise OSError(self.code, os.strerror(self.code))

    store = ArtifactStore(root, create=False, file_ops=Failing(errno.EROFS))
    assert store.layout == 2 and list(store.iter_refs()) == []
    assert not (root / "LAYOUT").exists()
    with pytest.raises(ArtifactError, match="Input/output error"):
        ArtifactStore(root, create=False, file_ops=Failing(errno.EIO))
    assert not (root / "LAYOUT").exists()
