"""verify covers every table a later step relies on (issue 12, point 4).

The store: two complete crawl sessions of the local test site (the second incremental, so
there are session documents that are a baseline), a rule verdict, and one conflicting
message delivered three times (one quarantine record counting three deliveries). For every
table, an attacker edits a row, deletes one and inserts one: with the append-only
triggers dropped and put back afterwards, and foreign keys off, so that only the data
checks can find the edit. Each edit must be an error located at (or naming) its table.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest

from evidence import (
    CrawlConfig,
    Crawler,
    CrawlOptions,
    Render,
    RuleEvaluated,
    Store,
    Writer,
    utc_now,
    verify,
)
from evidence._audit.verify import TABLE_COVERAGE
from evidence._demo.site import SiteConfig, TestSite
from evidence._store.sqlite import load_migrations

DOCS = Path(__file__).resolve().parent.parent / "docs" / "verify.md"


def crawl(path: Path, config: CrawlConfig) -> None:
    with Store.create(path) as store:
        result = anyio.run(Crawler(store, config, CrawlOptions(workers=3)).run)
        assert result.session_completed


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("coverage") / "store"
    with TestSite(SiteConfig(pages=12)) as site:
        # Named localhost, so its resolutions are recorded (dns_resolution has rows).
        config = CrawlConfig(seeds=[site.url.replace("127.0.0.1", "localhost")])
        crawl(path, config)
        site.set_version(2)
        crawl(path, config)  # incremental: documents classified against the first session
    with Store.open(path) as store:
        conn = store.connection
        run_id, url, attempt_id, digest = conn.execute(
            "SELECT f.run_id, f.url, f.attempt_id, b.digest FROM fetch_attempt f "
            "JOIN artifact b ON b.artifact_id = f.body_id ORDER BY f.attempt_seq LIMIT 1"
        ).fetchall()[0]
        rule = RuleEvaluated(message_id="rule-1", run_id=run_id, url=url, rule_id="title",
                             rule_version="1", input_hash=digest, verdict="pass",
                             evaluated_at=utc_now(), attempt_id=attempt_id)

        # A render of the first capture (what `crawl --render` records; written here
        # without a browser, so the table has a row to attack wherever the suite runs).
        render = Render(message_id="render-1", render_id="r-1", run_id=run_id,
                        source_attempt_id=attempt_id, url=url, started_at=utc_now(),
                        elapsed_ms=12.5, outcome="rendered", browser="test", title="t",
                        viewport_width=800, viewport_height=600, settle="quiet",
                        dom=store.artifacts.put("dom", b"<html><body>rendered</body></html>"))

        async def write() -> list[str]:
            async with Writer(store) as writer:
                assert (await writer.submit(render)).status == "committed"
                statuses = [(await writer.submit(rule)).status]
                changed = msgspec.structs.replace(rule, verdict="fail")  # same id: conflict
                for _ in range(3):
                    statuses.append((await writer.submit(changed)).status)
                return statuses

        assert anyio.run(write) == ["committed", "conflict", "conflict", "conflict"]
        assert conn.execute("SELECT deliveries FROM quarantine").fetchall() == [(3,)]
        counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                  for t in TABLE_COVERAGE}
    assert all(counts.values()), counts  # every table has rows to edit
    with Store.open(path, read_only=True) as store:
        assert verify(store).ok
    return path


@pytest.fixture
def store(crawled: Path, tmp_path: Path) -> Iterator[Store]:
    shutil.copytree(crawled, tmp_path / "store")
    with Store.open(tmp_path / "store") as s:
        yield s


def attack(store: Store, table: str, sql: str) -> None:
    """Drop the table's triggers, run ``sql`` with foreign keys off, put the triggers back."""
    conn = store.connection
    triggers = conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = 'trigger' "
                            "AND tbl_name = ?", (table,)).fetchall()
    conn.execute("PRAGMA foreign_keys = OFF")
    for name, _ in triggers:
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute(sql)
    for _, trigger in triggers:
        conn.execute(trigger)
    conn.execute("PRAGMA foreign_keys = ON")


def copy_row(table: str, changes: dict[str, str], where: str = "1") -> str:
    """INSERT a copy of one row of ``table`` with ``changes`` (column -> SQL expression)."""
    return (f"INSERT INTO {table} SELECT {{columns}} FROM {table} WHERE {where} LIMIT 1",
            changes)  # type: ignore[return-value]


SESSION2 = "(SELECT session_id FROM crawl_session ORDER BY started_at DESC LIMIT 1)"
EDITS: dict[str, dict[str, str | tuple[str, dict[str, str]]]] = {
    "crawl_session": {
        "update": "UPDATE crawl_session SET config = '{}'",
        "delete": f"DELETE FROM crawl_session WHERE session_id = {SESSION2}",
        "insert": copy_row("crawl_session", {"session_id": "'forged'"}),
    },
    "crawl_run": {
        "update": "UPDATE crawl_run SET host = 'elsewhere'",
        "delete": "DELETE FROM crawl_run WHERE rowid = (SELECT max(rowid) FROM crawl_run)",
        "insert": copy_row("crawl_run", {"run_id": "'forged'"}),
    },
    "url_identity": {
        "update": "UPDATE url_identity SET fetch_key = 'http://evil.example/' "
                  "WHERE url_id = (SELECT min(url_id) FROM url_identity)",
        "delete": "DELETE FROM url_identity WHERE url_id = (SELECT max(url_id) FROM url_identity)",
        "insert": "INSERT INTO url_identity (normalizer_version, fetch_key) "
                  "VALUES (1, 'http://forged.example/')",
    },
    "artifact": {
        "update": "UPDATE artifact SET size = size + 1 WHERE artifact_id = 1",
        "delete": "DELETE FROM artifact WHERE artifact_id = "
                  "(SELECT max(artifact_id) FROM artifact)",
        "insert": "INSERT INTO artifact (namespace, digest, size) "
                  f"VALUES ('body', '{'0' * 64}', 1)",
    },
    "fetch_attempt": {
        "update": "UPDATE fetch_attempt SET content_type = 'text/evil' WHERE attempt_seq = 1",
        "delete": "DELETE FROM fetch_attempt WHERE attempt_seq = (SELECT max(attempt_seq) "
                  "FROM fetch_attempt)",
        "insert": copy_row("fetch_attempt", {"attempt_seq": "NULL", "attempt_id": "'forged'",
                                             "sequence": "sequence + 7",
                                             "log_index": "(SELECT max(log_index) + 1000 "
                                                          "FROM ingest_ledger)"}),
    },
    "discovery_edge": {
        "update": "UPDATE discovery_edge SET observed_ref = '/evil' WHERE edge_id = 1",
        "delete": "DELETE FROM discovery_edge WHERE edge_id = 1",
        "insert": copy_row("discovery_edge", {"edge_id": "NULL", "position": "position + 999"}),
    },
    "rule_evaluation": {
        "update": "UPDATE rule_evaluation SET verdict = 'fail'",
        "delete": "DELETE FROM rule_evaluation",
        "insert": copy_row("rule_evaluation", {"evaluation_id": "NULL",
                                               "input_hash": f"'{'1' * 64}'",
                                               "log_index": "log_index - 1"}),
    },
    "render": {
        "update": "UPDATE render SET title = 'forged'",
        "delete": "DELETE FROM render",
        "insert": copy_row("render", {"render_seq": "NULL", "render_id": "'forged'",
                                      "log_index": "(SELECT max(log_index) + 1000 "
                                                   "FROM ingest_ledger)"}),
    },
    "dns_resolution": {
        "update": "UPDATE dns_resolution SET addresses = '[\"10.9.9.9\"]'",
        "delete": "DELETE FROM dns_resolution WHERE resolution_seq = "
                  "(SELECT max(resolution_seq) FROM dns_resolution)",
        "insert": copy_row("dns_resolution", {"resolution_seq": "NULL",
                                              "resolution_id": "'forged'"}),
    },
    "url_current": {
        "update": "UPDATE url_current SET sequence = sequence + 5 WHERE (run_id, url_id) IN "
                  "(SELECT run_id, url_id FROM url_current LIMIT 1)",
        "delete": "DELETE FROM url_current WHERE (run_id, url_id) IN "
                  "(SELECT run_id, url_id FROM url_current LIMIT 1)",
        "insert": "INSERT INTO url_current SELECT r.run_id, (SELECT max(url_id) FROM "
                  "url_identity), 0, 1 FROM crawl_run r WHERE NOT EXISTS (SELECT 1 FROM "
                  "url_current c WHERE c.run_id = r.run_id AND c.url_id = (SELECT max(url_id) "
                  "FROM url_identity)) LIMIT 1",
    },
    "ingest_ledger": {
        "update": "UPDATE ingest_ledger SET received_at = '2020-01-01T00:00:00.000000Z' "
                  "WHERE log_index = 3",
        "delete": "DELETE FROM ingest_ledger WHERE log_index = 3",
        "insert": copy_row("ingest_ledger", {"log_index": "(SELECT max(log_index) + 1 "
                                                          "FROM ingest_ledger)",
                                             "message_id": "'forged'"}),
    },
    "commit_log": {
        "update": "UPDATE commit_log SET committed_at = 'x' WHERE batch_seq = 2",
        "delete": "DELETE FROM commit_log WHERE batch_seq = 2",
        "insert": copy_row("commit_log", {"batch_seq": "(SELECT max(batch_seq) + 1 "
                                                       "FROM commit_log)"},
                           "batch_seq = (SELECT max(batch_seq) FROM commit_log)"),
    },
    "quarantine": {
        "update": "UPDATE quarantine SET deliveries = 1",
        "delete": "DELETE FROM quarantine",
        "insert": copy_row("quarantine", {"quarantine_id": "NULL", "reason": "'forged'"}),
    },
    "frontier": {
        "update": "UPDATE frontier SET state = 'queued' WHERE frontier_id = 2",
        "delete": "DELETE FROM frontier WHERE frontier_id = 2",
        "insert": "INSERT INTO frontier (session_id, url_id, url, state, depth, via, "
                  "updated_log_index) SELECT session_id, (SELECT max(url_id) FROM "
                  "url_identity), 'http://forged.example/', 'queued', 0, 'seed', "
                  "updated_log_index FROM frontier LIMIT 1",
    },
    "host_state": {
        "update": "UPDATE host_state SET robots_attempt_id = NULL, crawl_delay = 0",
        "delete": "DELETE FROM host_state",
        "insert": copy_row("host_state", {"host": "'forged.example'"}),
    },
    "session_document": {
        "update": f"UPDATE session_document SET change = 'changed', body_digest = '{'2' * 64}' "
                  f"WHERE session_id = {SESSION2} AND change = 'unchanged'",
        "delete": f"DELETE FROM session_document WHERE session_id = {SESSION2}",
        "insert": "INSERT INTO session_document SELECT session_id, (SELECT max(url_id) FROM "
                  "url_identity), 'http://forged.example/', 'new', 200, NULL, NULL, NULL, "
                  "log_index FROM session_document LIMIT 1",
    },
    "store_meta": {
        "update": "UPDATE store_meta SET value = 'store-forged' WHERE key = 'store_id'",
        "delete": "DELETE FROM store_meta WHERE key = 'store_id'",
    },
    "schema_migration": {
        "update": "UPDATE schema_migration SET checksum = 'x' WHERE version = 1",
        "delete": "DELETE FROM schema_migration WHERE version = 2",
        "insert": "INSERT INTO schema_migration VALUES (99, 'forged', 'x', 'x')",
    },
}
CASES = [(t, e) for t, edits in EDITS.items() for e in edits]


def sql_for(store: Store, table: str, edit: str | tuple[str, dict[str, str]]) -> str:
    if isinstance(edit, str):
        return edit
    template, changes = edit
    columns = [row[1] for row in store.connection.execute(f"PRAGMA table_info({table})")]
    return template.format(columns=", ".join(changes.get(c, c) for c in columns))


def test_every_table_is_covered_by_verify_and_its_docs() -> None:
    # A table a migration adds fails here until verify checks it or says it is not evidence.
    import apsw

    from evidence._store.sqlite import apply_migrations

    conn = apsw.Connection(":memory:")
    apply_migrations(conn, load_migrations())
    tables = {t for (t,) in conn.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
    assert tables == set(TABLE_COVERAGE)
    docs = DOCS.read_text()
    section = docs[docs.index("### Every table"):docs.index("### What proves")]
    rows = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| `")]
    listed = {name.strip("`| ") for row in rows for name in row.split(", ")}
    assert listed == tables, "docs/verify.md, 'Every table': one row per table"
    assert set(EDITS) == tables, "every table has its attacks below"


@pytest.mark.parametrize(("table", "edit"), CASES, ids=[f"{t}-{e}" for t, e in CASES])
def test_an_edit_of_any_table_is_found(store: Store, table: str, edit: str) -> None:
    before = store.connection.total_changes()
    attack(store, table, sql_for(store, table, EDITS[table][edit]))
    assert store.connection.total_changes() > before, "the attack changed a row"
    report = verify(store)
    errors = [f for f in report.errors if f.kind != "schema" or table == "schema_migration"]
    assert errors, f"{edit} of {table} went unreported"
    # url_identity is found through the rows whose URL key it gives (their fetch_key).
    located = [f for f in errors if f.location.table == table or table in f.message
               or (table == "url_identity" and "fetch_key" in f.message)]
    assert located, [(f.kind, f.location.table, f.message) for f in errors]
