"""A writer service that one client cannot starve (issue 13).

The service runs in this process (on an event loop in a background thread, through an
anyio blocking portal) so each test sets its ``ServiceLimits`` directly; clients are raw
sockets that misbehave on purpose, and ``evidence.client.Client`` as the well-behaved one.
Latency is compared with a run without the misbehaving clients, in the same test.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest
from anyio.from_thread import start_blocking_portal

from evidence import Store, Writer
from evidence._write.limits import ServiceLimits
from evidence._write.service import Service
from evidence._write.wire import HEADER

from .test_service import SETUP, TOKEN, _frames, _hello, attempt


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


@contextlib.contextmanager
def serving(store_path: Path, sock: Path | None = None, *, token: str | None = None,
            **limits: object) -> Iterator[Service]:
    with Store.open(store_path) as store, start_blocking_portal() as portal:
        service = Service(store, socket_path=sock,
                          listen=None if sock is not None else "127.0.0.1:0", token=token,
                          limits=ServiceLimits(**limits))  # type: ignore[arg-type]
        with portal.wrap_async_context_manager(service):
            yield service


def _latencies(client, tag: str, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for i in range(n):
        started = time.perf_counter()
        ack = client.submit(attempt(tag, i))
        out.append(time.perf_counter() - started)
        assert ack.status == "committed"
    return out


def _in_time(fn, seconds: float):  # type: ignore[no-untyped-def]
    """``fn()`` in a thread; fail the test if it has not returned after ``seconds``."""
    result: list[object] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if failed:
        raise failed[0]
    assert result, f"still waiting after {seconds} s"
    return result[0]


def _read_until_closed(s: socket.socket, timeout: float) -> tuple[list[dict], float]:
    """Frames the service sent until it closed the connection, and when it closed."""
    s.settimeout(timeout)
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(65536):
            received += chunk
    return _frames(received), time.monotonic()


def test_slow_body_clients_do_not_delay_a_normal_clients_acks(
        store_path: Path, short_dir: Path) -> None:
    from evidence.client import Client

    sock = short_dir / "s.sock"
    slow: list[socket.socket] = []
    with serving(store_path, sock) as service, Client(sock) as client:
        before = _latencies(client, "before", 150)
        for _ in range(5):  # each declares a frame just under 16 MiB and sends one byte
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(sock))
            s.sendall(_hello() + HEADER.pack(16 * 1024 * 1024 - 64) + b"\x91")
            slow.append(s)
        deadline = time.monotonic() + 10
        while client.server_statistics().connected_clients < 6:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)  # their headers are read
        beside = _in_time(lambda: _latencies(client, "beside", 150), 60)
        stats = client.server_statistics()
        assert stats.connected_clients == 6, "the slow clients were still connected"
        assert stats.pending_bytes < 1024 * 1024, "they hold what they sent, not what they declared"
        for s in slow:
            s.close()
        after = _latencies(client, "after", 150)
    baseline = max(statistics.median(before), statistics.median(after))
    assert statistics.median(beside) <= 4 * baseline, (
        f"median ack latency {statistics.median(beside) * 1000:.1f} ms beside five slow "
        f"clients, {baseline * 1000:.1f} ms without")
    del service


def test_a_frame_body_sent_too_slowly_ends_its_connection(
        store_path: Path, short_dir: Path) -> None:
    sock = short_dir / "s.sock"
    with serving(store_path, sock, body_timeout=1.0):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(sock))
        s.sendall(_hello() + HEADER.pack(1000))
        started = time.monotonic()
        stop = threading.Event()

        def drip() -> None:
            while not stop.wait(0.2):
                try:
                    s.sendall(b"\x00")
                except OSError:
                    return

        threading.Thread(target=drip, daemon=True).start()
        try:
            frames, closed = _read_until_closed(s, 30)
        finally:
            stop.set()
            s.close()
    assert [f["type"] for f in frames] == ["welcome", "error"]
    assert frames[1]["code"] == "body_timeout"
    assert 1.0 <= closed - started < 15, "one byte every 0.2 s never trips a per-read timeout"


def test_unauthenticated_connections_cannot_lock_out_a_token_holder(store_path: Path) -> None:
    from evidence.client import Client, ClientLimits

    stop = threading.Event()
    # 80 silent connections: more than the 16 client slots, and more than the default 64
    # for connections yet to say hello (so the oldest of those are dropped all the time).
    with serving(store_path, token=TOKEN, max_connections=16,
                 handshake_timeout=60.0) as service:
        address = service.tcp_address
        assert address is not None

        def flood() -> None:  # connections that never say hello, reopened when dropped
            conns: list[socket.socket] = []
            while not stop.is_set():
                for c in [c for c in conns if _closed(c)]:
                    conns.remove(c)
                    c.close()
                while len(conns) < 80 and not stop.is_set():
                    with contextlib.suppress(OSError):
                        conns.append(socket.create_connection(address, timeout=5))
                time.sleep(0.01)
            for c in conns:
                c.close()

        attacker = threading.Thread(target=flood, daemon=True)
        attacker.start()
        try:
            deadline = time.monotonic() + 60
            # Every silent slot is taken and the oldest are being dropped for newer ones.
            while service.statistics().protocol_errors.get("too_many_unauthenticated", 0) < 16:
                assert time.monotonic() < deadline, "the silent connections never filled up"
                time.sleep(0.01)
            started = time.monotonic()

            def submit() -> list[str]:
                with Client(address="{}:{}".format(*address), token=TOKEN,
                            limits=ClientLimits(reconnect_timeout=None)) as client:
                    return [a.status for a in client.submit_many(
                        [attempt("holder", i) for i in range(20)])]

            statuses = _in_time(submit, 60)
            took = time.monotonic() - started
        finally:
            stop.set()
            attacker.join(10)
    assert statuses == ["committed"] * 20
    assert took < 20, f"the token holder waited {took:.1f} s behind silent connections"


def _closed(s: socket.socket) -> bool:
    try:
        s.setblocking(False)
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


def test_an_idle_authenticated_connection_is_closed_after_the_idle_timeout(
        store_path: Path, short_dir: Path) -> None:
    sock = short_dir / "s.sock"
    with serving(store_path, sock, idle_timeout=1.0):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(sock))
        s.sendall(_hello())
        started = time.monotonic()
        frames, closed = _read_until_closed(s, 30)
        s.close()
    assert [f["type"] for f in frames] == ["welcome", "error"]
    assert frames[1]["code"] == "idle_timeout" and frames[1]["retryable"] is True
    assert 1.0 <= closed - started < 10


def test_an_idle_client_reconnects_and_submits_after_the_idle_timeout(
        store_path: Path, short_dir: Path) -> None:
    from evidence.client import Client

    sock = short_dir / "s.sock"
    with serving(store_path, sock, idle_timeout=0.5), Client(sock) as client:
        assert client.submit(attempt("idle", 0)).status == "committed"
        time.sleep(1.5)  # dropped as idle meanwhile
        assert client.submit(attempt("idle", 1)).status == "committed"
        assert client.statistics().connections >= 2
    assert msgspec.json.encode(SETUP)  # the store fixture's setup messages were valid
