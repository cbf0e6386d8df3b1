"""One connection of the crawler's HTTP client (``_crawl.http``), and with whom and how it
was made: the stream (a ``_net`` stream under asyncio, TLS or not, perhaps inside a
proxy's tunnel), whether it can still be used, and its ``Peer``: the remote and local
addresses as the socket reports them, the resolver's answer, and for TLS the version,
cipher, ALPN protocol, SNI and the certificate chain as the server presented it.

Separate from the client because it is what both protocols run over: an HTTP/1.1
response (``_crawl.http``) and an HTTP/2 connection (``_crawl.h2connection``) read and
write a ``_Connection`` and nothing below it, and the exchanges over it carry its
``Peer`` as evidence.
"""

from __future__ import annotations

import contextlib
import ipaddress
import select
import socket
import ssl
from dataclasses import dataclass

import anyio
import anyio.abc
from anyio.streams.tls import TLSAttribute, TLSStream

from .._model.messages import DnsAnswer
from .._net import Stream
from .netpolicy import Origin
from .proxy import Tunnel

__all__ = ["KEEPALIVE", "MAX_HEAD", "READ_SIZE", "Peer"]

KEEPALIVE = 5.0  # seconds an idle connection is kept
MAX_HEAD = 256 * 1024  # bytes of response heads (interim ones included) the client reads
READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class Peer:
    """With whom and how a connection was made (the module's doc): addresses as the socket
    reports them; the TLS fields are None on a plain connection."""

    remote_address: str
    remote_port: int
    local_address: str
    local_port: int
    dns: DnsAnswer | None = None  # the answer the remote address came from
    tls_version: str | None = None
    tls_cipher: str | None = None
    alpn: str | None = None
    sni: str | None = None
    chain: tuple[bytes, ...] = ()  # DER certificates, leaf first, as the server sent them
    verified: bool = False
    proxy: Tunnel | None = None  # the tunnel it went through (``_crawl.proxy``)


class _Connection:
    __slots__ = ("alpn", "idle_since", "origin", "peer", "raw", "requests", "socket",
                 "stream")

    def __init__(self, origin: Origin, stream: anyio.abc.ByteStream,
                 dns: DnsAnswer | None = None, tunnel: Tunnel | None = None) -> None:
        self.origin, self.stream = origin, stream
        self.requests = 0  # requests written over it so far
        inner = stream.transport_stream if isinstance(stream, TLSStream) else stream
        # A _net.Stream bounds each of its waits itself (the client's timeout); anyio's
        # streams (under trio) are bounded by a cancel scope per call.
        self.raw: Stream | None = inner if isinstance(inner, Stream) else None
        self.socket: socket.socket | None = stream.extra(anyio.abc.SocketAttribute.raw_socket,
                                                         None)
        self.idle_since = 0.0
        self.peer = _peer(self.socket, stream, origin, dns, tunnel)
        tls = stream.extra(TLSAttribute.ssl_object, None)
        self.alpn: str | None = None if tls is None else tls.selected_alpn_protocol()

    def readable(self) -> bool:
        """Whether a read would not block (the server closed it, or sent bytes unasked)."""
        if self.raw is not None:
            return not self.raw.at_rest()
        return _readable(self.socket)

    def bounded(self, timeout: float) -> contextlib.AbstractContextManager[object]:
        """Where a read or write waits at most ``timeout`` seconds (TimeoutError)."""
        return contextlib.nullcontext() if self.raw is not None else anyio.fail_after(timeout)

    async def close(self) -> None:
        with anyio.CancelScope(shield=True):
            with contextlib.suppress(OSError, anyio.BrokenResourceError):
                await self.stream.aclose()


def _peer(sock: socket.socket | None, stream: anyio.abc.ByteStream, origin: Origin,
          dns: DnsAnswer | None, tunnel: Tunnel | None = None) -> Peer | None:
    """What the socket and the TLS layer say of a connection just made (None if the socket
    cannot say whom it is connected to: then nothing is claimed)."""
    if sock is None:
        return None
    try:
        remote, local = sock.getpeername()[:2], sock.getsockname()[:2]
    except OSError:
        return None
    tls = stream.extra(TLSAttribute.ssl_object, None)
    if tls is None:
        return Peer(remote[0], remote[1], local[0], local[1], dns, proxy=tunnel)
    cipher = tls.cipher()
    sni: str | None = origin.host
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(origin.host)
        sni = None  # TLS never names an address literal (RFC 6066 section 3)
    return Peer(remote[0], remote[1], local[0], local[1], dns, tls_version=tls.version(),
                tls_cipher=cipher[0] if cipher else None, alpn=tls.selected_alpn_protocol(),
                sni=sni, chain=_chain(tls),
                verified=tls.context.verify_mode == ssl.CERT_REQUIRED, proxy=tunnel)


def _chain(tls: ssl.SSLObject) -> tuple[bytes, ...]:
    """The certificates the server presented, DER, leaf first: ``get_unverified_chain``
    (public since Python 3.13; the same method of the C object before), else the leaf."""
    chain = getattr(tls, "get_unverified_chain", None)
    if chain is None:
        chain = getattr(getattr(tls, "_sslobj", None), "get_unverified_chain", None)
    if chain is not None:
        certificates = chain() or []
        der = ssl._ssl.ENCODING_DER  # type: ignore[attr-defined]
        return tuple(c if isinstance(c, bytes) else c.public_bytes(der) for c in certificates)
    leaf = tls.getpeercert(binary_form=True)
    return (leaf,) if leaf else ()


def _readable(sock: socket.socket | None) -> bool:
    """Whether a read would not block; a socket that is gone counts as readable (EOF)."""
    fd = -1 if sock is None else sock.fileno()
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
