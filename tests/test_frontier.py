"""Frontier transitions through the writer, scope rules, and page results as one group."""

from __future__ import annotations

from pathlib import Path

import pytest

from evidence import (
    CrawlConfig,
    FrontierUpdate,
    QueuedUrl,
    SettledUrl,
    Store,
    Writer,
    WriterLimits,
)
from evidence._crawl.frontier import Scope, counts, in_flight, queued_after
from evidence._write.limits import WriterHooks

from .conftest import Factory, asubmit

pytestmark = pytest.mark.anyio


def update(make: Factory, **changes: list) -> FrontierUpdate:
    return FrontierUpdate(message_id=make.id("m"), session_id="s1", run_id="r1",
                          at=make.now, **changes)


def states(store: Store) -> dict[str, tuple[str, int, str]]:
    return {u: (s, a, r) for u, s, a, r in store.connection.execute(
        "SELECT url, state, attempts, reason FROM frontier")}


async def test_queue_claim_settle_moves_each_url_through_its_states(
        store: Store, make: Factory) -> None:
    a, b = "http://e.com/a", "http://e.com/b"
    acks = await asubmit(store, [
        make.session(), make.run(),
        update(make, queued=[QueuedUrl(url=a, depth=0, via="seed"),
                             QueuedUrl(url=b, depth=1, skip="scope: host x")]),
        update(make, claimed=[a]),
    ])
    assert {x.status for x in acks} == {"committed"}
    assert states(store) == {a: ("in_flight", 1, ""), b: ("skipped", 0, "scope: host x")}
    assert in_flight(store.connection, "s1") == [(a, 1)]
    [ack] = await asubmit(store, [update(make, settled=[SettledUrl(url=a, state="done",
                                                                   reason="HTTP 200")])])
    assert ack.status == "committed"
    assert states(store)[a] == ("done", 1, "HTTP 200")
    c = counts(store.connection, "s1")
    assert (c.done, c.skipped, c.queued, c.in_flight) == (1, 1, 0, 0)


async def test_a_url_already_known_keeps_its_state_when_queued_again(
        store: Store, make: Factory) -> None:
    a = "http://e.com/a"
    await asubmit(store, [make.session(), make.run(),
                          update(make, queued=[QueuedUrl(url=a, depth=0)]),
                          update(make, claimed=[a]),
                          update(make, settled=[SettledUrl(url=a, state="done")])])
    await asubmit(store, [update(make, queued=[QueuedUrl(url="http://E.com:80/a#x",
                                                         depth=3)])])
    assert states(store) == {a: ("done", 1, "")}


async def test_a_url_skipped_for_depth_is_queued_when_found_shallower(
        store: Store, make: Factory) -> None:
    a = "http://e.com/deep"
    await asubmit(store, [make.session(), make.run(), update(make, queued=[
        QueuedUrl(url=a, depth=5, skip="depth: 5 is beyond max depth 2")])])
    assert states(store)[a][0] == "skipped"
    await asubmit(store, [update(make, queued=[QueuedUrl(url=a, depth=2)])])
    assert states(store)[a] == ("queued", 0, "")
    assert [r.depth for r in queued_after(store.connection, "s1", 0, 10)] == [2]


async def test_claiming_a_url_that_is_not_queued_rejects_the_whole_claim(
        store: Store, make: Factory) -> None:
    a, b = "http://e.com/a", "http://e.com/b"
    await asubmit(store, [make.session(), make.run(),
                          update(make, queued=[QueuedUrl(url=a, depth=0)])])
    [ack] = await asubmit(store, [update(make, claimed=[a, b])])
    assert ack.status == "conflict" and "is not queued" in ack.reason
    assert states(store)[a] == ("queued", 0, ""), "nothing of the claim was applied"


async def test_settling_an_unknown_url_is_rejected(store: Store, make: Factory) -> None:
    await asubmit(store, [make.session(), make.run()])
    [ack] = await asubmit(store, [update(make, settled=[SettledUrl(url="http://e.com/x",
                                                                   state="done")])])
    assert ack.status == "rejected" and "is not in the frontier" in ack.reason


async def test_a_page_result_group_commits_in_one_transaction(
        store: Store, make: Factory) -> None:
    a = "http://e.com/a"
    await asubmit(store, [make.session(), make.run(),
                          update(make, queued=[QueuedUrl(url=a, depth=0)]),
                          update(make, claimed=[a])])
    body = make.body()
    attempt = make.attempt(a, body=body)
    group = [attempt, make.discovery(attempt, body, ["http://e.com/b"]),
             update(make, queued=[QueuedUrl(url="http://e.com/b", depth=1)],
                    settled=[SettledUrl(url=a, state="done")])]
    batches: list[int] = []
    limits = WriterLimits(max_batch_messages=1)  # a group is never split, even so
    hooks = WriterHooks(before_commit=batches.append)
    async with Writer(store, limits=limits, hooks=hooks) as w:
        acks = await w.submit_group(group)
    assert [x.status for x in acks] == ["committed"] * 3
    assert len(batches) == 1 and {x.batch_seq for x in acks} == {batches[0]}


@pytest.mark.parametrize(("scope", "url", "depth", "reason"), [
    ("host", "http://other.com/", 1, "scope: host other.com is not a seed host"),
    ("host", "http://e.com/x", 1, None),
    ("domain", "http://www.e.com/x", 1, None),
    ("domain", "http://e.org/x", 1, "scope: domain of e.org is not a seed domain"),
    ("prefix", "http://e.com/docs/a", 1, None),
    ("prefix", "http://e.com/blog", 1, "scope: not under a seed prefix"),
    ("host", "http://e.com/docs/a", 3, "depth: 3 is beyond max depth 2"),
])
def test_scope_names_the_rule_that_excludes_a_url(scope: str, url: str, depth: int,
                                                  reason: str | None) -> None:
    config = CrawlConfig(seeds=["http://e.com/docs/"], scope=scope, max_depth=2)
    assert Scope(config).reason_to_skip(url, depth) == reason


def test_include_and_exclude_patterns_are_named() -> None:
    config = CrawlConfig(seeds=["http://e.com/"], include=[r"/docs/"], exclude=[r"\.pdf$"])
    scope = Scope(config)
    assert scope.reason_to_skip("http://e.com/docs/a.pdf", 1) == \
        "scope: exclude pattern '\\\\.pdf$'"
    assert scope.reason_to_skip("http://e.com/blog", 1) == "scope: matches no include pattern"
    assert scope.reason_to_skip("http://e.com/docs/a", 1) is None


def test_config_differences_name_the_keys(tmp_path: Path) -> None:
    a = CrawlConfig(seeds=["http://e.com/"])
    b = CrawlConfig(seeds=["http://e.com/"], max_depth=3, exclude=["x"])
    assert a.differences(b.as_record()) == ["exclude", "max_depth"]
    assert a.differences(a.as_record()) == []


async def test_a_page_worker_queues_a_url_once_unless_a_shallower_find_could_queue_it(
        store: Store, make: Factory) -> None:
    # Queuing a URL the frontier holds changes nothing, so once one is committed queued
    # (or skipped for a reason no depth changes) a worker leaves it out of the updates
    # that follow; its edges are still every page's record. A URL skipped for its depth
    # is queued when found shallower, and nothing is left out before it has committed.
    from evidence._crawl.pages import PageWorker
    from evidence._model.messages import ObservedRef

    config = CrawlConfig(seeds=["http://e.com/"], max_depth=2)
    await asubmit(store, [make.session(), make.run()])

    def refs(*urls: str) -> list[ObservedRef]:
        return [ObservedRef(observed=u, url=u, position=i) for i, u in enumerate(urls)]

    def queued(found: list[QueuedUrl]) -> list[tuple[str, int, bool]]:
        return [(q.url.rsplit("/", 1)[1], q.depth, q.skip is None) for q in found]

    a, b, c, d = (f"http://e.com/{name}" for name in "abcd")
    other = "http://other.org/x"
    async with Writer(store) as writer:
        worker = PageWorker(config=config, session_id="s1", run_id="r1",
                            artifacts=store.artifacts, client=None,  # type: ignore[arg-type]
                            submit=writer.submit_group)
        first = worker.follow(refs(a, b, other), 0, "a-1")
        assert queued(first) == [("a", 1, True), ("b", 1, True), ("x", 1, False)]
        assert queued(worker.follow(refs(a, c), 0, "a-2")) == [("a", 1, True), ("c", 1, True)]
        await worker.commit([worker.update(queued=first)])
        deep = worker.follow(refs(a, other, b, d), 2, "a-3")
        assert queued(deep) == [("d", 3, False)]  # the rest committed for good
        await worker.commit([worker.update(queued=deep)])
        shallow = worker.follow(refs(d, a, c), 0, "a-4")
        assert queued(shallow) == [("d", 1, True), ("c", 1, True)]
        await worker.commit([worker.update(queued=shallow)])
        assert worker.follow(refs(a, b, c, d, other), 0, "a-5") == []
    rows = dict(store.connection.execute("SELECT url, depth FROM frontier "
                                         "WHERE state = 'queued'"))
    assert rows == {a: 1, b: 1, c: 1, d: 1}
    assert states(store)[other][0] == "skipped"
