"""The crawler's HTTP client against real servers on 127.0.0.1."""

from __future__ import annotations

import socket
import threading

import anyio
import pytest

from evidence._crawl.http import _Backend, _readable, crawl_client

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


class Server:
    """A keep-alive HTTP/1.1 server that answers ``per_connection`` requests, then closes."""

    def __init__(self, per_connection: int) -> None:
        self.per_connection = per_connection
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            buffered = b""
            for _ in range(self.per_connection):
                while b"\r\n\r\n" not in buffered:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffered += chunk
                buffered = buffered.split(b"\r\n\r\n", 1)[1]
                self.requests += 1
                conn.sendall(RESPONSE)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def closing_server():
    server = Server(per_connection=1)
    yield server
    server.close()


def test_the_pool_runs_on_our_backend() -> None:
    async def main() -> None:
        async with crawl_client(connections=4, timeout=5.0) as client:
            pool = client._transport._pool  # what crawl_client replaced
            assert isinstance(pool._network_backend, _Backend)

    anyio.run(main)


def test_a_connection_the_server_closed_is_not_reused(closing_server: Server) -> None:
    """The idle check must see the server's FIN: otherwise the 2nd request fails."""
    url = f"http://127.0.0.1:{closing_server.port}/"

    async def main() -> list[int]:
        statuses = []
        async with crawl_client(connections=4, timeout=5.0) as client:
            for _ in range(3):
                response = await client.get(url)
                statuses.append(response.status_code)
                await anyio.sleep(0.2)  # let the server's close arrive
        return statuses

    assert anyio.run(main) == [200, 200, 200]
    assert closing_server.requests == 3
    assert closing_server.connections == 3


def test_a_live_connection_is_reused() -> None:
    server = Server(per_connection=100)
    try:
        url = f"http://127.0.0.1:{server.port}/"

        async def main() -> None:
            async with crawl_client(connections=4, timeout=5.0) as client:
                for _ in range(5):
                    assert (await client.get(url)).status_code == 200

        anyio.run(main)
        assert (server.requests, server.connections) == (5, 1)
    finally:
        server.close()


def test_readable_answers_for_data_eof_and_a_closed_socket() -> None:
    left, right = socket.socketpair()
    try:
        assert not _readable(left)
        right.sendall(b"x")
        assert _readable(left)
        left.recv(1)
        right.close()
        assert _readable(left)  # EOF is readable
    finally:
        left.close()
    assert _readable(left)  # closed: fileno() is -1
    assert _readable(None)


def test_cookies_are_neither_kept_nor_sent() -> None:
    """A Set-Cookie is evidence in the response head; the next request carries no Cookie."""
    seen: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            buffered = b""
            for _ in range(2):
                while b"\r\n\r\n" not in buffered:
                    buffered += conn.recv(65536)
                head, buffered = buffered.split(b"\r\n\r\n", 1)
                seen.append(head)
                conn.sendall(b"HTTP/1.1 200 OK\r\nSet-Cookie: session=abc; Path=/\r\n"
                             b"Content-Length: 2\r\n\r\nok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    async def main() -> str | None:
        async with crawl_client(connections=1, timeout=5.0) as client:
            first = await client.get(f"http://127.0.0.1:{port}/a")
            await client.get(f"http://127.0.0.1:{port}/b")
            return first.headers.get("set-cookie")

    try:
        assert anyio.run(main) == "session=abc; Path=/"
        thread.join(5)
    finally:
        listener.close()
    assert len(seen) == 2
    assert not any(b"cookie:" in head.lower() for head in seen)
