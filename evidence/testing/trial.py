"""The writer trial: a fixed workload under one fault on the simulated disk, a crash, and
every guarantee checked after the reboot (docs/reliability.md).

    workload   ``Workload`` and ``build_groups``: a session and run, then batches of pages
               (each body put in the artifact store, then the page's attempt and links
               submitted as one group), one duplicate and one conflict among them; the
               same groups on every call.
    trial      ``run_trial``: create a store, run the workload on a ``SimulatedDisk``
               (``evidence.testing.disk``) with the fault armed, cut the power, write the
               crash image, reopen with the ordinary VFS and check every guarantee; what did
               not hold is in ``Trial.problems``.
    faults     ``count_operations`` (a fault-free run, counted per operation and per file
               kind) and ``iter_faults`` (one fault for each counted operation N);
               ``operation_kinds`` and ``sample_faults``: a reproducible sample of those
               faults that still hits every kind of operation they hit.

``tools/faultloop.py`` drives it for N = 1, 2, ... (every fault point: minutes);
``tests/test_faults.py`` for a sample of them (the suite's share of that time).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime as dt
import itertools
import os
import random
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import apsw
import blake3

from .._audit.verify import verify
from .._errors import EvidenceError, StoreError
from .._model.acks import Ack
from .._model.messages import (
    Discovery,
    FetchAttempt,
    Message,
    ObservedRef,
    RunEnded,
    RunStarted,
    SessionStarted,
    canonical_encode,
    payload_hash,
)
from .._model.refs import ArtifactRef
from .._store.db import Store
from .._write.limits import WriterLimits
from .._write.writer import Writer
from .disk import CrashMode, CrashVFS, Fault, SimulatedDisk, open_store

__all__ = [
    "FIXED_TIME",
    "Group",
    "Trial",
    "Workload",
    "build_groups",
    "count_operations",
    "iter_faults",
    "operation_kinds",
    "operation_log",
    "run_trial",
    "sample_faults",
]

# --- the fault loop: a fixed workload, a fault, a crash, and what must hold after it ----

FIXED_TIME = dt.datetime(2025, 3, 3, 12, 0, tzinfo=dt.UTC)


@dataclass(frozen=True, kw_only=True)
class Workload:
    """The fixed workload: a session and run, then batches of pages (attempt + links).

    Every page's body is put in the artifact store (through the seam) before its batch is
    submitted as one group. One group redelivers an earlier message (a duplicate) and one
    sends a changed copy of an earlier message (a conflict, quarantined).
    """

    batches: int = 6
    pages_per_batch: int = 3
    links_per_page: int = 3
    body_bytes: int = 2_000
    sync: Literal["full", "normal"] = "full"
    checkpoint_wal_bytes: int = 48 * 1024  # small, so checkpoints run inside the workload
    # Where payloads go: packs (many puts, one fsync, in the writer's sync before COMMIT)
    # or one fsynced file each (stores made before packs).
    artifacts: Literal["packs", "files"] = "packs"
    pack_bytes: int | None = None  # packs: rotate at this size (small: rotations happen)

    def limits(self) -> WriterLimits:
        return WriterLimits(checkpoint_wal_bytes=self.checkpoint_wal_bytes)


@dataclass(frozen=True)
class Group:
    messages: list[Message]
    bodies: list[bytes]  # put before the group is submitted


def build_groups(workload: Workload, *, prefix: str = "w") -> list[Group]:
    """The workload's groups, identical on every call (fixed ids, times and bodies)."""
    ids = (f"{prefix}{i:05d}" for i in itertools.count())
    groups = [Group([SessionStarted(message_id=next(ids), session_id="s1",
                                    started_at=FIXED_TIME),
                     RunStarted(message_id=next(ids), run_id="r1", session_id="s1",
                                started_at=FIXED_TIME)], [])]
    first_attempt: FetchAttempt | None = None
    for b in range(workload.batches):
        messages: list[Message] = []
        bodies = []
        for p in range(workload.pages_per_batch):
            page = f"{prefix}-{b}-{p}"
            body = (f"<html><title>{page}</title>".encode()
                    + bytes(range(256)) * (workload.body_bytes // 256))
            ref = ArtifactRef("body", blake3.blake3(body).hexdigest(), len(body))
            attempt = FetchAttempt(
                message_id=next(ids), attempt_id=f"a-{page}", run_id="r1",
                url=f"http://example.com/{page}", sequence=0, started_at=FIXED_TIME,
                elapsed_ms=1.5, outcome="response", http_status=200, body=ref)
            refs = [ObservedRef(observed=f"/{page}/{i}", url=f"http://example.com/{page}/{i}",
                                position=i) for i in range(workload.links_per_page)]
            messages += [attempt, Discovery(message_id=next(ids), run_id="r1",
                                            source_attempt_id=attempt.attempt_id,
                                            source_artifact=ref, refs=refs)]
            bodies.append(body)
            first_attempt = first_attempt or attempt
        if b == 2 and first_attempt is not None:
            messages.append(first_attempt)  # redelivered inside a later batch: a duplicate
        groups.append(Group(messages, bodies))
        if b == 3 and first_attempt is not None:
            changed = FetchAttempt(**{**_fields(first_attempt), "elapsed_ms": 99.0})
            groups.append(Group([changed], []))  # same id, other content: a conflict
    groups.append(Group([RunEnded(message_id=next(ids), run_id="r1", ended_at=FIXED_TIME,
                                  outcome="completed")], []))
    return groups


def _fields(message: Message) -> dict[str, Any]:
    return {name: getattr(message, name) for name in message.__struct_fields__}


@dataclass
class Trial:
    """One run of the workload under one fault, and what the checks found afterwards."""

    fault: Fault | None
    seed: int
    sync: str
    acked: dict[tuple[str, str], str] = field(default_factory=dict)  # (id, hash) -> status
    ack_order: list[tuple[str, str]] = field(default_factory=list)
    # Payloads that must survive: files, every put that returned; packs, every payload of
    # a group that was acknowledged (its batch synced it before COMMIT).
    puts: list[ArtifactRef] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)
    errors_seen: list[str] = field(default_factory=list)  # what the workload was told
    restarts: int = 0
    wal_syncs_at_ack: dict[tuple[str, str], int] = field(default_factory=dict)
    wal_syncs_at_crash: int = 0
    lost: list[tuple[str, str]] = field(default_factory=list)  # acked, missing after the crash
    problems: list[str] = field(default_factory=list)  # guarantees that did not hold
    orphans: int = 0
    operations: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def run_trial(root: os.PathLike[str] | str, fault: Fault | None, *,
              workload: Workload | None = None, seed: int = 0,
              sync_failure: Literal["lose", "keep"] = "lose",
              final_crash: CrashMode = "drop") -> Trial:
    """Create a store under ``root``, run the workload under ``fault``, crash, check.

    If the fault did not cut the power, the power is cut (``final_crash``) at the first
    ack after an error fault fired (was that ack durable?), or else once the workload has
    closed the store.
    """
    workload = workload or Workload()
    root = Path(root)
    store_path = root / "store"
    _new_store(store_path, workload.artifacts)
    disk = SimulatedDisk(root, seed=seed, sync_failure=sync_failure)
    disk.capture()
    disk.arm(fault)
    trial = Trial(fault=fault, seed=seed, sync=workload.sync)
    groups = build_groups(workload)
    vfs = CrashVFS(f"crash-{id(disk):x}", disk=disk)
    try:
        anyio.run(_drive, store_path, vfs, disk, workload, groups, trial, final_crash)
        disk.power_loss(final_crash)
    finally:
        vfs.unregister()
    trial.fired = list(disk.fired)
    trial.operations = sum(disk.counts.values())
    trial.wal_syncs_at_crash = disk.wal_syncs_at_crash
    disk.write_crash_image()
    _check(store_path, workload, groups, trial)
    return trial


def count_operations(root: os.PathLike[str] | str, workload: Workload | None = None
                     ) -> collections.Counter[str]:
    """Run the workload without a fault; how many operations of each kind it makes."""
    disk = _fault_free(Path(root), workload or Workload())
    return collections.Counter(disk.counts) + disk.kind_counts


def operation_log(root: os.PathLike[str] | str, workload: Workload | None = None
                  ) -> list[tuple[str, str, int, int]]:
    """Run the workload without a fault; every operation it makes, in order: (operation,
    path under ``root``, offset, length), a pack's random name replaced by its order of
    first appearance. Two runs of one workload give the same log: the fault at operation
    N of a trial is the same operation every run."""
    disk = _fault_free(Path(root), workload or Workload())
    names: dict[str, str] = {}

    def name(path: str) -> str:
        return _PACK_NAME.sub(lambda m: names.setdefault(m.group(0), f"pack{len(names)}"),
                              path)

    return [(op, name(path), offset, length) for _, op, path, offset, length, _ in disk.log]


_PACK_NAME = re.compile(r"[0-9a-f]{32}")


def _fault_free(root: Path, workload: Workload) -> SimulatedDisk:
    _new_store(root / "store", workload.artifacts)
    disk = SimulatedDisk(root)
    disk.capture()
    vfs = CrashVFS(f"count-{id(disk):x}", disk=disk)
    trial = Trial(fault=None, seed=0, sync=workload.sync)
    try:
        anyio.run(_drive, root / "store", vfs, disk, workload, build_groups(workload), trial)
    finally:
        vfs.unregister()
    if trial.errors_seen:
        raise RuntimeError(f"the workload failed without a fault: {trial.errors_seen}")
    return disk


_templates: dict[str, Path] = {}


def _new_store(path: Path, artifacts: Literal["packs", "files"]) -> None:
    """A new, empty store at ``path``: a copy of one this process created (every trial
    starts from the same empty store, and creating one applies every migration: most of
    a short trial's time), made before the disk model captures the directory."""
    template = _templates.get(artifacts)
    if template is None or not template.is_dir():
        holder = Path(tempfile.mkdtemp(prefix="evidence-trial-template-"))
        atexit.register(shutil.rmtree, holder, ignore_errors=True)
        template = holder / "store"
        with Store.create(template, artifact_layout=artifacts):
            pass
        _templates[artifacts] = template
    shutil.copytree(template, path, symlinks=True)


def _close(store: Store | None) -> None:
    if store is not None:
        with contextlib.suppress(EvidenceError):
            store.artifacts.close()  # packs: sealed (an fsync that may fail, or be cut)
        with contextlib.suppress(apsw.Error):
            store.connection.close()


async def _drive(store_path: Path, vfs: CrashVFS, disk: SimulatedDisk, workload: Workload,
                 groups: list[Group], trial: Trial,
                 crash_after_error: CrashMode | None = None) -> None:
    """Submit the groups in order; after an error, redeliver (restarting if need be)."""
    k, failures = 0, 0
    while k < len(groups) and not disk.crashed and failures <= 8:
        store = None
        try:
            store = open_store(store_path, vfs, disk, workload.sync, workload.pack_bytes)
            durable_at_put = workload.artifacts == "files"
            async with Writer(store, limits=workload.limits()) as writer:
                while k < len(groups) and not disk.crashed and failures <= 8:
                    group = groups[k]
                    try:
                        refs = []
                        for body in group.bodies:
                            refs.append(store.artifacts.put("body", body))
                            if durable_at_put:
                                trial.puts.append(refs[-1])
                        acks = await writer.submit_group(group.messages)
                        if not durable_at_put:
                            trial.puts += refs
                    except EvidenceError as exc:
                        trial.errors_seen.append(f"{type(exc).__name__}: {exc}")
                        failures += 1
                        if type(exc).__name__ == "WriterClosedError":
                            break  # restart the writer on a reopened store
                        continue  # redeliver the same group
                    _record(trial, group, acks, disk)
                    k += 1
                    if disk.fired and trial.errors_seen and crash_after_error:
                        disk.power_loss(crash_after_error)
        except Exception as exc:  # the writer failed (an ExceptionGroup) or the open did
            trial.errors_seen.append(_describe(exc))
            failures += 1
        finally:
            _close(store)
        trial.restarts += 1
    trial.restarts -= 1


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def _record(trial: Trial, group: Group, acks: list[Ack], disk: SimulatedDisk) -> None:
    for message, ack in zip(group.messages, acks, strict=True):
        key = (message.message_id, payload_hash(canonical_encode(message)))
        if key not in trial.acked:
            trial.acked[key] = ack.status
            trial.ack_order.append(key)
            trial.wal_syncs_at_ack[key] = disk.wal_syncs


def _check(store_path: Path, workload: Workload, groups: list[Group], trial: Trial) -> None:
    """Reopen as after a reboot and check every guarantee; record what does not hold."""
    problems = trial.problems
    try:
        store = Store.open(store_path, sync=workload.sync)
    except StoreError as exc:
        problems.append(f"the store does not reopen: {exc}")
        return
    with store:
        conn = store.connection
        integrity = conn.execute("PRAGMA integrity_check").fetchall()
        if integrity != [("ok",)]:
            problems.append(f"integrity_check: {integrity[:3]}")
        ledger = dict(conn.execute("SELECT message_id, payload_hash FROM ingest_ledger"))
        quarantined = {(m, h) for m, h in conn.execute(
            "SELECT message_id, payload_hash FROM quarantine")}
        for key in trial.ack_order:
            mid, digest = key
            present = (key in quarantined if trial.acked[key] == "conflict"
                       else ledger.get(mid) == digest)
            if not present:
                trial.lost.append(key)
        # sync=normal may lose what was acked after the last WAL sync, nothing older.
        unsynced = [key for key in trial.ack_order
                    if trial.wal_syncs_at_ack[key] == trial.wal_syncs_at_crash]
        if trial.lost and workload.sync == "full":
            problems.append(f"{len(trial.lost)} acked messages lost: {trial.lost[:5]}")
        elif set(trial.lost) - set(unsynced):
            problems.append(f"acked messages lost though a WAL sync followed their ack: "
                            f"{sorted(set(trial.lost) - set(unsynced))[:5]}")
        for ref in trial.puts:  # a put that returned is durable, referenced or not
            try:
                store.artifacts.verify(ref)
            except EvidenceError as exc:
                problems.append(f"artifact whose put returned is damaged: {exc}")
        seen: set[str] = set()
        for number, group in enumerate(groups):
            own = [m.message_id for m in group.messages if m.message_id not in seen]
            seen.update(own)
            present = sum(1 for mid in own if mid in ledger)
            if present not in (0, len(own)):
                problems.append(f"group {number} is half-present ({present} of {len(own)})")
        report = verify(store, full=True)
        problems += [f"verify: {f.kind}: {f.message}" for f in report.errors]
        trial.orphans = report.checks.get("orphans", 0)
        try:
            anyio.run(_resume, store, workload, groups, trial)
        except Exception as exc:
            problems.append(f"the writer does not resume: {type(exc).__name__}: {exc}")
            return
        report = verify(store, full=True)
        problems += [f"verify after resuming: {f.kind}: {f.message}" for f in report.errors]


async def _resume(store: Store, workload: Workload, groups: list[Group], trial: Trial) -> None:
    """Redeliver every group, then one new page: everything converges, nothing is refused."""
    extra = build_groups(Workload(batches=1, pages_per_batch=1), prefix="x")[1]
    first: dict[str, str] = {}  # message id -> the payload hash of its first delivery
    async with Writer(store, limits=workload.limits()) as writer:
        for group in [*groups, extra]:
            for body in group.bodies:
                store.artifacts.put("body", body)
            acks = await writer.submit_group(group.messages)
            for message, ack in zip(group.messages, acks, strict=True):
                digest = payload_hash(canonical_encode(message))
                original = first.setdefault(message.message_id, digest)
                allowed = {"conflict"} if original != digest else {"committed", "duplicate"}
                if ack.status not in allowed:
                    trial.problems.append(f"redelivery of {message.message_id}: {ack.status} "
                                          f"({ack.reason})")


def iter_faults(counts: collections.Counter[str], *, action: str = "power_loss",
                ops: frozenset[str] = frozenset({"write", "sync"}),
                crash: CrashMode = "drop", stride: int = 1, start: int = 1,
                persistent: bool = False, heal_after: int = 0,
                files: frozenset[str] = frozenset()) -> Iterator[Fault]:
    """One fault for each matching operation of a fault-free run: N = start, start+stride...

    ``counts`` is what ``count_operations`` returns (per operation, and per
    ``"operation:file kind"`` for faults aimed at some ``files``).
    """
    if files:
        total = sum(counts[f"{op}:{kind}"] for op in ops for kind in files)
    else:
        total = sum(counts[op] for op in ops)
    for n in range(start, total + 1, stride):
        yield Fault(action=action, at=n, ops=ops, crash=crash,  # type: ignore[arg-type]
                    persistent=persistent, heal_after=heal_after, files=files)


def operation_kinds(root: os.PathLike[str] | str, workload: Workload | None = None
                    ) -> list[tuple[str, str, str]]:
    """Run the workload without a fault; every operation it makes, in order, as (operation,
    kind of file, path under ``root``): what the fault at "the N-th operation" hits."""
    disk = _fault_free(Path(root), workload or Workload())
    return [(op, kind, path)
            for (_, op, path, *_), kind in zip(disk.log, disk.log_kinds, strict=True)]


def sample_faults(faults: Sequence[Fault], operations: Sequence[tuple[str, str, str]], *,
                  extra: int, seed: int) -> list[Fault]:
    """A sample of ``faults`` that still hits every kind of operation they hit.

    ``faults`` count one set of operations (one ``iter_faults`` call); ``operations`` is
    ``operation_kinds`` of their workload. The sample holds, for each (operation, kind of
    file) the faults hit, the first and the last fault that hits it; the first and the last
    fault of all; and ``extra`` more drawn by ``random.Random(seed)``: the same arguments
    give the same sample, so a failing trial is rerun as it was. The test suite runs a
    sample; ``tools/faultloop.py`` runs every fault.
    """
    if not faults:
        return []
    first = faults[0]
    if any((f.ops, f.files, f.path_suffix) != (first.ops, first.files, first.path_suffix)
           for f in faults):
        raise ValueError("sample_faults: the faults must count the same operations")
    counted = [(op, kind) for op, kind, path in operations
               if op in first.ops and path.endswith(first.path_suffix)
               and (not first.files or kind in first.files)]
    by_class: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for i, fault in enumerate(faults):
        if not 1 <= fault.at <= len(counted):
            raise ValueError(f"sample_faults: {fault} is past the workload's "
                             f"{len(counted)} counted operations")
        by_class[counted[fault.at - 1]].append(i)
    chosen = {0, len(faults) - 1}
    for members in by_class.values():
        chosen |= {members[0], members[-1]}
    rest = sorted(set(range(len(faults))) - chosen)
    chosen |= set(random.Random(seed).sample(rest, min(extra, len(rest))))
    return [faults[i] for i in sorted(chosen)]
