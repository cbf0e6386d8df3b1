"""Accountable worker hosts (issue 30 point 3): who submitted what is in the ledger, under
the Merkle leaf; a host submits only the evidence of pages leased to it; a host's fault
fences that host, not the run.

The crawls here are real: a coordinator (``evidence crawl --listen``) on 127.0.0.2, honest
hosts (``evidence worker``) and a dishonest one (``tests/forgehost.py``, a process speaking
the worker protocol and lying) on their own loopback addresses, payloads in SeaweedFS.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence import Store, compare, export, restore, verify
from evidence._audit.proofs import check_proof, prove_inclusion
from evidence._crawl.hostauth import check_submission, load_hosts
from evidence._errors import EvidenceError
from evidence._model.messages import ledger_entry, split_entry
from evidence._write.limits import WriterHooks
from evidence._write.service import Service
from evidence._write.writer import Writer
from evidence.client import AsyncClient
from evidence.testing.seaweed import SeaweedS3

from .conftest import Factory, new_pg_database, new_s3_url
from .forgehost import FORGED_URL
from .test_crawl import done_pages
from .test_postgresql import clock

COORDINATOR = "127.0.0.2"
ROOT = Path(__file__).resolve().parents[1]


def _token(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def site_hosts(tmp_path: Path, seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Tokens for an honest host and a dishonest one, a hosts file naming both (one by the
    hash of its token, one by its token file), a free port on the coordinator's address."""
    for name, value in seaweed.environ.items():
        monkeypatch.setenv(name, value)
    honest = _token(tmp_path / "honest.token", "token-of-the-honest-host-0123456789")
    forger = _token(tmp_path / "forger.token", "token-of-the-forging-host-0123456789")
    digest = hashlib.sha256(b"token-of-the-honest-host-0123456789").hexdigest()
    hosts = tmp_path / "hosts.toml"
    hosts.write_text(f'[hosts.honest]\ntoken_sha256 = "{digest}"\n\n'
                     '[hosts.mallory]\ntoken_file = "forger.token"\n')
    shared = _token(tmp_path / "shared.token", "the-shared-token-of-this-test-0123456789")
    with socket.socket() as s:
        s.bind((COORDINATOR, 0))
        port = s.getsockname()[1]
    return {"tmp": tmp_path, "env": {**os.environ, **seaweed.environ}, "honest": honest,
            "forger": forger, "shared": shared, "hosts": hosts,
            "address": f"{COORDINATOR}:{port}", "store": tmp_path / "store",
            "artifacts": new_s3_url(seaweed, "accountable")}


def _start(d: dict, name: str, argv: list[str]) -> subprocess.Popen:
    log = open(d["tmp"] / f"{name}.log", "a")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT,
                            text=True, env=d["env"], cwd=ROOT)
    log.close()
    return proc


def _coordinator(d: dict, url: str, *auth: str) -> subprocess.Popen:
    return _start(d, "coordinator", [
        "-m", "evidence", "crawl", url, "--store", str(d["store"]), "--artifacts",
        d["artifacts"], "--listen", d["address"], "--workers", "2", *auth])


def _honest(d: dict, token: Path) -> subprocess.Popen:
    return _start(d, "honest", [
        "-m", "evidence", "worker", "--connect", d["address"], "--token-file", str(token),
        "--no-tls", "--bind", "127.0.0.3", "--name", "honest", "--reconnect-timeout", "30"])


def _forger(d: dict, token: Path, mode: str) -> subprocess.Popen:
    return _start(d, "forger", ["-m", "tests.forgehost", d["address"], str(token),
                                "mallory", "127.0.0.4", mode])


def _log(d: dict, name: str) -> str:
    return (d["tmp"] / f"{name}.log").read_text()


def _run(d: dict, coordinator: subprocess.Popen, forger: subprocess.Popen,
         honest_token: Path) -> None:
    """The forger takes the first lease (it is the only host), does its deed and ends;
    then the honest host joins and the crawl completes with it."""
    honest = None
    try:
        assert forger.wait(120) == 0, _log(d, "forger") + _log(d, "coordinator")
        honest = _honest(d, honest_token)
        assert coordinator.wait(180) == 0, _log(d, "coordinator")
        assert honest.wait(60) == 0, _log(d, "honest")
    finally:
        for proc in (coordinator, forger, honest):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)


def _submitters(store: Path) -> dict[str | None, int]:
    with Store.open(store, read_only=True) as s:
        return dict(s.connection.execute(
            "SELECT submitter, count(*) FROM ingest_ledger GROUP BY submitter").fetchall())


def test_a_host_that_submits_an_attempt_it_was_never_leased_is_refused_and_fenced(
        site_hosts: dict) -> None:
    from evidence._demo.site import SiteConfig, TestSite

    d = site_hosts
    with TestSite(SiteConfig(pages=12)) as site:
        coordinator = _coordinator(d, site.url, "--hosts-file", str(d["hosts"]))
        forger = _forger(d, d["forger"], "attempt")
        _run(d, coordinator, forger, d["honest"])
        reachable = site.reachable_pages()
    said = _log(d, "forger")
    assert "forger: refused: not_leased" in said, said
    assert "forger: join refused: fenced" in said, said  # its token, for the rest of the run
    log = _log(d, "coordinator")
    assert "worker host mallory submitted what it may not (an attempt for " \
        f"{FORGED_URL}, which is not leased to it); it is fenced for the rest of the run" \
        in log, log
    done = done_pages(d["store"])
    assert set(done) == reachable and all(n == 1 for n in done.values())
    with Store.open(d["store"], read_only=True) as store:
        urls = [u for (u,) in store.connection.execute("SELECT url FROM fetch_attempt")]
        assert FORGED_URL not in urls
        assert verify(store, full=True).ok
    by = _submitters(d["store"])
    assert set(by) == {None, "honest"} and by["honest"] >= 12, by
    live = json.loads((d["store"] / "live-stats.json").read_text())
    assert live["hosts_fenced"] == {"mallory": 1}, live


def test_a_forged_failed_frame_fences_only_that_host_and_the_crawl_goes_on(
        site_hosts: dict) -> None:
    """Without a hosts file (one shared token): the forger answers its lease with Failed;
    that page goes to the honest host, and the run completes."""
    from evidence._demo.site import SiteConfig, TestSite

    d = site_hosts
    with TestSite(SiteConfig(pages=8)) as site:
        coordinator = _coordinator(d, site.url, "--token-file", str(d["shared"]))
        forger = _forger(d, d["shared"], "failed")
        _run(d, coordinator, forger, d["shared"])
        reachable = site.reachable_pages()
    assert "forger: channel ended" in _log(d, "forger")
    log = _log(d, "coordinator")
    assert "failed a page (forged failure); it is fenced" in log, log
    assert "run failed" not in log
    done = done_pages(d["store"])
    assert set(done) == reachable and all(n == 1 for n in done.values())
    by = _submitters(d["store"])  # the channel's name: its source address
    assert {k for k in by if k} == {"worker host 127.0.0.3 #2"}, by


def test_the_run_fails_for_want_of_hosts_only_when_the_operator_said_so(
        site_hosts: dict) -> None:
    """--fail-when-no-hosts 2: the only host is fenced (a forged Failed) and none comes;
    the run fails two seconds later, naming why. (Without it the run waits: the test
    above, whose honest host comes only after the forger is gone.)"""
    from evidence._demo.site import SiteConfig, TestSite

    d = site_hosts
    with TestSite(SiteConfig(pages=4)) as site:
        coordinator = _coordinator(d, site.url, "--token-file", str(d["shared"]),
                                   "--fail-when-no-hosts", "2")
        forger = _forger(d, d["shared"], "failed")
        try:
            assert forger.wait(120) == 0, _log(d, "forger")
            assert coordinator.wait(120) != 0
        finally:
            for proc in (coordinator, forger):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
    log = _log(d, "coordinator")
    assert "no worker host has served the run for 2 s (the last one (worker host " \
        "127.0.0.4 #1) failed a page (forged failure): fenced)" in log, log


def test_cross_check_records_that_a_host_altered_the_bytes_it_fetched(
        site_hosts: dict) -> None:
    """The only host stores every body with 'Page' replaced by 'Fake'; with --cross-check
    1.0 the coordinator fetches each of its pages again and records the mismatch."""
    from evidence._demo.site import SiteConfig, TestSite

    d = site_hosts
    with TestSite(SiteConfig(pages=6)) as site:
        coordinator = _coordinator(d, site.url, "--token-file", str(d["shared"]),
                                   "--cross-check", "1.0")
        forger = _forger(d, d["shared"], "alter")
        try:
            assert coordinator.wait(180) == 0, _log(d, "coordinator")
            assert forger.wait(60) == 0, _log(d, "forger")
        finally:
            for proc in (coordinator, forger):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
        reachable = site.reachable_pages()
    assert "altered" in _log(d, "forger")
    with Store.open(d["store"], read_only=True) as store:
        rows = store.connection.execute(
            "SELECT a.url, r.verdict, r.details, a.attempt_id, l.submitter "
            "FROM rule_evaluation r "
            "JOIN fetch_attempt a ON a.attempt_seq = r.attempt_seq "
            "JOIN ingest_ledger l ON l.log_index = a.log_index "
            "WHERE r.rule_id = 'evidence.cross-check'").fetchall()
        fetched = {url for (url,) in store.connection.execute(
            "SELECT a.url FROM fetch_attempt a JOIN ingest_ledger l "
            "ON l.log_index = a.log_index WHERE l.submitter IS NOT NULL "
            "AND a.outcome = 'response'")}
        assert verify(store, full=True).ok
    verdicts = {url: verdict for url, verdict, *_ in rows}
    assert len(rows) == len(verdicts) and set(verdicts) == fetched  # each checked once
    pages = {site.url.rstrip("/") + p for p in reachable if p.startswith("/p/")}
    assert pages and all(verdicts[url] == "fail" for url in pages), verdicts
    for url, verdict, details, _attempt, submitter in rows:
        said = json.loads(details)
        assert submitter is None  # the coordinator's own fetch
        assert said["host"] == "worker host 127.0.0.4 #1"
        assert said["status"] == said["host_status"]
        assert (said["host_content"] == said["content"]) == (verdict == "pass"), url
    assert "the content differs" in _log(d, "coordinator")


# --- the identity in the ledger, its proofs and its archives ------------------------------

def _groups(make: Factory) -> list[list]:
    """A session and run, then two attempts (never requested: no payloads to copy)."""
    def attempt(url: str) -> object:
        return make.attempt(url, outcome="skipped", http_status=None, error="not allowed")

    return [[make.session(), make.run()], [attempt("http://127.0.0.1:9/a")],
            [attempt("http://127.0.0.1:9/b")]]


async def _feed(store: Store, groups: list[list], submitters: list[str | None]) -> None:
    async with Writer(store, hooks=WriterHooks(batch_time=clock())) as writer:
        for group, by in zip(groups, submitters, strict=True):
            acks = await writer.submit_group(group, submitter=by)
            assert {a.status for a in acks} == {"committed"}, acks


@pytest.mark.anyio
async def test_the_submitter_is_under_the_leaf_in_proofs_and_in_archives_on_both_backends(
        tmp_path: Path, pg_cluster) -> None:
    with Store.create(tmp_path / "a"):
        pass
    export(tmp_path / "a", tmp_path / "empty")
    pg = new_pg_database(pg_cluster)
    restore(tmp_path / "empty", pg, artifacts=tmp_path / "b-artifacts")
    with Store.open(tmp_path / "a") as a, Store.open(pg) as b:
        groups = _groups(Factory(a))
        by = [None, "host-a", "host-b"]
        await _feed(a, groups, by)
        await _feed(b, groups, by)
        ma, mb = export(a, tmp_path / "xa"), export(b, tmp_path / "xb")
        dump = (tmp_path / "xa" / "dump.sql").read_bytes()
        assert dump == (tmp_path / "xb" / "dump.sql").read_bytes()
        assert b"'host-a'" in dump and b"'host-b'" in dump
        assert ma.log.root == mb.log.root
        attempt_id = groups[1][0].attempt_id
        proof = prove_inclusion(a, attempt_id)
        assert proof.submitter == "host-a"
        assert proof.leaf_hash == hashlib.sha256(
            b"\x00" + ledger_entry(proof.entry, "host-a")).digest()
        assert split_entry(ledger_entry(proof.entry, "host-a")) == (proof.entry, "host-a")
        assert prove_inclusion(a, log_index=0).submitter is None  # as before: no field
    restore(tmp_path / "xb", tmp_path / "c")
    d = new_pg_database(pg_cluster)
    restore(tmp_path / "xa", d, artifacts=tmp_path / "d-artifacts")
    for again, name in ((tmp_path / "c", "xc"), (d, "xd")):
        export(again, tmp_path / name)
        assert (tmp_path / name / "dump.sql").read_bytes() == dump
        with Store.open(again, read_only=True) as store:
            assert verify(store, full=True).ok
    assert compare(tmp_path / "c", d).equal


def test_check_proof_shows_the_submitter_and_refuses_a_proof_that_changes_it(
        tmp_path: Path) -> None:
    from evidence._audit.checkpoints import checkpoint
    from evidence._audit.keys import SigningKey
    from evidence._audit.proofs import encode_proof

    with Store.create(tmp_path / "s") as store:
        make = Factory(store)
        groups = _groups(make)
        anyio.run(_feed, store, groups, [None, "host-a", None])
        key = SigningKey.generate("test-key")
        signed = checkpoint(store, key)
        proof = prove_inclusion(store, groups[1][0].attempt_id)
    result = check_proof(encode_proof(proof), signed, key.public_key)
    assert result.ok and result.submitter == "host-a"
    assert "submitted by worker host 'host-a'" in result.statement
    for lie in (None, "host-b"):
        forged = json.loads(encode_proof(proof))
        forged.pop("submitter") if lie is None else forged.update(submitter=lie)
        bad = check_proof(json.dumps(forged), signed, key.public_key)
        assert not bad.ok and "does not hash to the proof's leaf hash" in bad.problems[0]


@pytest.mark.anyio
async def test_a_host_token_is_the_host_identity_the_service_records(tmp_path: Path) -> None:
    """Over TCP with a hosts table: a host's own token admits it, whatever name it gives,
    and its messages record the table's name; another token is refused."""
    from evidence import ServiceError
    from evidence.client import ClientLimits

    hosts = {"fetcher-1": hashlib.sha256(b"one-token-0123456789").digest()}
    with Store.create(tmp_path / "s") as store:
        make = Factory(store)
        async with Service(store, listen="127.0.0.1:0", hosts=hosts) as service:
            assert service.tcp_address is not None
            address = f"127.0.0.1:{service.tcp_address[1]}"
            async with AsyncClient(address=address, token="one-token-0123456789",
                                   name="fetcher-2") as client:
                acks = await client.submit_group([make.session(), make.run()])
                assert [a.status for a in acks] == ["committed", "committed"]
            with pytest.raises(ServiceError) as refused:
                async with AsyncClient(address=address, token="another-token-0123456789",
                                       limits=ClientLimits(reconnect_timeout=1.0)):
                    pass
            assert refused.value.code == "unauthorized"
        rows = store.connection.execute("SELECT submitter FROM ingest_ledger").fetchall()
        assert rows == [("fetcher-1",), ("fetcher-1",)]


def test_a_bad_hosts_file_is_a_user_error_before_anything_is_made(tmp_path: Path) -> None:
    cases = {"no hosts": "", "two tokens": '[hosts.a]\ntoken_sha256 = "' + "a" * 64
             + '"\ntoken_file = "t"\n', "bad digest": '[hosts.a]\ntoken_sha256 = "xyz"\n',
             "bad name": '[hosts."a b"]\ntoken_sha256 = "' + "a" * 64 + '"\n',
             "same token": "".join(f'[hosts.{n}]\ntoken_sha256 = "{"b" * 64}"\n'
                                   for n in "ab")}
    for what, text in cases.items():
        path = tmp_path / f"{what}.toml"
        path.write_text(text)
        with pytest.raises(EvidenceError):
            load_hosts(path)
        before = sorted(tmp_path.iterdir())
        result = subprocess.run(
            [sys.executable, "-m", "evidence", "crawl", "http://127.0.0.1:9/", "--store",
             str(tmp_path / "store"), "--listen", "127.0.0.1:0", "--hosts-file", str(path)],
            capture_output=True, text=True, timeout=60, cwd=tmp_path)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and lines[0].startswith("Error: "), (what, lines)
        assert lines[1].startswith("Try: ") and sorted(tmp_path.iterdir()) == before


def test_what_a_host_may_submit_is_the_evidence_of_its_leases(tmp_path: Path) -> None:
    from evidence._crawl.pages import PageOrder
    from evidence._model.messages import FrontierUpdate, QueuedUrl, SettledUrl, utc_now

    url, link = "http://127.0.0.1:9/a", "http://127.0.0.1:9/b"
    with Store.create(tmp_path / "s") as store:
        make = Factory(store)
        session, run = make.session(), make.run()
        attempt = make.attempt(url, body=make.body())
        found = make.discovery(attempt, make.body(), [link])
    leased = {url: PageOrder(url=url, depth=0, attempts=0, via="seed")}

    def update(**changes: list) -> FrontierUpdate:
        return FrontierUpdate(message_id=make.id("m"), session_id=session.session_id,
                              run_id=run.run_id, at=utc_now(), **changes)

    def refused(*messages: object, scope: str | None = None) -> str:
        return check_submission(list(messages), leased=leased, run_id=run.run_id,
                                session_id=session.session_id,
                                out_of_scope=lambda _url, _depth: scope) or ""

    done = update(settled=[SettledUrl(url=url, state="done", reason="HTTP 200")])
    queued = update(queued=[QueuedUrl(url=link, depth=1,
                                      source_attempt_id=attempt.attempt_id)])
    assert refused(attempt, found, queued, done) == ""
    assert "not leased to it" in refused(make.attempt(FORGED_URL))
    assert "not leased to it" in refused(
        update(settled=[SettledUrl(url=FORGED_URL, state="done", reason="HTTP 200")]))
    assert "another run" in refused(make.attempt(url, run_id="r2"))
    assert "only the coordinator claims" in refused(attempt, update(claimed=[url]))
    assert "never sends" in refused(run)
    assert "without a link" in refused(attempt, queued)  # no discovery of it
    assert "not one it submits" in refused(found)  # links of an attempt not in the group
    assert "the crawl's rule says scope: host" in refused(attempt, found, queued,
                                                          scope="scope: host")


@given(payload=st.binary(max_size=256), submitter=st.text(min_size=1, max_size=256),
       other=st.text(min_size=1, max_size=256))
@settings(max_examples=200, deadline=None)
def test_any_submitter_is_bound_by_its_entry_and_never_taken_for_a_bare_message(
        payload: bytes, submitter: str, other: str) -> None:
    entry = ledger_entry(payload, submitter)
    assert ledger_entry(payload) == payload  # no submitter: the leaf is as it always was
    assert split_entry(entry) == (payload, submitter)
    assert entry != payload and (other == submitter) == (
        ledger_entry(payload, other) == entry)


def test_a_message_is_never_read_as_a_submitted_entry(tmp_path: Path) -> None:
    from evidence._model.messages import canonical_encode

    with Store.create(tmp_path / "s") as store:
        make = Factory(store)
        for message in (make.session(), make.run(), make.attempt()):
            encoded = canonical_encode(message)
            assert split_entry(encoded) == (encoded, None)
