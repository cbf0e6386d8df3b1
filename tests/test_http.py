"""The crawler's HTTP client against real servers on 127.0.0.1."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evidence._crawl.connection import _readable
from evidence._crawl.exchange import _request
from evidence._crawl.http import (
    MAX_INTERIM,
    Client,
    Exchange,
    FetchError,
    Headers,
    crawl_client,
)
from evidence._model.http1 import ChunkedBody

from .testca import make_authority

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


class Server:
    """A keep-alive HTTP/1.1 server that answers ``per_connection`` requests, then closes."""

    def __init__(self, per_connection: int, response: bytes = RESPONSE) -> None:
        self.per_connection = per_connection
        self.response = response
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
                conn.sendall(self.response)

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def closing_server():
    server = Server(per_connection=1)
    yield server
    server.close()


async def get(client: Client, url: str, cap: int = 1 << 20) -> tuple[int, Exchange]:
    exchange = Exchange("GET")
    response = await client.send("GET", url, {"User-Agent": "t"}, exchange)
    outcome, error, _ = await response.read_body(cap)
    assert outcome == "response", error
    return response.status_code, exchange


def served(server: Server, requests: int, *, connections: int) -> tuple[int, int]:
    """``requests`` GETs one after another, each answered 200: (requests the server saw,
    connections it accepted)."""
    try:
        url = f"http://127.0.0.1:{server.port}/"

        async def main() -> None:
            async with crawl_client(connections=connections, timeout=5.0) as client:
                for _ in range(requests):
                    assert (await get(client, url))[0] == 200

        anyio.run(main)
        return server.requests, server.connections
    finally:
        server.close()


def test_a_connection_the_server_closed_is_not_reused(closing_server: Server) -> None:
    """The idle check must see the server's FIN: otherwise the 2nd request fails."""
    url = f"http://127.0.0.1:{closing_server.port}/"

    async def main() -> list[int]:
        statuses: list[int] = []
        async with crawl_client(connections=4, timeout=5.0) as client:
            for _ in range(3):
                statuses.append((await get(client, url))[0])
                await anyio.sleep(0.2)  # let the server's close arrive
        return statuses

    assert anyio.run(main) == [200, 200, 200]
    assert closing_server.requests == 3
    assert closing_server.connections == 3


def test_a_live_connection_is_reused() -> None:
    assert served(Server(per_connection=100), 5, connections=4) == (5, 1)


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
            exchange = Exchange("GET")
            first = await client.send("GET", f"http://127.0.0.1:{port}/a", {}, exchange)
            await first.read_body(100)
            await get(client, f"http://127.0.0.1:{port}/b")
            return first.headers.get("set-cookie")

    try:
        assert anyio.run(main) == "session=abc; Path=/"
        thread.join(5)
    finally:
        listener.close()
    assert len(seen) == 2
    assert not any(b"cookie:" in head.lower() for head in seen)


def test_never_more_connections_than_the_limit_and_each_reused() -> None:
    server = Server(per_connection=1000)
    try:
        url = f"http://127.0.0.1:{server.port}/"

        async def main() -> None:
            async with crawl_client(connections=3, timeout=5.0) as client, \
                    anyio.create_task_group() as tg:
                for _ in range(40):
                    tg.start_soon(get, client, url)

        anyio.run(main)
        assert server.requests == 40 and server.connections == 3
    finally:
        server.close()


def test_a_response_abandoned_half_way_closes_its_connection() -> None:
    """A body left unread (a deadline, the cap) must never be read as the next response."""
    sent: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for reply in (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nfirst part ",
                      RESPONSE):
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.sendall(reply)
            sent.append(reply)
            threading.Timer(3, conn.close).start()

    threading.Thread(target=serve, daemon=True).start()

    async def main() -> tuple[str, bytes]:
        async with crawl_client(connections=1, timeout=5.0) as client:
            exchange = Exchange("GET")
            with anyio.move_on_after(0.3):
                response = await client.send("GET", f"http://127.0.0.1:{port}/a", {}, exchange)
                await response.read_body(1000)  # the other 89 bytes never come
            _, second = await get(client, f"http://127.0.0.1:{port}/b")
            return bytes(exchange.received).decode(), bytes(second.received)

    try:
        first, second = anyio.run(main)
    finally:
        listener.close()
    assert first.endswith("first part ")
    assert second == RESPONSE  # from a new connection, not the old one's unread bytes


@pytest.mark.parametrize(("url", "kind"), [
    ("ftp://127.0.0.1/x", "UnsupportedProtocol"),
    ("http:///nohost", "InvalidURL"),
    ("http://127.0.0.1:99999/", "InvalidURL"),
    ("http://127.0.0.1:1/", "ConnectError"),
])
def test_a_request_that_cannot_be_made_says_which_step_failed(url: str, kind: str) -> None:
    async def main() -> None:
        async with crawl_client(connections=1, timeout=5.0) as client:
            await client.send("GET", url, {}, Exchange("GET"))

    with pytest.raises(FetchError) as caught:
        anyio.run(main)
    assert caught.value.kind == kind and str(caught.value).startswith(kind + ": ")


def test_the_request_head_host_first_then_defaults_then_the_callers_fields() -> None:
    origin, data = _request("GET", "http://Example.COM:8080/a b/ü?q=1#frag",
                            {"User-Agent": "ua", "accept-encoding": "gzip", "X-One": "1"}, None)
    assert origin == ("http", "example.com", 8080)
    assert data == (b"GET /a%20b/%C3%BC?q=1 HTTP/1.1\r\nHost: example.com:8080\r\n"
                    b"Accept: */*\r\naccept-encoding: gzip\r\nConnection: keep-alive\r\n"
                    b"User-Agent: ua\r\nX-One: 1\r\n\r\n")
    origin, data = _request("POST", "https://[::1]/", {"Content-Length": "99"}, b"body")
    assert origin == ("https", "::1", 443)
    assert data.startswith(b"POST / HTTP/1.1\r\nHost: [::1]\r\n")
    assert data.endswith(b"\r\nContent-Length: 4\r\n\r\nbody")  # the body's, not the caller's
    assert _request("POST", "http://h/", {}, None)[1].endswith(b"Content-Length: 0\r\n\r\n")
    with pytest.raises(FetchError, match="cannot be sent"):
        _request("GET", "http://h/", {"X-Bad": "a\r\nInjected: yes"}, None)
    with pytest.raises(FetchError, match="cannot be sent"):
        _request("GET", "http://h/", {"X Bad": "a"}, None)


def test_https_is_verified_against_the_trusted_authorities(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server whose certificate the client trusts answers, recorded as plain bytes; the
    same server untrusted is a ConnectError that names the verification failure."""
    ca_file, context = make_authority(tmp_path)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                raw, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(raw, server_side=True) as conn:
                    conn.recv(65536)
                    conn.sendall(RESPONSE)
            except (ssl.SSLError, OSError):
                pass  # the untrusting client hangs up in the handshake

    threading.Thread(target=serve, daemon=True).start()
    url = f"https://127.0.0.1:{port}/secure"

    async def main() -> tuple[int, Exchange]:
        async with crawl_client(connections=1, timeout=5.0) as client:
            return await get(client, url)

    try:
        with pytest.raises(FetchError) as caught:  # certifi's bundle: no test CA in it
            anyio.run(main)
        assert caught.value.kind == "ConnectError"
        assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
        monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
        status, exchange = anyio.run(main)
    finally:
        listener.close()
    assert status == 200 and bytes(exchange.received) == RESPONSE
    assert bytes(exchange.sent).startswith(b"GET /secure HTTP/1.1\r\nHost: 127.0.0.1:")


@pytest.mark.parametrize("response", [
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",  # 1.0: no keep-alive
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok+",  # bytes after the body's end
])
def test_a_connection_its_response_did_not_leave_reusable_is_not_reused(
        response: bytes) -> None:
    assert served(Server(per_connection=100, response=response), 3, connections=1) == (3, 3)


def test_interim_responses_are_read_through_up_to_a_limit() -> None:
    """1xx heads before the final one belong to the response; a server sending them
    without end is refused once there are more than MAX_INTERIM."""
    interim = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"
    results = []
    for count in (2, MAX_INTERIM + 1):
        server = Server(per_connection=1, response=interim * count + RESPONSE)
        try:
            async def main(port: int = server.port) -> tuple[int, Exchange]:
                async with crawl_client(connections=1, timeout=5.0) as client:
                    return await get(client, f"http://127.0.0.1:{port}/")

            try:
                status, exchange = anyio.run(main)
                results.append((status, bytes(exchange.received)))
            except FetchError as exc:
                results.append((0, str(exc).encode()))
        finally:
            server.close()
    assert results[0] == (200, interim * 2 + RESPONSE)
    assert results[1] == (0, f"RemoteProtocolError: more than {MAX_INTERIM} interim (1xx) "
                             "responses".encode())


@given(st.lists(st.binary(min_size=0, max_size=40), max_size=12), st.data())
@settings(max_examples=200, deadline=None)
def test_a_chunked_body_found_as_it_comes_ends_where_the_whole_one_does(
        chunks: list[bytes], data: st.DataObject) -> None:
    """Any chunks, trailers, and any split of the bytes into reads: fed the bytes read so
    far, ChunkedBody answers None until the body is whole, then the same end as one pass
    over all of it, and it never goes back (each byte is looked at once, a chunk at most
    once per read that ends inside it)."""
    pieces = [b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c]
    starts = [5 + sum(map(len, pieces[:i])) for i in range(len(pieces) + 1)]  # chunk starts
    body = b"".join(pieces) + b"0\r\nX-T: 1\r\n\r\n"
    wire = b"HEAD-" + body + b"after"
    whole = ChunkedBody(5).end(wire)
    assert whole == len(wire) - len(b"after")
    cuts = sorted(data.draw(st.lists(st.integers(1, len(wire)), max_size=8)))
    scanner = ChunkedBody(5, strict=True)
    positions = []
    for cut in [*cuts, len(wire)]:
        end = scanner.end(wire[:cut])
        positions.append(scanner.pos)
        if cut < starts[-1]:  # inside the data chunks: it waits at the first one not whole
            assert scanner.pos == max(b for b in starts if b <= cut or b == 5)
        assert end is None if cut < whole else end == whole
        if end is not None:
            break
    assert positions == sorted(positions)


@pytest.mark.parametrize(("data", "problem"), [
    (b"zz\r\nhello\r\n", "not one"),
    (b"5\r\nhelloXX", "not followed by a line end"),
    (b"5;" + b"e" * (ChunkedBody.MAX_LINE + 1), "over 65536 bytes"),
    (b"0\r\nX-Long: " + b"v" * (ChunkedBody.MAX_LINE + 1), "over 65536 bytes"),
])
def test_a_chunked_body_that_stops_being_one_is_refused_by_the_client(
        data: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        ChunkedBody(0, strict=True).end(data)
    assert ChunkedBody(0).end(data) is None  # stored bytes read again: just no end


def test_response_headers_by_name_decoded_as_the_whole_head_allows() -> None:
    fields = [(b"Location", b"/caf\xc3\xa9"), (b"Set-Cookie", b"a=1"), (b"set-cookie", b"b=2")]
    headers = Headers(fields)
    assert headers.get("LOCATION") == "/café" and headers["location"] == "/café"
    assert headers.get("set-cookie") == "a=1, b=2"  # repeated: joined
    assert "Set-Cookie" in headers and "etag" not in headers and headers.get("etag") is None
    with pytest.raises(KeyError):
        headers["etag"]
    latin = Headers([(b"Location", b"/caf\xe9")])  # not UTF-8: Latin-1
    assert latin["location"] == "/café" and latin.encoding == "iso-8859-1"
    assert Headers([(b"A", b"b")]).encoding == "ascii"


_NAMES = st.sampled_from([b"Location", b"location", b"Content-Type", b"Retry-After", b"X-A"])


@given(st.lists(st.tuples(_NAMES, st.binary(max_size=12).filter(
    lambda v: b"\r" not in v and b"\n" not in v and v == v.strip(b" \t"))), max_size=6),
       st.sampled_from(["location", "LOCATION", "content-type", "retry-after", "x-a", "none"]))
@settings(max_examples=300, deadline=None)
def test_response_headers_read_as_httpx_read_them(
        fields: list[tuple[bytes, bytes]], name: str) -> None:
    """Any fields, any name asked: the value the crawler used to get from httpx.Headers
    (redirect targets, Retry-After, Content-Type) is the value it gets now."""
    import httpx

    assert Headers(fields).get(name) == httpx.Headers(fields).get(name)
