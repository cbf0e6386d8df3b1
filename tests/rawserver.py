"""A raw-socket HTTP/1.1 server on 127.0.0.1 that writes exactly the bytes a test scripts.

Every response is a list of byte strings written in order (with an optional pause between
them, so the client reads them in separate reads), then the connection is kept open for
the next request or closed (``close=True``), or held open without closing (``hold``
seconds, for timeouts). The server keeps its own copy of every request it read and every
byte it wrote, per request, which is what the tests compare the store against.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Reply:
    parts: list[bytes]
    close: bool = False  # close the connection after the last part
    pause: float = 0.0  # seconds between parts
    hold: float = 0.0  # after the parts, wait this long before going on

    @property
    def data(self) -> bytes:
        return b"".join(self.parts)


@dataclass
class Exchanged:
    path: str
    received: bytes  # the request, as the server read it
    sent: bytes  # what the server wrote
    connection: int


@dataclass
class RawServer:
    routes: dict[str, Reply]
    exchanges: list[Exchanged] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def exchange(self, path: str, wait: float = 10.0) -> Exchanged:
        """The one exchange of ``path``. It is logged once its answer is sent, so a client
        can hold the answer a moment before the log does: wait for it (up to ``wait``)."""
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                found = [e for e in self.exchanges if e.path == path]
            if found or time.monotonic() >= deadline:
                break
            time.sleep(0.01)
        assert len(found) == 1, f"{path}: {len(found)} requests"
        return found[0]

    def close(self) -> None:
        self._listener.close()

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                number = self.connections
            thread = threading.Thread(target=self._serve, args=(conn, number), daemon=True)
            thread.start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        buffered = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffered:
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buffered += chunk
                end = buffered.index(b"\r\n\r\n") + 4
                request, buffered = buffered[:end], buffered[end:]
                path = request.split(b" ", 2)[1].decode("latin-1")
                reply = self.routes.get(path, Reply([b"HTTP/1.1 404 Not Found\r\n"
                                                     b"Content-Length: 0\r\n\r\n"]))
                sent = b""
                try:
                    for i, part in enumerate(reply.parts):
                        if i and reply.pause:
                            time.sleep(reply.pause)
                        conn.sendall(part)
                        sent += part
                except OSError:
                    pass
                with self._lock:
                    self.exchanges.append(Exchanged(path, request, sent, number))
                if reply.hold:
                    time.sleep(reply.hold)
                if reply.close:
                    return
