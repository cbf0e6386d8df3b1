"""Proxies for tests, on 127.0.0.1: an HTTP CONNECT proxy and a SOCKS5 one (RFC 1928, with
RFC 1929 username/password), each noting every tunnel it served (``tunnels``: the target
asked for, as sent) and every handshake it refused (``refused``).

Small and strict on purpose (no package: the ones on PyPI are servers to deploy, with
their own configuration and event loops, where a test wants a few lines it can read and
a count it can trust): a tunnel relays bytes both ways until either side closes; nothing
else is done with them. A proxy may require credentials (``credentials``), or refuse
every tunnel (``refuse``: the HTTP status, or the SOCKS reply code, it answers with).
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import select
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Proxy:
    kind: str  # "http" or "socks5"
    credentials: tuple[str, str] | None = None
    refuse: int | None = None
    port: int = 0
    tunnels: list[tuple[str, int]] = field(default_factory=list)  # (target, port) served
    refused: list[str] = field(default_factory=list)  # why each refused handshake was
    authorizations: list[str | None] = field(default_factory=list)  # as received (http)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, scheme: str | None = None, *, userinfo: str = "") -> str:
        at = f"{userinfo}@" if userinfo else ""
        return f"{scheme or self.kind}://{at}127.0.0.1:{self.port}"


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until one side closes (then the other is shut down too)."""
    sockets = [a, b]
    try:
        while True:
            readable, _, _ = select.select(sockets, [], [], 30)
            if not readable:
                return
            for sock in readable:
                data = sock.recv(65536)
                other = b if sock is a else a
                if not data:
                    with contextlib.suppress(OSError):
                        other.shutdown(socket.SHUT_WR)
                    sockets.remove(sock)
                    if not sockets:
                        return
                    continue
                other.sendall(data)
    except OSError:
        return


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            raise ConnectionError("closed")
        data += more
    return data


def _http(proxy: Proxy, client: socket.socket) -> None:
    head = b""
    while b"\r\n\r\n" not in head:
        more = client.recv(4096)
        if not more:
            return
        head += more
    lines = head.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":")
                                                         for line in lines[1:])}
    proxy.authorizations.append(fields.get("proxy-authorization"))
    if method != "CONNECT":
        proxy.refused.append(f"{method} {target}")
        client.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
        return
    if proxy.credentials is not None:
        token = base64.b64encode(":".join(proxy.credentials).encode()).decode()
        if fields.get("proxy-authorization") != f"Basic {token}":
            proxy.refused.append(f"407 {target}")
            client.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                           b"Proxy-Authenticate: Basic realm=\"test\"\r\n"
                           b"Content-Length: 0\r\n\r\n")
            return
    if proxy.refuse is not None:
        proxy.refused.append(f"{proxy.refuse} {target}")
        client.sendall(f"HTTP/1.1 {proxy.refuse} Refused\r\nContent-Length: 0\r\n\r\n"
                       .encode())
        return
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    upstream = socket.create_connection((host, int(port)), timeout=10)
    proxy.tunnels.append((host, int(port)))
    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    with upstream:
        _relay(client, upstream)


def _socks(proxy: Proxy, client: socket.socket) -> None:
    version, count = _read_exactly(client, 2)
    methods = _read_exactly(client, count)
    if version != 5:
        return
    if proxy.credentials is not None:
        if 2 not in methods:
            proxy.refused.append("no acceptable method")
            client.sendall(b"\x05\xff")
            return
        client.sendall(b"\x05\x02")
        _sub, size = _read_exactly(client, 2)
        user = _read_exactly(client, size).decode()
        password = _read_exactly(client, _read_exactly(client, 1)[0]).decode()
        if (user, password) != proxy.credentials:
            proxy.refused.append("bad credentials")
            client.sendall(b"\x01\x01")
            return
        client.sendall(b"\x01\x00")
    else:
        client.sendall(b"\x05\x00")
    _v, command, _r, kind = _read_exactly(client, 4)
    if kind == 1:
        host = str(ipaddress.IPv4Address(_read_exactly(client, 4)))
    elif kind == 4:
        host = str(ipaddress.IPv6Address(_read_exactly(client, 16)))
    else:
        host = _read_exactly(client, _read_exactly(client, 1)[0]).decode()
    (port,) = struct.unpack("!H", _read_exactly(client, 2))
    bound = b"\x01\x7f\x00\x00\x01\x00\x00"
    if command != 1 or proxy.refuse is not None:
        code = proxy.refuse if proxy.refuse is not None else 7
        proxy.refused.append(f"{code} {host}:{port}")
        client.sendall(bytes([5, code, 0]) + bound)
        return
    try:
        upstream = socket.create_connection((host, port), timeout=10)
    except OSError:
        proxy.refused.append(f"5 {host}:{port}")
        client.sendall(b"\x05\x05\x00" + bound)
        return
    proxy.tunnels.append((host, port))
    client.sendall(b"\x05\x00\x00" + bound)
    with upstream:
        _relay(client, upstream)


@contextlib.contextmanager
def running(kind: str, *, credentials: tuple[str, str] | None = None,
            refuse: int | None = None) -> Iterator[Proxy]:
    """A proxy of ``kind`` listening on 127.0.0.1 (a free port) while the block runs."""
    proxy = Proxy(kind, credentials, refuse)
    listener = socket.create_server(("127.0.0.1", 0))
    proxy.port = listener.getsockname()[1]
    serve = _http if kind == "http" else _socks
    stop = threading.Event()

    def one(client: socket.socket) -> None:
        with client, contextlib.suppress(OSError, ConnectionError, ValueError):
            serve(proxy, client)

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=one, args=(client,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() under way
        listener.close()
        thread.join(timeout=10)
