"""Connections through a proxy (issue 36): HTTP CONNECT and SOCKS5 tunnels for the
crawler's client (``_crawl.http``), and which proxy, if any, each host goes through.

Every origin goes through a tunnel, ``http`` as well as ``https``: the client speaks to
the origin inside it exactly as it would directly, so the bytes it records are those
exchanged with the origin, never a request in the proxy's absolute form. The handshake
that opened the tunnel (the CONNECT request and answer, the SOCKS negotiation) is not
part of any exchange: it is a fact of the connection (``Tunnel``, recorded as the
attempt's ``connection.proxy``), like its TLS parameters.

The network policy (``_crawl.netpolicy``) keeps its meaning through a proxy:

- the proxy's own address is checked like any connection's; a proxy the operator named
  is an origin of its own, allowed at its own address and port like a seed's
  (``NetworkPolicy(seeds=...)`` is given the proxies' URLs), and nothing more;
- ``http`` and ``socks5``: the crawler resolves the origin itself, checks each address as
  for a direct connection, and asks the proxy for a checked address (``CONNECT
  93.184.215.14:443``; SOCKS with an IPv4 or IPv6 address), never the name: a refused
  origin never reaches the proxy. TLS still sends the name (SNI, and the certificate is
  verified for it), and the request's ``Host`` is the name;
- ``socks5h``: the proxy resolves the name, which the crawler then cannot check (the
  proxy may reach a network the policy forbids). A crawl refuses it unless the operator
  says so (``--proxy-remote-dns``); the attempt records the name as the target.

Credentials (``http://user:pass@host:port``, RFC 1929 username/password for SOCKS5) are
secrets: ``Proxy.url`` and every record, log line and error name the proxy without them.
A proxy that refuses (a non-2xx answer to CONNECT, 407 included; a SOCKS failure) raises
``ProxyFailed`` carrying the facts of the refusal, so the attempt records which proxy
refused and what it said; a proxy that cannot be reached raises it with no facts.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import ipaddress
import re
import ssl
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import anyio
import anyio.abc
from anyio.streams.tls import TLSStream

from .._errors import EvidenceError
from .._model.messages import DnsAnswer, Proxied, ProxyScheme
from .._net import connect_tcp
from .netpolicy import NetworkPolicy, Origin, Refused, system_resolver

__all__ = ["SCHEMES", "Credentials", "Proxy", "ProxyFailed", "Routes", "Tunnel",
           "crawl_routes", "open_tunnel", "parse_proxy", "parse_routes", "recordable"]

SCHEMES: tuple[ProxyScheme, ...] = ("http", "socks5", "socks5h")
MAX_REPLY_HEAD = 16 * 1024  # bytes of a CONNECT answer's head the client reads
_STATUS = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: [^\r\n]*)?\r?\n")
# RFC 1928 section 6: the reply field, in words.
_SOCKS_REPLIES = {
    1: "general SOCKS server failure", 2: "connection not allowed by ruleset",
    3: "network unreachable", 4: "host unreachable", 5: "connection refused",
    6: "TTL expired", 7: "command not supported", 8: "address type not supported"}
_NEXT_ADDRESS = frozenset({3, 4, 5, 6})  # a SOCKS reply after which another address may do


@dataclass(frozen=True)
class Proxy:
    """A proxy as configured: ``url`` names it without its credentials."""

    scheme: ProxyScheme
    host: str  # lower case, IDNA-encoded, IPv6 without brackets
    port: int
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{name}:{self.port}"

    @property
    def origin(self) -> Origin:
        """The proxy as the network policy names it (``origin_of(self.url)``)."""
        return Origin(self.scheme, self.host, self.port)


def parse_proxy(text: str) -> Proxy | None:
    """``none`` (None: connect directly), or ``scheme://[user:pass@]host:port`` with a
    scheme of ``SCHEMES``; EvidenceError naming what is wrong (never the password)."""
    if text.strip().lower() == "none":
        return None
    hint = ("give none, or http://HOST:PORT, socks5://HOST:PORT or socks5h://HOST:PORT, "
            "with USER:PASSWORD@ before the host if the proxy asks for them")
    try:
        parts = urlsplit(text.strip())
        port = parts.port
        host = parts.hostname or ""
    except ValueError:
        raise EvidenceError(f"proxy {_redacted(text)!r} is not a URL", hint=hint) from None
    scheme = parts.scheme.lower()
    shown = _redacted(text)
    if scheme not in SCHEMES:
        raise EvidenceError(f"proxy {shown!r}: the scheme must be one of "
                            f"{', '.join(SCHEMES)}", hint=hint)
    if not host or port is None:
        raise EvidenceError(f"proxy {shown!r} names no host and port", hint=hint)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise EvidenceError(f"proxy {shown!r}: a proxy URL has no path, query or fragment",
                            hint=hint)
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise EvidenceError(f"proxy {shown!r}: host {host!r} is not a valid name",
                                hint=hint) from None
    username = None if parts.username is None else unquote(parts.username)
    password = None if parts.password is None else unquote(parts.password)
    if username is not None and scheme != "http" and (
            len(username.encode()) > 255 or len((password or "").encode()) > 255):
        raise EvidenceError(f"proxy {shown!r}: a SOCKS5 username or password is at most "
                            "255 bytes (RFC 1929)", hint=hint)
    return Proxy(scheme, host.lower(), port, username, password)


def _redacted(text: str) -> str:
    """A proxy URL as it may be shown: its userinfo, if any, replaced by ``***``."""
    scheme, sep, rest = text.strip().partition("://")
    if not sep:
        return text.strip()[:200]
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}{sep}{authority}{slash}{path}"[:200]


class Routes:
    """Which proxy each host goes through: the first rule whose patterns match the host,
    else ``default`` (None: directly). A pattern is a host name, or one with ``*``
    wildcards (``*.example.com`` is every name under example.com, not example.com
    itself; ``*`` is every host), compared case-insensitively."""

    def __init__(self, default: Proxy | None = None,
                 rules: Iterable[tuple[tuple[str, ...], Proxy | None]] = ()) -> None:
        self.default = default
        self.rules = [(tuple(p.lower() for p in patterns), proxy) for patterns, proxy in rules]

    def __bool__(self) -> bool:
        return self.default is not None or any(proxy for _, proxy in self.rules)

    def for_host(self, host: str) -> Proxy | None:
        host = host.lower().rstrip(".")
        for patterns, proxy in self.rules:
            if any(fnmatch.fnmatchcase(host, pattern) for pattern in patterns):
                return proxy
        return self.default

    def proxies(self) -> list[Proxy]:
        """Every proxy a host may go through, each once."""
        found = [self.default] + [proxy for _, proxy in self.rules]
        return list({p.url: p for p in found if p is not None}.values())

    def urls(self) -> list[str]:
        """The proxies' URLs (no credentials): origins of their own to the network policy,
        allowed at their own address and port like a seed's."""
        return [p.url for p in self.proxies()]

    def remote_dns(self) -> list[Proxy]:
        """The proxies that resolve origin names themselves (``socks5h``)."""
        return [p for p in self.proxies() if p.scheme == "socks5h"]


def parse_routes(default: str | None, rules: Iterable[Mapping[str, object]] = (),
                 credentials: Mapping[str, tuple[str, str | None]] | None = None) -> Routes:
    """Routes from a crawl's configuration: ``default`` (``--proxy``: a URL or ``none``)
    and ``rules`` (``[[proxies]]`` tables: ``hosts``, a pattern or a list of them, and
    ``url``). ``credentials`` adds them, by proxy URL, to proxies named without them (a
    recorded configuration never holds them)."""
    def one(text: str) -> Proxy | None:
        proxy = parse_proxy(text)
        if proxy is not None and proxy.username is None and credentials:
            user, password = credentials.get(proxy.url, (None, None))
            if user is not None:
                proxy = Proxy(proxy.scheme, proxy.host, proxy.port, user, password)
        return proxy

    hint = '[[proxies]] hosts = ["*.example.com"] url = "socks5://127.0.0.1:1080" (or "none")'
    parsed = []
    for index, rule in enumerate(rules, start=1):
        if not isinstance(rule, Mapping) or set(rule) - {"hosts", "url"}:
            raise EvidenceError(f"proxies rule {index}: expected a table with the keys hosts "
                                "and url", hint=hint)
        hosts, url = rule.get("hosts"), rule.get("url")
        patterns = [hosts] if isinstance(hosts, str) else hosts
        if (not isinstance(patterns, list) or not patterns
                or not all(isinstance(p, str) and p.strip() for p in patterns)):
            raise EvidenceError(f"proxies rule {index}: hosts must be a host pattern or a "
                                "list of them", hint=hint)
        if not isinstance(url, str):
            raise EvidenceError(f"proxies rule {index}: url must be a proxy URL or none",
                                hint=hint)
        parsed.append((tuple(p.strip() for p in patterns), one(url)))
    return Routes(None if default is None else one(default), parsed)


@dataclass(frozen=True)
class Tunnel:
    """What a proxy was asked and answered (the record's ``Proxied``)."""

    proxy: Proxy
    target: str
    target_port: int
    reply: str
    established: bool
    dns: DnsAnswer | None = None  # the proxy's own host's resolution

    def record(self) -> Proxied:
        return Proxied(scheme=self.proxy.scheme, host=self.proxy.host, port=self.proxy.port,
                       target=self.target[:300], target_port=self.target_port,
                       reply=self.reply[:300], established=self.established, dns=self.dns)


class ProxyFailed(OSError):
    """No tunnel: the proxy could not be reached (``tunnel`` None), or refused (``tunnel``
    says what it answered; ``remote`` and ``local``: the socket's addresses)."""

    def __init__(self, detail: str, tunnel: Tunnel | None = None,
                 remote: tuple[str, int] | None = None,
                 local: tuple[str, int] | None = None, *, final: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.tunnel, self.remote, self.local = tunnel, remote, local
        self.final = final  # another address of the origin would not do better
        self.dns: DnsAnswer | None = None  # the origin's resolution, if the crawler made one


async def open_tunnel(proxy: Proxy, origin: Origin, *, policy: NetworkPolicy | None,
                      timeout: float, tls: ssl.SSLContext | None
                      ) -> tuple[anyio.abc.ByteStream, DnsAnswer | None, Tunnel]:
    """A stream to ``origin`` through ``proxy`` (TLS to the origin inside the tunnel when
    ``tls`` is given), the resolver's answer for the origin's name (None when the proxy
    resolves it, or for an address literal), and the tunnel's facts.

    ``Refused`` if the policy refuses the proxy's address or the origin's; ``ProxyFailed``
    if the proxy cannot be reached or refuses; OSError as for a direct connection."""
    if proxy.scheme == "socks5h":
        targets, dns = [origin.host], None
    elif policy is not None:
        targets, dns = await policy.lookup(origin)
    elif proxy.scheme == "socks5":
        targets, dns = await system_resolver(origin.host, origin.port), None
    else:
        targets, dns = [origin.host], None
    if policy is not None:
        try:
            addresses, proxy_dns = await policy.lookup(proxy.origin)
        except Refused as exc:
            why = str(exc).removeprefix("network: ")
            raise Refused(f"network: the proxy {proxy.url}: {why}") from None
    else:
        addresses, proxy_dns = [proxy.host], None
    for index, target in enumerate(targets, start=1):
        try:
            stream, tunnel = await _through(proxy, addresses, proxy_dns, target, origin,
                                            timeout, tls)
        except ProxyFailed as exc:
            if exc.final or index == len(targets):
                exc.dns = dns
                raise
            continue  # the proxy could not reach this address: the next one, as directly
        return stream, dns, tunnel
    raise AssertionError("a lookup gives at least one address")  # pragma: no cover


async def _through(proxy: Proxy, addresses: list[str], proxy_dns: DnsAnswer | None,
                   target: str, origin: Origin, timeout: float,
                   tls: ssl.SSLContext | None) -> tuple[anyio.abc.ByteStream, Tunnel]:
    stream = await _connect_proxy(proxy, addresses, timeout)
    try:
        if proxy.scheme == "http":
            reply, ok, final = await _connect_http(stream, proxy, target, origin.port)
        else:
            reply, ok, final = await _connect_socks(stream, proxy, target, origin.port)
        tunnel = Tunnel(proxy, target, origin.port, reply, ok, proxy_dns)
        if not ok:
            remote, local = _addresses(stream)
            asked = f"[{target}]" if ":" in target else target
            raise ProxyFailed(f"proxy {proxy.url} refused the tunnel to {asked}:"
                              f"{origin.port}: {reply}", tunnel, remote, local, final=final)
        if tls is not None:
            stream = await TLSStream.wrap(stream, hostname=origin.host, ssl_context=tls,
                                          standard_compatible=False)
    except BaseException:
        with anyio.CancelScope(shield=True), contextlib.suppress(OSError,
                                                                  anyio.BrokenResourceError):
            await stream.aclose()
        raise
    return stream, tunnel


async def _connect_proxy(proxy: Proxy, addresses: list[str],
                         timeout: float) -> anyio.abc.ByteStream:
    """A TCP connection to the proxy, at the first of its checked addresses that answers."""
    last: OSError | None = None
    for address in addresses:
        try:
            return await connect_tcp(address, proxy.port, timeout=timeout)
        except OSError as exc:
            last = exc
    raise ProxyFailed(f"proxy {proxy.url} cannot be reached: "
                      f"{last or 'no address'}", final=True)


def _addresses(stream: anyio.abc.ByteStream) -> tuple[tuple[str, int] | None,
                                                      tuple[str, int] | None]:
    sock = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if sock is None:
        return None, None
    try:
        return sock.getpeername()[:2], sock.getsockname()[:2]
    except OSError:
        return None, None


async def _receive(stream: anyio.abc.ByteStream, proxy: Proxy) -> bytes:
    try:
        return await stream.receive(4096)
    except anyio.EndOfStream:
        raise ProxyFailed(f"proxy {proxy.url} closed the connection during the "
                          "handshake", final=True) from None


async def _exactly(stream: anyio.abc.ByteStream, proxy: Proxy, buffer: bytearray,
                   size: int) -> bytes:
    """``size`` bytes of the proxy's answer (``buffer`` keeps what came beyond them)."""
    while len(buffer) < size:
        buffer += await _receive(stream, proxy)
    data = bytes(buffer[:size])
    del buffer[:size]
    return data


def _authority(target: str, port: int) -> str:
    return f"[{target}]:{port}" if ":" in target else f"{target}:{port}"


async def _connect_http(stream: anyio.abc.ByteStream, proxy: Proxy, target: str,
                        port: int) -> tuple[str, bool, bool]:
    """CONNECT (RFC 9110 section 9.3.6): (the answer's status line, established, final)."""
    authority = _authority(target, port)
    lines = [f"CONNECT {authority} HTTP/1.1", f"Host: {authority}"]
    if proxy.username is not None:
        token = f"{proxy.username}:{proxy.password or ''}".encode()
        lines.append(f"Proxy-Authorization: Basic {base64.b64encode(token).decode()}")
    await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode())
    received = bytearray()
    while (end := received.find(b"\r\n\r\n")) < 0:
        if len(received) > MAX_REPLY_HEAD:
            raise ProxyFailed(f"proxy {proxy.url}: no end of its answer to CONNECT in "
                              f"{MAX_REPLY_HEAD} bytes", final=True)
        received += await _receive(stream, proxy)
    match = _STATUS.match(received)
    if match is None:
        raise ProxyFailed(f"proxy {proxy.url} did not answer CONNECT with HTTP "
                          f"({bytes(received[:40])!r})", final=True)
    status = int(match[1])
    line = received[:received.find(b"\n")].rstrip(b"\r").decode("latin-1")
    if 200 <= status < 300 and len(received) > end + 4:
        raise ProxyFailed(f"proxy {proxy.url} sent bytes after its answer to CONNECT, "
                          "before the origin was spoken to", final=True)
    return line, 200 <= status < 300, status not in (502, 503, 504)


async def _connect_socks(stream: anyio.abc.ByteStream, proxy: Proxy, target: str,
                         port: int) -> tuple[str, bool, bool]:
    """SOCKS5 CONNECT (RFC 1928), username/password (RFC 1929) if the proxy has them:
    (the reply in words, established, final)."""
    methods = b"\x00\x02" if proxy.username is not None else b"\x00"
    await stream.send(b"\x05" + bytes([len(methods)]) + methods)
    buffer = bytearray()
    version, method = await _exactly(stream, proxy, buffer, 2)
    if version != 5:
        raise ProxyFailed(f"proxy {proxy.url} does not speak SOCKS5 (version {version})",
                          final=True)
    if method == 0xFF:
        return "no acceptable authentication method", False, True
    if method == 0x02:
        if proxy.username is None:
            return "the proxy asks for a username and password, and none was given", \
                False, True
        user, password = proxy.username.encode(), (proxy.password or "").encode()
        await stream.send(b"\x01" + bytes([len(user)]) + user + bytes([len(password)])
                          + password)
        _version, status = await _exactly(stream, proxy, buffer, 2)
        if status != 0:
            return f"username/password authentication failed (status {status})", False, True
    elif method != 0x00:
        raise ProxyFailed(f"proxy {proxy.url} chose an authentication method it was not "
                          f"offered ({method})", final=True)
    try:
        packed = ipaddress.ip_address(target).packed
        address = (b"\x01" if len(packed) == 4 else b"\x04") + packed
    except ValueError:
        name = target.encode("ascii")
        address = b"\x03" + bytes([len(name)]) + name
    await stream.send(b"\x05\x01\x00" + address + struct.pack("!H", port))
    _version, reply, _reserved, kind = await _exactly(stream, proxy, buffer, 4)
    size = {1: 4, 4: 16}.get(kind)
    if size is None:
        size = (await _exactly(stream, proxy, buffer, 1))[0]
    await _exactly(stream, proxy, buffer, size + 2)  # the bound address and port
    if buffer:
        raise ProxyFailed(f"proxy {proxy.url} sent bytes after its SOCKS reply, before the "
                          "origin was spoken to", final=True)
    if reply == 0:
        return "succeeded", True, True
    words = _SOCKS_REPLIES.get(reply, "unassigned reply")
    return f"{words} (0x{reply:02x})", False, reply not in _NEXT_ADDRESS


Credentials = Mapping[str, tuple[str, str]]  # a proxy's URL (``Proxy.url``) -> user, password


def recordable(default: str | None, rules: Iterable[Mapping[str, object]] = ()
               ) -> tuple[str | None, list[dict[str, object]], dict[str, tuple[str, str]]]:
    """A crawl's proxy configuration as it may be recorded (each URL without its
    credentials, ``none`` kept), and the credentials taken out of it, by proxy URL."""
    credentials: dict[str, tuple[str, str]] = {}

    def plain(text: str) -> str:
        proxy = parse_proxy(text)
        if proxy is None:
            return "none"
        if proxy.username is not None:
            credentials[proxy.url] = (proxy.username, proxy.password or "")
        return proxy.url

    rules = list(rules)
    checked = parse_routes(default, rules)  # every rule checked first
    recorded: list[dict[str, object]] = [
        {"hosts": list(patterns), "url": plain(str(rule["url"]))}
        for (patterns, _proxy), rule in zip(checked.rules, rules, strict=True)]
    return (None if default is None else plain(default)), recorded, credentials


def crawl_routes(default: str | None, rules: Iterable[Mapping[str, object]], *,
                 remote_dns: bool, credentials: Credentials | None = None) -> Routes:
    """The routes of a crawl's configuration (``proxy``, ``proxies``), credentials added;
    EvidenceError if a ``socks5h`` proxy would resolve names the network policy cannot
    check and the operator did not say so (``remote_dns``)."""
    routes = parse_routes(default, rules, credentials)
    unchecked = routes.remote_dns()
    if unchecked and not remote_dns:
        raise EvidenceError(
            f"proxy {unchecked[0].url} resolves the origins' names itself, so the crawl's "
            "network policy cannot check where it connects (a name may lead to a private "
            "or loopback address the policy refuses)",
            hint="use socks5:// (the crawler resolves and checks each origin, and asks the "
            "proxy for the checked address), or give --proxy-remote-dns to accept it")
    return routes
