"""Signed checkpoints bind everything verify checks, not only the Merkle root (issue 32).

Each attack is made as someone with write access to the database would make it: the
append-only guards dropped (SQLite) or disabled (PostgreSQL) for the edit and put back, the
commit-log chain recomputed after it, so every link verifies. Then ``verify`` alone, or
``verify --checkpoint`` with a checkpoint signed before the edit, must find it; on both
backends.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import Store
from evidence._audit.checkpoints import (
    checkpoint,
    match_checkpoint,
    open_checkpoint,
    parse_checkpoint,
)
from evidence._audit.keys import SigningKey
from evidence._audit.verify import verify
from evidence._cli.main import main as cli_main
from evidence._errors import ProofError
from evidence._store.log import entry_hash

from .conftest import Factory, submit_all

BACKENDS = ["sqlite", "postgresql"]


class Raw:
    """A connection of the attacker's own to the store's database (not the store's)."""

    def __init__(self, store: Store, url: str | None) -> None:
        self.url = url
        if url is None:
            assert store.path is not None
            self.conn: Any = apsw.Connection(str(store.path / "evidence.db"))
        else:
            import psycopg

            self.conn = psycopg.connect(url, autocommit=True)

    def execute(self, sql: str, params: tuple = ()) -> list[tuple]:
        if self.url is None:
            return self.conn.execute(sql, params).fetchall()
        cursor = self.conn.execute(sql.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description else []

    @contextlib.contextmanager
    def unguarded(self, *tables: str) -> Iterator[None]:
        """The tables' triggers out of the way for the edit, and put back after it."""
        if self.url is None:
            saved = self.execute(
                "SELECT name, sql FROM sqlite_schema WHERE type = 'trigger' AND tbl_name IN "
                f"({', '.join('?' * len(tables))})", tables)
            for name, _ in saved:
                self.execute(f"DROP TRIGGER {name}")
            yield
            for _, sql in saved:
                self.execute(sql)
        else:
            for table in tables:
                self.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
            yield
            for table in tables:
                self.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")

    def rechain(self) -> None:
        """Every chain hash recomputed from the rows as they now are (what anyone who can
        write the database can do)."""
        rows = self.execute("SELECT batch_seq, first_index, tree_size, root, committed_at, "
                            "quarantined, prev_hash FROM commit_log ORDER BY batch_seq")
        prev = bytes(rows[0][6])
        for seq, first, size, root, at, quarantined, _ in rows:
            chain = entry_hash(prev, seq, first, size, bytes(root), at,
                               None if quarantined is None else bytes(quarantined))
            self.execute("UPDATE commit_log SET prev_hash = ?, entry_hash = ? "
                         "WHERE batch_seq = ?", (prev, chain, seq))
            prev = chain

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(params=BACKENDS)
def target(request, tmp_path: Path) -> Iterator[tuple[Store, Raw, str]]:
    """A store of 12 batches, the last of which quarantined a conflict: (store, the
    attacker's connection, its location for the CLI)."""
    if request.param == "sqlite":
        location, url = str(tmp_path / "st"), None
        store = Store.create(location)
    else:
        location = url = request.getfixturevalue("pg_url")
        store = Store.create(url, artifacts=str(tmp_path / "art"))
    make = Factory(store)
    sessions = [make.session(f"s{i}") for i in range(12)]
    acks = [a for m in sessions for a in submit_all(store, [m])]
    acks += submit_all(store, [msgspec.structs.replace(sessions[0], mode="incremental")])
    assert [a.status for a in acks] == ["committed"] * 12 + ["conflict"]
    raw = Raw(store, url)
    try:
        assert raw.execute("SELECT count(*) FROM commit_log") == [(13,)]
        yield store, raw, location
    finally:
        raw.close()
        store.close()


def signed(store: Store, tmp_path: Path) -> tuple[SigningKey, Path, Path]:
    """A checkpoint of the store as it is now, signed, written to files."""
    key = SigningKey.generate("example.com/crawl")
    cp = checkpoint(store, key)
    note, pub = tmp_path / "cp", tmp_path / "key.pub"
    note.write_text(cp.note())
    pub.write_text(key.public_key.to_text() + "\n")
    return key, note, pub


def kinds(report) -> set[str]:
    return {f.kind for f in report.errors}


def test_a_checkpoint_names_the_last_batch_its_chain_and_the_legacy_rows(
        target: tuple[Store, Raw, str], tmp_path: Path, capsys) -> None:
    store, _raw, location = target
    key, note, pub = signed(store, tmp_path)
    cp = open_checkpoint(note.read_text(), key.public_key)
    assert cp.extensions[1:] == [
        f"chain 13 {cp.extensions[1].split()[2]}",
        "legacy-quarantine 0 47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="]  # SHA-256("")
    report = verify(store, checkpoint=cp)
    assert report.ok and not report.findings, report.findings
    assert report.checkpoint is not None and "through batch 13" in report.checkpoint
    assert cli_main(["verify", location, "--checkpoint", str(note), "--public-key",
                     str(pub)]) == 0
    out = capsys.readouterr().out
    assert "against  the log through batch 13" in out and "OK: no errors" in out


def test_batch_times_moved_back_two_years_are_found_by_verify_and_the_checkpoint(
        target: tuple[Store, Raw, str], tmp_path: Path, capsys) -> None:
    store, raw, location = target
    key, note, pub = signed(store, tmp_path)
    [(at,)] = raw.execute("SELECT committed_at FROM commit_log WHERE batch_seq = 10")
    moment = dt.datetime.fromisoformat(at)
    earlier = moment.replace(year=moment.year - 2).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    with raw.unguarded("commit_log", "ingest_ledger"):
        raw.execute("UPDATE commit_log SET committed_at = ? WHERE batch_seq = 10", (earlier,))
        raw.execute("UPDATE ingest_ledger SET received_at = ? WHERE batch_seq = 10", (earlier,))
        raw.rechain()
    report = verify(store)
    assert kinds(report) == {"log_time"}, report.errors  # every link and row recomputes
    [finding] = report.errors
    assert finding.location.batch_seq == 10 and "days before batch 9" in finding.message
    report = verify(store, checkpoint=open_checkpoint(note.read_text(), key.public_key))
    assert kinds(report) == {"log_time", "checkpoint_mismatch"}
    assert any("chain recomputed up to batch 13 is not the one signed" in f.message
               for f in report.errors)
    assert cli_main(["verify", location, "--checkpoint", str(note), "--public-key",
                     str(pub)]) == 1
    assert "checkpoint_mismatch" in capsys.readouterr().out


def test_a_deleted_quarantine_record_is_found_against_the_checkpoint(
        target: tuple[Store, Raw, str], tmp_path: Path, capsys) -> None:
    store, raw, location = target
    key, note, pub = signed(store, tmp_path)
    with raw.unguarded("commit_log", "quarantine"):
        raw.execute("DELETE FROM quarantine")
        raw.execute("UPDATE commit_log SET quarantined = NULL WHERE quarantined IS NOT NULL")
        raw.rechain()
    assert verify(store).ok, "no trace left in the store itself"
    report = verify(store, checkpoint=open_checkpoint(note.read_text(), key.public_key))
    assert kinds(report) == {"checkpoint_mismatch"}, report.errors
    assert cli_main(["verify", location, "--checkpoint", str(note), "--public-key",
                     str(pub)]) == 1
    out = capsys.readouterr().out
    assert "a quarantine record or the store's identity was changed" in out


def test_a_quarantine_row_in_the_pre_006_layout_is_refused_and_found(
        target: tuple[Store, Raw, str], tmp_path: Path) -> None:
    store, raw, _ = target
    key, note, _pub = signed(store, tmp_path)
    [row] = raw.execute("SELECT message_id, kind, payload_hash, payload FROM quarantine")
    forge = ("INSERT INTO quarantine (quarantine_id, received_at, message_id, kind, "
             "reason_code, reason, payload_hash, payload) VALUES (99, "
             "'2024-01-01T00:00:00.000000Z', ?, ?, 'conflict', 'invented', ?, ?)")
    with pytest.raises(Exception, match="pre-006 layout") as refused:
        raw.execute(forge, row)
    assert type(refused.value).__name__ in ("ConstraintError", "IntegrityConstraintViolation")
    with raw.unguarded("quarantine"):
        raw.execute(forge, row)
    report = verify(store)
    assert kinds(report) == {"quarantine_legacy"}, report.errors
    assert any(f.location.row_id == 99 for f in report.errors)
    # The count in store_meta raised too: the row is older than no counted record now...
    with raw.unguarded("quarantine"):
        raw.execute("UPDATE quarantine SET quarantine_id = 0 WHERE quarantine_id = 99")
    raw.execute("UPDATE store_meta SET value = '1' WHERE key = 'legacy_quarantine'")
    assert verify(store).ok, "store_meta is the operator's word"
    # ...and the checkpoint signed before binds the rows themselves.
    report = verify(store, checkpoint=open_checkpoint(note.read_text(), key.public_key))
    assert kinds(report) == {"checkpoint_mismatch"}
    assert "pre-006 layout are not the signed ones (1 now, 0 signed)" in \
        report.errors[0].message


def test_a_checkpoint_from_before_the_chain_line_checks_the_root_and_says_so(
        target: tuple[Store, Raw, str]) -> None:
    store, raw, _ = target
    key = SigningKey.generate("example.com/crawl")
    new = checkpoint(store, key)
    old = parse_checkpoint(key.sign_note("".join(new.text.splitlines(True)[:4])))
    assert old.chain is None and old.legacy is None
    report = verify(store, checkpoint=old)
    assert report.ok and {f.kind for f in report.findings} == {"checkpoint_unbound"}
    assert report.checkpoint is not None and "vouches for no commit time" in \
        report.checkpoint
    with raw.unguarded("commit_log", "quarantine"):  # what it cannot see...
        raw.execute("DELETE FROM quarantine")
        raw.execute("UPDATE commit_log SET quarantined = NULL WHERE quarantined IS NOT NULL")
        raw.rechain()
    assert verify(store, checkpoint=old).ok
    [(payload,)] = raw.execute("SELECT payload FROM ingest_ledger WHERE log_index = 3")
    with raw.unguarded("ingest_ledger"):  # ...and what it can: an accepted message
        raw.execute("UPDATE ingest_ledger SET payload = ? WHERE log_index = 3",
                    (bytes(payload).replace(b"s3", b"s9"),))
    report = verify(store, checkpoint=old)
    assert "checkpoint_mismatch" in kinds(report)
    assert any("no longer give the signed root" in f.message for f in report.errors)


def test_verify_checkpoint_usage_errors_exit_two_and_change_nothing(
        tmp_path: Path, capsys) -> None:
    with Store.create(tmp_path / "st") as store:
        submit_all(store, [Factory(store).session()])
        _key, note, pub = signed(store, tmp_path)
    other = SigningKey.generate("someone.else")
    (tmp_path / "other.pub").write_text(other.public_key.to_text())
    for argv, said in (
            (["--checkpoint", str(note)], "--checkpoint and --public-key go together"),
            (["--checkpoint", str(note), "--public-key", str(tmp_path / "other.pub")],
             "not signed by someone.else"),
            (["--checkpoint", str(tmp_path / "nope"), "--public-key", str(pub)],
             "cannot read")):
        assert cli_main(["verify", str(tmp_path / "st"), *argv]) == 2
        err = capsys.readouterr().err
        assert "Error: " in err and said in err and "Try: " in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cp", "key.pub", "other.pub", "st"]


@pytest.mark.parametrize("bad", [
    "chain 1 AAAA\n", "chain x {h}\n", "chain 1 {h}\nchain 1 {h}\n", "legacy-quarantine {h}\n"])
def test_a_malformed_binding_line_rejects_the_checkpoint(bad: str) -> None:
    key = SigningKey.generate("k")
    h = "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
    text = f"evidence/store-x\n0\n{h}\ntime 2026-01-01T00:00:00.000000Z\n" + bad.format(h=h)
    with pytest.raises(ProofError):
        parse_checkpoint(key.sign_note(text))


def test_an_empty_store_binds_its_identity(tmp_path: Path) -> None:
    with Store.create(tmp_path / "st") as store:
        key = SigningKey.generate("k")
        cp = checkpoint(store, key)
        assert cp.chain is not None and cp.chain.number == 0
        with store.snapshot() as conn:
            assert match_checkpoint(conn, cp).ok
        store.connection.execute("UPDATE store_meta SET value = 'store-other' "
                                 "WHERE key = 'store_id'")
        with store.snapshot() as conn:
            found = match_checkpoint(conn, cp)
        assert not found.ok and len(found.problems) == 2  # the origin, and the chain's start


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(readings=st.lists(st.integers(0, 10**6), min_size=1, max_size=6))
def test_any_sequence_of_clock_readings_commits_times_that_never_go_back(
        tmp_path: Path, readings: list[int]) -> None:
    """The writer records the latest time already committed when the clock reads earlier
    (a step back): commit times are the running maximum of the readings."""
    import anyio

    from evidence import Writer
    from evidence._model.messages import format_time
    from evidence._store.log import check_times
    from evidence._write.limits import WriterHooks

    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    times = [format_time(start + dt.timedelta(seconds=r)) for r in readings]
    clock = iter(times)
    with tempfile.TemporaryDirectory(dir=tmp_path) as where, \
            Store.create(Path(where) / "st") as store:
        make = Factory(store)

        async def feed() -> None:
            async with Writer(store, hooks=WriterHooks(batch_time=lambda: next(clock))) as w:
                for i in range(len(times)):
                    await w.submit(make.session(f"s{i}"))

        anyio.run(feed)
        committed = [t for (t,) in store.connection.execute(
            "SELECT committed_at FROM commit_log ORDER BY batch_seq")]
        assert committed == [max(times[:i + 1]) for i in range(len(times))]
        assert check_times(store.connection) == []
