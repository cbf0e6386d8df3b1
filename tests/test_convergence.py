"""Any interleaving of deliveries, duplicates, reorderings and redeliveries converges.

A Hypothesis state machine delivers messages from a fixed pool in any order, any number of
times, alone or in concurrent groups that share a batch, and tries conflicting rewrites and
messages the writer rejects, again and again. After every step: the ledger holds each
delivered message once, the projection holds the highest delivered sequence per (run,
url), conflicts never changed anything, and the quarantine holds one record per refused
content and reason, counting its deliveries, each as the commit log recorded it. At the
end, a second store fed only the deduplicated sequence holds exactly the same evidence.
"""

from __future__ import annotations

import collections
import shutil
import tempfile
from pathlib import Path

import anyio
import msgspec
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from evidence import Store, Writer, WriterLimits, canonical_encode, check_log, payload_hash
from evidence._store.quarantine import check_records

from .conftest import Factory

URLS = ["http://example.com/a", "http://EXAMPLE.com:80/a#frag", "http://example.com/b",
        "http://example.com/c?y=2&x=1"]

# Columns that depend only on the deduplicated sequence, not on timing or batching.
COMPARED = {
    "url_identity": "SELECT * FROM url_identity ORDER BY url_id",
    "artifact": "SELECT * FROM artifact ORDER BY artifact_id",
    "fetch_attempt": "SELECT * FROM fetch_attempt ORDER BY attempt_seq",
    "discovery_edge": "SELECT * FROM discovery_edge ORDER BY edge_id",
    "url_current": "SELECT * FROM url_current ORDER BY run_id, url_id",
    "ledger": "SELECT log_index, message_id, kind, payload_hash, leaf_hash, payload "
              "FROM ingest_ledger ORDER BY log_index",
}


def snapshot(store: Store) -> dict[str, list[tuple]]:
    return {name: store.connection.execute(sql).fetchall() for name, sql in COMPARED.items()}


class Deliveries(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="converge-"))
        self.store = Store.create(self.dir / "a", sync="normal")
        self.make = Factory(self.store)
        body = self.make.body()
        setup = [self.make.session(), self.make.run()]
        # The pool: attempts of a few URLs at several sequences, and a discovery for some
        # of them. URLS[0] and URLS[1] are the same fetch key, so their sequences differ.
        self.pool = [self.make.attempt(u, sequence=s + 4 * (i == 1), body=body)
                     for i, u in enumerate(URLS) for s in (0, 1, 2, 3)]
        self.pool += [self.make.discovery(a, body, ["http://example.com/x", a.url])
                      for a in self.pool[::3]]
        self.setup = setup
        self._submit(setup)
        self.delivered: list[str] = [m.message_id for m in setup]  # first-delivery order
        self.seen: set[str] = set(self.delivered)
        # (payload hash, status, reason) -> deliveries refused: what the quarantine counts
        self.refused: collections.Counter[tuple[str, str, str]] = collections.Counter()
        # Messages the writer rejects: attempts of a run that was never started.
        self.invalid = [self.make.attempt(u, run_id="no-such-run", body=body) for u in URLS]

    def teardown(self) -> None:
        try:
            self._check_against_dedup_sequence()
        finally:
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _submit(self, messages: list, limits: WriterLimits | None = None) -> list:
        async def go() -> list:
            acks: list = [None] * len(messages)
            async with Writer(self.store, limits=limits) as w, anyio.create_task_group() as tg:
                async def one(i: int) -> None:
                    acks[i] = await w.submit(messages[i])
                for i in range(len(messages)):
                    tg.start_soon(one, i)
            return acks
        return anyio.run(go)

    def _deliverable(self, message) -> bool:
        # A discovery needs its source attempt recorded first (else it is rejected).
        source = getattr(message, "source_attempt_id", None)
        return source is None or any(
            m.attempt_id == source and m.message_id in self.seen
            for m in self.pool if hasattr(m, "attempt_id"))

    @rule(picks=st.lists(st.integers(0, 100), min_size=1, max_size=8),
          linger=st.booleans())
    def deliver_group(self, picks: list[int], linger: bool) -> None:
        group = [self.pool[p % len(self.pool)] for p in picks]
        group = [m for m in group if self._deliverable(m)]
        if not group:
            return
        limits = WriterLimits(max_batch_delay=0.02 if linger else 0.0)
        acks = self._submit(group, limits)
        first_time = {m.message_id for m in group} - self.seen
        for m, ack in zip(group, acks, strict=True):
            assert ack.status in ("committed", "duplicate"), ack
            if ack.status == "committed":
                assert m.message_id in first_time
                first_time.discard(m.message_id)  # committed once, then duplicates
                self.delivered.append(m.message_id)
        assert not first_time, "every new message is committed exactly once"
        self.seen.update(m.message_id for m in group)

    @precondition(lambda self: len(self.seen) > len(self.setup))
    @rule(pick=st.integers(0, 100))
    def deliver_conflicting_rewrite(self, pick: int) -> None:
        delivered = [m for m in self.pool if m.message_id in self.seen]
        original = delivered[pick % len(delivered)]
        before = snapshot(self.store)
        if hasattr(original, "elapsed_ms"):
            forged = msgspec.structs.replace(original, elapsed_ms=original.elapsed_ms + 1)
        else:
            forged = msgspec.structs.replace(original, truncated=not original.truncated)
        [ack] = self._submit([forged])
        assert ack.status == "conflict"
        assert snapshot(self.store) == before, "a conflict changes no evidence"
        self._refused(forged, ack)

    @rule(picks=st.lists(st.integers(0, 100), min_size=1, max_size=4))
    def deliver_rejected(self, picks: list[int]) -> None:
        group = [self.invalid[p % len(self.invalid)] for p in picks]
        before = snapshot(self.store)
        for m, ack in zip(group, self._submit(group), strict=True):
            assert ack.status == "rejected", ack
            self._refused(m, ack)
        assert snapshot(self.store) == before, "a rejection changes no evidence"

    def _refused(self, message, ack) -> None:
        self.refused[(payload_hash(canonical_encode(message)), ack.status, ack.reason)] += 1

    @invariant()
    def quarantine_counts_each_refused_content_once(self) -> None:
        rows = self.store.connection.execute(
            "SELECT payload_hash, reason_code, reason, deliveries FROM quarantine").fetchall()
        assert {(h, code, reason): n for h, code, reason, n in rows} == dict(self.refused)
        problems: list[tuple] = []
        check_records(self.store.connection, lambda *a, **k: problems.append((a, k)))
        assert problems == [], "every record is as the commit log recorded it"

    @invariant()
    def ledger_holds_each_delivered_message_once(self) -> None:
        ids = [r[0] for r in self.store.connection.execute(
            "SELECT message_id FROM ingest_ledger ORDER BY log_index")]
        assert ids == self.delivered

    @invariant()
    def projection_holds_the_highest_sequence(self) -> None:
        from evidence import normalize_url

        expected: dict[str, int] = {}
        for m in self.pool:
            if m.message_id in self.seen and hasattr(m, "sequence"):
                key = normalize_url(m.url)
                expected[key] = max(expected.get(key, -1), m.sequence)
        actual = dict(self.store.connection.execute(
            "SELECT u.fetch_key, c.sequence FROM url_current c JOIN url_identity u "
            "USING (url_id)"))
        assert actual == expected

    def _check_against_dedup_sequence(self) -> None:
        by_id = {m.message_id: m for m in [*self.setup, *self.pool]}
        with Store.create(self.dir / "b", sync="normal") as fresh:
            shutil.copytree(self.store.artifacts.root, fresh.artifacts.root,
                            dirs_exist_ok=True)

            async def go() -> None:
                async with Writer(fresh) as w:
                    for mid in self.delivered:
                        assert (await w.submit(by_id[mid])).status == "committed"
            anyio.run(go)
            assert snapshot(fresh) == snapshot(self.store)
            size, root, findings = check_log(self.store.connection)
            assert findings == []
            assert (size, root) == check_log(fresh.connection)[:2]


Deliveries.TestCase.settings = settings(max_examples=25, stateful_step_count=15,
                                        deadline=None)
test_any_interleaving_converges = Deliveries.TestCase
