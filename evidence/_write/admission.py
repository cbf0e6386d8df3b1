"""Who may connect to the service, and how many at once.

A connection is counted among those yet to say hello (at most ``max_unauthenticated``; the
oldest is dropped for a newcomer), then admitted by its hello: the protocol version, the
token (or, with worker ``hosts``, which host's token it is, in constant time), a name or
host fenced for what it did, its role, and the places left (``max_connections``, and
``max_connections_per_peer`` for its peer, the process or address it comes from:
``peer_of``, which a client cannot choose). ``Admission`` holds those counts and the fences;
the service (``service.py``) reads the hello, asks ``admit``, and sends the welcome.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import socket
import struct
from collections.abc import Mapping

import anyio.abc

from .connection import ClientConnection
from .limits import ServiceLimits
from .wire import PROTOCOL_VERSION, Hello, ProtocolError, tokens_match

__all__ = ["Admission", "peer_in_words", "peer_of"]


class Admission:
    """The service's gate: connections waiting for their hello, those admitted (in all and
    per peer), and the client names and worker hosts fenced out."""

    def __init__(self, limits: ServiceLimits, *, token: str | None,
                 hosts: Mapping[str, bytes] | None) -> None:
        self.limits = limits
        self._token = token or None
        self._hosts = dict(hosts) if hosts else None
        self._fenced: set[str] = set()
        self._fenced_hosts: set[str] = set()
        self._unauthenticated: dict[ClientConnection, None] = {}  # oldest first
        self._authenticated = 0
        self._per_peer = collections.Counter[str]()  # authenticated connections by identity

    def fence(self, client: str) -> None:
        """Refuse the client named ``client`` (in its hello) from now on."""
        self._fenced.add(client)

    def fence_host(self, host: str) -> None:
        """Refuse worker host ``host`` (a ``hosts`` identity) from now on."""
        self._fenced_hosts.add(host)

    def waiting(self, conn: ClientConnection) -> None:
        """Count ``conn`` among the connections yet to say hello; at the limit, drop the
        oldest of them: whoever opens connections and says nothing cannot keep a token
        holder out (a real client says hello at once, and is never the oldest for long)."""
        while len(self._unauthenticated) >= max(self.limits.max_unauthenticated, 1):
            oldest = next(iter(self._unauthenticated))
            del self._unauthenticated[oldest]
            oldest.hello_scope.cancel()
        self._unauthenticated[conn] = None

    def not_waiting(self, conn: ClientConnection) -> None:
        """``conn`` no longer waits for its hello (refused, or gone)."""
        self._unauthenticated.pop(conn, None)

    def admit(self, conn: ClientConnection, hello: Hello, *, stopping: bool,
              takes_workers: bool) -> None:
        """Admit ``conn`` by its ``hello``, or raise the ``ProtocolError`` that refuses it.
        Counted here, with no await between the checks and the count: otherwise several
        hellos from one peer pass the checks at once."""
        if PROTOCOL_VERSION not in hello.versions:
            raise ProtocolError("unsupported_version", f"this service speaks protocol "
                                f"version {PROTOCOL_VERSION}, the client {hello.versions}")
        if conn.tcp and self._hosts is not None:
            conn.host = self.host_of(hello.token) or ""
            if not conn.host:
                raise ProtocolError("unauthorized", "not the token of a host in the "
                                    "coordinator's hosts file")
            if conn.host in self._fenced_hosts:
                raise ProtocolError("fenced", f"worker host {conn.host!r} was fenced for "
                                    "what it submitted; it is refused for the rest of the "
                                    "run (see the coordinator's log)")
        elif self._token is not None and not tokens_match(self._token, hello.token):
            raise ProtocolError("unauthorized", "wrong or missing token")
        if hello.client and hello.client in self._fenced:
            raise ProtocolError("lease_expired", f"{hello.client}: its leases expired and "
                                "were returned to the frontier; reconnect as a new worker")
        if hello.role not in ("", "worker"):
            raise ProtocolError("protocol", f"unknown role {hello.role!r}")
        if hello.role == "worker" and not takes_workers:
            raise ProtocolError("no_workers", "this service takes no worker hosts (only a "
                                "crawl started with --listen does)", retryable=True)
        if stopping:
            raise ProtocolError("shutting_down", "the service is stopping", retryable=True)
        if self._authenticated >= self.limits.max_connections:
            raise ProtocolError("too_many_connections", f"{self.limits.max_connections} "
                                "clients are connected; retry later", retryable=True)
        if self._per_peer[conn.identity] >= self.limits.max_connections_per_peer:
            raise ProtocolError("too_many_connections", f"{conn.identity} has "
                                f"{self.limits.max_connections_per_peer} connections open "
                                "(--max-connections-per-peer); retry later", retryable=True)
        self._unauthenticated.pop(conn, None)  # from here on it counts as a client
        self._authenticated += 1
        self._per_peer[conn.identity] += 1
        conn.counted = True

    def host_of(self, token: str) -> str | None:
        """The identity whose token this is (every entry compared, in constant time)."""
        assert self._hosts is not None
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for name, expected in self._hosts.items():
            if hmac.compare_digest(expected, digest):
                found = name
        return found

    def leave(self, conn: ClientConnection) -> None:
        """``conn`` closed: its place (if it had one) is free again."""
        self._unauthenticated.pop(conn, None)
        if conn.counted:
            self._authenticated -= 1
            self._per_peer[conn.identity] -= 1
            if not self._per_peer[conn.identity]:
                del self._per_peer[conn.identity]  # the map holds connected peers only


def peer_in_words(stream: anyio.abc.ByteStream) -> str:
    """Where a connection comes from, as the log says it (an address, or the socket)."""
    try:
        address = stream.extra(anyio.abc.SocketAttribute.remote_address)
    except anyio.TypedAttributeLookupError:
        return ""
    if isinstance(address, tuple):
        return f"from {address[0]}:{address[1]}"
    return "on the Unix socket"


_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_of(stream: anyio.abc.ByteStream) -> str:
    """Whom a connection counts against in ``max_connections_per_peer``: on the Unix socket
    the process at the other end, as the kernel reports it (``SO_PEERCRED``: a client cannot
    choose it; the socket is 0600, so every peer runs as the service's user, or as root,
    and a per-user count would be a second ``max_connections``); over TCP the address it
    comes from. Not the token: every client presents the same one."""
    try:
        sock = stream.extra(anyio.abc.SocketAttribute.raw_socket)
    except anyio.TypedAttributeLookupError:
        return "an unknown peer"
    if sock.family == socket.AF_UNIX:
        try:
            pid, uid, _ = _PEERCRED.unpack(sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        except (OSError, AttributeError):  # no SO_PEERCRED (not Linux): one peer
            return "the Unix socket"
        return f"process {pid} (uid {uid})"
    try:
        return f"address {sock.getpeername()[0]}"
    except OSError:  # gone already: it is refused at its first read anyway
        return "an unknown peer"
