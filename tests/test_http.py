"""The crawler's HTTP client (evidence._http) against real servers on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time

import anyio

from evidence._http import _Backend, _readable, crawl_client


def test_readable_means_data_or_a_closed_peer() -> None:
    ours, peer = socket.socketpair()
    with ours:
        assert not _readable(ours), "an idle open connection is not readable"
        peer.sendall(b"x")
        assert _readable(ours)
        assert ours.recv(1) == b"x"
        assert not _readable(ours)
        peer.close()
        assert _readable(ours), "a closed peer is readable (the read returns b'')"


def _server_closing_after_each_response() -> tuple[socket.socket, list[int]]:
    """A server that answers one keep-alive response per connection, then hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))
    connections: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                connections.append(1)
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                             b"Connection: keep-alive\r\n\r\nok")
                time.sleep(0.02)  # the close comes after the client has read the response

    threading.Thread(target=serve, daemon=True).start()
    return listener, connections


def test_a_server_hanging_up_after_each_response_costs_a_connection_not_a_page() -> None:
    listener, connections = _server_closing_after_each_response()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/"

    async def main() -> list[int]:
        async with crawl_client(connections=4, timeout=5) as client:
            statuses = []
            for _ in range(3):
                response = await client.get(url)
                statuses.append(response.status_code)
                await anyio.sleep(0.1)  # the server's FIN arrives while the connection idles
            return statuses

    try:
        assert anyio.run(main) == [200, 200, 200]
        assert len(connections) == 3, "each request found its idle connection closed"
    finally:
        listener.close()


def test_the_cheaper_readability_check_is_installed() -> None:
    # If httpcore moves its pool's network backend, crawl_client falls back to the plain
    # client (correct, slower); this test is how we find out.
    client = crawl_client(connections=2, timeout=5)
    pool = client._transport._pool  # type: ignore[attr-defined]
    assert isinstance(pool._network_backend, _Backend)
