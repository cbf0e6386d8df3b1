"""The frontier's reads stay index range scans, whatever the frontier's size.

docs/scale.md ("A billion pages") and tools/bench_frontier.py rest on this: the scheduler's
refill (``queued_after``) and a resumed run's read of what was in flight (``in_flight``)
cost the rows they return, not the frontier's size, because each is answered by the index
``frontier_by_state (session_id, state, frontier_id)`` with all its columns bound and in its
order (no sort of the queued rows before the LIMIT, no scan of the table). Checked on the
query plans of both backends, of the SQL the functions really run; and the check itself is
shown to refuse a query that would scan or sort.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from evidence import FrontierUpdate, QueuedUrl, SettledUrl, Store
from evidence._crawl import frontier

from .conftest import Factory, submit_all


class Recorder:
    """A real read connection that remembers the statements run through it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements: list[tuple[str, tuple]] = []

    def execute(self, sql: str, binding: tuple = ()) -> Any:
        self.statements.append((sql, binding))
        return self.conn.execute(sql, binding)


def frontier_reads(reader: Any) -> list[tuple[str, tuple]]:
    """The SQL (and bindings) of the refill and of the resume's in-flight read. The refill
    asks for a small part of the queued rows, as the scheduler's 1,000 are of millions."""
    recorder = Recorder(reader)
    frontier.queued_after(recorder, "s1", 0, 10)
    frontier.in_flight(recorder, "s1")
    return recorder.statements


def sqlite_plan(reader: Any, sql: str, binding: tuple) -> str:
    return "\n".join(row[-1] for row in reader.execute("EXPLAIN QUERY PLAN " + sql, binding))


def sqlite_problem(plan: str) -> str | None:
    """Why this SQLite plan would not scale with the frontier (None: it does)."""
    if "TEMP B-TREE" in plan:
        return "it sorts the rows it selects"
    if "SCAN f" in plan or "SCAN frontier" in plan:
        return "it scans the frontier"
    if ("USING INDEX frontier_by_state (session_id=? AND state=?" not in plan
            and "USING COVERING INDEX frontier_by_state (session_id=? AND state=?" not in plan):
        return "it does not search frontier_by_state by session and state"
    return None


def pg_problem(plan: str) -> str | None:
    """Why this PostgreSQL plan would not scale with the frontier (None: it does)."""
    if "Seq Scan on frontier" in plan:
        return "it scans the frontier"
    if "Sort" in plan:
        return "it sorts the rows it selects"
    if "frontier_by_state" not in plan or "state = " not in plan:
        return "it does not search frontier_by_state by session and state"
    return None


SCANNING = [  # what a careless edit of the refill could make of it
    ("ORDER BY f.frontier_id", "ORDER BY f.depth, f.frontier_id"),  # a sort of all queued
    ("f.state = 'queued'", "coalesce(f.state, '') = 'queued'"),  # the index unusable
]


def crawled_frontier(make: Factory, count: int) -> list:
    """A session's frontier as a crawl leaves it: most URLs done, the newest queued, a few
    in flight (the query plans depend on what the planner knows of the states)."""
    urls = [f"http://h{i % 7}.test/{i}" for i in range(count)]

    def update(**changes: list) -> FrontierUpdate:
        return FrontierUpdate(message_id=make.id("m"), session_id="s1", run_id="r1",
                              at=make.now, **changes)

    return [make.session(), make.run(),
            update(queued=[QueuedUrl(url=u, depth=1) for u in urls]),
            update(claimed=urls[:count - 30]),
            update(settled=[SettledUrl(url=u, state="done") for u in urls[:count - 40]])]


def test_sqlite_frontier_reads_search_the_state_index(tmp_path: Path) -> None:
    with Store.create(tmp_path / "store") as store:
        acks = submit_all(store, crawled_frontier(Factory(store), 300))
        assert {a.status for a in acks} == {"committed"}
        with store.reader() as reader:
            reads = frontier_reads(reader)
            assert len(reads) == 2
            for sql, binding in reads:
                plan = sqlite_plan(reader, sql, binding)
                assert sqlite_problem(plan) is None, plan
            refill, binding = reads[0]
            for old, new in SCANNING:
                assert old in refill
                bad = sqlite_plan(reader, refill.replace(old, new), binding)
                assert sqlite_problem(bad) is not None, bad


def test_postgresql_frontier_reads_search_the_state_index(pg_url: str,
                                                           tmp_path: Path) -> None:
    with Store.create(pg_url, artifacts=str(tmp_path / "artifacts")) as store:
        acks = submit_all(store, crawled_frontier(Factory(store), 300))
        assert {a.status for a in acks} == {"committed"}
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("ANALYZE frontier")
            admin.execute("ANALYZE url_identity")
        with store.reader() as reader:
            reads = frontier_reads(reader)
            # A table this small is read whole whatever the indexes; the planner is asked
            # to avoid that when it can, as it does for millions of rows.
            reader.execute("SET enable_seqscan = off")
            reader.execute("SET enable_bitmapscan = off")

            def plan(sql: str, binding: tuple) -> str:
                return "\n".join(r[0] for r in reader.execute("EXPLAIN " + sql, binding))

            for sql, binding in reads:
                shown = plan(sql, binding)
                assert pg_problem(shown) is None, shown
            refill, binding = reads[0]
            for old, new in SCANNING:
                bad = plan(refill.replace(old, new), binding)
                assert pg_problem(bad) is not None, bad
