"""The tamper-evident log inside the store: ledger leaves and the commit-log chain.

Every accepted message is a leaf of an RFC 9162 Merkle tree (``ingest_ledger.log_index``
is its 0-based leaf index, contiguous). Each committed batch appends one ``commit_log`` row
with the tree size and root after it, the compact frontier (so reopening costs O(log n)),
and ``entry_hash``, which chains the row to the previous one:

    entry_hash = SHA-256(prev_hash || u64 batch_seq || u64 first_index || u64 tree_size
                         || root || committed_at as UTF-8
                         [|| "quarantined" || u64 length || quarantined])

The bracketed part is there only when the batch quarantined something: ``quarantined``
records which quarantine records it wrote or counted (``_store.quarantine``), so a row of that
table edited, deleted or forged no longer adds up (rows from before it existed hash as
they always did).

The first row's ``prev_hash`` is the store's identity: SHA-256("evidence store id\n" ||
store_id), so editing ``store_meta.store_id`` (the origin of every signed checkpoint)
breaks the chain at its first link. Stores whose first batch was committed before issue
12 start from 32 zero bytes; their identity is not bound (``identity_bound`` says so).
A leaf hashes the row's entry (``_model.messages.ledger_entry``: its payload, wrapped with
its submitter when a worker host submitted it), so editing any ledger payload or submitter
changes a leaf and so every later root; editing a commit-log
row breaks the chain. ``check_log`` recomputes both from the ledger alone, independently
of the writer's in-memory state.
"""

from __future__ import annotations

import bisect
import datetime as dt
import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import apsw

from .._model.merkle import EMPTY_ROOT, CompactTree, leaf_hash, leaf_hashes, level_above
from .._model.messages import ledger_entry

__all__ = ["GENESIS_HASH", "TIME_TOLERANCE", "Head", "LogCheck", "LogFinding", "LogHead",
           "check_log", "check_log_bulk", "check_times", "entry_hash", "has_column",
           "identity_bound", "identity_genesis", "load_head"]

GENESIS_HASH = bytes(32)  # the first prev_hash of stores made before issue 12


def identity_genesis(store_id: str) -> bytes:
    """The first row's ``prev_hash``: the store's identity, bound into the chain."""
    return hashlib.sha256(b"evidence store id\n" + store_id.encode()).digest()


def entry_hash(prev_hash: bytes, batch_seq: int, first_index: int, tree_size: int,
               root: bytes, committed_at: str, quarantined: bytes | None = None) -> bytes:
    """The chain hash of one commit-log row (see the module docstring for the layout)."""
    h = hashlib.sha256(prev_hash)
    for number in (batch_seq, first_index, tree_size):
        h.update(number.to_bytes(8, "big"))
    h.update(root)
    h.update(committed_at.encode())
    if quarantined is not None:
        h.update(b"quarantined")
        h.update(len(quarantined).to_bytes(8, "big"))
        h.update(quarantined)
    return h.digest()


def _store_id(conn: apsw.Connection) -> str:
    rows = conn.execute("SELECT value FROM store_meta WHERE key = 'store_id'").fetchall()
    return rows[0][0] if rows else ""


def has_column(conn: apsw.Connection, table: str, column: str) -> bool:
    """Whether ``table`` has ``column`` (a store opened read-only may predate it)."""
    if not isinstance(conn, apsw.Connection):  # a server database: its catalog says
        return bool(conn.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema() "
            "AND table_name = ? AND column_name = ?", (table, column)).fetchall())
    return any(row[1] == column for row in conn.execute(f"PRAGMA table_info({table})"))


def identity_bound(conn: apsw.Connection) -> bool | None:
    """Whether the chain starts from the store's identity: True; from zeros (a store made
    before issue 12): False; None when the log is empty."""
    rows = conn.execute("SELECT prev_hash FROM commit_log WHERE batch_seq = 1").fetchall()
    return None if not rows else rows[0][0] != GENESIS_HASH


@dataclass
class LogHead:
    """Where the log stands after the last committed batch."""

    tree: CompactTree
    batch_seq: int
    entry_hash: bytes
    committed_at: str = ""  # the last batch's commit time, as read (the writer's floor)


def load_head(conn: apsw.Connection) -> LogHead:
    """Read the last commit-log row: O(log n), no scan of the ledger."""
    rows = conn.execute(
        "SELECT batch_seq, tree_size, frontier, entry_hash, committed_at FROM commit_log "
        "ORDER BY batch_seq DESC LIMIT 1").fetchall()
    if not rows:
        return LogHead(CompactTree(), 0, identity_genesis(_store_id(conn)))
    batch_seq, tree_size, frontier, chain, committed_at = rows[0]
    return LogHead(CompactTree.from_bytes(tree_size, frontier), batch_seq, chain, committed_at)


@dataclass(frozen=True)
class Head:
    """One batch as recomputed from the ledger and the chain: what a checkpoint signs."""

    batch_seq: int
    tree_size: int
    root: bytes
    chain: bytes  # the chain hash recomputed from the store's identity up to this batch
    committed_at: str


@dataclass(frozen=True)
class LogFinding:
    """One way the stored log disagrees with a recomputation from the ledger."""

    what: str  # 'leaf', 'index_gap', 'root', 'chain', 'frontier', 'batch', 'identity'
    detail: str
    log_index: int | None = None
    batch_seq: int | None = None


def check_log(conn: apsw.Connection, heads: dict[int, Head] | None = None
              ) -> tuple[int, bytes, list[LogFinding]]:
    """Recompute every leaf, root and chain link from the ledger; return (size, root, findings).

    Streams the ledger in log order, so memory stays O(log n) whatever its size. ``heads``,
    when given, receives each batch's recomputed ``Head``: its chain hash is computed from
    the recomputed roots and the recomputed previous link, never from a stored hash, so it
    is what a signed checkpoint binds (``_audit.checkpoints``).
    """
    agreed = check_log_bulk(conn, heads)
    if agreed is not None:
        return agreed[0], agreed[1], []
    if heads is not None:
        heads.clear()
    check = LogCheck(conn, heads)
    leaves = conn.execute(_leaves_sql(conn))
    for row in leaves:
        if not check.leaf(*row):
            break
    return check.finish()


def _leaves_sql(conn: apsw.Connection) -> str:
    submitter = ("submitter" if has_column(conn, "ingest_ledger", "submitter")
                 else "NULL")  # schema 9 (a store opened read-only may predate it)
    return ("SELECT log_index, payload, leaf_hash, batch_seq, received_at, "
            f"{submitter} FROM ingest_ledger ORDER BY log_index")


# --- the bulk path -------------------------------------------------------------------
#
# ``LogCheck`` walks the ledger a leaf at a time, ready to say what is wrong with each. A
# store is almost always intact, so ``check_log`` first asks the cheaper question, "does
# everything agree?", over chunks of leaves at once: every leaf hashed in one list
# comprehension, the stored leaves, batches and times of a chunk compared as whole lists,
# and the tree built a level at a time over the chunk (a level is one comprehension of
# node hashes), where ``CompactTree.append_digest`` took a Python call per leaf. Each
# batch's frontier is then read off the levels (one node per set bit of its size within
# the chunk, after the roots of the chunks before). Any disagreement at all and the answer
# is None: ``LogCheck`` runs, and says where, in its words and order. 2.5 -> 1.0 us a leaf
# (tools/bench_archive.py --side-by-side; docs/archives.md has the figures).

_CHUNK_BITS = 14
_CHUNK = 1 << _CHUNK_BITS  # leaves per step: a perfect subtree, so chunks align with the tree


def check_log_bulk(conn: apsw.Connection, heads: dict[int, Head] | None = None,
                   each_chunk: Callable[[int, Sequence[bytes]], None] | None = None
                   ) -> tuple[int, bytes] | None:
    """(size, root) when every leaf, batch, root, frontier and chain link agrees with a
    recomputation from the ledger (``check_log`` would find nothing); None otherwise.

    ``heads`` receives each batch's ``Head`` as ``check_log`` gives it. ``each_chunk``,
    when given, is called with each chunk of the ledger in log order (its first index and
    its payloads), all of it even once something disagreed: a caller that reads the ledger
    for another check reads it once (``_audit/verify_quick.py``)."""
    quarantined = ("quarantined" if has_column(conn, "commit_log", "quarantined")
                   else "NULL")
    commits = conn.execute(
        "SELECT batch_seq, committed_at, first_index, tree_size, root, frontier, prev_hash, "
        f"entry_hash, {quarantined} FROM commit_log ORDER BY batch_seq").fetchall()
    ok = _chain_agrees(conn, commits) and _contiguous(conn) and _batches_agree(conn, commits)
    ends = [commit[3] for commit in commits]
    tree = _BulkTree()
    batches = iter(commits)
    batch = next(batches, None)
    ledger = iter(conn.execute(_bulk_sql(conn)))
    start = 0
    while True:
        chunk = list(itertools.islice(ledger, _CHUNK))
        if not chunk:
            break
        payloads, stored, submitters, received = zip(*chunk, strict=True)
        if each_chunk is not None:
            each_chunk(start, payloads)
        end = start + len(chunk)
        if ok:
            ok = (list(received) == _times(commits, ends, start, end)
                  and _leaves(payloads, submitters) == list(stored))
            if ok:
                levels = tree.levels(stored)
                while ok and batch is not None and batch[3] <= end:
                    ok = _batch_agrees(tree, levels, start, batch, heads)
                    batch = next(batches, None)
                tree.close(levels)
        start = end
    if not ok or batch is not None:
        return None  # a batch no leaf reached: ``LogCheck`` says which
    return start, commits[-1][4] if commits else EMPTY_ROOT  # the last root, as recomputed


def _bulk_sql(conn: apsw.Connection) -> str:
    """Each leaf's payload, stored leaf hash, submitter and receipt time, in log order."""
    submitter = "submitter" if has_column(conn, "ingest_ledger", "submitter") else "NULL"
    return (f"SELECT payload, leaf_hash, {submitter}, received_at FROM ingest_ledger "
            "ORDER BY log_index")


def _batches_agree(conn: apsw.Connection, commits: list[tuple]) -> bool:
    """Every leaf says the batch whose range holds it: per batch named, as many leaves as
    its range, none outside it (from the index on batch_seq alone, without the rows)."""
    named = conn.execute("SELECT batch_seq, count(*), min(log_index), max(log_index) "
                         "FROM ingest_ledger GROUP BY batch_seq ORDER BY batch_seq").fetchall()
    return named == [(seq, size - first, first, size - 1)
                     for seq, _, first, size, *_ in commits if size > first]


def _times(commits: list[tuple], ends: list[int], start: int, end: int) -> list[str]:
    """The receipt time each leaf of [start, end) must say: its batch's commit time."""
    times: list[str] = []
    for at in range(bisect.bisect_right(ends, start), len(commits)):
        _, committed_at, first_index, tree_size, *_ = commits[at]
        if first_index >= end:
            break
        times += [committed_at] * (min(tree_size, end) - max(first_index, start))
    return times


def _contiguous(conn: apsw.Connection) -> bool:
    """The ledger's indexes are 0, 1, ... with none missing (the primary key: each once)."""
    count, last, first = conn.execute(
        "SELECT count(*), max(log_index), min(log_index) FROM ingest_ledger").fetchall()[0]
    return count == 0 or (first == 0 and last == count - 1)


def _leaves(payloads: Sequence[bytes], submitters: Sequence[str | None]) -> list[bytes]:
    """Every leaf hash of a chunk, one comprehension (the entry of a worker host's message
    wraps its payload with its submitter)."""
    if submitters.count(None) == len(submitters):  # each entry is its payload
        return leaf_hashes(payloads)
    return leaf_hashes([payload if by is None else ledger_entry(payload, by)
                        for payload, by in zip(payloads, submitters, strict=True)])


def _chain_agrees(conn: apsw.Connection, commits: list[tuple]) -> bool:
    """Batches numbered from 1 and contiguous, each starting where the last ended, and the
    hash chain unbroken from the store's identity (or from zeros, for a store whose first
    batch predates issue 12: ``identity_bound`` says so, not a finding of the log)."""
    prev = identity_genesis(_store_id(conn))
    if commits and commits[0][6] == GENESIS_HASH:
        prev = GENESIS_HASH
    size = 0
    for number, (seq, committed_at, first_index, tree_size, root, _frontier, prev_hash,
                 chain, quarantine) in enumerate(commits, 1):
        if (seq != number or first_index != size or tree_size < first_index
                or prev_hash != prev or chain != entry_hash(prev, seq, first_index, tree_size,
                                                            root, committed_at, quarantine)):
            return False
        prev, size = chain, tree_size
    return True


def _batch_agrees(tree: _BulkTree, levels: list[list[bytes]], start: int, batch: tuple,
                  heads: dict[int, Head] | None) -> bool:
    """The stored root and frontier of a batch ending in this chunk, read off its levels."""
    seq, committed_at, _first, size, root, frontier, _prev, chain, _q = batch
    nodes = b"".join(tree.frontier(levels, size - start))
    if nodes != frontier or CompactTree.from_bytes(size, nodes).root() != root:
        return False
    if heads is not None:  # the chain agreed link by link: its recomputation is the stored one
        heads[seq] = Head(seq, size, root, chain, committed_at)
    return True


class _BulkTree:
    """The tree over whole chunks: the compact frontier of the chunks before (perfect
    subtrees of ``_CHUNK`` leaves or more), and each chunk's levels while it is read."""

    def __init__(self) -> None:
        # A compact tree whose leaves are the chunks' roots: merging two equal subtrees is
        # the same node hash whatever their size, so its frontier is the whole tree's.
        self._before = CompactTree()

    @staticmethod
    def levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
        """Level 0 the leaves, each next one the nodes over pairs of the one below."""
        levels = [list(leaves)]
        while len(levels[-1]) > 1:
            below = levels[-1]
            levels.append(level_above(below))
        return levels

    def frontier(self, levels: list[list[bytes]], offset: int) -> list[bytes]:
        """The compact frontier of the tree whose last leaf is ``offset`` into the chunk
        (1 <= offset <= its length)."""
        if offset == _CHUNK:  # the whole chunk: one more perfect subtree, merged
            after = self._before.copy()
            after.append_digest(levels[_CHUNK_BITS][0])
            return list(after.frontier)
        nodes = list(self._before.frontier)
        at = 0
        for bit in range(offset.bit_length() - 1, -1, -1):
            if offset >> bit & 1:
                nodes.append(levels[bit][at >> bit])
                at += 1 << bit
        return nodes

    def close(self, levels: list[list[bytes]]) -> None:
        """A chunk read whole becomes one subtree of the tree before the next."""
        if len(levels[0]) == _CHUNK:
            self._before.append_digest(levels[_CHUNK_BITS][0])


class LogCheck:
    """``check_log`` fed the ledger's rows by its caller, in log order: ``leaf`` for each
    (log_index, payload, leaf_hash, batch_seq, received_at, submitter), then ``finish``.
    An export reads the ledger once for its dump and hands the same rows here
    (``_archive/export.py``), where a second pass cost a third of the check.

    The findings and their order are ``check_log``'s: a batch's own checks, then its
    leaves', then its tree's and chain's, batch after batch; a leaf past the last batch
    ends the check (``leaf`` answers False: feed no more)."""

    def __init__(self, conn: apsw.Connection, heads: dict[int, Head] | None = None) -> None:
        self.findings: list[LogFinding] = []
        self.heads = heads
        quarantined = ("quarantined" if has_column(conn, "commit_log", "quarantined")
                       else "NULL")  # a store opened read-only may predate the column
        self._commits = iter(conn.execute(
            "SELECT batch_seq, committed_at, first_index, tree_size, root, frontier, "
            f"prev_hash, entry_hash, {quarantined} FROM commit_log ORDER BY batch_seq"
        ).fetchall())
        self.tree = CompactTree()
        genesis = identity_genesis(_store_id(conn))
        self._prev = genesis
        self._batch = next(self._commits, None)
        first = self._batch
        if first is not None and first[6] == GENESIS_HASH:
            self._prev = GENESIS_HASH  # the first batch predates issue 12: identity not bound
        elif first is not None and first[0] == 1 and first[6] != genesis:
            self.findings.append(LogFinding(
                "identity", "batch 1 does not start from this store's identity: store_meta's "
                "store_id was changed, or the log comes from another store", batch_seq=1))
            self._prev = first[6]  # check the rest of the chain from where it starts
        self._expected_seq = 1
        self._rechained = self._prev
        self._beyond = False  # a leaf past the last batch was seen: the check is over
        if self._batch is not None:
            self._open(self._batch)

    def leaf(self, index: int, payload: bytes, stored_leaf: bytes, leaf_batch: int,
             received_at: str, by: str | None) -> bool:
        """Check the next ledger row; False once a row lies past the last batch."""
        while self._batch is not None and index >= self._batch[3]:
            self._close(self._batch)
            self._batch = next(self._commits, None)
            if self._batch is not None:
                self._open(self._batch)
        if self._batch is None:
            if not self._beyond:
                self._beyond = True
                self.findings.append(LogFinding(
                    "batch", f"leaf {index} is beyond the last committed tree size "
                    f"{self.tree.size}", log_index=index))
            return False
        findings, tree = self.findings, self.tree
        seq, committed_at = self._batch[0], self._batch[1]
        if index != tree.size:
            findings.append(LogFinding(
                "index_gap", f"leaf {tree.size} is missing (next is {index})",
                log_index=tree.size))
        computed = leaf_hash(payload if by is None else ledger_entry(payload, by))
        if computed != stored_leaf:
            findings.append(LogFinding(
                "leaf", f"leaf {index}: payload{' and submitter' if by else ''} do"
                f"{'' if by else 'es'} not hash to its stored leaf hash",
                log_index=index))
        if leaf_batch != seq:
            findings.append(LogFinding(
                "batch", f"leaf {index} says batch {leaf_batch}, the log says {seq}",
                log_index=index, batch_seq=seq))
        elif received_at != committed_at:  # the writer gives both the batch's time
            findings.append(LogFinding(
                "batch", f"leaf {index} says it was received at {received_at!r}, its "
                f"batch {seq} was committed at {committed_at!r}", log_index=index,
                batch_seq=seq))
        tree.append_digest(computed)
        return True

    def finish(self) -> tuple[int, bytes, list[LogFinding]]:
        """Check the batches no leaf reached; (size, root, findings)."""
        while self._batch is not None:
            self._close(self._batch)
            self._batch = next(self._commits, None)
            if self._batch is not None:
                self._open(self._batch)
        return self.tree.size, self.tree.root(), self.findings

    def _open(self, batch: tuple) -> None:
        """A batch's own checks, before its leaves."""
        seq, first_index = batch[0], batch[2]
        if seq != self._expected_seq:
            self.findings.append(LogFinding("batch", f"commit log jumps to batch {seq}",
                                            batch_seq=seq))
        self._expected_seq = seq + 1
        if first_index != self.tree.size:
            self.findings.append(LogFinding(
                "batch", f"batch {seq} starts at {first_index}, the log was at "
                f"{self.tree.size}", batch_seq=seq))

    def _close(self, batch: tuple) -> None:
        """Its tree's and its chain's checks, after its leaves."""
        seq, committed_at, first_index, size, root, frontier, prev_hash, chain, quarantine \
            = batch
        tree, findings = self.tree, self.findings
        if tree.size != size or tree.root() != root:
            findings.append(LogFinding(
                "root", f"batch {seq}: recomputed tree (size {tree.size}) does not match the "
                f"stored root of size {size}", batch_seq=seq))
        if frontier != tree.to_bytes():
            findings.append(LogFinding("frontier", f"batch {seq}: stored frontier differs",
                                       batch_seq=seq))
        if prev_hash != self._prev or chain != entry_hash(self._prev, seq, first_index, size,
                                                          root, committed_at, quarantine):
            findings.append(LogFinding("chain", f"batch {seq}: hash chain broken",
                                       batch_seq=seq))
        self._prev = chain
        self._rechained = entry_hash(self._rechained, seq, first_index, tree.size,
                                     tree.root(), committed_at, quarantine)
        if self.heads is not None:
            self.heads[seq] = Head(seq, tree.size, tree.root(), self._rechained, committed_at)


# How far a batch's commit time may lie before the previous batch's: a host clock stepped
# back (an NTP correction, a resumed virtual machine) moves by seconds; an edit that
# backdates a batch, by as much as it needs.
TIME_TOLERANCE = 300.0


def check_times(conn: apsw.Connection, tolerance: float = TIME_TOLERANCE) -> list[LogFinding]:
    """Every batch's commit time read and compared with the latest before it: one that
    goes back more than ``tolerance`` seconds, or does not parse, is a ``time`` finding.

    The chain hash covers these times but anyone who can write the database can
    recompute it; this is what makes a backdated batch visible without a checkpoint (one
    signed before the edit binds every time exactly)."""
    findings: list[LogFinding] = []
    latest: tuple[int, dt.datetime] | None = None
    for seq, committed_at in conn.execute(
            "SELECT batch_seq, committed_at FROM commit_log ORDER BY batch_seq"):
        try:
            moment = dt.datetime.fromisoformat(committed_at)
        except (TypeError, ValueError):
            findings.append(LogFinding("time", f"batch {seq}: commit time {committed_at!r} is "
                                       "not a time", batch_seq=seq))
            continue
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        if latest is not None and (latest[1] - moment).total_seconds() > tolerance:
            findings.append(LogFinding(
                "time", f"batch {seq} was committed at {committed_at}, "
                f"{_span((latest[1] - moment).total_seconds())} before batch {latest[0]} (at "
                f"{latest[1].isoformat()}): commit times go back more than the "
                f"{tolerance:g} s a clock step explains", batch_seq=seq))
        if latest is None or moment > latest[1]:
            latest = (seq, moment)
    return findings


def _span(seconds: float) -> str:
    for unit, size in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"
