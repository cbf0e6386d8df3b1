"""PostgreSQL as a store backend (issue 16, part 1): the same evidence as on SQLite, byte for
byte; restore into either backend; compare across backends; the writer lock; the server
policy checked at open. The server is the session's throwaway cluster (tests/conftest.py
``pg_cluster``); every test gets a fresh database."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import (
    CommitError,
    FrontierUpdate,
    HostUpdate,
    Message,
    QueuedUrl,
    RuleEvaluated,
    RunEnded,
    RunStarted,
    SettledUrl,
    Store,
    SyncError,
    Writer,
    compare,
    export,
    restore,
    verify,
)
from evidence._errors import StoreError
from evidence._write.limits import WriterHooks

from .conftest import Factory, new_pg_database, submit_all
from .test_faults import failure_of, submit

pytestmark = pytest.mark.anyio


def clock() -> Callable[[], str]:
    """The same sequence of batch times for every writer given one (a microsecond apart)."""
    ticks = itertools.count()
    return lambda: f"2026-03-03T12:00:00.{next(ticks):06d}Z"


def stream(make: Factory, puts: Callable[[str, bytes], object]) -> list[list[Message]]:
    """A crawl-shaped stream of groups (each one batch): sessions, runs, attempts with their
    payloads, links, rules, frontier and host state, redeliveries, a conflict, rejections."""
    body = make.body(b"<html><a href=/a>a</a><a href=/b>b</a></html>")
    puts("body", b"<html><a href=/a>a</a><a href=/b>b</a></html>")
    head = make.store.artifacts.put("headers", b"HTTP/1.1 200 OK\r\n\r\n")
    puts("headers", b"HTTP/1.1 200 OK\r\n\r\n")
    first = make.attempt("http://example.com/", body=body, response_headers=head,
                         content_type="text/html", elapsed_ms=12.25)
    late = make.attempt("http://example.com/a", sequence=3, elapsed_ms=0.5)
    early = make.attempt("http://example.com/a", sequence=1, http_status=404)
    rule = RuleEvaluated(message_id=make.id("m"), run_id="r1", url=first.url, rule_id="title",
                         rule_version="1", input_hash=body.digest, verdict="pass",
                         evaluated_at=make.now, attempt_id=first.attempt_id,
                         details={"title": "a", "n": [1, 2.5, None]})
    frontier = FrontierUpdate(
        message_id=make.id("m"), session_id="s1", run_id="r1", at=make.now,
        queued=[QueuedUrl(url="http://example.com/", depth=0, via="seed"),
                QueuedUrl(url="http://example.com/a", depth=1, via="link",
                          source_attempt_id=first.attempt_id),
                QueuedUrl(url="http://example.com/x", depth=9, via="link", skip="depth 9 > 2"),
                # the same URL again, at a depth allowed: queued (the writer sends the
                # update's rows many per statement, never one URL twice in one: PostgreSQL
                # refuses an upsert that touches one row twice)
                QueuedUrl(url="http://example.com/x", depth=1, via="link")],
        claimed=["http://example.com/"])
    settle = FrontierUpdate(message_id=make.id("m"), session_id="s1", run_id="r1", at=make.now,
                            settled=[SettledUrl(url="http://example.com/", state="done",
                                                reason="HTTP 200")])
    host = HostUpdate(message_id=make.id("m"), run_id="r1", host="example.com",
                      robots_attempt_id=first.attempt_id, crawl_delay=1.5, reason="robots")
    orphan = make.attempt("http://example.com/z", run_id="no-such-run")
    return [
        [make.session(config={"seeds": ["http://example.com/"]}), make.run()],
        [frontier],
        [first, make.discovery(first, body, ["http://example.com/a", "http://example.com/b",
                                             "http://example.com/a"]), rule, settle],
        [late, early, host],
        [first],  # a redelivery: a duplicate, nothing written (no batch)
        [msgspec.structs.replace(first, elapsed_ms=99.0)],  # a conflict, quarantined
        [orphan], [orphan],  # rejected twice: one record, two deliveries
        [make.session("s2", mode="incremental", baseline_session_id="s1"),
         RunStarted(message_id=make.id("m"), run_id="r2", session_id="s2",
                    started_at=make.now, program="evidence", host="h", pid=7)],
        # 40 attempts of 5 URLs out of sequence order in one batch: the projection's rows
        # go many per statement, and PostgreSQL refuses an upsert that touches one row twice
        [make.attempt(f"http://example.com/m{i % 5}", sequence=(i * 7) % 40)
         for i in range(40)],
        [make.attempt("http://example.com/a", run_id="r2", body=body),
         RunEnded(message_id=make.id("m"), run_id="r1", ended_at=make.now,
                  outcome="completed", reason="done")],
    ]


async def feed(store: Store, groups: list[list[Message]]) -> list[str]:
    statuses = []
    async with Writer(store, hooks=WriterHooks(batch_time=clock())) as writer:
        for group in groups:
            statuses += [a.status for a in await writer.submit_group(group)]
    return statuses


@pytest.fixture
def twins(tmp_path: Path, pg_url: str) -> Iterator[tuple[Store, Store]]:
    """An empty SQLite store and a PostgreSQL store restored from its export: the same
    identity and migration rows, so the same messages must give the same bytes."""
    with Store.create(tmp_path / "a"):
        pass
    export(tmp_path / "a", tmp_path / "empty")
    restore(tmp_path / "empty", pg_url, artifacts=tmp_path / "b-artifacts")
    with Store.open(tmp_path / "a") as a, Store.open(pg_url) as b:
        yield a, b


async def test_the_same_messages_export_byte_identical_archives_on_sqlite_and_postgresql(
        twins: tuple[Store, Store], tmp_path: Path, pg_cluster) -> None:
    a, b = twins
    groups = stream(Factory(a), b.artifacts.put)
    statuses = await feed(a, groups)
    assert await feed(b, groups) == statuses
    assert {"committed", "duplicate", "conflict", "rejected"} <= set(statuses)
    ma = export(a, tmp_path / "xa")
    mb = export(b, tmp_path / "xb")
    dump_a, dump_b = ((tmp_path / x / "dump.sql").read_bytes() for x in ("xa", "xb"))
    assert dump_a == dump_b
    assert (tmp_path / "xa" / "manifest.json").read_bytes() == \
        (tmp_path / "xb" / "manifest.json").read_bytes()
    assert ma.log.root == mb.log.root and ma.log.tree_size == mb.log.tree_size > 0
    assert ma.log.verified and ma.quarantined == 2
    assert sorted(p.name for p in (tmp_path / "xb" / "artifacts").rglob("*") if p.is_file()) \
        == sorted(p.name for p in (tmp_path / "xa" / "artifacts").rglob("*") if p.is_file())
    # compare across backends, and restore each archive into the other backend
    assert compare(a, b).equal
    restore(tmp_path / "xb", tmp_path / "c")
    d = new_pg_database(pg_cluster)
    restore(tmp_path / "xa", d, artifacts=tmp_path / "d-artifacts")
    assert compare(tmp_path / "c", a).equal
    assert compare(d, b).equal  # d named by its connection string
    assert compare(d, tmp_path / "c").equal


async def test_a_difference_in_one_row_is_found_across_backends(
        twins: tuple[Store, Store], pg_cluster, pg_url: str) -> None:
    a, b = twins
    groups = stream(Factory(a), b.artifacts.put)
    await feed(a, groups)
    await feed(b, groups[:-1])  # b lacks the last batch
    result = compare(a, b)
    assert not result.equal
    assert {d.name for d in result.differences if d.what == "table"} >= {
        "fetch_attempt", "ingest_ledger", "commit_log"}


def test_a_restore_that_does_not_match_its_manifest_leaves_the_database_empty(
        tmp_path: Path, store: Store, make: Factory, pg_url: str) -> None:
    submit_all(store, [make.session(), make.run(), make.attempt(body=make.body())])
    export(store, tmp_path / "x")
    manifest = (tmp_path / "x" / "manifest.json").read_text()
    (tmp_path / "x" / "manifest.json").write_text(manifest.replace('"rows": 1', '"rows": 2', 1))
    with pytest.raises(Exception, match="does not restore"):
        restore(tmp_path / "x", pg_url, artifacts=tmp_path / "art")
    assert not (tmp_path / "art").exists()
    with pytest.raises(StoreError, match="no evidence store"):
        Store.open(pg_url, read_only=True)


def test_init_records_the_artifact_directory_and_later_opens_find_it(
        tmp_path: Path, pg_url: str) -> None:
    with Store.create(pg_url, artifacts=str(tmp_path / "art")) as store:
        ref = store.artifacts.put("body", b"payload")
        store_id = store.store_id
    with Store.open(pg_url, read_only=True) as again:
        assert again.store_id == store_id
        assert again.artifacts.read(ref) == b"payload"
        assert again.location == pg_url
    with pytest.raises(StoreError, match="needs a directory for its payloads"):
        Store.create(new_pg_database_for(pg_url))


def test_a_creation_that_fails_midway_leaves_no_migration_applied(
        tmp_path: Path, pg_url: str) -> None:
    """A store's pending migrations are applied in one transaction: one that fails (here
    007, whose table a squatter made first) leaves none of the fifteen behind, and the
    same database, cleared, becomes a whole store. Each migration committed on its own
    before, and 001-006 stayed applied."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE render (squatter int)")
    with pytest.raises(StoreError, match="relation \"render\" already exists"):
        Store.create(pg_url, artifacts=str(tmp_path / "art"))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        tables = {t for (t,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert tables - {"schema_migration", "postgresql_migration"} == {"render"}, tables
        assert conn.execute("SELECT count(*) FROM schema_migration").fetchone() == (0,)
        conn.execute("DROP TABLE render")
    with Store.create(pg_url, artifacts=str(tmp_path / "art2")) as store:
        assert store.schema_version == 15
        assert verify(store).ok


@pytest.mark.parametrize("place", ["directory", "s3"])
def test_a_creation_cut_before_its_identity_is_recorded_is_finished_by_init(
        place: str, tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    """A PostgreSQL store records its identity and payload location after its migrations.
    Cut in between, opening it (to write or to read) says its creation did not finish and
    how to finish it, and ``Store.create`` finishes it; its payloads in a directory or in
    an object store. Before, an open with --artifacts went on with a store whose identity
    was empty."""
    from evidence._store import pgstore

    from .conftest import new_s3_url

    artifacts = str(tmp_path / "art")
    if place == "s3":
        seaweed = request.getfixturevalue("seaweed")
        for name, value in seaweed.environ.items():
            monkeypatch.setenv(name, value)
        artifacts = new_s3_url(seaweed)

    def cut(*args: object) -> None:
        raise OSError("power cut")

    with monkeypatch.context() as patch:
        patch.setattr(pgstore, "ensure_store_id", cut)
        with pytest.raises(OSError, match="power cut"):
            Store.create(pg_url, artifacts=artifacts)
    for options in ({"artifacts": artifacts}, {"read_only": True}):
        with pytest.raises(StoreError, match="creation did not finish") as refused:
            Store.open(pg_url, **options)
        assert "evidence init" in (refused.value.hint or "")
    with Store.create(pg_url, artifacts=artifacts) as store:
        assert store.store_id.startswith("store-")
        submit_all(store, [Factory(store).session()])
    with Store.open(pg_url) as store:
        assert verify(store).ok


def new_pg_database_for(url: str) -> str:
    """A URL of another database on the same server (created by the test's cluster)."""
    import psycopg

    name = "other" + url.split("?")[0].rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    return url.replace(url.split("?")[0].rsplit("/", 1)[1] + "?", name + "?")


async def test_a_second_writer_is_refused_while_the_first_holds_the_store(
        tmp_path: Path, pg_url: str) -> None:
    with Store.create(pg_url, artifacts=str(tmp_path / "art")) as one, \
            Store.open(pg_url) as two:
        make = Factory(one)
        async with Writer(one) as writer:
            await writer.submit(make.session())
            with pytest.raises(StoreError, match="another writer holds this store"):
                async with Writer(two):
                    pass
            assert two.running_writer() is not None
        async with Writer(two) as writer:  # released when the first one closed
            assert (await writer.submit(make.run())).status == "committed"


def test_a_server_that_cannot_keep_a_commit_is_refused(tmp_path: Path) -> None:
    """A real server started with fsync = off: the store refuses it at open, saying why."""
    from evidence.testing.pgcluster import PgCluster

    with PgCluster.start(settings={"fsync": "off"}) as unsafe, \
            pytest.raises(StoreError, match="fsync is 'off', needs 'on'"):
        Store.create(unsafe.create_database("x"), artifacts=str(tmp_path / "a"))


def test_sync_normal_is_refused_for_postgresql(pg_url: str, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="always sync='full'"):
        Store.create(pg_url, artifacts=str(tmp_path / "a"), sync="normal")


async def test_a_text_holding_nul_is_refused_alone_on_postgresql(
        tmp_path: Path, pg_url: str) -> None:
    with Store.create(pg_url, artifacts=str(tmp_path / "art")) as store:
        make = Factory(store)
        async with Writer(store) as writer:
            await writer.submit_group([make.session(), make.run()])
            bad, good = await writer.submit_group([
                make.attempt("http://example.com/n", error="a\x00b", outcome="network_error",
                             http_status=None),
                make.attempt("http://example.com/ok")])
        assert (bad.status, good.status) == ("rejected", "committed")
        assert "U+0000" in (bad.reason or "")


def test_the_connection_string_is_shown_without_its_password() -> None:
    from evidence._store.location import is_postgres_location, redact

    assert redact("postgresql://u:secret@h/db?sslmode=require") == \
        "postgresql://u:***@h/db?sslmode=require"
    assert redact("host=/run/pg dbname=e password=secret") == "host=/run/pg dbname=e password=***"
    assert is_postgres_location("postgres://h/db")
    assert is_postgres_location("host=/run/postgresql dbname=evidence")
    assert not is_postgres_location("./store")
    assert not is_postgres_location(Path("postgresql:/x"))


def test_what_a_location_names_and_what_a_message_may_show_of_it() -> None:
    """The kinds are told apart in one place; callers ask ``is_server_database`` and
    ``label`` (issue 31), which never show a password."""
    from evidence._store.location import database_kind, is_server_database, label

    for location in ("postgresql://u:secret@h/db", "host=/run/pg dbname=e password=secret"):
        assert database_kind(location) == "postgresql" and is_server_database(location)
        assert "secret" not in label(location) and "***" in label(location)
    for location in ("./store", Path("/srv/store"), "backups/password-store"):
        assert database_kind(location) == "sqlite" and not is_server_database(location)
        assert label(location) == str(location)



async def test_verify_quick_and_full_pass_on_postgresql_and_locate_an_edit(
        tmp_path: Path, pg_url: str, pg_cluster) -> None:
    from urllib.parse import urlsplit

    from evidence import verify

    with Store.create(pg_url, artifacts=str(tmp_path / "art")) as store:
        await feed(store, stream(Factory(store), lambda *_: None))
        for full in (False, True):
            report = verify(store, full=full)
            assert report.ok, [str(f.message) for f in report.errors]
            assert report.checks["schema_objects"] > 50 and report.checks["ledger_entries"] > 5
        dbname = urlsplit(pg_url).path.lstrip("/")
        # An edit made with the guard disabled: the trigger is reported (disabled), and the
        # row is located by the row checks, exactly as on SQLite.
        pg_cluster.sql("ALTER TABLE fetch_attempt DISABLE TRIGGER fetch_attempt_no_update; "
                       "UPDATE fetch_attempt SET http_status = 500 WHERE attempt_seq = 1",
                       dbname=dbname)
        report = verify(store)
        messages = [f.message for f in report.errors]
        assert any("trigger fetch_attempt_no_update differs" in m and "disabled" in m
                   for m in messages), messages
        assert any(f.location.table == "fetch_attempt" and f.kind != "schema"
                   for f in report.errors), messages
        pg_cluster.sql("DROP TRIGGER commit_log_no_update ON commit_log", dbname=dbname)
        messages = [f.message for f in verify(store).errors]
        assert "trigger commit_log_no_update is missing (schema/postgresql creates it)" \
            in messages


def test_a_libpq_keyword_string_with_a_unix_socket_host_names_a_store(
        pg_cluster, tmp_path: Path) -> None:
    url = new_pg_database(pg_cluster)
    dbname = url.split("?")[0].rsplit("/", 1)[1]
    keywords = (f"host={pg_cluster.root} port={pg_cluster.port} dbname={dbname} "
                f"user={pg_cluster.superuser}")
    with Store.create(keywords, artifacts=str(tmp_path / "art")) as store:
        store_id = store.store_id
    with Store.open(url, read_only=True) as same:  # the URI form, the same database
        assert same.store_id == store_id


def test_cli_init_without_artifacts_is_a_user_error_that_changes_nothing(
        pg_url: str, pg_cluster) -> None:
    from .conftest import evidence_in_process

    result = evidence_in_process("init", pg_url)
    assert result.returncode == 2
    assert result.stderr.startswith("Error: ") and "\nTry: give one: --artifacts DIR" in \
        result.stderr and "Traceback" not in result.stderr
    dbname = pg_url.split("?")[0].rsplit("/", 1)[1]
    assert pg_cluster.sql("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
                          dbname=dbname).strip() == "0"
    unreachable = pg_url.replace(f"port={pg_cluster.port}", "port=1")
    result = evidence_in_process("status", unreachable)
    assert result.returncode == 2 and "cannot connect to PostgreSQL" in result.stderr
    assert "Try: check the connection string" in result.stderr


@pytest.mark.slow
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.tuples(st.integers(min_value=0, max_value=15),
                                st.integers(min_value=1, max_value=4)),
                      min_size=1, max_size=10))
def test_any_sequence_of_deliveries_exports_the_same_bytes_on_both_backends(
        pg_cluster, tmp_path_factory: pytest.TempPathFactory,
        picks: list[tuple[int, int]]) -> None:
    """Any sequence of groups drawn from one pool (new messages, redeliveries, a conflicting
    copy, a message for a run that does not exist, attempts of one URL out of order), fed
    to a SQLite store and a PostgreSQL store of the same identity with the same clock:
    the same acknowledgements, and exports of the same bytes."""
    tmp = tmp_path_factory.mktemp("twins")
    with Store.create(tmp / "a"):
        pass
    export(tmp / "a", tmp / "empty")
    url = new_pg_database(pg_cluster)
    restore(tmp / "empty", url, artifacts=tmp / "b-art")
    with Store.open(tmp / "a") as a, Store.open(url) as b:
        make = Factory(a)
        body = make.body(b"<a href=/x>x</a>")
        b.artifacts.put("body", b"<a href=/x>x</a>")
        pool: list[Message] = []
        for i in range(8):
            attempt = make.attempt("http://example.com/p", sequence=7 - i, body=body)
            pool += [attempt, make.discovery(attempt, body, [f"http://example.com/{i}",
                                                              "http://example.com/p"])]
        pool[3] = msgspec.structs.replace(pool[1], refs=pool[1].refs[:1])  # a conflict
        pool[5] = make.attempt("http://example.com/q", run_id="nope")  # rejected
        assert len(pool) == 16  # every pick starts inside it
        groups = [[make.session(), make.run()]] + [pool[start:start + size]
                                                    for start, size in picks]

        async def both() -> tuple[list[str], list[str]]:
            return await feed(a, groups), await feed(b, groups)

        sa, sb = anyio.run(both)
        assert sa == sb
        export(a, tmp / "xa")
        export(b, tmp / "xb")
    assert (tmp / "xa" / "dump.sql").read_bytes() == (tmp / "xb" / "dump.sql").read_bytes()
    assert (tmp / "xa" / "manifest.json").read_bytes() == \
        (tmp / "xb" / "manifest.json").read_bytes()


def test_a_failed_pack_fsync_acks_nothing_stops_the_writer_and_the_next_open_resyncs(
        pg_url: str, tmp_path: Path) -> None:
    """The failing-disk rule on a PostgreSQL store whose payloads are packs: a pack fsync
    that fails before a COMMIT acknowledges nothing and stops the writer; the next open for
    writing rewrites and fsyncs the listed packs before anything is trusted, and the
    redelivered group commits once."""
    from evidence._store.packs import PackStore
    from evidence.testing.disk import CrashFileOps, Fault, SimulatedDisk
    from evidence.testing.trial import Workload, build_groups

    disk = SimulatedDisk(tmp_path)
    disk.capture()
    art = tmp_path / "artifacts"
    setup, group = build_groups(Workload(batches=1, pages_per_batch=2), prefix="p")[:2]

    store = Store.create(pg_url, artifacts=str(art))
    try:
        store.artifacts.close()
        store.artifacts = PackStore(art, file_ops=CrashFileOps(disk))  # its pack fsyncs fail
        anyio.run(submit, store, setup.messages)
        for body in group.bodies:
            store.artifacts.put("body", body)
        disk.arm(Fault(action="io_error", at=1, ops=frozenset({"sync"}),
                       files=frozenset({"artifact"})))
        errors = [type(e) for e in failure_of(submit, store, group.messages)]
        assert set(errors) <= {CommitError, SyncError} and SyncError in errors, errors
        assert (art / "PACKS" / "SYNC-FAILED").exists()
        with pytest.raises(SyncError):
            anyio.run(submit, store, group.messages)  # the store takes no writer now
        with store.snapshot() as conn:
            assert conn.execute("SELECT count(*) FROM fetch_attempt").fetchall() == [(0,)]
        disk.arm(None)
    finally:
        store.close()
    with Store.open(pg_url) as store:  # resyncs the packs, then trusts them
        assert not (art / "PACKS" / "SYNC-FAILED").exists()
        for body in group.bodies:
            store.artifacts.put("body", body)
        acks = anyio.run(submit, store, group.messages)
        assert {a.status for a in acks} == {"committed"}
        assert verify(store, full=True).ok
