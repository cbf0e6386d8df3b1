"""Converting a store's payload files into packs: only when asked, resumable, idempotent.

    report = convert_to_packs("./site.evidence", progress=...)

A store made before packs keeps one file per payload, and is read and written that way
until its owner runs this (``evidence convert STORE``). In order, each step durable before
the next:

  1. ``artifacts/PACKS/`` is created, then ``artifacts/LAYOUT`` is replaced by
     "evidence-artifacts 3": from here on the store opens as packs, and payload files not
     packed yet are still read where they are (``PackStore.legacy``);
  2. each payload file not in a pack yet is read, re-hashed and appended to a pack, with
     the file's modification time as its put time (so reclaim's grace period is kept);
     the packs are synced and sealed;
  3. each file now in a sealed pack is removed, then the empty fan-out directories.

Killed anywhere, a second run finishes the work: a payload found in a pack is not copied
again, and no file is removed before its bytes are in a sealed pack. The database is not
touched: its rows name payloads by digest, so every export, report and proof is the same
before and after (tests/test_convert.py). A file whose bytes do not hash to its name is
left where it is and reported: ``evidence verify --full`` says more.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import blake3
import msgspec

from .._errors import ArtifactError, StoreError, SyncError
from .._model.refs import NAMESPACE_RE
from .artifactbase import _subdirs
from .artifacts import ArtifactStore
from .fileops import FileOps
from .packs import PACKS_DIR, PackStore, _write_small_file, store_layout
from .resync import SYNC_MARKER
from .runlock import crawl_lock

__all__ = ["ConvertReport", "convert_to_packs"]

Progress = Callable[[str, int, int], None]  # (phase, done, total)
_ARTIFACTS, _DB = "artifacts", "evidence.db"


class ConvertReport(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    layout_before: str  # "files" (one file per payload) or "packs"
    payloads: int  # payload files found
    packed: int  # copied into packs by this run
    already_packed: int  # found in a pack already (a run that was interrupted)
    removed: int  # payload files removed once their bytes were in a sealed pack
    packed_bytes: int
    kept: list[str]  # files left in place: their bytes do not hash to their name


def convert_to_packs(store_path: os.PathLike[str] | str, *,
                     progress: Progress | None = None) -> ConvertReport:
    """Move every payload file of the store at ``store_path`` into packs (see the module
    docstring). Holds the store's crawl lock: refused while a crawl runs."""
    root = Path(store_path)
    if not (root / _DB).is_file():
        raise StoreError(f"{root}: no evidence store here ({_DB} not found)",
                         hint="give the store directory", path=str(root))
    if (root / SYNC_MARKER).exists():
        raise SyncError(f"{root} is marked after a failed fsync and must be resynced first",
                        hint=f"open it for writing once (e.g. 'evidence crawl --store {root}' "
                        "or a library Store.open), then convert it", path=str(root))
    artifacts = root / _ARTIFACTS
    with crawl_lock(root):
        before = store_layout(artifacts) or "packs"
        if before == "files":
            _switch_to_packs(artifacts)
        packs = PackStore(artifacts)
        try:
            legacy = packs.legacy
            if legacy is None:
                return ConvertReport(path=str(root), layout_before=before, payloads=0,
                                     packed=0, already_packed=0, removed=0, packed_bytes=0,
                                     kept=[])
            refs = list(legacy.iter_refs())
            packed = already = size = 0
            done, kept = [], []
            for i, ref in enumerate(refs, 1):
                if packs.holds(ref):
                    already += 1
                    done.append(ref)
                else:
                    path = legacy.path_for(ref)
                    data = legacy.read(ref)
                    if blake3.blake3(data).hexdigest() != ref.digest:
                        kept.append(str(path))
                    else:
                        packs.import_payload(ref.namespace, data,
                                             put_time=os.stat(path).st_mtime)
                        packed, size = packed + 1, size + ref.size
                        done.append(ref)
                if progress:
                    progress("packing", i, len(refs))
            packs.sync(done)
        finally:
            packs.close()  # seals the pack it wrote
        removed = _remove_packed(artifacts, legacy.layout, done, progress)
    return ConvertReport(path=str(root), layout_before=before, payloads=len(refs),
                         packed=packed, already_packed=already, removed=removed,
                         packed_bytes=size, kept=kept)


def _switch_to_packs(artifacts: Path) -> None:
    """PACKS/ first, then LAYOUT says packs: each durable before the next."""
    ops = FileOps()
    try:
        for directory in ops.makedirs(artifacts / PACKS_DIR):
            ops.fsync_dir(directory.parent)
    except OSError as exc:
        raise ArtifactError(f"cannot create {artifacts / PACKS_DIR}: {exc}",
                            path=artifacts) from exc
    _write_small_file(ops, artifacts, "LAYOUT", b"evidence-artifacts 3\n")


def _remove_packed(artifacts: Path, layout: int, refs: list, progress: Progress | None) -> int:
    """Remove each payload file whose bytes a fresh open finds in a sealed pack."""
    check = PackStore(artifacts, read_only=True)
    files = ArtifactStore(artifacts, create=False, layout=layout)
    removed = 0
    try:
        for i, ref in enumerate(refs, 1):
            check.verify_packed(ref)  # raises if it is not whole in a sealed pack
            if files.remove(ref) is not None:
                removed += 1
            if progress:
                progress("removing files", i, len(refs))
    finally:
        check.close()
    for namespace in _subdirs(artifacts, NAMESPACE_RE):
        for directory in sorted((artifacts / namespace).glob("**/"), reverse=True):
            with contextlib.suppress(OSError):  # not empty: a payload file is left
                directory.rmdir()
    files.clean_stale_temp(older_than=0)
    with contextlib.suppress(OSError):
        (artifacts / ".tmp").rmdir()
    with contextlib.suppress(OSError):
        FileOps().fsync_dir(artifacts)
    return removed
