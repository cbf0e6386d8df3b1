"""The writer's two ways of applying a batch commit the same rows.

A batch is first applied without a savepoint per message: its URLs interned up front, its
ledger rows one by one, its edges and url_current upserts held to the end and written many
rows per statement. Any failure or redelivery sends the batch to the isolated path (a
savepoint per message). These tests pin that both paths leave identical tables, ids
included, and that what the fast path does up front never outlives a message it gave up.
"""

from __future__ import annotations

from pathlib import Path

import apsw
import msgspec
import pytest

from evidence import (
    FrontierUpdate,
    QueuedUrl,
    Render,
    RuleEvaluated,
    Store,
    Writer,
    WriterLimits,
)
from evidence._model.messages import Discovery, FetchAttempt
from evidence._model.refs import ArtifactRef
from evidence._store.sqlite import SQLITE
from evidence._write.apply import Applier, artifact_refs
from evidence._write.apply_rows import RowInsert

from .conftest import Factory, asubmit

pytestmark = pytest.mark.anyio

EVIDENCE = {
    "url_identity": "SELECT url_id, normalizer_version, fetch_key FROM url_identity",
    "fetch_attempt": "SELECT attempt_seq, attempt_id, url_id, sequence, log_index "
                     "FROM fetch_attempt",
    "discovery_edge": "SELECT edge_id, source_attempt_seq, position, observed_ref, "
                      "target_url_id, log_index FROM discovery_edge",
    "url_current": "SELECT run_id, url_id, sequence, attempt_seq FROM url_current",
    "rule_evaluation": "SELECT evaluation_id, url_id, attempt_seq, log_index "
                       "FROM rule_evaluation",
    "ledger": "SELECT log_index, message_id, batch_seq FROM ingest_ledger",
}


def tables(store: Store) -> dict[str, list[tuple]]:
    return {name: sorted(store.connection.execute(sql).fetchall())
            for name, sql in EVIDENCE.items()}


def batch_messages(make: Factory) -> tuple[list, list]:
    """Two batches exercising the grouped writes: a discovery wider than a multi-row
    statement (with a repeated reference and a repeated URL), attempts of one URL out of
    sequence order (the projection guard inside one statement), and back-links to URLs the
    store knows but a new writer's cache does not."""
    body = make.body(b"<html>batches</html>")
    first = [make.attempt(f"http://example.com/p{i}", body=body) for i in range(3)]
    hub = make.attempt("http://example.com/hub", body=body)
    targets = [f"http://example.com/t{i}" for i in range(70)]
    targets += ["http://example.com/p1", "http://example.com/t5", "http://example.com/p0"]
    links = make.discovery(hub, body, targets)
    links.refs.append(links.refs[0])  # the same node twice: one edge
    late = [make.attempt("http://example.com/t7", body=body, sequence=s) for s in (4, 9, 2)]
    verdict = RuleEvaluated(  # references an attempt of its own batch by a foreign key
        message_id=make.id("m"), run_id="r1", url="http://example.com/t7", rule_id="title",
        rule_version="1", input_hash="0" * 64, verdict="pass", evaluated_at=make.now,
        attempt_id=late[1].attempt_id)
    after = make.attempt("http://example.com/t8", body=body)
    second = [*late, verdict, after,
              make.discovery(late[0], body, ["http://example.com/p2", "http://example.com/new"])]
    return [*first, hub, links], second


async def write(store: Store, batches: list[list], *, isolated: bool) -> list[str]:
    """Commit each batch on one path only (the isolated path is spied on, so a fast-path
    batch that fell back would fail the test instead of passing it vacuously)."""
    statuses = []
    async with Writer(store, limits=WriterLimits(max_batch_messages=1000)) as writer:
        isolated_batches = []
        transactions = writer._transactions
        apply_isolated = transactions._apply_isolated

        def spy(applier, batch, *args):  # type: ignore[no-untyped-def]
            isolated_batches.append(len(batch))
            return apply_isolated(applier, batch, *args)

        transactions._apply_isolated = spy  # type: ignore[method-assign]
        for batch in batches:
            transactions._optimistic = not isolated
            statuses += [a.status for a in await writer.submit_group(batch)]
        assert len(isolated_batches) == (len(batches) if isolated else 0)
    return statuses


async def test_fast_and_isolated_paths_commit_identical_rows(store: Store, make: Factory,
                                                             tmp_path: Path) -> None:
    setup = [make.session(), make.run()]
    first, second = batch_messages(make)
    with Store.create(tmp_path / "isolated") as other:
        other.artifacts.put("body", b"<html>batches</html>")
        await asubmit(store, setup)
        await asubmit(other, setup)
        fast = await write(store, [first], isolated=False)
        fast += await write(store, [second], isolated=False)  # a new writer: cold caches
        slow = await write(other, [first], isolated=True)
        slow += await write(other, [second], isolated=True)
        assert fast == slow == ["committed"] * (len(first) + len(second))
        assert tables(store) == tables(other)
    rows = tables(store)
    assert len(rows["discovery_edge"]) == 73 + 2  # the repeated node wrote one edge
    current = store.connection.execute(
        "SELECT c.sequence FROM url_current c JOIN url_identity u USING (url_id) "
        "WHERE u.fetch_key = 'http://example.com/t7'").fetchall()
    assert current == [(9,)]


PAGES = {
    "artifact": "SELECT artifact_id, namespace, digest, size FROM artifact",
    "fetch_attempt": "SELECT attempt_seq, attempt_id, request_headers_id, response_headers_id, "
                     "body_id, content_id FROM fetch_attempt",
    "discovery_edge": "SELECT edge_id, source_artifact_id, position FROM discovery_edge",
    "frontier": "SELECT url_id, url, state, depth, via, reason, updated_log_index "
                "FROM frontier",
}


def page_batches(make: Factory, store: Store) -> list[list]:
    """Batches as a crawl sends them: attempts naming new payloads in every namespace (a
    payload named twice in one batch, one the store recorded in an earlier batch that a new
    writer's cache does not hold), and frontier updates queueing many URLs at once (one URL
    twice in an update: found too deep, then at an allowed depth)."""
    puts = store.artifacts.put
    known = puts("body", b"<html>known</html>")

    def page(i: int, body: ArtifactRef) -> FetchAttempt:
        return make.attempt(f"http://example.com/page{i}", body=body,
                            request_headers=puts("headers", f"GET /page{i}".encode()),
                            response_headers=puts("headers", f"HTTP/1.1 200 {i}".encode()),
                            content=puts("content", f"content {i}".encode()),
                            capture="wire", content_coding="gzip")

    def update(queued: list[QueuedUrl]) -> FrontierUpdate:
        return FrontierUpdate(message_id=make.id("m"), session_id="s1", run_id="r1",
                              at=make.now, queued=queued)

    first = [page(0, known), update([QueuedUrl(url="http://example.com/seed", depth=0)])]
    shared = puts("body", b"<html>shared</html>")
    pages = [page(i, shared if i % 2 else puts("body", f"<p>{i}</p>".encode()))
             for i in range(1, 6)]
    queued = [QueuedUrl(url=f"http://example.com/q{i}", depth=2) for i in range(40)]
    queued.insert(3, QueuedUrl(url="http://example.com/deep", depth=5, skip="depth 5 > 4"))
    queued.insert(20, QueuedUrl(url="http://example.com/deep", depth=1))
    body = pages[0].body
    assert body is not None
    second = [*pages, make.discovery(pages[0], body, ["http://example.com/q1"]),
              update(queued), page(6, known)]
    return [first, second]


async def test_fast_and_isolated_paths_intern_payloads_and_queue_urls_alike(
        store: Store, make: Factory, tmp_path: Path) -> None:
    # The fast path interns a batch's payloads at once (ids chosen as one at a time would
    # choose them) and queues an update's URLs many per statement; the isolated path does
    # both one message and one row at a time. Both must leave the same rows.
    setup = [make.session(), make.run()]
    with Store.create(tmp_path / "isolated") as other:
        batches = page_batches(make, store)
        for name, data in [("body", b"<html>known</html>"), ("body", b"<html>shared</html>")]:
            other.artifacts.put(name, data)
        for batch in batches:
            for message in batch:
                for ref in artifact_refs(message):
                    other.artifacts.put(ref.namespace, store.artifacts.read(ref))
        await asubmit(store, setup)
        await asubmit(other, setup)
        fast, slow = [], []
        for batch in batches:  # a new writer for each: cold caches
            fast += await write(store, [batch], isolated=False)
            slow += await write(other, [batch], isolated=True)
        assert fast == slow == ["committed"] * sum(map(len, batches))
        mine = {name: sorted(store.connection.execute(sql).fetchall())
                for name, sql in PAGES.items()}
        theirs = {name: sorted(other.connection.execute(sql).fetchall())
                  for name, sql in PAGES.items()}
        assert mine == theirs
    assert len(mine["artifact"]) == 2 + 3 * 7 + 2  # known, shared; 3 per page; 2 bodies
    deep = store.connection.execute(
        "SELECT state, depth FROM frontier WHERE url = 'http://example.com/deep'").fetchall()
    assert deep == [("queued", 1)]  # the second mention re-queued it, as one at a time does
    assert store.connection.execute("PRAGMA foreign_key_check").fetchall() == []


async def test_artifact_refs_names_what_each_handler_interns_in_its_order(
        store: Store, make: Factory, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fast path interns a batch's payloads up front from artifact_refs; its ids are the
    # isolated path's only if artifact_refs lists, per message, exactly the payloads the
    # message's handler interns, in the handler's order.
    puts = store.artifacts.put
    page = make.attempt("http://example.com/", capture="wire", content_coding="gzip",
                        request_headers=puts("headers", b"GET / HTTP/1.1\r\n\r\n"),
                        response_headers=puts("headers", b"HTTP/1.1 200 OK\r\n\r\n"),
                        body=puts("body", b"gzipped"), content=puts("content", b"<p>x"),
                        surplus=puts("body", b"surplus"))
    render = Render(message_id=make.id("m"), render_id="r-1", run_id="r1",
                    source_attempt_id=page.attempt_id, url=page.url, started_at=make.now,
                    elapsed_ms=10.0, outcome="rendered", dom=puts("dom", b"<html></html>"),
                    screenshot=puts("screenshot", b"png"), mhtml=puts("mhtml", b"mhtml"))
    assert page.content is not None and render.dom is not None
    links = make.discovery(page, page.content, ["http://example.com/a"])
    dom_links = msgspec.structs.replace(make.discovery(page, render.dom, ["http://b.example/"]),
                                        render_id="r-1")
    interned: list[tuple[int, ArtifactRef]] = []
    artifact_id = Applier.artifact_id

    def spy(self: Applier, ref: ArtifactRef, what: object) -> int:
        interned.append((self.log_index, ref))
        return artifact_id(self, ref, what)

    monkeypatch.setattr(Applier, "artifact_id", spy)
    messages = [make.session(), make.run(), page, render, links, dom_links]
    acks = await asubmit(store, messages)  # either path: the handlers call artifact_id
    assert [a.status for a in acks] == ["committed"] * len(messages)
    for message, ack in zip(messages, acks, strict=True):
        mine = [ref for index, ref in interned if index == ack.log_index]
        assert mine == artifact_refs(message), type(message).__name__
    assert {type(m) for m in messages if artifact_refs(m)} == {FetchAttempt, Render, Discovery}


async def test_a_conflicting_redelivery_leaves_no_url_behind(store: Store,
                                                             make: Factory) -> None:
    # The fast path interns a batch's URLs before it learns from the ledger that a message
    # is a redelivery; it must then give the batch to the isolated path, where the
    # conflicting message is quarantined and interns nothing.
    body = make.body()
    attempt = make.attempt("http://example.com/a", body=body)
    links = make.discovery(attempt, body, ["http://example.com/b"])
    await asubmit(store, [make.session(), make.run(), attempt, links])
    forged = msgspec.structs.replace(
        make.discovery(attempt, body, ["http://example.com/forged"]),
        message_id=links.message_id)
    fresh = make.attempt("http://example.com/c", body=body)
    async with Writer(store) as writer:
        acks = await writer.submit_group([fresh, forged])
    assert [a.status for a in acks] == ["committed", "conflict"]
    keys = {k for (k,) in store.connection.execute("SELECT fetch_key FROM url_identity")}
    assert keys == {"http://example.com/a", "http://example.com/b", "http://example.com/c"}
    ids = [i for (i,) in store.connection.execute(
        "SELECT url_id FROM url_identity ORDER BY url_id")]
    assert ids == list(range(ids[0], ids[0] + 3)), "no id was spent on the forged URL"


async def test_a_poison_message_after_grouped_writes_fails_alone(store: Store,
                                                                 make: Factory) -> None:
    # The fast path's ROLLBACK and new BEGIN: everything it wrote is undone, then the
    # isolated path commits the rest.
    body = make.body()
    await asubmit(store, [make.session(), make.run()])
    good = make.attempt("http://example.com/good", body=body)
    links = make.discovery(good, body, [f"http://example.com/l{i}" for i in range(40)])
    poison = make.attempt("http://example.com/poison", run_id="no-such-run", body=body)
    async with Writer(store) as writer:
        acks = await writer.submit_group([good, links, poison])
        again = await writer.submit_group([make.attempt("http://example.com/l3", body=body)])
    assert [a.status for a in acks] == ["committed", "committed", "rejected"]
    assert again[0].status == "committed"
    counts = store.connection.execute(
        "SELECT (SELECT count(*) FROM discovery_edge), (SELECT count(*) FROM url_identity), "
        "(SELECT count(*) FROM quarantine)").fetchall()
    assert counts == [(40, 41, 1)]
    assert store.connection.execute("PRAGMA foreign_key_check").fetchall() == []


@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 9, 15, 31, 32, 33, 47, 63, 65, 100])
def test_row_insert_writes_rows_in_order_as_one_by_one_would(count: int) -> None:
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT UNIQUE, v INTEGER)")
    insert = RowInsert("INSERT INTO t (k, v)", 2,
                       "ON CONFLICT (k) DO UPDATE SET v = excluded.v WHERE excluded.v > t.v",
                       dialect=SQLITE)
    rows = [(f"k{i % 40}", i % 7) for i in range(count)]
    insert.write(conn.cursor(), rows)
    expected = apsw.Connection(":memory:")
    expected.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT UNIQUE, v INTEGER)")
    for row in rows:
        expected.execute(insert.single, row)
    query = "SELECT id, k, v FROM t ORDER BY id"
    assert conn.execute(query).fetchall() == expected.execute(query).fetchall()



async def test_an_attempt_id_recorded_by_another_message_is_a_conflict_alone(
        store: Store, make: Factory) -> None:
    # The fast path holds a batch's attempts and writes them at its end; an attempt id the
    # store already has is found only then, and the isolated path must still single it out.
    body = make.body()
    known = make.attempt("http://example.com/known", body=body)
    await asubmit(store, [make.session(), make.run(), known])
    again = msgspec.structs.replace(known, message_id=make.id("m"), sequence=1)
    batch = [make.attempt("http://example.com/x", body=body), again,
             make.attempt("http://example.com/y", body=body)]
    async with Writer(store) as writer:
        acks = await writer.submit_group(batch)
    assert [a.status for a in acks] == ["committed", "conflict", "committed"]
    assert "already recorded by another message" in acks[1].reason
    seqs = [s for (s,) in store.connection.execute(
        "SELECT attempt_seq FROM fetch_attempt ORDER BY attempt_seq")]
    assert seqs == [1, 2, 3]
