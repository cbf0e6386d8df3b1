"""Opening a store: the SQLite gate, pragmas, migrations, append-only enforcement."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

from evidence import (
    CorruptStoreError,
    MigrationError,
    SQLiteVersionError,
    Store,
    StoreError,
)
from evidence._model.messages import now_text
from evidence._store.sqlite import (
    PAGE_SIZE,
    apply_migrations,
    check_sqlite_version,
    copy_migrated,
    load_migrations,
)


@pytest.mark.parametrize("version", ["3.51.2", "3.50.6", "3.44.5", "3.45.0", "3.49.9",
                                     "3.37.2", "3.51.0"])
def test_sqlite_with_wal_reset_bug_is_refused(tmp_path: Path, version: str) -> None:
    with pytest.raises(SQLiteVersionError, match=rf"SQLite {version}.*WAL-reset") as info:
        Store.create(tmp_path / "s", sqlite_version=version)
    assert info.value.sqlite_version == version
    assert not (tmp_path / "s").exists(), "a refused open must not create anything"


@pytest.mark.parametrize("version", ["3.51.3", "3.52.0", "3.44.6", "3.50.7", "3.54.1",
                                     "4.0.0"])
def test_fixed_sqlite_and_backports_are_accepted(version: str) -> None:
    assert check_sqlite_version(version) >= (3, 44, 6)


def test_new_store_is_wal_full_sync_with_foreign_keys(store: Store) -> None:
    conn = store.connection
    assert conn.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchall()[0][0] == 2  # FULL
    assert conn.execute("PRAGMA foreign_keys").fetchall()[0][0] == 1
    assert (store.path / "artifacts").is_dir()
    assert store.store_id.startswith("store-")


def test_sync_normal_is_an_explicit_option(tmp_path: Path) -> None:
    with Store.create(tmp_path / "s", sync="normal") as s:
        assert s.connection.execute("PRAGMA synchronous").fetchall()[0][0] == 1  # NORMAL
    with pytest.raises(StoreError, match="sync must be"):
        Store.create(tmp_path / "t", sync="off")  # type: ignore[arg-type]


def test_reopen_keeps_identity_and_applies_nothing_twice(tmp_path: Path) -> None:
    with Store.create(tmp_path / "s") as s:
        first_id = s.store_id
    with Store.open(tmp_path / "s") as s:
        assert s.store_id == first_id
        rows = s.connection.execute("SELECT version, name FROM schema_migration").fetchall()
        assert rows == [(v, name) for v, name, _c, _sql in load_migrations()]
        assert len(rows) >= 2
        assert s.connection.execute("PRAGMA user_version").fetchall()[0][0] == len(rows)


def test_opening_a_missing_store_says_how_to_create_one(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no evidence store here") as info:
        Store.open(tmp_path / "nothing")
    assert "evidence init" in (info.value.hint or "")


def test_a_corrupt_database_is_reported_as_corrupt(tmp_path: Path) -> None:
    with Store.create(tmp_path / "s"):
        pass
    (tmp_path / "s" / "evidence.db").write_bytes(b"this is not a database" * 500)
    for suffix in ("-wal", "-shm"):
        (tmp_path / "s" / f"evidence.db{suffix}").unlink(missing_ok=True)
    with pytest.raises(CorruptStoreError, match="damaged or not an evidence store"):
        Store.open(tmp_path / "s")


def test_edited_migration_is_refused(store: Store) -> None:
    migrations = load_migrations()
    version, name, _checksum, sql = migrations[0]
    edited = [(version, name, "0" * 64, sql + "\n-- edited\n"), *migrations[1:]]
    with pytest.raises(MigrationError, match="001_initial was edited after it was applied"):
        apply_migrations(store.connection, edited)


def test_store_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    with Store.create(tmp_path / "s") as s:
        s.connection.execute(
            "INSERT INTO schema_migration VALUES (99, 'future', 'x', '2030-01-01')")
    with pytest.raises(MigrationError, match="schema version 99, newer than this program"):
        Store.open(tmp_path / "s")


def test_a_new_migration_applies_in_its_own_transaction(store: Store) -> None:
    migrations = load_migrations()
    n = len(migrations)
    extra = (n + 1, "extra", "c" * 64, "CREATE TABLE extra (x INTEGER) STRICT;")
    assert apply_migrations(store.connection, [*migrations, extra]) == n + 1
    broken = (n + 2, "broken", "d" * 64, "CREATE TABLE half (x INTEGER); SELECT nonsense();")
    with pytest.raises(apsw.SQLError):
        apply_migrations(store.connection, [*migrations, extra, broken])
    tables = {r[0] for r in store.connection.execute("SELECT name FROM sqlite_schema")}
    assert "extra" in tables and "half" not in tables, "a failed migration leaves nothing"


def _migrated(conn: apsw.Connection) -> tuple[list, list, int]:
    schema = sorted(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_schema"))
    applied = list(conn.execute("SELECT version, name, checksum FROM schema_migration"))
    return schema, applied, conn.execute("PRAGMA user_version").fetchall()[0][0]


def test_a_copy_of_migrated_databases_is_what_the_migrations_make() -> None:
    """Verify's reference and scratch databases are copies of one migrated earlier in the
    process (copy_migrated): each list of migrations, a prefix or an edited one, in any
    order, must give what applying that list gives, in memory and in a temporary file."""
    migrations = load_migrations()
    version, name, _checksum, sql = migrations[-1]
    edited = (version, name, "e" * 64, sql + "\nCREATE TABLE edited (x INTEGER) STRICT;")
    for chosen in (migrations, migrations[:3], [*migrations[:-1], edited], migrations[:3],
                   migrations):
        applied = apsw.Connection(":memory:")
        apply_migrations(applied, chosen)
        for filename in (":memory:", ""):
            copied = apsw.Connection(filename)
            copy_migrated(copied, chosen)
            assert _migrated(copied) == _migrated(applied)
            copied.execute("INSERT INTO schema_migration VALUES (999, 'x', 'y', 'z')")
            copied.close()  # a copy is the caller's own: writing it leaves the next alone


def test_a_new_store_holds_what_migrating_it_in_place_gives(tmp_path: Path) -> None:
    """A new store's database is a copy of one the migrations made in memory: the same
    schema, migration rows and version as a file migrated in place, at the store's page
    size and in WAL mode, with this store's own migration times."""
    in_place = apsw.Connection(str(tmp_path / "in-place.db"))
    in_place.execute(f"PRAGMA page_size = {PAGE_SIZE}")
    apply_migrations(in_place, load_migrations())
    before = now_text()
    with Store.create(tmp_path / "a"), Store.create(tmp_path / "b") as second:
        conn = second.connection
        assert _migrated(conn) == _migrated(in_place)
        assert conn.execute("PRAGMA page_size").fetchall()[0][0] == PAGE_SIZE
        assert conn.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal"
        times = {t for (t,) in conn.execute("SELECT applied_at FROM schema_migration")}
        assert len(times) == 1 and times.pop() >= before
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


EVIDENCE_TABLES = ["url_identity", "artifact", "ingest_ledger", "commit_log", "fetch_attempt",
                   "discovery_edge", "rule_evaluation", "quarantine", "crawl_session",
                   "crawl_run", "url_current"]


@pytest.mark.parametrize("table", EVIDENCE_TABLES)
def test_update_and_delete_on_evidence_tables_fail_in_the_database(
        populated_store: Store, table: str) -> None:
    conn = populated_store.connection
    assert conn.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0] > 0
    column = conn.execute(f"SELECT name FROM pragma_table_info('{table}')").fetchall()[0][0]
    with pytest.raises(apsw.ConstraintError, match="append-only|only advances|never deleted"):
        conn.execute(f"UPDATE {table} SET {column} = CASE typeof({column}) "
                     f"WHEN 'integer' THEN {column} + 1000000 ELSE {column} || 'x' END")
    with pytest.raises(apsw.ConstraintError, match="append-only|never deleted"):
        conn.execute(f"DELETE FROM {table}")


def test_run_end_is_written_once(populated_store: Store) -> None:
    conn = populated_store.connection
    with pytest.raises(apsw.ConstraintError, match="end is written once"):
        conn.execute("UPDATE crawl_run SET ended_at = 'x', outcome = 'failed'")


def test_write_transactions_begin_immediate(store: Store) -> None:
    # A second connection holding the write lock makes BEGIN IMMEDIATE fail at once,
    # before any work is done, which is the point of IMMEDIATE.
    other = apsw.Connection(str(store.db_path))
    other.execute("BEGIN IMMEDIATE")
    store.connection.set_busy_timeout(50)
    try:
        with pytest.raises(apsw.BusyError), store.write_transaction():
            pytest.fail("the transaction body must not run without the write lock")
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_readers_are_read_only(store: Store) -> None:
    with store.reader() as conn, pytest.raises(apsw.ReadOnlyError):
        conn.execute("INSERT INTO store_meta VALUES ('x', 'y')")


def test_the_store_id_is_answered_while_the_writer_uses_the_write_connection(
        tmp_path: Path) -> None:
    """The service's handshake asks ``store.store_id`` on its event loop's thread while the
    writer may be committing on the write connection on its own thread: the answer is the
    one read at open, never a query on that connection (one crashed a crawl with worker
    processes: apsw's ThreadingViolationError, "the Connection is busy in another
    thread")."""
    import threading

    with Store.create(tmp_path / "s") as store:
        expected = store.store_id
        entered, release = threading.Event(), threading.Event()

        def hold() -> int:
            entered.set()
            release.wait(60)
            return 1

        store.connection.create_scalar_function("hold", hold, 0)
        busy = threading.Thread(
            target=lambda: store.connection.execute("SELECT hold()").fetchall())
        busy.start()
        try:
            assert entered.wait(60)  # the connection is in use on the other thread now
            assert store.store_id == expected != ""
        finally:
            release.set()
            busy.join()
