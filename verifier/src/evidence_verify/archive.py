"""An archive (the directory ``evidence export --format sql`` writes), checked file by file
and then as a log.

    manifest.json   counts, a BLAKE3 hash and size per file and per section, the log head
    dump.sql        the canonical dump: the schema, then every table, rows in key order
    artifacts/      format 2: index.tsv (namespace, digest, size, segment, offset per
                    payload, sorted) and segment-NNNNNN files holding the payloads back to
                    back; format 1: one file per payload, <namespace>/<aa>/<BLAKE3>

What is checked, in order:

1. every file the manifest lists has its size and BLAKE3; every section of the dump (a
   byte range of a file) has its BLAKE3; nothing but the manifest, its files and the
   payloads is in the directory;
2. every payload hashes to its name (format 2: each range of a segment the index gives
   hashes to its digest; the index is sorted, and the ranges of each segment follow each
   other from its start to its end, so a segment holds nothing else), and their count and
   bytes are the manifest's (less the gaps it declares: payloads the store had lost
   before the export);
3. the dump is loaded into an in-memory SQLite database (Python's own ``sqlite3``) and the
   ledger is rebuilt as a log: entries contiguous from 0, each entry's leaf hash
   SHA-256(0x00 || entry) and BLAKE3 payload hash as stored, and the RFC 9162 root at
   every size a commit-log row records equal to that row's root, and at the manifest's
   size equal to the manifest's root;
4. with a checkpoint and the operator's key: the signature, the origin (the store's id),
   and the root at the checkpoint's size, recomputed from the archive's own ledger, equal
   to the signed root: the archive holds the very log the operator signed (up to that
   size; entries after it are in the archive but not covered by that signature).

Not checked here: that each evidence row (an attempt, a link) says what its ledger entry
says, and the commit log's hash chain over times and quarantine records. ``evidence
verify`` on a restored copy checks both; docs/verify.md says what that leaves to trust.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path

import blake3

from .checkpoint import Checkpoint, VerifierKey, bound, check_checkpoint
from .log import Log, rebuild
from .policy import Proofs
from .rows import check_rows
from .verdict import Verdict

_MANIFEST = "manifest.json"
CARRIED, CARRIED_TSR = "checkpoint", "checkpoint.tsr"  # what export --checkpoint adds
_ARTIFACTS = "artifacts"
_INDEX_HEADER = "namespace\tdigest\tsize\tsegment\toffset"
_SEGMENT = re.compile(r"segment-[0-9]{6}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


def _blake3_file(path: Path, start: int = 0, length: int | None = None) -> tuple[str, int]:
    hasher, size = blake3.blake3(max_threads=1), 0
    with open(path, "rb") as f:
        f.seek(start)
        while length is None or size < length:
            chunk = f.read(_CHUNK if length is None else min(_CHUNK, length - size))
            if not chunk:
                break
            hasher.update(chunk)
            size += len(chunk)
    return hasher.hexdigest(), size


def check_archive(directory: str | os.PathLike[str], *, checkpoint: bytes | str | None = None,
                  key: VerifierKey | None = None, proofs: Proofs | None = None) -> Verdict:
    """``checkpoint`` None: the one the archive carries, if any (with its timestamp).
    ``proofs``: the timestamp and witness policy to check the checkpoint against."""
    root = Path(directory)
    proofs = proofs or Proofs()
    verdict = Verdict("archive", str(directory))
    try:
        manifest = json.loads((root / _MANIFEST).read_bytes())
    except FileNotFoundError:
        verdict.problem(f"no {_MANIFEST}: not an archive made by evidence export")
        return verdict.finish()
    except (OSError, ValueError) as exc:
        verdict.problem(f"{_MANIFEST} cannot be read: {exc}")
        return verdict.finish()
    if not isinstance(manifest, dict) or manifest.get("format") != "sql":
        verdict.problem(f"this verifier reads archives in the sql format, not "
                        f"{manifest.get('format') if isinstance(manifest, dict) else '?'!r}")
        return verdict.finish()
    verdict.facts |= {"store_id": manifest.get("store_id"),
                      "tree_size": manifest.get("log", {}).get("tree_size"),
                      "root": manifest.get("log", {}).get("root")}
    segmented = manifest.get("format_version", 1) >= 2
    files_ok = _check_files(root, manifest, verdict, segmented)
    if segmented:
        _check_segments(root, manifest, verdict)
    else:
        _check_payloads(root, manifest, verdict)
    if files_ok:
        _check_log(root, manifest, verdict, checkpoint, key, proofs)
    else:
        verdict.notes.append("the log was not rebuilt: the dump is not the one the manifest "
                             "describes")
    return verdict.finish()


def _check_files(root: Path, manifest: dict, verdict: Verdict, segmented: bool) -> bool:
    ok = True
    files = manifest.get("files", {})
    for name, entry in sorted(files.items()):
        path = root / name
        if not path.is_file() or ".." in Path(name).parts:
            verdict.problem(f"{name} is in the manifest but not in the archive")
            ok = False
            continue
        digest, size = _blake3_file(path)
        if (digest, size) != (entry.get("blake3"), entry.get("bytes")):
            verdict.problem(f"{name}: {size} bytes, BLAKE3 {digest}; the manifest says "
                            f"{entry.get('bytes')} bytes, {entry.get('blake3')}")
            ok = False
    sections = [("schema", manifest.get("schema")), *sorted(manifest.get("tables", {}).items())]
    for name, section in sections:
        if not isinstance(section, dict) or section.get("file") not in files:
            verdict.problem(f"section {name} names no file of the archive")
            ok = False
            continue
        digest, size = _blake3_file(root / section["file"], section["offset"], section["bytes"])
        if (digest, size) != (section.get("blake3"), section.get("bytes")):
            verdict.problem(f"section {name} of {section['file']} does not have the BLAKE3 "
                            "the manifest gives")
            ok = False
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if path.is_file() and name != _MANIFEST and name not in files and (
                segmented or not name.startswith(_ARTIFACTS + "/")):
            verdict.problem(f"{name} is in the archive but not in the manifest: nothing "
                            "vouches for it")
    verdict.facts["files"] = len(files)
    return ok


def _check_payloads(root: Path, manifest: dict, verdict: Verdict) -> None:
    count = total = 0
    base = root / _ARTIFACTS
    for path in sorted(base.rglob("*")) if base.is_dir() else []:
        if not path.is_file():
            continue
        parts = path.relative_to(base).parts
        if parts[-1] == "LAYOUT" and len(parts) == 1:
            continue
        if (len(parts) != 3 or not _DIGEST.fullmatch(parts[2])
                or parts[1] != parts[2][:2]):
            verdict.problem(f"{_ARTIFACTS}/{'/'.join(parts)} is not a payload file "
                            "(<namespace>/<aa>/<BLAKE3>)")
            continue
        digest, size = _blake3_file(path)
        count, total = count + 1, total + size
        if digest != parts[2]:
            verdict.problem(f"payload {parts[0]}/{parts[2]} does not hash to its name "
                            f"(BLAKE3 {digest}): its bytes were changed")
    _compare_counts(manifest, verdict, count, total)


def _check_segments(root: Path, manifest: dict, verdict: Verdict) -> None:
    """Format 2: the index, sorted and well formed, and each payload's range of its
    segment hashing to its digest; the ranges tile each segment exactly."""
    base = root / _ARTIFACTS
    try:
        lines = (base / "index.tsv").read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        verdict.problem(f"{_ARTIFACTS}/index.tsv cannot be read: {exc}")
        return
    if lines[0] != _INDEX_HEADER or lines[-1] != "":
        verdict.problem(f"{_ARTIFACTS}/index.tsv is not a payload index (its header, or its "
                        "last line, is not the format's)")
        return
    ends: dict[str, int] = {}  # segment -> where its next payload must start
    handles: dict[Path, int] = {}
    try:
        count, total = _check_index(base, lines, ends, handles, verdict)
    finally:
        for fd in handles.values():
            os.close(fd)
    on_disk = {p.name for p in base.iterdir() if _SEGMENT.fullmatch(p.name)} \
        if base.is_dir() else set()
    for segment in sorted(on_disk | set(ends)):
        path = base / segment
        size = path.stat().st_size if path.is_file() else None
        if size is None:
            verdict.problem(f"{_ARTIFACTS}/{segment} is named by the index but missing")
        elif size != ends.get(segment, 0):
            verdict.problem(f"{_ARTIFACTS}/{segment} holds {size} bytes, its payloads "
                            f"{ends.get(segment, 0)}: bytes no payload accounts for")
    _compare_counts(manifest, verdict, count, total)


def _check_index(base: Path, lines: list[str], ends: dict[str, int],
                 handles: dict[Path, int], verdict: Verdict) -> tuple[int, int]:
    """Each index line: well formed, in order, its range right after the one before it in
    its segment and hashing to its digest; (payloads, bytes)."""
    count = total = 0
    previous = ("", "")
    for number, line in enumerate(lines[1:-1], 2):
        fields = line.split("\t")
        if (len(fields) != 5 or not _DIGEST.fullmatch(fields[1]) or not fields[2].isdigit()
                or not fields[4].isdigit() or not _SEGMENT.fullmatch(fields[3])):
            verdict.problem(f"{_ARTIFACTS}/index.tsv line {number} is not "
                            "namespace, digest, size, segment, offset")
            continue
        namespace, digest, size, segment, offset = (fields[0], fields[1], int(fields[2]),
                                                    fields[3], int(fields[4]))
        if (namespace, digest) <= previous:
            verdict.problem(f"{_ARTIFACTS}/index.tsv line {number} is out of order or "
                            "repeats a payload")
        previous = (namespace, digest)
        if offset != ends.get(segment, 0):
            verdict.problem(f"payload {namespace}/{digest} starts at byte {offset} of "
                            f"{segment}, not where the one before it ends")
        ends[segment] = offset + size
        got, length = _blake3_range(base / segment, offset, size, handles)
        count, total = count + 1, total + size
        if length != size:
            verdict.problem(f"payload {namespace}/{digest}: {segment} ends before its "
                            f"{size} bytes do")
        elif got != digest:
            verdict.problem(f"payload {namespace}/{digest} does not hash to its name "
                            f"(BLAKE3 {got}): its bytes were changed")
    return count, total


def _blake3_range(path: Path, offset: int, size: int, handles: dict[Path, int]
                  ) -> tuple[str, int]:
    """(BLAKE3, bytes read) of ``size`` bytes at ``offset``; a missing file reads none."""
    if path not in handles:
        try:
            handles[path] = os.open(path, os.O_RDONLY)
        except OSError:
            return "", 0
    hasher, done = blake3.blake3(max_threads=1), 0
    while done < size:
        chunk = os.pread(handles[path], min(_CHUNK, size - done), offset + done)
        if not chunk:
            break
        hasher.update(chunk)
        done += len(chunk)
    return hasher.hexdigest(), done


def _compare_counts(manifest: dict, verdict: Verdict, count: int, total: int) -> None:
    gaps = manifest.get("gaps", [])
    if count != manifest.get("artifacts") and not gaps:
        verdict.problem(f"{count} payloads, the manifest says {manifest.get('artifacts')}")
    if not gaps and total != manifest.get("artifact_bytes"):
        verdict.problem(f"{total} payload bytes, the manifest says "
                        f"{manifest.get('artifact_bytes')}")
    if gaps:
        verdict.notes.append(f"the manifest declares {len(gaps)} gap(s) (what the store "
                             "lacked when exported): payload counts not compared")
    verdict.facts["payloads"] = count


def _check_log(root: Path, manifest: dict, verdict: Verdict, checkpoint: bytes | str | None,
               key: VerifierKey | None, proofs: Proofs) -> None:
    db = sqlite3.connect(":memory:")
    try:
        try:
            db.executescript((root / "dump.sql").read_text(encoding="utf-8"))
        except (sqlite3.Error, UnicodeDecodeError, OSError) as exc:
            verdict.problem(f"dump.sql does not load into SQLite: {exc}")
            return
        log = rebuild(db, verdict)
        check_rows(db, verdict)
    finally:
        db.close()
    roots, store_id = log.roots, log.store_id
    head = manifest.get("log", {})
    size = len(roots) - 1
    verdict.facts["entries"] = size
    verdict.facts["batches"] = len(log.heads)
    if head.get("tree_size") != size or head.get("root") != roots[-1].hex():
        verdict.problem(f"the ledger gives a tree of {size} entries with root "
                        f"{roots[-1].hex()}; the manifest says {head.get('tree_size')}, "
                        f"{head.get('root')}")
    if store_id != manifest.get("store_id"):
        verdict.problem(f"the dump is of store {store_id!r}, the manifest says "
                        f"{manifest.get('store_id')!r}")
    carried = (root / CARRIED).read_bytes() if CARRIED in manifest.get("files", {}) else None
    if checkpoint is None:
        checkpoint = carried
        if carried is not None and proofs.timestamp is None and CARRIED_TSR in manifest.get(
                "files", {}):
            proofs.timestamp = (root / CARRIED_TSR).read_bytes()
    if checkpoint is None or key is None:
        verdict.notes.append("no checkpoint " + ("given" if checkpoint is None else
                             "key given (--public-key)") + ": the archive is consistent with "
                             "itself, but nothing signed says it is the operator's log")
        if proofs.wanted():
            verdict.problem("a TSA root or a witness was named, but there is no checkpoint "
                            "(and its key) to check them on")
        return
    signed, cp = check_checkpoint(checkpoint, key)
    verdict.notes += signed.notes
    if cp is None:
        verdict.problems += [f"checkpoint: {p}" for p in signed.problems]
        return
    verdict.facts |= {"checkpoint_size": cp.tree_size, "checkpoint_key": cp.verified_by,
                      "checkpoint": "carried by the archive" if checkpoint is carried
                      else "given"}
    proofs.check(checkpoint if isinstance(checkpoint, bytes) else checkpoint.encode(), cp,
                 verdict)
    if cp.origin != f"evidence/{store_id}":
        verdict.problem(f"the checkpoint is for log {cp.origin!r}, the archive is of store "
                        f"{store_id!r}")
        return
    _against(cp, log, verdict)


def _against(cp: Checkpoint, log: Log, verdict: Verdict) -> None:
    """The signed size, root, chain head and pre-006 quarantine rows against the log."""
    size = len(log.roots) - 1
    if cp.tree_size > size:
        verdict.problem(f"the checkpoint signs {cp.tree_size} entries, the archive holds "
                        f"{size}: entries the operator signed are missing")
        return
    if log.roots[cp.tree_size] != cp.root:
        verdict.problem(f"the archive's first {cp.tree_size} entries do not give the root "
                        "the checkpoint signs: the log was rewritten")
    chain, legacy = bound(cp, "chain"), bound(cp, "legacy-quarantine")
    if chain is None:
        verdict.notes.append("the checkpoint was signed before checkpoints bound the "
                             "commit-log chain: it vouches for the accepted messages only, "
                             "not for commit times, quarantine records or the store's id")
    else:
        seq, digest = chain
        found = log.heads.get(seq)
        if found is None and seq != 0:
            verdict.problem(f"the archive has no batch {seq}, the last one the checkpoint "
                            "signs")
        elif found is not None and (found.tree_size, found.root) != (cp.tree_size, cp.root):
            verdict.problem(f"batch {seq} recomputes to size {found.tree_size}; the "
                            f"checkpoint signs size {cp.tree_size} at that batch")
        elif found is not None and found.chain != digest:
            verdict.problem(f"the commit-log chain recomputed up to batch {seq} is not the "
                            "one signed: a commit or receipt time, a quarantine record or "
                            "the store's identity differs from what was signed")
        else:
            verdict.facts["checkpoint_batch"] = seq
    if legacy is not None and legacy != log.legacy:
        verdict.problem(f"the quarantine rows in the pre-006 layout are not the signed ones "
                        f"({log.legacy[0]} in the archive, {legacy[0]} signed)")
    if cp.tree_size < size:
        verdict.notes.append(f"the checkpoint covers the first {cp.tree_size} of the "
                             f"{size} entries; the rest are not covered by its signature")
