"""Archives: stable export, online backup, restore-and-compare (issue 4).

Real stores in tmp_path, written through the real Writer. The guarantees: the same logical
content always dumps to the same bytes (twice, from a backup, from a VACUUM INTO copy,
after restore); a backup taken while a writer commits is consistent and complete; restore
refuses a non-empty target and anything that does not match its manifest; compare finds
and locates a single changed row, and finds nothing in a faithful copy.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import itertools
import json
import math
import re
import shutil
import tempfile
import threading
from pathlib import Path

import anyio
import apsw
import blake3
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import (
    ArtifactRef,
    CorruptStoreError,
    RuleEvaluated,
    RunEnded,
    SessionEnded,
    Store,
    StoreError,
    Writer,
    check_log,
)
from evidence._archive.archive import backup, compare, load_dump, restore
from evidence._archive.export import (
    TABLE_ORDER,
    Output,
    describe_log,
    dump,
    export,
    read_manifest,
    sql_literal,
)
from evidence._archive.segments import ArchivePayloads, write_payloads
from evidence._audit.verify import verify
from evidence._cli.archive import add_commands
from evidence._errors import ArtifactCorruptError
from evidence._store.artifacts import ArtifactStore
from evidence._store.packs import PackStore
from evidence._store.sqlite import copy_snapshot

from .conftest import (
    Factory,
    as_format_1,
    flip_payload_byte,
    lose_payload,
    payload_place,
    submit_all,
)

TRICKY = "it's\ttab\r\nnew\x00nul\x7fdel é \u2028 ''"


@pytest.fixture
def rich(populated_store: Store, make: Factory) -> Store:
    """populated_store plus a second session (with a baseline) and run, tricky text, an
    attempt without a body, headers artifacts and infinities: every literal kind."""
    store, now = populated_store, make.now
    headers = make.store.artifacts.put("headers", b"content-type: text/plain\r\n")
    other = make.body(b"plain text body")
    a1 = make.attempt("http://example.com/t", run_id="r2", body=other, response_headers=headers,
                      content_type="Text/Plain; charset=utf-8", error=TRICKY, http_status=404,
                      elapsed_ms=math.inf)
    a2 = make.attempt("http://example.com/down", run_id="r2", outcome="network_error",
                      http_status=None, error="connection refused", elapsed_ms=0.1)
    messages = [
        SessionEnded(message_id=make.id("m"), session_id="s1", ended_at=now,
                     outcome="completed"),
        make.session("s2", mode="incremental", baseline_session_id="s1",
                     config={"seeds": ["http://example.com/"], "note": TRICKY}),
        make.run("r2", "s2"), a1, a2,
        make.discovery(a1, other, ["http://example.com/x", "http://example.com/"]),
        RuleEvaluated(message_id=make.id("m"), run_id="r2", url=a1.url, rule_id="title",
                      rule_version="1", input_hash=other.digest, verdict="fail",
                      evaluated_at=now, attempt_id=a1.attempt_id, details={"why": TRICKY}),
    ]
    assert {a.status for a in submit_all(store, messages)} == {"committed"}
    return store


def dump_bytes(archive: Path) -> bytes:
    return (archive / "dump.sql").read_bytes()


# --- stable export ---------------------------------------------------------------------------

def test_export_is_byte_identical_twice_from_backup_from_vacuum_copy_and_after_restore(
        rich: Store, tmp_path: Path) -> None:
    first = export(rich, tmp_path / "first")
    export(rich.path, tmp_path / "again")
    backup(rich, tmp_path / "backup")
    export(tmp_path / "backup", tmp_path / "from-backup")
    vacuumed = tmp_path / "vacuumed"
    vacuumed.mkdir()
    rich.connection.execute("VACUUM INTO ?", (str(vacuumed / "evidence.db"),))
    shutil.copytree(rich.path / "artifacts", vacuumed / "artifacts")
    export(vacuumed, tmp_path / "from-vacuum")
    restore(tmp_path / "first", tmp_path / "restored")
    export(tmp_path / "restored", tmp_path / "from-restore")
    expected = dump_bytes(tmp_path / "first")
    manifest = (tmp_path / "first" / "manifest.json").read_bytes()
    for name in ("again", "from-backup", "from-vacuum", "from-restore"):
        assert dump_bytes(tmp_path / name) == expected, name
        assert (tmp_path / name / "manifest.json").read_bytes() == manifest, name
    assert first.tables["fetch_attempt"].rows == 3
    assert b"char(9)" in expected and b"1e999" in expected  # the tricky literals are there


def test_dump_orders_rows_by_primary_key_not_by_storage_order(
        rich: Store, tmp_path: Path) -> None:
    export(rich, tmp_path / "a")
    backup(rich, tmp_path / "copy")
    conn = apsw.Connection(str(tmp_path / "copy" / "evidence.db"))
    with conn:  # the same rows, stored in the opposite order (new rowids)
        for table, key in (("store_meta", "key"), ("crawl_session", "session_id")):
            rows = conn.execute(f"SELECT * FROM {table} ORDER BY rowid DESC").fetchall()
            triggers = conn.execute("SELECT name, sql FROM sqlite_schema WHERE type = "
                                    "'trigger' AND tbl_name = ?", (table,)).fetchall()
            for name, _sql in triggers:
                conn.execute(f"DROP TRIGGER {name}")
            conn.execute(f"DELETE FROM {table}")
            for row in rows:
                conn.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", row)
            for _name, sql in triggers:
                conn.execute(sql)
            assert conn.execute(f"SELECT {key} FROM {table} ORDER BY rowid").fetchall() != \
                conn.execute(f"SELECT {key} FROM {table} ORDER BY {key}").fetchall()
    conn.close()
    export(tmp_path / "copy", tmp_path / "b")
    assert dump_bytes(tmp_path / "b") == dump_bytes(tmp_path / "a")


# Any value in any column: SQLite keeps a TEXT in an INTEGER column, a BLOB in a TEXT one.
_VALUES = (st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False) | st.none()
           | st.text(st.characters(codec="utf-8"), max_size=8) | st.binary(max_size=6)
           | st.sampled_from(["it's", "a\tb", "\x00", "\u2028", "''", "\x7f"]))


_TEXTS = (st.text(st.characters(min_codepoint=32, max_codepoint=126) | st.sampled_from(
    "é\u2028\U0001f600"), max_size=8) | st.text(st.characters(codec="utf-8"), max_size=8)
    | st.sampled_from(["it's", "a\tb", "\x00", "''", "\x7f", "\x85"]))
_FLOATS = st.floats(allow_nan=False) | st.sampled_from([-0.0, 1e16, 5e-324, 1e999, -1e999])
_INTEGERS = st.integers(-2**63, 2**63 - 1)
# A row of the table below: each column's declared type (NULL where it may be), or that
# with one value of any type in any column.
_TYPED = (_INTEGERS | st.none(), _TEXTS | st.none(), st.binary(max_size=6) | st.none(),
          _FLOATS | st.none(), _TEXTS | st.none(), _VALUES, _INTEGERS, _FLOATS, _TEXTS,
          st.binary(max_size=6), _VALUES)


@st.composite
def _rows(draw: st.DrawFn) -> tuple:
    row = list(draw(st.tuples(*_TYPED)))
    if draw(st.booleans()):
        row[draw(st.integers(0, len(row) - 1))] = draw(_VALUES)
    return tuple(row)


@settings(max_examples=80, deadline=None)
@given(st.lists(_rows(), max_size=6))
def test_any_values_in_any_declared_column_dump_as_sql_literal_spells_them(rows) -> None:
    """The dump spells a row whose values all have their columns' declared types in place
    (export._sql_lines); whatever a column holds, NULL or not, each line is the INSERT
    that sql_literal spells value by value."""
    conn = apsw.Connection(":memory:")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b TEXT, c BLOB, "
                 "d REAL, e VARCHAR(9), f, g INTEGER NOT NULL DEFAULT 0, "
                 "h DOUBLE NOT NULL, i TEXT NOT NULL, j BLOB NOT NULL, k NUMERIC)")
    for i, row in enumerate(rows):
        conn.execute("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, coalesce(?, 0), "
                     "coalesce(?, 0.5), coalesce(?, ''), coalesce(?, x''), ?)", (i, *row))
    with tempfile.TemporaryDirectory() as scratch:
        out = Output(Path(scratch))
        dump(conn, out)
        out.finish()
        text = (Path(scratch) / "dump.sql").read_text(encoding="utf-8")
    stored = conn.execute("SELECT * FROM t ORDER BY id").fetchall()
    want = "".join("INSERT INTO t VALUES(" + ",".join(sql_literal(v) for v in row) + ");\n"
                   for row in stored)
    body = text.split("-- @section table t\n", 1)[1].split("-- @end\n", 1)[0]
    assert body == want


@pytest.mark.parametrize(("edit", "what"), [
    ("UPDATE ingest_ledger SET payload = CAST(payload || x'00' AS BLOB) WHERE log_index = 3",
     "does not hash to its stored leaf hash"),
    ("DELETE FROM ingest_ledger WHERE log_index = 2", "leaf 2 is missing (next is 3)"),
    ("UPDATE commit_log SET root = zeroblob(32) WHERE batch_seq = 2", "batch 2: recomputed"),
    ("INSERT INTO ingest_ledger (log_index, message_id, kind, payload_hash, leaf_hash, "
     "payload, batch_seq, received_at) SELECT log_index + 1000, message_id || 'x', kind, "
     "payload_hash, leaf_hash, payload, batch_seq, received_at FROM ingest_ledger "
     "WHERE log_index = 0", "leaf 1000 is beyond the last committed tree size"),
    ("UPDATE ingest_ledger SET batch_seq = 1 WHERE log_index = 4", "leaf 4 says batch 1"),
    ("", None),
])
def test_the_log_check_read_with_the_dump_finds_what_check_log_finds(
        rich: Store, tmp_path: Path, edit: str, what: str | None) -> None:
    """The export checks the log from the ledger rows its dump reads (one pass): its
    manifest's log head and log gaps are those of check_log over the same store."""
    backup(rich, tmp_path / "copy")
    conn = apsw.Connection(str(tmp_path / "copy" / "evidence.db"))
    for trigger in ("ingest_ledger_no_update", "ingest_ledger_no_delete",
                    "commit_log_no_update"):
        conn.execute(f"DROP TRIGGER {trigger}")
    if edit:
        conn.execute(edit)
    manifest = export(tmp_path / "copy", tmp_path / "a")
    head, gaps = describe_log(conn, check_log(conn))
    conn.close()
    assert manifest.log == head
    assert [g for g in manifest.gaps if g.kind == "log"] == sorted(gaps)
    assert head.verified == (what is None)
    assert what is None or any(what in finding for finding in head.findings), head.findings


def test_an_export_reads_the_ledger_s_payloads_once(
        rich: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log check takes the rows the dump reads: one pass over the ledger, where
    check_log read every payload a second time (the statements SQLite ran, traced)."""
    statements: list[str] = []

    def trace(conn: apsw.Connection) -> None:
        def record(_cursor: apsw.Cursor, sql: str, _bindings: object) -> bool:
            statements.append(sql)
            return True
        conn.exec_trace = record

    monkeypatch.setattr(apsw, "connection_hooks", [*apsw.connection_hooks, trace])
    export(rich, tmp_path / "a")
    reads = [s for s in statements if re.search(r"\bpayload\b.* FROM ingest_ledger", s)]
    assert len(reads) == 1, reads


def test_dump_has_no_date_host_or_path_of_the_export(rich: Store, tmp_path: Path) -> None:
    export(rich, tmp_path / "a")
    head = dump_bytes(tmp_path / "a").split(b"-- @section schema")[0].decode()
    assert head == ("-- evidence canonical dump, format 1\n-- scope: store\n"
                    "PRAGMA foreign_keys=OFF;\nBEGIN TRANSACTION;\n")
    assert str(tmp_path).encode() not in (tmp_path / "a" / "manifest.json").read_bytes()


def test_manifest_counts_section_hashes_root_and_artifacts_are_correct(
        rich: Store, tmp_path: Path) -> None:
    manifest = export(rich, tmp_path / "a")
    data = dump_bytes(tmp_path / "a")
    conn = rich.connection
    sections = [manifest.schema, *manifest.tables.values()]
    # The sections tile the file between the fixed header and the trailer, in order.
    assert sections[0].offset == data.index(b"-- @section schema")
    for before, after in itertools.pairwise(sections):
        assert before.offset + before.bytes == after.offset
    assert data[sections[-1].offset + sections[-1].bytes:] == b"-- @end\nCOMMIT;\n"
    for name, section in manifest.tables.items():
        piece = data[section.offset:section.offset + section.bytes]
        assert blake3.blake3(piece).hexdigest() == section.blake3
        assert piece.startswith(f"-- @section table {name}\n".encode())
        assert section.rows == conn.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0]
        assert piece.count(b"\n") == section.rows + 1  # one line per row
    assert manifest.files["dump.sql"].blake3 == blake3.blake3(data).hexdigest()
    size, root, findings = check_log(conn)
    assert (manifest.log.tree_size, manifest.log.root, manifest.log.verified) == (
        size, root.hex(), True) and not findings
    assert manifest.store_id == rich.store_id and manifest.schema_version == rich.schema_version
    assert [r.run_id for r in manifest.runs] == ["r1", "r2"]
    assert [(s.session_id, s.outcome) for s in manifest.sessions] == [("s1", "completed"),
                                                                      ("s2", None)]
    assert {(g.kind, g.subject) for g in manifest.gaps} == {("session_open", "s2"),
                                                            ("run_not_completed", "r2")}
    rows = sorted(conn.execute("SELECT namespace, digest, size FROM artifact"))
    artifacts = tmp_path / "a" / "artifacts"
    assert sorted(p.name for p in artifacts.iterdir()) == ["index.tsv", "segment-000000"]
    lines = (artifacts / "index.tsv").read_text().splitlines()
    assert lines[0] == "namespace\tdigest\tsize\tsegment\toffset"
    indexed = [tuple(line.split("\t")) for line in lines[1:]]
    assert [(ns, d, int(n)) for ns, d, n, _s, _o in indexed] == rows  # sorted, each once
    segment, offset = (artifacts / "segment-000000").read_bytes(), 0
    for _ns, digest, size, _segment, at in indexed:  # back to back, each its own digest
        assert int(at) == offset and blake3.blake3(
            segment[offset:offset + int(size)]).hexdigest() == digest
        offset += int(size)
    assert offset == len(segment) and manifest.artifacts == len(rows) == 3
    for name in ("artifacts/index.tsv", "artifacts/segment-000000"):  # the manifest vouches
        assert manifest.files[name].blake3 == blake3.blake3(
            (tmp_path / "a" / name).read_bytes()).hexdigest()
    assert manifest.format_version == 2


def test_jsonl_and_csv_exports_have_the_same_rows_in_the_same_order_as_sql(
        rich: Store, tmp_path: Path) -> None:
    sql = export(rich, tmp_path / "sql")
    jsonl = export(rich, tmp_path / "jsonl", format="jsonl")
    as_csv = export(rich, tmp_path / "csv", format="csv")
    conn = apsw.Connection(":memory:")
    conn.execute((tmp_path / "sql" / "dump.sql").read_text())
    for table, section in sql.tables.items():
        rows = conn.execute(f"SELECT * FROM {table}").fetchall()  # load order = dump order
        objects = [json.loads(line) for line in
                   (tmp_path / "jsonl" / "tables" / f"{table}.jsonl").read_text().splitlines()]
        with open(tmp_path / "csv" / "tables" / f"{table}.csv", newline="") as handle:
            records = list(csv.reader(handle))[1:]
        assert len(objects) == len(records) == len(rows) == section.rows
        assert jsonl.tables[table].rows == as_csv.tables[table].rows == section.rows
        for row, obj, record in zip(rows, objects, records, strict=True):
            assert list(obj) == [c[0] for c in conn.execute(
                f"SELECT name FROM pragma_table_info('{table}')")]
            for value, jvalue, cvalue in zip(row, obj.values(), record, strict=True):
                expected = value.hex() if isinstance(value, bytes) else value
                if isinstance(value, float) and math.isinf(value):
                    expected = "Infinity"
                assert jvalue == expected
                assert cvalue == ("" if value is None else str(expected))
    assert jsonl.schema.blake3 == sql.schema.blake3 == as_csv.schema.blake3


def test_literals_have_one_spelling_and_round_trip_through_sqlite(tmp_path: Path) -> None:
    assert [sql_literal(v) for v in (-0.0, math.inf, -math.inf, 0.1, 1e16, None, -5,
                                     b"\x00\xff", "a'b\n\x01c", "")] == [
        "-0.0", "1e999", "-1e999", "0.1", "1e+16", "NULL", "-5", "X'00ff'",
        "'a''b'||char(10,1)||'c'", "''"]
    values = [-0.0, 0.0, math.inf, -math.inf, 5e-324, 1.7976931348623157e308, 0.1, 1 / 3,
              2**63 - 1, -(2**63), "", "'", TRICKY, "\x00", "é\u2028", b"", b"\x00'\xff",
              None]
    source = apsw.Connection(str(tmp_path / "source.db"))
    source.execute("CREATE TABLE loose (v); CREATE TABLE typed (k INTEGER PRIMARY KEY, v ANY) "
                   "STRICT; CREATE TABLE keyless (a, b)")
    for i, v in enumerate(values):
        source.execute("INSERT INTO loose VALUES (?); INSERT INTO typed VALUES (?, ?); "
                       "INSERT INTO keyless VALUES (?, ?)", (v, i, v, len(values) - i, v))
    out = Output(tmp_path / "d1")
    dump(source, out)
    files = out.finish()
    loaded = load_dump(tmp_path / "d1" / "dump.sql", tmp_path / "loaded.db")
    for table in ("loose", "typed", "keyless"):
        a = source.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
        b = loaded.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
        assert [[(type(x), repr(x)) for x in r] for r in sorted(a, key=repr)] == \
            [[(type(x), repr(x)) for x in r] for r in sorted(b, key=repr)]
    again = Output(tmp_path / "d2")
    dump(loaded, again)
    assert again.finish() == files
    assert (tmp_path / "d2" / "dump.sql").read_bytes() == \
        (tmp_path / "d1" / "dump.sql").read_bytes()


def test_run_export_holds_exactly_the_run_and_what_it_references(
        rich: Store, tmp_path: Path) -> None:
    manifest = export(rich, tmp_path / "r2", run_id="r2")
    conn = apsw.Connection(":memory:")
    conn.execute(dump_bytes(tmp_path / "r2").decode())
    one = lambda sql: {r[0] for r in conn.execute(sql)}  # noqa: E731
    assert one("SELECT run_id FROM crawl_run") == one("SELECT DISTINCT run_id FROM "
                                                      "fetch_attempt") == {"r2"}
    assert one("SELECT session_id FROM crawl_session") == {"s1", "s2"}  # s1 is the baseline
    assert not conn.execute("PRAGMA foreign_key_check").fetchall()
    kinds = [k for (k,) in conn.execute("SELECT kind FROM ingest_ledger ORDER BY log_index")]
    assert kinds == ["session_started", "session_ended", "session_started", "run_started",
                     "fetch_attempt", "fetch_attempt", "discovery", "rule_evaluated"]
    assert one("SELECT batch_seq FROM commit_log") == one("SELECT batch_seq FROM ingest_ledger")
    assert one("SELECT fetch_key FROM url_identity") == {
        "http://example.com/t", "http://example.com/down", "http://example.com/x",
        "http://example.com/"}
    assert manifest.artifacts == 2 and manifest.run_id == "r2"
    assert manifest.quarantined == 0  # the quarantined conflict belongs to r1
    # Tables of later migrations: by their run_id column, by what the run's rows reference
    # (dns_resolution: its attempts' resolutions), or left empty and listed.
    later = [t for t in manifest.tables if t not in TABLE_ORDER]
    run_scoped = {t for t in later if ("run_id",) in conn.execute(
        "SELECT name FROM pragma_table_info(?)", (t,)).fetchall()}
    assert set(manifest.excluded_tables) == set(later) - run_scoped - {"dns_resolution"}
    assert {"frontier", "host_state"} <= set(manifest.excluded_tables)
    assert all(manifest.tables[t].rows == 0 for t in manifest.excluded_tables)
    restored = restore(tmp_path / "r2", tmp_path / "restored")
    assert restored.run_id == "r2"
    assert [f.split(":")[0] for f in restored.findings] == [
        "known gap, run_not_completed", "known gap, session_open"]
    export(tmp_path / "restored", tmp_path / "again", run_id="r2")
    assert dump_bytes(tmp_path / "again") == dump_bytes(tmp_path / "r2")


def test_gaps_record_missing_artifacts_and_restore_carries_them(
        store: Store, make: Factory, tmp_path: Path) -> None:
    body = make.body(b"soon gone")
    submit_all(store, [make.session(), make.run(), make.attempt(body=body)])
    lose_payload(store, body)
    manifest = export(store, tmp_path / "a")
    assert ("artifact_missing", f"body/{body.digest}") in {(g.kind, g.subject)
                                                           for g in manifest.gaps}
    assert ("run_not_completed", "r1") in {(g.kind, g.subject) for g in manifest.gaps}
    report = restore(tmp_path / "a", tmp_path / "restored")
    assert any("artifact_missing" in f for f in report.findings)
    with pytest.raises(StoreError, match="no evidence store here"):
        export(tmp_path / "nowhere", tmp_path / "b")


# --- online backup ---------------------------------------------------------------------------

@pytest.mark.anyio
async def test_backup_while_a_writer_commits_continuously_is_verified_and_complete(
        store: Store, make: Factory, tmp_path: Path) -> None:
    async with Writer(store) as writer:
        await writer.submit(make.session())
        await writer.submit(make.run())
        committed, during = 0, threading.Event()
        stop = anyio.Event()
        written_at_copy: list[int] = []

        def hold(phase: str, done: int, total: int) -> None:
            # After the snapshot, before and while artifacts are copied, make sure the writer
            # has committed rows (with new artifacts) that the snapshot does not hold.
            if phase == "artifacts" and not written_at_copy:
                written_at_copy.append(committed)
                assert during.wait(10)

        async def write() -> None:
            nonlocal committed
            i = 0
            while not stop.is_set():
                body = await anyio.to_thread.run_sync(make.body, f"page {i}".encode())
                ack = await writer.submit(make.attempt(f"http://example.com/{i}", body=body))
                assert ack.status == "committed"
                committed, i = committed + 1, i + 1
                if written_at_copy and committed >= written_at_copy[0] + 20:
                    during.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            while committed < 30:
                await anyio.sleep(0.01)
            report = await anyio.to_thread.run_sync(
                lambda: backup(store, tmp_path / "backup", progress=hold))
            stop.set()
    assert report.findings == []
    assert 30 <= report.tables["fetch_attempt"] < committed
    with Store.open(tmp_path / "backup") as copy:
        refs = copy.connection.execute("SELECT namespace, digest, size FROM artifact").fetchall()
        assert len(refs) == report.artifacts == report.tables["fetch_attempt"]  # one body each
        for namespace, digest, size in refs:
            copy.artifacts.verify(ArtifactRef(namespace, digest, size))  # present, same bytes
        size, root, findings = check_log(copy.connection)
        assert not findings and (size, root.hex()) == (report.tree_size, report.root)
        assert copy.connection.execute("PRAGMA journal_mode").fetchall() == [("wal",)]
    assert json.loads((tmp_path / "backup" / "backup.json").read_text())["findings"] == []


@pytest.mark.anyio
async def test_snapshot_steps_read_one_state_while_the_writer_commits_between_them(
        store: Store, make: Factory, tmp_path: Path) -> None:
    body = make.body()
    async with Writer(store) as writer:
        await writer.submit(make.session())
        await writer.submit(make.run())
        for i in range(300):  # enough pages for many one-page steps
            await writer.submit(make.attempt(f"http://example.com/{i}", body=body))
        before = store.connection.execute("SELECT count(*) FROM fetch_attempt").fetchall()
        steps: list[int] = []

        def between_steps(phase: str, done: int, total: int) -> None:
            steps.append(done)
            assert len(steps) <= total, "the copy restarted: the steps saw different states"
            ack = anyio.from_thread.run(writer.submit, make.attempt(
                f"http://example.com/x{done}", body=body))
            assert ack.status == "committed"

        pages = await anyio.to_thread.run_sync(lambda: copy_snapshot(
            store.db_path, tmp_path / "copy.db", step_pages=1, progress=between_steps))
    assert pages == len(steps) > 10  # the writer committed between every step
    copy = apsw.Connection(str(tmp_path / "copy.db"))
    assert copy.execute("SELECT count(*) FROM fetch_attempt").fetchall() == before
    assert copy.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert not check_log(copy)[2]


# --- restore ---------------------------------------------------------------------------------

def test_restore_into_a_non_empty_target_is_refused_and_leaves_it_alone(
        populated_store: Store, tmp_path: Path) -> None:
    export(populated_store, tmp_path / "a")
    target = tmp_path / "occupied"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(StoreError, match="is not empty"):
        restore(tmp_path / "a", target)
    assert [p.name for p in target.iterdir()] == ["keep.txt"]
    with pytest.raises(StoreError, match="keep.txt is a file; refusing to replace it"):
        restore(tmp_path / "a", target / "keep.txt")
    (target / "keep.txt").unlink()
    assert restore(tmp_path / "a", target).tables["fetch_attempt"] == 1  # empty dir: fine


def _tamper(archive: Path, old: bytes, new: bytes, *, fix_file_hash: bool) -> None:
    path = archive / "dump.sql"
    data = path.read_bytes()
    assert data.count(old) == 1
    data = data.replace(old, new)
    path.write_bytes(data)
    if fix_file_hash:
        manifest = json.loads((archive / "manifest.json").read_text())
        manifest["files"]["dump.sql"] = {"bytes": len(data),
                                         "blake3": blake3.blake3(data).hexdigest()}
        (archive / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(("old", "new", "fix", "message"), [
    (b"'http://example.com/a')", b"'http://example.com/A')", False, "does not match its "
     "manifest"),
    (b"'http://example.com/a')", b"'http://example.com/A')", True, "table url_identity"),
    (b"-- @end\n", b"ATTACH 'elsewhere.db' AS x;\n-- @end\n", True, "does not load"),
    (b"-- @end\n", b"DELETE FROM store_meta;\n-- @end\n", True, "does not load"),
])
def test_restore_refuses_an_archive_that_does_not_match_its_manifest(
        populated_store: Store, tmp_path: Path, old: bytes, new: bytes, fix: bool,
        message: str) -> None:
    export(populated_store, tmp_path / "a")
    _tamper(tmp_path / "a", old, new, fix_file_hash=fix)
    with pytest.raises(CorruptStoreError, match=message):
        restore(tmp_path / "a", tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    assert not (tmp_path / "elsewhere.db").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "store"]  # no partial build


def test_restore_checks_artifacts_against_their_digests(
        populated_store: Store, tmp_path: Path) -> None:
    export(populated_store, tmp_path / "a")
    segment = tmp_path / "a" / "artifacts" / "segment-000000"
    data = segment.read_bytes()
    assert data.count(b"<html>hello</html>") == 1
    segment.write_bytes(data.replace(b"<html>hello</html>", b"<html>HELLO</html>"))
    with pytest.raises(CorruptStoreError, match="artifact_corrupt"):
        restore(tmp_path / "a", tmp_path / "restored")


def test_an_archive_of_format_1_still_restores_and_compares_equal(
        populated_store: Store, tmp_path: Path) -> None:
    """An archive an older evidence wrote (one file per payload) is read as before."""
    export(populated_store, tmp_path / "a")
    as_format_1(tmp_path / "a")
    assert read_manifest(tmp_path / "a").format_version == 1
    assert not (tmp_path / "a" / "artifacts" / "index.tsv").exists()
    report = restore(tmp_path / "a", tmp_path / "restored")
    assert report.artifacts == 1 and "1 artifacts re-hashed" in report.checks
    assert compare(populated_store, tmp_path / "a", full=True).equal
    with Store.open(tmp_path / "restored") as restored:
        assert verify(restored, full=True).ok


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bodies=st.lists(st.binary(max_size=40), max_size=12),
       namespaces=st.lists(st.sampled_from(["body", "b", "b-", "headers", "dom"]),
                           min_size=12, max_size=12),  # a namespace a prefix of another
       limit=st.integers(1, 120), seed=st.randoms(use_true_random=False))
def test_any_set_of_payloads_in_any_order_writes_the_same_segments_and_reads_back(
        bodies: list[bytes], namespaces: list[str], limit: int, seed) -> None:
    """Segments depend on the set of payloads and the limit alone (never on the order the
    rows name them); every payload reads back from them; no segment passes the limit
    unless one payload alone does; the ranges tile the segments."""
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        source = ArtifactStore(work / "src", max_payload=2**20)
        refs = [source.put(ns, body) for ns, body in zip(namespaces, bodies, strict=False)]
        shuffled = refs + refs[:2]  # a payload named twice is written once
        seed.shuffle(shuffled)
        outputs = []
        for name, order in (("a", refs), ("b", shuffled)):
            files, gaps = write_payloads(order, source, work / name, segment_bytes=limit)
            assert gaps == []
            outputs.append({n: (work / name / n).read_bytes() for n in sorted(files)})
        assert outputs[0] == outputs[1]
        held = ArchivePayloads(work / "a")
        assert held.refs() == sorted(set(refs), key=lambda r: (r.namespace, r.digest))
        for ref in refs:
            held.verify(ref)
            with held.open(ref) as handle:
                assert handle.read() == source.read(ref)
        held.close()
        segments = {n: d for n, d in outputs[0].items() if n.startswith("segment-")}
        assert sum(map(len, segments.values())) == sum(r.size for r in set(refs))
        sizes = {r.size for r in refs}
        assert all(len(d) <= max(limit, *sizes) for d in segments.values())
        source.close()


def test_payloads_of_a_local_source_are_read_on_the_exporting_thread(tmp_path: Path) -> None:
    """A local store's reads wait for no network: no read-ahead threads, which cost more
    CPU than the reads (docs/archives.md); the archive's payloads are the same."""
    source = ArtifactStore(tmp_path / "src", max_payload=2**20)
    refs = [source.put("body", f"page {i}".encode()) for i in range(5)]
    readers: set[str] = set()
    opened = source.open

    def open_noting_the_thread(ref, **kwargs):  # the real read, its thread noted
        readers.add(threading.current_thread().name)
        return opened(ref, **kwargs)

    source.open = open_noting_the_thread  # type: ignore[method-assign]
    _files, gaps = write_payloads(refs, source, tmp_path / "out")
    assert gaps == [] and readers == {threading.current_thread().name}
    held = ArchivePayloads(tmp_path / "out")
    for i, ref in enumerate(refs):
        with held.open(ref) as handle:
            assert handle.read() == f"page {i}".encode()
    held.close()
    source.close()


def test_export_records_a_corrupt_payload_as_a_gap_and_leaves_it_out(
        populated_store: Store, tmp_path: Path) -> None:
    (body,) = [r for r in populated_store.artifacts.iter_refs() if r.namespace == "body"]
    flip_payload_byte(populated_store, body)
    manifest = export(populated_store, tmp_path / "a")
    assert [(g.kind, g.subject) for g in manifest.gaps if g.kind.startswith("artifact")] == [
        ("artifact_corrupt", f"body/{body.digest}")]
    artifacts = tmp_path / "a" / "artifacts"  # its only payload left out: no segment
    assert [p.name for p in artifacts.iterdir()] == ["index.tsv"]
    assert (artifacts / "index.tsv").read_text() == "namespace\tdigest\tsize\tsegment\toffset\n"



def test_a_pack_cut_short_under_an_export_is_a_gap_that_says_its_size(
        tmp_path: Path) -> None:
    """A pack store's payloads are read through each pack mapped once (``read_each``): a
    record the pack no longer holds whole is the gap a read of it gives (its size against
    its reference's), never bytes that merely fail to hash."""
    with Store.create(tmp_path / "store", artifact_layout="packs") as store:
        make = Factory(store)
        body = store.artifacts.put("body", b"<p>" + b"x" * 500 + b"</p>")
        submit_all(store, [make.session(), make.run(),
                           make.attempt("http://example.com/", body=body)])
        path, start = payload_place(store, body)
        path.chmod(0o644)
        with open(path, "r+b") as handle:  # after the store indexed it: mid-payload
            handle.truncate(start + 100)
        manifest = export(store, tmp_path / "a")
    (gap,) = [g for g in manifest.gaps if g.kind.startswith("artifact")]
    assert (gap.kind, gap.subject) == ("artifact_corrupt", f"body/{body.digest}")
    assert f"is 100 bytes, its reference says {body.size}" in gap.detail


@pytest.mark.parametrize("share", ["all", "few"])
def test_reading_each_payload_of_a_pack_store_answers_what_reading_it_does(
        tmp_path: Path, share: str) -> None:
    """``read_each`` (export's payloads: each pack mapped once; every ref located in one
    pass over the index, or, for a few of many, one by one) gives each ref's bytes as
    ``read`` does, the error ``read`` raises for a ref whose size is not its record's, and
    None for one to read on its own (too large, or in no pack)."""
    packs = PackStore(tmp_path / "artifacts", pack_bytes=4096)  # several packs
    refs = [packs.put("body", f"page {i} ".encode() * (i + 1)) for i in range(100)]
    asked = refs if share == "all" else refs[::25]  # one pass, or one by one (_FEW_REFS)
    wrong = ArtifactRef(asked[0].namespace, asked[0].digest, asked[0].size + 1)
    absent = ArtifactRef("body", "0" * 64, 3)
    large = max(asked, key=lambda r: r.size)
    answers = dict(packs.read_each([*asked, wrong, absent], most=large.size - 1))
    for ref in asked:
        assert answers[ref] == (None if ref == large else packs.read(ref))
    with pytest.raises(ArtifactCorruptError) as raised:
        packs.read(wrong)
    assert str(answers[wrong]) == str(raised.value)
    assert answers[absent] is None
    packs.close()


# --- compare ---------------------------------------------------------------------------------

def test_compare_finds_and_locates_a_single_changed_row(rich: Store, tmp_path: Path) -> None:
    backup(rich, tmp_path / "copy")
    conn = apsw.Connection(str(tmp_path / "copy" / "evidence.db"))
    (trigger,) = conn.execute("SELECT sql FROM sqlite_schema "
                              "WHERE name = 'fetch_attempt_no_update'").fetchall()[0]
    conn.execute("DROP TRIGGER fetch_attempt_no_update")
    conn.execute("UPDATE fetch_attempt SET http_status = 500 WHERE http_status = 404")
    conn.execute(trigger)  # the same schema again: only the row differs
    conn.close()
    result = compare(rich, tmp_path / "copy")
    assert not result.equal
    seq = rich.connection.execute(
        "SELECT attempt_seq FROM fetch_attempt WHERE http_status = 404").fetchall()[0][0]
    found = {(d.what, d.name, d.key, d.a, d.b) for d in result.differences}
    assert ("row", "fetch_attempt", f"attempt_seq={seq}", "http_status=404",
            "http_status=500") in found
    assert ("report", "pages_per_status_per_run", "r2, response, 404", "1", None) in found
    assert ("report", "pages_per_status_per_run", "r2, response, 500", None, "1") in found
    assert {(d.what, d.name, d.key) for d in result.differences} == {
        ("table", "fetch_attempt", ""), ("run", "r2", "fetch_attempt"),
        ("row", "fetch_attempt", f"attempt_seq={seq}"),
        ("report", "pages_per_status_per_run", "r2, response, 404"),
        ("report", "pages_per_status_per_run", "r2, response, 500")}


def test_compare_is_equal_for_a_restored_copy_and_its_archive(
        rich: Store, tmp_path: Path) -> None:
    export(rich, tmp_path / "a")
    restore(tmp_path / "a", tmp_path / "restored")
    for a, b in ((rich, tmp_path / "restored"), (tmp_path / "a", rich.path),
                 (tmp_path / "a", tmp_path / "restored")):
        result = compare(a, b)
        assert result.equal and result.differences == [], result.differences
    assert result.tables >= 13 and result.runs == 2 and result.report_rows >= 5
    assert result.a.kind == "archive" and result.b.kind == "store"


def test_compare_of_two_stores_names_their_identity_and_equal_reports_stay_quiet(
        populated_store: Store, rich_second: Store) -> None:
    result = compare(populated_store, rich_second)
    names = {(d.what, d.name) for d in result.differences}
    assert ("table", "store_meta") in names  # another store: another identity
    assert ("report", "edges_per_run") not in names
    assert any(d.what == "row" and d.name == "store_meta" for d in result.differences)


@pytest.fixture
def rich_second(tmp_path: Path) -> Store:
    with Store.create(tmp_path / "second") as other:
        make = Factory(other)
        body = make.body()
        attempt = make.attempt(body=body)
        submit_all(other, [make.session(), make.run(), attempt,
                           make.discovery(attempt, body, ["http://example.com/a",
                                                          "http://example.com/b"])])
        yield other


# --- the command line ------------------------------------------------------------------------

def run_cli(*argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="evidence")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = args.func(args)
    return code, out.getvalue()


def test_cli_export_restore_compare_exit_codes_and_json(
        populated_store: Store, tmp_path: Path) -> None:
    code, text = run_cli("export", str(populated_store.path), "--out", str(tmp_path / "a"),
                         "--json")
    assert code == 0 and json.loads(text)["tables"]["fetch_attempt"]["rows"] == 1
    code, text = run_cli("restore", str(tmp_path / "a"), "--store", str(tmp_path / "r"))
    assert code == 0 and "Merkle tree size and root" in text
    code, text = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "r"), "--json")
    assert code == 0 and json.loads(text)["equal"] is True
    code, text = run_cli("backup", str(tmp_path / "r"), "--out", str(tmp_path / "b"))
    assert code == 0 and "verified" in text
    conn = apsw.Connection(str(tmp_path / "b" / "evidence.db"))
    conn.execute("UPDATE store_meta SET value = 'elsewhere' WHERE key = 'created_on'")
    conn.close()
    code, text = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert code == 1 and re.search(r"DIFF row store_meta \[key='created_on'\]", text)


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("export", "backup", "restore", "compare"):
        with pytest.raises(SystemExit) as exit_info:
            run_cli(command, "--help")
        assert exit_info.value.code == 0
        assert "usage: evidence" in capsys.readouterr().out


# --- property ----------------------------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 5), texts, texts | st.none(),
                          st.floats(min_value=0, allow_nan=False)), min_size=1, max_size=8))
def test_any_generated_messages_export_the_same_across_backup_and_restore(attempts) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with Store.create(root / "s", sync="normal") as store:
            make = Factory(store)
            messages = [make.session(), make.run()]
            for path, error, content_type, elapsed in attempts:
                messages.append(make.attempt(
                    f"http://example.com/{path}", body=make.body(error.encode()),
                    error=error, content_type=content_type, elapsed_ms=elapsed))
            messages.append(RunEnded(message_id=make.id("m"), run_id="r1", ended_at=make.now,
                                     outcome="completed", reason=attempts[0][1]))
            submit_all(store, messages)
            first = export(store, root / "a")
            backup(store, root / "b")
        restore(root / "a", root / "r")
        export(root / "r", root / "ra")
        export(root / "b", root / "ba")
        assert dump_bytes(root / "ra") == dump_bytes(root / "ba") == dump_bytes(root / "a")
        assert read_manifest(root / "ra") == first
        assert msgspec.json.encode(read_manifest(root / "ba")) == msgspec.json.encode(first)
