"""Artifacts in an S3-compatible object store, against a real server (SeaweedFS).

What the server enforces (a wrong checksum refused, a second create refused), what our
client sends on every put (seen on the wire by a proxy), and what happens when the store
fails: a 5xx, an answer lost after the server stored the object, a server SIGKILLed in the
middle of a put, a put racing another of the same digest. In every case a put either
returns a ref whose object is there whole, or raises; and the writer refuses a message
naming an object that is not there.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import threading
import time
from pathlib import Path

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evidence import ArtifactRef, Store
from evidence._store.s3 import S3ArtifactStore, open_s3
from evidence._store.s3client import S3Client, S3Config, S3Error, sign_v4
from evidence.testing.seaweed import SeaweedS3

from .conftest import Factory, new_s3_url, submit_all
from .s3proxy import Action, S3Proxy


@pytest.fixture
def s3(seaweed: SeaweedS3):
    """A store at a fresh prefix of the session's server."""
    store = open_s3(new_s3_url(seaweed), create=True, read_only=False,
                    environ=seaweed.environ)
    yield store
    store.close()


def _client(server: SeaweedS3, endpoint: str | None = None, attempts: int = 1) -> S3Client:
    env = server.environ
    return S3Client(S3Config(endpoint=endpoint or server.endpoint, bucket=server.bucket,
                             access_key=env["AWS_ACCESS_KEY_ID"],
                             secret_key=env["AWS_SECRET_ACCESS_KEY"], attempts=attempts,
                             backoff=0.01))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_the_signature_is_aws_signature_version_4() -> None:
    """The GET example of the S3 SigV4 documentation ("Example: GET Object"), exactly."""
    empty = hashlib.sha256(b"").hexdigest()
    auth = sign_v4(method="GET", host="examplebucket.s3.amazonaws.com", path="/test.txt",
                   query={}, headers={"range": "bytes=0-9", "x-amz-content-sha256": empty,
                                      "x-amz-date": "20130524T000000Z"},
                   payload_sha256=empty, access_key="AKIAIOSFODNN7EXAMPLE",
                   secret_key="wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                   region="us-east-1", now=dt.datetime(2013, 5, 24, tzinfo=dt.UTC))
    assert auth == ("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/"
                    "aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
                    "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


@pytest.mark.parametrize("wrong", ["x-amz-checksum-sha256", "content-md5"])
def test_the_server_refuses_a_put_whose_checksum_is_wrong(seaweed: SeaweedS3,
                                                          wrong: str) -> None:
    """Each checksum header alone, wrong, makes the server refuse the put and store
    nothing; the same request with it right is stored."""
    client = _client(seaweed)
    body = b"the bytes that left the crawler"
    key = f"refused-{wrong}-{time.monotonic_ns()}"
    good = {"x-amz-checksum-sha256": _b64(hashlib.sha256(body).digest()),
            "content-md5": _b64(hashlib.md5(body).digest())}
    bad = {"x-amz-checksum-sha256": _b64(hashlib.sha256(b"other").digest()),
           "content-md5": _b64(hashlib.md5(b"other").digest())}
    try:
        with pytest.raises(S3Error) as refused:
            client._send("PUT", key, headers={"if-none-match": "*", wrong: bad[wrong]},
                         body=body, ok=(200,))
        assert refused.value.status == 400 and refused.value.code in ("BadDigest",
                                                                      "InvalidDigest")
        assert client.head(key) is None  # nothing of it was stored
        client._send("PUT", key, headers={"if-none-match": "*", wrong: good[wrong]},
                     body=body, ok=(200,))
        assert client.get(key) == body
    finally:
        client.close()


def test_a_second_create_of_the_same_key_is_refused_and_the_first_stays(
        seaweed: SeaweedS3) -> None:
    client = _client(seaweed)
    key = f"create-once-{time.monotonic_ns()}"
    first, second = b"first", b"second, other bytes"
    try:
        assert client.put_if_absent(key, first, sha256=hashlib.sha256(first).digest(),
                                    md5=hashlib.md5(first).digest()) is True
        assert client.put_if_absent(key, second, sha256=hashlib.sha256(second).digest(),
                                    md5=hashlib.md5(second).digest()) is False  # 412
        assert client.get(key) == first
    finally:
        client.close()


def test_every_put_is_a_conditional_create_with_both_checksums(seaweed: SeaweedS3) -> None:
    """Seen on the wire: each payload PUT carries If-None-Match: * and the body's MD5 and
    SHA-256 (which match the body the proxy received)."""
    bodies: dict[str, bytes] = {}

    with S3Proxy(upstream=("127.0.0.1", int(seaweed.endpoint.rsplit(":", 1)[1]))) as proxy:
        url = new_s3_url(seaweed).replace(seaweed.endpoint, proxy.endpoint)
        store = open_s3(url, create=True, read_only=False, environ=seaweed.environ)
        try:
            for i in range(5):
                data = f"payload {i}".encode() * (i + 1)
                ref = store.put("body", data)
                bodies[ref.digest] = data
            store.put("body", b"payload 0")  # again: 412, resolved, no second object
        finally:
            store.close()
    puts = [s for s in proxy.seen if s.method == "PUT" and "/body/" in s.path]
    assert len(puts) == 6
    for seen in puts:
        data = bodies[seen.path.rsplit("/", 1)[1]]
        assert seen.headers["if-none-match"] == "*"
        assert seen.headers["content-md5"] == _b64(hashlib.md5(data).digest())
        assert seen.headers["x-amz-checksum-sha256"] == _b64(hashlib.sha256(data).digest())
        assert seen.headers["x-amz-content-sha256"] == hashlib.sha256(data).hexdigest()
        assert seen.body_size == len(data)


def test_puts_racing_on_one_digest_store_it_once_and_all_return_its_ref(
        s3: S3ArtifactStore) -> None:
    data = b"the same page, fetched by eight workers at once" * 100
    barrier = threading.Barrier(8)
    refs: list[ArtifactRef] = []
    errors: list[BaseException] = []

    def put() -> None:
        barrier.wait()
        try:
            refs.append(s3.put("body", data))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=put) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(refs)) == 1 and len(refs) == 8
    assert list(s3.iter_refs()) == [refs[0]]
    assert s3.read(refs[0], verify=True) == data


def test_a_5xx_answer_is_retried_and_the_put_lands_once(seaweed: SeaweedS3) -> None:
    port = int(seaweed.endpoint.rsplit(":", 1)[1])
    failures = {"left": 2}

    def rule(seen, index):
        if seen.method == "PUT" and "/body/" in seen.path and failures["left"]:
            failures["left"] -= 1
            return Action("status", status=503)
        return Action()

    with S3Proxy(upstream=("127.0.0.1", port), rule=rule) as proxy:
        url = new_s3_url(seaweed).replace(seaweed.endpoint, proxy.endpoint)
        store = open_s3(url, create=True, read_only=False, environ=seaweed.environ)
        try:
            ref = store.put("body", b"lands after two 503s")
            assert store.client.retries == 2
            assert store.read(ref, verify=True) == b"lands after two 503s"
            assert list(store.iter_refs()) == [ref]
        finally:
            store.close()


def test_a_store_that_keeps_failing_is_given_up_at_its_outage_deadline(
        seaweed: SeaweedS3) -> None:
    """A 500 to every put: retried with backoff until EVIDENCE_S3_OUTAGE_DEADLINE (here 1 s),
    then an S3Error that says how long it tried; no object was made."""
    port = int(seaweed.endpoint.rsplit(":", 1)[1])

    def rule(seen, index):
        if seen.method == "PUT" and "/body/" in seen.path:
            return Action("status", status=500)
        return Action()

    with S3Proxy(upstream=("127.0.0.1", port), rule=rule) as proxy:
        url = new_s3_url(seaweed).replace(seaweed.endpoint, proxy.endpoint)
        store = open_s3(url, create=True, read_only=False,
                        environ={**seaweed.environ, "EVIDENCE_S3_OUTAGE_DEADLINE": "1"})
        try:
            started = time.monotonic()
            with pytest.raises(S3Error) as failed:
                store.put("body", b"never lands")
            assert 1 <= time.monotonic() - started < 10  # not the default's 600 s
            assert failed.value.status == 500
            assert "past its outage deadline (EVIDENCE_S3_OUTAGE_DEADLINE) of 1 s; last: " \
                "HTTP 500" in str(failed.value)
            attempts = [s for s in proxy.seen if s.method == "PUT" and "/body/" in s.path]
            assert 3 <= len(attempts) == store.client.retries + 1 <= 12
            ref = ArtifactRef("body", blake3.blake3(b"never lands").hexdigest(), 11)
            assert not store.exists(ref)
        finally:
            store.close()


def test_an_answer_lost_after_the_server_stored_the_object_is_resolved_by_the_retry(
        seaweed: SeaweedS3) -> None:
    """The first PUT reaches the server, which stores the object; its answer is cut. The
    retry's conditional create gets 412; the put reads what is there (the same bytes)
    and returns the ref."""
    port = int(seaweed.endpoint.rsplit(":", 1)[1])
    cut = {"done": False}

    def rule(seen, index):
        if seen.method == "PUT" and "/body/" in seen.path and not cut["done"]:
            cut["done"] = True
            return Action("cut_after")
        return Action()

    with S3Proxy(upstream=("127.0.0.1", port), rule=rule) as proxy:
        url = new_s3_url(seaweed).replace(seaweed.endpoint, proxy.endpoint)
        store = open_s3(url, create=True, read_only=False, environ=seaweed.environ)
        try:
            ref = store.put("body", b"stored, but the answer was lost")
            methods = [(s.method, s.path.rsplit("/", 2)[-2]) for s in proxy.seen
                       if "/body/" in s.path]
            assert methods == [("PUT", "body"), ("PUT", "body"), ("HEAD", "body")]
            assert store.read(ref, verify=True) == b"stored, but the answer was lost"
        finally:
            store.close()


def test_a_damaged_object_is_replaced_by_the_next_put_of_its_content(
        s3: S3ArtifactStore) -> None:
    ref = s3.put("body", b"the real bytes")
    other = b"tampered bytes"  # written over the object behind the store's back
    s3.client._send("PUT", s3.key(ref), headers={
        "content-md5": _b64(hashlib.md5(other).digest())}, body=other, ok=(200,))
    assert not s3.exists(ref) or s3.read(ref) != b"the real bytes"
    assert s3.put("body", b"the real bytes") == ref
    assert s3.read(ref, verify=True) == b"the real bytes"


def test_a_server_killed_mid_put_leaves_no_object_and_no_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL while the server is receiving a put's body (a worker process's put: one
    object, durable when it returns): the put raises at its outage deadline (1 s here),
    the restarted server has no object, and the writer refuses a message that names it.
    Once the server is back, the put and the message go through."""
    server = SeaweedS3.start(tmp_path / "s3")
    try:
        for name, value in server.environ.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("EVIDENCE_S3_OUTAGE_DEADLINE", "1")  # (tests/test_s3_outages.py)
        port = server.ports["s3"]
        held, sent = threading.Event(), threading.Event()

        def rule(seen, index):
            if seen.method == "PUT" and "/body/" in seen.path and not held.is_set():
                return Action("partial", hold=held, sent=sent)
            return Action()

        with S3Proxy(upstream=("127.0.0.1", port), rule=rule) as proxy:
            url = server.url("killed").replace(server.endpoint, proxy.endpoint)
            with Store.create(tmp_path / "store", artifacts=url) as store:
                assert isinstance(store.artifacts, S3ArtifactStore)
                worker = open_s3(url, create=False, read_only=False)  # hold=False
                data = bytes(range(256)) * 4096  # 1 MiB
                outcome: list[object] = []

                def put() -> None:
                    try:
                        outcome.append(worker.put("body", data))
                    except S3Error as exc:
                        outcome.append(exc)
                    finally:
                        worker.close()

                thread = threading.Thread(target=put)
                thread.start()
                assert sent.wait(30), "the put never reached the server"
                server.kill()  # half the body is on the server's socket
                held.set()
                thread.join(60)
                assert len(outcome) == 1 and isinstance(outcome[0], S3Error), outcome
                server.restart()
                ref = ArtifactRef("body", blake3.blake3(data).hexdigest(), len(data))
                assert not store.artifacts.exists(ref)

                make = Factory(store)
                acks = submit_all(store, [make.session(), make.run(),
                                          make.attempt(body=ref)])
                assert [a.status for a in acks] == ["committed", "committed", "rejected"]
                assert "not in the store" in (acks[2].reason or "")

                assert store.artifacts.put("body", data) == ref  # the server is back
                [ack] = submit_all(store, [make.attempt(body=ref)])
                assert ack.status == "committed"
                assert store.artifacts.read(ref, verify=True) == data
                assert any(p.is_socket() for p in server.grpc_sockets())  # it makes them
    finally:
        server.close()
    assert [p for p in server.grpc_sockets() if p.exists()] == [], "killed, weed leaves them"


def test_a_server_killed_mid_segment_put_fails_the_batch_and_its_redelivery_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's store holds its puts until the batch's sync, which seals them into one
    segment object. SIGKILL of the server while it receives that segment: the batch fails
    with a CommitError (nothing written, nothing quarantined), the restarted server has
    no segment, and the same messages, redelivered, commit with their payloads readable."""
    from evidence import CommitError

    server = SeaweedS3.start(tmp_path / "s3")
    try:
        for name, value in server.environ.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("EVIDENCE_S3_OUTAGE_DEADLINE", "1")
        held, sent = threading.Event(), threading.Event()

        def rule(seen, index):
            if seen.method == "PUT" and "/SEGMENTS/" in seen.path and not held.is_set():
                return Action("partial", hold=held, sent=sent)
            return Action()

        with S3Proxy(upstream=("127.0.0.1", server.ports["s3"]), rule=rule) as proxy:
            url = server.url("segment").replace(server.endpoint, proxy.endpoint)
            with Store.create(tmp_path / "store", artifacts=url) as store:
                s3 = store.artifacts
                assert isinstance(s3, S3ArtifactStore)
                make = Factory(store)
                assert [a.status for a in submit_all(store, [make.session(), make.run()])
                        ] == ["committed", "committed"]
                bodies = [bytes([i]) * (300_000 + i) for i in range(3)]
                refs = [s3.put("body", body) for body in bodies]
                assert s3.segment_keys() == [], "held until the batch's sync"
                attempts = [make.attempt(f"http://example.com/{i}", body=ref)
                            for i, ref in enumerate(refs)]
                outcome: list[object] = []

                def commit() -> None:
                    try:
                        outcome.append(submit_all(store, attempts))
                    except CommitError as exc:
                        outcome.append(exc)

                thread = threading.Thread(target=commit)
                thread.start()
                assert sent.wait(30), "the segment never reached the server"
                server.kill()  # part of the segment is on the server's socket
                held.set()
                thread.join(60)
                assert len(outcome) == 1 and isinstance(outcome[0], CommitError), outcome
                assert "could not be made durable" in str(outcome[0])
                for table in ("fetch_attempt", "quarantine", "artifact"):
                    assert store.connection.execute(
                        f"SELECT count(*) FROM {table}").fetchall() == [(0,)]
                server.restart()
                assert s3.segment_keys() == []
                acks = submit_all(store, attempts)
                assert [a.status for a in acks] == ["committed"] * 3, [a.reason for a in acks]
                [segment] = s3.segment_keys()
        with Store.open(tmp_path / "store", read_only=True,
                        artifacts=server.url("segment")) as reader:
            for ref, body in zip(refs, bodies, strict=True):
                assert reader.artifacts.read(ref, verify=True) == body
            assert reader.artifacts.location(refs[0]).startswith(
                f"s3://{server.bucket}/{segment}@")
    finally:
        server.close()


def test_a_reference_check_the_object_store_cannot_answer_fails_the_batch_not_the_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store is down when the writer checks a new reference: that is not the message's
    fault, so it is not rejected (quarantined for good) but its batch fails with a
    CommitError, nothing written; redelivered once the store is back, it commits."""
    from evidence import CommitError

    server = SeaweedS3.start(tmp_path / "s3")
    try:
        for name, value in server.environ.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("EVIDENCE_S3_OUTAGE_DEADLINE", "1")  # (tests/test_s3_outages.py)
        with Store.create(tmp_path / "store", artifacts=server.url("down")) as store:
            make = Factory(store)
            worker = open_s3(server.url("down"), create=False, read_only=False)
            try:  # a worker process's put: its own object, which the writer must ask for
                ref = worker.put("body", b"stored while the server was up")
            finally:
                worker.close()
            assert [a.status for a in submit_all(store, [make.session(), make.run()])] == [
                "committed", "committed"]
            attempt = make.attempt(body=ref)
            server.kill()
            with pytest.raises(CommitError, match="could not check its payloads"):
                submit_all(store, [attempt])
            assert store.connection.execute(
                "SELECT count(*) FROM fetch_attempt").fetchall() == [(0,)]
            assert store.connection.execute(
                "SELECT count(*) FROM quarantine").fetchall() == [(0,)]
            server.restart()
            [ack] = submit_all(store, [attempt])
            assert ack.status == "committed"
    finally:
        server.close()


_FAULTS = {"503": Action("status", status=503), "500": Action("status", status=500),
           "cut_before": Action("cut_before"), "cut_after": Action("cut_after")}


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schedule=st.lists(st.sampled_from(["forward", *_FAULTS]), max_size=10),
       payloads=st.lists(st.binary(max_size=3000), min_size=1, max_size=4))
def test_any_schedule_of_failures_leaves_each_put_whole_or_raised(
        seaweed: SeaweedS3, schedule: list[str], payloads: list[bytes]) -> None:
    """Whatever answers the payload requests get (an error status, a connection cut before
    the server saw the request or after it stored the object), each put either returns a
    ref whose object holds exactly its bytes, or raises S3Error; no object ever holds
    other bytes than its digest says."""
    port = int(seaweed.endpoint.rsplit(":", 1)[1])
    counter = iter(range(10**6))

    def rule(seen, index):
        if "/body/" not in seen.path:
            return Action()
        n = next(counter)
        return _FAULTS.get(schedule[n], Action()) if n < len(schedule) else Action()

    with S3Proxy(upstream=("127.0.0.1", port), rule=rule) as proxy:
        url = new_s3_url(seaweed, "faults").replace(seaweed.endpoint, proxy.endpoint)
        store = open_s3(url, create=True, read_only=False,  # a few tries, as many raise
                        environ={**seaweed.environ, "EVIDENCE_S3_OUTAGE_DEADLINE": "0.3"})
        returned: list[tuple[ArtifactRef, bytes]] = []
        try:
            for data in payloads:
                with contextlib.suppress(S3Error):
                    returned.append((store.put("body", data), data))
        finally:
            store.close()
    check = open_s3(url.replace(proxy.endpoint, seaweed.endpoint), create=False,
                    read_only=True, environ=seaweed.environ)  # read past the proxy
    try:
        for ref, data in returned:
            assert check.read(ref, verify=True) == data
        for ref in check.iter_refs():
            check.verify(ref)  # whole, or it would raise ArtifactCorruptError
            assert check.read(ref) in payloads
    finally:
        check.close()


def test_a_creation_cut_before_its_object_store_is_recorded_is_finished_by_init(
        tmp_path: Path, seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose payloads go to an object store records that location after its
    database is made. Cut in between (here the recording raises, as a kill would stop it),
    the store has a database, no artifacts/ and no location: opening it says its creation
    did not finish and how to finish it (before, "artifacts/ is missing": damaged), and
    ``Store.create`` with the same URL finishes it. A store with evidence in it and its
    artifacts/ gone is still damaged."""
    from evidence import CorruptStoreError, StoreError
    from evidence._store import artifactspec

    for name, value in seaweed.environ.items():
        monkeypatch.setenv(name, value)
    url, path = new_s3_url(seaweed), tmp_path / "store"

    def cut(*args: object, **kwargs: object) -> None:
        raise OSError("power cut")

    with monkeypatch.context() as patch:
        patch.setattr(artifactspec, "record", cut)
        with pytest.raises(OSError, match="power cut"):
            Store.create(path, artifacts=url)
    assert (path / "evidence.db").is_file() and not (path / "artifacts").exists()
    for read_only in (False, True):
        with pytest.raises(StoreError, match="creation did not finish") as refused:
            Store.open(path, read_only=read_only)
        assert not isinstance(refused.value, CorruptStoreError)
        assert "evidence init" in (refused.value.hint or "")
    with Store.create(path, artifacts=url) as store:
        ref = store.artifacts.put("body", b"finished")
        submit_all(store, [Factory(store).session()])
    with Store.open(path) as store:
        assert store.artifacts.read(ref, verify=True) == b"finished"

    local = tmp_path / "local"
    with Store.create(local) as store:
        submit_all(store, [Factory(store).session()])
    (local / "artifacts").rename(tmp_path / "elsewhere")
    with pytest.raises(CorruptStoreError, match="artifacts/ is missing"):
        Store.open(local)
