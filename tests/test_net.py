"""evidence._net: byte streams over asyncio transports, on real sockets."""

from __future__ import annotations

import socket
import struct
import time

import anyio
import anyio.abc
import pytest

from evidence import _net


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)


def test_bytes_arrive_in_order_and_end_of_stream_is_reported():
    async def main() -> list[bytes]:
        ours, theirs = _pair()
        stream = await _net.wrap_socket(ours)
        assert isinstance(stream, _net.Stream)
        theirs.sendall(b"hello ")
        theirs.sendall(b"world")
        theirs.shutdown(socket.SHUT_WR)
        got = []
        try:
            while True:
                got.append(await stream.receive(4))
        except anyio.EndOfStream:
            pass
        await stream.send(b"back")
        await stream.aclose()
        assert theirs.recv(10) == b"back"
        theirs.close()
        return got

    got = anyio.run(main)
    assert b"".join(got) == b"hello world"
    assert max(len(chunk) for chunk in got) <= 4  # max_bytes honoured


def test_a_read_waits_at_most_the_timeout():
    async def main() -> float:
        ours, theirs = _pair()
        stream = await _net.wrap_socket(ours, timeout=0.2)
        started = time.monotonic()
        with anyio.fail_after(5), pytest.raises(TimeoutError):  # ours, not fail_after's
            await stream.receive()
        waited = time.monotonic() - started
        theirs.sendall(b"late")  # the stream is still usable after a timeout
        assert await stream.receive() == b"late"
        await stream.aclose()
        theirs.close()
        return waited

    assert 0.15 <= anyio.run(main) < 5


def test_a_cancel_scope_cancels_a_waiting_read():
    async def main() -> None:
        ours, theirs = _pair()
        stream = await _net.wrap_socket(ours)
        with anyio.move_on_after(0.1) as scope:
            await stream.receive()
        assert scope.cancelled_caught
        theirs.sendall(b"next")
        assert await stream.receive() == b"next"
        await stream.aclose()
        theirs.close()

    anyio.run(main)


def test_a_peer_that_floods_is_held_to_a_bound():
    """A peer sending without pause fills the buffer to about _HIGH_WATER; then reading
    pauses and the rest waits in the kernel (the sender blocks), not in our memory."""
    async def main() -> tuple[int, int]:
        ours, theirs = _pair()
        theirs.setblocking(False)
        stream = await _net.wrap_socket(ours)
        assert isinstance(stream, _net.Stream)
        sent = 0
        chunk = b"x" * 65536
        for _ in range(200):  # 12.5 MiB offered
            try:
                sent += theirs.send(chunk)
            except BlockingIOError:
                await anyio.sleep(0.01)
        held = stream._protocol.held
        total = 0
        while total < sent:
            total += len(await stream.receive())
        await stream.aclose()
        theirs.close()
        return held, sent

    held, sent = anyio.run(main)
    assert held <= _net._HIGH_WATER + 2 * 65536 * 4  # one read past the mark at most
    assert sent > held  # the rest waited in the kernel


def test_at_rest_tells_an_idle_connection_from_one_the_peer_closed():
    async def main() -> tuple[bool, bool, bool]:
        ours, theirs = _pair()
        stream = await _net.wrap_socket(ours)
        assert isinstance(stream, _net.Stream)
        idle = stream.at_rest()
        theirs.sendall(b"unasked")
        await anyio.sleep(0.05)
        unasked = stream.at_rest()
        await stream.receive()
        theirs.close()
        await anyio.sleep(0.05)
        closed = stream.at_rest()
        await stream.aclose()
        return idle, unasked, closed

    assert anyio.run(main) == (True, False, False)


def test_a_reset_connection_reads_as_broken_and_sends_fail():
    async def main() -> None:
        with socket.create_server(("127.0.0.1", 0)) as server:
            stream = await _net.connect_tcp("127.0.0.1", server.getsockname()[1])
            assert isinstance(stream, _net.Stream)
            accepted, _ = server.accept()
            accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                struct.pack("ii", 1, 0))
            accepted.close()  # linger 0: the close sends a reset
            with pytest.raises((anyio.BrokenResourceError, anyio.EndOfStream)):
                await stream.receive()
            with pytest.raises(anyio.BrokenResourceError):
                await stream.send(b"after the reset")
            await stream.aclose()
            with pytest.raises(anyio.ClosedResourceError):
                await stream.receive()

    anyio.run(main)


def test_adopt_takes_over_an_accepted_unix_stream(tmp_path):
    async def main() -> bytes:
        path = str(tmp_path / "s.sock")
        async with await anyio.create_unix_listener(path) as listener:
            client = await _net.connect_unix(path)
            accepted = await _net.adopt(await listener.accept())
            assert isinstance(accepted, _net.Stream)
            assert accepted.extra(anyio.abc.SocketAttribute.family) == socket.AF_UNIX
            await client.send(b"ping")
            got = await accepted.receive()
            await accepted.send(b"pong")
            assert await client.receive() == b"pong"
            await client.aclose()
            await accepted.aclose()
            return got

    assert anyio.run(main) == b"ping"
