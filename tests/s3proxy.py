"""A small HTTP proxy on 127.0.0.1 in front of the S3 server, for failure tests.

A real network peer between the client and the server: it reads each request (head and
``Content-Length`` body), records its head, and by a rule of the test's either forwards it
to the server and relays the answer (upstream with ``Connection: close``, so one answer per
upstream connection, read to its end), answers itself with an error status, cuts the
client's connection before or after the server got the request, or holds the request
until an event (so a test can kill the server while a put is in flight).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body_size: int


@dataclass
class Action:
    """What to do with one request: ``forward``, ``status`` (answer it with ``status``
    ourselves), ``cut_before`` (close without sending it on), ``cut_after`` (send it on,
    read the answer, close without relaying it), ``partial`` (send the head and half the
    body on, set ``sent``, wait for ``hold``, then send the rest); ``hold``: otherwise,
    wait for this event before anything."""

    kind: str = "forward"
    status: int = 503
    hold: threading.Event | None = None
    sent: threading.Event | None = None


Rule = Callable[[Seen, int], Action]  # (request, its index among all requests) -> action


@dataclass
class S3Proxy:
    upstream: tuple[str, int]
    rule: Rule = field(default=lambda seen, n: Action())
    seen: list[Seen] = field(default_factory=list)
    address: tuple[str, int] = ("127.0.0.1", 0)
    received: threading.Event = field(default_factory=threading.Event)  # a request's head

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._closed = False
        self._threads: list[threading.Thread] = []
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)

    @property
    def endpoint(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> S3Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            buffer = b""
            while True:
                try:
                    request, buffer = _read_request(conn, buffer)
                except (OSError, ConnectionError):
                    return
                if request is None:
                    return
                head, body = request
                seen = _parse(head, len(body))
                with self._lock:
                    index = len(self.seen)
                    self.seen.append(seen)
                self.received.set()
                action = self.rule(seen, index)
                if action.hold is not None and action.kind != "partial":
                    action.hold.wait(60)
                if action.kind == "status":
                    text = f"<Error><Code>Injected</Code><Message>{action.status}</Message></Error>"
                    conn.sendall((f"HTTP/1.1 {action.status} Injected\r\nContent-Type: "
                                  f"application/xml\r\nContent-Length: {len(text)}\r\n\r\n"
                                  f"{text}").encode())
                    continue
                if action.kind == "cut_before":
                    return
                try:
                    answer = self._forward(head, body, action)
                except OSError:
                    return  # the server is gone: the client sees its connection end
                if action.kind == "cut_after":
                    return
                try:
                    conn.sendall(answer)
                except OSError:
                    return
                return  # upstream closed after its answer: so do we (Connection: close)

    def _forward(self, head: bytes, body: bytes, action: Action) -> bytes:
        lines = head.split(b"\r\n")
        kept = [line for line in lines[1:] if line and not line.lower().startswith(
            b"connection:")]
        request = b"\r\n".join([lines[0], *kept, b"Connection: close", b"", b""]) + body
        with socket.create_connection(self.upstream, timeout=30) as up:
            if action.kind == "partial":
                cut = len(request) - len(body) // 2
                up.sendall(request[:cut])
                assert action.sent is not None and action.hold is not None
                action.sent.set()
                action.hold.wait(60)
                request = request[cut:]
            up.sendall(request)
            chunks = []
            while True:
                data = up.recv(65536)
                if not data:
                    break
                chunks.append(data)
        return b"".join(chunks)


def _read_request(conn: socket.socket, buffer: bytes
                  ) -> tuple[tuple[bytes, bytes] | None, bytes]:
    while b"\r\n\r\n" not in buffer:
        data = conn.recv(65536)
        if not data:
            return None, b""
        buffer += data
    head, _, rest = buffer.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        data = conn.recv(65536)
        if not data:
            raise ConnectionError("the client went away mid-body")
        rest += data
    return (head, rest[:length]), rest[length:]


def _parse(head: bytes, body_size: int) -> Seen:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Seen(method=method, path=path, headers=headers, body_size=body_size)
