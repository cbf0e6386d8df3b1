"""The writer service and its clients: real processes, real sockets, real signals.

The service runs as ``python -m evidence serve``;
client processes run this module (``python -m tests.test_service client ...``). The load
test runs 4 processes x ``EVIDENCE_SERVICE_MESSAGES`` messages (default 3,000: with 256
requests in flight per client that is a dozen windows each, batches of hundreds of messages
from four clients interleaved; ``EVIDENCE_SERVICE_MESSAGES=10000`` runs the longer load).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime as dt
import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import apsw
import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from evidence import (
    FetchAttempt,
    Message,
    MessageError,
    RunStarted,
    SessionStarted,
    Store,
    Writer,
    canonical_encode,
    check_log,
    payload_hash,
)
from evidence._write.limits import ServiceLimits
from evidence._write.service import prometheus_text
from evidence._write.wire import (
    HEADER,
    PROTOCOL_VERSION,
    Hello,
    Ping,
    ServiceError,
    Submit,
    decode_client_frame,
    encode_frame,
    parse_loopback,
)

# evidence.client is imported inside the tests, not here: importing it binds the public
# attribute evidence.client, which tests/test_exported_members.py does not yet allow.

ROOT = Path(__file__).resolve().parent.parent
SERVE = [sys.executable, "-m", "evidence", "serve"]
TOKEN = "test-token-0123456789abcdef"
NOW = dt.datetime(2026, 3, 3, 12, 0, tzinfo=dt.UTC)
MESSAGES = int(os.environ.get("EVIDENCE_SERVICE_MESSAGES", "3000"))


# --- messages ---------------------------------------------------------------------------

def attempt(client: int | str, i: int) -> FetchAttempt:
    """A valid message that needs no artifact: a refused connection, recorded as evidence."""
    return FetchAttempt(message_id=f"m-{client}-{i}", attempt_id=f"a-{client}-{i}",
                        run_id="r1", url=f"http://example.com/{client}/{i}", sequence=0,
                        started_at=NOW, elapsed_ms=float(i % 97), outcome="network_error",
                        error="connection refused")


SETUP: list[Message] = [
    SessionStarted(message_id="m-session", session_id="s1", started_at=NOW),
    RunStarted(message_id="m-run", run_id="r1", session_id="s1", started_at=NOW),
]


def plan(client: int, count: int, *, seed: int, shared: int,
         dup_rate: float) -> list[list[Message]]:
    """The requests one client sends: singles and groups of its own ``count`` messages,
    redeliveries of random earlier requests, and ``shared`` messages every client sends."""
    rng = random.Random(seed * 1000 + client)
    requests: list[list[Message]] = []
    i = 0
    while i < count:
        size = rng.choice((1, 1, 1, 2, 3, 5))
        requests.append([attempt(client, j) for j in range(i, min(i + size, count))])
        i += len(requests[-1])
        if rng.random() < dup_rate:
            requests.append(rng.choice(requests))
    for s in range(shared):
        requests.insert(rng.randrange(len(requests) + 1), [attempt("shared", s)])
    return requests


def expected(clients: int, count: int, shared: int) -> list[Message]:
    return [*SETUP, *(attempt(c, i) for c in range(clients) for i in range(count)),
            *(attempt("shared", s) for s in range(shared))]


# --- the client process -----------------------------------------------------------------

def client_main(argv: list[str]) -> int:
    """``python -m tests.test_service client SOCKET INDEX COUNT OUT [options]``."""
    from evidence.client import AsyncClient, Client, ClientLimits

    p = argparse.ArgumentParser()
    p.add_argument("socket")
    p.add_argument("index", type=int)
    p.add_argument("count", type=int)
    p.add_argument("out")
    p.add_argument("--mode", choices=("async", "sync"), default="async")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--shared", type=int, default=0)
    p.add_argument("--dup-rate", type=float, default=0.05)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--reconnect-timeout", type=float, default=60.0)
    p.add_argument("--go", help="once connected, touch OUT.ready and wait for this file")
    args = p.parse_args(argv)
    requests = plan(args.index, args.count, seed=args.seed, shared=args.shared,
                    dup_rate=args.dup_rate)
    limits = ClientLimits(max_in_flight=args.window, reconnect_timeout=args.reconnect_timeout)
    results: dict[str, list] = collections.defaultdict(list)

    def record(acks: list) -> None:
        for ack in acks:
            results[ack.message_id].append([ack.status, ack.log_index])

    def barrier() -> None:  # every client connected before any submits: an even load
        if args.go:
            Path(args.out + ".ready").touch()
            while not Path(args.go).exists():
                time.sleep(0.005)

    started = time.monotonic()
    if args.mode == "async":
        async def run() -> object:
            async with AsyncClient(args.socket, limits=limits) as client:
                await anyio.to_thread.run_sync(barrier)
                queue = iter(requests)

                async def worker() -> None:
                    for group in queue:
                        record(await client.submit_group(group) if len(group) > 1
                               else [await client.submit(group[0])])

                async with anyio.create_task_group() as tg:
                    for _ in range(args.window):
                        tg.start_soon(worker)
                return client.statistics()

        stats = anyio.run(run)
    else:
        with Client(args.socket, limits=limits) as client:
            barrier()
            window: collections.deque = collections.deque()
            for group in requests:
                window.append(client.submit_group_soon(group))
                if len(window) >= args.window:
                    record(window.popleft().result())
            while window:
                record(window.popleft().result())
            stats = client.statistics()
    Path(args.out).write_bytes(msgspec.json.encode({
        "acks": results, "requests": len(requests), "statistics": stats,
        "seconds": time.monotonic() - started}))
    return 0


# --- the service process ----------------------------------------------------------------

class Service:
    """``evidence serve`` in a subprocess; ``ready`` is its JSON ready line."""

    def __init__(self, store: Path, sock: Path | None, *extra: str, log: Path) -> None:
        args = [*SERVE, str(store), "--json", "--sync", "normal", *extra]
        if sock is not None:
            args += ["--socket", str(sock)]
        self.log = log
        self._stderr = log.open("a")
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            self.kill()
            raise AssertionError(f"the service did not start:\n{log.read_text()}")
        self.ready = json.loads(line)

    def stop(self, timeout: float = 60) -> tuple[int, dict | None]:
        """SIGTERM, then wait: (exit status, the 'stopped' JSON event)."""
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float = 60) -> tuple[int, dict | None]:
        out, _ = self.proc.communicate(timeout=timeout)
        self._stderr.close()
        lines = [json.loads(x) for x in out.splitlines() if x.strip()]
        return self.proc.returncode, next((x for x in lines if x["event"] == "stopped"), None)

    def kill(self) -> None:
        """SIGKILL (if still running) and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)
        self._stderr.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths must stay under 108 bytes; pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="ev-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    with Store.create(path, sync="normal") as store:
        async def setup() -> None:
            async with Writer(store) as writer:
                await writer.submit_group(SETUP)
        anyio.run(setup)
    return path


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def services(tmp_path: Path) -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        service.kill()


def ledger(store_path: Path) -> dict[str, tuple[str, int]]:
    """message_id -> (payload hash, log index), from a read-only snapshot."""
    conn = apsw.Connection(str(store_path / "evidence.db"), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.set_busy_timeout(5000)
        return {m: (h, i) for m, h, i in conn.execute(
            "SELECT message_id, payload_hash, log_index FROM ingest_ledger")}
    finally:
        conn.close()


def assert_store_is_exactly(store_path: Path, messages: list[Message]) -> None:
    """The ledger holds exactly these messages, each once; rows and log agree."""
    want = {m.message_id: payload_hash(canonical_encode(m)) for m in messages}
    assert len(want) == len(messages)
    got = ledger(store_path)
    assert {m: h for m, (h, _) in got.items()} == want
    attempts = {m.attempt_id for m in messages if isinstance(m, FetchAttempt)}
    with Store.open(store_path) as store:
        conn = store.connection
        rows = [r for (r,) in conn.execute("SELECT attempt_id FROM fetch_attempt")]
        assert len(rows) == len(attempts) and set(rows) == attempts
        assert conn.execute("SELECT count(*) FROM url_current").fetchall()[0][0] == len(attempts)
        assert conn.execute("SELECT count(*) FROM quarantine").fetchall()[0][0] == 0
        size, _root, findings = check_log(conn)
        assert findings == [] and size == len(messages)


@pytest.fixture
def clients(tmp_path: Path) -> Iterator[list[subprocess.Popen]]:
    """Client processes started by a test; killed at teardown if a test failed early."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def start_clients(procs: list[subprocess.Popen], sock: Path, tmp_path: Path, count: int,
                  modes: list[str], **options: object) -> None:
    """Start client processes; once all are connected, let them go at once."""
    go = tmp_path / "go"
    for index, mode in enumerate(modes):
        out = tmp_path / f"client{index}.json"
        args = [sys.executable, "-m", "tests.test_service", "client", str(sock), str(index),
                str(count), str(out), "--mode", mode, "--go", str(go)]
        for key, value in options.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        procs.append(subprocess.Popen(args, cwd=ROOT))
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"client{i}.json.ready").exists() for i in range(len(modes))):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    go.touch()


def client_results(tmp_path: Path, n: int) -> list[dict]:
    return [msgspec.json.decode((tmp_path / f"client{i}.json").read_bytes()) for i in range(n)]


def assert_acked_once(results: list[dict], store_path: Path, *,
                      strict_duplicates: bool) -> collections.Counter:
    """Each send got one ack; each message is committed at most once (exactly once when
    nothing was lost in flight) and every ack names the ledger's log index."""
    got = ledger(store_path)
    statuses: collections.Counter = collections.Counter()
    per_message: dict[str, list] = collections.defaultdict(list)
    for result in results:
        for message_id, acks in result["acks"].items():
            per_message[message_id] += acks
    for message_id, acks in per_message.items():
        kinds = collections.Counter(status for status, _ in acks)
        statuses.update(kinds)
        assert set(kinds) <= {"committed", "duplicate"}, (message_id, acks)
        assert kinds["committed"] <= 1, (message_id, acks)
        if strict_duplicates:
            assert kinds["committed"] == 1, (message_id, acks)
        assert {index for _, index in acks} == {got[message_id][1]}, (message_id, acks)
    return statuses


# --- tests ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(240)
def test_four_client_processes_each_message_committed_once_store_exact(
        store_path: Path, short_dir: Path, tmp_path: Path, services: list[Service],
        clients: list[subprocess.Popen]) -> None:
    sock = short_dir / "s.sock"
    services.append(Service(store_path, sock, log=tmp_path / "service.log"))
    shared = 50
    start_clients(clients, sock, tmp_path, MESSAGES, ["async", "async", "sync", "sync"],
                  shared=shared, dup_rate=0.05)
    assert [p.wait(200) for p in clients] == [0, 0, 0, 0]
    code, stopped = services[0].stop()
    assert code == 0 and stopped is not None
    results = client_results(tmp_path, 4)
    statuses = assert_acked_once(results, store_path, strict_duplicates=True)
    unique = 4 * MESSAGES + shared
    sends = sum(len(acks) for r in results for acks in r["acks"].values())
    assert statuses["committed"] == unique
    assert statuses["duplicate"] == sends - unique > 3 * shared  # redeliveries + shared ones
    assert_store_is_exactly(store_path, expected(4, MESSAGES, shared))
    writer = stopped["statistics"]["writer"]
    assert writer["committed"] == unique and writer["duplicates"] == sends - unique
    print(f"\n4 x {MESSAGES} messages: " + ", ".join(
        f"{r['requests'] / r['seconds']:.0f} req/s" for r in results))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkill_mid_load_then_restart_clients_redeliver_nothing_lost_or_doubled(
        store_path: Path, short_dir: Path, tmp_path: Path, services: list[Service],
        clients: list[subprocess.Popen]) -> None:
    sock = short_dir / "s.sock"
    count = min(MESSAGES, 4000)
    services.append(Service(store_path, sock, log=tmp_path / "service.log"))
    start_clients(clients, sock, tmp_path, count, ["async", "sync", "async"], dup_rate=0.02)
    deadline = time.monotonic() + 60
    while True:  # every client well into its load
        done = collections.Counter(m.split("-")[1] for m in ledger(store_path) if m[2] != "s")
        if all(done[str(c)] >= count // 5 for c in range(3)):
            break
        assert time.monotonic() < deadline and all(p.poll() is None for p in clients)
        time.sleep(0.02)
    services[0].kill()  # SIGKILL: no drain, no acks for what was in flight
    at_kill = len(ledger(store_path))
    time.sleep(0.5)  # clients see the connection drop and start backing off
    services.append(Service(store_path, sock, log=tmp_path / "service.log"))
    assert [p.wait(200) for p in clients] == [0, 0, 0]
    code, _ = services[1].stop()
    assert code == 0
    results = client_results(tmp_path, 3)
    assert at_kill < 2 + 3 * count, "the kill came after the load: the test proved nothing"
    assert all(r["statistics"]["connections"] >= 2 for r in results)
    assert sum(r["statistics"]["redelivered"] for r in results) > 0
    assert_acked_once(results, store_path, strict_duplicates=False)
    assert_store_is_exactly(store_path, expected(3, count, 0))


def _frames(data: bytes) -> list[dict]:
    """Split a byte string into decoded frames (as plain maps)."""
    frames, offset = [], 0
    while offset + 4 <= len(data):
        (size,) = HEADER.unpack_from(data, offset)
        frames.append(msgspec.msgpack.decode(data[offset + 4:offset + 4 + size]))
        offset += 4 + size
    assert offset == len(data), "the service sent a partial frame"
    return frames


def exchange(sock: Path | tuple[str, int], data: bytes) -> list[dict]:
    """Send ``data``, half-close, read until the service closes; the frames it sent."""
    family = socket.AF_UNIX if isinstance(sock, Path) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(str(sock) if isinstance(sock, Path) else sock)
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the service may refuse and close before we finish sending
        received = b""
        try:
            while chunk := s.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
    return _frames(received)


def _raw_frame(value: object) -> bytes:
    body = msgspec.msgpack.encode(value)
    return HEADER.pack(len(body)) + body


def _hello(token: str = TOKEN) -> bytes:
    return encode_frame(Hello(versions=[PROTOCOL_VERSION], token=token, client="hypothesis"))


def _submit(request_id: int, messages: list[Message]) -> bytes:
    return encode_frame(Submit(id=request_id, messages=[
        msgspec.Raw(canonical_encode(m)) for m in messages]))


MAX_FRAME = 64 * 1024
KNOWN_TYPES = {"hello", "submit", "ping", "stats"}


@st.composite
def abuse(draw: st.DrawFn) -> tuple[str, set[str] | None, bytes]:
    """(case, error codes the service may answer with, bytes a bad client sends)."""
    bait = _submit(7, [attempt("bait", draw(st.integers(0, 10**6)))])  # written if read
    case = draw(st.sampled_from(["token", "too_large", "random", "random_first",
                                 "truncated", "unknown_kind", "unknown_first"]))
    if case == "token":
        token = draw(st.text(max_size=80).filter(lambda t: t != TOKEN))
        return case, {"unauthorized"}, _hello(token) + bait
    if case == "too_large":
        size = draw(st.integers(MAX_FRAME + 1, 2**32 - 1))
        return case, {"frame_too_large"}, _hello() + HEADER.pack(size) + draw(st.binary(
            max_size=64)) + bait
    if case == "random":
        return case, None, _hello() + draw(st.binary(min_size=1, max_size=600))
    if case == "random_first":
        return case, None, draw(st.binary(min_size=1, max_size=600))
    if case == "truncated":
        return case, {"truncated_frame"}, _hello() + bait[:draw(st.integers(1, len(bait) - 1))]
    kind = draw(st.text(max_size=20).filter(lambda k: k not in KNOWN_TYPES))
    values = st.integers(-(2**63), 2**63) | st.text(max_size=8) | st.binary(max_size=8)
    fields = draw(st.dictionaries(st.text(max_size=8), values, max_size=3))
    frame = _raw_frame({**fields, "type": kind, "id": 1})
    if case == "unknown_first":
        return case, {"malformed_frame"}, frame + bait
    return case, {"malformed_frame"}, _hello() + frame + bait


def _all_valid_frames(data: bytes) -> bool:
    """Whether ``data`` is nothing but complete, valid frames (then no error is due)."""
    offset = 0
    while offset < len(data):
        if offset + 4 > len(data):
            return False
        (size,) = HEADER.unpack_from(data, offset)
        if size > MAX_FRAME or offset + 4 + size > len(data):
            return False
        try:
            decode_client_frame(data[offset + 4:offset + 4 + size])
        except Exception:
            return False
        offset += 4 + size
    return True


@pytest.mark.timeout(240)
def test_bad_clients_are_refused_and_closed_nothing_written_others_served(
        store_path: Path, short_dir: Path, tmp_path: Path, token_file: Path,
        services: list[Service]) -> None:
    from evidence.client import Client

    sock = short_dir / "s.sock"
    services.append(Service(store_path, sock, "--token-file", str(token_file),
                            "--max-frame-bytes", str(MAX_FRAME), log=tmp_path / "service.log"))
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    good_messages: list[Message] = []
    with Client(sock, token=TOKEN) as good:

        @settings(max_examples=120, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(abuse())
        def one_bad_client(case: tuple[str, set[str] | None, bytes]) -> None:
            name, codes, data = case
            event(name)
            frames = exchange(sock, data)
            assert not [f for f in frames if f.get("type") == "ack"], frames
            errors = [f for f in frames if f.get("type") == "error"]
            if codes is None:  # random bytes: refused unless they happen to be valid frames
                body = data[len(_hello()):] if data.startswith(_hello()) else data
                if not (data.startswith(_hello()) and _all_valid_frames(body)):
                    assert errors and errors[-1].get("id") is None, frames
            else:
                assert errors and errors[-1]["code"] in codes and errors[-1].get("id") is None
                assert frames[-1] is errors[-1]  # the error is the last word
            message = attempt("good", len(good_messages))
            good_messages.append(message)
            assert good.submit(message).status == "committed"  # the others are served

        one_bad_client()
        stats = good.server_statistics()
    assert set(ledger(store_path)) == {m.message_id for m in SETUP + good_messages}
    assert stats.protocol_errors.get("unauthorized", 0) >= 1
    code, _ = services[0].stop()
    assert code == 0


def test_invalid_message_fails_its_request_alone_and_the_connection_goes_on(
        store_path: Path, short_dir: Path, tmp_path: Path, services: list[Service]) -> None:
    sock = short_dir / "s.sock"
    services.append(Service(store_path, sock, log=tmp_path / "service.log"))
    bad = msgspec.msgpack.encode({"kind": "fetch_attempt", "message_id": "m-x"})
    unknown_run = msgspec.structs.replace(attempt(9, 1), run_id="r-unknown")
    data = (_hello() + encode_frame(Submit(id=1, messages=[msgspec.Raw(bad)]))
            + _submit(2, [attempt(9, 0), unknown_run]) + encode_frame(Ping(id=3)))
    frames = {f.get("id"): f for f in exchange(sock, data) if f["type"] != "welcome"}
    assert frames[1]["type"] == "error" and frames[1]["code"] == "invalid_message"
    assert "missing required field" in frames[1]["message"]
    assert [a["status"] for a in frames[2]["acks"]] == ["committed", "rejected"]
    assert frames[3]["type"] == "pong"
    assert set(frames) == {1, 2, 3}  # a clean end of stream: no connection error
    assert "m-x" not in ledger(store_path)


def test_stalled_client_does_not_block_another_clients_acks_and_is_dropped(
        store_path: Path, short_dir: Path, tmp_path: Path, services: list[Service]) -> None:
    from evidence.client import Client

    sock = short_dir / "s.sock"
    services.append(Service(store_path, sock, "--send-timeout", "10",
                            "--connection-in-flight", "64", log=tmp_path / "service.log"))
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stalled.connect(str(sock))
    stalled.sendall(_hello())
    sent: list[Message] = []

    def flood() -> None:  # submit groups of 50 and never read an ack
        try:
            for n in range(400):
                group = [attempt("stalled", n * 50 + i) for i in range(50)]
                stalled.sendall(_submit(n, group))
                sent.extend(group)
        except OSError:
            pass  # dropped by the service

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    with Client(sock) as other:
        deadline = time.monotonic() + 30
        while other.server_statistics().send_blocked_connections < 1:
            assert time.monotonic() < deadline, "the stalled client never filled its socket"
            time.sleep(0.05)
        acks = [other.submit(attempt("other", i)) for i in range(200)]
        stats = other.server_statistics()
        assert [a.status for a in acks] == ["committed"] * 200
        # All acked while the stalled client was still connected and still blocking its
        # sender: nothing waited for it (its drop comes only after --send-timeout, 10 s of
        # a blocked send; acks that waited for the drop would come after it).
        assert stats.slow_disconnects == 0 and stats.send_blocked_connections == 1, stats
        deadline = time.monotonic() + 20
        while other.server_statistics().slow_disconnects < 1:
            assert time.monotonic() < deadline, "the stalled client was never dropped"
            time.sleep(0.1)
        thread.join(20)
        stalled.close()
        # What it sent and never saw acked, it redelivers: duplicates where committed.
        redelivered = other.submit_many(list(sent))
    statuses = collections.Counter(a.status for a in redelivered)
    assert statuses["duplicate"] > 0 and set(statuses) <= {"committed", "duplicate"}
    code, _ = services[0].stop()
    assert code == 0
    assert_store_is_exactly(store_path, [*SETUP, *(attempt("other", i) for i in range(200)),
                                         *sent])


def test_sigterm_drains_every_read_request_is_committed_and_acked_then_exit_0(
        store_path: Path, short_dir: Path, tmp_path: Path, services: list[Service]) -> None:
    from evidence.client import Client, ClientLimits

    sock = short_dir / "s.sock"
    services.append(Service(store_path, sock, log=tmp_path / "service.log"))
    messages = [attempt("term", i) for i in range(10_000)]
    limits = ClientLimits(max_in_flight=512, reconnect_timeout=1.0)
    with Client(sock, limits=limits) as client:
        done = threading.Semaphore(0)
        futures: list = []

        def produce() -> None:  # keeps submitting while the main thread sends SIGTERM
            for m in messages:
                futures.append(client.submit_soon(m))
                futures[-1].add_done_callback(lambda _: done.release())

        producer = threading.Thread(target=produce)
        producer.start()
        for _ in range(1000):
            assert done.acquire(timeout=30)
        code, stopped = services[0].stop()
        producer.join(60)
        assert code == 0 and stopped is not None
        assert not sock.exists()
        acked = {}
        for message, future in zip(messages, futures, strict=True):
            # ServiceError: never read by the service, and the client gave up reconnecting.
            with contextlib.suppress(ServiceError):
                acked[message.message_id] = future.result(30)
    stored = ledger(store_path)
    assert 1000 <= len(acked) < len(messages), "SIGTERM came too late to test the drain"
    # Everything the service read was committed AND acknowledged before it exited.
    assert set(stored) - {m.message_id for m in SETUP} == set(acked)
    assert all(stored[m][1] == a.log_index and a.status == "committed"
               for m, a in acked.items())
    assert stopped["statistics"]["writer"]["committed"] == len(acked)
    assert "stopping" in (tmp_path / "service.log").read_text()


def test_tcp_needs_a_token_and_loopback_metrics_over_http(
        store_path: Path, tmp_path: Path, token_file: Path, services: list[Service]) -> None:
    from evidence.client import Client

    services.append(Service(store_path, None, "--listen", "127.0.0.1:0", "--token-file",
                            str(token_file), "--metrics", "127.0.0.1:0",
                            log=tmp_path / "service.log"))
    address = services[0].ready["listen"]
    with Client(address=address, token=TOKEN) as client:
        assert client.submit_group([attempt("tcp", 0), attempt("tcp", 1)])[1].status == \
            "committed"
        assert client.submit(attempt("tcp", 0)).status == "duplicate"
        text = client.metrics_text()
    with pytest.raises(ServiceError) as refused, \
            Client(address=address, token="wrong-token-wrong-token"):
        pass
    assert refused.value.code == "unauthorized"
    host, port = parse_loopback(address)
    frames = exchange((host, port), _hello("nope") + _submit(1, [attempt("tcp", 9)]))
    assert [f["code"] for f in frames] == ["unauthorized"]
    response = httpx.get(services[0].ready["metrics"], timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    for name in ("evidence_writer_queue_depth", "evidence_writer_oldest_pending_age_seconds",
                 'evidence_writer_commit_latency_seconds_bucket{le="+Inf"}',
                 "evidence_writer_commit_latency_seconds_count",
                 "evidence_store_wal_bytes",
                 'evidence_writer_batch_size_messages_bucket{le="+Inf"}',
                 "evidence_writer_busy_retries_total",
                 'evidence_writer_messages_total{outcome="duplicate"} 1',
                 'evidence_writer_messages_total{outcome="conflict"} 0',
                 "evidence_service_connected_clients",
                 'evidence_service_protocol_errors_total{code="unauthorized"} 2'):
        assert name in response.text, name
    assert "evidence_writer_queue_depth" in text
    assert httpx.get(services[0].ready["metrics"].replace("/metrics", "/healthz"),
                     timeout=10).text == "ok\n"
    assert "m-tcp-9" not in ledger(store_path)
    stop = subprocess.run([sys.executable, "-m", "evidence", "stop", str(store_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr  # the service holds the store's lock: SIGTERM
    code, _ = services[0].wait()
    assert code == 0


@pytest.mark.parametrize(("args", "error"), [
    (["--listen", "0.0.0.0:0", "--token-file", "{token}"], "not a loopback address"),
    (["--listen", "192.168.1.5:7400", "--token-file", "{token}"], "not a loopback address"),
    (["--listen", "127.0.0.1:0"], "needs a token"),
    (["--socket", "{dir}/s.sock", "--token-file", "{open_token}"], "readable by other users"),
    ([], "nothing to listen on"),
])
def test_serve_refuses_unsafe_configurations(store_path: Path, tmp_path: Path,
                                             short_dir: Path, token_file: Path,
                                             args: list[str], error: str) -> None:
    open_token = tmp_path / "open-token"
    open_token.write_text(TOKEN)
    open_token.chmod(0o644)
    args = [a.format(token=token_file, open_token=open_token, dir=short_dir) for a in args]
    done = subprocess.run([*SERVE, str(store_path), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and error in done.stderr and "Try:" in done.stderr


def test_a_live_socket_is_not_stolen_a_stale_one_is_replaced(
        store_path: Path, short_dir: Path, tmp_path: Path, services: list[Service]) -> None:
    from evidence.client import Client

    sock = short_dir / "s.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))
    stale.close()  # a socket file with nothing behind it, as a SIGKILL leaves
    services.append(Service(store_path, sock, log=tmp_path / "service.log"))
    other = tmp_path / "other"
    shutil.copytree(store_path, other)
    done = subprocess.run([*SERVE, str(other), "--socket", str(sock)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "another service is listening" in done.stderr
    second = subprocess.run([*SERVE, str(store_path), "--socket", str(short_dir / "t.sock")],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2 and "is writing this store" in second.stderr
    with Client(sock) as client:
        assert client.ping() < 5


def test_client_refuses_what_the_service_would_refuse_without_sending(
        store_path: Path, short_dir: Path, tmp_path: Path, services: list[Service]) -> None:
    from evidence.client import AsyncClient, Client

    sock = short_dir / "s.sock"
    services.append(Service(store_path, sock, "--max-frame-bytes", "2000",
                            log=tmp_path / "service.log"))
    with Client(sock) as client:
        with pytest.raises(MessageError, match="frame limit"):
            client.submit_group([attempt("big", i) for i in range(40)])
        assert client.submit(attempt("big", 0)).status == "committed"
        assert client.statistics().connections == 1  # not dropped for a protocol error
    with pytest.raises(ServiceError, match="socket path or its address"):
        AsyncClient()
    with pytest.raises(ServiceError, match="not a loopback"):
        Client(address="10.0.0.1:7400")


def test_client_gives_up_after_reconnect_timeout(short_dir: Path) -> None:
    from evidence.client import Client, ClientLimits

    limits = ClientLimits(reconnect_timeout=0.5, backoff_initial=0.01)
    started = time.monotonic()
    with pytest.raises(ServiceError, match="no connection to the writer service"), \
            Client(short_dir / "nobody.sock", limits=limits):
        pass
    assert time.monotonic() - started < 5


def test_prometheus_text_is_well_formed() -> None:
    """The official parser reads it: every family typed, histograms cumulative."""
    from prometheus_client.parser import text_string_to_metric_families

    from evidence._model.acks import WriterStatistics
    from evidence._write.wire import ServiceStatistics

    fields: dict[str, object] = {name: 0 for name in WriterStatistics.__struct_fields__
                                 if name != "recorded"}
    fields.update(queue_depth=3, oldest_pending_age=0.25, batches=2,
                  batch_sizes={"1": 1, "10": 0, "50": 1, "inf": 0}, commit_latency_p50=0.001,
                  commit_latency_p99=0.01, commit_latency_max=0.02, busy_retries=1,
                  committed=40, duplicates=2, conflicts=1, tree_size=40,
                  commit_latencies={"0.001": 1, "0.025": 1, "inf": 0},
                  commit_latency_sum=0.021)
    writer = WriterStatistics(**fields)
    text = prometheus_text(ServiceStatistics(
        writer=writer, uptime=1.5, connected_clients=2, connections_total=3,
        requests_in_flight=1, pending_bytes=100, frames_received=5, messages_received=43,
        acks_sent=43, backpressure_waits=0, send_blocked_connections=0, slow_disconnects=0,
        protocol_errors={"unauthorized": 1}))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert all(f.type in ("counter", "gauge", "histogram") for f in families.values())
    samples = {(s.name, tuple(s.labels.items())): s.value
               for f in families.values() for s in f.samples}
    assert families["evidence_writer_batch_size_messages"].type == "histogram"
    assert samples[("evidence_writer_batch_size_messages_bucket", (("le", "50"),))] == 2
    assert samples[("evidence_writer_batch_size_messages_bucket", (("le", "+Inf"),))] == 2
    assert samples[("evidence_writer_batch_size_messages_sum", ())] == 43
    assert families["evidence_writer_commit_latency_seconds"].type == "histogram"
    assert samples[("evidence_writer_commit_latency_seconds_bucket", (("le", "0.001"),))] == 1
    assert samples[("evidence_writer_commit_latency_seconds_bucket", (("le", "+Inf"),))] == 2
    assert samples[("evidence_writer_commit_latency_seconds_count", ())] == 2
    assert samples[("evidence_writer_commit_latency_seconds_sum", ())] == 0.021
    assert families["evidence_writer_messages"].type == "counter"
    assert samples[("evidence_writer_messages_total", (("outcome", "conflict"),))] == 1
    assert samples[("evidence_service_protocol_errors_total", (("code", "unauthorized"),))] == 1
    assert families["evidence_service_connected_clients"].type == "gauge"


@pytest.mark.parametrize(("text", "parsed"), [
    ("127.0.0.1:7400", ("127.0.0.1", 7400)), ("localhost:0", ("127.0.0.1", 0)),
    ("[::1]:9", ("::1", 9)), ("127.8.9.10:1", ("127.8.9.10", 1)),
])
def test_loopback_addresses_are_accepted(text: str, parsed: tuple[str, int]) -> None:
    assert parse_loopback(text) == parsed


@pytest.mark.parametrize("text", ["0.0.0.0:1", "[::]:1", "10.1.2.3:80", "example.com:80",
                                  "127.0.0.1", "127.0.0.1:99999", ":80"])
def test_other_addresses_are_refused(text: str) -> None:
    with pytest.raises(ServiceError):
        parse_loopback(text)


def test_service_limits_defaults_bound_memory() -> None:
    limits = ServiceLimits()
    assert limits.max_pending_bytes >= limits.max_frame_bytes
    assert limits.connection_in_flight <= limits.max_in_flight


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        sys.exit(client_main(sys.argv[2:]))
    sys.exit(f"usage: python -m tests.test_service client ... (got {sys.argv[1:]})")


def test_wait_gone_returns_once_what_a_vanished_client_sent_has_committed(
        store_path: Path, short_dir: Path) -> None:
    # A crawl whose worker process dies settles that worker's pages from the store, after
    # Service.wait_gone: so everything the worker had sent must be committed by then.
    from evidence._write.limits import WriterLimits
    from evidence._write.service import Service

    socket_path = short_dir / "s.sock"
    message = attempt("victim", 1)

    async def main() -> tuple[bool, bool]:
        with Store.open(store_path) as store:
            # The writer lingers 0.5 s for more messages: the commit comes well after the
            # client is gone.
            async with Service(store, socket_path=socket_path, writer_limits=WriterLimits(
                    max_batch_delay=0.5, max_batch_messages=1000)) as service:
                stream = await anyio.connect_unix(socket_path)
                await stream.send(encode_frame(Hello(versions=[PROTOCOL_VERSION],
                                                     client="victim")))
                await stream.receive()  # the welcome
                await stream.send(encode_frame(Submit(
                    id=1, messages=[msgspec.Raw(canonical_encode(message))])))
                await anyio.sleep(0.05)  # read by the service, not committed yet
                await stream.aclose()  # the client vanishes without its ack

                def committed() -> bool:
                    with store.reader() as conn:
                        return bool(conn.execute(
                            "SELECT 1 FROM ingest_ledger WHERE message_id = ?",
                            (message.message_id,)).fetchall())

                before = committed()
                with anyio.fail_after(10):
                    await service.wait_gone("victim")
                return before, committed()

    before, after = anyio.run(main)
    assert not before, "the linger holds the commit back while the client vanishes"
    assert after, "wait_gone returned only once the vanished client's request committed"
